"""The PostgreSQL catalog's connections: a call after the server dropped them reconnects,
a call is repeated only when nothing of it can have been committed, reads never wait
behind a write waiting for the catalog's lock, and an unreachable server is said so,
without the password."""

from __future__ import annotations

import threading
import time

import pytest

from catalog import CatalogUnavailableError, open_catalog
from catalog.postgres import CATALOG_LOCK
from catalog.postgres_pool import ConnectionLostError
from ingest_sdk import TableSchema

SCHEMA = TableSchema.parse({"ID": "INT"})
PASSWORD = "s3cret-never-shown"


def _dbname(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(dsn)["dbname"])


def _admin(postgres_server):
    import psycopg

    return psycopg.connect(postgres_server.dsn, autocommit=True)


def _end_sessions(admin, dsn: str) -> None:
    """End every session on the catalog's database, as a restart of the server does (each
    gone before this returns)."""
    admin.execute(
        "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE datname = %s",
        (_dbname(dsn),),
    )


def _allow_connections(admin, dsn: str, allowed: bool) -> None:
    admin.execute(f'ALTER DATABASE "{_dbname(dsn)}" ALLOW_CONNECTIONS {str(allowed).lower()}')


def _wait_for_lock_waiter(admin) -> None:
    """Until a session waits for the catalog's advisory lock (at most 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if admin.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                         "AND NOT granted").fetchone()[0]:  # fmt: skip
            return
        time.sleep(0.01)
    raise AssertionError("no session waits for the catalog's lock")


@pytest.fixture
def catalog(postgres_dsn):
    made = open_catalog(postgres_dsn)
    yield made
    made.close()


def test_calls_after_the_server_ended_every_session_reconnect(postgres_server, postgres_dsn):
    catalog = open_catalog(postgres_dsn)
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    with _admin(postgres_server) as admin:
        _end_sessions(admin, postgres_dsn)
        assert catalog.get_table("DB", "S", "T") == table  # a read
        _end_sessions(admin, postgres_dsn)
        assert catalog.open_channel(table.id, "c").generation == 1  # a write transaction
        _end_sessions(admin, postgres_dsn)
        assert catalog.create_database("D")[1]  # a list of writes
    assert catalog.unreachable() is None
    catalog.close()


def test_a_write_whose_connection_broke_before_commit_is_sent_again_once(catalog):
    # A sequence is not transactional: the first attempt ends its own session, the second
    # goes on; the database is recorded once.
    catalog._db.execute("CREATE SEQUENCE attempts")
    end_first = ("SELECT CASE WHEN nextval('attempts') = 1"
                 " THEN pg_terminate_backend(pg_backend_pid()) END")  # fmt: skip
    catalog._write([(end_first, ()), ("INSERT INTO databases VALUES (?, ?)", ("D", 1.0))])
    assert catalog._read("SELECT last_value FROM attempts") == [(2,)]
    assert [d.name for d in catalog.list_databases()] == ["D"]


def test_a_connection_lost_at_commit_is_an_unknown_outcome_never_repeated(catalog):
    # A deferred trigger ends the session while COMMIT runs: the client cannot know whether
    # it committed, so the call fails and is not sent again.
    for statement in (
        "CREATE SEQUENCE attempts",
        "CREATE TABLE doomed (x BIGINT)",
        "CREATE FUNCTION end_me() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$",
        "CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON doomed DEFERRABLE INITIALLY "
        "DEFERRED FOR EACH ROW EXECUTE FUNCTION end_me()",
    ):
        catalog._db.execute(statement)
    with pytest.raises(CatalogUnavailableError, match="whether it committed is unknown") as raised:
        catalog._write([("SELECT nextval('attempts')", ()), ("INSERT INTO doomed VALUES (1)", ())])
    assert not isinstance(raised.value, ConnectionLostError)
    assert catalog._read("SELECT last_value FROM attempts") == [(1,)]  # not sent again
    assert catalog._read("SELECT count(*) FROM doomed") == [(0,)]


def test_a_session_ended_inside_a_transaction_commits_nothing(postgres_server, catalog):
    with (
        _admin(postgres_server) as admin,
        pytest.raises(ConnectionLostError),
        catalog._immediate() as db,
    ):
        db.execute("INSERT INTO databases VALUES (?, ?)", ("D", 1.0))
        pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]
        admin.execute("SELECT pg_terminate_backend(%s, 30000)", (pid,))
        db.execute("INSERT INTO databases VALUES (?, ?)", ("E", 1.0))
    assert catalog.list_databases() == []


def test_reads_do_not_wait_behind_a_write_waiting_for_the_lock(postgres_dsn, catalog):
    import psycopg

    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    with psycopg.connect(postgres_dsn, autocommit=True) as peer:  # advisory locks: per database
        peer.execute("SELECT pg_advisory_lock(%s)", (CATALOG_LOCK,))
        writer = threading.Thread(target=catalog.open_channel, args=(table.id, "c"))
        try:
            writer.start()
            _wait_for_lock_waiter(peer)
            assert catalog.list_tables() == [table]
            assert catalog.get_channel(table.id, "c") is None
            assert writer.is_alive()  # the read answered while the write still waited
        finally:
            peer.execute("SELECT pg_advisory_unlock(%s)", (CATALOG_LOCK,))
        writer.join()
    assert catalog.get_channel(table.id, "c").generation == 1


def test_an_unreachable_server_is_said_so_without_the_password(postgres_server, postgres_dsn):
    # The test cluster trusts every login, so the password is taken and never checked.
    dsn = postgres_dsn.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    catalog = open_catalog(dsn)
    with _admin(postgres_server) as admin:
        try:
            _allow_connections(admin, dsn, False)
            _end_sessions(admin, dsn)
            with pytest.raises(CatalogUnavailableError, match="is unreachable") as raised:
                catalog.list_tables()
            problem = catalog.unreachable()
            assert problem is not None and "is unreachable" in problem
        finally:
            _allow_connections(admin, dsn, True)
    assert PASSWORD not in str(raised.value) and PASSWORD not in problem
    assert catalog.list_tables() == []  # back: the next call connects again
    assert catalog.unreachable() is None
    catalog.close()


def test_a_write_that_waited_out_the_lock_timeout_says_the_catalog_is_busy(postgres_dsn, catalog):
    import psycopg

    catalog._db.execute("SET lock_timeout = '50ms'")  # the pool's one connection (30 s)
    with psycopg.connect(postgres_dsn, autocommit=True) as peer:
        peer.execute("SELECT pg_advisory_lock(%s)", (CATALOG_LOCK,))
        with pytest.raises(CatalogUnavailableError, match="is busy: another process held"):
            catalog.create_database("D")
        peer.execute("SELECT pg_advisory_unlock(%s)", (CATALOG_LOCK,))
    assert catalog.list_databases() == []
    assert catalog.create_database("D")[1]  # the peer let go
