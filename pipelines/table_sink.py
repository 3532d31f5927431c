"""The ``ingest`` Spark data source: append a DataFrame or a stream to one of our tables.

    query = (frame.writeStream.format("ingest").option("warehouse", W)
             .option("table", "DB.PUBLIC.EVENTS").option("checkpointLocation", C).start())
    frame.write.format("ingest").option("warehouse", W).option("table", "T")
        .mode("append").save()

Rows are checked by the ingest conversion rules (columns matched by name as
identifiers, missing nullable columns NULL) and get row ids from the table's
sequence, as ingested rows do. A streaming query commits each micro-batch exactly
once (:mod:`flush.batch_commit`): the batch id is the version of the app transaction
``txnAppId``, by default derived from the checkpoint location, so a batch replayed
after a crash leaves neither a duplicate row nor an orphan file. The sink only
appends: overwrite and complete output modes are refused.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from catalog import SqliteCatalog, TableInfo
from flush.batch_commit import commit_batch, discard_staged, stage_batch_file
from flush.parquet_files import WrittenFile
from flush.tables import ROW_ID_COLUMN, delta_schema
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.errors import IngestError
from pipelines.errors import InvalidOptionError
from pipelines.source_options import CATALOG_FILE, SourceOptions

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["TableSinkDataSource"]

NAME = "ingest"
_OPTIONS = ("warehouse", "table", "txnAppId", "checkpointLocation")
#: Rows per staged file: a task's rows are held in memory up to this many.
ROWS_PER_FILE = 500_000


@dataclass
class StagedFiles(WriterCommitMessage):
    """What one task staged, sent to the driver's commit."""

    files: list[WrittenFile] = field(default_factory=list)


@dataclass(frozen=True)
class _Target:
    """Everything a task needs (pickled to it): the table and the writer's app id."""

    warehouse: str
    info: TableInfo
    app_id: str | None

    def stage(self, batches: Iterator[pa.RecordBatch]) -> StagedFiles:
        staged = StagedFiles()
        pending: list[pa.RecordBatch] = []
        for batch in batches:
            pending.append(batch)
            if sum(b.num_rows for b in pending) >= ROWS_PER_FILE:
                staged.files.append(self._stage(pending))
                pending = []
        if any(b.num_rows for b in pending):
            staged.files.append(self._stage(pending))
        return staged

    def _stage(self, batches: list[pa.RecordBatch]) -> WrittenFile:
        checked = check_arrow_batch(self.info.schema, pa.Table.from_batches(batches))
        catalog = SqliteCatalog(os.path.join(self.warehouse, CATALOG_FILE))
        try:
            first = catalog.reserve_row_ids(self.info.id, checked.num_rows)
        finally:
            catalog.close()
        target = delta_schema(self.info.schema)
        ids = pa.array(range(first, first + checked.num_rows), pa.int64())
        rows = checked.append_column(target.field(ROW_ID_COLUMN), ids).cast(target)
        return stage_batch_file(self.info.uri, self.app_id, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batch_id: int) -> None:
        files = [f for m in messages if isinstance(m, StagedFiles) for f in m.files]
        commit_batch(self.info.uri, self.app_id, batch_id, files)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        discard_staged(self.info.uri, [f for m in messages if isinstance(m, StagedFiles)
                                       for f in m.files])  # fmt: skip


class TableStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream``: each micro-batch once (see the module docstring)."""

    def __init__(self, target: _Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles:
        return self.target.stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.target.commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.target.abort(messages)


class TableBatchWriter(DataSourceArrowWriter):
    """``write``: one append commit of the whole DataFrame."""

    def __init__(self, target: _Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFiles:
        return self.target.stage(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.target.commit(messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.target.abort(messages)


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
        warehouse = options.warehouse()
        catalog = options.catalog()
        try:
            info = options.table(catalog)
        finally:
            catalog.close()
        _check_columns(info, schema)
        app_id = None
        if streaming:
            given = options.get("txnAppId")
            checkpoint = options.get("checkpointLocation")
            if given is not None and given.strip():
                app_id = given.strip()[:200]
            elif checkpoint:
                app_id = "checkpoint:" + os.path.abspath(checkpoint)
            else:
                raise InvalidOptionError(
                    f"{NAME}: a streaming write needs the option checkpointLocation (or "
                    "txnAppId, one per query) so each micro-batch is committed once"
                )
        return _Target(str(warehouse), info, app_id)

    def writer(self, schema: StructType, overwrite: bool) -> TableBatchWriter:
        return TableBatchWriter(self._target(schema, overwrite, streaming=False))

    def streamWriter(self, schema: StructType, overwrite: bool) -> TableStreamWriter:
        return TableStreamWriter(self._target(schema, overwrite, streaming=True))
