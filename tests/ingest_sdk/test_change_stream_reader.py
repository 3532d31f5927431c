"""ChangeStreamReader against real change streams: a warehouse written through a session,
partitions split and merged by the real statements, records from the real read.

The reader's transport here is the in-process read (``pipelines.__main__.local_query``),
instrumented where a test needs to see the calls; a flaky wrapper raises the SDK's
``TransportError`` to stand for a broken connection. The kill tests run the reader in a
child process and SIGKILL it, or SIGKILL the service a reader reads from over HTTP.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from datetime import datetime

import pytest

from flush.commit_clock import clock
from ingest_sdk import ChangeStreamReader, CheckpointPolicy, RetryPolicy, TransportError
from ingest_sdk.change_stream_reader import rfc3339, to_micros
from pipelines import Session, SqlError
from pipelines.__main__ import local_query
from pipelines.change_streams.partitions import open_partitions, split
from tests.servers import ROOT

NAME = ("DB", "PUBLIC", "CS")
KEYS = 24


@pytest.fixture
def session(tmp_path, spark):
    made = Session(tmp_path / "warehouse", spark=spark)
    yield made
    made.close()


def stream_of(session):
    return session.catalog.get_change_stream(*NAME)


def make_stream(session, partitions=3):
    """T (ID primary key, V) with KEYS rows at V = 0, watched by CS; the read's start."""
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V NUMBER)")
    session.sql(f"CREATE CHANGE STREAM CS FOR T OPTIONS (partitions = '{partitions}')")
    start = rfc3339(clock())
    session.sql(f"INSERT INTO T SELECT id, 0 FROM range({KEYS})")
    return start


def bump(session, rounds):
    for _ in range(rounds):
        session.sql("UPDATE T SET V = V + 1")


class Recorder:
    """The query callable, instrumented: every call, each query's end, each record a
    query returned, and each record handed to the callback, in one ordered log."""

    def __init__(self, session, stop=None):
        self.query = local_query(session.catalog, NAME, stop)
        self.log = []
        self.lock = threading.Lock()

    def note(self, *event):
        with self.lock:
            self.log.append(event)

    def __call__(self, token, start, end, heartbeat_ms):
        self.note("call", token, start)
        records = self.query(token, start, end, heartbeat_ms)

        def follow():
            for record in records:
                if "child_partitions_record" in record:
                    self.note("child_record", token, record["child_partitions_record"])
                yield record
            self.note("end", token)

        return follow()

    def callback(self, record, db):
        self.note("handed", record["partition_token"], record)

    def calls(self):
        return [token for kind, token, *_ in self.log if kind == "call"]

    def index(self, kind, token, last=False):
        found = [i for i, (k, t, *_) in enumerate(self.log) if k == kind and t == token]
        return found[-1] if last else found[0]


def values_by_key(records):
    """Each key's new V values in the order the records were handed."""
    seen = defaultdict(list)
    for record in records:
        for mod in record["data_change_record"]["mods"]:
            seen[mod["keys"]["ID"]].append(mod["new_values"].get("V"))
    return seen


def returned_after_end(session, records):
    """``(partition token, commit_timestamp)`` of records a partition returned at or after
    its own end (the read reads the partitions again after each pass's seals, so that a
    split or merge landing meanwhile never makes a parent return its children's records)."""
    ends = {p.token: p.end_us for p in session.catalog.list_partitions(stream_of(session).uid)}
    return [
        (token, moment)
        for token, moment in records
        if ends.get(token) is not None and to_micros(moment) >= ends[token]
    ]


def assert_none_after_its_end(session, records):
    late = returned_after_end(session, records)
    assert not late, f"partitions returned records after their end (token, time): {late[:3]}"


def tokens_and_moments(handed):
    return [(r["partition_token"], r["data_change_record"]["commit_timestamp"]) for r in handed]


def run_in_thread(reader, stop):
    failure = []

    def target():
        try:
            reader.run(stop)
        except BaseException as exc:  # the test reads it
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, failure


def wait_for(condition, timeout=60.0, what="condition", failure=()):
    deadline = time.monotonic() + timeout
    while not condition():
        assert not failure, failure
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_reference_workflow_merge_child_read_once_after_both_parents(session, tmp_path):
    """The reference's workflow: three initial partitions read in parallel; two of them
    are merged; each parent returns the child record; the child's one query starts only
    after both parents' queries ended and all their records were handed."""
    start = make_stream(session)
    bump(session, 2)
    recorder = Recorder(session)
    handed = []

    def callback(record, db):
        recorder.callback(record, db)
        handed.append(record)

    reader = ChangeStreamReader(recorder, "CS", start_timestamp=start,
                                checkpoint_path=tmp_path / "cp.sqlite", callback=callback)  # fmt: skip
    stop = threading.Event()
    thread, failure = run_in_thread(reader, stop)
    try:
        initial = [p.token for p in open_partitions(session.catalog, stream_of(session))]
        assert len(initial) == 3
        wait_for(
            lambda: set(recorder.calls()) >= set(initial),
            what="the initial queries",
            failure=failure,
        )
        session.sql(f"ALTER CHANGE STREAM CS MERGE PARTITIONS '{initial[0]}', '{initial[1]}'")
        bump(session, 2)
        (child,) = [p.token for p in open_partitions(session.catalog, stream_of(session))
                    if p.parents]  # fmt: skip
        wait_for(lambda: len(values_by_key(handed)) == KEYS
                 and all(len(v) == 5 for v in values_by_key(handed).values()),
                 what="every change")  # fmt: skip
    finally:
        stop.set()
        thread.join(30)
    assert not failure, failure
    calls = recorder.calls()
    # The first query, one query per initial partition, and exactly one for the child.
    assert calls[0] is None
    assert sorted(calls[1:4]) == sorted(initial)
    assert Counter(calls) == Counter([None, *initial, child])
    # Both parents returned the same child record.
    named = [(t, rest[0]) for kind, t, *rest in recorder.log if kind == "child_record" and t]
    assert sorted(t for t, _ in named) == sorted(initial[:2])
    for _, record in named:
        (made,) = record["child_partitions"]
        assert made["token"] == child
        assert sorted(made["parent_partition_tokens"]) == sorted(initial[:2])
    # The child's query started after both parents' queries ended and after every record
    # of theirs was handed to the callback.
    child_call = recorder.index("call", child)
    for parent in initial[:2]:
        assert recorder.index("end", parent) < child_call
        assert recorder.index("handed", parent, last=True) < child_call
    assert recorder.index("handed", child) > child_call
    # Every change once, in order per key: V = 0 (the insert), then 1..4.
    if values_by_key(handed) != {k: [0, 1, 2, 3, 4] for k in range(KEYS)}:
        assert_none_after_its_end(session, tokens_and_moments(handed))
    assert values_by_key(handed) == {k: [0, 1, 2, 3, 4] for k in range(KEYS)}
    # The finished parents are gone from the reader's watermarks; open ones remain.
    assert set(reader.watermarks) == {initial[2], child}


def test_split_and_merge_while_writes_continue(session, tmp_path):
    """Partitions split and merged while a writer updates every key: each change is handed
    exactly once, in order per key, and the low watermark never goes backwards and never
    passes a record still to come."""
    start = make_stream(session, partitions=2)
    reader_ref = []
    handed = []
    lows = []

    def callback(record, db):
        low = reader_ref[0].low_watermark
        moment = to_micros(record["data_change_record"]["commit_timestamp"])
        lows.append((low, moment))
        handed.append(record)

    reader = ChangeStreamReader(local_query(session.catalog, NAME), "CS", start_timestamp=start,
                                checkpoint_path=tmp_path / "cp.sqlite", callback=callback)  # fmt: skip
    reader_ref.append(reader)
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            low = reader.low_watermark
            if low is not None:
                samples.append(low)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    thread, failure = run_in_thread(reader, stop)
    rounds = 10
    writer_done = threading.Event()

    def write():
        try:
            bump(session, rounds)
        finally:
            writer_done.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    catalog, stream = session.catalog, stream_of(session)
    try:
        changes = 0
        while not writer_done.is_set() and changes < 6:
            time.sleep(random.uniform(0.3, 1.0))
            live = open_partitions(catalog, stream)
            if changes % 3 == 2 and len(live) >= 2:
                from pipelines.change_streams.partitions import merge

                merge(catalog, stream, [live[0].token, live[1].token])
            else:
                split(catalog, stream, random.choice(live).token)
            changes += 1
        writer.join(120)
        assert changes >= 2, "the writer finished before the partitions changed"
        wait_for(lambda: sum(len(v) for v in values_by_key(handed).values())
                 >= KEYS * (rounds + 1), timeout=60, what="every change")  # fmt: skip
        time.sleep(1.0)  # a duplicate would arrive now
    finally:
        stop.set()
        thread.join(30)
        sampler.join(5)
    assert not failure, failure
    if values_by_key(handed) != {k: list(range(rounds + 1)) for k in range(KEYS)}:
        assert_none_after_its_end(session, tokens_and_moments(handed))
    assert values_by_key(handed) == {k: list(range(rounds + 1)) for k in range(KEYS)}
    assert all(a <= b for a, b in itertools.pairwise(samples)), "low went back"
    for low, moment in lows:
        assert low is not None and to_micros(low) <= moment


class Flaky:
    """The real query whose iterator breaks off with ``TransportError`` at random, as a
    connection to a restarting service does."""

    def __init__(self, query, chance):
        self.query = query
        self.chance = chance
        self.breaks = 0

    def __call__(self, token, start, end, heartbeat_ms):
        if random.random() < self.chance / 3:
            self.breaks += 1
            raise TransportError("connection refused (a flaky test transport)")
        records = self.query(token, start, end, heartbeat_ms)

        def follow():
            for record in records:
                if random.random() < self.chance:
                    self.breaks += 1
                    raise TransportError("connection reset (a flaky test transport)")
                yield record

        return follow()


def test_broken_queries_are_resumed_from_the_watermark_without_loss_or_duplicates(
    session, tmp_path
):
    start = make_stream(session)
    bump(session, 3)
    streamed = stream_of(session)
    split(session.catalog, streamed, open_partitions(session.catalog, streamed)[0].token)
    bump(session, 3)
    end = rfc3339(clock())
    flaky = Flaky(local_query(session.catalog, NAME), chance=0.3)
    handed = []
    reader = ChangeStreamReader(
        flaky, "CS", start_timestamp=start, end_timestamp=end,
        checkpoint_path=tmp_path / "cp.sqlite", callback=lambda r, db: handed.append(r),
        retry=RetryPolicy(initial=0.01, maximum=0.05, deadline=30),
    )  # fmt: skip
    reader.run()  # returns: every partition reached end_timestamp
    assert flaky.breaks > 3
    assert values_by_key(handed) == {k: list(range(7)) for k in range(KEYS)}
    assert reader.low_watermark == datetime.fromisoformat(end)
    # A second run on the finished checkpoint reads nothing again.
    again = []
    ChangeStreamReader(local_query(session.catalog, NAME), "CS", start_timestamp=start,
                       end_timestamp=end, checkpoint_path=tmp_path / "cp.sqlite",
                       callback=lambda r, db: again.append(r)).run()  # fmt: skip
    assert again == []


def test_stop_and_resume_later_end_and_callback_writes_commit_with_progress(session, tmp_path):
    """Stopped readers resume where they were; a later end_timestamp reopens the
    partitions that ended; what the callback writes through db commits with the progress,
    and a failing callback rolls its batch back."""
    start = make_stream(session)
    bump(session, 2)
    middle = rfc3339(clock())
    bump(session, 2)
    checkpoint = tmp_path / "cp.sqlite"

    def callback(record, db):
        db.execute("CREATE TABLE IF NOT EXISTS seen (id INTEGER, v INTEGER)")
        for mod in record["data_change_record"]["mods"]:
            db.execute(
                "INSERT INTO seen VALUES (?, ?)", (mod["keys"]["ID"], mod["new_values"]["V"])
            )

    def reader(end=None, call=callback, **kwargs):
        return ChangeStreamReader(local_query(session.catalog, NAME), "CS", start_timestamp=start,
                                  end_timestamp=end, checkpoint_path=checkpoint, callback=call,
                                  **kwargs)  # fmt: skip

    def seen():
        with sqlite3.connect(checkpoint) as db:
            return sorted(db.execute("SELECT id, v FROM seen").fetchall())

    reader(middle).run()
    assert seen() == sorted((k, v) for k in range(KEYS) for v in range(3))
    # An earlier end than the checkpoint's is refused.
    with pytest.raises(Exception, match="cannot stop earlier"):
        reader(rfc3339(to_micros(middle) - 1)).run()

    # A callback that fails on its 2nd record: the batch (its writes and progress) rolls back.
    calls = []

    def failing(record, db):
        calls.append(record)
        callback(record, db)
        if len(calls) == 2:
            raise RuntimeError("the application failed")

    with pytest.raises(RuntimeError, match="the application failed"):
        reader(None, failing, checkpoint=CheckpointPolicy(max_records=10_000, max_delay=60)).run()
    assert seen() == sorted((k, v) for k in range(KEYS) for v in range(3))
    # Resumed without an end: the rest, once each; stop it when it has everything.
    stop = threading.Event()
    resumed = reader(None)
    thread, failure = run_in_thread(resumed, stop)
    wait_for(lambda: len(seen()) == KEYS * 5, what="the rest")
    time.sleep(0.5)
    stop.set()
    thread.join(30)
    assert not failure, failure
    assert seen() == sorted((k, v) for k in range(KEYS) for v in range(5))


def test_a_dropped_stream_stops_the_reader_with_its_error(session, tmp_path):
    start = make_stream(session)
    reader = ChangeStreamReader(local_query(session.catalog, NAME), "CS", start_timestamp=start,
                                checkpoint_path=tmp_path / "cp.sqlite",
                                callback=lambda r, db: None)  # fmt: skip
    stop = threading.Event()
    thread, failure = run_in_thread(reader, stop)
    time.sleep(1.0)
    session.sql("DROP CHANGE STREAM CS")
    thread.join(60)
    stop.set()
    assert not thread.is_alive()
    (error,) = failure
    assert isinstance(error, SqlError)
    assert "does not exist" in str(error) or "was dropped or replaced" in str(error)


# -- SIGKILL of the reader -------------------------------------------------------------

CHILD = """
import sys, time
from pathlib import Path

from catalog import SqliteCatalog
from ingest_sdk import ChangeStreamReader, CheckpointPolicy
from ingest_sdk.process_exit import run_entry_point
from pipelines.__main__ import local_query

warehouse, checkpoint, start, end = sys.argv[1:5]


def callback(record, db):
    db.execute("CREATE TABLE IF NOT EXISTS seen (id INTEGER, v INTEGER)")
    for mod in record["data_change_record"]["mods"]:
        db.execute("INSERT INTO seen VALUES (?, ?)", (mod["keys"]["ID"], mod["new_values"]["V"]))
    time.sleep(0.1)


def main():
    catalog = SqliteCatalog(Path(warehouse) / "catalog.sqlite")
    ChangeStreamReader(
        local_query(catalog, ("DB", "PUBLIC", "CS")), "CS", start_timestamp=start,
        end_timestamp=end, checkpoint_path=checkpoint, callback=callback,
        checkpoint=CheckpointPolicy(max_records=3, max_delay=0.05),
    ).run()


run_entry_point(main)
"""


def test_sigkill_of_the_reader_loses_and_repeats_nothing(session, tmp_path):
    start = make_stream(session)
    catalog, streamed = session.catalog, stream_of(session)
    for round_ in range(8):
        bump(session, 1)
        live = open_partitions(catalog, streamed)
        if round_ in (2, 5):
            split(catalog, streamed, live[0].token)
        if round_ == 4:
            from pipelines.change_streams.partitions import merge

            merge(catalog, streamed, [live[-2].token, live[-1].token])
    end = rfc3339(clock())
    checkpoint = tmp_path / "cp.sqlite"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        "-c",
        CHILD,
        str(tmp_path / "warehouse"),
        str(checkpoint),
        start,
        end,
    ]

    def seen():
        if not checkpoint.exists():
            return []
        with sqlite3.connect(checkpoint) as db:
            try:
                return db.execute("SELECT id, v FROM seen ORDER BY rowid").fetchall()
            except sqlite3.OperationalError:  # no table yet
                return []

    progress = []
    for _ in range(5):
        before = len(seen())
        child = subprocess.Popen(command, env=env, cwd=ROOT)
        # Killed at a random moment once it hands records (its imports take seconds).
        wait_for(lambda: len(seen()) > before or child.poll() is not None, what="progress")  # noqa: B023
        time.sleep(random.uniform(0.0, 0.6))
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        progress.append(len(seen()))
    done = subprocess.run(command, env=env, cwd=ROOT, timeout=300, check=False)
    assert done.returncode == 0
    rows = seen()
    expected = KEYS * 9
    assert progress[0] > 0 and progress[-1] < expected, progress  # killed midway
    assert Counter(rows) == Counter((k, v) for k in range(KEYS) for v in range(9))
    by_key = defaultdict(list)
    for key, value in rows:
        by_key[key].append(value)
    assert all(values == list(range(9)) for values in by_key.values())  # order per key


# -- SIGKILL of the service a reader reads from over HTTP -------------------------------


def test_sigkill_of_the_service_mid_stream_loses_and_repeats_nothing(
    session, tmp_path, process_server_factory, client_factory, caplog
):
    """A reader reads over HTTP while a writer updates every key; the service is SIGKILLed
    and restarted on the same port several times. The reader's queries break, are
    retried from the partitions' watermarks, and every change arrives once, in order."""
    caplog.set_level(logging.INFO, logger="ingest_sdk.change_stream_reader")
    start = make_stream(session)
    server = process_server_factory().start()
    client = client_factory(server.url, retry=RetryPolicy(initial=0.05, maximum=0.5, deadline=60))
    checkpoint = tmp_path / "cp.sqlite"

    def callback(record, db):
        change = record["data_change_record"]
        db.execute("CREATE TABLE IF NOT EXISTS seen (id INTEGER, v INTEGER, token, moment)")
        for mod in change["mods"]:
            db.execute("INSERT INTO seen VALUES (?, ?, ?, ?)", (
                mod["keys"]["ID"], mod["new_values"]["V"], record["partition_token"],
                change["commit_timestamp"],
            ))  # fmt: skip

    def seen(columns="id, v"):
        with sqlite3.connect(checkpoint) as db:
            try:
                return db.execute(f"SELECT {columns} FROM seen ORDER BY rowid").fetchall()
            except sqlite3.OperationalError:
                return []

    reader = ChangeStreamReader(
        client, "CS", start_timestamp=start, checkpoint_path=checkpoint, callback=callback,
        retry=RetryPolicy(initial=0.05, maximum=0.5, deadline=60),
    )  # fmt: skip
    stop = threading.Event()
    thread, failure = run_in_thread(reader, stop)
    rounds = 8
    try:
        wait_for(lambda: len(seen()) >= KEYS, what="the inserts", failure=failure)
        streamed = stream_of(session)
        for round_ in range(rounds):
            bump(session, 1)
            if round_ == 3:
                split(
                    session.catalog, streamed, open_partitions(session.catalog, streamed)[0].token
                )
            if round_ % 2 == 1:
                time.sleep(random.uniform(0.0, 0.5))
                server.kill()
                time.sleep(random.uniform(0.0, 1.0))
                server.start()
        wait_for(lambda: len(seen()) >= KEYS * (rounds + 1), timeout=120, what="every change",
                 failure=failure)  # fmt: skip
        time.sleep(1.0)  # a duplicate would arrive now
    finally:
        stop.set()
        thread.join(60)
    assert not failure, failure
    rows = seen()
    if Counter(rows) != Counter((k, v) for k in range(KEYS) for v in range(rounds + 1)):
        assert_none_after_its_end(session, seen("token, moment"))
    assert Counter(rows) == Counter((k, v) for k in range(KEYS) for v in range(rounds + 1))
    by_key = defaultdict(list)
    for key, value in rows:
        by_key[key].append(value)
    assert all(values == list(range(rounds + 1)) for values in by_key.values())
    broken = [r for r in caplog.records if "broke off" in r.getMessage()]
    assert len(broken) >= 4, "the kills did not break open reads"
