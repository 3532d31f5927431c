"""``format("ingest-change-stream")``: a change stream's records through Spark.

A streaming query reads every change once across a split and a merge made while it runs
and across a restart from its checkpoint, children only after their parents; a batch
that Spark runs again from its checkpoint returns the same rows; a batch read returns
what the stream did; bad options are refused at the door with our messages.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from catalog import PartitionRecord
from pipelines import source_errors
from pipelines.change_streams.partitions import open_partitions
from pipelines.change_streams.records import rfc3339
from pipelines.errors import InvalidOptionError, ObjectNotFoundError, StreamStaleError

FORMAT = "ingest-change-stream"
#: A streaming query or a wait for its rows that takes longer than this has hung.
TIMEOUT = 120


class Collect:
    """A ``foreachBatch`` function keeping each batch's rows (as dicts) by batch id,
    across the runs of one checkpoint."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[dict]]] = []

    def __call__(self, frame, batch_id: int) -> None:
        self.calls.append((batch_id, [row.asDict() for row in frame.collect()]))

    def batches(self) -> dict[int, list[dict]]:
        """Rows by batch id; a batch delivered again (Spark runs a batch again when a
        query stopped before committing it) must hold the same rows."""
        found: dict[int, list[dict]] = {}
        for batch_id, rows in self.calls:
            if batch_id in found:
                assert _key(found[batch_id]) == _key(rows), f"batch {batch_id} changed on replay"
            found[batch_id] = rows
        return found

    def data(self) -> list[tuple[int, dict]]:
        """``(batch id, row)`` of every data change row, each batch once."""
        return [
            (batch_id, row)
            for batch_id, rows in sorted(self.batches().items())
            for row in rows
            if row["record_type"] == "data_change"
        ]


def _key(rows: list[dict]) -> list[tuple]:
    return sorted((r["partition_token"] or "", r["record_type"], r["record"]) for r in rows)


def mods(rows) -> list[tuple[int, str, str | None, object, str]]:
    """``(ID, mod_type, V, commit_timestamp, record_sequence)`` of every mod of data change
    rows, in commit timestamp order."""
    out = []
    for row in rows:
        record = json.loads(row["record"])["data_change_record"]
        assert record["mod_type"] == row["mod_type"]
        assert record["table_name"] == row["table_name"] == "T"
        for mod in record["mods"]:
            value = mod["new_values"].get("V")
            out.append(
                (mod["keys"]["ID"], row["mod_type"], value, row["commit_timestamp"],
                 row["record_sequence"])
            )  # fmt: skip
    return sorted(out, key=lambda m: (m[3], m[4], m[0]))


def by_key(found) -> dict[int, list[tuple[str, str | None]]]:
    keyed: dict[int, list[tuple[str, str | None]]] = defaultdict(list)
    for key, kind, value, _, _ in found:
        keyed[key].append((kind, value))
    return dict(keyed)


def reader(spark, warehouse: Path, name: str = "CS", **options):
    reading = spark.readStream.format(FORMAT).option("warehouse", str(warehouse))
    return reading.option("name", name).options(**{k: str(v) for k, v in options.items()}).load()


def start(frame, checkpoint: Path, into: Collect, **trigger):
    writer = frame.writeStream.foreachBatch(into).option("checkpointLocation", str(checkpoint))
    with source_errors():
        return writer.trigger(**(trigger or {"processingTime": "100 milliseconds"})).start()


def run_available_now(frame, checkpoint: Path, into: Collect) -> None:
    query = start(frame, checkpoint, into, availableNow=True)
    try:
        with source_errors():
            finished = query.awaitTermination(TIMEOUT)
    finally:
        query.stop()
    assert finished, f"the query did not finish within {TIMEOUT} s"


def wait_for(into: Collect, count: int, query) -> None:
    """Until ``into`` holds ``count`` mods (the query must keep running meanwhile)."""
    deadline = time.monotonic() + TIMEOUT
    while len(mods(r for _, r in into.data())) < count:
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, f"only {len(mods(r for _, r in into.data()))} mods"
        time.sleep(0.1)


def created(session, name: str = "CS") -> str:
    return rfc3339(session.catalog.get_change_stream("DB", "PUBLIC", name).created_us)


def lineage(session, name: str = "CS") -> dict[str, PartitionRecord]:
    stream = session.catalog.get_change_stream("DB", "PUBLIC", name)
    return {p.token: p for p in session.catalog.list_partitions(stream.uid)}


def open_tokens(session, name: str = "CS") -> list[str]:
    stream = session.catalog.get_change_stream("DB", "PUBLIC", name)
    return [p.token for p in open_partitions(session.catalog, stream)]


@pytest.fixture
def table(session):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    return session


def test_each_change_once_across_split_merge_and_restart(spark, table, tmp_path):
    session, checkpoint, into = table, tmp_path / "ck", Collect()
    options = {"startTimestamp": created(session)}
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'a'), (3, 'a'), (4, 'a'), (5, 'a'), (6, 'a')")
    query = start(reader(spark, session.warehouse, **options), checkpoint, into)
    try:
        session.sql("UPDATE T SET V = 'b' WHERE ID IN (1, 2)")
        (root,) = open_tokens(session)
        session.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{root}'")
        session.sql("UPDATE T SET V = 'c' WHERE ID >= 3")
        session.sql("INSERT INTO T VALUES (7, 'a'), (8, 'a')")
        wait_for(into, 14, query)
    finally:
        query.stop()
    # Stopped: changes land meanwhile; a new query on the checkpoint goes on.
    session.sql("DELETE FROM T WHERE ID = 1")
    session.sql("UPDATE T SET V = 'd' WHERE ID = 7")
    query = start(reader(spark, session.warehouse, **options), checkpoint, into)
    try:
        left, right = open_tokens(session)
        session.sql(f"ALTER CHANGE STREAM CS MERGE PARTITIONS '{left}', '{right}'")
        session.sql("DELETE FROM T WHERE ID = 2")
        session.sql("INSERT INTO T VALUES (9, 'a')")
        session.sql("UPDATE T SET V = 'e' WHERE ID = 9")
        wait_for(into, 19, query)
    finally:
        query.stop()
    run_available_now(reader(spark, session.warehouse, **options), checkpoint, into)

    found = mods(r for _, r in into.data())
    assert len(found) == 19, found
    assert by_key(found) == {
        1: [("INSERT", "a"), ("UPDATE", "b"), ("DELETE", None)],
        2: [("INSERT", "a"), ("UPDATE", "b"), ("DELETE", None)],
        **{k: [("INSERT", "a"), ("UPDATE", "c")] for k in (3, 4, 5, 6)},
        7: [("INSERT", "a"), ("UPDATE", "d")],
        8: [("INSERT", "a")],
        9: [("INSERT", "a"), ("UPDATE", "e")],
    }
    # Every partition of the lineage was read, each child only in a batch after the
    # one that returned the last records (and the child partitions record) of its parents.
    tree = lineage(session)
    assert len(tree) == 4  # the root, its two children, their merge
    batches = into.batches()
    rows = [(b, r) for b, found_rows in batches.items() for r in found_rows]
    ends = defaultdict(list)
    for batch_id, row in rows:
        if row["record_type"] == "child_partitions" and row["partition_token"] is not None:
            ends[row["partition_token"]].append(batch_id)
    assert sorted(ends) == sorted(t for t, p in tree.items() if p.end_us is not None)
    assert all(len(found) == 1 for found in ends.values()), ends  # one end per parent
    announced = [r for _, r in rows if r["record_type"] == "child_partitions"
                 and r["partition_token"] is None]  # fmt: skip
    assert [json.loads(r["record"])["child_partitions_record"]["child_partitions"][0]["token"]
            for r in announced] == [root]  # fmt: skip
    for batch_id, row in rows:
        token = row["partition_token"]
        for parent in tree[token].parents if token else ():
            assert batch_id > ends[parent][0], (token, parent, batch_id, ends)
    # A batch read of the same range returns the same data change records.
    everything = (
        spark.read.format(FORMAT).option("warehouse", str(session.warehouse))
        .option("name", "CS").option("startTimestamp", created(session)).load()
    )  # fmt: skip
    batch = [r.asDict() for r in everything.collect()]
    assert mods(r for r in batch if r["record_type"] == "data_change") == found
    assert sorted(r["record"] for r in batch if r["record_type"] == "data_change") == sorted(
        r["record"] for _, r in into.data()
    )


def test_a_batch_run_again_from_the_checkpoint_returns_the_same_rows(spark, table, tmp_path):
    """Spark logs a batch's end offset before running it; a batch it runs again (the
    query stopped before committing it) reads to the same bound, whatever changed since
    (a split, an ALTER of what the stream reports: it takes effect after that bound), and
    the changes since come in the next batches, once."""
    session, checkpoint, into = table, tmp_path / "ck", Collect()
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'a'), (3, 'a')")
    frame = reader(spark, session.warehouse, startTimestamp=created(session))
    run_available_now(frame, checkpoint, into)
    first = into.batches()
    last = max(first)
    for name in (str(last), f".{last}.crc"):  # as if it stopped before committing it
        (checkpoint / "commits" / name).unlink()
    (root,) = open_tokens(session)
    session.sql("UPDATE T SET V = 'b' WHERE ID = 1")
    session.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{root}'")
    session.sql("ALTER CHANGE STREAM CS SET OPTIONS (exclude_insert = TRUE)")
    session.sql("INSERT INTO T VALUES (4, 'd')")  # excluded: no record
    session.sql("UPDATE T SET V = 'c' WHERE ID IN (2, 3)")
    run_available_now(frame, checkpoint, into)
    assert [b for b, _ in into.calls].count(last) == 2
    again = into.batches()  # asserts the replay's rows are the first run's
    assert _key(again[last]) == _key(first[last])
    assert by_key(mods(r for _, r in into.data())) == {
        1: [("INSERT", "a"), ("UPDATE", "b")],
        2: [("INSERT", "a"), ("UPDATE", "c")],
        3: [("INSERT", "a"), ("UPDATE", "c")],
    }


def test_without_start_reads_from_now_with_heartbeats(spark, table, tmp_path):
    session, into = table, Collect()
    session.sql("INSERT INTO T VALUES (1, 'before')")
    frame = reader(spark, session.warehouse, heartbeatMilliseconds=1000)
    query = start(frame, tmp_path / "ck", into)
    try:
        deadline = time.monotonic() + TIMEOUT
        while not into.calls:  # the first batch: the partitions it starts with
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.1)
        session.sql("INSERT INTO T VALUES (2, 'after')")
        wait_for(into, 1, query)
        (root,) = open_tokens(session)
        while not any(r["record_type"] == "heartbeat" for b in into.batches().values()
                      for r in b):  # fmt: skip
            assert query.isActive and time.monotonic() < deadline, query.exception()
            time.sleep(0.1)
    finally:
        query.stop()
    assert [(m[0], m[1], m[2]) for m in mods(r for _, r in into.data())] == [(2, "INSERT", "after")]
    first = into.batches()[0]
    assert [(r["record_type"], r["partition_token"]) for r in first] == [("child_partitions", None)]
    beats = [r for b in into.batches().values() for r in b if r["record_type"] == "heartbeat"]
    assert {r["partition_token"] for r in beats} == {root}
    for beat in beats:
        moment = json.loads(beat["record"])["heartbeat_record"]["timestamp"]
        assert rfc3339(int(beat["commit_timestamp"].timestamp() * 1e6)) == moment


def test_a_restart_after_the_retention_goes_on_a_new_query_is_refused(spark, table, tmp_path):
    session, into = table, Collect()
    options = {"startTimestamp": created(session)}
    session.sql("INSERT INTO T VALUES (1, 'a')")
    run_available_now(reader(spark, session.warehouse, **options), tmp_path / "ck", into)
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    session.catalog.alter_change_stream(stream.id, retention_s=1)  # below SQL's minute
    time.sleep(1.1)
    session.sql("INSERT INTO T VALUES (2, 'a')")
    run_available_now(reader(spark, session.warehouse, **options), tmp_path / "ck", into)
    assert [m[0] for m in mods(r for _, r in into.data())] == [1, 2]
    with pytest.raises(StreamStaleError, match=f"^{FORMAT}: startTimestamp .* retention period"):
        run_available_now(reader(spark, session.warehouse, **options), tmp_path / "new", into)


@pytest.fixture(scope="module")
def warehouse(spark, tmp_path_factory):
    from pipelines import Session

    session = Session(tmp_path_factory.mktemp("refusals") / "warehouse", spark=spark)
    try:
        session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
        session.sql("CREATE CHANGE STREAM CS FOR T")
        yield session.warehouse, created(session)
    finally:
        session.close()


def _options(warehouse, overrides) -> dict[str, str]:
    folder, start_at = warehouse
    options = {"warehouse": str(folder), "name": "CS", "startTimestamp": start_at} | overrides
    return {k: v for k, v in options.items() if v is not None}


#: ``(id, read, option overrides, error, message)``: read "load" is refused by both kinds
#: of read when Spark loads the source, "stream" and "batch" when that kind starts.
CASES = [
    ("misspelt", "load", {"startTimestmp": "x"}, InvalidOptionError,
     "unknown option(s) starttimestmp; the options are catalog, endTimestamp, heartbeatMilliseconds"),
    ("no name", "load", {"name": None}, InvalidOptionError, "the option name is required"),
    ("bad name", "load", {"name": "DB..CS"}, InvalidOptionError,
     "invalid change stream name 'DB..CS'"),
    ("no stream", "load", {"name": "S.NOPE"}, ObjectNotFoundError,
     "change stream DB.S.NOPE does not exist"),
    ("not a warehouse", "load", {"warehouse": "/nonexistent/wh"}, InvalidOptionError,
     "/nonexistent/wh is not a warehouse"),
    ("bad start", "load", {"startTimestamp": "yesterday"}, InvalidOptionError,
     "cannot read the option startTimestamp='yesterday' as a timestamp"),
    ("future start", "load", {"startTimestamp": "2999-01-01T00:00:00Z"}, InvalidOptionError,
     "startTimestamp 2999-01-01T00:00:00.000000Z is in the future"),
    ("before creation", "load", {"startTimestamp": "2001-01-01 00:00:00"}, InvalidOptionError,
     "startTimestamp 2001-01-01T00:00:00.000000Z is before DB.PUBLIC.CS was created"),
    ("beat low", "load", {"heartbeatMilliseconds": "999"}, InvalidOptionError,
     "heartbeatMilliseconds must be from 1,000 to 300,000, got 999"),
    ("beat high", "load", {"heartbeatMilliseconds": "300001"}, InvalidOptionError,
     "heartbeatMilliseconds must be from 1,000 to 300,000, got 300001"),
    ("beat text", "load", {"heartbeatMilliseconds": "1s"}, InvalidOptionError,
     "heartbeatMilliseconds must be a whole number of at least 0, got '1s'"),
    ("future end", "load", {"endTimestamp": "2999-01-01"}, InvalidOptionError,
     "endTimestamp 2999-01-01T00:00:00.000000Z is in the future"),
    ("end before start", "load", {"endTimestamp": "2001-01-01"}, InvalidOptionError,
     "endTimestamp 2001-01-01T00:00:00.000000Z is before startTimestamp"),
    ("end in a stream", "stream", {"endTimestamp": "now"}, InvalidOptionError,
     "endTimestamp is for batch reads"),
    ("batch without start", "batch", {"startTimestamp": None}, InvalidOptionError,
     "a batch read needs startTimestamp"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "overrides", "error", "message"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_bad_options_are_refused_with_our_message(warehouse, kind, overrides, error, message):
    """The checks, called as Spark's worker calls them (each Spark load starts a Python
    worker, seconds each: two cases go through Spark below)."""
    from pipelines.spark_sources.change_stream_source import ChangeStreamDataSource

    if overrides.get("endTimestamp") == "now":
        overrides = overrides | {"endTimestamp": warehouse[1]}
    source = ChangeStreamDataSource(_options(warehouse, overrides))
    with pytest.raises(error) as caught:
        source.schema()  # what load() runs
        if kind == "stream":
            source.streamReader(None)
        else:
            source.reader(None)
    assert str(caught.value).startswith(f"{FORMAT}: "), caught.value
    assert message in str(caught.value)


def test_spark_refuses_bad_options_with_our_errors(spark, warehouse, tmp_path):
    """At load() (a stream's heartbeat out of range) and at start (a batch-only option in a
    stream), the error Spark raises is ours inside ``source_errors``."""
    bad_beat = _options(warehouse, {"heartbeatMilliseconds": "999"})
    refused = pytest.raises(InvalidOptionError, match="heartbeatMilliseconds must be from 1,000")
    with refused, source_errors():
        spark.readStream.format(FORMAT).options(**bad_beat).load()
    with_end = _options(warehouse, {"endTimestamp": warehouse[1]})
    frame = spark.readStream.format(FORMAT).options(**with_end).load()  # valid for a batch
    into = Collect()
    with pytest.raises(InvalidOptionError, match=f"^{FORMAT}: endTimestamp is for batch reads"):
        run_available_now(frame, tmp_path / "ck", into)
    assert into.calls == []
    no_stream = _options(warehouse, {"name": "NOPE"})
    missing = pytest.raises(ObjectNotFoundError, match=r"change stream DB\.PUBLIC\.NOPE does not")
    with missing, source_errors():
        spark.read.format(FORMAT).options(**no_stream).load()
