"""Dynamic tables in the service: defined over ``POST /v1/sql``, refreshed on schedule by
the Spark worker's refresh loop (no client asks), fed by channels, and going on after
the worker is killed and after the service restarts."""

from __future__ import annotations

import contextlib
import time

import pytest

from channel_server import CompactionTrigger, ServerConfig
from ingest_sdk import OpenChannelRequest, StreamingIngestClient
from tests.servers import ThreadServer

WAIT = 180.0  # a worker (JVM) start on a loaded 2-core machine takes up to a minute


def config(warehouse, **overrides):
    return ServerConfig(port=0, warehouse=warehouse,
                        compaction=CompactionTrigger(enabled=False), **overrides)  # fmt: skip


def wait_until(check, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.5)


def ids(client, name):
    return sorted(int(r["ID"]) for r in client.sql(f"SELECT ID FROM {name}"))


def scheduled(client, name):
    return client.sql(
        "SELECT REFRESH_ACTION, STATE FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
        f"NAME => '{name}')) WHERE REFRESH_TRIGGER = 'SCHEDULED'"
    )


@pytest.fixture
def server(tmp_path):
    made = ThreadServer(config(tmp_path / "warehouse"))
    yield made
    with contextlib.suppress(Exception):
        made.stop()


def test_the_worker_refreshes_on_schedule_and_survives_kills_and_restarts(server, tmp_path):
    with StreamingIngestClient("dt-service", server.url) as client:
        client.sql("CREATE TABLE SRC (ID NUMBER, V VARCHAR)")
        client.sql("CREATE DYNAMIC TABLE DT TARGET_LAG = '5 seconds' AS "
                   "SELECT ID FROM SRC WHERE ID > 0")  # fmt: skip
        # Rows arrive through a channel; nobody asks for a refresh.
        channel = client.open_channel(OpenChannelRequest("feed", "DB", "PUBLIC", "SRC"))
        channel.insert_rows([{"ID": i, "V": "x"} for i in range(1, 6)], end_offset_token="5")
        channel.wait_for_commit("5", timeout=60)
        wait_until(lambda: ids(client, "DT") == [1, 2, 3, 4, 5], "a scheduled refresh")
        assert any(r["REFRESH_ACTION"] == "INCREMENTAL" for r in scheduled(client, "DT"))
        # The worker dies: the service starts it again and refreshes go on.
        server.run(server.service.worker.kill())
        channel.insert_rows([{"ID": 6, "V": "y"}], end_offset_token="6")
        channel.wait_for_commit("6", timeout=60)
        wait_until(lambda: ids(client, "DT") == [1, 2, 3, 4, 5, 6], "refreshes after a kill")
        channel.close()
    server.stop()
    # A new service on the same warehouse goes on with the schedule and the history.
    again = ThreadServer(config(tmp_path / "warehouse"))
    try:
        with StreamingIngestClient("dt-service-2", again.url) as client:
            before = len(scheduled(client, "DT"))
            client.sql("INSERT INTO SRC VALUES (7, 'z'), (-1, 'no')")
            wait_until(lambda: ids(client, "DT") == [1, 2, 3, 4, 5, 6, 7], "after a restart")
            assert len(scheduled(client, "DT")) > before
            failed = [r for r in scheduled(client, "DT") if r["STATE"] == "FAILED"]
            assert failed == []
    finally:
        again.stop()


def test_without_the_scheduler_nothing_refreshes_on_its_own(tmp_path):
    server = ThreadServer(config(tmp_path / "warehouse", refresh_scheduler=False))
    try:
        with StreamingIngestClient("dt-manual", server.url) as client:
            client.sql("CREATE TABLE SRC (ID NUMBER)")
            client.sql("CREATE DYNAMIC TABLE DT TARGET_LAG = '1 second' AS SELECT ID FROM SRC")
            client.sql("INSERT INTO SRC VALUES (1)")
            time.sleep(4)
            assert ids(client, "DT") == []
            assert scheduled(client, "DT") == []
            client.sql("ALTER DYNAMIC TABLE DT REFRESH")
            assert ids(client, "DT") == [1]
    finally:
        server.stop()
