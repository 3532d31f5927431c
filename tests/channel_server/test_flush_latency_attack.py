"""Adversarial round on 72f2f11 (issue 31, first step): flush latency shortcuts.

Attacked:

* ``flush.commit.TableWriter``: the log is refreshed once per flush, channel positions are
  cached per log version and, after the writer's own commit, assumed at base + 1 without a
  reload. Races with other writers of the same table: a second writer with a newer
  generation of a channel (must fence, before and between the check and the commit), a
  plain ``write_deltalake`` append or a compaction-like rewrite between flushes or between
  check and commit (positions looked up again, the record names the version that really
  holds the flush), a commit that raises after it landed (retried inside the writer, or
  by the flusher with more rows pending: no row twice).
* ``channel_server.flusher``: row ids, commit and catalog update in one worker thread; a
  landed commit whose call raised, or whose catalog update failed, followed by more rows,
  a reopen of the channel or a restart (the catalog is the index reopens read tokens from).
* ``ingest_sdk.channel.AsyncChannel.wait_for_commit``: answers from the remembered newest
  committed position, across a reopen by another handle, a SIGKILLed server, waits with
  explicit tokens out of order, reused tokens and waits after the handle failed.
* Exactly-once under SIGKILL at the ``after_parquet_write``, ``before_delta_commit`` and
  ``after_delta_commit`` failpoints with several channels committing in one flush.

Invariant: no row lost or duplicated, no token reported committed before it is durable,
a stale writer is fenced, every answer a user gets is true. Defects are strict xfails; all
but the SDK's remembered-token one also fail on 72f2f11's parent (they predate it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter

import aiohttp
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from flush import ChannelProgress, TableWriter, commits_after, create_table
from flush.commit import ChannelFencedError, app_id
from flush.failpoints import InjectedFailure
from ingest_sdk import (
    ChannelInvalidatedError,
    OpenChannelRequest,
    RetryPolicy,
    StreamingIngestClient,
    TableSchema,
    convert_rows,
)
from ingest_sdk.wire import pack_txn_version
from tests.http_calls import call

TABLE = "db.s.t"
COLUMNS = {"ID": "INT NOT NULL"}
SCHEMA = TableSchema.parse(COLUMNS)


# -- helpers ----------------------------------------------------------------------------------


def part(*ids: int) -> pa.Table:
    batch, _ = convert_rows(SCHEMA, [{"ID": i} for i in ids])
    return pa.Table.from_batches([batch])


def log_ids(uri: str) -> list[int]:
    return [int(v) for v in DeltaTable(uri).to_pyarrow_table().column("ID").to_pylist()]


def assert_once(uri: str, expected: list[int]) -> None:
    ids = log_ids(uri)
    doubled = sorted(n for n, c in Counter(ids).items() if c > 1)
    assert not doubled, f"rows committed twice: {doubled[:10]}"
    assert sorted(ids) == sorted(expected), "rows lost"


def flush_version(uri: str, channel: str, generation: int, batch_seq: int) -> int:
    """The log version whose commit metadata carries this channel position."""
    (version,) = [
        record.version
        for record in commits_after(uri, -1)
        if any(
            (c.channel, c.generation, c.batch_seq) == (channel, generation, batch_seq)
            for c in record.channels
        )
    ]
    return version


class Http:
    """The channel API with a plain HTTP client (each answer is an explicit event)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def create_table(self) -> str:
        status, body, _ = await call(self.session, "POST", "/v1/tables",
                                     json={"name": TABLE, "columns": COLUMNS, "if_not_exists": True})  # fmt: skip
        assert status in (200, 201), body
        return body["location"]

    async def open(self, channel: str, lag: float = 600.0) -> int:
        status, body, _ = await call(self.session, "POST", "/v1/channels/open",
                                     json={"table": TABLE, "channel": channel, "max_client_lag": lag})  # fmt: skip
        assert status == 200, body
        return body["generation"]

    async def rows(self, channel: str, generation: int, seq: int, ids: range | list[int]) -> None:
        path = (f"/v1/channels/rows?table={TABLE}&channel={channel}"
                f"&generation={generation}&batch_seq={seq}")  # fmt: skip
        status, body, _ = await call(self.session, "POST", path,
                                     json={"rows": [{"ID": n} for n in ids],
                                           "end_offset_token": str(list(ids)[-1])})  # fmt: skip
        assert status == 200 and body["accepted_rows"] == len(ids), body

    async def wait(self, channel: str, generation: int, seq: int, timeout: float = 60) -> tuple:
        return await call(self.session, "POST", "/v1/channels/wait",
                          json={"table": TABLE, "channel": channel, "generation": generation,
                                "batch_seq": seq, "timeout": timeout})  # fmt: skip

    async def committed(self, channel: str, generation: int, seq: int) -> str:
        status, body, _ = await self.wait(channel, generation, seq)
        assert status == 200 and body["committed"], body
        return body["offset_token"]


@contextlib.asynccontextmanager
async def http_to(url: str):
    async with aiohttp.ClientSession(base_url=url) as session:
        yield Http(session)


# -- the flusher: a commit that raised after it landed -----------------------------------------


def lose_the_first_answer_and_hold_its_retry(monkeypatch):
    """The first flush's commit lands but its call raises (``landed`` is set then); its
    retry waits for ``release``. Returns (landed, release)."""
    import flush.commit as commit_module
    from channel_server.flusher import TableFlusher

    landed, release = threading.Event(), threading.Event()
    real_failpoint, real_flush = commit_module.failpoint, TableFlusher.flush_once

    def lost_answer(name: str) -> None:
        if name == "after_delta_commit" and not landed.is_set():
            landed.set()  # the commit is in the log; its caller sees an error
            raise InjectedFailure("after_delta_commit")
        real_failpoint(name)

    async def held_retry(self: TableFlusher) -> None:
        if landed.is_set() and not release.is_set():  # the retry waits for the newcomer
            await asyncio.get_running_loop().run_in_executor(None, release.wait, 60)
        await real_flush(self)

    monkeypatch.setattr(commit_module, "failpoint", lost_answer)
    monkeypatch.setattr(TableFlusher, "flush_once", held_retry)
    return landed, release


# FIXED (was a defect, found in this round; it predates 72f2f11).
@pytest.mark.parametrize("newcomer", ["same channel", "another channel"])
async def test_a_landed_commit_that_raised_is_not_committed_again_with_newer_rows(
    server_factory, monkeypatch, newcomer
):
    landed, release = lose_the_first_answer_and_hold_its_retry(monkeypatch)
    server = server_factory()
    try:
        async with http_to(server.url) as api:
            uri = await api.create_table()
            a = await api.open("a", lag=0.05)
            b = await api.open("b", lag=0.05)
            await api.rows("a", a, 1, range(0, 10))
            assert await asyncio.to_thread(landed.wait, 60)
            if newcomer == "same channel":
                await api.rows("a", a, 2, range(10, 20))
            else:
                await api.rows("b", b, 1, range(10, 20))
            release.set()
            if newcomer == "same channel":
                assert await api.committed("a", a, 2) == "19"
            else:
                assert await api.committed("b", b, 1) == "19"
                assert await api.committed("a", a, 1) == "9"
            assert_once(uri, list(range(20)))
    finally:
        release.set()


async def test_a_landed_commit_that_raised_and_is_retried_alone_commits_once(
    server_factory, monkeypatch
):
    """The same flush again (nothing arrived meanwhile): the retry finds its commit."""
    import flush.commit as commit_module

    monkeypatch.setattr(commit_module, "failpoint", _raise_once("after_delta_commit"))
    server = server_factory()
    async with http_to(server.url) as api:
        uri = await api.create_table()
        a, b = await api.open("a", lag=0.05), await api.open("b", lag=600)
        await api.rows("b", b, 1, range(100, 110))
        await api.rows("a", a, 1, range(0, 10))
        assert await api.committed("a", a, 1) == "9"
        assert await api.committed("b", b, 1) == "109"
        assert_once(uri, [*range(10), *range(100, 110)])
        assert applied_version(server) == flush_version(uri, "a", a, 1)


async def open_answer(api: Http, channel: str, lag: float = 0.05) -> dict:
    status, body, _ = await call(api.session, "POST", "/v1/channels/open",
                                 json={"table": TABLE, "channel": channel, "max_client_lag": lag})  # fmt: skip
    assert status == 200, body
    return body


# FIXED (was a defect, found in this round; it predates 72f2f11).
async def test_a_reopen_after_a_landed_commit_that_raised_answers_the_landed_token(
    server_factory, monkeypatch
):
    landed, release = lose_the_first_answer_and_hold_its_retry(monkeypatch)
    server = server_factory()
    try:
        async with http_to(server.url) as api:
            uri = await api.create_table()
            old = await api.open("a", lag=0.05)
            await api.rows("a", old, 1, range(0, 10))
            assert await asyncio.to_thread(landed.wait, 60)
            assert sorted(log_ids(uri)) == list(range(10))  # durable, token "9" in the log
            reopened = await open_answer(api, "a")
            release.set()
            # The recovery recipe: resume right after the token the reopen answered.
            token = reopened["offset_token"]
            start = int(token) + 1 if token is not None else 0
            await api.rows("a", reopened["generation"], 1, range(start, 20))
            assert await api.committed("a", reopened["generation"], 1) == "19"
            assert_once(uri, list(range(20)))
            assert token == "9"
    finally:
        release.set()


def fail_first_catalog_update(monkeypatch, catalog) -> list[int]:
    """The catalog's first ``apply_commit`` raises (as a locked database would); returns
    the list that gets the version it failed for."""
    real_apply, failed = catalog.apply_commit, []

    def apply_once_failing(table_id, record):
        if not failed:
            failed.append(record.version)
            raise RuntimeError("database is locked")
        return real_apply(table_id, record)

    monkeypatch.setattr(catalog, "apply_commit", apply_once_failing)
    return failed


# FIXED (was a defect, found in this round; it predates 72f2f11).
async def test_a_reopen_after_a_failed_catalog_update_answers_the_committed_token(
    server_factory, monkeypatch
):
    server = server_factory()
    catalog = server.service.catalog
    failed = fail_first_catalog_update(monkeypatch, catalog)
    async with http_to(server.url) as api:
        uri = await api.create_table()
        old = await api.open("a", lag=0.05)
        await api.rows("a", old, 1, range(0, 10))
        assert await api.committed("a", old, 1) == "9"  # the user is told "9" is committed
        assert failed
        reopened = await open_answer(api, "a")
        token = reopened["offset_token"]
        start = int(token) + 1 if token is not None else 0
        await api.rows("a", reopened["generation"], 1, range(start, 20))
        assert await api.committed("a", reopened["generation"], 1) == "19"
        assert_once(uri, list(range(20)))
        assert token == "9"


# FIXED (was a defect, found in this round; it predates 72f2f11).
async def test_a_failed_catalog_update_is_replayed_even_after_a_later_one_succeeded(
    server_factory, monkeypatch
):
    server = server_factory()
    warehouse = server.config.warehouse
    catalog = server.service.catalog
    failed = fail_first_catalog_update(monkeypatch, catalog)
    async with http_to(server.url) as api:
        uri = await api.create_table()
        b = await api.open("b", lag=0.05)
        await api.rows("b", b, 1, range(100, 110))
        assert await api.committed("b", b, 1) == "109"
        a = await api.open("a", lag=0.05)
        await api.rows("a", a, 1, range(0, 10))
        assert await api.committed("a", a, 1) == "9"
    assert len(failed) == 1
    await asyncio.to_thread(server.stop)
    restarted = server_factory(warehouse=warehouse)
    async with http_to(restarted.url) as api:
        reopened = await open_answer(api, "b")
        token = reopened["offset_token"]
        start = int(token) + 1 if token is not None else 100
        await api.rows("b", reopened["generation"], 1, range(start, 120))
        assert await api.committed("b", reopened["generation"], 1) == "119"
        assert_once(uri, [*range(10), *range(100, 120)])
        assert token == "109"


# -- TableWriter against other writers of the same table ---------------------------------------


def between_check_and_commit(monkeypatch, action) -> None:
    """Run ``action`` once, while the next flush writes its Parquet file: after its check
    of the channels, before its commit."""
    import flush.commit as commit_module

    write = commit_module.write_parquet_file

    def meanwhile(*args, **kwargs):
        monkeypatch.setattr(commit_module, "write_parquet_file", write)  # once
        action()
        return write(*args, **kwargs)

    monkeypatch.setattr(commit_module, "write_parquet_file", meanwhile)


@pytest.fixture
def uri(tmp_path) -> str:
    folder = str(tmp_path / "table")
    create_table(folder, SCHEMA)
    return folder


def foreign_rows(writer: TableWriter, *ids: int) -> pa.Table:
    """Rows as another tool would append them (row ids far from the writer's)."""
    return part(*ids).append_column(
        writer.arrow_schema.field("_INGEST_ROW_ID"),
        pa.array([10_000 + i for i in ids], pa.int64()),
    )


def test_a_newer_generation_one_version_after_the_writers_own_commit_fences_it(uri):
    """The writer's cache says the log is at its own commit (base + 1) with a, b at
    generation 1; another writer commits a at generation 2 exactly one version later."""
    writer = TableWriter(uri, SCHEMA)
    first = writer.commit_flush(
        [part(1), part(2)],
        [ChannelProgress("a", 1, 1, "1", 1), ChannelProgress("b", 1, 1, "2", 1)],
        0,
    )
    newer = TableWriter(uri, SCHEMA).commit_flush(
        [part(3)], [ChannelProgress("a", 2, 1, "g2", 1)], 10
    )
    assert newer.version == first.version + 1
    with pytest.raises(ChannelFencedError) as fenced:
        writer.commit_flush(
            [part(4), part(5)],
            [ChannelProgress("b", 1, 2, "5", 1), ChannelProgress("a", 1, 2, "4", 1)], 2,
        )  # fmt: skip
    assert fenced.value.channels == ["a"]
    # b alone still commits, right above the newest version, and a keeps generation 2.
    record = writer.commit_flush([part(5)], [ChannelProgress("b", 1, 2, "5", 1)], 3)
    table = DeltaTable(uri)
    assert record.version == table.version() == newer.version + 1
    assert table.transaction_version(app_id("a")) == pack_txn_version(2, 1)
    assert table.transaction_version(app_id("b")) == pack_txn_version(1, 2)
    assert_once(uri, [1, 2, 3, 5])


def test_a_newer_generation_between_the_check_and_the_commit_fences_any_channel(uri, monkeypatch):
    """Three channels in the flush; the newer generation (of the last one) lands while the
    Parquet file is written: the refused commit must check every channel again."""
    import flush.commit as commit_module

    writer = TableWriter(uri, SCHEMA)
    channels = [ChannelProgress(c, 1, 1, c, 1) for c in ("a", "b", "c")]
    writer.commit_flush([part(1), part(2), part(3)], channels, 0)
    write = commit_module.write_parquet_file

    def meanwhile(*args, **kwargs):
        monkeypatch.setattr(commit_module, "write_parquet_file", write)
        TableWriter(uri, SCHEMA).commit_flush([part(9)], [ChannelProgress("c", 2, 1, "g2", 1)], 9)
        return write(*args, **kwargs)

    monkeypatch.setattr(commit_module, "write_parquet_file", meanwhile)
    with pytest.raises(ChannelFencedError) as fenced:
        writer.commit_flush(
            [part(4), part(5), part(6)],
            [ChannelProgress(c, 1, 2, c, 1) for c in ("a", "b", "c")],
            3,
        )
    assert fenced.value.channels == ["c"]
    assert_once(uri, [1, 2, 3, 9])


@pytest.mark.parametrize("moment", ["between flushes", "between check and commit"])
@pytest.mark.parametrize("other", ["append", "compaction"])
def test_another_writers_commit_is_followed_and_the_flush_lands_above_it(
    uri, monkeypatch, moment, other
):
    """A plain write_deltalake append or a compaction-like rewrite (no app transactions)
    moves the log: the writer follows its positions through that commit (its commit file
    read once, no lookup of each position), the commit lands above it and the record
    names the version that really holds the flush (the catalog applies it)."""

    writer = TableWriter(uri, SCHEMA)
    for seq in (1, 2, 3):
        writer.commit_flush([part(seq)], [ChannelProgress("a", 1, seq, str(seq), 1)], seq)

    def other_commit() -> None:
        if other == "append":
            write_deltalake(uri, foreign_rows(writer, 500), mode="append")
        else:
            assert DeltaTable(uri).optimize.compact()["numFilesRemoved"] >= 2

    looked_up = []
    lookup = DeltaTable.transaction_version
    monkeypatch.setattr(DeltaTable, "transaction_version",
                        lambda table, app: looked_up.append(app) or lookup(table, app))  # fmt: skip
    if moment == "between flushes":
        other_commit()
    else:
        between_check_and_commit(monkeypatch, other_commit)
    record = writer.commit_flush([part(4)], [ChannelProgress("a", 1, 4, "4", 1)], 4)
    assert looked_up == [], "the positions were looked up again, not followed"
    assert record.version == flush_version(uri, "a", 1, 4) == DeltaTable(uri).version()
    # The next flush: the log is at the writer's own commit again.
    again = writer.commit_flush([part(5)], [ChannelProgress("a", 1, 5, "5", 1)], 5)
    assert again.version == record.version + 1 == flush_version(uri, "a", 1, 5)
    assert DeltaTable(uri).transaction_version(app_id("a")) == pack_txn_version(1, 5)
    expected = [1, 2, 3, 4, 5] + ([500] if other == "append" else [])
    assert_once(uri, expected)


@pytest.mark.parametrize("then", ["nothing", "an append", "a newer generation"])
def test_a_commit_refused_after_it_landed_is_found_not_committed_again(uri, monkeypatch, then):
    """delta-rs raises CommitFailedError although the commit file is in the log (a lost
    answer); before the retry another writer may commit too. The retry must find the
    flush landed (never commit it twice) and return the version that holds it."""
    from deltalake.exceptions import CommitFailedError

    writer = TableWriter(uri, SCHEMA)
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0)
    real = DeltaTable.create_write_transaction
    calls = []

    def landed_then_refused(table, *args, **kwargs):
        if table is not writer._table:  # the other writer's commit
            return real(table, *args, **kwargs)
        calls.append(1)
        real(table, *args, **kwargs)
        if len(calls) == 1:
            if then == "an append":
                write_deltalake(uri, foreign_rows(writer, 500), mode="append")
            elif then == "a newer generation":
                TableWriter(uri, SCHEMA).commit_flush(
                    [part(9)], [ChannelProgress("b", 2, 1, "g2", 1)], 9
                )
            raise CommitFailedError("the answer was lost")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", landed_then_refused)
    channels = [ChannelProgress("a", 1, 2, "2", 1), ChannelProgress("b", 1, 1, "b", 1)]
    if then == "a newer generation":
        # b moved past this flush: fenced (the flusher invalidates b's handle), and the
        # flusher's next attempt, without b, finds a's position landed.
        with pytest.raises(ChannelFencedError):
            writer.commit_flush([part(2), part(3)], channels, 1)
        record = writer.commit_flush([part(2)], channels[:1], 1)
    else:
        record = writer.commit_flush([part(2), part(3)], channels, 1)
    assert len(calls) == 1
    assert record.version == flush_version(uri, "a", 1, 2) == flush_version(uri, "b", 1, 1)
    assert record.rows == 2 and record.next_row_id == 3
    # The writer goes on from the newest log, whatever it cached.
    monkeypatch.setattr(DeltaTable, "create_write_transaction", real)
    if then == "a newer generation":
        with pytest.raises(ChannelFencedError):
            writer.commit_flush([part(4)], [ChannelProgress("b", 1, 2, "b2", 1)], 3)
    writer.commit_flush([part(5)], [ChannelProgress("a", 1, 3, "3", 1)], 4)
    expected = [1, 2, 3, 5] + {"nothing": [], "an append": [500], "a newer generation": [9]}[then]
    assert_once(uri, expected)


def test_a_commit_that_raised_after_it_landed_retried_as_it_was_is_found(uri, monkeypatch):
    """Not a CommitFailedError (a post-commit hook failing): commit_flush raises, and the
    same flush again finds its commit instead of writing the rows twice."""
    import flush.commit as commit_module

    writer = TableWriter(uri, SCHEMA)
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0)
    monkeypatch.setitem(commit_module.__dict__, "failpoint", _raise_once("after_delta_commit"))
    channels = [ChannelProgress("a", 1, 2, "2", 1), ChannelProgress("b", 1, 1, "b", 1)]
    with pytest.raises(InjectedFailure):
        writer.commit_flush([part(2), part(3)], channels, 1)
    record = writer.commit_flush([part(2), part(3)], channels, 1)
    assert record.version == flush_version(uri, "a", 1, 2) == DeltaTable(uri).version()
    assert_once(uri, [1, 2, 3])


def _raise_once(point: str):
    fired = []

    def failpoint(name: str) -> None:
        if name == point and not fired:
            fired.append(name)
            raise InjectedFailure(name)

    return failpoint


# -- the server's writer against writers of other processes -----------------------------------


def applied_version(server) -> int:
    (info,) = [t for t in server.service.catalog.list_tables() if t.name == "T"]
    return info.applied_version


@pytest.mark.parametrize("moment", ["between flushes", "between check and commit"])
async def test_a_newer_generation_from_another_process_fences_the_server(
    server_factory, monkeypatch, moment
):
    """The server's writer committed the channel (its cache: the log is at its own commit);
    another process commits a newer generation of the channel exactly one version later,
    before the next flush or while it writes its file. The server must be fenced: the stale
    batch is not committed and its wait says the handle is invalidated, never committed."""

    server = server_factory()
    async with http_to(server.url) as api:
        uri = await api.create_table()
        gen = await api.open("a", lag=0.05)
        await api.rows("a", gen, 1, range(0, 10))
        assert await api.committed("a", gen, 1) == "9"
        base = DeltaTable(uri).version()

        def newer_generation() -> None:
            TableWriter(uri, SCHEMA).commit_flush(
                [part(500)], [ChannelProgress("a", gen + 1, 1, "500", 1)], 10_000
            )

        if moment == "between flushes":
            newer_generation()
        else:
            between_check_and_commit(monkeypatch, newer_generation)
        await api.rows("a", gen, 2, range(10, 20))
        status, body, _ = await api.wait("a", gen, 2)
        assert status == 409 and body["error"]["code"] == "CHANNEL_INVALIDATED", body
        assert DeltaTable(uri).version() == base + 1  # only the other process's commit
        assert_once(uri, [*range(10), 500])


@pytest.mark.parametrize("moment", ["between flushes", "between check and commit"])
@pytest.mark.parametrize("other", ["append", "compaction"])
async def test_the_catalog_applies_the_version_that_holds_the_flush(
    server_factory, monkeypatch, moment, other
):
    """Another process appends (write_deltalake) or rewrites files (compaction-like) while
    the server flushes: the flush lands above it, the version the catalog records is the
    one that holds the flush, and a restart replays nothing twice."""

    server = server_factory()
    warehouse = server.config.warehouse
    async with http_to(server.url) as api:
        uri = await api.create_table()
        gen = await api.open("a", lag=0.05)
        for seq in (1, 2, 3):
            await api.rows("a", gen, seq, [seq])
            assert await api.committed("a", gen, seq) == str(seq)

        def other_commit() -> None:
            if other == "append":
                writer = TableWriter(uri, SCHEMA)
                write_deltalake(uri, foreign_rows(writer, 500), mode="append")
            else:
                assert DeltaTable(uri).optimize.compact()["numFilesRemoved"] >= 2

        if moment == "between flushes":
            other_commit()
        else:
            between_check_and_commit(monkeypatch, other_commit)
        await api.rows("a", gen, 4, [4])
        assert await api.committed("a", gen, 4) == "4"
        assert (
            applied_version(server) == flush_version(uri, "a", gen, 4) == DeltaTable(uri).version()
        )
        await api.rows("a", gen, 5, [5])
        assert await api.committed("a", gen, 5) == "5"
        assert applied_version(server) == flush_version(uri, "a", gen, 5)
    await asyncio.to_thread(server.stop)
    restarted = server_factory(warehouse=warehouse)
    async with http_to(restarted.url) as api:
        assert (await open_answer(api, "a"))["offset_token"] == "5"
    assert_once(uri, [1, 2, 3, 4, 5] + ([500] if other == "append" else []))


# -- the SDK's remembered answers --------------------------------------------------------------


REQUEST = OpenChannelRequest("a", "DB", "S", "T")


def raw_wait(url: str, generation: int, seq: int) -> dict:
    """Another reader's wait (not through the handle, so it remembers nothing of it)."""
    import json
    import urllib.request

    body = json.dumps({"table": TABLE, "channel": "a", "generation": generation,
                       "batch_seq": seq, "timeout": 30}).encode()  # fmt: skip
    request = urllib.request.Request(url + "/v1/channels/wait", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def insert_and_wait(channel, n: int) -> str:
    channel.insert_rows([{"ID": n}], end_offset_token=str(n))
    return channel.wait_for_commit(str(n), timeout=30)


def test_remembered_answers_across_a_reopen_by_another_handle(server, client_factory):
    """The old handle's remembered positions are committed (true even after the reopen);
    anything it did not hear committed, and every wait after it failed, goes to the
    server and is refused as invalidated, never answered from memory."""
    client = client_factory(server.url)
    uri = client.create_table(TABLE, COLUMNS)["location"]
    old = client.open_channel(REQUEST)
    for n in range(3):
        assert insert_and_wait(old, n) == str(n)
    new = client_factory(server.url).open_channel(REQUEST)
    assert new.get_latest_committed_offset_token() == "2"
    assert insert_and_wait(new, 3) == "3"
    assert old.wait_for_commit("1", timeout=30) in ("2", "3")  # committed: a true answer
    assert old.wait_for_commit(timeout=30) in ("2", "3")  # all it inserted is committed
    old.insert_rows([{"ID": 99}], end_offset_token="99")  # refused: the handle was replaced
    with pytest.raises(ChannelInvalidatedError):
        old.wait_for_commit("99", timeout=30)
    with pytest.raises(ChannelInvalidatedError):  # after the error: no answer from memory
        old.wait_for_commit("1", timeout=30)
    assert new.wait_for_commit(timeout=30) == "3"
    assert_once(uri, [0, 1, 2, 3])


def test_explicit_tokens_out_of_order_and_reused(server, client_factory):
    """Waits for tokens in any order, and a token reused in a later batch: each answer is a
    committed token, and a reused token that was sent again waits for its new batch."""
    client = client_factory(server.url)
    uri = client.create_table(TABLE, COLUMNS)["location"]
    channel = client.open_channel(REQUEST)
    for n in range(5):
        channel.insert_rows([{"ID": n}], end_offset_token=f"t{n}")
    assert channel.wait_for_commit("t4", timeout=30) == "t4"
    for n in (3, 0, 2, 1):
        assert channel.wait_for_commit(f"t{n}", timeout=30) == "t4"
    channel.insert_rows([{"ID": 5}], end_offset_token="x")
    assert channel.wait_for_commit("x", timeout=30) == "x"
    channel.insert_rows([{"ID": 6}], end_offset_token="y")
    assert channel.wait_for_commit("y", timeout=30) == "y"
    channel.insert_rows([{"ID": 7}], end_offset_token="x")  # reused
    assert channel.wait_for_commit(timeout=30) == "x"  # everything inserted, with the new x
    assert channel.wait_for_commit("x", timeout=30) == "x"
    assert channel.get_latest_committed_offset_token() == "x"
    assert_once(uri, list(range(8)))


# FIXED (was a defect, minor, new in 72f2f11): the docstring promised "the committed
# token at that moment"; the contract is now a committed token at or after the one waited
# for, the newest an answer to this handle named (docs/sdk.md).
def test_an_answer_from_memory_names_a_committed_token_at_or_after_the_wait(server, client_factory):
    client = client_factory(server.url)
    client.create_table(TABLE, COLUMNS)
    channel = client.open_channel(REQUEST)
    assert insert_and_wait(channel, 0) == "0"
    channel.insert_rows([{"ID": 1}], end_offset_token="1")
    channel.wait_until_sent(timeout=30)  # received by the server, not committed:
    assert raw_wait(server.url, channel.generation, 2)["offset_token"] == "1"
    assert channel.get_latest_committed_offset_token() == "1"
    assert channel.wait_for_commit("0", timeout=30) == "0"  # the answer it had: committed
    assert channel.wait_for_commit("1", timeout=30) == "1"  # past it: the server answers


def test_remembered_answers_across_a_sigkilled_server(process_server_factory):
    """An answer the handle remembers was durable: it holds with the server dead and after
    its restart; anything newer is refused as invalidated, and the recipe commits once."""
    server = process_server_factory().start()
    client = StreamingIngestClient("p", url=server.url, max_client_lag=0.05,
                                   retry=RetryPolicy(deadline=2))  # fmt: skip
    try:
        uri = client.create_table(TABLE, COLUMNS)["location"]
        channel = client.open_channel(REQUEST)
        channel.insert_rows([{"ID": n} for n in range(10)], end_offset_token="9")
        assert channel.wait_for_commit(timeout=30) == "9"
        server.kill()
        assert sorted(log_ids(uri)) == list(range(10))  # what the answer said is durable
        assert channel.wait_for_commit("9", timeout=5) == "9"
        server.start()
        channel.insert_rows([{"ID": n} for n in range(10, 20)], end_offset_token="19")
        with pytest.raises(ChannelInvalidatedError):
            channel.wait_for_commit("19", timeout=30)
        with pytest.raises(ChannelInvalidatedError):
            channel.wait_for_commit(timeout=30)
        again = client.open_channel(REQUEST)
        token = again.get_latest_committed_offset_token()
        assert token == "9"
        again.insert_rows([{"ID": n} for n in range(int(token) + 1, 20)], end_offset_token="19")
        assert again.wait_for_commit(timeout=30) == "19"
        assert_once(uri, list(range(20)))
    finally:
        with contextlib.suppress(Exception):
            client.close()


# -- SIGKILL at the failpoints, several channels in one flush ----------------------------------


async def resume(url: str, channel: str, first: int, count: int) -> str | None:
    """The recovery recipe: reopen, read the committed token, send everything after it."""
    from ingest_sdk.client import AsyncStreamingIngestClient

    last = first + count - 1
    async with AsyncStreamingIngestClient("resume", url=url, max_client_lag=0.05,
                                          retry=RetryPolicy(deadline=10)) as client:  # fmt: skip
        handle = await client.open_channel(OpenChannelRequest(channel, "DB", "S", "T"))
        token = await handle.get_latest_committed_offset_token()
        start = int(token) + 1 if token is not None else first
        if start <= last:
            await handle.insert_rows([{"ID": n} for n in range(start, last + 1)],
                                     end_offset_token=str(last))  # fmt: skip
            assert await handle.wait_for_commit(timeout=60) == str(last)
        await handle.close()
        return token


@pytest.mark.parametrize(
    "point", ["after_parquet_write", "before_delta_commit", "after_delta_commit"]
)
async def test_sigkill_at_a_failpoint_with_three_channels_in_one_flush(
    process_server_factory, point
):
    """Channels a and b are buffered (long lag); c's short lag starts the flush, which takes
    all three into one commit and dies at ``point``. c's producer waits through the SDK: it
    must never hear "committed" from the dying server. After the restart each channel's
    token is exactly what the log holds, and the recipe commits every row once."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from ingest_sdk import IngestError
    from ingest_sdk.client import AsyncStreamingIngestClient

    server = process_server_factory(failpoints=f"{point}=kill").start()
    firsts = {"a": 0, "b": 1000, "c": 2000}
    async with http_to(server.url) as api:
        uri = await api.create_table()
        for name in ("a", "b"):
            generation = await api.open(name, lag=600)
            await api.rows(name, generation, 1, range(firsts[name], firsts[name] + 10))
        async with AsyncStreamingIngestClient("c", url=server.url, max_client_lag=0.05,
                                              retry=RetryPolicy(deadline=2)) as sdk:  # fmt: skip
            handle = await sdk.open_channel(OpenChannelRequest("c", "DB", "S", "T"))
            await handle.insert_rows([{"ID": n} for n in range(2000, 2010)],
                                     end_offset_token="2009")  # fmt: skip
            with pytest.raises(IngestError):  # the server died: no answer, never "committed"
                await handle.wait_for_commit(timeout=30)
            assert await asyncio.to_thread(server.wait_killed) != 0
            everything = [n for first in firsts.values() for n in range(first, first + 10)]
            if point == "after_delta_commit":
                assert_once(uri, everything)  # one commit for the three channels
                (record,) = [r for r in commits_after(uri, 0) if r.rows]  # not the opens' fences
                assert sorted(c.channel for c in record.channels) == ["a", "b", "c"]
            else:
                assert log_ids(uri) == []
                (orphan,) = (Path(uri) / "_ingest").glob("*.parquet")
                assert pq.read_table(orphan).num_rows == 30  # all three were in the flush
            server.start(failpoints="")
            with pytest.raises(ChannelInvalidatedError):  # the old handle learns nothing false
                await handle.wait_for_commit("2009", timeout=30)
    expected_token = {n: str(f + 9) if point == "after_delta_commit" else None
                      for n, f in firsts.items()}  # fmt: skip
    for name, first in firsts.items():
        assert await resume(server.url, name, first, 25) == expected_token[name]
    assert_once(uri, [n for first in firsts.values() for n in range(first, first + 25)])


async def test_concurrent_waits_answer_in_any_order(server):
    """Waits for five tokens at once, in scrambled order, on one handle: every answer is a
    committed token at or after the one waited for."""
    from ingest_sdk.client import AsyncStreamingIngestClient

    async with AsyncStreamingIngestClient("w", url=server.url, max_client_lag=0.05) as client:
        uri = (await client.create_table(TABLE, COLUMNS))["location"]
        handle = await client.open_channel(REQUEST)
        for n in range(5):
            await handle.insert_rows([{"ID": n}], end_offset_token=str(n))
        order = [3, 0, 4, 1, 2, 4, 0]
        answers = await asyncio.gather(*(handle.wait_for_commit(str(n), timeout=30) for n in order))
        for waited, answer in zip(order, answers, strict=True):
            assert answer is not None and int(answer) >= waited
        assert await handle.wait_for_commit(timeout=30) == "4"
        await handle.close()
    assert_once(uri, list(range(5)))
