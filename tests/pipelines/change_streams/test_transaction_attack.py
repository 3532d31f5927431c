"""Attacks on a SQL transaction of several tables as one change stream transaction
(one ``server_transaction_id``, one ``commit_timestamp``, numbered and counted across
its tables, none of it returned before the whole commit is finished)."""

from __future__ import annotations

import json
import time

from flush.commit_clock import clock
from pipelines.change_streams.records import rfc3339
from pipelines.change_streams.timeline import newest_version
from tests.pipelines.change_streams.test_kill import (
    killed_at,
    reading,
    transaction_script,
    two_tables_watched,
)
from tests.pipelines.change_streams.test_read import changes, flush_rows, micros, read_tree
from tests.pipelines.change_streams.test_read import read as read_once


def _brief(record):
    return (record["table_name"], record["server_transaction_id"][:8], record["commit_timestamp"],
            record["record_sequence"], record["number_of_records_in_transaction"])  # fmt: skip


def test_a_second_transaction_on_a_shared_table_waits_for_a_held_commit(session):
    """Commit A (T, U) is decided and has written T when commit B (T, W), which pinned T
    before A's decision, is decided too. B writes a table it shares with A only once A
    ended (it completes A itself, A's owner being dead): A reaches readers whole at one
    moment, B after it. (Found by this file's first version: B's end sealed T past A's
    version while A was held, so A's T record came early and A was split in two; two
    live sessions committing such transactions hit it about once in 15 rounds.)"""
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE TABLE W (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CT FOR T")
    session.sql("CREATE CHANGE STREAM CS FOR T, U")
    start = clock()
    t, u = session.require_table("T"), session.require_table("U")
    session.sql("INSERT INTO T VALUES (0, 'z')")
    tokens = {}
    for cs in ("CT", "CS"):  # both streams' tables sealed past start
        stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
        (partition,) = session.catalog.list_partitions(stream.uid)
        tokens[cs] = partition.token
        (_,) = changes(read_once(session, cs, rfc3339(start), partition.token,
                                      end=rfc3339(clock())))  # fmt: skip
    # B pins T (its first statement), then A commits T and dies before U, then B ends.
    with session.transaction():
        session.sql("INSERT INTO T VALUES (2, 'b')")
        pending = killed_at(session, "pipeline_between_tables")
        assert [newest_version(t.uri), newest_version(u.uri)] == [2, 0]  # A: T, not U
        session.sql("INSERT INTO W VALUES (2, 'b')")
    a_id = pending.plan["app_id"].rsplit(":", 1)[-1]
    assert session.catalog.pending_commits() == []  # B completed A, then itself
    assert [newest_version(t.uri), newest_version(u.uri)] == [3, 1]
    found = changes(read_once(session, "CS", rfc3339(start), tokens["CS"],
                              end=rfc3339(clock())))  # fmt: skip
    mine = [c for c in found if c["server_transaction_id"] == a_id]
    assert sorted(c["table_name"] for c in mine) == ["T", "U"]
    assert len({c["commit_timestamp"] for c in mine}) == 1, [_brief(c) for c in mine]
    assert {c["number_of_records_in_transaction"] for c in mine} == {2}
    assert sorted(c["record_sequence"] for c in mine) == ["00000000", "00000001"]
    moment = micros(mine[0]["commit_timestamp"])
    (b_row,) = [c for c in found if c["mods"][0]["keys"] == {"ID": 2}]
    assert micros(b_row["commit_timestamp"]) > moment
    in_t = changes(read_once(session, "CT", rfc3339(start), tokens["CT"], end=rfc3339(clock())))
    assert [(c["server_transaction_id"], micros(c["commit_timestamp"]))
            for c in in_t if c["server_transaction_id"] == a_id] == [(a_id, moment)]  # fmt: skip


def _until_beat_at(records, kept, at_least):
    """Move a reader's records (and heartbeats) to ``kept`` until a heartbeat at or
    after ``at_least`` (µs) arrives."""
    while True:
        record = records.get(timeout=120)
        assert "error" not in record, record
        kept.append(record)
        beat = record.get("heartbeat_record")
        if beat is not None and micros(beat["timestamp"]) >= at_least:
            return


def test_transactions_of_three_tables_in_two_partitions_under_live_readers(session):
    """Transactions that insert, update, delete, write one table twice and update no
    row of a fourth statement, in a stream of two partitions, read live by a reader per
    partition: each transaction is one id at one timestamp, numbered 0..n-1 across both
    partitions, counted whole, its last record per partition marked, no heartbeat
    returned before a record at or after it; a read resumed from a heartbeat returns
    exactly what came after it."""
    for name in ("T", "U", "V"):
        session.sql(f"CREATE TABLE {name} (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("INSERT INTO U SELECT id, 'u' FROM range(10)")
    session.sql("INSERT INTO V SELECT id, 'v' FROM range(10)")
    session.sql("CREATE CHANGE STREAM CS FOR T, U, V OPTIONS (partitions = 2)")
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    tokens = sorted(p.token for p in session.catalog.list_partitions(stream.uid))
    assert len(tokens) == 2
    catalog_file = session.warehouse / "catalog.sqlite"
    start = clock()
    readers = {token: reading(catalog_file, stream, token, start, 500) for token in tokens}
    got: dict[str, list] = {token: [] for token in tokens}
    try:
        for i in range(4):
            base = 100 * i
            with session.transaction():
                session.sql(f"INSERT INTO T SELECT id + {base}, 't' FROM range(6)")
                session.sql(f"UPDATE U SET V = 'u{i}' WHERE ID < 4")
                session.sql(f"DELETE FROM V WHERE ID = {i}")
                session.sql(f"UPDATE T SET V = 'again' WHERE ID >= {base} AND ID < {base + 3}")
                session.sql("UPDATE V SET V = 'none' WHERE ID < 0")  # no row
            if i == 1:  # a heartbeat between transactions, to resume from later
                middle = clock()
                for token, (records, _, _) in readers.items():
                    _until_beat_at(records, got[token], middle)
        end = clock()
        for token, (records, _, _) in readers.items():
            _until_beat_at(records, got[token], end)
    finally:
        for _, stop, _ in readers.values():
            stop.set()
        for _, _, thread in readers.values():
            thread.join(timeout=60)

    by_id: dict[str, list] = {}
    for token, stream_records in got.items():
        last_beat = start - 1
        seen_times: dict[str, int] = {}
        for record in stream_records:
            if "heartbeat_record" in record:
                last_beat = micros(record["heartbeat_record"]["timestamp"])
                continue
            change = record["data_change_record"]
            moment = micros(change["commit_timestamp"])
            assert moment > last_beat, (token, change["commit_timestamp"], last_beat)
            assert moment >= seen_times.get(change["table_name"], 0)
            seen_times[change["table_name"]] = moment
            by_id.setdefault(change["server_transaction_id"], []).append((token, change))
    spans = [len({t for t, _ in members}) for members in by_id.values()]
    assert 2 in spans, spans  # the keys reach both partitions
    assert len(by_id) == 4, {k: [_brief(c) for _, c in v] for k, v in by_id.items()}
    for _transaction_id, members in by_id.items():
        brief = [(_brief(c), t[:6], c["is_last_record_in_transaction_in_partition"])
                 for t, c in members]  # fmt: skip
        assert len({c["commit_timestamp"] for _, c in members}) == 1, brief
        sequences = sorted(int(c["record_sequence"]) for _, c in members)
        assert sequences == list(range(len(members))), brief
        assert {c["number_of_records_in_transaction"] for _, c in members} == {len(members)}
        used = {t for t, _ in members}
        assert {c["number_of_partitions_in_transaction"] for _, c in members} == {len(used)}
        for token in used:
            mine = [c for t, c in members if t == token]
            last = max(mine, key=lambda c: c["record_sequence"])
            assert [c is last for c in mine] == [
                c["is_last_record_in_transaction_in_partition"] for c in mine
            ], brief
        mods: dict[tuple[str, str], list] = {}
        for _, c in members:
            mods.setdefault((c["table_name"], c["mod_type"]), []).extend(c["mods"])
        assert {k: len(v) for k, v in mods.items()} == {
            ("T", "INSERT"): 6, ("U", "UPDATE"): 4, ("V", "DELETE"): 1
        }, brief
        assert sorted(m["new_values"]["V"] for m in mods["T", "INSERT"]) == ["again"] * 3 + [
            "t"
        ] * 3

    # A read resumed from the heartbeat between transactions returns what came after it.
    for token, stream_records in got.items():
        index = next(i for i, r in enumerate(stream_records)
                     if "heartbeat_record" in r
                     and micros(r["heartbeat_record"]["timestamp"]) >= middle)  # fmt: skip
        beat = stream_records[index]["heartbeat_record"]["timestamp"]
        after = changes(stream_records[index + 1 :])
        resumed = changes(read_once(session, "CS", beat, token, end=rfc3339(end)))
        assert resumed == after, token


A_BEFORE_FINISH = transaction_script(
    "INSERT INTO T SELECT id + 100, 'a' FROM range(8)", "UPDATE U SET V = 'a' WHERE ID < 5"
)


def _check_whole(found):
    """Each transaction of ``found`` (records of every partition): one timestamp,
    sequences 0..n-1, counted whole; returns them by id."""
    by_id: dict[str, list] = {}
    for record in found:
        by_id.setdefault(record["server_transaction_id"], []).append(record)
    for members in by_id.values():
        brief = [_brief(c) for c in members]
        assert len({c["commit_timestamp"] for c in members}) == 1, brief
        assert sorted(int(c["record_sequence"]) for c in members) == list(range(len(members)))
        assert {c["number_of_records_in_transaction"] for c in members} == {len(members)}
    return by_id


def test_alter_split_and_rename_around_a_transaction_killed_before_its_finish(session):
    """A transaction of two tables SIGKILLed after both Delta commits, before the catalog
    is told: an ALTER CHANGE STREAM SET FOR completes it first; a split and a rename of
    one of its tables follow, then another transaction of three tables. Every partition
    read from the start returns each transaction once, whole, at one timestamp, under
    the tables' new names."""
    for name in ("T", "U", "V"):
        session.sql(f"CREATE TABLE {name} (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("INSERT INTO U SELECT id, 'u' FROM range(10)")
    session.sql("CREATE CHANGE STREAM CS FOR T, U OPTIONS (partitions = 2)")
    start = rfc3339(clock())
    pending = killed_at(session, "pipeline_before_finish", A_BEFORE_FINISH)
    a_id = pending.plan["app_id"].rsplit(":", 1)[-1]
    session.sql("ALTER CHANGE STREAM CS SET FOR T, U, V")
    assert session.catalog.pending_commits() == []  # completed by the ALTER's wait
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    token = next(p.token for p in session.catalog.list_partitions(stream.uid))
    session.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{token}'")
    session.sql("ALTER TABLE U RENAME TO U2")
    with session.transaction():
        session.sql("DELETE FROM T WHERE ID >= 104")
        session.sql("UPDATE U2 SET V = 'b' WHERE ID >= 5")
        session.sql("INSERT INTO V SELECT id, 'v' FROM range(6)")
    tree = read_tree(session, "CS", start)
    found = [c for records in tree.values() for c in changes(records)]
    by_id = _check_whole(found)
    assert len(by_id) == 2, {k: [_brief(c) for c in v] for k, v in by_id.items()}
    counts = {k: sorted({(c["table_name"], c["mod_type"]): 0 for c in v}) for k, v in by_id.items()}
    b_id = next(k for k in by_id if k != a_id)
    assert counts[a_id] == [("T", "INSERT"), ("U2", "UPDATE")]
    assert counts[b_id] == [("T", "DELETE"), ("U2", "UPDATE"), ("V", "INSERT")]
    for key, expected in ((a_id, {"T": 8, "U2": 5}), (b_id, {"T": 4, "U2": 5, "V": 6})):
        mods: dict[str, int] = {}
        for c in by_id[key]:
            mods[c["table_name"]] = mods.get(c["table_name"], 0) + len(c["mods"])
        assert mods == expected


def test_the_spark_source_returns_each_transaction_of_several_tables_once_and_whole(
    spark, session, tmp_path
):
    """A streaming query of the Spark change stream source over a stream of three tables
    in two partitions, while transactions of the three tables run: every record once,
    each transaction at one timestamp, numbered and counted across its tables."""
    from tests.pipelines.spark_sources.test_change_stream_source import (
        TIMEOUT,
        Collect,
        reader,
        start,
    )

    for name in ("T", "U", "V"):
        session.sql(f"CREATE TABLE {name} (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("INSERT INTO U SELECT id, 'u' FROM range(10)")
    session.sql("CREATE CHANGE STREAM CS FOR T, U, V OPTIONS (partitions = 2)")
    begin = rfc3339(clock())
    into = Collect()
    frame = reader(spark, session.warehouse, startTimestamp=begin)
    query = start(frame, tmp_path / "checkpoint", into)
    try:
        for i in range(3):
            with session.transaction():
                session.sql(f"INSERT INTO T SELECT id + {100 * i}, 't' FROM range(5)")
                session.sql(f"UPDATE U SET V = 'u{i}' WHERE ID < 3")
                session.sql(f"INSERT INTO V VALUES ({i}, 'v')")
        expected = 3 * (5 + 3 + 1)
        deadline = time.monotonic() + TIMEOUT
        while sum(len(json.loads(r["record"])["data_change_record"]["mods"])
                  for _, r in into.data()) < expected:  # fmt: skip
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, into.data()
            time.sleep(0.1)
    finally:
        query.stop()
    rows = [r for _, r in into.data()]
    keys = [(r["partition_token"], r["record"]) for r in rows]
    assert len(keys) == len(set(keys))  # each record once
    found = [json.loads(r["record"])["data_change_record"] for r in rows]
    by_id = _check_whole(found)
    assert len(by_id) == 3
    for members in by_id.values():
        assert sorted({c["table_name"] for c in members}) == ["T", "U", "V"]
        assert sum(len(c["mods"]) for c in members) == 9


def test_a_killed_transaction_with_a_flush_landing_meanwhile_reaches_a_live_reader_whole(
    session, session_factory
):
    """SIGKILLed between its tables, a transaction of T and U holds them; a channel flush
    appends to T meanwhile. A live reader returns neither (its heartbeats stay before
    them) until a new Session recovers the transaction: then the transaction comes
    whole, once, then the flush, later; a read resumed from the heartbeat returned while
    it waited returns the same."""
    stream, partition, start, before = two_tables_watched(session)
    catalog_file = session.warehouse / "catalog.sqlite"
    pending = killed_at(session, "pipeline_between_tables")
    a_id = pending.plan["app_id"].rsplit(":", 1)[-1]
    flush_rows(session, "T", [{"ID": 50, "V": "f"}])
    t = session.require_table("T")
    assert newest_version(t.uri) == 3  # A's T version, then the flush's
    records, stop, thread = reading(catalog_file, stream, partition.token, start, 500)
    got: list = []
    try:
        early: list = []
        _until_beat_at(records, early, start)  # the first heartbeat: A held, nothing of it
        assert changes(early) == [before]  # nothing of A or the flush
        waited = micros(early[-1]["heartbeat_record"]["timestamp"])
        session_factory(session.warehouse)  # recovers A
        assert session.catalog.pending_commits() == []
        _until_beat_at(records, got, clock())
    finally:
        stop.set()
        thread.join(timeout=60)
    found = changes(got)
    assert [(c["table_name"], c["server_transaction_id"]) for c in found] == [
        ("T", a_id), ("U", a_id), ("T", found[2]["server_transaction_id"])
    ], [_brief(c) for c in found]
    assert found[2]["mods"][0]["keys"] == {"ID": 50}
    assert found[0]["commit_timestamp"] == found[1]["commit_timestamp"]
    moment = micros(found[0]["commit_timestamp"])
    assert waited < moment < micros(found[2]["commit_timestamp"])
    assert {c["number_of_records_in_transaction"] for c in found[:2]} == {2}
    beats = [micros(r["heartbeat_record"]["timestamp"]) for r in got if "heartbeat_record" in r]
    first_data = next(i for i, r in enumerate(got) if "data_change_record" in r)
    assert all(b < moment for b in beats[:first_data])
    resumed = changes(read_once(session, "CS", rfc3339(waited), partition.token,
                                end=rfc3339(beats[-1])))  # fmt: skip
    assert resumed == found
