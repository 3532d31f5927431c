"""Adversarial tests of change streams: hostile arguments and names, skewed writer
clocks, tables whose labels collide, and exactly-once delivery across a partition tree
that splits and merges while a writer commits and live readers follow it.

Seven of them found defects (fixed with them: a writer whose clock is ahead held back
heartbeats and gave timestamps a reader could not resume from; tables whose labels
collide were mixed up; a moment outside the calendar was a 500); the others held."""

from __future__ import annotations

import itertools
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson
import pytest

import flush.commit_clock as commit_clock
from flush.commit_clock import now_us
from pipelines import SqlError
from pipelines.change_streams.partitions import merge, open_partitions, split
from pipelines.change_streams.read import ReadArgs, read_args
from pipelines.change_streams.read import read as read_records
from pipelines.change_streams.records import key_hash, rfc3339
from pipelines.errors import ObjectNotFoundError
from tests.pipelines.change_streams.test_read import (
    changes,
    created,
    flush_rows,
    micros,
    partitions,
    read_tree,
)


def refused(session, text, code="INVALID_ARGUMENT", kind=SqlError):
    with pytest.raises(kind) as caught:
        session.sql(text).collect()
    assert caught.value.code == code, caught.value
    return str(caught.value)


def call(start="NULL", end="NULL", token="NULL", heartbeat="1000", name="READ_CS"):
    return (
        f"SELECT * FROM {name}(start_timestamp => {start}, end_timestamp => {end}, "
        f"partition_token => {token}, heartbeat_milliseconds => {heartbeat})"
    )


# Hostile arguments
@pytest.mark.parametrize(
    "which",
    [
        ("start", "'0001-01-01T00:00:00+01:00'"),
        ("start", "'9999-12-31T23:59:59-01:00'"),
        ("end", "'0001-01-01T00:00:00+01:00'"),
    ],
)
def test_a_timestamp_outside_the_calendar_is_refused_as_an_invalid_argument(watched, which):
    s, token = watched
    arg, value = which
    start = f"'{created(s, 'CS')}'"
    text = call(start=value, token=f"'{token}'") if arg == "start" else call(start, value)
    refused(s, text)


def test_ordinary_bad_timestamps_and_heartbeats_are_refused(watched):
    s, token = watched
    start = f"'{created(s, 'CS')}'"
    for bad in ("'now'", "'0001-01-01'", "'9999-12-31'", "'1700000000'", "'NaN'", "''"):
        refused(s, call(start=bad))
    for beat in ("1e400", "-1000", "'NaN'", "'Infinity'", "999", "300001", "1000.5", "NULL"):
        refused(s, call(start=start, token=f"'{token}'", heartbeat=beat))
    refused(s, call(start=start).replace("end_timestamp", "START_TIMESTAMP"))
    # A token that is SQL, or another stream's token, is no partition of this stream.
    s.sql("CREATE CHANGE STREAM OTHER FOR T")
    (other,) = [p["token"] for p in partitions(s, "OTHER")]
    for bad in ("'''); DROP TABLE T; --'", f"'{other}'", f"'{token} '", f"'{token.upper()}'"):
        refused(s, call(start=start, token=bad))
    assert s.sql("SELECT count(*) FROM T").collect()[0][0] == 0


def test_read_in_views_ctes_inserts_and_other_schemas(watched):
    s, token = watched
    s.sql("INSERT INTO T VALUES (1, 'a')")
    text = call(start=f"'{created(s, 'CS')}'", token=f"'{token}'")
    s.sql(f"CREATE VIEW VV AS {text}")
    assert s.sql("SELECT count(*) FROM VV").collect()[0][0] == 2  # the change, a heartbeat
    refused(
        s,
        f"CREATE DYNAMIC TABLE DD TARGET_LAG = '1 minute' AS {text}",
        code="SQL_COMPILATION_ERROR",
    )
    s.sql("CREATE TABLE SINK (C VARCHAR)")
    s.sql(f"INSERT INTO SINK {text}")
    assert s.sql("SELECT count(*) FROM SINK").collect()[0][0] == 2
    assert s.sql(f"WITH x AS ({text}) SELECT count(*) FROM x").collect()[0][0] == 2
    s.sql("CREATE SCHEMA S2")
    s.sql("CREATE TABLE DB.S2.U (ID NUMBER PRIMARY KEY)")
    s.sql("CREATE CHANGE STREAM DB.S2.CS FOR DB.S2.U")
    s.sql("INSERT INTO DB.S2.U VALUES (7)")
    stream = s.catalog.get_change_stream("DB", "S2", "CS")
    start = f"'{rfc3339(stream.created_us)}'"
    (first,) = [orjson.loads(r[0]) for r in s.sql(call(start, name="DB.S2.READ_CS")).collect()]
    other = first["child_partitions_record"]["child_partitions"][0]["token"]
    assert other != token
    found = [orjson.loads(r[0]) for r in s.sql(call(start, token=f"'{other}'", name="DB.S2.READ_CS")).collect()]  # fmt: skip
    assert [m["keys"] for c in changes(found) for m in c["mods"]] == [{"ID": 7}]
    s.sql("DROP SCHEMA DB.S2 CASCADE")
    refused(s, call(start, name="DB.S2.READ_CS"), code="OBJECT_NOT_FOUND", kind=ObjectNotFoundError)


def test_unicode_and_dotted_stream_names(watched):
    s, _ = watched
    for name in ("ström", "a.b", "x" * 200):
        s.sql(f'CREATE CHANGE STREAM "{name}" FOR T')
        stream = s.catalog.get_change_stream("DB", "PUBLIC", name)
        first = s.sql(call(f"'{rfc3339(stream.created_us)}'", name=f'"READ_{name}"')).collect()
        assert len(first) == 1


# Table names that collide in records
def test_a_for_all_stream_keeps_tables_with_the_same_label_apart(session):
    s = session
    s.sql("CREATE CHANGE STREAM ALLCS FOR ALL")
    s.sql('CREATE TABLE DB.PUBLIC."DB.S2.T" (ID NUMBER PRIMARY KEY, V VARCHAR)')
    s.sql("CREATE SCHEMA S2")
    s.sql("USE SCHEMA DB.PUBLIC")  # CREATE SCHEMA made S2 the current schema
    s.sql("CREATE TABLE DB.S2.T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("INSERT INTO DB.S2.T VALUES (1, 's2')")
    s.sql("INSERT INTO DB.S2.T VALUES (3, 's2 again')")
    s.sql("INSERT INTO DB.PUBLIC.\"DB.S2.T\" VALUES (2, 'public')")
    tree = read_tree(s, "ALLCS", created(s, "ALLCS"))
    found = sorted(
        (m["keys"]["ID"], m["new_values"]["V"]) for r in tree.values() for c in changes(r) for m in c["mods"]
    )  # fmt: skip
    assert found == [(1, "s2"), (2, "public"), (3, "s2 again")]


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
    by_tx: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for token, records in tree.items():
        for c in changes(records):
            by_tx.setdefault(c["server_transaction_id"], []).append((token, c))
    assert len(by_tx) == 2
    for found in by_tx.values():
        seqs = sorted(int(c["record_sequence"]) for _, c in found)
        assert seqs == list(range(len(found)))
        assert {c["number_of_records_in_transaction"] for _, c in found} == {len(found)}
        tokens = {t for t, _ in found}
        assert {c["number_of_partitions_in_transaction"] for _, c in found} == {len(tokens)}
        for token in tokens:
            mine = sorted((int(c["record_sequence"]), c) for t, c in found if t == token)
            flags = [c["is_last_record_in_transaction_in_partition"] for _, c in mine]
            assert flags == [False] * (len(flags) - 1) + [True]
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


# HTTP
def http_get(url: str, timeout: float = 30.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def served(server_factory, spark):
    from pipelines import Session

    server = server_factory(change_stream_check_seconds=0)
    s = Session(server.config.warehouse, spark=spark)
    s.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("CREATE CHANGE STREAM CS FOR T")
    yield server, s
    s.close()


def url_of(server, start, **extra):
    query = {"start_timestamp": start, "heartbeat_milliseconds": "1000", **extra}
    return f"{server.url}/v1/change-streams/CS/read?{urllib.parse.urlencode(query)}"


def test_http_a_timestamp_outside_the_calendar_is_a_4xx(served):
    server, _ = served
    status, body = http_get(url_of(server, "0001-01-01T00:00:00+01:00"))
    assert 400 <= status < 500, (status, body[:300])


def test_http_hostile_tokens_and_many_concurrent_reads(served):
    server, s = served
    start = created(s, "CS")
    (token,) = [p["token"] for p in partitions(s, "CS")]
    for bad in ("'); DROP TABLE T; --", "../../catalog.db", "\x00", token + "x"):
        status, body = http_get(url_of(server, start, partition_token=bad))
        assert status == 400, (status, body[:300])
    s.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    end = rfc3339(now_us())
    results: list[Any] = []

    def one():
        results.append(http_get(url_of(server, start, partition_token=token, end_timestamp=end)))

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    bodies = {body for _, body in results}
    assert {status for status, _ in results} <= {200, 429}
    ok = [body for status, body in results if status == 200]
    assert ok and len({b for b in ok}) == 1, bodies
    lines = [orjson.loads(x) for x in ok[0].splitlines()]
    assert sorted(m["keys"]["ID"] for c in changes(lines) for m in c["mods"]) == [1, 2]
    assert s.sql("SELECT count(*) FROM T").collect()[0][0] == 2
