"""The Spark data sources of the pipeline layer, driven through Spark itself.

``format("ingest-changes")`` (a table's change rows by version, batch and streaming)
and ``format("ingest")`` (append rows, batch and streaming, each micro-batch once):
exact change rows, types, offsets across restarts, replays of a landed batch, and
hostile options and rows that must be refused with a message naming the cause while
nothing in the warehouse changes.

Most read-only cases share one module warehouse (``history``) whose table ``T`` has a
known history; tests that write get warehouses of their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    StringType,
    TimestampNTZType,
    TimestampType,
)

from flush import read_table
from pipelines import Session, SqlError
from pipelines.spark_sources.change_source import ChangesDataSource
from pipelines.spark_sources.table_sink import ROWS_PER_FILE
from tests.pipelines.conftest import rows as rows_of

CHANGES, SINK = "ingest-changes", "ingest"
ROW_ID = "_INGEST_ROW_ID"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: A streaming query that has not finished after this long has hung.
STREAM_TIMEOUT = 180


# Helpers
def files(root: Path) -> dict[str, int | None]:
    """Every file under ``root`` (relative path -> size; None for the SQLite catalog's
    files, whose size moves with reads of the sequence and WAL checkpoints)."""
    found: dict[str, int | None] = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            found[str(path.relative_to(root))] = (
                None if name.startswith("catalog.sqlite") else path.stat().st_size
            )
    return found


def table_rows(uri: str) -> list[tuple]:
    """The rows of a Delta table's newest version (hidden row id included), sorted."""
    table = read_table(DeltaTable(uri))
    return sorted(tuple(row.values()) for row in table.to_pylist())


def utc(moment: datetime) -> datetime:
    """A timestamp Spark collected (naive, in this process's zone) as an aware UTC one."""
    return moment.astimezone(UTC)


def at_millis(millis: int) -> datetime:
    return EPOCH + timedelta(milliseconds=millis)


def commit_millis(uri: str) -> dict[int, int]:
    """Each version's commit timestamp (epoch milliseconds), from the Delta log."""
    return {int(e["version"]): int(e["timestamp"]) for e in DeltaTable(uri).history()}


def change_rows(frame_rows) -> list[tuple]:
    """``(ID, NAME, _change_type, _commit_version, _row_id)`` of change rows, in commit
    order (then row id, then change type)."""
    picked = [
        (r["ID"], r["NAME"], r["_change_type"], r["_commit_version"], r["_row_id"])
        for r in frame_rows
    ]
    return sorted(picked, key=lambda r: (r[3], r[4], r[2]))


def changes(spark, warehouse, table="T", **options):
    """A batch read of ``table``'s change rows (options as given, all as text)."""
    reader = spark.read.format(CHANGES).option("warehouse", str(warehouse)).option("table", table)
    return reader.options(**{k: str(v) for k, v in options.items()}).load()


def changes_stream(spark, warehouse, table="T", **options):
    reader = spark.readStream.format(CHANGES).option("warehouse", str(warehouse))
    reader = reader.option("table", table)
    return reader.options(**{k: str(v) for k, v in options.items()}).load()


def run_available_now(writer):
    """Start a ``Trigger.AvailableNow`` query, wait for it, always stop it."""
    query = writer.trigger(availableNow=True).start()
    try:
        finished = query.awaitTermination(STREAM_TIMEOUT)
    finally:
        query.stop()
    assert finished, f"the streaming query did not finish within {STREAM_TIMEOUT} s"
    return query


def progress(query) -> list[tuple[int, int]]:
    """``(batchId, numInputRows)`` of every micro-batch the query ran (a restart with
    nothing new reports a progress whose start and end offsets are equal: no batch)."""
    return [
        (p["batchId"], p["numInputRows"])
        for p in query.recentProgress
        if p["sources"][0]["startOffset"] != p["sources"][0]["endOffset"]
    ]


class Collect:
    """A ``foreachBatch`` function keeping each batch's rows by batch id (across runs of
    the same checkpoint, unlike the memory sink)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list]] = []

    def __call__(self, frame, batch_id: int) -> None:
        self.calls.append((batch_id, frame.collect()))

    @property
    def batches(self) -> dict[int, list]:
        ids = [batch_id for batch_id, _ in self.calls]
        assert len(ids) == len(set(ids)), f"a batch was delivered twice: {ids}"
        return dict(self.calls)

    def rows(self) -> list:
        """Every row delivered, in delivery order (a repeated batch shows twice)."""
        return [row for _, rows in self.calls for row in rows]


def collect_stream(frame, checkpoint: Path, into: Collect):
    writer = frame.writeStream.foreachBatch(into).option("checkpointLocation", str(checkpoint))
    return run_available_now(writer)


def fails(action) -> str:
    """Run ``action``; it must fail with a Spark error (or one of ours): its text."""
    with pytest.raises((PySparkException, SqlError)) as caught:
        action()
    return str(caught.value)


def sink_files(uri: str) -> tuple[list[str], list[str]]:
    """``(staged, unreferenced)``: files left in a sink's staging folders, and files of a
    sink's folder that the table's log does not reference (orphans)."""
    root = Path(uri)
    staged = sorted(str(p.relative_to(root)) for p in root.glob("_ingest/sink-*/staging/**/*"))
    referenced = {
        str(Path(u.removeprefix("file://")).relative_to(root)) for u in DeltaTable(uri).file_uris()
    }
    kept = sorted(
        str(p.relative_to(root)) for p in root.glob("_ingest/sink-*/*.parquet") if p.is_file()
    )
    return staged, [path for path in kept if path not in referenced]


# The shared, read-only history
class History:
    """Table ``T`` (ID NUMBER(10,0) NOT NULL, NAME VARCHAR) with versions
    0 CREATE, 1 INSERT (1,'a'),(2,'b'),(3,'c'), 2 UPDATE 1 -> 'A', 3 DELETE 2,
    4 INSERT (4,'d'); and ``SINK`` (same columns, one row) as a target that the
    hostile sink tests must leave alone."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.warehouse = session.warehouse
        session.sql("CREATE TABLE T (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
        session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        time.sleep(0.6)
        self.between_1_and_2 = datetime.now(UTC)  # after version 1, before version 2
        time.sleep(0.6)
        session.sql("UPDATE T SET NAME = 'A' WHERE ID = 1")
        session.sql("DELETE FROM T WHERE ID = 2")
        session.sql("INSERT INTO T VALUES (4, 'd')")
        session.sql("CREATE TABLE SINK (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
        session.sql("INSERT INTO SINK VALUES (100, 'kept')")
        self.info = session.catalog.get_table("DB", "PUBLIC", "T")
        self.sink = session.catalog.get_table("DB", "PUBLIC", "SINK")
        self.uri = self.info.uri
        self.millis = commit_millis(self.uri)
        first = read_table(DeltaTable(self.uri, version=1)).to_pylist()
        ids = {row["ID"]: row[ROW_ID] for row in first}
        ids.update({row["ID"]: row[ROW_ID] for row in read_table(DeltaTable(self.uri)).to_pylist()})
        self.row_id = ids
        r = ids
        self.by_version = {
            0: [],
            1: [
                (1, "a", "insert", 1, r[1]),
                (2, "b", "insert", 1, r[2]),
                (3, "c", "insert", 1, r[3]),
            ],
            2: [(1, "a", "update_preimage", 2, r[1]), (1, "A", "update_postimage", 2, r[1])],
            3: [(2, "b", "delete", 3, r[2])],
            4: [(4, "d", "insert", 4, r[4])],
        }

    def expected(self, first: int, last: int) -> list[tuple]:
        out = [row for v in range(first, last + 1) for row in self.by_version[v]]
        return sorted(out, key=lambda r: (r[3], r[4], r[2]))

    def state(self) -> tuple:
        """Everything a failed read or write must leave as it was."""
        return (
            files(self.warehouse),
            DeltaTable(self.uri).version(),
            table_rows(self.uri),
            DeltaTable(self.sink.uri).version(),
            table_rows(self.sink.uri),
        )


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):
    session = Session(tmp_path_factory.mktemp("history") / "warehouse", spark=spark)
    try:
        yield History(session)
    finally:
        session.close()


@pytest.fixture
def unchanged(history):
    """Asserts, after the test, that the shared warehouse is exactly as before it."""
    before = history.state()
    yield history
    after = history.state()
    added = sorted(set(after[0]) - set(before[0]))
    removed = sorted(set(before[0]) - set(after[0]))
    assert (added, removed) == ([], []), "files added/removed under the warehouse"
    assert after == before


# Batch reads
def test_history_row_ids_are_distinct(history):
    assert sorted(history.row_id) == [1, 2, 3, 4]
    assert len(set(history.row_id.values())) == 4
    assert sorted(history.millis) == [0, 1, 2, 3, 4]


def test_batch_read_from_version_zero_is_every_change(spark, history):
    frame = changes(spark, history.warehouse, startingVersion=0)
    assert frame.columns == ["ID", "NAME", "_row_id", "_change_type", "_commit_version",
                             "_commit_timestamp"]  # fmt: skip
    collected = frame.collect()
    assert change_rows(collected) == history.expected(0, 4)
    for row in collected:  # the commit's own timestamp, from the Delta log
        assert utc(row["_commit_timestamp"]) == at_millis(history.millis[row["_commit_version"]])
    update = [r for r in collected if r["_commit_version"] == 2]
    assert {r["_row_id"] for r in update} == {history.row_id[1]}  # pre- and postimage: one row


@pytest.mark.parametrize(
    ("start", "end", "first", "last"),
    [(2, 3, 2, 3), (4, 4, 4, 4), (0, 0, 0, 0), (1, 1, 1, 1), (3, None, 3, 4), (0, 4, 0, 4)],
)
def test_batch_read_version_range_is_inclusive(spark, history, start, end, first, last):
    options = {"startingVersion": start} | ({} if end is None else {"endingVersion": end})
    frame = changes(spark, history.warehouse, **options)
    assert change_rows(frame.collect()) == history.expected(first, last)


def test_batch_read_from_timestamp_starts_at_first_version_at_or_after_it(spark, history):
    moment = history.between_1_and_2
    naive_utc = moment.replace(tzinfo=None).isoformat(sep=" ")
    in_plus_two = moment.astimezone(timezone(timedelta(hours=2))).isoformat()
    for text in (moment.isoformat(), naive_utc, in_plus_two):
        got = change_rows(changes(spark, history.warehouse, startingTimestamp=text).collect())
        assert got == history.expected(2, 4), text
    # Exactly a commit's timestamp starts at that commit; a millisecond later at the next.
    exact = at_millis(history.millis[3])
    got = change_rows(
        changes(spark, history.warehouse, startingTimestamp=exact.isoformat()).collect()
    )
    assert got == history.expected(3, 4)
    later = (exact + timedelta(milliseconds=1)).isoformat()
    got = change_rows(changes(spark, history.warehouse, startingTimestamp=later).collect())
    assert got == history.expected(4, 4)
    # endingTimestamp: the last version committed at or before it (inclusive, as Delta).
    got = changes(spark, history.warehouse, startingVersion=0, endingTimestamp=moment.isoformat())
    assert change_rows(got.collect()) == history.expected(0, 1)
    got = changes(spark, history.warehouse, startingVersion=0, endingTimestamp=exact.isoformat())
    assert change_rows(got.collect()) == history.expected(0, 3)


@pytest.mark.parametrize("case", ["timestamp after the newest commit", "ending before starting"])
def test_batch_read_of_no_versions_is_empty(spark, history, case):
    if case == "timestamp after the newest commit":  # allowed: 'nothing yet', not an error
        future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        frame = changes(spark, history.warehouse, startingTimestamp=future)
    else:  # endingTimestamp before startingVersion: no version in between
        moment = history.between_1_and_2.isoformat()
        frame = changes(spark, history.warehouse, startingVersion=3, endingTimestamp=moment)
    assert frame.collect() == []


# Types
def test_column_types_survive_batch_and_stream_reads(spark, session, tmp_path):
    session.sql(
        "CREATE TABLE TY (ID NUMBER(10,0) NOT NULL, AMT NUMBER(12,2), S VARCHAR(20), "
        "NTZ TIMESTAMP_NTZ, TZ TIMESTAMP_TZ, D DATE, B BOOLEAN, BIN BINARY, F FLOAT)"
    )
    session.sql(
        "INSERT INTO TY VALUES (1, 12345.67, 'héllo ✓', '2024-02-29 13:14:15.123456', "
        "'2024-02-29 13:14:15.5 +02:00', '2024-02-29', TRUE, X'DEADBEEF', 1.5), "
        "(2, -0.01, '', '1970-01-01 00:00:00', '1999-12-31 23:59:59 -08:00', '0001-01-01', "
        "FALSE, X'', -2.25)"
    )
    session.sql("INSERT INTO TY (ID) VALUES (3)")
    # delta-rs's merge writes string and binary views: the update's files hold them.
    session.sql("UPDATE TY SET S = 'x', BIN = X'00FF' WHERE ID = 1")
    one = (1, Decimal("12345.67"), "héllo ✓", datetime(2024, 2, 29, 13, 14, 15, 123456),
           datetime(2024, 2, 29, 11, 14, 15, 500000, tzinfo=UTC), date(2024, 2, 29), True,
           b"\xde\xad\xbe\xef", 1.5)  # fmt: skip
    two = (2, Decimal("-0.01"), "", datetime(1970, 1, 1), datetime(2000, 1, 1, 7, 59, 59, tzinfo=UTC),
           date(1, 1, 1), False, b"", -2.25)  # fmt: skip
    three = (3, None, None, None, None, None, None, None, None)
    updated = (*one[:2], "x", *one[3:7], b"\x00\xff", one[8])
    columns = ["ID", "AMT", "S", "NTZ", "TZ", "D", "B", "BIN", "F"]

    def values(row):
        out = [row[c] for c in columns]
        out[4] = None if out[4] is None else utc(out[4])
        return tuple(out)

    frame = changes(spark, session.warehouse, "TY", startingVersion=1)
    types = {f.name: f.dataType for f in frame.schema.fields}
    assert [types[c] for c in columns[1:]] == [
        DecimalType(12, 2), StringType(), TimestampNTZType(), TimestampType(), DateType(),
        BooleanType(), BinaryType(), DoubleType(),
    ]  # fmt: skip
    got = sorted(
        ((r["_commit_version"], r["_change_type"], values(r)) for r in frame.collect()),
        key=lambda r: (r[0], r[1], r[2][0]),
    )
    assert got == [
        (1, "insert", one), (1, "insert", two), (2, "insert", three),
        (3, "update_postimage", updated), (3, "update_preimage", one),
    ]  # fmt: skip

    # The first batch of a stream reads the data files as they are (views included).
    into = Collect()
    collect_stream(changes_stream(spark, session.warehouse, "TY"), tmp_path / "ck", into)
    snapshot = sorted(((r["_commit_version"], r["_change_type"], values(r)) for r in into.rows()),
                      key=lambda r: r[2][0])  # fmt: skip
    assert snapshot == [(3, "insert", updated), (3, "insert", two), (3, "insert", three)]


# Streaming reads
def test_stream_starts_with_table_as_it_is_then_only_new_changes(spark, session, tmp_path):
    """Without startingVersion the first batch is the table as it is; with
    startingVersion=latest it is empty; from the same checkpoint, later runs deliver only
    later changes, once."""
    session.sql("CREATE TABLE S (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    session.sql("INSERT INTO S VALUES (1, 'a'), (2, 'b')")
    session.sql("UPDATE S SET NAME = 'x' WHERE ID = 1")
    uri = session.catalog.get_table("DB", "PUBLIC", "S").uri
    ids = {row["ID"]: row[ROW_ID] for row in read_table(DeltaTable(uri)).to_pylist()}
    into, checkpoint = Collect(), tmp_path / "ck"
    latest, latest_checkpoint = Collect(), tmp_path / "ck-latest"

    def run_both():
        collect_stream(changes_stream(spark, session.warehouse, "S"), checkpoint, into)
        frame = changes_stream(spark, session.warehouse, "s", startingVersion="LATEST")
        collect_stream(frame, latest_checkpoint, latest)

    run_both()
    assert change_rows(into.rows()) == sorted(
        [(1, "x", "insert", 2, ids[1]), (2, "b", "insert", 2, ids[2])], key=lambda r: r[4]
    )
    millis = commit_millis(uri)
    assert {utc(r["_commit_timestamp"]) for r in into.rows()} == {at_millis(millis[2])}
    assert latest.rows() == []

    session.sql("INSERT INTO S VALUES (3, 'c')")
    session.sql("DELETE FROM S WHERE ID = 2")
    ids.update({row["ID"]: row[ROW_ID] for row in read_table(DeltaTable(uri)).to_pylist()})
    seen = len(into.rows())
    run_both()
    later = [(3, "c", "insert", 3, ids[3]), (2, "b", "delete", 4, ids[2])]
    assert change_rows(into.rows()[seen:]) == later
    assert change_rows(latest.rows()) == later

    seen = len(into.rows())
    query = collect_stream(changes_stream(spark, session.warehouse, "S"), checkpoint, into)
    assert into.rows()[seen:] == []  # nothing new: nothing again
    assert progress(query) == []


def test_max_versions_per_trigger_splits_batches_by_version(spark, history, tmp_path):
    into = Collect()
    frame = changes_stream(spark, history.warehouse, startingVersion=0, maxVersionsPerTrigger=1)
    query = collect_stream(frame, tmp_path / "ck", into)
    assert progress(query) == [(0, 0), (1, 3), (2, 2), (3, 1), (4, 1)]
    for batch, rows in into.batches.items():
        assert {r["_commit_version"] for r in rows} <= {batch}
    assert change_rows(into.rows()) == history.expected(0, 4)

    into = Collect()
    frame = changes_stream(spark, history.warehouse, startingVersion=1, maxVersionsPerTrigger=3)
    query = collect_stream(frame, tmp_path / "ck3", into)
    assert progress(query) == [(0, 6), (1, 1)]
    assert change_rows(into.rows()) == history.expected(1, 4)


# The sink
def ingest_rows(uri: str) -> list[tuple]:
    """``(ID, NAME)`` of a sink target's rows, sorted, and its row ids checked unique."""
    rows = read_table(DeltaTable(uri)).to_pylist()
    ids = [row[ROW_ID] for row in rows]
    assert len(set(ids)) == len(ids), f"duplicate row ids: {sorted(ids)}"
    return sorted((row["ID"], row["NAME"]) for row in rows)


def test_changes_into_sink_end_to_end_each_row_once(spark, session, tmp_path):
    session.sql("CREATE TABLE T (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    session.sql("CREATE TABLE T2 (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    target = session.catalog.get_table("DB", "PUBLIC", "T2").uri
    checkpoint = tmp_path / "ck"

    def run():
        frame = changes_stream(spark, session.warehouse, "T").where("_change_type = 'insert'")
        writer = (
            frame.select("ID", "NAME").writeStream.format(SINK)
            .option("warehouse", str(session.warehouse)).option("table", "DB.PUBLIC.T2")
            .option("checkpointLocation", str(checkpoint))
        )  # fmt: skip
        return run_available_now(writer)

    assert progress(run()) == [(0, 2)]
    assert ingest_rows(target) == [(1, "a"), (2, "b")]
    session.sql("INSERT INTO T VALUES (3, 'c'), (4, 'd')")
    session.sql("UPDATE T SET NAME = 'B' WHERE ID = 2")  # not an insert: filtered out
    session.sql("INSERT INTO T VALUES (5, 'e')")
    assert progress(run()) == [(1, 5)]
    assert ingest_rows(target) == [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]
    app_id = "query:" + json.loads((checkpoint / "metadata").read_text())["id"]
    assert DeltaTable(target).transaction_version(app_id) == 1
    assert DeltaTable(target).version() == 2  # CREATE, then one commit per batch
    assert sink_files(target) == ([], [])
    # The SQL side sees the same rows.
    assert rows_of(session.sql("SELECT ID, NAME FROM T2")) == [
        (1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"),
    ]  # fmt: skip


def test_sink_replay_of_landed_batch_adds_nothing(spark, session, history, tmp_path):
    """Spark replays a batch whose commit it did not record (a crash between the sink's
    commit and the checkpoint's): the sink's app transaction makes it a no-op."""
    session.sql("CREATE TABLE T2 (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    target = session.catalog.get_table("DB", "PUBLIC", "T2").uri
    checkpoint = tmp_path / "ck"

    def run():
        frame = changes_stream(spark, history.warehouse, startingVersion=0, maxVersionsPerTrigger=2)
        writer = (
            frame.select("ID", "NAME").writeStream.format(SINK)
            .option("warehouse", str(session.warehouse)).option("table", "t2")
            .option("txnAppId", " replay-test ").option("checkpointLocation", str(checkpoint))
        )  # fmt: skip
        return run_available_now(writer)

    assert progress(run()) == [(0, 3), (1, 3), (2, 1)]
    expected = sorted((r[0], r[1]) for r in history.expected(0, 4))
    assert ingest_rows(target) == expected
    version = DeltaTable(target).version()
    assert DeltaTable(target).transaction_version("replay-test") == 2
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    assert DeltaTable(target).transaction_version(f"query:{query_id}") is None

    # A restart with nothing new writes nothing.
    assert progress(run()) == []
    assert DeltaTable(target).version() == version
    # Forget that batch 2 was committed: Spark runs it again on restart.
    for name in ("2", ".2.crc"):
        (checkpoint / "commits" / name).unlink()
    assert progress(run()) == [(2, 1)]
    assert ingest_rows(target) == expected
    assert DeltaTable(target).version() == version
    assert DeltaTable(target).transaction_version("replay-test") == 2
    assert sink_files(target) == ([], [])


def test_sink_new_query_on_reused_checkpoint_path_loses_no_rows(spark, session, history, tmp_path):
    session.sql("CREATE TABLE T2 (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    target = session.catalog.get_table("DB", "PUBLIC", "T2").uri
    checkpoint = tmp_path / "ck"

    def run(**options):
        frame = changes_stream(spark, history.warehouse, **options).select("ID", "NAME")
        writer = (
            frame.writeStream.format(SINK).option("warehouse", str(session.warehouse))
            .option("table", "T2").option("checkpointLocation", str(checkpoint))
        )  # fmt: skip
        return run_available_now(writer)

    run()  # the table as it is: 3 rows, batch 0
    snapshot = [(1, "A"), (3, "c"), (4, "d")]
    assert ingest_rows(target) == snapshot
    shutil.rmtree(checkpoint)  # start over: a new query, whose batch 0 is every change
    try:
        run(startingVersion=0)
    except PySparkException as exc:  # refusing the ambiguous app id loudly is fine too
        assert "checkpoint" in str(exc)
        assert ingest_rows(target) == snapshot
        return
    everything = sorted(snapshot + [(r[0], r[1]) for r in history.expected(0, 4)])
    assert ingest_rows(target) == everything


def test_batch_write_appends_with_fresh_row_ids(spark, session):
    session.sql("CREATE TABLE W (ID NUMBER(10,0) NOT NULL, NAME VARCHAR, AMT NUMBER(12,2))")
    session.sql("INSERT INTO W VALUES (1, 'a', 1.50), (2, 'b', NULL)")
    uri = session.catalog.get_table("DB", "PUBLIC", "W").uri
    before = {row["ID"]: row[ROW_ID] for row in read_table(DeltaTable(uri)).to_pylist()}
    version = DeltaTable(uri).version()

    def write(frame):
        (frame.write.format(SINK).option("warehouse", str(session.warehouse))
         .option("table", "public.w").mode("append").save())  # fmt: skip

    # Columns match by identifier rules (lower-case names are the upper-case columns).
    write(spark.createDataFrame(
        [(10, "x", Decimal("3.25")), (11, None, None), (12, "y", Decimal("-0.01"))],
        "id long, name string, amt decimal(12,2)",
    ))  # fmt: skip
    write(spark.createDataFrame([(13,), (14,)], "ID int"))  # missing nullable columns: NULL
    assert DeltaTable(uri).version() == version + 2  # one commit per write
    session.sql("INSERT INTO W VALUES (15, 'z', 9)")  # the sequence is shared with SQL
    rows = read_table(DeltaTable(uri)).to_pylist()
    assert sorted((r["ID"], r["NAME"], r["AMT"]) for r in rows) == [
        (1, "a", Decimal("1.50")), (2, "b", None), (10, "x", Decimal("3.25")), (11, None, None),
        (12, "y", Decimal("-0.01")), (13, None, None), (14, None, None), (15, "z", Decimal("9.00")),
    ]  # fmt: skip
    ids = {row["ID"]: row[ROW_ID] for row in rows}
    assert len(set(ids.values())) == len(ids) == 8
    assert {ids[1], ids[2]} == set(before.values())  # the SQL rows keep theirs
    assert not ({ids[i] for i in range(10, 16)} & set(before.values()))
    # The SQL side reads the sink's files like any other.
    assert rows_of(session.sql("SELECT ID FROM W WHERE NAME IS NULL")) == [(11,), (13,), (14,)]


# Hostile reader options: refused with the cause named, nothing changed
EMPTY_DIR, MISSING_DIR = object(), object()


READ_CASES = [
    # (id, options (None removes one), message part)
    ("no warehouse", {"warehouse": None}, "the option warehouse is required"),
    ("blank warehouse", {"warehouse": "   "}, "the option warehouse is required"),
    ("empty folder", {"warehouse": EMPTY_DIR}, "is not a warehouse (no catalog.sqlite)"),
    ("missing folder", {"warehouse": MISSING_DIR}, "is not a warehouse (no catalog.sqlite)"),
    ("no table", {"table": None}, "the option table is required"),
    ("empty table", {"table": ""}, "the option table is required"),
    ("missing table", {"table": "NOPE"}, "table DB.PUBLIC.NOPE does not exist"),
    ("quoted lower", {"table": '"t"'}, "table DB.PUBLIC.t does not exist"),
    ("other schema", {"table": "OTHER.T"}, "table DB.OTHER.T does not exist"),
    ("double dot", {"table": "a..b"}, "invalid table name 'a..b'"),
    ("injection", {"table": "x; DROP TABLE T"}, "invalid table name 'x; DROP TABLE T'"),
    ("path", {"table": "../../etc"}, "invalid table name '../../etc'"),
    ("four parts", {"table": "A.DB.PUBLIC.T"}, "invalid table name"),
    ("10,000 chars", {"table": "A" * 10_000}, "does not exist"),
    ("misspelt option", {"startingVersoin": "0"}, "unknown option(s) startingversoin"),
    ("negative", {"startingVersion": "-1"}, "startingVersion must be a whole number of at least 0"),
    ("not a number", {"startingVersion": "abc"}, "startingVersion must be a whole number"),
    ("empty version", {"startingVersion": " "}, "startingVersion must be a whole number"),
    ("30 digits", {"startingVersion": "9" * 30}, "startingVersion must be a whole number"),
    ("18 digits", {"startingVersion": "9" * 18}, "is after the newest version (4)"),
    ("one past", {"startingVersion": "5"}, "startingVersion 5 is after the newest version (4)"),
    ("latest in batch", {"startingVersion": "latest"}, "startingVersion must be a whole number"),
    (
        "both starts",
        {"startingTimestamp": "2024-01-01"},
        "set startingVersion or startingTimestamp, not both",
    ),
    (
        "bad timestamp",
        {"startingVersion": None, "startingTimestamp": "yesterday"},
        "cannot read the option startingTimestamp='yesterday'",
    ),
    (
        "bad ending ts",
        {"endingTimestamp": "2024-13-45 25:00"},
        "cannot read the option endingTimestamp",
    ),
    (
        "end before start",
        {"startingVersion": "3", "endingVersion": "1"},
        "endingVersion 1 is before startingVersion 3",
    ),
    ("end past latest", {"endingVersion": "5"}, "endingVersion 5 is after the newest version (4)"),
    ("no start", {"startingVersion": None}, "a batch read needs startingVersion"),
    pytest.param(
        {"startingVersion": "²"},
        "startingVersion must be a whole number",
        id="superscript digit",
    ),
    pytest.param(
        {"endingVersion": "1", "endingTimestamp": "2100-01-01"},
        "not both",
        id="both ends",
    ),
]


def _case_options(history, tmp_path, overrides):
    options = {"warehouse": str(history.warehouse), "table": "T", "startingVersion": "0"}
    for key, value in overrides.items():
        if value is None:
            options.pop(key, None)
        elif value is EMPTY_DIR:
            (tmp_path / "empty").mkdir()
            options[key] = str(tmp_path / "empty")
        elif value is MISSING_DIR:
            options[key] = str(tmp_path / "missing" / "deeper")
        else:
            options[key] = value
    return options


@pytest.mark.parametrize(
    ("overrides", "message"),
    [c if hasattr(c, "marks") else pytest.param(*c[1:], id=c[0]) for c in READ_CASES],
)
def test_hostile_batch_read_options_are_refused(spark, unchanged, tmp_path, overrides, message):
    options = _case_options(unchanged, tmp_path, overrides)
    outside = files(tmp_path)

    def read():
        spark.read.format(CHANGES).options(**options).load().collect()

    text = fails(read)
    assert message in text
    # One of our errors, not another kind of failure.
    assert re.search(r"(InvalidOptionError|ObjectNotFoundError): ingest-changes: ", text)
    assert files(tmp_path) == outside  # no catalog created in a folder that is not a warehouse
    assert not (tmp_path / "missing").exists()


def test_warehouse_with_a_foreign_catalog_file_is_refused_unchanged(spark, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "catalog.sqlite").write_bytes(b"not a database at all\n" * 20)
    before = files(tmp_path), (fake / "catalog.sqlite").read_bytes()
    text = fails(lambda: changes(spark, fake, startingVersion=0).collect())
    assert "not a" in text and "database" in text
    assert (files(tmp_path), (fake / "catalog.sqlite").read_bytes()) == before


def test_warehouse_with_an_empty_catalog_file_is_left_empty(spark, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "catalog.sqlite").touch()
    text = fails(lambda: changes(spark, fake, startingVersion=0).collect())
    assert "catalog" in text or "does not exist" in text
    assert files(tmp_path) == {"fake/catalog.sqlite": None}
    assert (fake / "catalog.sqlite").stat().st_size == 0


STREAM_CASES = [
    ("ending version", {"endingVersion": "3"}, "endingVersion/endingTimestamp are for batch reads"),
    (
        "zero per trigger",
        {"maxVersionsPerTrigger": "0"},
        "maxVersionsPerTrigger must be a whole number of at least 1",
    ),
    ("past latest", {"startingVersion": "5"}, "startingVersion 5 is after the newest version (4)"),
    ("latest and ts", {"startingVersion": "latest", "startingTimestamp": "2024-01-01"}, "not both"),
    ("misspelt", {"maxVersionPerTrigger": "1"}, "unknown option(s) maxversionpertrigger"),
    ("missing table", {"table": "NOPE"}, "table DB.PUBLIC.NOPE does not exist"),
]


@pytest.mark.parametrize(
    ("overrides", "message"), [pytest.param(*c[1:], id=c[0]) for c in STREAM_CASES]
)
def test_hostile_stream_read_options_are_refused(spark, unchanged, tmp_path, overrides, message):
    options = {"warehouse": str(unchanged.warehouse), "table": "T"} | overrides
    into = Collect()

    def read():
        frame = spark.readStream.format(CHANGES).options(**options).load()
        collect_stream(frame, tmp_path / "ck", into)

    assert message in fails(read)
    assert into.batches == {}


# Hostile sink writes: refused with the cause named, nothing changed
def test_sink_refusals_at_the_door(spark, unchanged):
    warehouse = str(unchanged.warehouse)
    good = spark.createDataFrame([(7, "g")], "ID long, NAME string")

    def write(frame, mode="append", path=None, **options):
        writer = frame.write.format(SINK).mode(mode)
        writer = writer.options(**({"warehouse": warehouse, "table": "SINK"} | options))
        return lambda: writer.save(path) if path else writer.save()

    cases = [
        (write(good, table="NOPE"), "table DB.PUBLIC.NOPE does not exist"),
        (write(good, table="x; DROP TABLE SINK"), "invalid table name"),
        (write(spark.createDataFrame([(7, "g", 1)], "ID long, NAME string, EXTRA long")),
         'unknown column "EXTRA"'),
        (write(spark.createDataFrame([("g",)], "NAME string")),
         "the NOT NULL column(s) ID of DB.PUBLIC.SINK are missing"),
        (write(good, mode="overwrite"), "the sink only appends rows"),
        (write(good, warehouse=str(Path(warehouse) / "nowhere")), "is not a warehouse"),
        (write(good, path=warehouse + "/x"), "unknown option(s) path"),
        (write(good, txnAppid="x", checkpointLocaton="y"), "unknown option(s) checkpointlocaton"),
    ]  # fmt: skip
    for action, message in cases:
        assert message in fails(action)
    assert not (Path(warehouse) / "nowhere").exists()
    assert not (Path(warehouse) / "x").exists()


def test_sink_refuses_rows_in_tasks_and_commits_nothing(spark, unchanged):
    warehouse = str(unchanged.warehouse)

    def write(rows, schema):
        # One task (a task that stages nothing before failing; see the orphan test below).
        frame = spark.createDataFrame(rows, schema).coalesce(1)
        writer = frame.write.format(SINK).option("warehouse", warehouse).option("table", "SINK")
        return fails(lambda: writer.mode("append").save())

    text = write([("5", "e"), ("6", "f"), ("x", "h"), ("7", "g")], "ID string, NAME string")
    assert (
        "Row 2, column \"ID\" (NUMBER(10,0)): value error: the text is not a number; got 'x'"
        in text
    )
    text = write([(5, "e"), (None, "n")], "ID long, NAME string")
    assert 'NULL given for NOT NULL column "ID"' in text
    text = write([(1, "ok"), (10**12, "big")], "ID long, NAME string")
    assert "out of range for NUMBER(10,0)" in text


def test_failed_batch_write_leaves_no_staged_file(spark, history):
    before = history.state()
    # One task: its first ROWS_PER_FILE rows are staged as a file, then the last row fails.
    frame = spark.range(0, ROWS_PER_FILE + 1, numPartitions=1).selectExpr(
        f"CASE WHEN id = {ROWS_PER_FILE} THEN NULL ELSE id END AS ID"
    )
    writer = frame.write.format(SINK).option("warehouse", str(history.warehouse))
    text = fails(lambda: writer.option("table", "SINK").mode("append").save())
    assert 'NULL given for NOT NULL column "ID"' in text
    after = history.state()
    try:
        assert sorted(set(after[0]) - set(before[0])) == []
        assert after == before
    finally:  # leave the shared warehouse as the other tests expect it
        for path in set(after[0]) - set(before[0]):
            (history.warehouse / path).unlink()


def test_stream_sink_without_checkpoint_option_is_refused(spark, unchanged, tmp_path):
    """Spark needs a checkpoint; given only through the session setting, the sink sees no
    checkpointLocation option and no txnAppId, so it cannot commit batches once."""
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path / "root"))
    try:
        frame = changes_stream(spark, unchanged.warehouse).select("ID", "NAME")
        writer = (frame.writeStream.format(SINK).option("warehouse", str(unchanged.warehouse))
                  .option("table", "SINK"))  # fmt: skip
        text = fails(lambda: run_available_now(writer))
    finally:
        spark.conf.unset("spark.sql.streaming.checkpointLocation")
    assert "a streaming write needs the option checkpointLocation (or txnAppId" in text


def test_stream_sink_refuses_complete_mode(spark, unchanged, tmp_path):
    counts = changes_stream(spark, unchanged.warehouse).groupBy("ID").count()
    writer = (
        counts.selectExpr("ID", "CAST(count AS STRING) AS NAME").writeStream.format(SINK)
        .outputMode("complete").option("warehouse", str(unchanged.warehouse))
        .option("table", "SINK").option("checkpointLocation", str(tmp_path / "ck"))
    )  # fmt: skip
    assert "the sink only appends rows" in fails(lambda: run_available_now(writer))


def test_stream_sink_task_failure_commits_nothing_and_leaves_no_file(spark, unchanged, tmp_path):
    frame = changes_stream(spark, unchanged.warehouse, startingVersion=0).selectExpr(
        "CASE WHEN ID = 3 THEN 'three' ELSE CAST(ID AS STRING) END AS ID", "NAME"
    )
    writer = (
        frame.writeStream.format(SINK).option("warehouse", str(unchanged.warehouse))
        .option("table", "SINK").option("checkpointLocation", str(tmp_path / "ck"))
    )  # fmt: skip
    text = fails(lambda: run_available_now(writer))
    assert "the text is not a number; got 'three'" in text
    staged, orphans = sink_files(unchanged.sink.uri)
    assert (staged, orphans) == ([], [])


# Fuzzing the table option
FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
_PART = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_$]{0,6}", fullmatch=True),
    st.text(max_size=6).map(lambda s: '"' + s.replace('"', '""') + '"'),
    st.sampled_from(["T", "t", "sink", "PUBLIC", "public", "DB", "db", '"T"', '"SINK"', "..", ""]),
)
NAMES = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=".\"'; -/\\ \t\n$_aTt0", max_size=30),
    st.tuples(
        st.lists(_PART, min_size=1, max_size=4), st.sampled_from([".", " . ", "..", "\n.", ""])
    ).map(lambda pair: pair[1].join(pair[0])),
)


@FUZZ
@given(name=NAMES)
def test_fuzzed_table_names_resolve_or_are_refused(history, name):
    """In process, as Spark's Python worker runs it: the source's schema and batch reader."""
    before = files(history.warehouse)
    options = {"warehouse": str(history.warehouse), "table": name, "startingVersion": "0"}
    source = ChangesDataSource(options)
    try:
        schema = source.schema()
        reader = source.reader(schema)
    except SqlError as exc:
        assert exc.code in ("INVALID_OPTION", "OBJECT_NOT_FOUND"), exc
        assert str(exc).startswith(CHANGES + ": ")
    else:  # it names T or SINK: DB and PUBLIC optional, any case unless quoted
        uris = {partition.uri for partition in reader.partitions()}
        assert uris in ({history.uri}, {history.sink.uri}), uris
        table = "T" if uris == {history.uri} else "SINK"
        assert re.sub(r'[\s"]', "", name).upper() in (
            table,
            f"PUBLIC.{table}",
            f"DB.PUBLIC.{table}",
        )
        assert schema.names == ["ID", "NAME", "_row_id", "_change_type", "_commit_version",
                                "_commit_timestamp"]  # fmt: skip
    assert files(history.warehouse) == before


@settings(max_examples=5, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(name=NAMES)
def test_fuzzed_table_names_through_spark(spark, history, name):
    before = history.state()
    reader = spark.read.format(CHANGES).option("warehouse", str(history.warehouse))
    reader = reader.option("table", name).option("startingVersion", "0")
    try:
        got = reader.load().collect()
    except PySparkException as exc:
        text = str(exc)
        assert "InvalidOptionError: ingest-changes: " in text or (
            "ObjectNotFoundError: ingest-changes: " in text
        ), text[-800:]
    else:
        assert {r["ID"] for r in got} <= {1, 2, 3, 4, 100}
    assert history.state() == before


# Found by review: paths with spaces, change-column names, the first batch gone stale
def test_stream_first_batch_reads_a_warehouse_whose_path_has_a_space(
    spark, session_factory, tmp_path
):
    session = session_factory(tmp_path / "with space" / "warehouse")
    session.sql("CREATE TABLE S (ID NUMBER(10,0) NOT NULL)")
    session.sql("INSERT INTO S VALUES (1), (2)")
    into = Collect()
    collect_stream(changes_stream(spark, session.warehouse, "S"), tmp_path / "ck", into)
    assert sorted((r["ID"], r["_change_type"]) for r in into.rows()) == [
        (1, "insert"),
        (2, "insert"),
    ]
    assert rows_of(session.sql("SELECT ID FROM S")) == [(1,), (2,)]  # the table reads too


def test_a_table_with_a_change_column_name_is_refused(spark, session):
    session.sql('CREATE TABLE C ("_change_type" VARCHAR, ID NUMBER(10,0))')
    text = fails(lambda: changes(spark, session.warehouse, "C", startingVersion=0).collect())
    assert "change rows use for themselves" in text and "_change_type" in text


def test_first_batch_after_log_cleanup_is_stale(session):
    """Spark logged the first batch's end (the table as of version N-1) and the query
    died; log cleanup then removed version N-1: the replay says stale, no raw error."""
    from pipelines.errors import StreamStaleError
    from pipelines.spark_sources.change_source import _plan

    session.sql("CREATE TABLE L (ID NUMBER(10,0))")
    for n in range(3):
        session.sql(f"INSERT INTO L VALUES ({n})")
    info = session.catalog.get_table("DB", "PUBLIC", "L")
    assert _plan(info, -1, 3, snapshot=True)  # version 2 is there: partitions
    log = Path(info.uri) / "_delta_log"
    old = time.time() - 60 * 86_400
    for entry in log.glob("*.json"):
        os.utime(entry, (old, old))
    session.sql("INSERT INTO L VALUES (9)")
    table = DeltaTable(info.uri)
    table.create_checkpoint()
    table.cleanup_metadata()
    assert not (log / f"{2:020d}.json").exists()
    with pytest.raises(StreamStaleError, match="new checkpoint location"):
        _plan(info, -1, 3, snapshot=True)


# Our message first: Spark reports a source's refusal inside its own error
def _refusals(spark, warehouse: Path, tmp_path: Path) -> list:
    """``(id, action, our error class, our message's start)``: one refusal per place Spark
    runs a source's code (instance, read plan, stream reader, batch and stream writers)."""
    good = spark.createDataFrame([(7, "g")], "ID long, NAME string")

    def sink():  # a new writer each time: a DataFrameWriter's options accumulate
        return good.write.format(SINK).option("warehouse", str(warehouse)).option("table", "SINK")

    def stream_into_sink(**options):
        frame = changes_stream(spark, warehouse).select("ID", "NAME")
        writer = frame.writeStream.format(SINK).option("warehouse", str(warehouse))
        writer = writer.options(table="SINK", checkpointLocation=str(tmp_path / "ck"), **options)
        return lambda: run_available_now(writer)

    return [
        ("misspelt read option", lambda: changes(spark, warehouse, startingVersoin=0).collect(),
         "InvalidOptionError", "ingest-changes: unknown option(s) startingversoin; the options "
         "are catalog, endingTimestamp, endingVersion, maxVersionsPerTrigger, startingTimestamp, "
         "startingVersion, table, warehouse"),
        ("batch read without a start", lambda: changes(spark, warehouse).collect(),
         "InvalidOptionError", "ingest-changes: a batch read needs startingVersion"),
        ("missing table", lambda: changes(spark, warehouse, "NOPE", startingVersion=0).collect(),
         "ObjectNotFoundError", "ingest-changes: table DB.PUBLIC.NOPE does not exist; check the "
         "option table"),
        ("stream read with an end",
         lambda: collect_stream(changes_stream(spark, warehouse, endingVersion=1),
                                tmp_path / "ck2", Collect()),
         "InvalidOptionError", "ingest-changes: endingVersion/endingTimestamp are for batch reads"),
        ("misspelt sink option", lambda: sink().option("txnAppld", "x").mode("append").save(),
         "InvalidOptionError", "ingest: unknown option(s) txnappld; the options are "
         "catalog, checkpointLocation, table, txnAppId, warehouse"),
        ("overwrite", lambda: sink().mode("overwrite").save(),
         "InvalidOptionError", "ingest: the sink only appends rows; use mode('append')"),
        ("misspelt stream sink option", stream_into_sink(checkpointLocaton="x"),
         "InvalidOptionError", "ingest: unknown option(s) checkpointlocaton"),
    ]  # fmt: skip


def test_spark_buries_our_message_under_its_error_and_a_traceback(spark, unchanged, tmp_path):
    """Why ``source_errors`` exists: Spark runs the sources in a Python worker and wraps
    what it raises; our message comes after Spark's and after the worker's traceback."""
    for case, action, kind, message in _refusals(spark, unchanged.warehouse, tmp_path):
        with pytest.raises(PySparkException) as caught:
            action()
        text = str(caught.value)
        assert not text.startswith(message), case
        assert f"pipelines.errors.{kind}: {message}" in text, (case, text[:2000])


def test_source_errors_puts_our_message_first(spark, unchanged, tmp_path):
    from pipelines.errors import InvalidOptionError, ObjectNotFoundError
    from pipelines.spark_sources.source_options import source_errors

    kinds = {"InvalidOptionError": InvalidOptionError, "ObjectNotFoundError": ObjectNotFoundError}
    for case, action, kind, message in _refusals(spark, unchanged.warehouse, tmp_path):
        with pytest.raises(SqlError) as caught, source_errors():
            action()
        error = caught.value
        assert type(error) is kinds[kind], case
        assert error.code == kinds[kind].code
        first = str(error).splitlines()[0]
        assert first.startswith(message), (case, first)
        # Nothing of Spark's and no traceback: the message is ours alone.
        assert str(error) == first, (case, str(error))
        assert error.__suppress_context__ and error.__cause__ is None


def test_source_errors_passes_other_errors_unchanged(spark, unchanged):
    from pyspark.errors import AnalysisException

    from pipelines.spark_sources.source_options import source_errors

    with pytest.raises(AnalysisException, match="TABLE_OR_VIEW_NOT_FOUND"), source_errors():
        spark.sql("SELECT * FROM no_such_view_anywhere").collect()
    with pytest.raises(ZeroDivisionError), source_errors():
        _ = 1 / 0
    with source_errors():  # a good read goes through untouched
        got = changes(spark, unchanged.warehouse, startingVersion=4).collect()
    assert [(r["ID"], r["_change_type"]) for r in got] == [(4, "insert")]
