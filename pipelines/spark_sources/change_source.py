"""The ``ingest-changes`` Spark data source: a table's change rows by version.

    spark.read.format("ingest-changes").option("warehouse", W).option("table", "T")
        .option("startingVersion", 5).load()
    spark.readStream.format("ingest-changes").option("warehouse", W).option("table", "T")
        .load()

Each row is one change of one commit, as Delta's change data feed shows it: the
table's columns, ``_row_id`` (the hidden row id, stable across updates),
``_change_type`` (``insert``, ``delete``, ``update_preimage``, ``update_postimage``),
``_commit_version`` and ``_commit_timestamp``. Compaction shows nothing (it changes no
data). Unlike a stream (SQL), nothing is netted and nothing is consumed: offsets
belong to the Spark query's checkpoint.

Streaming offsets are ``{"table": id, "version": n}``, ``n`` the next version to
read. A query without ``startingVersion`` starts from the marker ``n = -1``: its first
batch is the table as it is (every row an ``insert`` of the newest version), as a Delta
change-feed stream does; ``startingVersion = latest`` makes that batch empty. The
marker keeps the first batch deterministic: Spark writes the batch's end offset to
its checkpoint before running it, and the snapshot is read at that end.

Options are checked when Spark creates the source and plans the read, in its Python
worker; Spark reports a refusal inside its own error, so callers wrap the Spark calls
in :func:`pipelines.source_errors` to get ours back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from catalog import TableInfo, open_catalog
from flush.tables import ROW_ID_COLUMN, commit_history, live_paths, logged_versions
from pipelines.errors import InvalidOptionError, ObjectNotFoundError, StreamStaleError
from pipelines.spark_sources.source_options import SourceOptions

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["ChangesDataSource", "change_schema", "version_at"]

NAME = "ingest-changes"
ROW_ID, CHANGE_TYPE, VERSION, TIMESTAMP = (
    "_row_id", "_change_type", "_commit_version", "_commit_timestamp",
)  # fmt: skip
_START = -1  # the offset of a query that has read nothing yet
#: Versions one Spark task reads (one change-feed scan each).
VERSIONS_PER_PARTITION = 64
#: Data files one Spark task reads for the first batch of a stream (the table as it is).
FILES_PER_SNAPSHOT_PARTITION = 8
_OPTIONS = (
    "warehouse", "catalog", "table", "startingVersion", "startingTimestamp", "endingVersion",
    "endingTimestamp", "maxVersionsPerTrigger",
)  # fmt: skip


def change_schema(info: TableInfo) -> pa.Schema:
    """The rows of the source: the table's columns, then the change columns."""
    return info.schema.to_arrow().append(pa.field(ROW_ID, pa.int64())).append(
        pa.field(CHANGE_TYPE, pa.string())
    ).append(pa.field(VERSION, pa.int64())).append(
        pa.field(TIMESTAMP, pa.timestamp("us", tz="UTC"))
    )  # fmt: skip


def version_at(table_uri: str, moment: datetime, after: bool = False) -> int:
    """The first version committed at or after ``moment`` (Delta's rule for a starting
    timestamp), or strictly after it with ``after`` (one past an ending timestamp);
    one past the newest version if none is."""
    table, entries = commit_history(table_uri)
    millis = moment.timestamp() * 1000
    later = [
        int(e["version"])
        for e in entries
        if e.get("timestamp", 0) > millis or (not after and e.get("timestamp", 0) == millis)
    ]
    return min(later) if later else table.version() + 1


@dataclass(frozen=True, slots=True)
class _Changes(InputPartition):
    """Change rows of versions ``first..last`` of one table."""

    uri: str
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class _Snapshot(InputPartition):
    """The rows of data files of one version, each an ``insert`` of that version."""

    files: tuple[str, ...]
    version: int
    millis: int


def _check_retained(info: TableInfo, first: int) -> None:
    oldest = min(logged_versions(info.uri), default=0)
    if first < oldest:
        raise StreamStaleError(
            f"{NAME}: the changes of {info.full_name} from version {first} are no longer "
            f"retained (the log starts at version {oldest}, after log cleanup); start from "
            f"version {oldest} or later (a streaming query needs a new checkpoint location)"
        )


def _plan(info: TableInfo, start: int, end: int, snapshot: bool) -> list[InputPartition]:
    """Partitions for versions ``start..end-1`` (``start`` -1: the first batch)."""
    if start == _START:
        if not snapshot or end <= 0:
            return []
        try:  # the version the first batch ended at when Spark logged it
            _, entries = commit_history(info.uri, since=end - 2)
            millis = int(next(e for e in entries if e["version"] == end - 1)["timestamp"])
            snapshot_table = DeltaTable(info.uri, version=end - 1)
        except Exception as exc:  # log cleanup removed that version
            raise StreamStaleError(
                f"{NAME}: version {end - 1} of {info.full_name}, where this query's first "
                f"batch reads the table, is no longer retained ({str(exc)[:200]}); start a "
                "new query (a new checkpoint location)"
            ) from exc
        files = live_paths(info.uri, snapshot_table)
        per = FILES_PER_SNAPSHOT_PARTITION
        return [_Snapshot(tuple(files[i : i + per]), end - 1, millis)
                for i in range(0, len(files), per)]  # fmt: skip
    if end <= start:
        return []
    _check_retained(info, start)
    return [
        _Changes(info.uri, first, min(first + VERSIONS_PER_PARTITION, end) - 1)
        for first in range(start, end, VERSIONS_PER_PARTITION)
    ]


def _read(partition: InputPartition, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The rows of one partition (runs in a Spark task), typed as ``schema``."""
    user = [name for name in schema.names if name not in (ROW_ID, CHANGE_TYPE, VERSION, TIMESTAMP)]
    if isinstance(partition, _Snapshot):
        for path in partition.files:
            try:
                rows = pq.read_table(path, columns=[*user, ROW_ID_COLUMN])
            except FileNotFoundError as exc:
                raise StreamStaleError(
                    f"{NAME}: a file of version {partition.version} is gone (vacuum); start "
                    "a new query (a new checkpoint location)"
                ) from exc
            count = rows.num_rows
            yield from _typed(
                rows, schema, pa.array(["insert"] * count),
                pa.array([partition.version] * count, pa.int64()),
                pa.array([partition.millis * 1000] * count, pa.int64()),
            )  # fmt: skip
        return
    if not isinstance(partition, _Changes):  # Spark reads one empty partition for none
        return
    try:
        events = pa.table(
            DeltaTable(partition.uri).load_cdf(
                starting_version=partition.first, ending_version=partition.last
            )
        )
    except Exception as exc:  # delta-rs reports missing log entries and files variously
        raise StreamStaleError(
            f"{NAME}: the changes of versions {partition.first}..{partition.last} are no "
            f"longer readable ({str(exc)[:200]}); log cleanup or vacuum removed them"
        ) from exc
    events = _without_views(events).sort_by("_commit_version")
    micros = pc.multiply(events.column("_commit_timestamp").cast(pa.int64()), 1000)
    yield from _typed(
        events.select([*user, ROW_ID_COLUMN]),
        schema,
        events.column("_change_type").cast(pa.string()),
        events.column("_commit_version").cast(pa.int64()),
        micros,
    )


def _without_views(table: pa.Table) -> pa.Table:
    """``table`` with string and binary views as plain strings and binaries (delta-rs
    reads views; pyarrow has no take kernel for them)."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return table.cast(pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema]))


def _typed(
    rows: pa.Table, schema: pa.Schema, kinds: Any, versions: Any, micros: Any
) -> Iterator[pa.RecordBatch]:
    columns = [rows.column(i) for i in range(rows.num_columns)]
    stamps = pc.cast(micros, pa.int64()).cast(pa.timestamp("us", tz="UTC"))
    table = pa.Table.from_arrays(
        [*columns, kinds, versions, stamps],
        names=[*rows.column_names[:-1], ROW_ID, CHANGE_TYPE, VERSION, TIMESTAMP],
    )
    yield from table.cast(schema).to_batches()


class _Source:
    """What the readers share: the options, the table, the Arrow schema."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = SourceOptions(options, NAME, _OPTIONS)
        self.warehouse = self.options.warehouse()
        self.catalog_location = self.options.catalog_location()
        catalog = open_catalog(self.catalog_location)
        try:
            self.info = self.options.table(catalog)
        finally:
            catalog.close()
        taken = [
            c.name
            for c in self.info.schema.columns
            if c.name.lower() in (ROW_ID, CHANGE_TYPE, VERSION, TIMESTAMP)
        ]
        if taken:
            raise InvalidOptionError(
                f"{NAME}: {self.info.full_name} has the column(s) {', '.join(taken)}, which "
                "change rows use for themselves; columns cannot be renamed yet: copy the table "
                "under other column names to read its changes here, or use a stream in SQL"
            )
        self.arrow_schema = change_schema(self.info)

    def current(self, table_id: int) -> TableInfo:
        """The table as the catalog knows it now (by id: a rename keeps it)."""
        catalog = open_catalog(self.catalog_location)
        try:
            info = catalog.get_table_by_id(table_id)
        finally:
            catalog.close()
        if info is None:
            raise ObjectNotFoundError(
                f"{NAME}: the table this query reads ({self.info.full_name}, id {table_id}) "
                "was dropped; a table created again under its name is another table: start "
                "a new query (new checkpoint location) to read it"
            )
        return info

    def starting_version(self, latest: int, allow_latest: bool) -> int | None:
        """The first version to read, from startingVersion/startingTimestamp. None: not
        set, or ``latest`` (a stream then starts at the marker offset and its first batch,
        whose end Spark logs before running it, is empty: a restart before that batch
        commits does not move the start past commits that landed in between)."""
        given = self.options.get("startingVersion")
        if given is not None and self.options.get("startingTimestamp") is not None:
            raise InvalidOptionError(f"{NAME}: set startingVersion or startingTimestamp, not both")
        if allow_latest and given is not None and given.strip().lower() == "latest":
            return None
        version = self.options.whole_number("startingVersion")
        moment = self.options.timestamp("startingTimestamp")
        if moment is not None:
            version = version_at(self.info.uri, moment)
        if version is not None and version > latest + (1 if moment is not None else 0):
            raise InvalidOptionError(
                f"{NAME}: startingVersion {version} is after the newest version ({latest}) "
                f"of {self.info.full_name}"
            )
        return version


class ChangesBatchReader(DataSourceReader):
    """``spark.read``: the change rows of versions startingVersion..endingVersion."""

    def __init__(self, source: _Source) -> None:
        latest = DeltaTable(source.info.uri).version()
        start = source.starting_version(latest, allow_latest=False)
        if start is None:
            raise InvalidOptionError(
                f"{NAME}: a batch read needs startingVersion (0 reads every change) or "
                "startingTimestamp"
            )
        if source.options.get("endingVersion") and source.options.get("endingTimestamp"):
            raise InvalidOptionError(f"{NAME}: set endingVersion or endingTimestamp, not both")
        end = source.options.whole_number("endingVersion")
        moment = source.options.timestamp("endingTimestamp")
        if moment is not None:
            end = version_at(source.info.uri, moment, after=True) - 1  # the last at or before
        end = latest if end is None else end
        if end > latest:
            raise InvalidOptionError(
                f"{NAME}: endingVersion {end} is after the newest version ({latest}) of "
                f"{source.info.full_name}"
            )
        if end < start and source.options.get("endingVersion") is not None:
            raise InvalidOptionError(
                f"{NAME}: endingVersion {end} is before startingVersion {start}"
            )
        self.schema = source.arrow_schema
        self.planned = _plan(source.info, start, end + 1, snapshot=False)

    def partitions(self) -> Sequence[InputPartition]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.schema)


class ChangesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: offsets are table versions (see the module docstring)."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.schema = source.arrow_schema
        self.limit = source.options.whole_number("maxVersionsPerTrigger", minimum=1)
        self.snapshot = source.options.get("startingVersion") is None and (
            source.options.get("startingTimestamp") is None
        )
        self.target: int | None = None  # Trigger.AvailableNow: the end at the query's start
        if source.options.get("endingVersion") or source.options.get("endingTimestamp"):
            raise InvalidOptionError(f"{NAME}: endingVersion/endingTimestamp are for batch reads")
        latest = DeltaTable(source.info.uri).version()
        self.first = source.starting_version(latest, allow_latest=True)

    def initialOffset(self) -> dict[str, int]:
        version = _START if self.first is None else self.first
        return {"table": self.source.info.id, "version": version}

    def _latest(self, table_id: int) -> int:
        return DeltaTable(self.source.current(table_id).uri).version() + 1

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._latest(self.source.info.id)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.limit is None else ReadMaxFiles(self.limit)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        end = self.target if self.target is not None else self._latest(start["table"])
        if start["version"] != _START and isinstance(limit, ReadMaxFiles):
            end = min(end, start["version"] + limit.max_files)
        return {"table": start["table"], "version": max(end, start["version"])}

    def reportLatestOffset(self) -> dict[str, int]:
        return {"table": self.source.info.id, "version": self._latest(self.source.info.id)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        if start.get("table") != self.source.info.id:
            raise ObjectNotFoundError(
                f"{NAME}: this query's checkpoint reads table id {start.get('table')}, not "
                f"{self.source.info.full_name} (id {self.source.info.id}); the table was "
                "dropped and created again: start a new query with a new checkpoint location"
            )
        info = self.source.current(start["table"])
        return _plan(info, start["version"], end["version"], self.snapshot)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self.schema)


class ChangesDataSource(DataSource):
    """``format("ingest-changes")``: see the module docstring for options and rows."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _source(self) -> _Source:
        return _Source(self.options)

    def schema(self) -> StructType:
        from pyspark.sql.pandas.types import from_arrow_schema

        return from_arrow_schema(self._source().arrow_schema, prefer_timestamp_ntz=True)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ChangesBatchReader(self._source())

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ChangesStreamReader(self._source())
