"""The contract every catalog implementation must pass (SQLite today)."""

import dataclasses
import itertools
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from catalog import (
    DatabaseRecord,
    ObjectAlreadyExistsError,
    ObjectNotEmptyError,
    SchemaRecord,
    SqliteCatalog,
    StreamClaim,
    StreamClaimConflict,
    open_catalog,
)
from catalog.records import DEFAULT_PROPERTIES
from flush import ChannelProgress, CommitRecord
from ingest_sdk import TableAlreadyExistsError, TableNotFoundError, TableSchema

SCHEMA = TableSchema.parse({"ID": "INT NOT NULL", "S": "VARCHAR(3)"})


def record(version, *channels, next_row_id=10):
    return CommitRecord(version, tuple(ChannelProgress(*c) for c in channels), next_row_id, 5)


def test_tables(catalog):
    info = catalog.create_table("DB", "S", "T", "/w/DB/S/T", SCHEMA)
    assert (info.full_name, info.schema, info.applied_version) == ("DB.S.T", SCHEMA, 0)
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("DB", "S", "T", "/w/DB/S/T", SCHEMA)
    assert catalog.get_table("DB", "S", "T") == info
    assert catalog.get_table_by_id(info.id) == info
    assert [t.name for t in catalog.list_tables()] == ["T"]
    catalog.drop_table(info.id)
    with pytest.raises(TableNotFoundError):
        catalog.get_table("DB", "S", "T")
    recreated = catalog.create_table("DB", "S", "T", "/w/DB/S/T", SCHEMA)
    assert recreated.id != info.id  # ids are never reused


def test_open_bumps_the_generation_durably(catalog, catalog_location):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert catalog.open_channel(table.id, "c").generation == 1
    assert catalog.open_channel(table.id, "c").generation == 2
    assert catalog.get_channel(table.id, "c").offset_token is None
    again = open_catalog(catalog_location)
    assert again.open_channel(table.id, "c").generation == 3
    again.close()


def test_open_starts_above_a_generation_the_log_holds(catalog):
    """A dropped channel's row is gone but its Delta app transaction is not: reopened, it
    must start above the generation the log holds."""
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert catalog.open_channel(table.id, "c", min_generation=4).generation == 4
    assert catalog.open_channel(table.id, "c", min_generation=2).generation == 5
    assert catalog.open_channel(table.id, "c", min_generation=9).generation == 9
    catalog.drop_channel(table.id, "c")
    assert catalog.open_channel(table.id, "c", min_generation=10).generation == 10


def test_apply_commit_is_idempotent_and_ordered(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    catalog.open_channel(table.id, "a")
    catalog.open_channel(table.id, "b")
    catalog.apply_commit(table.id, record(3, ("a", 1, 1, "t1", 5), ("b", 1, 1, None, 2)))
    catalog.apply_commit(table.id, record(3, ("a", 1, 1, "t1", 5)))  # replayed: ignored
    catalog.apply_commit(table.id, record(2, ("a", 1, 1, "old", 5)))  # older: ignored
    a, b = catalog.get_channel(table.id, "a"), catalog.get_channel(table.id, "b")
    assert (a.offset_token, a.rows_committed) == ("t1", 5)
    assert (b.offset_token, b.rows_committed) == (None, 2)
    info = catalog.get_table_by_id(table.id)
    assert (info.applied_version, info.next_row_id) == (3, 10)
    catalog.apply_commit(table.id, record(4, ("gone", 1, 1, "x", 1)))  # unknown channel: skipped
    assert catalog.get_channel(table.id, "gone") is None


def test_a_commit_applied_after_a_newer_one_of_another_writer_still_counts(catalog):
    """Two services flush one table: A's version 10 reaches the catalog after B's 11. A's
    channels move by their own positions; no channel goes back."""
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    for name in ("a", "b"):
        catalog.open_channel(table.id, name)
    catalog.apply_commit(table.id, record(11, ("b", 1, 1, "b1", 3), next_row_id=30))
    catalog.apply_commit(table.id, record(10, ("a", 1, 1, "a1", 4), next_row_id=20))
    catalog.apply_commit(table.id, record(10, ("a", 1, 1, "a1", 4), next_row_id=20))  # again
    catalog.apply_commit(table.id, record(12, ("a", 1, 2, "a2", 1), next_row_id=31))
    catalog.apply_commit(table.id, record(9, ("a", 1, 1, "a0", 9), next_row_id=19))  # behind
    a, b = catalog.get_channel(table.id, "a"), catalog.get_channel(table.id, "b")
    assert (a.offset_token, a.rows_committed) == ("a2", 5)
    assert (b.offset_token, b.rows_committed) == ("b1", 3)
    info = catalog.get_table_by_id(table.id)
    assert (info.applied_version, info.next_row_id) == (12, 31)
    reopened = catalog.open_channel(table.id, "a")  # a new generation starts above the old
    catalog.apply_commit(table.id, record(13, ("a", reopened.generation, 1, "a3", 2)))
    assert catalog.get_channel(table.id, "a").offset_token == "a3"


def test_a_channel_from_before_positions_moves_only_with_versions_above_the_upgrade(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    catalog.open_channel(table.id, "a")
    catalog.apply_commit(table.id, record(5, ("a", 1, 3, "t3", 3)))
    catalog._db.execute("UPDATE channels SET committed_position = NULL")  # as upgraded
    catalog._db.execute("UPDATE tables SET positions_from = applied_version")
    catalog.apply_commit(table.id, record(4, ("a", 1, 2, "t2", 2)))  # replayed: ignored
    assert catalog.get_channel(table.id, "a").offset_token == "t3"
    catalog.apply_commit(table.id, record(6, ("a", 1, 4, "t4", 1)))
    assert (catalog.get_channel(table.id, "a").offset_token,
            catalog.get_channel(table.id, "a").rows_committed) == ("t4", 4)  # fmt: skip


def test_drop_and_retention(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    for name in ("a", "b", "c"):
        catalog.open_channel(table.id, name)
    assert catalog.drop_channel(table.id, "a") is True
    assert catalog.drop_channel(table.id, "a") is False
    removed = catalog.remove_inactive_channels(time.time() + 1, keep={(table.id, "c")})
    assert removed == 1
    assert [c.name for c in catalog.list_channels(table.id)] == ["c"]
    assert catalog.remove_inactive_channels(time.time() - 3600, keep=set()) == 0


# --- Helpers for the tests that share one catalog file between processes -------------

ROOT = Path(__file__).resolve().parents[2]

#: Run first in every child: its arguments are the catalog's location, a barrier folder, the
#: child's index, then the test's own. ``wait()`` returns once every child is ready, so
#: their calls really race.
_CHILD_PRELUDE = """
import json, os, random, sys, time
from pathlib import Path
from catalog import StreamClaim, StreamClaimConflict, open_catalog
path, barrier, index, args = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
catalog = open_catalog(path)

def wait():
    (barrier / f"ready-{index}").touch()
    while not (barrier / "go").exists():
        time.sleep(0.001)
"""


def run_children(body, path, barrier, processes, *args):
    """Run ``processes`` children on one catalog file, released together; their JSON."""
    barrier.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD_PRELUDE + body,
                str(path),
                str(barrier),
                str(index),
                *map(str, args),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(processes)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(list(barrier.glob("ready-*"))) < processes:
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                break  # a child died early: its stderr says why below
            time.sleep(0.005)
        (barrier / "go").touch()
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=60)
            assert child.returncode == 0, err
            outputs.append(json.loads(out))
        return outputs
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


# --- Row-id reservations ---------------------------------------------------------------


def test_reserve_row_ids(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    other = catalog.create_table("DB", "S", "U", "/w2", SCHEMA)
    assert catalog.reserve_row_ids(table.id, 5) == 0
    assert catalog.reserve_row_ids(table.id, 3) == 5  # right after the first block
    assert catalog.reserve_row_ids(table.id, 1) == 8
    assert catalog.get_table_by_id(table.id).next_row_id == 9
    assert catalog.reserve_row_ids(other.id, 4) == 0  # one sequence per table
    # Zero: where the sequence stands, without moving it.
    assert catalog.reserve_row_ids(table.id, 0) == 9
    assert catalog.reserve_row_ids(table.id, 0) == 9
    assert catalog.get_table_by_id(table.id).next_row_id == 9
    with pytest.raises(ValueError):
        catalog.reserve_row_ids(table.id, -1)
    assert catalog.get_table_by_id(table.id).next_row_id == 9  # nothing moved
    missing = max(t.id for t in catalog.list_tables()) + 1000
    with pytest.raises(TableNotFoundError):
        catalog.reserve_row_ids(missing, 1)
    catalog.drop_table(other.id)
    with pytest.raises(TableNotFoundError):
        catalog.reserve_row_ids(other.id, 1)
    assert catalog.reserve_row_ids(table.id, 2) == 9  # the failures consumed nothing


def test_apply_commit_moves_the_row_id_sequence_only_forward(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert catalog.reserve_row_ids(table.id, 4) == 0
    catalog.apply_commit(table.id, record(1, next_row_id=100))  # a writer used ids up to 99
    assert catalog.get_table_by_id(table.id).next_row_id == 100
    assert catalog.reserve_row_ids(table.id, 10) == 100
    catalog.apply_commit(table.id, record(2, next_row_id=50))  # behind the reservations
    assert catalog.get_table_by_id(table.id).next_row_id == 110
    assert catalog.reserve_row_ids(table.id, 1) == 110
    catalog.apply_commit(table.id, record(3, next_row_id=111))  # exactly where it stands
    assert catalog.reserve_row_ids(table.id, 1) == 111


_RESERVE_CHILD = """
table_id, rounds = int(args[0]), int(args[1])
rng = random.Random(index)
wait()
reserved = []
for _ in range(rounds):
    count = rng.randint(1, 50)
    reserved.append((catalog.reserve_row_ids(table_id, count), count))
catalog.close()
print(json.dumps(reserved))
"""


def test_row_id_reservations_are_unique_across_processes(catalog, catalog_location, tmp_path):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    start = catalog.reserve_row_ids(table.id, 7) + 7
    outputs = run_children(_RESERVE_CHILD, catalog_location, tmp_path / "barrier", 4, table.id, 200)
    ranges = sorted((first, count) for output in outputs for first, count in output)
    assert len(ranges) == 4 * 200
    for (first, count), (following, _) in itertools.pairwise(ranges):
        assert first + count <= following, f"[{first}, {first + count}) overlaps {following}"
    # No one else reserved: the blocks tile the sequence from where it stood, no gaps.
    assert ranges[0][0] == start
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(ranges))
    end = ranges[-1][0] + ranges[-1][1]
    assert end == start + sum(count for _, count in ranges)
    assert catalog.get_table_by_id(table.id).next_row_id == end


# --- Rename and properties -------------------------------------------------------------


def test_rename_keeps_the_id_and_streams(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    other = catalog.create_table("DB", "S", "U", "/w2", SCHEMA)
    catalog.open_channel(table.id, "c")
    catalog.reserve_row_ids(table.id, 12)
    catalog.set_table_properties(table.id, {"change_tracking": True})
    stream = catalog.create_stream("DB", "S", "ST", table.id, "default", 0)
    before = catalog.get_table_by_id(table.id)

    catalog.rename_table(table.id, "DB2", "S2", "T2")
    renamed = catalog.get_table("DB2", "S2", "T2")
    assert renamed == dataclasses.replace(before, database="DB2", schema_name="S2", name="T2")
    assert catalog.get_table_by_id(table.id) == renamed
    with pytest.raises(TableNotFoundError):
        catalog.get_table("DB", "S", "T")
    assert catalog.get_stream_by_id(stream.id) == stream  # still on the same table id
    assert catalog.list_streams(table.id) == [stream]
    assert catalog.get_channel(table.id, "c").generation == 1
    assert catalog.reserve_row_ids(table.id, 1) == 12

    # Onto a name that is taken: refused, and neither table changes.
    other_before = catalog.get_table_by_id(other.id)
    renamed = catalog.get_table_by_id(table.id)
    with pytest.raises(TableAlreadyExistsError):
        catalog.rename_table(table.id, "DB", "S", "U")
    assert catalog.get_table_by_id(table.id) == renamed
    assert catalog.get_table_by_id(other.id) == other_before
    assert catalog.get_table("DB", "S", "U") == other_before
    assert sorted(t.full_name for t in catalog.list_tables()) == ["DB.S.U", "DB2.S2.T2"]

    # The old name is free again.
    recreated = catalog.create_table("DB", "S", "T", "/w3", SCHEMA)
    assert recreated.id not in (table.id, other.id)


def test_table_properties_merge_into_defaults_and_persist(catalog, catalog_location):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    other = catalog.create_table("DB", "S", "U", "/w2", SCHEMA)
    assert table.properties == DEFAULT_PROPERTIES
    changed = catalog.set_table_properties(table.id, {"change_tracking": True})
    assert changed.properties == {**DEFAULT_PROPERTIES, "change_tracking": True}
    # A second call merges into the first, it does not replace it.
    changed = catalog.set_table_properties(table.id, {"data_retention_time_in_days": 7})
    expected = {**DEFAULT_PROPERTIES, "change_tracking": True, "data_retention_time_in_days": 7}
    assert changed.properties == expected
    assert changed == dataclasses.replace(table, properties=expected)  # nothing else moved
    assert catalog.get_table("DB", "S", "T").properties == expected
    assert catalog.get_table_by_id(table.id).properties == expected
    assert catalog.get_table_by_id(other.id).properties == DEFAULT_PROPERTIES
    assert DEFAULT_PROPERTIES["change_tracking"] is False  # the defaults were not mutated
    missing = max(t.id for t in catalog.list_tables()) + 1000
    with pytest.raises(TableNotFoundError):
        catalog.set_table_properties(missing, {"change_tracking": True})
    again = open_catalog(catalog_location)
    assert again.get_table_by_id(table.id).properties == expected
    assert again.get_table_by_id(other.id).properties == DEFAULT_PROPERTIES
    again.close()


# --- Streams -------------------------------------------------------------------------


def test_streams(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    other = catalog.create_table("DB", "S", "U", "/w2", SCHEMA)
    before = time.time()
    stream = catalog.create_stream("DB", "S", "ST", table.id, "default", 3, comment="note")
    assert (stream.full_name, stream.table_id, stream.mode, stream.offset_version) == (
        "DB.S.ST",
        table.id,
        "default",
        3,
    )
    assert (stream.comment, stream.claimed_by) == ("note", None)
    assert before <= stream.created_at == stream.offset_moved_at <= time.time()
    assert catalog.get_stream("DB", "S", "ST") == stream
    assert catalog.get_stream_by_id(stream.id) == stream
    assert catalog.get_stream("DB", "S", "NOPE") is None
    assert catalog.get_stream_by_id(stream.id + 1000) is None

    appended = catalog.create_stream("DB", "S", "A", other.id, "append_only", 0)
    elsewhere = catalog.create_stream("DB", "S2", "ST", other.id, "default", 1)  # same name
    assert len({stream.id, appended.id, elsewhere.id}) == 3
    assert catalog.list_streams(table.id) == [stream]
    assert sorted(catalog.list_streams(other.id), key=lambda s: s.id) == [appended, elsewhere]
    assert sorted(catalog.list_streams(), key=lambda s: s.id) == [stream, appended, elsewhere]

    with pytest.raises(ObjectAlreadyExistsError):
        catalog.create_stream("DB", "S", "ST", other.id, "append_only", 9)
    assert catalog.get_stream("DB", "S", "ST") == stream  # unchanged
    assert len(catalog.list_streams()) == 3

    # Replace: a new stream (new id, the given offset), the old one is gone.
    replaced = catalog.create_stream("DB", "S", "ST", other.id, "append_only", 0, replace=True)
    assert replaced.id not in (stream.id, appended.id, elsewhere.id)
    assert (replaced.table_id, replaced.mode, replaced.offset_version) == (
        other.id,
        "append_only",
        0,
    )
    assert (replaced.comment, replaced.claimed_by) == ("", None)
    assert catalog.get_stream_by_id(stream.id) is None
    assert catalog.get_stream("DB", "S", "ST") == replaced
    assert catalog.list_streams(table.id) == []
    fresh = catalog.create_stream("DB", "S", "NEW", table.id, "default", 2, replace=True)
    assert catalog.get_stream("DB", "S", "NEW") == fresh  # replace with nothing to replace

    assert catalog.drop_stream(replaced.id) is True
    assert catalog.drop_stream(replaced.id) is False
    assert catalog.get_stream("DB", "S", "ST") is None
    assert catalog.get_stream_by_id(replaced.id) is None
    assert catalog.drop_stream(replaced.id + 1000) is False
    recreated = catalog.create_stream("DB", "S", "ST", table.id, "default", 0)
    assert recreated.id not in (stream.id, replaced.id)  # ids are never reused


def test_drop_table_leaves_its_streams(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    stream = catalog.create_stream("DB", "S", "ST", table.id, "default", 4)
    catalog.drop_table(table.id)
    assert catalog.get_stream_by_id(stream.id) == stream
    assert catalog.get_stream("DB", "S", "ST") == stream
    assert catalog.list_streams(table.id) == [stream]
    recreated = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert catalog.list_streams(recreated.id) == []  # stale: it points at the old id
    assert catalog.drop_stream(stream.id) is True


# --- Pending pipeline commits ----------------------------------------------------------


def streams_of(catalog, *offsets):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    return [
        catalog.create_stream("DB", "S", f"ST{i}", table.id, "default", offset)
        for i, offset in enumerate(offsets)
    ]


def test_begin_commit_claims_its_streams(catalog):
    first, second, third = streams_of(catalog, 3, 5, 0)
    plan = {"insert": [{"table": "DB.S.T", "rows": [1, 2]}], "note": "x"}
    claims = (StreamClaim(first.id, 3, 7), StreamClaim(third.id, 0, 1))
    pending = catalog.begin_commit("123:abc", plan, claims)
    assert (pending.owner, pending.plan, pending.claims) == ("123:abc", plan, claims)
    assert catalog.pending_commits() == [pending]
    assert catalog.get_stream_by_id(first.id) == dataclasses.replace(first, claimed_by=pending.id)
    assert catalog.get_stream_by_id(third.id) == dataclasses.replace(third, claimed_by=pending.id)
    assert catalog.get_stream_by_id(second.id) == second  # not claimed
    # A commit on other streams goes ahead alongside.
    beside = catalog.begin_commit("123:def", {}, [StreamClaim(second.id, 5, 6)])
    assert beside.id != pending.id
    assert sorted(catalog.pending_commits(), key=lambda p: p.id) == [pending, beside]
    assert catalog.get_stream_by_id(second.id).claimed_by == beside.id


def test_a_losing_begin_commit_records_nothing(catalog):
    first, second, third = streams_of(catalog, 3, 5, 0)
    held = catalog.begin_commit("1:a", {"n": 1}, [StreamClaim(first.id, 3, 7)])
    state = catalog.list_streams()

    # The free stream comes first: it must not stay claimed when the held one fails.
    with pytest.raises(StreamClaimConflict) as lost:
        catalog.begin_commit(
            "2:b", {"n": 2}, [StreamClaim(second.id, 5, 6), StreamClaim(first.id, 3, 8)]
        )
    assert lost.value.stream_ids == [first.id]
    assert catalog.pending_commits() == [held]
    assert catalog.list_streams() == state

    # An offset that is not the expected one loses too (a commit moved it meanwhile).
    with pytest.raises(StreamClaimConflict) as lost:
        catalog.begin_commit(
            "2:b", {"n": 3}, [StreamClaim(third.id, 0, 1), StreamClaim(second.id, 4, 6)]
        )
    assert lost.value.stream_ids == [second.id]
    with pytest.raises(StreamClaimConflict):
        catalog.begin_commit("2:b", {"n": 4}, [StreamClaim(first.id + 1000, 0, 1)])  # gone
    assert catalog.pending_commits() == [held]
    assert catalog.list_streams() == state
    # Still free to claim with the right offsets.
    won = catalog.begin_commit(
        "2:b", {}, [StreamClaim(second.id, 5, 6), StreamClaim(third.id, 0, 1)]
    )
    assert catalog.get_stream_by_id(second.id).claimed_by == won.id


def test_finish_commit_moves_the_offsets_once(catalog):
    first, second, untouched = streams_of(catalog, 3, 5, 0)
    pending = catalog.begin_commit(
        "1:a", {"n": 1}, [StreamClaim(first.id, 3, 7), StreamClaim(second.id, 5, 9)]
    )
    time.sleep(0.01)
    before = time.time()
    catalog.finish_commit(pending.id)
    after = time.time()
    moved_first, moved_second = (catalog.get_stream_by_id(s.id) for s in (first, second))
    assert moved_first == dataclasses.replace(
        first, offset_version=7, offset_moved_at=moved_first.offset_moved_at
    )
    assert moved_second == dataclasses.replace(
        second, offset_version=9, offset_moved_at=moved_second.offset_moved_at
    )
    for moved, old in ((moved_first, first), (moved_second, second)):
        assert old.offset_moved_at < before <= moved.offset_moved_at <= after
    assert catalog.get_stream_by_id(untouched.id) == untouched
    assert catalog.pending_commits() == []

    catalog.finish_commit(pending.id)  # again (owner and recovery both try): no-op
    assert catalog.get_stream_by_id(first.id) == moved_first
    assert catalog.get_stream_by_id(second.id) == moved_second
    assert catalog.pending_commits() == []

    # The old offset is no longer claimable, the new one is.
    with pytest.raises(StreamClaimConflict):
        catalog.begin_commit("1:b", {}, [StreamClaim(first.id, 3, 8)])
    following = catalog.begin_commit("1:b", {}, [StreamClaim(first.id, 7, 8)])
    catalog.finish_commit(pending.id)  # a stale retry does not touch the new claim
    assert catalog.get_stream_by_id(first.id) == dataclasses.replace(
        moved_first, claimed_by=following.id
    )
    catalog.finish_commit(following.id)
    assert catalog.get_stream_by_id(first.id).offset_version == 8


def test_abandon_commit_releases_without_moving(catalog):
    first, second = streams_of(catalog, 3, 5)
    keep = catalog.begin_commit("1:keep", {}, [StreamClaim(second.id, 5, 6)])
    pending = catalog.begin_commit("1:a", {"n": 1}, [StreamClaim(first.id, 3, 7)])
    catalog.abandon_commit(pending.id)
    assert catalog.get_stream_by_id(first.id) == first  # same offset and moved-at, unclaimed
    assert catalog.pending_commits() == [keep]
    assert catalog.get_stream_by_id(second.id).claimed_by == keep.id  # others keep theirs
    catalog.finish_commit(pending.id)  # finishing an abandoned commit: no-op
    assert catalog.get_stream_by_id(first.id) == first
    catalog.abandon_commit(pending.id)  # twice: no-op
    assert catalog.pending_commits() == [keep]
    again = catalog.begin_commit("1:b", {}, [StreamClaim(first.id, 3, 4)])  # free again
    catalog.finish_commit(again.id)
    assert catalog.get_stream_by_id(first.id).offset_version == 4


def test_a_replaced_stream_is_not_moved_by_the_old_streams_commit(catalog):
    (stream,) = streams_of(catalog, 3)
    pending = catalog.begin_commit("1:a", {}, [StreamClaim(stream.id, 3, 7)])
    replaced = catalog.create_stream("DB", "S", "ST0", stream.table_id, "default", 3, replace=True)
    assert replaced.claimed_by is None
    catalog.finish_commit(pending.id)
    assert catalog.get_stream_by_id(replaced.id) == replaced
    assert catalog.pending_commits() == []


_CLAIM_CHILD = """
stream_ids = json.loads(args[0])
wait()
result = []
for stream_id in stream_ids:
    try:
        plan = {"stream": stream_id, "child": index}
        pending = catalog.begin_commit(f"{index}:x", plan, [StreamClaim(stream_id, 0, 1)])
        result.append((stream_id, pending.id))
    except StreamClaimConflict as exc:
        assert exc.stream_ids == [stream_id], exc.stream_ids
        result.append((stream_id, None))
catalog.close()
print(json.dumps(result))
"""


def test_racing_processes_claim_a_stream_once(catalog, catalog_location, tmp_path):
    streams = streams_of(catalog, *[0] * 20)
    ids = [s.id for s in streams]
    outputs = run_children(_CLAIM_CHILD, catalog_location, tmp_path / "barrier", 4, json.dumps(ids))
    winners = {}  # stream id -> (child, commit id)
    for child, output in enumerate(outputs):
        assert [stream_id for stream_id, _ in output] == ids
        for stream_id, commit_id in output:
            if commit_id is not None:
                assert stream_id not in winners, f"stream {stream_id} claimed twice"
                winners[stream_id] = (child, commit_id)
    assert sorted(winners) == sorted(ids)  # exactly one winner per stream
    pending = {p.id: p for p in catalog.pending_commits()}
    assert sorted(pending) == sorted(commit_id for _, commit_id in winners.values())
    for stream_id, (child, commit_id) in winners.items():
        assert pending[commit_id].owner == f"{child}:x"
        assert pending[commit_id].plan == {"stream": stream_id, "child": child}
        assert pending[commit_id].claims == (StreamClaim(stream_id, 0, 1),)
        assert catalog.get_stream_by_id(stream_id).claimed_by == commit_id


# --- Databases and schemas --------------------------------------------------------------


def names(records):
    return [r.full_name if isinstance(r, SchemaRecord) else r.name for r in records]


def test_databases_and_schemas_are_created_once(catalog):
    assert catalog.list_databases() == [] and catalog.list_schemas() == []
    database, created = catalog.create_database("D")
    assert (database.name, created) == ("D", True)
    again, created = catalog.create_database("D")
    assert (again, created) == (database, False)  # the first one, unchanged
    assert catalog.get_database("D") == database
    assert catalog.get_database("d") is None  # names are stored forms: exact

    schema, created = catalog.create_schema("E", "S")  # creates its database too
    assert (schema.full_name, created) == ("E.S", True)
    assert catalog.create_schema("E", "S") == (schema, False)
    assert catalog.get_schema("E", "S") == schema
    assert catalog.get_schema("E", "T") is None
    assert names(catalog.list_databases()) == ["D", "E"]
    assert all(isinstance(d, DatabaseRecord) for d in catalog.list_databases())
    assert names(catalog.list_schemas()) == ["E.S"]
    assert catalog.list_schemas("D") == []
    quoted, _ = catalog.create_schema("E", "with space")
    assert quoted.full_name == 'E."with space"'


def test_tables_and_streams_imply_their_schema_and_database(catalog):
    """A table or stream names its schema and database, which exist while it does (and,
    once a table or stream was created there, after it too)."""
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert names(catalog.list_databases()) == ["DB"]
    assert names(catalog.list_schemas("DB")) == ["DB.S"]
    catalog.create_stream("SDB", "SS", "ST", table.id, "default", 0)
    catalog.rename_table(table.id, "RDB", "RS", "T")
    assert names(catalog.list_databases()) == ["DB", "RDB", "SDB"]
    assert names(catalog.list_schemas()) == ["DB.S", "RDB.RS", "SDB.SS"]
    assert catalog.get_schema("RDB", "RS").created_at >= table.created_at
    # CREATE of an existing one: there already, nothing new.
    assert catalog.create_schema("SDB", "SS")[1] is False
    assert catalog.create_database("RDB")[1] is False


def test_a_warehouse_older_than_databases_keeps_its_databases(catalog):
    """Catalogs made before databases and schemas were objects have tables but no rows
    for their schemas: those schemas exist, and can be dropped once empty."""
    if not isinstance(catalog, SqliteCatalog):
        pytest.skip("writes the SQLite file's rows directly")
    table = catalog.create_table("OLD", "S", "T", "/w", SCHEMA)
    catalog._db.execute("DELETE FROM schemas")
    catalog._db.execute("DELETE FROM databases")
    assert catalog.list_databases() == [DatabaseRecord("OLD", table.created_at)]
    assert catalog.list_schemas() == [SchemaRecord("OLD", "S", table.created_at)]
    with pytest.raises(ObjectNotEmptyError):
        catalog.drop_schema("OLD", "S")
    catalog.drop_table(table.id)
    assert catalog.list_databases() == []  # it held nothing and was never created
    assert catalog.drop_schema("OLD", "S") is None


def test_drop_refuses_a_schema_or_database_that_holds_objects(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    catalog.create_stream("DB", "S", "ST", table.id, "default", 0)
    catalog.create_schema("DB", "EMPTY")
    before = (catalog.list_databases(), catalog.list_schemas(), catalog.list_tables(),
              catalog.list_streams())  # fmt: skip
    for drop in (lambda: catalog.drop_schema("DB", "S"), lambda: catalog.drop_database("DB")):
        with pytest.raises(ObjectNotEmptyError) as caught:
            drop()
        assert caught.value.tables == ["DB.S.T"] and caught.value.streams == ["DB.S.ST"]
        assert "DB.S.T" in str(caught.value) and "DB.S.ST" in str(caught.value)
        assert (catalog.list_databases(), catalog.list_schemas(), catalog.list_tables(),
                catalog.list_streams()) == before  # fmt: skip
    # An empty schema goes; a missing one is None.
    assert catalog.drop_schema("DB", "EMPTY") == []
    assert catalog.get_schema("DB", "EMPTY") is None
    assert catalog.drop_schema("DB", "EMPTY") is None
    assert catalog.drop_database("NOPE") is None


def test_drop_cascade_drops_what_is_inside_and_nothing_else(catalog):
    table = catalog.create_table("DB", "S", "T", "/w/t", SCHEMA)
    kept = catalog.create_table("DB", "KEEP", "U", "/w/u", SCHEMA)
    catalog.open_channel(table.id, "c")
    catalog.record_migration(table.id, {"started_at": 1, "ended_at": 2, "status": "SUCCEEDED",
                                        "files_in": 1, "bytes_in": 1, "rows_in": 1,
                                        "files_out": 1, "bytes_out": 1, "rows_out": 1})  # fmt: skip
    inside = catalog.create_stream("DB", "S", "IN_S", kept.id, "default", 0)
    outside = catalog.create_stream("DB", "KEEP", "ON_T", table.id, "default", 0)

    dropped = catalog.drop_schema("DB", "S", cascade=True)
    assert [t.id for t in dropped] == [table.id] and dropped[0].uri == "/w/t"
    assert catalog.get_table_by_id(table.id) is None
    assert catalog.list_channels(table.id) == [] and catalog.list_migrations(table.id) == []
    assert catalog.get_stream_by_id(inside.id) is None
    assert catalog.get_stream_by_id(outside.id) == outside  # elsewhere: stays, stale
    assert names(catalog.list_schemas("DB")) == ["DB.KEEP"]
    assert catalog.get_table_by_id(kept.id) == kept

    other = catalog.create_table("OTHER", "S", "V", "/w/v", SCHEMA)
    dropped = catalog.drop_database("DB", cascade=True)
    assert [t.id for t in dropped] == [kept.id]
    assert catalog.get_database("DB") is None and catalog.list_schemas("DB") == []
    assert catalog.list_streams() == []
    assert catalog.list_tables() == [other]
    recreated = catalog.create_table("DB", "S", "T", "/w/t2", SCHEMA)
    assert recreated.id not in (table.id, kept.id)  # ids are never reused


# --- Catalog files made by older versions ----------------------------------------------

#: ``tables`` as the first release made it: no ``properties`` column.
_OLD_TABLES = """
CREATE TABLE tables (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    database TEXT NOT NULL, schema_name TEXT NOT NULL, name TEXT NOT NULL,
    uri TEXT NOT NULL, columns TEXT NOT NULL, created_at REAL NOT NULL,
    applied_version INTEGER NOT NULL DEFAULT 0, next_row_id INTEGER NOT NULL DEFAULT 0,
    clustering TEXT NOT NULL DEFAULT '[]',
    UNIQUE (database, schema_name, name));
"""


def test_a_catalog_without_table_properties_still_opens(tmp_path):
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(_OLD_TABLES)
    old.execute(
        "INSERT INTO tables (database, schema_name, name, uri, columns, created_at,"
        " applied_version, next_row_id, clustering) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        ("DB", "S", "T", "/w/DB/S/T", json.dumps(SCHEMA.declarations()), 1.5, 4, 42, '["ID"]'),
    )
    old.commit()
    old.close()

    catalog = SqliteCatalog(path)
    try:
        info = catalog.get_table("DB", "S", "T")
        assert (info.full_name, info.uri, info.schema, info.created_at) == (
            "DB.S.T",
            "/w/DB/S/T",
            SCHEMA,
            1.5,
        )
        assert (info.applied_version, info.next_row_id, info.clustering) == (4, 42, ("ID",))
        assert info.properties == DEFAULT_PROPERTIES
        assert catalog.get_table_by_id(info.id) == info
        assert [t.name for t in catalog.list_tables()] == ["T"]
        assert catalog.reserve_row_ids(info.id, 3) == 42
        changed = catalog.set_table_properties(info.id, {"change_tracking": True})
        assert changed.properties == {**DEFAULT_PROPERTIES, "change_tracking": True}
        assert catalog.create_table("DB", "S", "U", "/w", SCHEMA).properties == DEFAULT_PROPERTIES
        assert catalog.create_stream("DB", "S", "ST", info.id, "default", 4).table_id == info.id
    finally:
        catalog.close()
    again = SqliteCatalog(path)  # the upgraded file opens again
    try:
        assert again.get_table("DB", "S", "T").properties["change_tracking"] is True
        assert again.get_table("DB", "S", "T").next_row_id == 45
    finally:
        again.close()


def test_views(catalog):
    """Views: created, read, listed, replaced (a new uid), dropped; one namespace with
    tables and streams; a schema holding a view is not empty."""
    view = catalog.create_view("DB", "S", "V", "SELECT 1 AS A", ("DB", "S"), comment="c")
    assert (view.full_name, view.query, view.default_schema, view.comment) == (
        "DB.S.V", "SELECT 1 AS A", "S", "c")  # fmt: skip
    assert catalog.get_view("DB", "S", "V") == view
    assert names(catalog.list_schemas("DB")) == ["DB.S"]  # a view names its schema
    with pytest.raises(ObjectAlreadyExistsError, match="CREATE OR REPLACE VIEW"):
        catalog.create_view("DB", "S", "V", "SELECT 2", ("DB", "S"))
    replaced = catalog.create_view("DB", "S", "V", "SELECT 2", ("X", "Y"), replace=True)
    assert replaced.uid != view.uid and replaced.query == "SELECT 2"
    assert [v.full_name for v in catalog.list_views()] == ["DB.S.V"]
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    catalog.create_stream("DB", "S", "ST", table.id, "default", 0)
    for taken in ("T", "ST"):  # a table's or a stream's name, even with OR REPLACE
        with pytest.raises(ObjectAlreadyExistsError, match="already has this name"):
            catalog.create_view("DB", "S", taken, "SELECT 1", ("DB", "S"), replace=True)
    assert catalog.get_view("DB", "S", "T") is None
    with pytest.raises(ObjectNotEmptyError) as held:
        catalog.drop_schema("DB", "S")
    assert held.value.views == ["DB.S.V"] and "view(s) DB.S.V" in str(held.value)
    assert catalog.drop_view(replaced.id) is True
    assert catalog.drop_view(replaced.id) is False
    assert catalog.get_view("DB", "S", "V") is None
    catalog.create_view("DB", "S2", "V2", "SELECT 1", ("DB", "S2"))
    catalog.drop_schema("DB", "S2", cascade=True)
    assert catalog.get_view("DB", "S2", "V2") is None


def test_change_streams(catalog, catalog_location, tmp_path):
    """Change streams: created (their schema too), read, listed, altered field by field,
    replaced (a new uid), dropped; a name of their own beside a table's; durable."""
    catalog.create_table("DB", "S", "T", str(tmp_path / "t"), SCHEMA)
    made = catalog.create_change_stream(
        "DB", "S", "T", for_all=False, table_ids=(1,), value_capture_type="NEW_ROW",
        retention_s=3600, created_us=10,
    )  # fmt: skip
    assert (made.full_name, made.for_all, made.table_ids, made.retention_s, made.created_us) == (
        "DB.S.T", False, (1,), 3600, 10)  # fmt: skip
    assert [s.name for s in catalog.list_schemas("DB")] == ["S"]
    with pytest.raises(ObjectAlreadyExistsError):
        catalog.create_change_stream("DB", "S", "T", for_all=True, table_ids=(),
                                     value_capture_type="NEW_ROW", retention_s=60, created_us=11)  # fmt: skip
    assert catalog.alter_change_stream(made.id, retention_s=120)
    assert catalog.alter_change_stream(made.id, for_all=True, table_ids=())
    altered = catalog.get_change_stream("DB", "S", "T")
    assert (altered.for_all, altered.table_ids, altered.retention_s, altered.uid) == (
        True, (), 120, made.uid)  # fmt: skip
    replaced = catalog.create_change_stream(
        "DB", "S", "T", for_all=False, table_ids=(), value_capture_type="NEW_VALUES",
        retention_s=60, created_us=12, replace=True,
    )  # fmt: skip
    assert replaced.uid != made.uid and catalog.list_change_streams() == [replaced]
    reopened = open_catalog(catalog_location)
    try:
        assert reopened.get_change_stream("DB", "S", "T") == replaced
    finally:
        reopened.close()
    assert catalog.drop_change_stream(replaced.id)
    assert not catalog.drop_change_stream(replaced.id)
    assert not catalog.alter_change_stream(replaced.id, retention_s=60)
    assert catalog.get_change_stream("DB", "S", "T") is None


def test_a_lease_is_held_by_one_holder_until_it_expires_or_is_released(catalog):
    assert catalog.lease_holder("job") is None
    assert catalog.take_lease("job", "a", 10, now=100.0) is True
    assert catalog.take_lease("job", "b", 10, now=105.0) is False  # a's runs to 110
    assert catalog.take_lease("job", "a", 10, now=105.0) is True  # renewed to 115
    assert catalog.lease_holder("job") == ("a", 115.0)
    assert catalog.take_lease("job", "b", 10, now=114.9) is False
    assert catalog.take_lease("job", "b", 10, now=115.0) is True  # expired: b takes it
    catalog.release_lease("job", "a")  # not a's any more: nothing happens
    assert catalog.lease_holder("job") == ("b", 125.0)
    catalog.release_lease("job", "b")
    assert catalog.take_lease("job", "a", 10, now=116.0) is True
    assert catalog.take_lease("other", "b", 10, now=116.0) is True  # leases are apart
