"""``python -m pipelines``, run as a user runs it: a child process, a real warehouse, a live
service for ``--url``.

Each local run starts Spark in its child (seconds), so the local cases share runs where
they can; the ``--url`` cases share one in-process service (one Spark worker).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from channel_server import CompactionTrigger, ServerConfig
from ingest_sdk import StreamingIngestClient
from pipelines.__main__ import parse_args
from tests.servers import ROOT, ThreadServer

TOKEN = "cli-test-token"


def cli(*args: str, stdin: str | None = None, token: str | None = None,
        python: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python -m pipelines *args`` in the repository, without the caller's INGEST_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    env["PYTHONPATH"] = str(ROOT)
    if token is not None:
        env["INGEST_TOKEN"] = token
    return subprocess.run(
        [sys.executable, *python, "-m", "pipelines", *args],
        input=stdin if stdin is not None else "", capture_output=True, text=True, cwd=ROOT,
        env=env, timeout=600, check=False,
    )  # fmt: skip


def errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``error ...`` lines of a run's stderr (Spark's own log lines left out)."""
    return [line for line in done.stderr.splitlines() if line.startswith("error")]


def contents(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# The options, parsed by the real parser
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--format", "csv", "sql", "S"], ("csv", 10_000, None)),
        (["sql", "S", "--format", "json", "--max-rows", "3"], ("json", 3, None)),
        (["--format", "csv", "sql", "S", "--warehouse", "W"], ("csv", 10_000, "W")),
        (["--format", "csv", "--warehouse", "V", "sql", "--format", "json", "S"], ("json", 10_000, "V")),
        ([], ("table", 10_000, None)),
    ],
)  # fmt: skip
def test_options_go_before_or_after_the_sub_command(argv, expected):
    args = parse_args(argv)
    assert (args.format, args.max_rows, args.warehouse) == expected


@pytest.mark.parametrize(
    "argv",
    [
        ["--url", "http://127.0.0.1:1", "--warehouse", "W"],
        ["sql", "S", "--url", "http://127.0.0.1:1", "--create"],
        ["--url", "127.0.0.1:8080"],
        ["--max-rows", "0"],
    ],
)
def test_option_mistakes_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


# A folder that is not a warehouse (no Spark starts: the check comes first)
def test_a_folder_without_a_warehouse_is_refused_and_nothing_is_created(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = cli("--warehouse", str(empty), "sql", "SELECT 1")
    assert done.returncode == 2, done.stderr
    (line,) = errors(done)
    assert line.startswith(f"error: {empty} holds no warehouse (no catalog.sqlite)")
    assert "--create" in line
    assert contents(empty) == []
    missing = tmp_path / "missing" / "deeper"
    done = cli("sql", "SELECT 1", "--warehouse", str(missing))
    assert done.returncode == 2 and "holds no warehouse" in done.stderr
    assert not (tmp_path / "missing").exists()


def test_a_foreign_catalog_file_is_refused_even_with_create(tmp_path):
    (tmp_path / "catalog.sqlite").write_bytes(b"somebody else's file\n")
    done = cli("--warehouse", str(tmp_path), "--create", "sql", "SELECT 1")
    assert done.returncode == 2
    assert "its catalog.sqlite is not a catalog database" in done.stderr
    assert (tmp_path / "catalog.sqlite").read_bytes() == b"somebody else's file\n"
    assert contents(tmp_path) == ["catalog.sqlite"]


# Local runs (each starts Spark in the child)
def test_create_then_options_after_the_sub_command(tmp_path):
    warehouse = tmp_path / "made"
    done = cli("sql", "CREATE TABLE T (ID INT NOT NULL, NAME VARCHAR(5))",
               "--format", "json", "--warehouse", str(warehouse), "--create")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"status": "Table T successfully created."}
    assert (warehouse / "catalog.sqlite").is_file()


def test_prompt_runs_a_last_statement_without_semicolon_and_names_the_warehouse(tmp_path):
    warehouse = tmp_path / "warehouse"
    script = (
        "CREATE TABLE T (ID INT NOT NULL, NAME VARCHAR(5));\n"
        "INSERT INTO T VALUES (1, 'a'),\n  (2, NULL);\n"
        "SELECT * FROM NOPE;\n"
        "SELECT id, name\nFROM t\nORDER BY id"  # no ';' and no newline: runs at EOF
    )
    done = cli("--warehouse", str(warehouse), "--create", "--format", "csv", stdin=script)
    assert done.stdout.splitlines() == [
        "status", "Table T successfully created.",
        "number of rows inserted", "2",
        "ID,NAME", "1,a", "2,NULL",
    ]  # fmt: skip
    # The prompt carries on after a mistake and exits 1 for it.
    assert done.returncode == 1
    (line,) = errors(done)
    assert line.startswith("error OBJECT_NOT_FOUND: object DB.PUBLIC.NOPE does not exist")
    assert line.endswith(f"(warehouse {warehouse.resolve()})")
    assert "sql> " not in done.stdout  # no prompt when stdin is not a terminal
    # Said once: a running service answers faster than the Spark started here.
    assert done.stderr.count("--url http://host:port") == 1, done.stderr[-3000:]


# --url: statements to a live service
@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One service (and so one Spark worker) for the module, with a token required."""
    server = ThreadServer(
        ServerConfig(
            port=0,
            warehouse=tmp_path_factory.mktemp("cli") / "warehouse",
            compaction=CompactionTrigger(enabled=False),
            auth_tokens=frozenset({TOKEN}),
        )
    )
    yield server
    with contextlib.suppress(Exception):
        server.stop()


@pytest.fixture(scope="module")
def client(service):
    with StreamingIngestClient("cli-tests", service.url, token=TOKEN) as made:
        yield made


def remote(service, *args: str, stdin: str | None = None):
    return cli("--url", service.url, "--token", TOKEN, *args, stdin=stdin)


def test_url_create_insert_select_round_trip(service):
    done = remote(service, "sql", "CREATE TABLE RT (ID INT NOT NULL, NAME VARCHAR(5))")
    assert (done.returncode, done.stdout) == (0, (
        "status                        \n"
        "------------------------------\n"
        "Table RT successfully created.\n"
        "(1 row)\n"
    )), done.stderr  # fmt: skip
    done = remote(service, "sql", "INSERT INTO rt VALUES (1, 'a'), (2, NULL), (3, 'c');")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2] == "3                      "
    # Options after the sub-command, as locally; the token from $INGEST_TOKEN.
    done = cli("sql", "SELECT id, name FROM rt ORDER BY id", "--format", "json",
               "--max-rows", "2", "--url", service.url, token=TOKEN)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        '{"ID":"1","NAME":"a"}',
        '{"ID":"2","NAME":null}',
        "... more rows left out (--max-rows 2)",
    ]


def test_url_errors_print_code_and_name_the_service(service):
    done = remote(service, "sql", "SELECT * FROM NOPE")
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = errors(done)
    assert line.startswith("error OBJECT_NOT_FOUND: object DB.PUBLIC.NOPE does not exist")
    assert line.endswith(f"(warehouse of the service at {service.url})")
    done = cli("--url", service.url, "--token", "wrong", "sql", "SELECT 1")
    assert done.returncode == 1
    assert errors(done) == [
        "error UNAUTHENTICATED: missing or wrong token: pass --token TOKEN or set "
        "$INGEST_TOKEN to a token the service was started with"
    ]


def test_url_unsupported_statement_fits_on_a_line_unless_verbose(service):
    done = remote(service, "sql", "FROBNICATE T")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error UNSUPPORTED_STATEMENT: unsupported statement 'FROBNICATE T' (--verbose prints "
        "the whole message)"
    ]
    done = remote(service, "--verbose", "sql", "FROBNICATE T")
    assert done.returncode == 1
    assert "; supported: SELECT" in done.stderr and len(done.stderr) > 500


def test_url_script_is_cut_at_semicolons_outside_comments_and_quotes(service, client):
    script = (
        "CREATE TABLE CUT (S VARCHAR(10));  -- a note after the semicolon\n"
        "INSERT INTO cut VALUES ('a;b'), ('it''s'), ('x--y'); /* ; */\n"
        "SELECT s FROM cut ORDER BY s;\n"
        "-- a last comment is no statement\n"
    )
    done = remote(service, "--format", "csv", stdin=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-4:] == ["S", "a;b", "it's", "x--y"]
    assert "\r" not in done.stdout  # CSV lines end with LF


def test_url_unterminated_input_runs_nothing(service, client):
    done = remote(service, stdin="CREATE TABLE NEVER (ID INT);\nSELECT 'open\n")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: unterminated string starting at line 2, column 8: nothing was run"
    ]
    assert client.sql("SHOW TABLES LIKE 'NEVER'") == []
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    env["PYTHONPATH"] = str(ROOT)
    binary = subprocess.run(
        [sys.executable, "-m", "pipelines", "--url", service.url, "--token", TOKEN],
        input=b"SELECT 1;\n\xff\x00\n", capture_output=True, cwd=ROOT, env=env, timeout=300,
        check=False,
    )  # fmt: skip
    assert binary.returncode == 2
    assert binary.stderr.decode().splitlines() == [
        "error: the input is not UTF-8 text (byte 10: b'\\xff'); nothing was run"
    ]
    # A statement of more than 1,000,000 characters: the service refuses it, in one line.
    huge = remote(service, stdin=f"CREATE TABLE HUGE AS SELECT '{'x' * 1_000_000}' AS V;\n")
    assert huge.returncode != 0
    (line,) = huge.stderr.splitlines()
    assert "1 to 1000000 characters" in line.replace(",", ""), line
    assert client.sql("SHOW TABLES LIKE 'HUGE'") == []


def test_url_path_imports_no_spark_delta_arrow_or_sdk(service):
    """The client path, run in a fresh interpreter: ``--help`` and a statement over
    ``--url`` leave none of the heavy modules in ``sys.modules``."""
    code = (
        "import contextlib, sys\n"
        "from pipelines.__main__ import main\n"
        "with contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        f"assert main(['--url', {service.url!r}, '--token', {TOKEN!r}, 'sql', 'SELECT 1']) == 0\n"
        "heavy = ('pyspark', 'py4j', 'deltalake', 'pyarrow', 'numpy', 'pandas', 'aiohttp',\n"
        "         'ingest_sdk', 'catalog', 'flush', 'sqlglot', 'pipelines.session',\n"
        "         'pipelines.sql.statements', 'pipelines.change_sets')\n"
        "found = sorted(m for m in sys.modules if m.startswith(heavy))\n"
        "print('heavy modules:', found, file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == "heavy modules: []", done.stderr[-3000:]


def test_url_prompt_keeps_one_transaction_across_lines(service, client):
    client.sql("CREATE TABLE TX (ID INT)")
    script = (
        "BEGIN;\n"
        "INSERT INTO tx VALUES (1), (2);\n"
        "SELECT count(*) AS n FROM tx;\n"  # the transaction's own rows
        "COMMIT"  # the last line, without ';'
    )
    done = remote(service, "--format", "csv", stdin=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "status", "Statement executed successfully.",
        "number of rows inserted", "2",
        "N", "2",
        "status", "Statement executed successfully.",
    ]  # fmt: skip
    assert client.sql("SELECT id FROM tx ORDER BY id") == [{"ID": "1"}, {"ID": "2"}]
    # A transaction left open at the end of input is rolled back, as a local session's.
    done = remote(service, stdin="BEGIN;\nINSERT INTO tx VALUES (3);\n")
    assert done.returncode == 0, done.stderr
    assert client.sql("SELECT count(*) AS n FROM tx") == [{"N": 2}]


def test_url_database_and_schema_are_the_sessions_defaults(service, client):
    client.sql("CREATE TABLE OTHER.S1.HERE (ID INT)")
    client.sql("INSERT INTO OTHER.S1.HERE VALUES (7)")
    done = remote(service, "--database", "other", "--schema", "s1", "--format", "csv",
                  "sql", "SELECT id FROM here")  # fmt: skip
    assert (done.returncode, done.stdout.splitlines()) == (0, ["ID", "7"]), done.stderr


def test_url_mode_does_not_import_spark(service):
    done = cli("--url", service.url, "--token", TOKEN, "sql", "SELECT 1 AS one",
               python=("-X", "importtime"))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]  # fmt: skip
    assert "pipelines" in imported  # the check sees the imports
    assert not [name for name in imported if name.split(".")[0] in ("pyspark", "py4j")]


def test_url_and_local_print_the_same_text(service, client):
    """The same rows through the service (Arrow) and a local session (Spark's collect)."""
    client.sql("CREATE TABLE SAME (ID NUMBER(10,2), TS TIMESTAMP_LTZ, NTZ TIMESTAMP_NTZ, "
               "D DATE, F FLOAT, B BOOLEAN, S VARCHAR(3))")  # fmt: skip
    client.sql("INSERT INTO SAME VALUES (1.5, '2024-05-06 07:08:09', '2024-05-06 07:08:09', "
               "'2024-05-06', 0.25, TRUE, 'x'), (NULL, NULL, NULL, NULL, NULL, NULL, NULL)")  # fmt: skip
    script = (
        "SELECT * FROM same ORDER BY id;\n"
        "SELECT s, count(*) AS n FROM same GROUP BY s ORDER BY s\n"
    )
    by_url = remote(service, stdin=script)
    assert by_url.returncode == 0, by_url.stderr
    local = cli("--warehouse", str(service.config.warehouse), stdin=script)
    assert local.returncode == 0, local.stderr[-3000:]
    assert by_url.stdout == local.stdout
    row = by_url.stdout.splitlines()[3]
    assert row.startswith("1.50 | 2024-05-06 ") and row.endswith(
        " | 2024-05-06 07:08:09 | 2024-05-06 | 0.25 | True | x   "
    ), by_url.stdout
