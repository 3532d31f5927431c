"""A transaction: the versions it reads, the writes it stages, the streams it consumes.

Every statement runs in one: an explicit one (BEGIN ... COMMIT) or its own. A table
is pinned at the version current when the transaction first touches it, and a stream
at the offset it had then, so every statement of the transaction sees the same
changes (repeatable read). Writes are staged in memory, keyed by row id, and later
statements see them; nothing reaches Delta before :meth:`Transaction.commit`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from catalog import Catalog, StreamClaim, StreamRecord, TableInfo
from flush.change_commit import ChangeSet
from flush.spark_tables import read_delta
from flush.tables import ROW_ID_COLUMN
from pipelines.change_sets import ChangeMode
from pipelines.errors import StreamConflictError, StreamStaleError, TransactionConflictError
from pipelines.streams.changes import read_changes
from pipelines.transactions.commit import (
    TableWrites,
    commit_consumer,
    recover_pending,
    stream_app_id,
    when_free,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["BaseRead", "StreamRead", "Transaction", "ViewStreamRead"]


@dataclass(frozen=True, slots=True)
class StreamRead:
    """A stream as this transaction reads it: changes of versions ``(offset, to]``."""

    stream: StreamRecord
    table: TableInfo
    offset: int
    to: int


@dataclass(frozen=True, slots=True)
class BaseRead:
    """One base table of a stream on a view as this transaction reads it."""

    table: TableInfo
    offset: int
    to: int


@dataclass(frozen=True, slots=True)
class ViewStreamRead:
    """A stream on a view as this transaction reads it: each base table's changes of
    versions ``(offset, to]``, all pinned together on first use."""

    stream: StreamRecord
    bases: tuple[BaseRead, ...]


def _ids(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return values.cast(pa.int64())


class Transaction:
    """The state of one transaction; see the module docstring."""

    def __init__(self, catalog: Catalog, spark: SparkSession, read_only: bool = False) -> None:
        self.catalog = catalog
        self.spark = spark
        #: A query alone: it may read the last committed versions past a decided commit
        #: that cannot complete (see :func:`pipelines.transactions.commit.when_free`).
        self.read_only = read_only
        self.versions: dict[int, int] = {}
        self.handles: dict[int, DeltaTable] = {}  # each table at its pinned version
        self.writes: dict[int, TableWrites] = {}
        self.reads: dict[int, StreamRead | ViewStreamRead] = {}
        self.consumed: set[int] = set()
        self.statements: list[str] = []  # the DML run, named in the commit's record

    # Reading
    def version(self, info: TableInfo) -> int:
        """The table's version for this transaction (pinned on first use, once no
        decided commit is still rolling forward into the table)."""
        if info.id not in self.versions:
            handle = when_free(self.catalog, lambda: DeltaTable(info.uri), [info.id],
                               decided_only=True, read_only=self.read_only)  # fmt: skip
            self.handles[info.id] = handle
            self.versions[info.id] = handle.version()
        return self.versions[info.id]

    def table_frame(self, info: TableInfo, row_ids: bool = False) -> DataFrame:
        """The table as this transaction sees it: its pinned version plus staged writes."""
        version = self.version(info)
        frame = read_delta(self.spark, info.uri, version, loaded=self.handles.get(info.id))
        writes = self.writes.get(info.id)
        if writes is not None:
            change = writes.change
            gone = pa.concat_arrays([_ids(change.rows.column(ROW_ID_COLUMN)), change.deleted])
            if len(gone):
                ids = self.spark.createDataFrame(pa.table({ROW_ID_COLUMN: gone}))
                frame = frame.join(ids, on=ROW_ID_COLUMN, how="left_anti")
            if change.rows.num_rows:
                frame = frame.unionByName(self.spark.createDataFrame(change.rows))
        if not row_ids:
            frame = frame.drop(ROW_ID_COLUMN)
        return frame

    def stream_read(self, stream: StreamRecord) -> StreamRead:
        """Where the stream stands for this transaction (pinned on first use).

        Raises:
            StreamStaleError: the stream's table was dropped or recreated.
        """
        assert not stream.on_view, "a stream on a view is read by view_stream_read"
        read = self.reads.get(stream.id)
        if read is None:
            stream = self._settled(stream)
            table = self.catalog.get_table_by_id(stream.table_id)
            if table is None:
                raise StreamStaleError(
                    f"stream {stream.full_name} is stale: its table was dropped or replaced; "
                    "recreate the stream with CREATE OR REPLACE STREAM"
                )
            read = StreamRead(stream, table, stream.offset_version, self.version(table))
            if read.to < read.offset:
                raise _consumed_past(stream)
            self.reads[stream.id] = read
        assert isinstance(read, StreamRead)
        return read

    def view_stream_read(self, stream: StreamRecord) -> ViewStreamRead:
        """Where a stream on a view stands for this transaction: every base table pinned
        with its offset on first use (repeatable read, as for a table's stream).

        Raises:
            StreamStaleError: a base table was dropped or recreated.
            StreamConflictError: another transaction consumed it past this one's pins.
        """
        read = self.reads.get(stream.id)
        if read is None:
            stream = self._settled(stream)
            bases = []
            for table_id, offset in stream.base_offsets:
                table = self.catalog.get_table_by_id(table_id)
                if table is None:
                    raise StreamStaleError(
                        f"stream {stream.full_name} is stale: a base table of its view was "
                        "dropped or replaced; recreate the stream with CREATE OR REPLACE STREAM"
                    )
                bases.append(BaseRead(table, offset, self.version(table)))
            if any(base.to < base.offset for base in bases):
                raise _consumed_past(stream)
            read = ViewStreamRead(stream, tuple(bases))
            self.reads[stream.id] = read
        assert isinstance(read, ViewStreamRead)
        return read

    def _settled(self, stream: StreamRecord) -> StreamRecord:
        """The stream once a dead consumer's decided commit has moved its offset."""
        if stream.claimed_by is not None and recover_pending(
            self.catalog, only={stream.claimed_by}
        ):
            return self.catalog.get_stream_by_id(stream.id) or stream
        return stream

    def stream_frame(self, stream: StreamRecord, mode: ChangeMode) -> DataFrame:
        read = self.stream_read(stream)
        handle = self.handles.get(read.table.id)  # at read.to: the version pinned with it
        return read_changes(
            self.spark, handle or read.table.uri, read.table.schema, read.offset, read.to, mode
        )

    # Writing
    def stage(self, info: TableInfo, change: ChangeSet) -> None:
        """Add one statement's change to the table's staged writes (later wins by row id)."""
        base = self.version(info)
        writes = self.writes.get(info.id)
        if writes is None:
            self.writes[info.id] = TableWrites(info, base, change)
            return
        old = writes.change
        replaced = pa.concat_arrays([_ids(change.rows.column(ROW_ID_COLUMN)), change.deleted])
        keep = pc.invert(pc.is_in(old.rows.column(ROW_ID_COLUMN), value_set=replaced))
        rows = pa.concat_tables([old.rows.filter(keep), change.rows])
        new_ids = pa.concat_arrays([old.new_ids, change.new_ids])
        # A row inserted by this transaction and deleted again never existed for others.
        inserted_here = pc.is_in(change.deleted, value_set=new_ids)
        deleted = pa.concat_arrays([old.deleted, change.deleted.filter(pc.invert(inserted_here))])
        new_ids = new_ids.filter(pc.invert(pc.is_in(new_ids, value_set=change.deleted)))
        writes.change = ChangeSet(rows, deleted, new_ids)

    def consume(self, stream: StreamRecord) -> None:
        if stream.on_view:
            self.view_stream_read(stream)
        else:
            self.stream_read(stream)
        self.consumed.add(stream.id)

    def commit(self, statement: str) -> dict[int, int]:
        """Commit the staged writes and consumed streams (see :func:`commit_consumer`)."""
        if not self.writes and not self.consumed:
            return {}
        claims = [_claim(self.reads[stream_id]) for stream_id in sorted(self.consumed)]
        apps = {
            stream_id: stream_app_id(self.reads[stream_id].stream) for stream_id in self.consumed
        }
        return commit_consumer(self.catalog, list(self.writes.values()), claims, statement, apps)


def _claim(read: StreamRead | ViewStreamRead) -> StreamClaim:
    """The claim a consuming commit makes: a table's stream moves to the version read; a
    stream on a view moves every base offset, its consumption count compared and swapped."""
    if isinstance(read, StreamRead):
        return StreamClaim(read.stream.id, read.offset, read.to)
    count = read.stream.offset_version
    return StreamClaim(read.stream.id, count, count + 1,
                       tuple((base.table.id, base.to) for base in read.bases))  # fmt: skip


def _consumed_past(stream: StreamRecord) -> StreamConflictError:
    # Another transaction consumed the stream past this one's snapshot of its table(s):
    # reading it here would deliver those changes again.
    return StreamConflictError(
        f"stream {stream.full_name} was consumed by another transaction after this one "
        "first read its table; this transaction cannot use it. ROLLBACK and run it again"
    )


def autocommit_attempts() -> Retrying:
    """The attempts of an auto-commit statement: one that lost a race on its rows runs
    again, on fresh data, up to four times."""
    return Retrying(
        retry=retry_if_exception_type(TransactionConflictError),
        stop=stop_after_attempt(4),
        wait=wait_random_exponential(multiplier=0.1, max=2),
        reraise=True,
    )
