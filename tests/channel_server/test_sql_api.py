"""POST /v1/sql: statements run in the service's Spark worker, through HTTP and the SDK."""

import contextlib
import json
import urllib.error
import urllib.request

import pyarrow as pa
import pytest

from channel_server import CompactionTrigger, ServerConfig
from ingest_sdk import StreamingIngestClient
from ingest_sdk.errors import SqlStatementError
from tests.servers import ThreadServer


@pytest.fixture(scope="module")
def sql_server(tmp_path_factory):
    """One server (and so one Spark worker) for the whole module: a worker start is seconds."""
    server = ThreadServer(
        ServerConfig(
            port=0,
            warehouse=tmp_path_factory.mktemp("sql") / "warehouse",
            compaction=CompactionTrigger(enabled=False),
        )
    )
    yield server
    with contextlib.suppress(Exception):
        server.stop()


@pytest.fixture(scope="module")
def client(sql_server):
    with StreamingIngestClient("sql-tests", sql_server.url) as made:
        yield made


def post(server, body, accept=None, raw=None):
    """``(status, body bytes, content type)`` of one POST /v1/sql."""
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(f"{server.url}/v1/sql", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read(), response.headers.get("Content-Type")
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers.get("Content-Type")


def test_statements_run_end_to_end_through_the_sdk(client):
    client.sql("CREATE TABLE api_t (a INT, b VARCHAR(5), c NUMBER(38, 2))")
    client.sql("CREATE STREAM api_s ON TABLE api_t")
    assert client.sql(
        "INSERT INTO api_t VALUES (1, 'x', 12345678901234567890.12), (2, NULL, 0)"
    ) == [{"number of rows inserted": 2}]
    changes = client.sql(
        "SELECT a, b, c, METADATA$ACTION AS action FROM api_s ORDER BY a", session="reader"
    )
    # Decimals come back as text: not one digit lost.
    assert changes == [
        {"A": "1", "B": "x", "C": "12345678901234567890.12", "ACTION": "INSERT"},
        {"A": "2", "B": None, "C": "0.00", "ACTION": "INSERT"},
    ]
    client.sql("CREATE TABLE api_target (a INT)")
    client.sql("INSERT INTO api_target SELECT a FROM api_s")
    assert client.sql("SELECT count(*) AS n FROM api_s") == [{"N": 0}]
    assert client.sql("SELECT a FROM api_target ORDER BY a") == [{"A": "1"}, {"A": "2"}]


def test_a_session_keeps_its_defaults_and_its_transaction(client):
    client.sql("CREATE TABLE OTHER.S1.TX (a INT)")
    client.sql("USE SCHEMA OTHER.S1", session="s1")
    client.sql("BEGIN", session="s1")
    client.sql("INSERT INTO tx VALUES (7)", session="s1")
    # Not committed: the session sees it, another session does not.
    assert client.sql("SELECT a FROM tx", session="s1") == [{"A": "7"}]
    assert client.sql("SELECT a FROM OTHER.S1.TX", session="s2") == []
    client.sql("COMMIT", session="s1")
    assert client.sql("SELECT a FROM OTHER.S1.TX", session="s2") == [{"A": "7"}]


def test_arrow_answer(sql_server, client):
    client.sql("CREATE TABLE api_arrow (a INT, s VARCHAR(10))")
    client.sql("INSERT INTO api_arrow VALUES (1, 'one'), (2, 'two')")
    status, body, kind = post(
        sql_server,
        {"statement": "SELECT * FROM api_arrow ORDER BY a"},
        accept="application/vnd.apache.arrow.stream",
    )
    assert (status, kind) == (200, "application/vnd.apache.arrow.stream")
    table = pa.ipc.open_stream(body).read_all()
    assert table.column("S").to_pylist() == ["one", "two"]


def test_max_rows_truncates_and_says_so(sql_server, client):
    status, body, _ = post(sql_server, {"statement": "SELECT id FROM range(25)", "max_rows": 10})
    answer = json.loads(body)
    assert status == 200
    assert (len(answer["rows"]), answer["truncated"]) == (10, True)


def test_sql_mistakes_are_400_with_the_statements_code(sql_server, client):
    with pytest.raises(SqlStatementError) as caught:
        client.sql("SELECT * FROM no_such_table")
    assert caught.value.sql_code == "OBJECT_NOT_FOUND"
    assert "NO_SUCH_TABLE" in str(caught.value)
    status, body, _ = post(sql_server, {"statement": "GRANT ALL ON t TO r"})
    error = json.loads(body)["error"]
    assert (status, error["code"], error["sql_code"]) == (400, "SQL_ERROR", "UNSUPPORTED_STATEMENT")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({}, '"statement" is required'),
        ({"statement": 5}, "must be a str"),
        ({"statement": "   "}, "1 to 1000000 characters"),
        ({"statement": "SELECT '" + "x" * 1_000_001 + "'"}, "1 to 1000000 characters"),
        ({"statement": "SELECT 1\x00"}, "NUL"),
        ({"statement": "SELECT 1", "session": "../etc"}, '"session" must be'),
        ({"statement": "SELECT 1", "session": "x" * 129}, '"session" must be'),
        ({"statement": "SELECT 1", "session": ""}, '"session" must be'),
        ({"statement": "SELECT 1", "max_rows": 0}, '"max_rows" must be'),
        ({"statement": "SELECT 1", "max_rows": 10**9}, '"max_rows" must be'),
        ({"statement": "SELECT 1", "max_rows": True}, "must be a int"),
        ({"statement": "SELECT 1", "timeout": 0}, '"timeout" must be'),
        ({"statement": "SELECT 1", "timeout": -1}, '"timeout" must be'),
        ({"statement": "SELECT 1", "timeout": 1e300}, '"timeout" must be'),
    ],
)
def test_hostile_bodies_are_refused_at_the_door(sql_server, client, body, fragment):
    before = client.list_tables()
    status, answer, kind = post(sql_server, body)
    error = json.loads(answer)["error"]
    assert (status, kind, error["code"]) == (400, "application/json", "BAD_REQUEST")
    assert fragment in error["message"]
    assert client.list_tables() == before


def test_a_body_that_is_not_json_is_refused(sql_server):
    status, answer, _ = post(sql_server, None, raw=b"{not json")
    assert status == 400
    assert json.loads(answer)["error"]["code"] == "BAD_REQUEST"


def test_a_statement_past_its_timeout_is_cancelled_and_the_next_one_runs(client):
    with pytest.raises(SqlStatementError) as caught:
        client.sql("SELECT count(*) FROM range(100000000000)", timeout=0.5)
    assert caught.value.sql_code == "STATEMENT_TIMEOUT"
    assert client.sql("SELECT 1 AS one") == [{"ONE": 1}]


def _metric(server, line_start):
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        text = response.read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(line_start)]  # fmt: skip
    return values[0] if values else 0.0


def test_metrics_count_statements_sessions_and_transactions(sql_server, client):
    ok = _metric(sql_server, 'ingest_sql_statements_total{outcome="OK"}')
    refused = _metric(sql_server, 'ingest_sql_statements_total{outcome="STATEMENT_NOT_ALLOWED"}')
    timed = _metric(sql_server, "ingest_sql_statement_seconds_count")
    transactions = _metric(sql_server, "ingest_sql_transactions_open ")
    client.sql("SELECT 1", session="metrics")
    with pytest.raises(SqlStatementError):
        client.sql("SELECT reflect('java.lang.System', 'getenv', 'HOME')")
    client.sql("BEGIN", session="metrics")
    assert _metric(sql_server, 'ingest_sql_statements_total{outcome="OK"}') == ok + 2
    assert _metric(sql_server, 'ingest_sql_statements_total{outcome="STATEMENT_NOT_ALLOWED"}') \
        == refused + 1
    assert _metric(sql_server, "ingest_sql_statement_seconds_count") == timed + 3
    assert _metric(sql_server, "ingest_sql_transactions_open ") == transactions + 1
    assert _metric(sql_server, "ingest_sql_sessions_open ") >= 1
    client.sql("ROLLBACK", session="metrics")
    assert client.close_sql_session("metrics") is True
    assert client.close_sql_session("metrics") is False
    assert _metric(sql_server, "ingest_sql_transactions_open ") == transactions
    assert _metric(sql_server, "ingest_spark_worker_restarts_total") == 0


def test_a_wait_for_another_commit_ends_with_the_statements_timeout(sql_server, client):
    """An UPDATE of a table whose rows a live transaction's commit holds waits at most
    the statement's timeout (not the 30 s intent wait), is told STATEMENT_TIMEOUT having
    changed nothing, and the worker answers the next statement."""
    import subprocess

    from catalog import ROWS_INTENT, CommitIntent
    from pipelines.transactions.commit_owner import process_identity

    client.sql("CREATE TABLE held_t (a INT)")
    client.sql("INSERT INTO held_t VALUES (1)")
    catalog = sql_server.service.catalog
    info = catalog.get_table("DB", "PUBLIC", "HELD_T")
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        owner = f"{process_identity(sleeper.pid)}:x"  # alive: nobody completes it
        pending = catalog.reserve_commit(owner, {"tables": []}, [CommitIntent(info.id, ROWS_INTENT)])
        with pytest.raises(SqlStatementError) as caught:
            client.sql("UPDATE held_t SET a = 2", timeout=1.5)
        assert caught.value.sql_code == "STATEMENT_TIMEOUT"
        assert client.sql("SELECT a FROM held_t") == [{"A": "1"}]  # NUMBER, exact as text
        catalog.abandon_commit(pending.id)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert int(client.sql("UPDATE held_t SET a = 2")[0]["number of rows updated"]) == 1
