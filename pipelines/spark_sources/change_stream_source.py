"""The ``ingest-change-stream`` Spark data source: a change stream's records as rows.

    spark.readStream.format("ingest-change-stream").option("warehouse", W)
        .option("name", "CS").option("startTimestamp", "2026-01-31T12:00:00Z").load()
    spark.read.format("ingest-change-stream").option("warehouse", W).option("name", "CS")
        .option("startTimestamp", "...").option("endTimestamp", "...").load()

Each row is one record of one partition (:mod:`pipelines.change_streams.read`): a data
change record, a heartbeat, or a child partitions record, with the record's JSON in
``record`` and its main fields as columns (:data:`SCHEMA`).

A streaming query is a reader of every partition at once, following the lineage as the
reference prescribes: a child partition is read only in a micro-batch after the one in
which all its parents ended and were read to their end, and by exactly one read. The
offset is that reader's state (:class:`_State`): per partition being read, the first
timestamp not yet read; children waiting for parents, with the parents that have ended;
the bound ``at`` every partition has been read up to; the tables' sealed versions.

A micro-batch reads every partition up to one bound, a seal's heartbeat
(:mod:`pipelines.change_streams.timeline`) chosen when Spark asks for the latest offset:
every version up to a seal has its change stream timestamp fixed by then, and every
later one a later timestamp, so the records up to the bound are the same whenever the
batch is read. Spark writes a batch's end offset to its checkpoint before running it, so
a batch run again after a crash returns the same rows. Whether a partition ends in a
batch is decided there too (its end at or before the bound), and recorded in the end
offset; the batch's tasks follow the offsets, never what the catalog says meanwhile.

Options are checked when Spark creates the source and plans the read, in its Python
worker; wrap the Spark calls in :func:`pipelines.source_errors` to get our errors back.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

from catalog import (
    Catalog,
    ChangeStreamRecord,
    PartitionRecord,
    did_you_mean,
    full_name,
    open_catalog,
)
from flush.commit_clock import clock
from ingest_sdk.change_records import (
    ChangeRecord,
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
    record_from_json,
)
from pipelines.change_streams.read import (
    MAX_HEARTBEAT_MS,
    MIN_HEARTBEAT_MS,
    ReadArgs,
    open_at,
    read,
    stream_tables,
)
from pipelines.change_streams.records import rfc3339
from pipelines.change_streams.timeline import newest_version, seal
from pipelines.errors import InvalidOptionError, ObjectNotFoundError, StreamStaleError
from pipelines.spark_sources.source_options import SourceOptions
from pipelines.sql.statements import NAME as NAME_PATTERN
from pipelines.sql.statements import qualified, split_name

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["SCHEMA", "ChangeStreamDataSource"]

NAME = "ingest-change-stream"
#: The rows: the record's timestamp (a data change's commit timestamp, a heartbeat's
#: timestamp, a child partitions record's start timestamp), the partition that returned
#: it (NULL for the partitions a read starts with), its kind, the data change fields
#: (NULL for the other kinds; ``record_sequence`` also for child partitions records), and
#: the record itself as JSON (``{"data_change_record": {...}}`` and so on).
SCHEMA = (
    "commit_timestamp TIMESTAMP, partition_token STRING, record_type STRING, "
    "table_name STRING, mod_type STRING, server_transaction_id STRING, "
    "record_sequence STRING, record STRING"
)
_OPTIONS = ("warehouse", "catalog", "name", "startTimestamp", "endTimestamp",
            "heartbeatMilliseconds")  # fmt: skip
_RESTART = "start a new query (a new checkpoint location)"


def _micros(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def _moment(text: str) -> datetime:
    """A record's RFC 3339 timestamp (``rfc3339``'s form) as an aware datetime."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _row(token: str | None, record: ChangeRecord, sent: dict[str, Any] | None = None
         ) -> tuple[Any, ...]:  # fmt: skip
    """One record as a row of :data:`SCHEMA`; ``sent``: its JSON form, if at hand."""
    text = orjson.dumps(record.to_json() if sent is None else sent).decode()
    match record:
        case DataChangeRecord():
            return (_moment(record.commit_timestamp), token, "data_change", record.table_name,
                    record.mod_type, record.server_transaction_id, record.record_sequence,
                    text)  # fmt: skip
        case HeartbeatRecord():
            return (_moment(record.timestamp), token, "heartbeat", None, None, None, None, text)
        case ChildPartitionsRecord():
            return (_moment(record.start_timestamp), token, "child_partitions", None, None,
                    None, record.record_sequence, text)  # fmt: skip


# The plan: which partitions a batch reads, and the state after it
@dataclass(frozen=True, slots=True)
class _Read(InputPartition):
    """The records of partition ``token`` with timestamps in ``[first_us, until_us]``;
    ``ends``: it ends within them (its child partitions record is returned); ``beat``: a
    heartbeat row at ``until_us`` if no data change record is returned."""

    stream_uid: str
    token: str
    first_us: int
    until_us: int
    ends: bool
    beat: bool


@dataclass(frozen=True, slots=True)
class _Announce(InputPartition):
    """The partitions a read starts with, as the first query's child partitions records."""

    tokens: tuple[str, ...]
    start_us: int


@dataclass(frozen=True, slots=True)
class _State:
    """A streaming offset: the state of a reader of every partition (JSON in Spark's
    checkpoint, :meth:`to_json`).

    ``at``: every partition in ``reading`` has been read up to it (None: the query has
    read nothing and starts at the bound of its first batch). ``reading``: token ->
    ``[first timestamp not yet read, time of its last heartbeat]``. ``waiting``: child
    token -> its parents that have ended and been read to their end. ``tables``: table
    id -> the version sealed at ``at`` (to see, without a seal, that nothing is new).
    ``first``: the query's initial offset (its first batch announces the partitions).
    """

    stream: str
    at: int | None
    reading: dict[str, list[int]]
    waiting: dict[str, list[str]]
    tables: dict[str, int]
    first: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stream": self.stream, "at": self.at,
            "reading": {t: list(v) for t, v in sorted(self.reading.items())},
            "waiting": {t: sorted(v) for t, v in sorted(self.waiting.items())},
            "tables": dict(sorted(self.tables.items(), key=lambda item: int(item[0]))),
        }  # fmt: skip
        if self.first:
            out["first"] = True
        return out

    @classmethod
    def of(cls, offset: Mapping[str, Any]) -> _State:
        try:
            return cls(
                str(offset["stream"]),
                None if offset["at"] is None else int(offset["at"]),
                {str(t): [int(v[0]), int(v[1])] for t, v in offset["reading"].items()},
                {str(t): [str(p) for p in v] for t, v in offset["waiting"].items()},
                {str(t): int(v) for t, v in offset["tables"].items()},
                bool(offset.get("first", False)),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise InvalidOptionError(
                f"{NAME}: the checkpoint's offset {str(dict(offset))[:120]} is not one of "
                f"this source's ({exc!r}); {_RESTART}"
            ) from None


#: One read of a plan: (token, first µs, ends in it, heartbeat due).
_Planned = tuple[str, int, bool, bool]


def _open_at(lineage: Mapping[str, PartitionRecord], moment: int) -> list[str]:
    """The tokens of the partitions open at ``moment``, sorted."""
    return sorted(p.token for p in open_at(list(lineage.values()), moment))


def _plan(
    state: _State, bound: int, lineage: Mapping[str, PartitionRecord], beat_us: int | None,
    ends: Callable[[str], bool],
) -> tuple[list[_Planned], dict[str, list[int]], dict[str, list[str]]]:  # fmt: skip
    """What one batch reads from ``state`` up to ``bound``, and what is left after it.

    The partitions read: those of ``state.reading``, and the waiting children whose
    parents have all ended (in earlier batches). ``ends(token)``: whether a partition
    ends in this batch (its children then wait for the next one). Returns the reads
    ``(token, first µs, ends, heartbeat due)``, and the new ``reading`` and ``waiting``.
    """
    reading = dict(state.reading)
    waiting = {child: list(parents) for child, parents in state.waiting.items()}
    for child, ended in state.waiting.items():
        if set(ended) >= set(lineage[child].parents):
            start = lineage[child].start_us
            reading[child] = [start, start - 1]
            del waiting[child]
    reads: list[_Planned] = []
    after: dict[str, list[int]] = {}
    for token, (first, beaten) in sorted(reading.items()):
        if ends(token):
            reads.append((token, first, True, False))
            for child in sorted(t for t, p in lineage.items() if token in p.parents):
                waiting[child] = sorted({*waiting.get(child, []), token})
            continue
        due = beat_us is not None and first <= bound and bound - beaten >= beat_us
        if first <= bound:
            reads.append((token, first, False, due))
        after[token] = [max(first, bound + 1), bound if due else beaten]
    return reads, after, waiting


class _Source:
    """The checked options and the change stream they name (the readers share it)."""

    def __init__(self, options: Mapping[str, str], streaming: bool | None) -> None:
        """Check ``options`` for a streaming read, a batch read, or (None) either."""
        self.options = SourceOptions(options, NAME, _OPTIONS)
        self.warehouse = self.options.warehouse()
        self.catalog_location = self.options.catalog_location()
        text = self.options.require("name", "a change stream name such as DB.PUBLIC.CS")
        if re.fullmatch(NAME_PATTERN, text) is None:
            raise InvalidOptionError(
                f"{NAME}: invalid change stream name {text[:80]!r}; write NAME, SCHEMA.NAME "
                'or DB.SCHEMA.NAME (letters, digits, _ and $, or "quoted")'
            )
        self.names = qualified(split_name(text))
        beat = self.options.whole_number("heartbeatMilliseconds")
        if beat is not None and not MIN_HEARTBEAT_MS <= beat <= MAX_HEARTBEAT_MS:
            raise InvalidOptionError(
                f"{NAME}: the option heartbeatMilliseconds must be from {MIN_HEARTBEAT_MS:,} "
                f"to {MAX_HEARTBEAT_MS:,}, got {beat}"
            )
        self.beat_us = None if beat is None else beat * 1000
        start = self.options.timestamp("startTimestamp")
        end = self.options.timestamp("endTimestamp")
        self.start_us = None if start is None else _micros(start)
        self.end_us = None if end is None else _micros(end)
        catalog = self.catalog()
        try:
            self.stream = self.find(catalog)
        finally:
            catalog.close()
        now = clock()
        if streaming and self.end_us is not None:
            raise InvalidOptionError(f"{NAME}: endTimestamp is for batch reads; a streaming "
                                     "query reads on until it is stopped")  # fmt: skip
        if streaming is False and self.start_us is None:
            raise InvalidOptionError(
                f"{NAME}: a batch read needs startTimestamp (e.g. '2026-01-31T12:00:00Z'); "
                "endTimestamp defaults to now"
            )
        if self.start_us is not None:
            if self.start_us > now:
                raise InvalidOptionError(
                    f"{NAME}: startTimestamp {rfc3339(self.start_us)} is in the future (now "
                    f"is {rfc3339(now)}); start at or before now"
                )
            if self.start_us < self.stream.created_us:
                raise InvalidOptionError(
                    f"{NAME}: startTimestamp {rfc3339(self.start_us)} is before "
                    f"{self.stream.full_name} was created ({rfc3339(self.stream.created_us)}); "
                    "start at or after that"
                )
        if self.end_us is not None:
            if self.end_us > now:
                raise InvalidOptionError(f"{NAME}: endTimestamp {rfc3339(self.end_us)} is in "
                                         f"the future (now is {rfc3339(now)})")  # fmt: skip
            if self.start_us is not None and self.end_us < self.start_us:
                raise InvalidOptionError(
                    f"{NAME}: endTimestamp {rfc3339(self.end_us)} is before startTimestamp "
                    f"{rfc3339(self.start_us)}"
                )

    def catalog(self) -> Catalog:
        return open_catalog(self.catalog_location)

    def find(self, catalog: Catalog, uid: str | None = None) -> ChangeStreamRecord:
        """The change stream the option ``name`` names; with ``uid``, it must be that one
        (the stream a query's checkpoint reads)."""
        stream = catalog.get_change_stream(*self.names)
        if stream is None:
            raise ObjectNotFoundError(
                f"{NAME}: change stream {full_name(*self.names)} does not exist"
                f"{did_you_mean(catalog, *self.names, ['change stream'])}; check the "
                "option name (unquoted names are upper-cased) and the option warehouse"
            )
        if uid is not None and stream.uid != uid:
            raise ObjectNotFoundError(
                f"{NAME}: the change stream this query reads was dropped or replaced; "
                f"{full_name(*self.names)} is another one now: {_RESTART}"
            )
        return stream

    def check_retained(self, start_us: int) -> None:
        """A new read may not start before the retention period (a query restarted from
        its checkpoint goes on from there, so this is checked at its first offset only)."""
        oldest = clock() - self.stream.retention_s * 1_000_000
        if start_us < oldest:
            raise StreamStaleError(
                f"{NAME}: startTimestamp {rfc3339(start_us)} is before {rfc3339(oldest)}: the "
                f"retention period of {self.stream.full_name} ({self.stream.retention_s} s) "
                f"keeps nothing older; start at {rfc3339(oldest)} or later"
            )

    def rows(self, part: InputPartition) -> Iterator[tuple[Any, ...]]:
        """The rows of one planned read (runs in a Spark task)."""
        if isinstance(part, _Announce):
            for sequence, token in enumerate(part.tokens):
                announced = (ChildPartition(token),)
                yield _row(None, ChildPartitionsRecord(rfc3339(part.start_us),
                                                       f"{sequence:08d}", announced))  # fmt: skip
            return
        if not isinstance(part, _Read):  # Spark reads one empty partition for none
            return
        catalog = self.catalog()
        try:
            stream = self.find(catalog, part.stream_uid)
            args = ReadArgs(part.first_us, None, part.token, MAX_HEARTBEAT_MS)
            changed = False
            for sent in read(catalog, stream, args, until_us=part.until_us):
                record = record_from_json(sent)
                if isinstance(record, DataChangeRecord):
                    changed = True
                    yield _row(part.token, record, sent)
                elif isinstance(record, ChildPartitionsRecord) and part.ends:
                    yield _row(part.token, record, sent)
            # Heartbeats are the plan's (read's own depend on when it ran): one at the
            # bound, for a partition that returned no change in this batch.
            if part.beat and not changed:
                yield _row(part.token, HeartbeatRecord(rfc3339(part.until_us)))
        finally:
            catalog.close()


def _lineage(catalog: Catalog, stream: ChangeStreamRecord) -> dict[str, PartitionRecord]:
    return {p.token: p for p in catalog.list_partitions(stream.uid)}


def _ends(lineage: Mapping[str, PartitionRecord], bound: int) -> Callable[[str], bool]:
    def ends(token: str) -> bool:
        end = lineage[token].end_us
        return end is not None and end - 1 <= bound

    return ends


class ChangeStreamBatchReader(DataSourceReader):
    """``spark.read``: the records from startTimestamp to endTimestamp (default: now) of
    every partition of that time, children included; each partition read once."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        assert source.start_us is not None
        catalog = source.catalog()
        try:
            stream = source.stream
            source.check_retained(source.start_us)
            if source.end_us is not None:
                bound = source.end_us
            else:
                seals, _ = seal(catalog, stream_tables(catalog, stream))
                bound = max((s.heartbeat_us for s in seals.values()), default=clock())
            lineage = _lineage(catalog, stream)
        finally:
            catalog.close()
        start = source.start_us
        opened = _open_at(lineage, start)
        state = _State(stream.uid, start - 1, {t: [start, start - 1] for t in opened}, {}, {})
        planned: list[InputPartition] = [_Announce(tuple(opened), start)] if opened else []
        ends = _ends(lineage, bound)
        while True:  # a round per generation: children once all their parents ended
            reads, _, waiting = _plan(state, bound, lineage, source.beat_us, ends)
            planned += [_Read(stream.uid, t, first, bound, done, beat)
                        for t, first, done, beat in reads]  # fmt: skip
            if not any(set(e) >= set(lineage[c].parents) for c, e in waiting.items()):
                break
            state = _State(stream.uid, bound, {}, waiting, {})
        self.planned = planned

    def partitions(self) -> Sequence[InputPartition]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return self.source.rows(partition)


class ChangeStreamStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: offsets are the reader state (:class:`_State`)."""

    def __init__(self, source: _Source) -> None:
        self.source = source
        self.target: tuple[int, dict[str, int]] | None = None  # Trigger.AvailableNow
        self._catalog: Catalog | None = None

    def __getstate__(self) -> dict[str, Any]:  # the tasks get the reader without its catalog
        return {"source": self.source, "target": self.target, "_catalog": None}

    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = self.source.catalog()
        return self._catalog

    def initialOffset(self) -> dict[str, Any]:
        stream = self.source.find(self.catalog())
        start = self.source.start_us
        if start is None:  # from the bound of the first batch, which Spark logs before it runs
            return _State(stream.uid, None, {}, {}, {}, first=True).to_json()
        self.source.check_retained(start)
        opened = _open_at(_lineage(self.catalog(), stream), start)
        reading = {t: [start, start - 1] for t in opened}
        return _State(stream.uid, start - 1, reading, {}, {}, first=True).to_json()

    def _sealed(self, stream: ChangeStreamRecord) -> tuple[int, dict[str, int]]:
        """A new bound: the tables sealed now, at one heartbeat."""
        catalog = self.catalog()
        seals, _ = seal(catalog, stream_tables(catalog, stream))
        bound = max((s.heartbeat_us for s in seals.values()), default=clock())
        return bound, {str(t): s.version for t, s in seals.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._sealed(self.source.find(self.catalog()))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        state = _State.of(start)
        catalog = self.catalog()
        stream = self.source.find(catalog, state.stream)
        lineage = _lineage(catalog, stream)
        if self.target is not None:
            bound, tables = self.target
            if state.at is not None and state.at >= bound:
                bound, tables = state.at, state.tables
        elif self._new(state, stream, lineage):
            bound, tables = self._sealed(stream)
            if state.at is not None:
                bound = max(bound, state.at)
        else:
            return start
        if state.at is None:  # the first batch: the partitions open after its bound
            opened = _open_at(lineage, bound + 1)
            after = {t: [bound + 1, bound] for t in opened}
            return _State(stream.uid, bound, after, {}, tables).to_json()
        _, reading, waiting = _plan(state, bound, lineage, self.source.beat_us,
                                    _ends(lineage, bound))  # fmt: skip
        end = _State(stream.uid, bound, reading, waiting, tables)
        unchanged = _State(state.stream, state.at, state.reading, state.waiting, state.tables)
        return start if end == unchanged and not state.first else end.to_json()

    def _new(
        self, state: _State, stream: ChangeStreamRecord, lineage: Mapping[str, PartitionRecord]
    ) -> bool:
        """Whether a batch has anything to do: a first bound, a table with versions not
        yet sealed into the state, a partition that ended, a child whose parents have all
        ended, or a heartbeat due."""
        if state.at is None:
            return True
        if any(set(ended) >= set(lineage[c].parents) for c, ended in state.waiting.items()):
            return True
        if any(lineage[t].end_us is not None for t in state.reading if t in lineage):
            return True
        for table in stream_tables(self.catalog(), stream):
            seen = state.tables.get(str(table.id))
            if seen is None or newest_version(table.uri) > seen:
                return True
        beat = self.source.beat_us
        return beat is not None and clock() - state.at >= beat

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        state, after = _State.of(start), _State.of(end)
        if after.at is None or start == end:
            return []
        stream = self.source.find(self.catalog(), state.stream)
        bound = after.at
        planned: list[InputPartition] = []
        if state.first:  # the partitions the query starts with, at its start
            if state.at is None:
                return [_Announce(tuple(sorted(after.reading)), bound + 1)]
            planned.append(_Announce(tuple(sorted(state.reading)), state.at + 1))
        if state.at is None:
            return planned
        lineage = _lineage(self.catalog(), stream)

        def ends(token: str) -> bool:  # as the end offset says, whatever happened since
            return token not in after.reading

        reads, _, _ = _plan(state, bound, lineage, self.source.beat_us, ends)
        planned += [_Read(stream.uid, t, first, bound, done, beat)
                    for t, first, done, beat in reads]  # fmt: skip
        return planned

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return self.source.rows(partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass

    def stop(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None


class ChangeStreamDataSource(DataSource):
    """``format("ingest-change-stream")``: see the module docstring for options and rows."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        _Source(self.options, streaming=None)  # what both kinds of read need, at load()
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ChangeStreamBatchReader(_Source(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ChangeStreamStreamReader(_Source(self.options, streaming=True))
