"""The ``ingest`` Spark data source: append a DataFrame or a stream to one of our tables.

    query = (frame.writeStream.format("ingest").option("warehouse", W)
             .option("table", "DB.PUBLIC.EVENTS").option("checkpointLocation", C).start())
    frame.write.format("ingest").option("warehouse", W).option("table", "T")
        .mode("append").save()

Rows are checked by the ingest conversion rules (columns matched by name as
identifiers, missing nullable columns NULL) and get row ids from the table's
sequence, as ingested rows do. A streaming query commits each micro-batch exactly
once (:mod:`flush.batch_commit`): the batch id is the version of the app transaction
``txnAppId``, by default the query's Spark id (from its checkpoint), so a batch
replayed after a crash leaves neither a duplicate row nor an orphan file. The sink only
appends: overwrite and complete output modes are refused, as are options the sink does
not know and a dynamic table (only its refreshes write it), before any task runs
(raised in Spark's Python worker, so Spark reports them inside its own error:
:func:`pipelines.source_errors` gives ours back).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from catalog import TableInfo, open_catalog
from flush.batch_commit import commit_batch, discard_staged, stage_batch_file
from flush.parquet_files import WrittenFile
from flush.tables import ROW_ID_COLUMN, delta_schema
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.errors import IngestError
from pipelines.errors import InvalidOptionError
from pipelines.spark_sources.source_options import SourceOptions

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["TableSinkDataSource"]

NAME = "ingest"
_OPTIONS = ("warehouse", "catalog", "table", "txnAppId", "checkpointLocation")
#: Rows per staged file: a task's rows are held in memory up to this many.
ROWS_PER_FILE = 500_000


@dataclass
class StagedFiles(WriterCommitMessage):
    """What one task staged, sent to the driver's commit."""

    files: list[WrittenFile] = field(default_factory=list)


@dataclass(frozen=True)
class _Target:
    """Everything a task needs (pickled to it): the catalog, the table and the writer.

    ``writer_id`` names the writer's folder and, for a stream (``once``), its app
    transaction; a batch write gets a random one.
    """

    catalog_location: str
    info: TableInfo
    writer_id: str
    once: bool

    def stage(self, batches: Iterator[pa.RecordBatch]) -> StagedFiles:
        staged = StagedFiles()
        pending: list[pa.RecordBatch] = []
        try:
            for batch in batches:
                pending.append(batch)
                if sum(b.num_rows for b in pending) >= ROWS_PER_FILE:
                    staged.files.append(self._stage(pending))
                    pending = []
            if any(b.num_rows for b in pending):
                staged.files.append(self._stage(pending))
        except BaseException:  # a bad row: this task's files must not stay behind
            discard_staged(self.info.uri, self.writer_id, staged.files)
            raise
        return staged

    def _stage(self, batches: list[pa.RecordBatch]) -> WrittenFile:
        checked = check_arrow_batch(self.info.schema, pa.Table.from_batches(batches))
        catalog = open_catalog(self.catalog_location)
        try:
            first = catalog.reserve_row_ids(self.info.id, checked.num_rows)
        finally:
            catalog.close()
        target = delta_schema(self.info.schema)
        ids = pa.array(range(first, first + checked.num_rows), pa.int64())
        rows = checked.append_column(target.field(ROW_ID_COLUMN), ids).cast(target)
        return stage_batch_file(self.info.uri, self.writer_id, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        files = [f for m in messages if isinstance(m, StagedFiles) for f in m.files]
        commit_batch(self.info.uri, self.writer_id, batch_id, files, once=self.once)

    def abort(self) -> None:
        """Every staged file of the writer goes, reported or not (one batch at a time)."""
        discard_staged(self.info.uri, self.writer_id)


class TableStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream``: each micro-batch once (see the module docstring)."""

    def __init__(self, target: _Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles:
        return self.target.stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.target.commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.target.abort()


class TableBatchWriter(DataSourceArrowWriter):
    """``write``: one append commit of the whole DataFrame."""

    def __init__(self, target: _Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles:
        return self.target.stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.target.commit(messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.target.abort()


def _check_columns(info: TableInfo, schema: StructType) -> None:
    """Refuse, before any task runs, input columns the table cannot take."""
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        check_arrow_batch(info.schema, to_arrow_schema(schema).empty_table())
    except IngestError as exc:
        raise InvalidOptionError(f"{NAME}: the rows do not fit {info.full_name}: {exc}") from None
    except (TypeError, ValueError) as exc:  # a Spark type with no Arrow equivalent
        raise InvalidOptionError(f"{NAME}: cannot write these columns: {exc}") from None
    missing = [c.name for c in info.schema.columns if not c.nullable and
               not any(info.schema.find(f.name) is c for f in schema.fields)]  # fmt: skip
    if missing:
        raise InvalidOptionError(
            f"{NAME}: the NOT NULL column(s) {', '.join(missing)} of {info.full_name} are "
            "missing from the rows; select them"
        )


def _query_id(options: SourceOptions) -> str:
    """The app transaction id of a streaming query: its Spark query id, which the
    checkpoint's ``metadata`` file holds (as Delta's sink does). A new query, even on a
    path an old checkpoint used, has a new id, so none of its batches is skipped."""
    checkpoint = options.get("checkpointLocation")
    if not checkpoint:
        raise InvalidOptionError(
            f"{NAME}: a streaming write needs the option checkpointLocation (or txnAppId, "
            "one per query) so each micro-batch is committed once"
        )
    path = Path(checkpoint.removeprefix("file:"))
    try:
        query_id = orjson.loads((path / "metadata").read_bytes())["id"]
    except (OSError, ValueError, KeyError, TypeError):
        raise InvalidOptionError(
            f"{NAME}: cannot read the query id from {str(path)[:200]}/metadata (a checkpoint "
            "on another file system?); set the option txnAppId, one per query"
        ) from None
    return f"query:{str(query_id)[:64]}"


class TableSinkDataSource(DataSource):
    """``format("ingest")``: append rows to a table (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _target(self, schema: StructType, overwrite: bool, streaming: bool) -> _Target:
        options = SourceOptions(self.options, NAME, _OPTIONS)
        if overwrite:
            raise InvalidOptionError(
                f"{NAME}: the sink only appends rows; use mode('append') or "
                "outputMode('append') (to empty a table, run DELETE FROM in a session)"
            )
        options.warehouse()
        location = options.catalog_location()
        catalog = open_catalog(location)
        try:
            info = options.table(catalog)
            dynamic = catalog.get_dynamic_table(info.id) is not None
        finally:
            catalog.close()
        if dynamic:  # its id is dynamic for good: the check holds until the commit
            raise InvalidOptionError(
                f"{NAME}: {info.full_name} is a dynamic table: only its refreshes write it, "
                "so the sink cannot append to it, and nothing was written. Write the rows into "
                "the tables its query reads and refresh it (ALTER DYNAMIC TABLE "
                f"{info.full_name} REFRESH), or name a table that is not dynamic in the option "
                "table"
            )
        _check_columns(info, schema)
        if not streaming:
            return _Target(location, info, f"write:{uuid.uuid4()}", once=False)
        given = options.get("txnAppId")
        if given is not None and given.strip():
            return _Target(location, info, given.strip()[:200], once=True)
        return _Target(location, info, _query_id(options), once=True)

    def writer(self, schema: StructType, overwrite: bool) -> TableBatchWriter:
        return TableBatchWriter(self._target(schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> TableStreamWriter:
        return TableStreamWriter(self._target(schema, overwrite, streaming=True))
