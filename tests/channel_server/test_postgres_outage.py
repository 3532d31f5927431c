"""The service while its PostgreSQL catalog cannot be reached: calls that need the catalog
answer 503 ``CATALOG_UNAVAILABLE``, ``/health`` answers 503, neither shows the password,
rows wait in the buffer and commit once when the catalog is back, and a Delta commit whose
catalog update failed is recorded then without waiting for more rows.

The outage is made by the server itself: the catalog's database stops taking connections
and its sessions are ended (as a restart ends them), so the test needs no cluster of its
own."""

from __future__ import annotations

import json
import time

import psycopg
import pytest

from catalog import open_catalog
from tests.channel_server.test_postgres_catalog_attacks import (
    call,
    create_t,
    ids_in,
    insert,
    open_channel,
    wait,
)

PASSWORD = "s3cret-never-shown"


def _dbname(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    return str(conninfo_to_dict(dsn)["dbname"])


class Outage:
    """Cuts the catalog's database off (no new connections, every session ended) and
    brings it back."""

    def __init__(self, postgres_server, dsn: str) -> None:
        self._admin = psycopg.connect(postgres_server.dsn, autocommit=True)
        self._name = _dbname(dsn)

    def begin(self) -> None:
        self._admin.execute(f'ALTER DATABASE "{self._name}" ALLOW_CONNECTIONS false')
        self._admin.execute(
            "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity WHERE datname = %s",
            (self._name,),
        )

    def end(self) -> None:
        self._admin.execute(f'ALTER DATABASE "{self._name}" ALLOW_CONNECTIONS true')

    def close(self) -> None:
        self.end()
        self._admin.close()


@pytest.fixture
def dsn(postgres_dsn):
    """The test's database, with a password in its URL (the test cluster trusts every
    login, so it is taken and never checked): no answer may show it."""
    return postgres_dsn.replace("postgres@", f"postgres:{PASSWORD}@", 1)


@pytest.fixture
def outage(postgres_server, dsn):
    made = Outage(postgres_server, dsn)
    yield made
    made.close()


def test_calls_answer_503_while_the_catalog_is_unreachable_and_rows_commit_after(
    server_factory, dsn, outage
):
    server = server_factory(catalog=dsn)
    create_t(server.url)
    handle = open_channel(server.url, "c")
    insert(server.url, handle, 1, [1], "1")
    assert wait(server.url, handle, 1)[1]["offset_token"] == "1"
    outage.begin()
    try:
        accepted = insert(server.url, handle, 2, [2], "2")[0]  # a channel open here: buffered
        listed = call(server.url, "GET", "/v1/tables")
        opened = call(server.url, "POST", "/v1/channels/open", {"table": "db.s.t", "channel": "d"})
        health = call(server.url, "GET", "/health")
        waited = wait(server.url, handle, 2, timeout=0.2)
    finally:
        outage.end()
    # No commit without the catalog: the flush cannot reserve its row ids.
    assert accepted == 200 and waited[1].get("committed") is False, waited
    for status, answer in (listed, opened):
        assert status == 503 and answer["error"]["code"] == "CATALOG_UNAVAILABLE", answer
        assert "is unreachable" in answer["error"]["message"], answer
    assert health[0] == 503 and health[1]["status"] == "unavailable", health
    assert "is unreachable" in health[1]["catalog"]
    assert PASSWORD not in json.dumps([listed, opened, health])
    # Back: the rows buffered meanwhile commit once, and the service says it is well.
    assert wait(server.url, handle, 2)[1]["offset_token"] == "2"
    assert ids_in(server.service.catalog.get_table("DB", "S", "T").uri) == [1, 2]
    assert call(server.url, "GET", "/health") == (200, {"status": "ok", "buffer_bytes": 0})
    assert call(server.url, "GET", "/v1/tables")[0] == 200


def test_a_commit_whose_catalog_update_failed_is_recorded_once_the_catalog_is_back(
    server_factory, dsn, outage
):
    server = server_factory(catalog=dsn)
    create_t(server.url)
    handle = open_channel(server.url, "c")
    flusher = next(iter(server.service.channels._flushers.values()))
    real = flusher.writer.commit_flush

    def commit_then_lose_the_catalog(*args, **kwargs):
        committed = real(*args, **kwargs)
        outage.begin()
        return committed

    flusher.writer.commit_flush = commit_then_lose_the_catalog
    try:
        insert(server.url, handle, 1, [1, 2], "2")
        assert wait(server.url, handle, 1)[1]["offset_token"] == "2"  # the commit stands
    finally:
        flusher.writer.commit_flush = real
        outage.end()
    catalog = open_catalog(dsn)
    try:
        table = catalog.get_table("DB", "S", "T")
        deadline = time.monotonic() + 60
        while catalog.get_channel(table.id, "c").offset_token != "2":  # no more rows sent
            assert time.monotonic() < deadline, "the catalog never recorded the commit"
            time.sleep(0.05)
        assert catalog.get_channel(table.id, "c").rows_committed == 2
    finally:
        catalog.close()
    assert ids_in(table.uri) == [1, 2]
