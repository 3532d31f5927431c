"""How a read of a change stream proceeds through ``READ_<cs>(...)``: the reference's
partition workflow (the first query's partitions, a merge and a split read by their
parents and then their children, every change of many keys returned exactly once in its
key's partition of the moment, reads that end before their partition does, large
transactions), heartbeats (idle tables, writers with skewed clocks), retention, and bad
arguments. What the records hold is in ``test_read.py``."""

from __future__ import annotations

import itertools
import json
import time
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import flush.commit_clock as commit_clock
from flush.commit_clock import now_us
from pipelines.change_streams.records import key_hash, rfc3339
from tests.pipelines.change_streams.test_read import (
    CAPTURES,
    changes,
    created,
    flush_rows,
    micros,
    now,
    partitions,
    read,
    read_tree,
)
from tests.pipelines.refusals import assert_refused

KEYS = 300


def open_partitions(session, cs):
    return sorted((p for p in partitions(session, cs) if p["state"] == "OPEN"),
                  key=lambda p: p["key_range_start"])  # fmt: skip


def owner(parts, key) -> str:
    """The token of the partition of ``parts`` holding ``key``."""
    (found,) = [p["token"] for p in parts
                if p["key_range_start"] <= key_hash([key]) < p["key_range_end"]]  # fmt: skip
    return found


def write_before(session):
    """Changes of every key before the repartition; returns the model of each key's mods:
    key -> [(mod_type, new V or None)]."""
    values = ", ".join(f"({k}, {k})" for k in range(1, KEYS + 1))
    session.sql(f"INSERT INTO K VALUES {values}")
    session.sql("UPDATE K SET V = V + 1 WHERE ID % 3 = 0")
    flush_rows(session, "K", [{"ID": k, "V": -k} for k in range(KEYS + 1, KEYS + 21)])
    model: dict[int, list[tuple[str, Any]]] = {k: [("INSERT", k)] for k in range(1, KEYS + 1)}
    for k in range(3, KEYS + 1, 3):
        model[k].append(("UPDATE", k + 1))
    for k in range(KEYS + 1, KEYS + 21):
        model[k] = [("INSERT", -k)]
    return model


def write_after(session, model):
    """Changes of every key after the repartition, added to ``model``."""
    session.sql("UPDATE K SET V = V + 10 WHERE ID % 2 = 0")
    session.sql("DELETE FROM K WHERE ID % 5 = 0")
    values = ", ".join(f"({k}, 0)" for k in range(KEYS + 21, KEYS + 61))
    session.sql(f"INSERT INTO K VALUES {values}")
    for k, mods in model.items():
        if k % 2 == 0:
            mods.append(("UPDATE", mods[-1][1] + 10))
        if k % 5 == 0:
            mods.append(("DELETE", None))
    for k in range(KEYS + 21, KEYS + 61):
        model[k] = [("INSERT", 0)]


def returned(tree: dict[str, list[dict[str, Any]]]) -> dict[int, list[tuple[str, Any, str, int]]]:
    """Every key's mods as the partitions returned them: (mod_type, new V, token, µs), in
    commit timestamp order."""
    found: dict[int, list[tuple[str, Any, str, int]]] = {}
    for token, records in tree.items():
        for change in changes(records):
            for mod in change["mods"]:
                found.setdefault(mod["keys"]["ID"], []).append((
                    change["mod_type"], mod["new_values"].get("V"), token,
                    micros(change["commit_timestamp"]),
                ))  # fmt: skip
    return {k: sorted(mods, key=lambda m: m[3]) for k, mods in found.items()}


@pytest.fixture
def keyed(session):
    session.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR K OPTIONS (value_capture_type = 'NEW_ROW', "
                "partitions = 3)")  # fmt: skip
    return session


def test_the_first_query_returns_the_initial_partitions(keyed):
    s = keyed
    start = created(s, "CS")
    first = read(s, "CS", start)
    assert [list(r) for r in first] == [["child_partitions_record"]] * 3
    bodies = [r["child_partitions_record"] for r in first]
    assert {b["start_timestamp"] for b in bodies} == {start}
    assert [b["record_sequence"] for b in bodies] == ["00000000", "00000001", "00000002"]
    children = [c for b in bodies for c in b["child_partitions"]]
    assert all(c["parent_partition_tokens"] == [] for c in children)
    shown = partitions(s, "CS")
    assert sorted(c["token"] for c in children) == sorted(p["token"] for p in shown)
    # Three ranges that cover the key space without a gap or an overlap.
    ranges = sorted((p["key_range_start"], p["key_range_end"]) for p in shown)
    assert ranges[0][0] == 0 and ranges[-1][1] == 2**32
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


@pytest.mark.parametrize("change", ["merge", "split"])
def test_every_change_is_returned_once_across_parents_and_children(keyed, change):
    s = keyed
    start = created(s, "CS")
    model = write_before(s)
    before = open_partitions(s, "CS")
    if change == "merge":  # the reference's: 2 and 3 become 4
        parents = [before[1]["token"], before[2]["token"]]
        s.sql(f"ALTER CHANGE STREAM CS MERGE PARTITIONS '{parents[0]}', '{parents[1]}'")
    else:
        parents = [before[1]["token"]]
        s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{parents[0]}' INTO 3")
    after = open_partitions(s, "CS")
    kids = [p["token"] for p in after if p["token"] not in {b["token"] for b in before}]
    assert len(kids) == (1 if change == "merge" else 3)
    write_after(s, model)

    tree = read_tree(s, "CS", start)
    assert set(tree) == {p["token"] for p in before} | set(kids)
    # Each parent ends with one child partitions record, the same for all parents,
    # naming every parent; its start is after each of their records.
    ends = [tree[token][-1] for token in parents]
    assert all(list(e) == ["child_partitions_record"] for e in ends)
    assert all(e == ends[0] for e in ends)
    body = ends[0]["child_partitions_record"]
    assert sorted(c["token"] for c in body["child_partitions"]) == sorted(kids)
    assert all(sorted(c["parent_partition_tokens"]) == sorted(parents)
               for c in body["child_partitions"])  # fmt: skip
    assert sum("child_partitions_record" in r for t in parents for r in tree[t]) == len(parents)
    split_at = micros(body["start_timestamp"])
    for token in parents:
        assert all(micros(c["commit_timestamp"]) < split_at for c in changes(tree[token]))
    for token in kids:
        assert all(micros(c["commit_timestamp"]) >= split_at for c in changes(tree[token]))
        assert list(tree[token][-1]) == ["heartbeat_record"]  # still open
    # Every change of every key exactly once, in the partition that held the key then.
    found = returned(tree)
    assert {k: [(kind, v) for kind, v, _, _ in mods] for k, mods in found.items()} == model
    for key, mods in found.items():
        for _, _, token, at in mods:
            assert token == owner(before if at < split_at else after, key), (key, at)
    assert any(at >= split_at for mods in found.values() for *_, at in mods)
    # A first query after the repartition returns the partitions open then, as roots.
    later = read(s, "CS", now())
    roots = [c for r in later for c in r["child_partitions_record"]["child_partitions"]]
    assert sorted(c["token"] for c in roots) == sorted(p["token"] for p in after)
    assert all(c["parent_partition_tokens"] == [] for c in roots)


def test_a_read_that_ends_before_its_partition_ends_ends_with_a_heartbeat(keyed):
    """A parent read with an end_timestamp before the parent's end returns its records
    up to that end and a heartbeat, not the child record: that would send the reader to
    the child, past the parent's records between the two ends."""
    s = keyed
    start = created(s, "CS")
    parent = owner(open_partitions(s, "CS"), 1)
    s.sql("INSERT INTO K VALUES (1, 1)")
    middle = now_us()
    values = ", ".join(f"({k}, {k})" for k in range(2, 60))
    s.sql(f"INSERT INTO K VALUES {values}")
    s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{parent}'")
    ended = next(p for p in partitions(s, "CS") if p["token"] == parent)
    assert ended["state"] == "ENDED"
    window = read(s, "CS", start, parent, end=rfc3339(middle))
    assert all("child_partitions_record" not in r for r in window), window
    assert window[-1] == {"heartbeat_record": {"timestamp": rfc3339(middle)}}
    assert all(moment(r) <= middle for r in window)
    # Resumed from that heartbeat, the same partition returns the rest, then its end.
    rest = read(s, "CS", rfc3339(middle), parent)
    assert list(rest[-1]) == ["child_partitions_record"]
    whole = read(s, "CS", start, parent)
    assert changes(window) + changes(rest) == changes(whole)
    assert changes(rest), "the parent had records after the window"
    # At the boundary: a read whose end is the parent's last moment has all its records
    # and ends with the child record; one a microsecond earlier with a heartbeat.
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    (last_us,) = [p.end_us - 1 for p in s.catalog.list_partitions(stream.uid) if p.token == parent]
    assert list(read(s, "CS", start, parent, end=rfc3339(last_us))[-1]) == [
        "child_partitions_record"
    ]
    assert read(s, "CS", start, parent, end=rfc3339(last_us - 1))[-1] == {
        "heartbeat_record": {"timestamp": rfc3339(last_us - 1)}
    }


def test_a_large_transaction_is_several_records_in_each_partition(keyed):
    """At most MODS_PER_RECORD mods a record: a transaction of 2,600 rows in three
    partitions is several records, numbered across partitions."""
    from pipelines.change_streams.records import MODS_PER_RECORD

    s = keyed
    start = created(s, "CS")
    keys = range(1, 2601)
    flush_rows(s, "K", [{"ID": k, "V": k} for k in keys])
    tree = read_tree(s, "CS", start)
    parts = open_partitions(s, "CS")
    found = {token: changes(records) for token, records in tree.items()}
    everything = [c for records in found.values() for c in records]
    assert {c["server_transaction_id"] for c in everything} != set()
    assert len({c["server_transaction_id"] for c in everything}) == 1
    expected_records = 0
    for token, records in found.items():
        mine = [k for k in keys if owner(parts, k) == token]  # in row id (insert) order
        assert [m["keys"]["ID"] for c in records for m in c["mods"]] == mine
        assert [len(c["mods"]) for c in records][:-1] == [MODS_PER_RECORD] * (len(records) - 1)
        assert len(records) == -(-len(mine) // MODS_PER_RECORD)
        assert [c["is_last_record_in_transaction_in_partition"] for c in records] == [
            i == len(records) - 1 for i in range(len(records))
        ]
        sequences = [c["record_sequence"] for c in records]
        assert sequences == sorted(sequences)
        expected_records += len(records)
    assert sorted(c["record_sequence"] for c in everything) == [
        f"{i:08d}" for i in range(expected_records)
    ]
    assert {c["number_of_records_in_transaction"] for c in everything} == {expected_records}
    assert {c["number_of_partitions_in_transaction"] for c in everything} == {3}


# Heartbeats
def reader(session, cs, start_us, token, heartbeat_ms=1000, until_us=None):
    """The read generator every face runs (SQL bounds a read to the statement's start;
    this one runs until ``until_us``, or for as long as it is iterated)."""
    from pipelines.change_streams.read import ReadArgs
    from pipelines.change_streams.read import read as read_records

    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    args = ReadArgs(start_us, None, token, heartbeat_ms)
    return read_records(session.catalog, stream, args, until_us=until_us)


def moment(record) -> int:
    (body,) = record.values()
    return micros(body.get("commit_timestamp") or body.get("timestamp") or body["start_timestamp"])


def check_progress(found):
    """Heartbeats strictly increase, and every one is at or after every record before it
    and before every record after it; commit timestamps never go back."""
    beats = [moment(r) for r in found if "heartbeat_record" in r]
    assert beats == sorted(beats) and len(set(beats)) == len(beats), beats
    latest_beat = latest_change = -1
    for record in found:
        if "heartbeat_record" in record:
            assert moment(record) >= latest_change
            latest_beat = moment(record)
        elif "data_change_record" in record:
            assert moment(record) > latest_beat, "a record at or before a heartbeat"
            assert moment(record) >= latest_change
            latest_change = moment(record)


def test_an_idle_table_gets_a_heartbeat_each_interval_and_a_bounded_read_ends_with_one(watched):
    s, token = watched
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    started = time.monotonic()
    until = now_us() + 3_500_000
    arrived = []
    found = []
    for record in reader(s, "CS", stream.created_us, token, until_us=until):
        arrived.append(time.monotonic() - started)
        found.append(record)
    assert all(list(r) == ["heartbeat_record"] for r in found)
    check_progress(found)
    assert 3 <= len(found) <= 5, found  # about one a second, then the end
    assert moment(found[-1]) == until
    assert all(b - a < 2.5 for a, b in zip([0.0, *arrived], arrived, strict=False))
    # In SQL: the read ends with a heartbeat at the statement's start.
    before = now_us()
    (last,) = read(s, "CS", rfc3339(stream.created_us), token)
    assert before <= moment(last) <= now_us()


def test_records_come_after_the_heartbeat_before_them(watched):
    s, token = watched
    start = now_us()
    records = reader(s, "CS", start, token)
    found = [next(records)]  # the first heartbeat: nothing up to it
    s.sql("INSERT INTO T VALUES (1, 'a')")
    s.sql("UPDATE T SET V = 'b'")
    while len(changes(found)) < 2 or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    check_progress(found)
    assert [c["mod_type"] for c in changes(found)] == ["INSERT", "UPDATE"]


@pytest.mark.parametrize("writer", ["sql", "flush"])
def test_a_writer_whose_clock_is_behind_commits_after_the_heartbeat(watched, monkeypatch, writer):
    """A writer 60 s behind commits after a reader said "everything up to H": its
    records still come after H, and commit timestamps strictly increase per table."""
    from flush.commit_clock import commit_ts

    s, token = watched
    start = now_us()
    records = reader(s, "CS", start, token)
    (beat,) = next(records).values()
    monkeypatch.setattr(commit_clock, "clock", lambda: now_us() - 60_000_000)
    keys = iter(range(1, 100))

    def write():
        if writer == "sql":
            s.sql(f"INSERT INTO T VALUES ({next(keys)}, 'late')")
        else:
            flush_rows(s, "T", [{"ID": next(keys), "V": "late"}])

    write()
    info = s.require_table("T")
    version = max(int(r["version"]) for r in s.sql("DESCRIBE HISTORY T").collect())
    assert commit_ts(info.uri, version) < micros(beat["timestamp"])  # stamped before H
    found = [{"heartbeat_record": beat}]
    while not changes(found) or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    write()  # a second late commit, after the next heartbeat too
    monkeypatch.undo()
    write()  # and one on time
    while len(changes(found)) < 3 or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    check_progress(found)
    stamps = [micros(c["commit_timestamp"]) for c in changes(found)]
    assert len(stamps) == 3 and stamps == sorted(set(stamps))
    # Every face agrees: a later read in SQL gives the same timestamps.
    again = changes(read(s, "CS", rfc3339(start), token))
    assert [micros(c["commit_timestamp"]) for c in again] == stamps


# Retention and bad arguments
def test_a_start_outside_retention_before_creation_or_in_the_future_is_refused(watched):
    s, token = watched
    table = s.require_table("T")
    # A stream made two hours ago that keeps one hour (the catalog's own call: CREATE
    # stamps the present).
    old = s.catalog.create_change_stream(
        "DB", "PUBLIC", "OLD", for_all=False, table_ids=(table.id,),
        value_capture_type="NEW_ROW", retention_s=3600, created_us=now_us() - 7_200_000_000,
    )  # fmt: skip
    (old_token,) = [p.token for p in s.catalog.list_partitions(old.uid)]
    hour_ago = now_us() - 3_600_000_000
    message = assert_refused(
        s, f"SELECT * FROM READ_OLD('{rfc3339(hour_ago - 5_000_000)}', NULL, '{old_token}', 1000)",
        "INVALID_ARGUMENT", "retention period",
    )  # fmt: skip
    assert "3600 s" in str(message)
    # Just inside the retention period: read.
    (last,) = read(s, "OLD", rfc3339(hour_ago + 60_000_000), old_token)
    assert list(last) == ["heartbeat_record"]
    # Before the stream was created; at that moment; in the future.
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    assert_refused(s, f"SELECT * FROM READ_CS('{rfc3339(stream.created_us - 1)}', NULL, "
                      f"'{token}', 1000)", "INVALID_ARGUMENT", "the stream was created",
                   rfc3339(stream.created_us))  # fmt: skip
    assert list(read(s, "CS", rfc3339(stream.created_us), token)[-1]) == ["heartbeat_record"]
    assert_refused(s, f"SELECT * FROM READ_CS('{rfc3339(now_us() + 60_000_000)}', NULL, "
                      f"'{token}', 1000)", "INVALID_ARGUMENT", "in the future")  # fmt: skip


@pytest.mark.parametrize(("arguments", "code", "words"), [
    ("start_timestamp => {start}, partition_token => '{token}', heartbeat_milliseconds => 999",
     "INVALID_ARGUMENT", ["heartbeat_milliseconds", "1,000", "300,000", "999"]),
    ("start_timestamp => {start}, partition_token => '{token}', "
     "heartbeat_milliseconds => 300001", "INVALID_ARGUMENT", ["heartbeat_milliseconds", "300001"]),
    ("start_timestamp => {start}, partition_token => '{token}', heartbeat_milliseconds => 'x'",
     "INVALID_ARGUMENT", ["heartbeat_milliseconds"]),
    ("start_timestamp => {start}, partition_token => '{token}', "
     "heartbeat_milliseconds => 1000.5", "INVALID_ARGUMENT", ["heartbeat_milliseconds", "1000.5"]),
    ("start_timestamp => {start}, partition_token => '{token}'", "INVALID_ARGUMENT",
     ["heartbeat_milliseconds"]),
    ("partition_token => '{token}', heartbeat_milliseconds => 1000", "INVALID_ARGUMENT",
     ["start_timestamp is required"]),
    ("start_timestamp => 'yesterday', heartbeat_milliseconds => 1000", "INVALID_ARGUMENT",
     ["not a timestamp", "yesterday"]),
    ("start_timestamp => {start}, end_timestamp => {before}, heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["end_timestamp", "before start_timestamp"]),
    ("start_timestamp => {start}, heartbeat_milliseconds => 1000, colour => 'red'",
     "INVALID_ARGUMENT", ["unknown argument 'colour'"]),
    ("{start}, NULL, partition_token => '{token}', heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["all by name", "position"]),
    ("start_timestamp => current_timestamp(), heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["start_timestamp must be a literal"]),
    ("{start}, NULL, (SELECT 'x'), 1000", "INVALID_ARGUMENT", ["partition_token must be a literal"]),
    ("{start}, NULL, NULL, 1000, 'options'", "INVALID_ARGUMENT", ["read_options"]),
    ("{start}, NULL, NULL, 1000, NULL, NULL", "INVALID_ARGUMENT", ["at most 5 arguments"]),
    ("start_timestamp => {start}, start_timestamp => {start}, heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["given twice"]),
    ("{start}, NULL, 'nope', 1000", "INVALID_ARGUMENT", ["'nope' is not a partition", "DB.PUBLIC.CS"]),
    ("{start}, NULL, 42, 1000", "INVALID_ARGUMENT", ["partition_token must be text"]),
])  # fmt: skip
def test_bad_arguments_are_refused_with_what_to_pass(watched, arguments, code, words):
    s, token = watched
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    start = f"'{rfc3339(stream.created_us + 1)}'"
    text = arguments.format(start=start, token=token, before=f"'{rfc3339(stream.created_us)}'")
    assert_refused(s, f"SELECT * FROM READ_CS({text})", code, *words)


def test_heartbeat_bounds_stream_names_and_tokens(watched):
    s, token = watched
    start = rfc3339(s.catalog.get_change_stream("DB", "PUBLIC", "CS").created_us)
    for beat in (1000, 300000, "1.5e3"):  # both bounds are accepted, and whole numbers
        assert list(read(s, "CS", start, token, heartbeat=beat)[-1]) == ["heartbeat_record"]
    # Positional arguments in the reference's order, TIMESTAMP literals, a reserved NULL.
    found = s.sql(f"SELECT * FROM READ_CS(TIMESTAMP '{start.replace('T', ' ')[:-1]}', NULL, "
                  f"'{token}', 1000, NULL)").collect()  # fmt: skip
    assert list(json.loads(found[-1][0])) == ["heartbeat_record"]
    assert_refused(s, f"SELECT * FROM READ_NOPE('{start}', NULL, NULL, 1000)", "OBJECT_NOT_FOUND",
                   "change stream DB.PUBLIC.NOPE does not exist")  # fmt: skip
    # A token of another stream is not one of this stream's.
    s.sql("CREATE CHANGE STREAM OTHER FOR T")
    (other,) = [p["token"] for p in partitions(s, "OTHER")]
    assert_refused(
        s,
        f"SELECT * FROM READ_CS('{now()}', NULL, '{other}', 1000)",
        "INVALID_ARGUMENT",
        f"partition_token '{other}' is not a partition of change stream DB.PUBLIC.CS",
    )
    # A child's token before the child's start.
    s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{token}'")
    child = next(p for p in partitions(s, "CS") if p["state"] == "OPEN")
    assert_refused(
        s,
        f"SELECT * FROM READ_CS('{start}', NULL, '{child['token']}', 1000)",
        "INVALID_ARGUMENT",
        "before partition",
        "start at the start_timestamp",
    )


# Known gap (strict: a fix makes it pass, and then the marker goes)
def test_a_table_added_to_the_stream_reports_its_changes_from_then_on(watched):
    s, token = watched
    s.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    start = now_us()
    s.sql("INSERT INTO U VALUES (1, 'before it was watched')")
    records = reader(s, "CS", start, token)
    found = [next(records)]
    s.sql("ALTER CHANGE STREAM CS SET FOR T, U")
    s.sql("INSERT INTO U VALUES (2, 'watched')")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not changes(found):
        found.append(next(records))
    check_progress(found)
    assert [m["keys"]["ID"] for c in changes(found) for m in c["mods"]] == [2]
    again = changes(read(s, "CS", rfc3339(start), token))
    assert [m["keys"]["ID"] for c in again for m in c["mods"]] == [2]


# One version's records, from its change feed (no Spark): any change of any rows
_STATE = st.dictionaries(  # row id -> (key, value); keys unique per state
    st.integers(0, 12), st.tuples(st.integers(0, 8), st.sampled_from(["a", "b", None])),
    max_size=10,
).filter(lambda rows: len({k for k, _ in rows.values()}) == len(rows))  # fmt: skip


def _feed(before, after) -> pa.Table:
    """The change data feed of one version taking the rows ``before`` to ``after`` (an
    unchanged row that was rewritten gives equal pre- and post-images, as Delta does)."""
    rows = []
    for row_id in sorted(before.keys() | after.keys()):
        old, new = before.get(row_id), after.get(row_id)
        if old is None:
            rows.append((row_id, "insert", *new))
        elif new is None:
            rows.append((row_id, "delete", *old))
        else:
            rows += [(row_id, "update_preimage", *old), (row_id, "update_postimage", *new)]
    return pa.table({
        "K": pa.array([r[2] for r in rows], pa.int64()),
        "V": pa.array([r[3] for r in rows], pa.string()),
        "_INGEST_ROW_ID": pa.array([r[0] for r in rows], pa.int64()),
        "_change_type": pa.array([r[1] for r in rows], pa.string()),
        "_commit_version": pa.array([1] * len(rows), pa.int64()),
    })  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    before=_STATE, after=_STATE, capture=st.sampled_from(CAPTURES),
    cuts=st.sets(st.integers(1, 2**32 - 1), max_size=3), per_record=st.integers(1, 3),
)  # fmt: skip
def test_a_version_s_records_replay_its_change_in_each_partition(
    before, after, capture, cuts, per_record
):
    """Applied in record_sequence order, a version's records take every key from its
    state before to its state after, each key in the one partition holding it; the
    records of a transaction are numbered across partitions, the last of each marked."""
    from catalog import PartitionRecord, TableInfo
    from ingest_sdk import TableSchema
    from pipelines.change_streams import records as records_module

    schema = TableSchema.parse({"K": "NUMBER(18,0)", "V": "VARCHAR"})
    table = TableInfo(1, "DB", "PUBLIC", "P", "/nowhere", schema, 0.0, 0, 0,
                      properties={"primary_key": ["K"]})  # fmt: skip
    bounds = [0, *sorted(cuts), 2**32]
    parts = [PartitionRecord(f"p{i}", "s", lo, hi, 0, None, ())
             for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]  # fmt: skip
    with mock.patch.object(records_module, "MODS_PER_RECORD", per_record):
        made = records_module.version_records(
            table, _feed(before, after), capture, 5, "1.1", "sql", False, parts, "P"
        )
    everything = [r["data_change_record"] for found in made.by_token.values() for r in found]
    assert sorted(r["record_sequence"] for r in everything) == [
        f"{i:08d}" for i in range(len(everything))
    ]
    assert {r["number_of_records_in_transaction"] for r in everything} <= {len(everything)}
    assert {r["number_of_partitions_in_transaction"] for r in everything} <= {len(made.by_token)}
    state = {k: v for k, v in before.values()}
    for token, found in made.by_token.items():
        assert found, "a partition without records is left out"
        bodies = [r["data_change_record"] for r in found]
        assert [b["is_last_record_in_transaction_in_partition"] for b in bodies] == [
            i == len(bodies) - 1 for i in range(len(bodies))
        ]
        assert [b["record_sequence"] for b in bodies] == sorted(
            b["record_sequence"] for b in bodies
        )
        assert all(len(b["mods"]) <= per_record for b in bodies)
        for body in bodies:
            for mod in body["mods"]:
                key = mod["keys"]["K"]
                assert owner(
                    [{"token": p.token, "key_range_start": p.lo, "key_range_end": p.hi}
                     for p in parts], key
                ) == token  # fmt: skip
                if body["mod_type"] == "DELETE":
                    assert key in state
                    del state[key]
                elif body["mod_type"] == "INSERT":
                    assert key not in state
                    state[key] = mod["new_values"]["V"]
                else:
                    assert key in state
                    if "V" in mod["new_values"]:
                        state[key] = mod["new_values"]["V"]
    assert state == {k: v for k, v in after.values()}


@pytest.mark.parametrize("change", ["split", "merge"])
def test_a_repartition_during_an_open_read_loses_and_repeats_nothing(session, change):
    """The parents' reads are open while the stream is split (or merged) and written to:
    each ends with the child record after exactly its own records before the change; the
    children return the rest."""
    s = session
    s.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    s.sql(f"CREATE CHANGE STREAM CS FOR K OPTIONS (partitions = {2 if change == 'merge' else 1})")
    start_us = s.catalog.get_change_stream("DB", "PUBLIC", "CS").created_us
    parents = open_partitions(s, "CS")
    readers = {p["token"]: reader(s, "CS", start_us, p["token"]) for p in parents}
    found = {token: [next(records)] for token, records in readers.items()}  # a heartbeat each
    s.sql(f"INSERT INTO K VALUES {', '.join(f'({k}, 0)' for k in range(1, 41))}")
    for token, records in readers.items():  # the parents are reading the insert
        while not changes(found[token]) or "heartbeat_record" not in found[token][-1]:
            found[token].append(next(records))
    tokens = [p["token"] for p in parents]
    if change == "split":
        s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{tokens[0]}' INTO 2")
    else:
        s.sql(f"ALTER CHANGE STREAM CS MERGE PARTITIONS '{tokens[0]}', '{tokens[1]}'")
    s.sql("UPDATE K SET V = 1")
    for token, records in readers.items():
        found[token].extend(records)  # to its end: the child record
        assert list(found[token][-1]) == ["child_partitions_record"]
        check_progress(found[token])
    (body,) = {json.dumps(found[t][-1], sort_keys=True) for t in tokens}  # the same one
    children = json.loads(body)["child_partitions_record"]
    for child in children["child_partitions"]:
        found[child["token"]] = read(s, "CS", children["start_timestamp"], child["token"])
    kinds: dict[int, list[str]] = {}
    for records in found.values():
        for change_record in changes(records):
            for mod in change_record["mods"]:
                kinds.setdefault(mod["keys"]["ID"], []).append(change_record["mod_type"])
    assert kinds == {k: ["INSERT", "UPDATE"] for k in range(1, 41)}
    assert all(not changes(found[t]) or changes(found[t])[-1]["mod_type"] == "INSERT"
               for t in tokens)  # fmt: skip
