"""A table dropped or replaced behind a service (by another service sharing its catalog,
on SQLite or PostgreSQL), and the flusher's accounting of the batches it takes: each is
committed, put back or freed with its channel told, never lost with its buffer room."""

from __future__ import annotations

import functools
import urllib.parse

import pytest

from flush import TableWriter
from tests.http_calls import call_url

#: One HTTP call: (status, the answer's JSON).
call = functools.partial(call_url, timeout=60)


def create(url, columns=None):
    status, answer = call(url, "POST", "/v1/tables",
                          {"name": "db.s.t", "columns": columns or {"ID": "INT"}})  # fmt: skip
    assert status == 201, answer
    return answer


def open_channel(url, channel="c"):
    status, answer = call(url, "POST", "/v1/channels/open",
                          {"table": "db.s.t", "channel": channel, "max_client_lag": 0.05})  # fmt: skip
    assert status == 200, answer
    return answer


def insert(url, handle, seq, ids):
    query = urllib.parse.urlencode({"table": "db.s.t", "channel": handle["channel"],
                                    "generation": handle["generation"], "batch_seq": seq})  # fmt: skip
    return call(url, "POST", f"/v1/channels/rows?{query}",
                {"rows": [{"ID": n} for n in ids], "end_offset_token": str(seq)})  # fmt: skip


def wait(url, handle, seq, timeout=30):
    return call(url, "POST", "/v1/channels/wait", {
        "table": "db.s.t", "channel": handle["channel"], "generation": handle["generation"],
        "batch_seq": seq, "timeout": timeout}, timeout=timeout + 30)  # fmt: skip


def buffered(url) -> int:
    return call(url, "GET", "/health")[1]["buffer_bytes"]


@pytest.fixture(params=["sqlite", "postgres"])
def two_services(request, server_factory, tmp_path):
    """Two services on one warehouse and one catalog (its SQLite file, or PostgreSQL)."""
    overrides = {"warehouse": tmp_path / "shared"}
    if request.param == "postgres":
        overrides["catalog"] = request.getfixturevalue("postgres_dsn")
    return server_factory(**overrides), server_factory(**overrides)


def test_a_table_dropped_on_another_service_invalidates_its_channels_here(two_services):
    a, b = two_services
    create(a.url)
    handle = open_channel(a.url)
    assert insert(a.url, handle, 1, [1])[0] == 200
    assert wait(a.url, handle, 1)[1]["offset_token"] == "1"
    assert call(b.url, "DELETE", "/v1/tables/db.s.t")[0] == 200
    # A does not know yet: it takes the batch, and its flush finds the table gone.
    assert insert(a.url, handle, 2, range(1000))[0] == 200
    status, answer = wait(a.url, handle, 2)  # answered as soon as A finds out
    assert status == 409 and answer["error"]["code"] == "CHANNEL_INVALIDATED", answer
    assert "dropped" in answer["error"]["message"]
    assert buffered(a.url) == 0
    status, answer = insert(a.url, handle, 3, [3])
    assert status == 409 and "dropped" in answer["error"]["message"], answer
    status, answer = wait(a.url, handle, 2)
    assert status == 409 and "dropped" in answer["error"]["message"], answer
    assert buffered(a.url) == 0
    # The name is free again on A, with a new table and a new channel on it.
    create(a.url, {"ID": "INT", "X": "VARCHAR"})
    again = open_channel(a.url)
    assert insert(a.url, again, 1, [7])[0] == 200
    assert wait(a.url, again, 1)[1]["offset_token"] == "1"


def test_an_idle_channel_of_a_table_replaced_elsewhere_is_forgotten_at_the_next_open(
    two_services,
):
    a, b = two_services
    create(a.url)
    old = open_channel(a.url, "old")
    assert call(b.url, "DELETE", "/v1/tables/db.s.t")[0] == 200
    create(b.url, {"ID": "INT", "X": "VARCHAR"})
    new = open_channel(a.url, "new")
    assert new["columns"] == {"ID": "NUMBER(38,0)", "X": "VARCHAR(16777216)"}
    status, answer = insert(a.url, old, 1, [1])
    assert status == 409 and "dropped" in answer["error"]["message"], answer
    assert a.service.channels.live_tables.keys() == {a.service.tables.describe("db.s.t").id}


def test_a_landed_check_that_fails_puts_its_batches_back(server_factory, monkeypatch):
    """A commit lands but its call raises; the next attempt's check of the log (which
    batches it already holds) fails too: the batches go back to the buffer, and the
    attempt after finds them committed and acknowledges them, once."""
    import flush.commit as commit_module
    from flush.failpoints import InjectedFailure

    real_failpoint, real_landed = commit_module.failpoint, TableWriter.landed_positions
    fired: list[str] = []

    def lost_answer(name: str) -> None:
        if name == "after_delta_commit" and "commit" not in fired:
            fired.append("commit")
            raise InjectedFailure(name)
        real_failpoint(name)

    def failing_check(self, progress):
        if fired == ["commit"]:  # the flusher's check after the lost answer
            fired.append("check")
            raise OSError("the log could not be read this time")
        return real_landed(self, progress)

    monkeypatch.setattr(commit_module, "failpoint", lost_answer)
    monkeypatch.setattr(TableWriter, "landed_positions", failing_check)
    server = server_factory()
    create(server.url)
    handle = open_channel(server.url)
    assert insert(server.url, handle, 1, range(100))[0] == 200
    status, answer = wait(server.url, handle, 1)
    assert status == 200 and answer["committed"] and answer["offset_token"] == "1", answer
    assert fired == ["commit", "check"]
    assert buffered(server.url) == 0
    info = server.service.catalog.get_table("DB", "S", "T")
    from deltalake import DeltaTable

    assert sorted(DeltaTable(info.uri).to_pyarrow_table().column("ID").to_pylist()) == list(
        range(100)
    )


def test_a_table_replaced_or_clustered_elsewhere_is_described_as_it_is_now(two_services):
    a, b = two_services
    create(a.url)
    assert call(a.url, "GET", "/v1/tables/db.s.t")[0] == 200  # A has looked the table up
    assert call(b.url, "PUT", "/v1/tables/db.s.t/clustering", {"columns": ["ID"]})[0] == 200
    assert call(a.url, "GET", "/v1/tables/DB.S.T")[1]["clustering"] == ["ID"]
    assert call(b.url, "DELETE", "/v1/tables/db.s.t")[0] == 200
    status, answer = call(a.url, "GET", "/v1/tables/db.s.t")
    assert status == 404 and answer["error"]["code"] == "TABLE_NOT_FOUND", answer
    new = create(b.url, {"ID": "INT", "X": "VARCHAR"})
    described = call(a.url, "GET", "/v1/tables/db.s.t")[1]
    assert (described["location"], described["columns"]) == (new["location"], new["columns"])
    status, answer = call(a.url, "PUT", "/v1/tables/db.s.t/clustering", {"columns": ["X"]})
    assert status == 200 and answer["clustering"] == ["X"], answer
    handle = open_channel(a.url)
    assert insert(a.url, handle, 1, [1])[0] == 200
    assert wait(a.url, handle, 1)[1]["offset_token"] == "1"


def test_the_ingest_path_reads_no_table_definition_per_batch(server_factory, monkeypatch):
    """An insert and a wait find their table in the service's memory: a catalog read of the
    definition per batch would cost a round trip to PostgreSQL for each."""
    server = server_factory()
    create(server.url)
    handle = open_channel(server.url)
    catalog, reads = server.service.catalog, []

    def counted(name, real):
        def read(*args):
            reads.append(name)
            return real(*args)

        return read

    for name in ("get_table", "get_table_by_id", "list_tables"):
        monkeypatch.setattr(catalog, name, counted(name, getattr(catalog, name)))
    for seq in range(1, 21):
        assert insert(server.url, handle, seq, [seq])[0] == 200
    assert wait(server.url, handle, 20)[1]["offset_token"] == "20"
    assert reads == []
