"""Adversarial tests of the service on a catalog in PostgreSQL: what a client sends that
PostgreSQL stores differently from SQLite, two services racing on one warehouse, a
service SIGKILLed mid-flush, the PostgreSQL server restarted or stuck under a running
service, and hostile catalog URLs (the password must show nowhere).

A test marked ``xfail(strict=True, reason="DEFECT: ...")`` shows a defect: it asserts
what should happen and fails until the defect is fixed."""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from deltalake import DeltaTable

from catalog import open_catalog
from flush.commit import commits_after
from tests.http_calls import call_url as call
from tests.postgres_server import PostgresServer
from tests.servers import ROOT, free_port


def open_channel(url, channel, table="db.s.t"):
    status, answer = call(url, "POST", "/v1/channels/open",
                          {"table": table, "channel": channel, "max_client_lag": 0.05})  # fmt: skip
    assert status == 200, answer
    return answer


def insert(url, handle, seq, ids, token, table="db.s.t"):
    query = urllib.parse.urlencode({"table": table, "channel": handle["channel"],
                                    "generation": handle["generation"], "batch_seq": seq})  # fmt: skip
    return call(url, "POST", f"/v1/channels/rows?{query}",
                {"rows": [{"ID": n} for n in ids], "end_offset_token": token})  # fmt: skip


def wait(url, handle, seq, timeout=30, table="db.s.t"):
    return call(url, "POST", "/v1/channels/wait", {
        "table": table, "channel": handle["channel"], "generation": handle["generation"],
        "batch_seq": seq, "timeout": timeout}, timeout=timeout + 10)  # fmt: skip


def create_t(url):
    status, answer = call(url, "POST", "/v1/tables", {"name": "db.s.t", "columns": {"ID": "INT"}})
    assert status == 201, answer


def ids_in(uri):
    return sorted(DeltaTable(uri).to_pyarrow_dataset().to_table().column("ID").to_pylist())


@pytest.fixture
def own_postgres():
    """A cluster of this test's own, which it may stop, restart or reconfigure."""
    from tests.postgres_server import PostgresUnavailable

    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as error:
        pytest.skip(str(error))
    yield server
    server.stop()


def durable_database(server: PostgresServer) -> str:
    """A new database of ``server`` whose commits survive an immediate stop (the test
    cluster runs with synchronous_commit off; a per-database setting overrides that)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    dsn = server.create_database()
    with psycopg.connect(server.dsn, autocommit=True) as connection:
        name = conninfo_to_dict(dsn)["dbname"]
        connection.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = on')
    return dsn


def restart_postgres(server: PostgresServer) -> None:
    """Stop the cluster at once (as a crash would) and start it again on its port."""
    stop_postgres(server)
    assert server._run_postgres(server.port)


def stop_postgres(server: PostgresServer) -> None:
    subprocess.run(server._stop_command(), check=True, capture_output=True, timeout=120)
    server._process.wait(30)
    server._process = None


# --- 1. Values a client sends that PostgreSQL stores differently ---------------------------


def test_channel_calls_with_a_nul_in_the_name_answer_as_on_sqlite(
    server_factory, postgres_dsn, tmp_path
):
    servers = {"sqlite": server_factory(warehouse=tmp_path / "a"),
               "postgres": server_factory(warehouse=tmp_path / "b", catalog=postgres_dsn)}  # fmt: skip
    rows = "/v1/channels/rows?" + urllib.parse.urlencode(
        {"table": "db.s.t", "channel": "c\x00", "generation": 1, "batch_seq": 1}
    )
    calls = [
        ("POST", "/v1/channels/status", {"channels": [{"table": "db.s.t", "channel": "c\x00"}]}),
        ("POST", "/v1/channels/drop", {"table": "db.s.t", "channel": "c\x00"}),
        ("POST", "/v1/channels/wait",
         {"table": "db.s.t", "channel": "c\x00", "generation": 1, "batch_seq": 1}),
        ("POST", "/v1/channels/close", {"table": "db.s.t", "channel": "c\x00", "generation": 1}),
        ("POST", rows, {"rows": []}),
    ]  # fmt: skip
    answers = {}
    for kind, server in servers.items():
        create_t(server.url)
        answers[kind] = [call(server.url, *c)[0] for c in calls]
    assert answers["sqlite"] == [200, 404, 404, 404, 404]
    assert answers["postgres"] == answers["sqlite"]


def test_a_long_valid_table_name_is_created_as_on_sqlite(server_factory, postgres_dsn, tmp_path):
    rng = random.Random(7)
    part = lambda: '"' + "".join(chr(rng.randrange(0x20000, 0x2A6DF)) for _ in range(255)) + '"'  # noqa: E731
    name = ".".join(part() for _ in range(3))
    statuses = {}
    for kind, catalog in (("sqlite", None), ("postgres", postgres_dsn)):
        server = server_factory(warehouse=tmp_path / kind, catalog=catalog)
        statuses[kind] = call(server.url, "POST", "/v1/tables",
                              {"name": name, "columns": {"ID": "INT"}})[0]  # fmt: skip
    assert statuses == {"sqlite": 201, "postgres": 201}


def test_sql_with_a_nul_answers_as_on_sqlite(spark, postgres_dsn, tmp_path):
    from pipelines.session import Session

    statements = [
        "CREATE VIEW db.s.v1 COMMENT = 'a\x00b' AS SELECT id FROM db.s.t",
        "CREATE VIEW db.s.v2 AS SELECT id, 'x\x00y' AS w FROM db.s.t",
        "CREATE STREAM db.s.st1 ON TABLE db.s.t COMMENT = 'c\x00'",
        'SELECT * FROM db.s."t\x00"',
        'DESCRIBE TABLE db.s."t\x00"',
        'DROP TABLE db.s."t\x00"',
        'DROP VIEW IF EXISTS db.s."v\x00"',
        "ALTER DYNAMIC TABLE db.s.dt REFRESH",
    ]
    outcomes, history = {}, {}
    for kind, catalog in (("sqlite", None), ("postgres", postgres_dsn)):
        session = Session(tmp_path / kind, spark=spark, catalog=catalog)
        for setup in ("CREATE TABLE db.s.t (id INT, v STRING)", "INSERT INTO db.s.t VALUES (1, '1')",
                      "CREATE DYNAMIC TABLE db.s.dt TARGET_LAG = '1 hour' AS "
                      "SELECT id, CAST(v AS INT) AS n FROM db.s.t",
                      "INSERT INTO db.s.t VALUES (2, 'a\x00b')"):  # fmt: skip
            session.sql(setup).collect()
        outcomes[kind] = []
        for statement in statements:
            try:
                session.sql(statement).collect()
                outcomes[kind].append("ok")
            except Exception as exc:
                outcomes[kind].append(f"{type(exc).__module__}:{getattr(exc, 'code', None)}")
        table = session.catalog.get_table("DB", "S", "DT")
        history[kind] = [r.state for r in session.catalog.list_refreshes(table.id)]
        if catalog is not None:
            session.catalog.close()
    assert not any(o.startswith("psycopg") for o in outcomes["postgres"]), outcomes
    assert outcomes["postgres"] == outcomes["sqlite"]
    assert history["postgres"] == history["sqlite"] == ["FAILED", "SUCCEEDED"]


# --- 3. Two services on one warehouse ----------------------------------------------------


def test_create_if_not_exists_on_two_services_at_once_never_refuses(
    server_factory, postgres_dsn, tmp_path
):
    warehouse = tmp_path / "shared"
    a = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    b = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    statuses = []
    for n in range(4):
        go, got = threading.Barrier(2), []

        def create(server, n=n, go=go, got=got):
            go.wait()
            got.append(
                call(
                    server.url,
                    "POST",
                    "/v1/tables",
                    {"name": f"db.s.t{n}", "columns": {"ID": "INT"}, "if_not_exists": True},
                )
            )

        threads = [threading.Thread(target=create, args=(s,)) for s in (a, b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        statuses.append(sorted(status for status, _ in got))
        locations = {answer.get("location") for _, answer in got}
        assert len(locations - {None}) <= 1  # never two tables of one name
    assert statuses == [[200, 201]] * 4
    # The loser's own Delta folder is not left behind: one folder per table, the catalog's.
    folders = {str(path) for path in (warehouse / "DB" / "S").iterdir()}
    assert folders == {info.uri for info in a.service.catalog.list_tables()}


def test_a_commit_whose_index_failed_is_recorded_after_another_service_moved_on(
    server_factory, postgres_dsn, tmp_path
):
    import psycopg

    warehouse = tmp_path / "shared"
    a = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    b = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    create_t(a.url)
    on_a, on_b = open_channel(a.url, "from-a"), open_channel(b.url, "from-b")
    real, failed = a.service.catalog.apply_commit, []

    def apply_once_failing(table_id, record):
        if not failed:
            failed.append(record.version)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return real(table_id, record)

    a.service.catalog.apply_commit = apply_once_failing
    assert insert(a.url, on_a, 1, [1, 2], "a-2")[0] == 200
    assert wait(a.url, on_a, 1)[1]["offset_token"] == "a-2"  # acknowledged: committed
    assert insert(b.url, on_b, 1, [100], "b-100")[0] == 200
    assert wait(b.url, on_b, 1)[1]["offset_token"] == "b-100"
    again = open_channel(a.url, "from-a")  # the producer restarts and resumes
    resumed = again["offset_token"]
    if resumed is None:  # as a producer does: everything after its token, again
        insert(a.url, again, 1, [1, 2], "a-2")
        wait(a.url, again, 1)
    uri = a.service.catalog.get_table("DB", "S", "T").uri
    assert failed and resumed == "a-2"
    assert ids_in(uri) == [1, 2, 100]


def test_sigkill_after_the_delta_commit_while_another_service_commits(
    server_factory, process_server_factory, postgres_dsn
):
    """Service A SIGKILLed between its Delta commit and the catalog update while service B
    (same warehouse, same catalog) records a newer commit: A's start-up recovery finds
    its commit below the applied version (B's) by the channel's position in the log, and
    the reopen's fence reads the token from the log: the producer resumes after its rows."""
    a = process_server_factory("--catalog", postgres_dsn, failpoints="after_delta_commit=kill")
    b = server_factory(catalog=postgres_dsn)  # the same warehouse (tmp_path / "warehouse")
    create_t(b.url)
    a.start()
    on_a = open_channel(a.url, "from-a")
    insert(a.url, on_a, 1, [1, 2, 3], "a-3")
    assert a.wait_killed(60) != 0  # killed right after its Delta commit
    uri = b.service.catalog.get_table("DB", "S", "T").uri
    flushes = [c for r in commits_after(uri, -1) for c in r.channels if c.batch_seq > 0]
    assert [c.offset_token for c in flushes] == ["a-3"]  # the open's fence carries none
    on_b = open_channel(b.url, "from-b")
    insert(b.url, on_b, 1, [100], "b-100")
    assert wait(b.url, on_b, 1)[1]["offset_token"] == "b-100"
    a.start(failpoints="")  # its recovery finds the commit below B's
    info = b.service.catalog.get_table("DB", "S", "T")
    recorded = b.service.catalog.get_channel(info.id, "from-a")
    assert (recorded.offset_token, recorded.rows_committed) == ("a-3", 3)
    resumed = open_channel(a.url, "from-a")["offset_token"]
    assert resumed == "a-3"  # what the log holds for the channel


def test_sigkill_after_the_delta_commit_then_restart_keeps_every_offset_once(
    process_server_factory, postgres_dsn
):
    """One service on PostgreSQL, SIGKILLed between a Delta commit and its catalog
    update: its start-up recovery records the token, the producer resumes after it, and
    every row is in the table once."""
    server = process_server_factory("--catalog", postgres_dsn,
                                    failpoints="after_delta_commit=kill*1").start()  # fmt: skip
    create_t(server.url)
    handle = open_channel(server.url, "c")
    insert(server.url, handle, 1, [1, 2, 3], "3")
    assert server.wait_killed(60) != 0
    server.start(failpoints="")
    handle = open_channel(server.url, "c")
    assert handle["offset_token"] == "3"
    insert(server.url, handle, 1, [4, 5], "5")
    assert wait(server.url, handle, 1)[1]["offset_token"] == "5"
    catalog = open_catalog(postgres_dsn)
    info = catalog.get_table("DB", "S", "T")
    channel = catalog.get_channel(info.id, "c")
    catalog.close()
    assert (channel.offset_token, channel.rows_committed) == ("5", 5)
    assert ids_in(info.uri) == [1, 2, 3, 4, 5]
    flushes = [c for r in commits_after(info.uri, -1) for c in r.channels if c.batch_seq > 0]
    assert [c.offset_token for c in flushes] == ["3", "5"]  # the opens' fences carry no rows


def test_a_drop_on_another_service_invalidates_the_channel_and_frees_its_buffer(
    server_factory, postgres_dsn, tmp_path
):
    warehouse = tmp_path / "shared"
    a = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    b = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    create_t(a.url)
    handle = open_channel(a.url, "c")
    insert(a.url, handle, 1, [1], "1")
    assert wait(a.url, handle, 1)[1]["offset_token"] == "1"
    assert call(b.url, "DELETE", "/v1/tables/db.s.t")[0] == 200
    statuses = [insert(a.url, handle, seq, range(500), str(seq))[0] for seq in (2, 3)]
    time.sleep(3)  # several flush attempts
    waited = wait(a.url, handle, 3, timeout=2)
    buffered = call(a.url, "GET", "/health")[1]["buffer_bytes"]
    assert buffered == 0, f"{buffered} bytes held for batches no flush will take ({statuses})"
    assert waited[0] in (404, 409), waited  # told: table dropped / channel invalidated


def test_a_table_replaced_on_another_service_is_described_as_it_is_now(
    server_factory, postgres_dsn, tmp_path
):
    warehouse = tmp_path / "shared"
    a = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    b = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    create_t(a.url)
    assert call(a.url, "GET", "/v1/tables/db.s.t")[0] == 200  # A now knows the table
    assert call(b.url, "DELETE", "/v1/tables/db.s.t")[0] == 200
    status, new = call(b.url, "POST", "/v1/tables",
                       {"name": "db.s.t", "columns": {"ID": "INT", "X": "VARCHAR"}})  # fmt: skip
    assert status == 201
    described = call(a.url, "GET", "/v1/tables/db.s.t")[1]
    clustering = call(a.url, "PUT", "/v1/tables/db.s.t/clustering", {"columns": ["X"]})[0]
    compacting = call(a.url, "POST", "/v1/tables/db.s.t/compact")[0]
    assert (described["location"], described["columns"]) == (new["location"], new["columns"])
    assert clustering == 200 and compacting == 202


# --- 5. PostgreSQL stuck, stopped or restarted under a running service ----------------------


def waiting_for_the_lock(peer) -> int:
    """How many sessions wait for the catalog's advisory lock (held by ``peer``)."""
    return int(peer.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                            "AND NOT granted").fetchone()[0])  # fmt: skip


def test_a_peer_holding_the_catalog_lock_does_not_freeze_the_service(server_factory, postgres_dsn):
    """While another process holds the catalog's advisory lock (a peer service paused,
    partitioned or stuck inside a write transaction), a flush and a change of clustering
    wait for it in worker threads, each on a connection of its own: reads, /health and
    the event loop go on, and both complete once the peer lets go."""
    import psycopg

    from catalog.postgres import CATALOG_LOCK

    server = server_factory(catalog=postgres_dsn)
    create_t(server.url)
    handle = open_channel(server.url, "c")
    peer = psycopg.connect(postgres_dsn, autocommit=True)
    peer.execute("SELECT pg_advisory_lock(%s)", (CATALOG_LOCK,))
    clustered: list[tuple] = []
    clustering = threading.Thread(target=lambda: clustered.append(call(
        server.url, "PUT", "/v1/tables/db.s.t/clustering", {"columns": ["ID"]}, timeout=60)))  # fmt: skip
    try:
        insert(server.url, handle, 1, [1], "1")  # its flush waits in reserve_row_ids
        clustering.start()
        deadline = time.monotonic() + 60
        while waiting_for_the_lock(peer) < 2:
            assert time.monotonic() < deadline, "the flush and the clustering never waited"
            time.sleep(0.01)
        # Each would wait for the lock's 30 s timeout if it waited behind them.
        listed = call(server.url, "GET", "/v1/tables", timeout=20)[0]
        described = call(server.url, "GET", "/v1/tables/db.s.t", timeout=20)[0]
        health = call(server.url, "GET", "/health", timeout=20)[0]
        assert waiting_for_the_lock(peer) == 2  # all answered while both still waited
    finally:
        peer.execute("SELECT pg_advisory_unlock(%s)", (CATALOG_LOCK,))
        peer.close()
        clustering.join()
    assert (listed, described, health) == (200, 200, 200)
    assert wait(server.url, handle, 1)[1]["offset_token"] == "1"  # once the peer lets go
    assert clustered[0][0] == 200 and clustered[0][1]["clustering"] == ["ID"], clustered


def test_postgres_killed_after_a_delta_commit_then_everything_restarted(
    server_factory, own_postgres, tmp_path
):
    """PostgreSQL dies between a flush's Delta commit and its catalog update: the
    producer was acknowledged (the commit stands); later flushes fail and nothing is
    acknowledged that is not committed. After PostgreSQL and the service restart, the
    token is the log's and every row is in the table once."""
    dsn = durable_database(own_postgres)
    server = server_factory(catalog=dsn, warehouse=tmp_path / "w")
    create_t(server.url)
    handle = open_channel(server.url, "c")
    flusher = next(iter(server.service.channels._flushers.values()))
    real = flusher.writer.commit_flush

    def commit_then_lose_postgres(*args, **kwargs):
        committed = real(*args, **kwargs)
        stop_postgres(own_postgres)
        return committed

    flusher.writer.commit_flush = commit_then_lose_postgres
    insert(server.url, handle, 1, [1, 2], "2")
    assert wait(server.url, handle, 1)[1]["offset_token"] == "2"  # the commit stands
    flusher.writer.commit_flush = real
    insert(server.url, handle, 2, [3], "3")
    status, answer = wait(server.url, handle, 2, timeout=2)
    assert status == 200 and answer["committed"] is False  # never acknowledged uncommitted
    server.stop()
    assert own_postgres._run_postgres(own_postgres.port)
    again = server_factory(catalog=dsn, warehouse=tmp_path / "w")
    handle = open_channel(again.url, "c")
    assert handle["offset_token"] == "2"
    insert(again.url, handle, 1, [3], "3")
    assert wait(again.url, handle, 1)[1]["offset_token"] == "3"
    uri = again.service.catalog.get_table("DB", "S", "T").uri
    assert ids_in(uri) == [1, 2, 3]


def test_a_service_recovers_or_says_so_after_postgres_restarts(
    server_factory, own_postgres, tmp_path
):
    """The PostgreSQL server restarts under a running service: its next calls reconnect,
    the flush commits, and /health says ok."""
    dsn = durable_database(own_postgres)
    server = server_factory(catalog=dsn, warehouse=tmp_path / "w")
    create_t(server.url)
    handle = open_channel(server.url, "c")
    insert(server.url, handle, 1, [1], "1")
    assert wait(server.url, handle, 1)[1]["offset_token"] == "1"
    restart_postgres(own_postgres)
    insert(server.url, handle, 2, [2], "2")
    committed = wait(server.url, handle, 2)[1].get("committed")
    health = call(server.url, "GET", "/health")
    listed = call(server.url, "GET", "/v1/tables")[0]
    assert committed and health[0] == 200 and health[1]["status"] == "ok", (health, listed)
    assert listed == 200
    assert ids_in(server.service.catalog.get_table("DB", "S", "T").uri) == [1, 2]


# --- 6. Hostile catalog URLs ---------------------------------------------------------------


def start_service(tmp_path, url, timeout=120):
    """``python -m channel_server`` with the catalog in INGEST_CATALOG (as the docs
    advise: not on the command line), expected to stop at start-up."""
    env = {**os.environ, "INGEST_CATALOG": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "channel_server", "--port", "0", "--warehouse",
         str(tmp_path / f"w{secrets.token_hex(4)}"), "--no-auto-compaction"],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture
def password_cluster(own_postgres):
    """``own_postgres`` with a role ``bob`` that logs in with a password (the test cluster
    trusts everyone otherwise), owning a database ``bobdb``; (server, password)."""
    import psycopg

    password = "Pw-" + secrets.token_hex(8)
    hba = own_postgres.folder / "data" / "pg_hba.conf"
    hba.write_text("host all bob 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    with psycopg.connect(own_postgres.dsn, autocommit=True) as connection:
        connection.execute(f"CREATE ROLE bob LOGIN PASSWORD '{password}'")
        connection.execute("CREATE DATABASE bobdb OWNER bob")
        connection.execute("CREATE DATABASE notbobs")  # bob may not create tables in it
        connection.execute("SELECT pg_reload_conf()")
    return own_postgres, password


def test_a_wrong_password_or_database_is_one_line_without_the_password(password_cluster, tmp_path):
    server, password = password_cluster
    port = server.port
    wrong = "Wrong-" + secrets.token_hex(6)
    cases = {
        "wrong password": f"postgresql://bob:{wrong}@127.0.0.1:{port}/bobdb",
        "unknown database": f"postgresql://bob:{password}@127.0.0.1:{port}/nosuchdb",
        "no server": f"postgresql://bob:{password}@127.0.0.1:{free_port()}/bobdb",
        "unreadable URL": f"postgresql://bob:{password}%zz@127.0.0.1:{port}/bobdb",
        "password in the query": f"postgresql://bob@127.0.0.1:{port}/bobdb?password={wrong}",
    }
    for case, url in cases.items():
        done = start_service(tmp_path, url)
        assert done.returncode == 2, (case, done.stderr[-2000:])
        assert done.stderr.startswith("error: cannot open the catalog in PostgreSQL"), case
        assert len(done.stderr.strip().splitlines()) == 1, (case, done.stderr)
        assert password not in done.stderr and wrong not in done.stderr, (case, done.stderr)
    right = open_catalog(f"postgresql://bob:{password}@127.0.0.1:{port}/bobdb")
    right.close()  # the right password opens it


def test_a_password_with_an_at_sign_is_not_printed(password_cluster, tmp_path):
    server, _ = password_cluster
    tail = "Tail" + secrets.token_hex(6)
    done = start_service(tmp_path, f"postgresql://bob:pa@{tail}@127.0.0.1:{server.port}/bobdb")
    assert done.returncode == 2, done.stderr[-2000:]
    assert tail not in done.stderr, done.stderr


def test_a_role_without_create_rights_is_one_line(password_cluster, tmp_path):
    server, password = password_cluster
    done = start_service(tmp_path, f"postgresql://bob:{password}@127.0.0.1:{server.port}/notbobs")
    assert password not in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr[-1500:]


def _command_lines() -> dict[int, str]:
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                continue
    return lines


def test_the_password_shows_nowhere_while_the_service_runs_sql(
    process_server_factory, postgres_dsn, monkeypatch, tmp_path
):
    """A service started with INGEST_CATALOG=URL holding a password (the test cluster
    trusts the login, so any password opens it) runs SQL in its Spark worker, fails some,
    and is asked for its metrics: no command line of any process (ps), no log, no metric
    and no HTTP answer holds the password."""
    secret = "S3cret" + secrets.token_hex(8)
    url = postgres_dsn.replace("postgresql://postgres@", f"postgresql://postgres:{secret}@")
    monkeypatch.setenv("INGEST_CATALOG", url)
    server = process_server_factory().start()
    answers = []
    for statement in ("CREATE TABLE db.s.t (id INT)", "INSERT INTO db.s.t VALUES (1), (2)",
                      "SELECT id FROM db.s.t ORDER BY id", "SELECT * FROM db.s.missing",
                      'SELECT * FROM db.s."t\x00"', "CREATE VIEW db.s.v AS SELECT id FROM db.s.t",
                      "SHOW TABLES"):  # fmt: skip
        answers.append(call(server.url, "POST", "/v1/sql", {"statement": statement}, timeout=180))
        lines = _command_lines()  # while the worker (and its JVM) runs
        leaking = {pid: line[:200] for pid, line in lines.items() if secret in line}
        assert not leaking, leaking
    assert answers[0][0] == 200 and answers[3][0] == 400, answers[:4]
    answers.append(call(server.url, "GET", "/metrics"))
    answers.append(call(server.url, "GET", "/v1/tables"))
    answers.append(call(server.url, "GET", "/health"))
    server.stop()
    for status, answer in answers:
        text = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        assert secret.encode() not in text, (status, text[:300])
    logs = [server.log, *(tmp_path / "warehouse").rglob("*.log")]
    assert len(logs) >= 2  # the service's and its worker's
    for log in logs:
        assert secret not in log.read_text(errors="replace"), log
