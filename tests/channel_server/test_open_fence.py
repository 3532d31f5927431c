"""An open is a fence: two channel servers on one warehouse (one catalog file, one
folder), a producer moving from one to the other, and the rows the first one still
buffers for the superseded handle never commit after the new handle read its token.

The servers are real (in-process on their own loops, or processes that a failpoint
kills with SIGKILL); every wait is on an answer or an event, never a sleep.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter

import pytest
from deltalake import DeltaTable

from flush.commit import app_id, commits_after
from ingest_sdk import (
    ChannelInvalidatedError,
    OpenChannelRequest,
    RetryPolicy,
    StreamingIngestClient,
    TransportError,
)
from ingest_sdk.wire import pack_txn_version
from tests.channel_server.test_crash_recovery import (
    REQUEST,
    TABLE,
    assert_exactly_once,
    committed_ids,
    produce_exactly_once,
    setup_table,
)
from tests.servers import table_folder

OTHER = OpenChannelRequest("partition-1", "DB", "S", "EVENTS")
SLOW = "10 minutes"  # the longest max_client_lag: nothing flushes on its own meanwhile


def rows(first, last):
    return [{"ID": n} for n in range(first, last + 1)]


def channel_commits(warehouse, channel):
    """(generation, batch_seq, token, rows) of each commit naming ``channel``, in order."""
    uri = table_folder(warehouse, "DB", "S", "EVENTS")
    return [
        (c.generation, c.batch_seq, c.offset_token, c.rows)
        for record in commits_after(uri, -1)
        for c in record.channels
        if c.channel == channel
    ]


def test_rows_buffered_on_a_superseded_server_never_commit(server_factory, client_factory):
    a = server_factory()
    b = server_factory(warehouse=a.config.warehouse)
    warehouse = a.config.warehouse
    setup_table(a.url)
    first = client_factory(a.url).open_channel(REQUEST)  # generation 1, on A
    first.insert_rows(rows(0, 49), end_offset_token="49")
    assert first.wait_for_commit(timeout=60) == "49"
    # A new handle on A (generation 2) buffers rows 50..149 there, and another channel of
    # the table buffers rows too; neither flushes on its own for ten minutes.
    slow_client = client_factory(a.url, max_client_lag=SLOW)
    slow = slow_client.open_channel(REQUEST)
    slow.insert_rows(rows(50, 149), end_offset_token="149")
    slow.wait_until_sent(timeout=60)  # in A's buffer now
    other = slow_client.open_channel(OTHER)
    other.insert_rows(rows(1000, 1009), end_offset_token="o-1009")
    other.wait_until_sent(timeout=60)
    # The producer moves to B and reads its resume token there: the fence is in the log.
    moved = client_factory(b.url).open_channel(REQUEST)
    assert moved.generation == slow.generation + 1
    assert moved.get_latest_committed_offset_token() == "49"
    uri = table_folder(warehouse, "DB", "S", "EVENTS")
    assert DeltaTable(uri).transaction_version(app_id(REQUEST.name)) == pack_txn_version(
        moved.generation, 0
    )
    # A flushes the table now (the old handle closes): the fence refuses its rows, the
    # handle answers CHANNEL_INVALIDATED, and the other channel's rows still commit.
    with pytest.raises(ChannelInvalidatedError, match="opened again"):
        slow.close()
    assert other.wait_for_commit(timeout=60) == "o-1009"
    assert sorted(committed_ids(warehouse)) == [*range(50), *range(1000, 1010)]
    (status,) = slow_client.get_latest_committed_offset_tokens([slow])
    assert status.status == "INVALIDATED"
    assert a.call(lambda: a.service.channels.budget.used) == 0  # its buffer was freed
    # The new handle resumes after its token, on B; every offset lands once.
    moved.insert_rows(rows(50, 149), end_offset_token="149")
    assert moved.wait_for_commit(timeout=60) == "149"
    ids = committed_ids(warehouse)
    assert sorted(ids) == [*range(150), *range(1000, 1010)]
    assert max(Counter(ids).values()) == 1
    commits = channel_commits(warehouse, REQUEST.name)
    assert [c for c in commits if c[0] == slow.generation] == [(slow.generation, 0, "49", 0)]
    assert commits[-2:] == [(moved.generation, 0, "49", 0), (moved.generation, 1, "149", 100)]
    # Both servers' catalogs (one file) agree with the log.
    for server in (a, b):
        with StreamingIngestClient("check", url=server.url) as check:
            (status,) = check.get_latest_committed_offset_tokens([(TABLE, REQUEST.name)])
            assert status.offset_token == "149"


def test_a_reopen_on_the_same_server_answers_the_logs_token(server_factory, client_factory):
    """The token an open answers is the log's, also when the catalog's is older (here the
    catalog is set back by hand, as a lost index update on another server leaves it)."""
    server = server_factory()
    client = client_factory(server.url)
    client.create_table(TABLE, {"ID": "INT NOT NULL"})
    channel = client.open_channel(REQUEST)
    channel.insert_rows(rows(0, 9), end_offset_token="9")
    assert channel.wait_for_commit(timeout=60) == "9"
    catalog = server.service.catalog
    info = catalog.get_table("DB", "S", "EVENTS")
    with contextlib.closing(sqlite3.connect(server.config.catalog_location)) as db, db:
        db.execute("UPDATE channels SET offset_token='4' WHERE table_id=?", (info.id,))
    again = client.open_channel(REQUEST)
    assert again.get_latest_committed_offset_token() == "9"
    with pytest.raises(ChannelInvalidatedError):
        channel.insert_rows(rows(10, 10), end_offset_token="10")
        channel.wait_for_commit(timeout=60)
    # The fence's index update wrote the log's token back into the catalog.
    assert catalog.get_channel(info.id, REQUEST.name).offset_token == "9"


def test_a_dropped_channel_opened_again_starts_without_a_token(server_factory, client_factory):
    server = server_factory()
    client = client_factory(server.url)
    client.create_table(TABLE, {"ID": "INT NOT NULL"})
    channel = client.open_channel(REQUEST)
    channel.insert_rows(rows(0, 9), end_offset_token="9")
    channel.wait_for_commit(timeout=60)
    client.drop_channel(REQUEST)
    reopened = client.open_channel(REQUEST)
    assert reopened.get_latest_committed_offset_token() is None
    assert client.open_channel(REQUEST).get_latest_committed_offset_token() is None
    commits = channel_commits(server.config.warehouse, REQUEST.name)
    assert commits[-2:] == [(2, 0, None, 0), (3, 0, None, 0)]


@pytest.mark.parametrize("failpoint", ["after_fence_commit", "before_fence_commit"])
def test_a_server_killed_around_its_fence_loses_and_doubles_nothing(
    process_server_factory, failpoint
):
    """B dies by SIGKILL just after (or just before) its fence commit, before answering
    the open. After: A's buffered rows of the old handle are refused (the fence is in the
    log, though nobody read its token). Before: no fence, so they may commit (no new
    producer read a token). Either way a producer following the recipe on the restarted B
    ends with every offset exactly once."""
    a = process_server_factory().start()
    b = process_server_factory(failpoints=f"{failpoint}=kill").start()
    setup_table(a.url)
    assert produce_exactly_once(a.url, 50) == "49"
    slow_client = StreamingIngestClient("slow", url=a.url, max_client_lag=SLOW,
                                        retry=RetryPolicy(deadline=10))  # fmt: skip
    slow = slow_client.open_channel(REQUEST)
    slow.insert_rows(rows(50, 149), end_offset_token="149")
    slow.wait_until_sent(timeout=60)
    moving = StreamingIngestClient("moving", url=b.url, retry=RetryPolicy(deadline=2))
    with moving, pytest.raises(TransportError):
        moving.open_channel(REQUEST)
    assert b.wait_killed() != 0
    uri = table_folder(a.warehouse, "DB", "S", "EVENTS")
    landed = DeltaTable(uri).transaction_version(app_id(REQUEST.name))
    if failpoint == "after_fence_commit":
        assert landed == pack_txn_version(slow.generation + 1, 0)
        assert channel_commits(a.warehouse, REQUEST.name)[-1] == (slow.generation + 1, 0, "49", 0)
        with pytest.raises(ChannelInvalidatedError):
            slow.close()
        assert sorted(committed_ids(a.warehouse)) == list(range(50))
    else:
        assert landed == pack_txn_version(slow.generation, 0)  # the old handle's own fence
        slow.close()  # committed: no open answered since its own
        assert sorted(committed_ids(a.warehouse)) == list(range(150))
    with contextlib.suppress(Exception):
        slow_client.close()
    b.start(failpoints="")  # recovery replays the fence into the catalog
    assert produce_exactly_once(b.url, 300) == "299"
    assert_exactly_once(a.warehouse, 300)
    assert produce_exactly_once(a.url, 300) == "299"  # A reads the same token
