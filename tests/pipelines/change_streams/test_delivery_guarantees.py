"""What a change stream's readers can rely on: heartbeats that stay true and timestamps
they can resume from when a writer's clock is ahead or behind, records numbered within
their transaction across partitions, rows without a primary key kept apart, and every
flush read exactly once across a partition tree that splits and merges while a writer
commits and live readers follow it.

Written by the adversarial review of change streams, with ``test_hostile_reads``.
Seven tests of that review found defects, fixed with them: a writer whose clock is
ahead held back heartbeats and gave timestamps a reader could not resume from; tables
whose labels collide were mixed up; a moment outside the calendar was a 500. The
others held.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import flush.commit_clock as commit_clock
from flush.commit_clock import now_us
from pipelines.change_streams.partitions import merge, open_partitions, split
from pipelines.change_streams.read import ReadArgs, read_args
from pipelines.change_streams.read import read as read_records
from pipelines.change_streams.records import key_hash, rfc3339
from tests.pipelines.change_streams.test_exclusions import assert_numbered, by_transaction
from tests.pipelines.change_streams.test_read import (
    changes,
    created,
    flush_rows,
    micros,
    read_tree,
)


# Skewed clocks
def ahead_then_read(s, token, monkeypatch, seconds=3.0):
    """A writer 1 h ahead commits a row; an open read of the partition runs ``seconds``.
    Returns [(arrival in s, record)]."""
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    start = now_us()
    monkeypatch.setattr(commit_clock, "clock", lambda: now_us() + 3_600_000_000)
    s.sql("INSERT INTO T VALUES (1, 'early')")
    monkeypatch.undo()
    stop = threading.Event()
    found: list[tuple[float, dict[str, Any]]] = []
    began = time.monotonic()

    def run():
        args = ReadArgs(start, None, token, 1000)
        for record in read_records(s.catalog, stream, args, stop=stop):
            found.append((time.monotonic() - began, record))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(10)
    return stream, found


def test_heartbeats_keep_coming_after_a_writer_whose_clock_is_ahead(watched, monkeypatch):
    s, token = watched
    _, found = ahead_then_read(s, token, monkeypatch)
    assert changes([r for _, r in found]), found
    change_at = next(at for at, r in found if "data_change_record" in r)
    beats = [at for at, r in found if "heartbeat_record" in r and at > change_at]
    assert beats, f"no heartbeat in {3.0 - change_at:.1f} s with heartbeat_milliseconds=1000"


def test_a_writer_whose_clock_is_ahead_gives_no_timestamps_a_reader_cannot_resume_from(
    watched, monkeypatch
):
    s, token = watched
    stream, found = ahead_then_read(s, token, monkeypatch, seconds=1.5)
    partitions_now = s.catalog.list_partitions(stream.uid)
    for _, record in found:
        (body,) = record.values()
        moment = body.get("commit_timestamp") or body.get("timestamp")
        values = {
            "start_timestamp": moment,
            "partition_token": token,
            "heartbeat_milliseconds": 1000,
        }
        read_args(values, stream, partitions_now)


def test_a_writer_whose_clock_is_behind_keeps_heartbeats_true_across_a_split(watched, monkeypatch):
    """A lagging writer commits after a heartbeat and after a split: its record is after
    the heartbeat, and in the child, never in the ended parent."""
    s, token = watched
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    start = now_us()
    records = read_records(s.catalog, stream, ReadArgs(start, None, token, 1000))
    beat = micros(next(records)["heartbeat_record"]["timestamp"])
    children = split(s.catalog, stream, token)
    monkeypatch.setattr(commit_clock, "clock", lambda: now_us() - 60_000_000)
    s.sql("INSERT INTO T VALUES (1, 'late'), (2, 'late'), (3, 'late')")
    monkeypatch.undo()
    rest = list(records)
    assert changes(rest) == []
    (last,) = rest
    assert micros(last["child_partitions_record"]["start_timestamp"]) > beat
    seen = []
    for child in children:
        args = ReadArgs(child.start_us, None, child.token, 1000)
        for record in read_records(s.catalog, stream, args, until_us=now_us()):
            if "data_change_record" in record:
                stamp = micros(record["data_change_record"]["commit_timestamp"])
                assert stamp >= child.start_us > beat
                seen += [m["keys"]["ID"] for m in record["data_change_record"]["mods"]]
    assert sorted(seen) == [1, 2, 3]


# Records
def test_no_primary_key_duplicates_key_changes_and_float_bits(session):
    s = session
    s.sql("CREATE TABLE N (K NUMBER, F FLOAT)")
    s.sql("CREATE TABLE P (ID NUMBER PRIMARY KEY, F FLOAT)")
    s.sql("CREATE CHANGE STREAM CS FOR N, P")
    s.sql("INSERT INTO N VALUES (1, 0.0), (1, 0.0), (NULL, NULL)")
    s.sql("INSERT INTO P VALUES (1, 0.0), (3, NULL)")
    s.sql("INSERT INTO P SELECT 2, CAST('NaN' AS DOUBLE)")
    s.sql("UPDATE P SET F = CAST('-0.0' AS DOUBLE) WHERE ID = 1")  # -0.0 is another value
    s.sql("UPDATE P SET F = CAST('NaN' AS DOUBLE) WHERE ID = 2")  # NaN to NaN: no change
    s.sql("UPDATE P SET ID = 4 WHERE ID = 3")  # a key change: DELETE 3, INSERT 4
    tree = read_tree(s, "CS", created(s, "CS"))
    found = [c for r in tree.values() for c in changes(r)]
    n = [c for c in found if c["table_name"] == "N"]
    assert [len(c["mods"]) for c in n] == [3]
    assert len({tuple(m["keys"].items()) for m in n[0]["mods"]}) == 3  # row ids
    p = [(c["mod_type"], m["keys"]["ID"], m["new_values"]) for c in found if c["table_name"] == "P" for m in c["mods"]]  # fmt: skip
    updates = [x for x in p if x[0] == "UPDATE"]
    assert updates == [("UPDATE", 1, {"F": -0.0})]
    assert ("DELETE", 3, {}) in p and ("INSERT", 4, {"F": None}) in p
    for c in found:
        stamp, seqs = c["commit_timestamp"], [c["record_sequence"]]
        assert stamp and seqs


def test_a_transaction_over_many_partitions_numbers_its_records(session):
    s = session
    s.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    s.sql("CREATE CHANGE STREAM CS FOR K OPTIONS (partitions = 5)")
    s.sql("INSERT INTO K SELECT id, id FROM range(3000)")
    s.sql("UPDATE K SET V = V + 1 WHERE ID % 3 = 0")
    tree = read_tree(s, "CS", created(s, "CS"))
    by_tx = by_transaction(tree)
    assert len(by_tx) == 2
    assert_numbered(tree)
    total = sum(len(c["mods"]) for f in by_tx.values() for _, c in f)
    assert total == 3000 + 1000


# Exactly once while the tree changes under a writer and live readers
def test_every_flush_is_read_once_while_partitions_split_and_merge(session_factory, tmp_path):
    s = session_factory()
    s.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    s.sql("CREATE CHANGE STREAM CS FOR K OPTIONS (partitions = 2)")
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    writer = session_factory()
    stop = threading.Event()
    written: list[int] = []
    keys = itertools.count(1)

    def write():
        while not stop.is_set():
            batch = [next(keys) for _ in range(5)]
            flush_rows(writer, "K", [{"ID": k, "V": k} for k in batch], channel="attack")
            written.extend(batch)

    until = now_us() + 6_000_000
    got: dict[str, list[dict[str, Any]]] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    readers: dict[str, threading.Thread] = {}
    parents_of: dict[str, tuple[str, ...]] = {}
    catalog = s.catalog

    def follow(token: str, start: int) -> None:
        try:
            found = list(
                read_records(catalog, stream, ReadArgs(start, None, token, 1000), until_us=until)
            )
        except BaseException as exc:
            errors.append(exc)
            return
        with lock:
            got[token] = found
            for record in found:
                if "child_partitions_record" in record:
                    child = record["child_partitions_record"]
                    at = micros(child["start_timestamp"])
                    for item in child["child_partitions"]:
                        parents_of[item["token"]] = tuple(item["parent_partition_tokens"])
                        ready = all(p in got for p in item["parent_partition_tokens"])
                        if ready and item["token"] not in readers:
                            t = threading.Thread(target=follow, args=(item["token"], at))
                            readers[item["token"]] = t
                            t.start()

    start = now_us()
    with lock:
        for p in open_partitions(catalog, stream):
            t = threading.Thread(target=follow, args=(p.token, start))
            readers[p.token] = t
            t.start()
    thread = threading.Thread(target=write)
    thread.start()
    try:
        for round_ in range(6):
            time.sleep(0.4)
            live = open_partitions(s.catalog, stream)
            if round_ % 2 == 0 or len(live) < 2:
                split(s.catalog, stream, live[round_ % len(live)].token)
            else:
                merge(s.catalog, stream, [live[0].token, live[1].token])
    finally:
        stop.set()
        thread.join()
    assert now_us() < until - 1_000_000, "the writer ran past the readers' end"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            pending = [t for t in readers.values() if t.is_alive()]
        if not pending and now_us() > until:
            break
        time.sleep(0.1)
    assert not errors, errors
    tree = {p.token: p for p in s.catalog.list_partitions(stream.uid)}
    delivered: dict[int, list[str]] = {}
    for token, records in got.items():
        part = tree[token]
        for c in changes(records):
            stamp = micros(c["commit_timestamp"])
            assert stamp >= part.start_us and (part.end_us is None or stamp < part.end_us)
            for m in c["mods"]:
                h = key_hash([m["keys"]["ID"]])
                assert part.lo <= h < part.hi
                delivered.setdefault(m["keys"]["ID"], []).append(token)
    dups = {k: v for k, v in delivered.items() if len(v) > 1}
    assert not dups, dups
    assert sorted(delivered) == sorted(written)
    # a reader reading the tree again after the fact gets the same
    again = read_tree(s, "CS", rfc3339(start))
    again_keys = sorted(
        m["keys"]["ID"] for r in again.values() for c in changes(r) for m in c["mods"]
    )
    assert again_keys == sorted(written)
    assert set(delivered) <= set(again_keys)
