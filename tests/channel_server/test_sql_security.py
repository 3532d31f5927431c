"""POST /v1/sql as an attacker holding a valid token sees it (issue 17), on a live service.

One service (auth on, tokens ``tok-a`` and ``tok-b``) and so one Spark worker serve the
whole module; a temporary root holds the warehouse beside a secret file (mode 0600) and an
empty marker folder. Every hostile statement must answer a 4xx JSON error with a code, leak
neither the secret, the warehouse's or the worker log's paths, tracebacks nor internal
class names, and leave the service, its worker and ingestion working with nothing outside
the warehouse created, read back or changed.

Then: sessions belong to the token that named them; 8 concurrent clients each get exactly
their own answers; a timed-out statement leaves other sessions' transactions intact; a
worker killed with SIGKILL makes every open transaction answer ``TRANSACTION_ABORTED``
(never a silent success). Cases named after defects found while writing this suite (and
fixed) assert the correct behaviour. A statement that exhausts the worker's JVM (memory,
stack) is a documented gap: it fails only after its timeout plus a grace period, with a
worker restart (docs/security.md, known gaps).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import stat
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from channel_server import CompactionTrigger, ServerConfig
from ingest_sdk import OpenChannelRequest, StreamingIngestClient
from tests.servers import ThreadServer, table_folder

TOKEN_A, TOKEN_B = "tok-a", "tok-b"
SECRET = "s3cr3t-sql-security-7f1c"
ARROW = "application/vnd.apache.arrow.stream"
#: Text no error may hold unless the statement itself holds it (it may be quoted back).
LEAKS = re.compile(
    r"Traceback|File \"|org\.apache\.|java\.(?:lang|io|nio|util)\.|javax\.|scala\.|py4j|"
    r"pyspark|sqlglot|<class '|\x1b\["
)
#: Rows of table T as created (one row is deleted again: its file stays on disk).
T_ROWS = [["1", "a"], ["2", "b"]]


@dataclass
class World:
    server: ThreadServer
    root: Path
    warehouse: Path
    secret: Path
    marker: Path
    client: StreamingIngestClient
    channel: Any
    cases: int = 0
    pid: int | None = None
    offsets: list[int] = field(default_factory=lambda: [0])

    @property
    def worker_pid(self) -> int | None:
        return self.server.service.worker.pid

    @property
    def log_path(self) -> Path:
        return self.server.service.worker.log_path


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        return self.json["error"]

    @property
    def sql_code(self) -> str | None:
        return self.error.get("sql_code") if self.status >= 400 else None


def sql(
    world: World,
    statement: str,
    *,
    token: str = TOKEN_A,
    session: str | None = None,
    timeout: float | None = None,
    max_rows: int | None = None,
    accept: str | None = None,
) -> Answer:
    """One ``POST /v1/sql`` with a bearer token."""
    body: dict[str, Any] = {"statement": statement}
    if session is not None:
        body["session"] = session
    if timeout is not None:
        body["timeout"] = timeout
    if max_rows is not None:
        body["max_rows"] = max_rows
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(
        f"{world.server.url}/v1/sql", data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return Answer(response.status, response.read(), response.headers["Content-Type"])
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.read(), error.headers["Content-Type"])


def rows(answer: Answer) -> list[list[Any]]:
    assert answer.status == 200, answer.body[:500]
    return answer.json["rows"]


def close_session(world: World, name: str, token: str = TOKEN_A) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{world.server.url}/v1/sql/sessions/{name}",
        method="DELETE",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def get(world: World, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"{world.server.url}{path}", timeout=60) as response:
        return response.status, response.read()


def outside(world: World) -> dict[str, Any]:
    """Everything under the temporary root but the warehouse: paths, sizes, modes, link
    targets, and the secret's content."""
    seen: dict[str, Any] = {}
    for folder, folders, files in os.walk(world.root):
        if Path(folder) == world.root:
            folders[:] = [f for f in folders if f != world.warehouse.name]
        for name in [*folders, *files]:
            path = Path(folder, name)
            info = path.lstat()
            target = os.readlink(path) if path.is_symlink() else None
            seen[str(path)] = (info.st_size, info.st_mode, target)
    root = world.root.lstat()
    seen["."] = (root.st_mode, world.secret.read_text())
    return seen


def check_refused(world: World, statement: str, answer: Answer) -> None:
    """A 4xx JSON error with a code, leaking nothing the statement did not hold."""
    assert 400 <= answer.status < 500, (answer.status, answer.body[:500])
    assert answer.content_type.startswith("application/json"), answer.content_type
    error = answer.error
    assert error["code"], error
    assert error["message"], error
    if error["code"] == "SQL_ERROR":
        assert error.get("sql_code"), error
    texts = [answer.body.decode("utf-8", errors="replace"), error["message"]]
    for text in texts:
        assert SECRET not in text
        assert "spark-worker.log" not in text and str(world.log_path) not in text, text[:500]
        if str(world.warehouse) in text:
            assert str(world.warehouse) in statement, text[:500]
        for leak in LEAKS.finditer(text):
            assert leak.group(0) in statement, f"{leak.group(0)!r} leaked: {text[:500]}"


def check_alive(world: World) -> None:
    """The service and its worker answer."""
    assert rows(sql(world, "SELECT 1 AS one")) == [[1]]
    status, body = get(world, "/health")
    assert status == 200, body


def check_ingest_and_tables(world: World) -> None:
    """A row ingested through a channel commits, and the tables are as created."""
    offset = world.offsets[-1] + 1
    world.channel.insert_row({"id": offset, "v": f"row {offset}"}, offset_token=str(offset))
    assert world.channel.wait_for_commit(timeout=60) == str(offset)
    world.offsets.append(offset)
    assert rows(sql(world, "SELECT id, v FROM t ORDER BY id")) == T_ROWS
    assert rows(sql(world, "SELECT count(*) AS n FROM u")) == [[0]]
    assert rows(sql(world, "SELECT count(*) AS n FROM ingested")) == [[len(world.offsets) - 1]]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sql-security")
    secret = root / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    secret.chmod(0o600)
    marker = root / "marker"
    marker.mkdir()
    warehouse = root / "warehouse"
    server = ThreadServer(
        ServerConfig(
            port=0,
            warehouse=warehouse,
            auth_tokens=frozenset({TOKEN_A, TOKEN_B}),
            compaction=CompactionTrigger(enabled=False),
        )
    )
    client = StreamingIngestClient("sql-security", server.url, token=TOKEN_A, max_client_lag=0.1)
    made = World(server, root, warehouse, secret, marker, client, None)
    try:
        for statement in (
            "CREATE TABLE t (id INT, v VARCHAR(100))",
            "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'deleted')",
            "DELETE FROM t WHERE id = 3",
            "CREATE TABLE u (id INT, v VARCHAR(100))",
            "CREATE STREAM s ON TABLE t",
        ):
            assert sql(made, statement).status == 200, statement
        client.create_table(
            "DB.PUBLIC.INGESTED", {"ID": "NUMBER(38,0) NOT NULL", "V": "VARCHAR(100)"}
        )
        made.pid = made.worker_pid
        made.channel = client.open_channel(OpenChannelRequest("sec-p0", "DB", "PUBLIC", "INGESTED"))
        yield made
    finally:
        with contextlib.suppress(Exception):
            client.close()
        with contextlib.suppress(Exception):
            server.stop()


# Each case: a hostile statement ({secret}, {root}, {marker}, {warehouse} and {table} are
# filled in). Grouped by class of attack; variants in quoting, case, comments, nesting, DML.
FILES = [
    "SELECT * FROM text.`{secret}`",
    "SELECT * FROM TEXT.`{secret}`",
    "SELECT * FROM `text`.`{secret}`",
    'SELECT * FROM "text"."{secret}"',
    "SELECT * FROM csv.`{secret}`",
    "SELECT * FROM json.`{secret}`",
    "SELECT * FROM binaryFile.`{secret}`",
    "SELECT * FROM orc.`{secret}`",
    "select * from /* c */ text . `{secret}`",
    "SELECT * FROM parquet.`{warehouse}`",
    "SELECT * FROM parquet.`{table}`",  # a deleted row's file is still there
    "SELECT * FROM delta.`{table}`",
    "SELECT * FROM IDENTIFIER('text.`{secret}`')",
    "SELECT * FROM identifier('csv.`{secret}`')",
    'SELECT * FROM IDENTIFIER("text.`{secret}`")',
    "SELECT * FROM IDENTIFIER(r'text.`{secret}`')",
    "SELECT * FROM IDENTIFIER('`text`.`{secret}`')",
    "SELECT * FROM /* a */ IDENTIFIER /* b */ ( 'text.`{secret}`' )",
    "SELECT * FROM IDENTIFIER(concat('text.`', '{root}', '/secret.txt`'))",
    "SELECT * FROM IDENTIFIER('text.' || '`{secret}`')",
    "SELECT * FROM IDENTIFIER(concat_ws('.', 'text', '`{secret}`'))",
    "WITH x AS (SELECT * FROM text.`{secret}`) SELECT * FROM x",
    "WITH x AS (SELECT * FROM t), y AS (SELECT * FROM IDENTIFIER('text.`{secret}`')) SELECT * FROM x, y",
    "SELECT * FROM (SELECT * FROM (SELECT value FROM csv.`{secret}`) a) b",
    "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM binaryFile.`{secret}`)",
    "SELECT * FROM t WHERE v IN (SELECT value FROM text.`{secret}`)",
    "SELECT (SELECT max(value) FROM IDENTIFIER('text.`{secret}`')) FROM t",
    "SELECT id FROM t ORDER BY (SELECT count(*) FROM csv.`{secret}`)",
    "SELECT id FROM t UNION ALL SELECT value FROM text.`{secret}`",
    "SELECT * FROM t, LATERAL (SELECT value FROM text.`{secret}`)",
    "SELECT * FROM t JOIN text.`{secret}` s ON t.v = s.value",
    "INSERT INTO u SELECT 1, value FROM text.`{secret}`",
    "INSERT INTO u (id, v) SELECT 1, value FROM IDENTIFIER('text.`{secret}`')",
    "insert into u with x as (select value from text.`{secret}`) select 1, value from x",
    "UPDATE t SET v = (SELECT max(value) FROM text.`{secret}`)",
    "UPDATE t SET v = s.value FROM text.`{secret}` s",
    "UPDATE t SET v = 'x' WHERE v IN (SELECT value FROM IDENTIFIER('text.`{secret}`'))",
    "DELETE FROM t WHERE v = (SELECT max(value) FROM text.`{secret}`)",
    "DELETE FROM t USING text.`{secret}` s WHERE t.v = s.value",
    "MERGE INTO u USING (SELECT 1 AS id, value AS v FROM text.`{secret}`) src ON u.id = src.id WHEN NOT MATCHED THEN INSERT VALUES (src.id, src.v)",
    "MERGE INTO u USING IDENTIFIER('text.`{secret}`') src ON u.v = src.value WHEN NOT MATCHED THEN INSERT VALUES (1, src.value)",
    "MERGE INTO u USING text.`{secret}` src ON u.v = src.value WHEN NOT MATCHED THEN INSERT VALUES (1, src.value)",
    "MERGE INTO t USING u ON u.id = t.id WHEN MATCHED THEN UPDATE SET v = (SELECT max(value) FROM text.`{secret}`)",
]
REFLECTION = [
    "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT REFLECT('java.lang.System', 'getProperty', 'user.home')",
    "SELECT ReFlEcT('java.lang.System', 'getenv', 'HOME')",
    "SELECT `reflect`('java.lang.System', 'getenv', 'HOME')",
    "SELECT \"reflect\"('java.lang.System', 'getenv', 'HOME')",
    "SELECT reflect/**/('java.lang.System', 'getenv', 'HOME')",
    "SELECT reflect\n\t('java.lang.System', 'getenv', 'HOME')",
    "SELECT re/**/flect('java.lang.System', 'getenv', 'HOME')",
    "SELECT `re\u200bflect`('java.lang.System', 'getenv', 'HOME')",
    "SELECT \uff52eflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT builtin.reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT system.builtin.reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT `system`.`builtin`.`java_method`('java.lang.System', 'getenv', 'HOME')",
    "SELECT java_method('java.lang.System', 'getenv', 'HOME')",
    "SELECT JAVA_METHOD('java.lang.System', 'getProperty', 'java.home')",
    "SELECT try_reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT try_reflect('org.apache.spark.util.Utils', 'getPropertiesFromFile', '{secret}')",
    "SELECT reflect('java.lang.System', 'exit', 0)",
    "SELECT java_method('java.lang.System', 'exit', 1) FROM t",
    "SELECT reflect('java.lang.Runtime', 'getRuntime')",
    "SELECT java_method('java.io.File', 'createTempFile', 'pwn', '.txt')",
    "WITH x AS (SELECT reflect('java.lang.System', 'getenv', 'HOME') AS h) SELECT * FROM x",
    "SELECT * FROM (SELECT java_method('java.lang.System', 'getenv', 'HOME')) q",
    "SELECT id FROM t WHERE reflect('java.lang.System', 'getenv', 'HOME') IS NOT NULL",
    "SELECT id FROM t ORDER BY reflect('java.lang.Math', 'random')",
    "SELECT count(*) FROM t GROUP BY reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT max(id) OVER (ORDER BY reflect('java.lang.Math', 'random')) FROM t",
    "SELECT CASE WHEN id > 0 THEN try_reflect('java.lang.System', 'getenv', 'HOME') END FROM t",
    "SELECT transform(array(1), x -> reflect('java.lang.System', 'getenv', 'HOME'))",
    "SELECT * FROM VALUES (reflect('java.lang.System', 'getenv', 'HOME'))",
    "SELECT * FROM t LATERAL VIEW explode(array(reflect('java.lang.System', 'getenv', 'HOME'))) e AS x",
    "SELECT * FROM t, LATERAL (SELECT reflect('java.lang.System', 'getenv', 'HOME'))",
    "INSERT INTO u SELECT 1, reflect('java.lang.System', 'getenv', 'HOME')",
    "INSERT INTO u VALUES (1, java_method('java.lang.System', 'getenv', 'HOME'))",
    "UPDATE t SET v = reflect('java.lang.System', 'getProperty', 'user.home')",
    "UPDATE t SET v = 'x' WHERE try_reflect('java.lang.System', 'getenv', 'HOME') = 'x'",
    "DELETE FROM t WHERE reflect('java.lang.System', 'getenv', 'HOME') = 'x'",
    "MERGE INTO u USING t ON u.id = t.id WHEN NOT MATCHED THEN INSERT VALUES (t.id, java_method('java.lang.System', 'getenv', 'HOME'))",
    "MERGE INTO t USING u ON u.id = t.id WHEN MATCHED THEN UPDATE SET v = try_reflect('java.lang.System', 'getenv', 'HOME')",
    "MERGE INTO t USING t AS src ON reflect('java.lang.System', 'getenv', 'HOME') = src.v WHEN MATCHED THEN DELETE",
    "MERGE INTO t USING t AS src ON t.id = src.id WHEN MATCHED AND reflect('java.lang.System', 'exit', 0) = 'x' THEN DELETE",
]
PROCESS = [
    "SELECT TRANSFORM(id) USING 'id' FROM t",
    "select transform(id) using 'id' from t",
    "SELECT TRANSFORM(id, v) USING 'touch {marker}/pwned' AS (a, b) FROM t",
    "SELECT TRANSFORM(*) USING 'cat {secret}' FROM t",
    "SELECT TRANS/**/FORM(id) USING 'id' FROM t",
    "SELECT TRANSFORM(id) ROW FORMAT DELIMITED FIELDS TERMINATED BY ',' USING 'cat {secret}' AS (x) FROM t",
    "WITH x AS (SELECT TRANSFORM(id) USING 'id' FROM t) SELECT * FROM x",
    "SELECT * FROM (SELECT TRANSFORM(id) USING 'touch {marker}/pwned' FROM t) q",
    "INSERT INTO u SELECT TRANSFORM(id, v) USING 'cat' AS (id, v) FROM t",
    "MERGE INTO u USING (SELECT TRANSFORM(id, v) USING 'cat' AS (id, v) FROM t) s ON u.id = s.id WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.v)",
    "FROM t SELECT TRANSFORM(id) USING 'id'",
    "FROM t MAP id USING 'id'",
    "FROM t REDUCE id USING 'id'",
    "SELECT input_file_name() FROM t",
    "SELECT INPUT_FILE_NAME(), id FROM t",
    "SELECT id FROM t WHERE input_file_name() LIKE '%parquet'",
    "SELECT input_file_block_start(), input_file_block_length() FROM t",
    "UPDATE t SET v = input_file_name()",
    "INSERT INTO u SELECT id, input_file_name() FROM t",
    "SELECT current_user()",
    "SELECT session_user()",
    "SELECT * FROM python_worker_logs()",
    "SELECT xpath('<a/>', '/a')",
    "SELECT from_protobuf(x'00', 'M', '{secret}')",
]
COMMANDS = [
    "SET spark.sql.runSQLOnFiles=true",
    "set spark.sql.runSQLOnFiles = true",
    "SET spark.sql.reflect.allowList=.*",
    "SET spark.sql.restrictedMode.enabled=false",
    "/* c */ SET spark.sql.runSQLOnFiles=true",
    "-- c\nSET spark.sql.runSQLOnFiles=true",
    "SET",
    "SET -v",
    "RESET",
    "reset spark.sql.runSQLOnFiles",
    "CACHE TABLE t",
    "CACHE LAZY TABLE c AS SELECT * FROM text.`{secret}`",
    "UNCACHE TABLE t",
    "CLEAR CACHE",
    "ADD JAR {secret}",
    "add file {secret}",
    "ADD ARCHIVE {secret}",
    "LIST FILES",
    "INSERT OVERWRITE DIRECTORY '{marker}' SELECT 1",
    "INSERT OVERWRITE LOCAL DIRECTORY '{marker}' USING csv SELECT * FROM t",
    "insert overwrite local directory '{marker}' stored as textfile select * from t",
    "WITH x AS (SELECT 1) INSERT OVERWRITE DIRECTORY '{marker}' SELECT * FROM x",
    "CREATE TEMPORARY FUNCTION f AS 'org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection'",
    "CREATE FUNCTION f AS 'x.Y' USING JAR '{secret}'",
    "CREATE TEMPORARY FUNCTION f() RETURNS STRING RETURN reflect('java.lang.System', 'getenv', 'HOME')",
    "EXECUTE IMMEDIATE 'SELECT 1'",
    "EXECUTE IMMEDIATE 'SET spark.sql.runSQLOnFiles=true'",
    "EXECUTE IMMEDIATE 'SELECT reflect(''java.lang.System'', ''getenv'', ''HOME'')'",
    "DECLARE VARIABLE x INT",
    "SET VAR x = 1",
    "LOAD DATA LOCAL INPATH '{secret}' INTO TABLE t",
    "CREATE TABLE x USING parquet LOCATION '{marker}' AS SELECT 1",
    "CREATE TABLE x (a INT) LOCATION '{marker}'",
    "CREATE TABLE x (a INT) USING csv OPTIONS (path '{secret}')",
    "CREATE TEMPORARY VIEW v USING text OPTIONS (path '{secret}')",
    "CREATE TEMPORARY VIEW v AS SELECT * FROM text.`{secret}`",
    "ALTER TABLE t SET LOCATION '{marker}'",
    "REFRESH TABLE t",
    "MSCK REPAIR TABLE t",
    "ANALYZE TABLE t COMPUTE STATISTICS",
    "USE CATALOG spark_catalog",
    "SHOW FUNCTIONS",
    "DESCRIBE FUNCTION EXTENDED reflect",
    "SELECT 1; SET spark.sql.runSQLOnFiles=true",
    "SELECT * FROM t; ADD JAR {secret}",
]
NESTING = [
    "SELECT " + "(" * 300 + "1" + ")" * 300,
    "SELECT * FROM t WHERE id IN " + "(" * 300 + "1" + ")" * 300,
    "WITH x AS (SELECT " + "(" * 300 + "1" + ")" * 300 + ") SELECT * FROM x",
    "SELECT * FROM " + "(SELECT * FROM " * 300 + "t" + ") q" * 300,
    "SELECT " + "CASE WHEN true THEN " * 300 + "1" + " END" * 300,
    "SELECT " + "array(" * 300 + "1" + ")" * 300,
    "INSERT INTO u SELECT 1, " + "(" * 300 + "'x'" + ")" * 300,
    "UPDATE t SET v = " + "(" * 300 + "'x'" + ")" * 300,
    # END outside CASE must not let deeper nesting through
    "SELECT " + "end, " * 300 + "(" * 300 + "1" + ")" * 300 + " FROM t",
    "SELECT " + "NOT " * 1000 + "true",
    "SELECT " + "- " * 1000 + "1",
    "SELECT reflect('java.lang.System', 'exit', " + "(" * 300 + "0" + ")" * 300 + ")",
]
# Long adversarial headers: each pattern must be refused in time linear in its length.
HEADERS = [
    "ALTER TABLE t SET " + ("A=A=," * 30)[:96],  # the 114-character header of the issue
    "ALTER TABLE t SET " + "A=A=," * 199_000,
    "ALTER TABLE t SET " + "A=A " * 249_000 + "=",
    "ALTER TABLE t SET A=" + "A" * 999_000 + "=",
    # AT(... => x<spaces>: quadratic in the number of spaces (see the report), kept short here
    "CREATE STREAM s2 ON TABLE t AT(VERSION => 1" + " " * 5_000 + "x",
    "CREATE STREAM s2 ON TABLE t COMMENT = '" + "''" * 499_000,
    "CREATE TABLE x (" + ")" * 999_000 + "x",
    "CREATE TABLE x (" + "(a)" * 333_000 + " x",
    'DROP TABLE "' + '""' * 499_000,
    "DROP TABLE " + '"a".' * 249_000,
    "USE " + "a ." * 333_000,
    "SHOW TABLES LIKE '" + "''" * 499_000,
    "BEGIN NAME " + " " * 999_000 + "x y",
    "DESC " + '"' * 999_000,
    "/*" * 499_999,
    # huge literals (about 3 MB of UTF-8, under the 1,000,000-character limit)
    "SELECT reflect('java.lang.System', 'getProperty', '" + "\u20ac" * 999_000 + "')",
    "SELECT * FROM text.`{secret}` WHERE value = '" + "\u20ac" * 999_000 + "'",
    "INSERT INTO u SELECT 1, value FROM text.`{secret}` WHERE value <> '" + "x" * 999_000 + "'",
]
# Once defects (syntax errors named sqlglot's classes), kept apart by name.
PARSE_ERRORS = [
    pytest.param(
        "SELECT IDENTIFIER('reflect')('java.lang.System', 'getenv', 'HOME')",
        id="identifier-reflect",
    ),
    pytest.param(
        "SELECT IDENTIFIER('refl' || 'ect')('java.lang.System', 'getenv', 'HOME')",
        id="identifier-concat-reflect",
    ),
    pytest.param("SELECT 1 " + "/*" * 499_995, id="select-then-comments"),
]


def _ids(cases: list[str], prefix: str) -> list[Any]:
    return [pytest.param(case, id=f"{prefix}-{index}") for index, case in enumerate(cases)]


CASES = [
    *_ids(FILES, "files"),
    *_ids(REFLECTION, "reflection"),
    *_ids(PROCESS, "process"),
    *_ids(COMMANDS, "commands"),
    *_ids(NESTING, "nesting"),
    *_ids(HEADERS, "headers"),
    *PARSE_ERRORS,
]


@pytest.mark.parametrize("template", CASES)
def test_a_hostile_statement_is_refused_and_harms_nothing(world, template):
    statement = _fill(world, template)
    before = outside(world)
    world.cases += 1
    accept = ARROW if world.cases % 2 else None
    answer = sql(world, statement, session="attacker" if world.cases % 3 == 0 else None,
                 accept=accept)  # fmt: skip
    check_refused(world, statement, answer)
    assert outside(world) == before
    assert not any(world.marker.iterdir())
    assert stat.S_IMODE(world.secret.stat().st_mode) == 0o600
    check_alive(world)
    pid, world.pid = world.pid, world.worker_pid  # a failure here does not fail later cases
    assert world.worker_pid == pid  # never restarted
    if world.cases % 10 == 0:
        check_ingest_and_tables(world)


def _fill(world: World, template: str) -> str:
    """A case's statement: its placeholders replaced by the paths they name."""
    paths = {
        "{secret}": world.secret,
        "{root}": world.root,
        "{marker}": world.marker,
        "{warehouse}": world.warehouse,
        "{table}": table_folder(str(world.warehouse), "DB", "PUBLIC", "T"),
    }
    for placeholder, path in paths.items():
        template = template.replace(placeholder, str(path))
    return template


def test_after_the_hostile_statements_ingestion_and_the_tables_are_intact(world):
    check_ingest_and_tables(world)
    assert world.secret.read_text() == f"{SECRET}\n"
    assert world.worker_pid == world.pid
    assert rows(sql(world, "SELECT count(*) AS n FROM s")) == [[0]]  # the stream saw no change


def test_a_huge_literal_of_an_honest_query_is_answered_in_full(world):
    text = "\u20ac" * 999_000
    assert rows(sql(world, f"SELECT length('{text}') AS n, substr('{text[:10]}', 1, 3) AS p")) == [
        [999_000, "\u20ac" * 3]
    ]


# Sessions belong to their client.


def test_a_session_name_of_another_token_is_another_session(world):
    sql(world, "CREATE TABLE sess_t (id INT, v VARCHAR(20))")
    sql(world, "CREATE TABLE SEC.S2.OTHER_T (id INT)")
    assert sql(world, "BEGIN", session="shared").status == 200
    assert rows(sql(world, "INSERT INTO sess_t VALUES (1, 'from-a')", session="shared")) == [[1]]
    assert sql(world, "USE SCHEMA SEC.S2", session="shared-use").status == 200
    # B names the same sessions: its statements run in its own session, with the defaults.
    assert rows(
        sql(world, "SELECT count(*) AS n FROM sess_t", token=TOKEN_B, session="shared")
    ) == [[0]]
    assert rows(sql(world, "SELECT count(*) AS n FROM t", token=TOKEN_B, session="shared-use")) == [
        [2]
    ]
    sql(world, "COMMIT", token=TOKEN_B, session="shared")
    assert rows(sql(world, "SELECT count(*) AS n FROM sess_t")) == [[0]]  # B's COMMIT is not A's
    sql(world, "ROLLBACK", token=TOKEN_B, session="shared")
    assert close_session(world, "shared", token=TOKEN_B)["closed"] is True  # B's own
    # A's transaction is intact and commits.
    assert rows(sql(world, "SELECT id, v FROM sess_t", session="shared")) == [["1", "from-a"]]
    assert sql(world, "COMMIT", session="shared").status == 200
    assert rows(sql(world, "SELECT id, v FROM sess_t")) == [["1", "from-a"]]
    assert rows(sql(world, "SELECT count(*) AS n FROM other_t", session="shared-use")) == [[0]]


def test_a_session_closed_by_another_token_stays_open(world):
    assert sql(world, "BEGIN", session="mine").status == 200
    sql(world, "INSERT INTO sess_t VALUES (5, 'mine')", session="mine")
    assert close_session(world, "mine", token=TOKEN_B) == {"session": "mine", "closed": False}
    assert sql(world, "COMMIT", session="mine").status == 200
    assert rows(sql(world, "SELECT v FROM sess_t WHERE id = 5")) == [["mine"]]


def test_without_a_session_each_statement_runs_alone(world):
    for token in (TOKEN_A, TOKEN_B):
        for begin in ("BEGIN", "begin transaction", "START TRANSACTION"):
            answer = sql(world, begin, token=token)
            assert (answer.status, answer.sql_code) == (409, "SESSION_REQUIRED"), answer.body
            assert '"session"' in answer.error["message"]
    # A client without a session inserts: committed at once, whatever another one sends.
    assert rows(sql(world, "INSERT INTO sess_t VALUES (10, 'alone')")) == [[1]]
    for other in ("ROLLBACK", "COMMIT"):
        assert sql(world, other, token=TOKEN_B).status in (200, 409)
        assert sql(world, other).status in (200, 409)
    assert rows(sql(world, "SELECT v FROM sess_t WHERE id = 10", token=TOKEN_B)) == [["alone"]]


def test_a_commit_without_a_transaction_is_not_reported_as_success(world):
    sql(world, "BEGIN", session="has-txn")
    sql(world, "INSERT INTO sess_t VALUES (20, 'pending')", session="has-txn")
    answer = sql(world, "COMMIT", token=TOKEN_B, session="has-txn")
    sql(world, "ROLLBACK", session="has-txn")
    assert answer.status >= 400, answer.body


# One client never breaks another.


def _client(world: World, number: int, seed: int, failures: list[str]) -> None:
    chance = random.Random(seed)
    token = (TOKEN_A, TOKEN_B)[number % 2]
    session = f"conc-{number}" if number % 3 else None
    for request in range(6):
        accept = ARROW if chance.random() < 0.5 else None
        label = f"client {number} request {request}"
        if chance.random() < 0.2:
            missing = f"NO_SUCH_{number}_{request}"
            answer = sql(world, f"SELECT {number} AS client FROM {missing}", token=token,
                         session=session, accept=accept)  # fmt: skip
            if answer.status != 400 or missing not in answer.error["message"]:
                failures.append(f"{label}: {answer.status} {answer.body[:300]!r}")
            continue
        count, width = chance.randint(0, 60), chance.choice([0, 10, 5_000, 60_000])
        statement = (
            f"SELECT {number} AS client, {request} AS request, id, repeat('x', {width}) AS pad "
            f"FROM range({count})"
        )
        answer = sql(world, statement, token=token, session=session, accept=accept)
        if answer.status != 200:
            failures.append(f"{label}: {answer.status} {answer.body[:300]!r}")
            continue
        if accept:
            table = pa.ipc.open_stream(answer.body).read_all()
            got = list(zip(*(table.column(i).to_pylist() for i in range(4)), strict=True))
        else:
            got = [tuple(row) for row in answer.json["rows"]]
        expected = [(number, request, i, "x" * width) for i in range(count)]
        if sorted(got) != expected:
            failures.append(f"{label}: {len(got)} rows, first {str(got[:1])[:200]}")


def test_concurrent_clients_each_get_exactly_their_own_answers(world):
    failures: list[str] = []
    threads = [
        threading.Thread(target=_client, args=(world, number, 1000 + number, failures))
        for number in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert failures == []
    check_alive(world)


def test_a_timeout_cancels_one_statement_and_open_transactions_commit(world):
    sql(world, "CREATE TABLE timeout_t (id INT, who VARCHAR(10))")
    pid = world.worker_pid
    for token, session, row in (
        (TOKEN_A, "hold-1", "(1, 'one')"),
        (TOKEN_B, "hold-2", "(2, 'two')"),
    ):
        assert sql(world, "BEGIN", token=token, session=session).status == 200
        assert (
            sql(world, f"INSERT INTO timeout_t VALUES {row}", token=token, session=session).status
            == 200
        )
    answer = sql(world, "SELECT count(*) FROM range(100000000000)", session="slow", timeout=1)
    assert (answer.status, answer.sql_code) == (400, "STATEMENT_TIMEOUT"), answer.body
    check_refused(world, "", answer)
    assert sql(world, "COMMIT", session="hold-1").status == 200
    assert sql(world, "COMMIT", token=TOKEN_B, session="hold-2").status == 200
    assert rows(sql(world, "SELECT id, who FROM timeout_t ORDER BY id")) == [
        ["1", "one"],
        ["2", "two"],
    ]
    assert rows(sql(world, "SELECT 1 AS one", session="slow")) == [[1]]
    assert world.worker_pid == pid  # cancelled in place, never restarted


def test_statements_of_one_session_sent_together_never_claim_a_lost_transaction(world):
    sql(world, "CREATE TABLE pair_t (id INT)")
    assert sql(world, "BEGIN", session="pair").status == 200
    assert sql(world, "INSERT INTO pair_t VALUES (1)", session="pair").status == 200
    pid = world.worker_pid
    answers: dict[str, Answer] = {}

    def send(name: str, statement: str, **kwargs: Any) -> None:
        answers[name] = sql(world, statement, **kwargs)

    # Another client holds the worker, so the session's COMMIT and INSERT queue together.
    busy = threading.Thread(target=send, args=("busy", "SELECT count(*) FROM range(100000000000)"),
                            kwargs={"session": "busy", "timeout": 3})  # fmt: skip
    commit = threading.Thread(target=send, args=("commit", "COMMIT"), kwargs={"session": "pair"})
    insert = threading.Thread(target=send, args=("insert", "INSERT INTO pair_t VALUES (2)"),
                              kwargs={"session": "pair"})  # fmt: skip
    busy.start()
    time.sleep(0.5)
    commit.start()
    time.sleep(0.3)
    insert.start()
    for thread in (busy, commit, insert):
        thread.join(timeout=120)
    after = sql(world, "SELECT count(*) AS n FROM pair_t", session="pair")
    sql(world, "ROLLBACK", session="pair")
    assert world.worker_pid == pid
    assert answers["commit"].status == 200
    assert rows(sql(world, "SELECT id FROM pair_t WHERE id = 1")) == [["1"]]  # it committed
    claims = [a.sql_code for a in (answers["insert"], after) if a.status >= 400]
    assert "TRANSACTION_ABORTED" not in claims, (answers["insert"].body, after.body)


# Answers say what the statement computed.


def test_json_rows_keep_columns_that_share_a_name(world):
    answer = sql(world, "SELECT 1 AS a, 2 AS a")
    assert answer.json["rows"] == [[1, 2]]


def test_json_answers_do_not_turn_nan_into_null(world):
    answer = sql(world, "SELECT CAST('NaN' AS DOUBLE) AS n, CAST('Infinity' AS DOUBLE) AS i")
    assert None not in answer.json["rows"][0]


def test_a_cte_inside_a_subquery_does_not_shadow_a_table_outside_it(world):
    statement = "SELECT count(*) AS n FROM t, (WITH t AS (SELECT 1 AS a) SELECT a FROM t) y"
    assert rows(sql(world, statement)) == [[2]]


@pytest.mark.parametrize(
    "statement",
    ["SELECT count(*) AS n FROM t VERSION AS OF 0",
     "SELECT count(*) AS n FROM t TIMESTAMP AS OF '2000-01-01 00:00:00'"],
)  # fmt: skip
def test_a_time_travel_clause_is_honoured_or_refused(world, statement):
    assert rows(sql(world, "SELECT count(*) AS n FROM t AT(VERSION => 0)")) == [[0]]
    answer = sql(world, statement)
    assert answer.status >= 400 or answer.json["rows"] == [[0]], answer.body


def test_sql_needs_a_token(world):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"bearer {TOKEN_A}"}):
        request = urllib.request.Request(
            f"{world.server.url}/v1/sql",
            data=json.dumps({"statement": "SELECT 1"}).encode(),
            headers={"Content-Type": "application/json", **headers},
        )
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=60)
        assert caught.value.code == 401
        assert json.loads(caught.value.read())["error"]["code"] == "UNAUTHENTICATED"


@pytest.mark.parametrize(
    # ("SELECT * FROM t WHERE" is no error: Spark reads t aliased WHERE.)
    "statement", ["SELECT 1 *", "SELECT * FROM t WHERE AND", "INSERT INTO t VALUES"]
)
def test_syntax_errors_name_no_parser_classes(world, statement):
    answer = sql(world, statement)
    assert answer.sql_code == "SQL_COMPILATION_ERROR"
    check_refused(world, statement, answer)


# A worker restart tells every open transaction (last: these restart the worker).


def test_a_killed_worker_aborts_open_transactions_never_silently(world):
    sql(world, "CREATE TABLE crash_t (id INT)")
    sql(world, "CREATE TABLE SEC.S1.CRASH_USE (id INT)")
    sql(world, "INSERT INTO SEC.S1.CRASH_USE VALUES (42)")
    assert sql(world, "USE SCHEMA SEC.S1", session="keeps-use").status == 200
    for token, session, value in ((TOKEN_A, "crash-1", 1), (TOKEN_B, "crash-2", 2)):
        assert sql(world, "BEGIN", token=token, session=session).status == 200
        assert (
            sql(world, f"INSERT INTO crash_t VALUES ({value})", token=token, session=session).status
            == 200
        )
    restarts = _restarts(world)
    in_flight: dict[str, Answer] = {}
    thread = threading.Thread(target=lambda: in_flight.setdefault(
        "answer", sql(world, "SELECT count(*) FROM range(100000000000)", timeout=120)))  # fmt: skip
    thread.start()
    worker = world.server.service.worker
    for _ in range(200):  # until the statement holds the worker
        if worker._turn.locked():
            break
        time.sleep(0.05)
    time.sleep(0.5)  # and has been written to it
    pid = world.worker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    thread.join(timeout=120)
    answer = in_flight["answer"]
    assert (answer.status, answer.sql_code) == (503, "WORKER_FAILED"), answer.body
    check_failed_softly(world, answer)
    # Session 1: its next statement, then its COMMIT, answer TRANSACTION_ABORTED.
    first = sql(world, "SELECT count(*) AS n FROM crash_t", session="crash-1")
    assert (first.status, first.sql_code) == (409, "TRANSACTION_ABORTED"), first.body
    commit = sql(world, "COMMIT", session="crash-1")
    assert (commit.status, commit.sql_code) == (409, "TRANSACTION_ABORTED"), commit.body
    # Session 2: its COMMIT is its next statement.
    commit = sql(world, "COMMIT", token=TOKEN_B, session="crash-2")
    assert (commit.status, commit.sql_code) == (409, "TRANSACTION_ABORTED"), commit.body
    assert rows(sql(world, "SELECT count(*) AS n FROM crash_t")) == [[0]]
    for token, session in ((TOKEN_A, "crash-1"), (TOKEN_B, "crash-2")):
        assert sql(world, "ROLLBACK", token=token, session=session).status == 200
        answer = sql(world, "SELECT count(*) AS n FROM crash_t", token=token, session=session)
        assert rows(answer) == [[0]]
    for token, session in ((TOKEN_A, "crash-1"), (TOKEN_B, "crash-2")):
        assert sql(world, "BEGIN", token=token, session=session).status == 200
        answer = sql(world, "INSERT INTO crash_t VALUES (7)", token=token, session=session)
        assert answer.status == 200, answer.body
        assert sql(world, "COMMIT", token=token, session=session).status == 200
    assert rows(sql(world, "SELECT count(*) AS n FROM crash_t")) == [[2]]
    # A session without a transaction keeps its USE defaults across the restart.
    assert rows(sql(world, "SELECT id FROM crash_use", session="keeps-use")) == [["42"]]
    assert world.worker_pid not in (None, pid)
    assert _restarts(world) == restarts + 1
    check_ingest_and_tables(world)


def check_failed_softly(world: World, answer: Answer) -> None:
    """A worker failure in plain words: no path, traceback or class name."""
    assert answer.error["message"] and answer.error["sql_code"], answer.body
    text = answer.body.decode()
    assert str(world.root) not in text and "Traceback" not in text
    assert not LEAKS.search(text), text


def _restarts(world: World) -> float:
    _, body = get(world, "/metrics")
    found = re.search(rb"^ingest_spark_worker_restarts(?:_total)?(?:\{[^}]*\})? (\S+)$", body, re.M)
    assert found, body[:2000]
    return float(found.group(1))


def test_an_idle_worker_is_not_stopped_under_an_open_transaction(tmp_path):
    server = ThreadServer(
        ServerConfig(
            port=0,
            warehouse=tmp_path / "warehouse",
            auth_tokens=frozenset({TOKEN_A}),
            compaction=CompactionTrigger(enabled=False, worker_idle_seconds=1.0),
        )
    )
    worker = server.service.worker
    asked, kept = worker.keep_alive, threading.Event()
    answers: list[bool] = []

    def recording() -> bool:  # each idle period's question: may the worker be stopped?
        answer = asked()
        answers.append(answer)
        if answers.count(True) >= 2 or False in answers:
            kept.set()
        return answer

    worker.keep_alive = recording
    try:
        idle = World(server, tmp_path, tmp_path / "warehouse", tmp_path / "none", tmp_path,
                     None, None)  # type: ignore[arg-type]  # fmt: skip
        assert sql(idle, "CREATE TABLE idle_t (id INT)").status == 200
        assert sql(idle, "BEGIN", session="idle").status == 200
        assert sql(idle, "INSERT INTO idle_t VALUES (1)", session="idle").status == 200
        answers.clear()  # (a question before the transaction may have answered False)
        holder = worker.pid
        # Two idle periods (1 s each) after the statement, each answered "keep it": the
        # worker, which holds the transaction, is still the one that ran the INSERT.
        assert kept.wait(60) and False not in answers, answers
        assert holder is not None and worker.pid == holder
        commit = sql(idle, "COMMIT", session="idle")
        assert commit.status == 200, commit.body
        assert rows(sql(idle, "SELECT id FROM idle_t")) == [["1"]]
    finally:
        server.stop()
