"""SQL sessions across a restart of the whole service: a session that held a transaction
is told, never runs its next statements in auto-commit, and a COMMIT never answers
success for it."""

from __future__ import annotations

import contextlib

import pytest

from channel_server import CompactionTrigger, ServerConfig
from ingest_sdk import StreamingIngestClient
from ingest_sdk.errors import SqlStatementError
from tests.servers import ThreadServer


def make_server(warehouse):
    return ThreadServer(ServerConfig(port=0, warehouse=warehouse,
                                     compaction=CompactionTrigger(enabled=False)))  # fmt: skip


def sql_error(client, statement, session=None):
    with pytest.raises(SqlStatementError) as caught:
        client.sql(statement, session=session)
    return caught.value


def test_a_transaction_open_when_the_service_stopped_is_aborted_after_it(tmp_path):
    warehouse = tmp_path / "warehouse"
    server = make_server(warehouse)
    try:
        with StreamingIngestClient("restart", server.url) as client:
            client.sql("CREATE TABLE r (a INT)")
            client.sql("USE SCHEMA DB.PUBLIC", session="keeps")
            for name in ("s1", "s2"):
                client.sql("BEGIN", session=name)
                client.sql("INSERT INTO r VALUES (1)", session=name)
            client.sql("ROLLBACK", session="s2")  # ended before the stop: nothing to tell
            error = sql_error(client, "COMMIT")  # no session: no transaction to commit
            assert error.sql_code == "NO_TRANSACTION"
    finally:
        server.stop()

    server = make_server(warehouse)
    try:
        with StreamingIngestClient("restart", server.url) as client:
            # The statement meant for the lost transaction is refused, not auto-committed.
            error = sql_error(client, "INSERT INTO r VALUES (2)", session="s1")
            assert error.sql_code == "TRANSACTION_ABORTED"
            assert "restarted" in str(error)
            error = sql_error(client, "COMMIT", session="s1")
            assert error.sql_code == "TRANSACTION_ABORTED"
            assert client.sql("SELECT count(*) AS n FROM r") == [{"N": 0}]
            # The block is over: the session works again, in auto-commit.
            client.sql("INSERT INTO r VALUES (3)", session="s1")
            assert client.sql("SELECT a FROM r") == [{"A": "3"}]
            # A session that had none runs on; a COMMIT without BEGIN commits nothing.
            client.sql("SELECT 1", session="s2")
            assert sql_error(client, "COMMIT", session="s2").sql_code == "NO_TRANSACTION"
    finally:
        with contextlib.suppress(Exception):
            server.stop()
