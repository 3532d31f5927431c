"""The monotonic commit timestamp: every commit path stamps one, strictly increasing
per table even when a writer's clock goes back or two writers' clocks disagree, and
"the newest version committed at T" reads the stamps."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

import flush.commit_clock as commit_clock
from flush import ChannelProgress, TableWriter, create_table
from flush.change_commit import commit_staged
from flush.commit_clock import COMMIT_TS_KEY, commit_ts, stamped, version_at
from flush.tables import logged_versions
from ingest_sdk import TableSchema, convert_rows

SCHEMA = TableSchema.parse({"ID": "INT NOT NULL"})
ROOT = Path(__file__).parents[2]


def part(*ids: int) -> pa.Table:
    batch, _ = convert_rows(SCHEMA, [{"ID": i} for i in ids])
    return pa.Table.from_batches([batch])


def stamps(uri: str) -> list[int]:
    """Each version's stamp, in version order (every version must have one)."""
    found = []
    for version in sorted(logged_versions(uri)):
        value = commit_ts(uri, version)
        assert value is not None
        found.append(value)
    return found


def empty_commit(uri: str, name: str) -> int:
    """A pipeline commit holding nothing but its app id (the consumer commit's path)."""
    return commit_staged(uri, None, commit_app=name, base_version=0, app_transactions={},
                         metadata={})  # fmt: skip


def test_every_path_stamps_and_a_clock_going_back_never_moves_a_stamp_back(
    tmp_path, monkeypatch
):
    uri = str(tmp_path)
    ticks = iter(range(10_000_000, 0, -1_000_000))  # each call 1 s earlier than the last
    monkeypatch.setattr(commit_clock, "clock", lambda: next(ticks))
    create_table(uri, SCHEMA)
    writer = TableWriter(uri, SCHEMA)
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0)
    empty_commit(uri, "pipeline-1")
    writer.commit_flush([part(2)], [ChannelProgress("a", 1, 2, "2", 1)], 1)
    found = stamps(uri)
    assert len(found) == 4 and found[0] == 10_000_000
    assert found == sorted(found) and len(set(found)) == 4  # strictly increasing
    history = DeltaTable(uri).history()
    assert all(COMMIT_TS_KEY in entry for entry in history)


def test_a_stale_handle_is_refused_not_moved_to_a_later_version(tmp_path):
    """delta-rs would land an append from a stale handle at the next free version, with
    a stamp computed for the version before: stamped() turns its retries off."""
    uri = str(tmp_path)
    create_table(uri, SCHEMA)
    stale = DeltaTable(uri)
    empty_commit(uri, "other")
    with pytest.raises(CommitFailedError):
        stale.create_write_transaction([], "append", stale.schema(),
                                       commit_properties=stamped(stale))  # fmt: skip
    assert DeltaTable(uri).version() == 1


def test_a_flush_on_a_stale_handle_goes_again_on_the_newest_version(tmp_path, monkeypatch):
    uri = str(tmp_path)
    create_table(uri, SCHEMA)
    writer = TableWriter(uri, SCHEMA)  # its handle is at version 0
    monkeypatch.setattr(commit_clock, "clock", lambda: 2**52)  # another writer, far ahead
    empty_commit(uri, "ahead")
    monkeypatch.setattr(commit_clock, "clock", commit_clock.now_us)
    record = writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0)
    assert record.version == 2
    assert stamps(uri)[2] == 2**52 + 1


SKEWED_WRITER = textwrap.dedent(
    """
    import os, sys
    import flush.commit_clock as commit_clock
    from flush.change_commit import commit_staged
    uri, name, skew, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    commit_clock.clock = lambda: commit_clock.now_us() + skew
    for i in range(count):
        commit_staged(uri, None, commit_app=f"{name}-{i}", base_version=0,
                      app_transactions={}, metadata={})
    sys.stdout.flush()
    os._exit(0)
    """
)


def test_two_writers_with_skewed_clocks_at_once(tmp_path):
    """One writer's clock an hour behind, the other's an hour ahead, committing to one
    table at the same time: every commit lands once, stamps strictly increase."""
    uri = str(tmp_path)
    create_table(uri, SCHEMA)
    count = 15
    skews = (("behind", -3_600_000_000), ("ahead", 3_600_000_000))
    writers = [
        subprocess.Popen([sys.executable, "-c", SKEWED_WRITER, uri, name, str(skew), str(count)],
                         cwd=ROOT)
        for name, skew in skews
    ]
    for writer in writers:
        assert writer.wait(timeout=300) == 0
    table = DeltaTable(uri)
    assert table.version() == 2 * count
    for name in ("behind", "ahead"):
        assert all(table.transaction_version(f"{name}-{i}") == 1 for i in range(count))
    found = stamps(uri)
    assert all(later > earlier for earlier, later in itertools.pairwise(found))


def test_version_at_finds_the_newest_version_committed_at_a_moment(tmp_path, monkeypatch):
    uri = str(tmp_path)
    moments = iter([1_000, 2_000, 3_000, 3_500])
    monkeypatch.setattr(commit_clock, "clock", lambda: next(moments))
    create_table(uri, SCHEMA)  # version 0 at 1,000
    for name in ("a", "b", "c"):  # versions 1, 2, 3 at 2,000, 3,000, 3,500
        empty_commit(uri, name)
    assert stamps(uri) == [1_000, 2_000, 3_000, 3_500]
    assert version_at(uri, 999) is None
    assert version_at(uri, 1_000) == 0
    assert version_at(uri, 1_000, strictly_before=True) is None
    assert version_at(uri, 2_999) == 1
    assert version_at(uri, 3_000) == 2
    assert version_at(uri, 3_000, strictly_before=True) == 1
    assert version_at(uri, 10**18) == 3
