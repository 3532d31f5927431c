"""Reading a change stream: the arguments of ``READ_<name>(...)``, the first query's
partitions, and one partition's records, heartbeats and end.

A partition's query returns, in commit timestamp order, the data change records of
the versions it covers (sealed ones only, :mod:`.timeline`), a heartbeat when nothing
was returned for ``heartbeat_milliseconds``, and when the partition has ended (split
or merged), one child partitions record naming the partitions after it; then it ends.
It also ends once ``end_timestamp`` is passed. Every face (the session's function,
the HTTP route, the command line) runs this generator.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from catalog import (
    Catalog,
    ChangeStreamDefinition,
    ChangeStreamRecord,
    PartitionRecord,
    Seal,
    TableInfo,
)
from flush.commit_clock import clock, commit_info, version_at
from ingest_sdk.change_records import ChildPartition, ChildPartitionsRecord, HeartbeatRecord
from ingest_sdk.errors import InvalidValueError
from ingest_sdk.temporal import datetime_instant_nanos, moment_micros
from pipelines.change_streams.history import definition_at, read_tables, tables_of
from pipelines.change_streams.records import RecordCache, TableChange, VersionRecords, rfc3339
from pipelines.change_streams.records import transaction_records as build_records
from pipelines.change_streams.timeline import newest_version, seal, timestamps
from pipelines.errors import ObjectNotFoundError, SqlError, StreamStaleError
from pipelines.sql.history import commit_writer
from pipelines.streams.changes import change_events

__all__ = [
    "ARGUMENTS", "MAX_HEARTBEAT_MS", "MIN_HEARTBEAT_MS", "ReadArgs", "open_at", "read",
    "read_args", "stream_tables",
]  # fmt: skip

MIN_HEARTBEAT_MS, MAX_HEARTBEAT_MS = 1_000, 300_000
#: The function's arguments, in their positional order.
ARGUMENTS = ("start_timestamp", "end_timestamp", "partition_token", "heartbeat_milliseconds")
#: How often a waiting partition looks for new versions (seconds).
POLL_S = 0.05
#: How often an open read looks again at which tables its stream watches (seconds).
TABLES_EVERY_S = 1.0
#: A heartbeat may use a seal this recent (µs) that another read of the stream wrote.
SHARED_SEAL_US = 200_000
_CACHE = RecordCache()


def _error(message: str) -> SqlError:
    return SqlError(message, "INVALID_ARGUMENT")


@dataclass(frozen=True, slots=True)
class ReadArgs:
    """Checked arguments of one read: times in µs since the epoch."""

    start_us: int
    end_us: int | None
    token: str | None
    heartbeat_ms: int


#: Moments a read may name (µs): the calendar's, a day inside its ends in every zone.
_EARLIEST_US = datetime_instant_nanos(datetime(1, 1, 2, tzinfo=UTC)) // 1000
_LATEST_US = datetime_instant_nanos(datetime(9999, 12, 30, tzinfo=UTC)) // 1000


def _micros(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        micros, shown = datetime_instant_nanos(moment) // 1000, moment.isoformat()[:40]
    elif isinstance(value, str) and value.strip().upper() != "NULL":
        try:
            parsed = moment_micros(value)
        except InvalidValueError as error:
            raise _error(f"{name} {value[:60]!r} is not a timestamp: {error}") from None
        if parsed is None:
            raise _error(
                f"{name} {value[:60]!r} is not a timestamp; write it as "
                "'2026-01-31T12:00:00Z' (RFC 3339, UTC unless an offset is given)"
            )
        micros, shown = parsed, repr(value[:40])
    elif isinstance(value, str):
        return None
    else:
        raise _error(f"{name} must be a timestamp such as '2026-01-31T12:00:00Z'")
    if not _EARLIEST_US <= micros <= _LATEST_US:
        raise _error(f"{name} {shown} is outside the calendar; give a moment within the "
                     "stream's retention period")  # fmt: skip
    return micros


def read_args(
    values: Mapping[str, Any], stream: ChangeStreamRecord, partitions: list[PartitionRecord]
) -> ReadArgs:
    """Check a read's arguments against the stream, its retention and its partitions.

    Raises:
        SqlError: ``INVALID_ARGUMENT`` naming the argument and what to pass instead.
    """
    unknown = set(values) - set(ARGUMENTS) - {"read_options"}
    if unknown:
        raise _error(f"unknown argument {sorted(unknown)[0][:40]!r}; the arguments are "
                     f"{', '.join(ARGUMENTS)}")  # fmt: skip
    if values.get("read_options") not in (None, "NULL", "null"):
        raise _error("read_options is reserved; pass NULL or leave it out")
    start = _micros("start_timestamp", values.get("start_timestamp"))
    if start is None:
        raise _error("start_timestamp is required, e.g. start_timestamp => '2026-01-31T12:00:00Z'")
    end = _micros("end_timestamp", values.get("end_timestamp"))
    beat = values.get("heartbeat_milliseconds")
    try:
        heartbeat = int(beat) if beat is not None and not isinstance(beat, bool) else None
    except (TypeError, ValueError):
        heartbeat = None
    if heartbeat is not None and isinstance(beat, float | Decimal) and beat != heartbeat:
        heartbeat = None  # 1000.5 is not a whole number of milliseconds (int() truncates)
    if heartbeat is None or not MIN_HEARTBEAT_MS <= heartbeat <= MAX_HEARTBEAT_MS:
        raise _error(f"heartbeat_milliseconds must be a whole number from {MIN_HEARTBEAT_MS:,} "
                     f"to {MAX_HEARTBEAT_MS:,}, got {str(beat)[:40]!r}")  # fmt: skip
    now = clock()
    if start > now:
        raise _error(f"start_timestamp {rfc3339(start)} is in the future (now is "
                     f"{rfc3339(now)}); start at or before now")  # fmt: skip
    oldest = max(stream.created_us, now - stream.retention_s * 1_000_000)
    if start < oldest:
        why = (
            "the stream was created"
            if oldest == stream.created_us
            else f"the retention period ({stream.retention_s} s) keeps nothing older"
        )
        raise _error(f"start_timestamp {rfc3339(start)} is before {rfc3339(oldest)}: {why}; "
                     f"start at {rfc3339(oldest)} or later")  # fmt: skip
    if end is not None and end < start:
        raise _error(f"end_timestamp {rfc3339(end)} is before start_timestamp {rfc3339(start)}")
    token = values.get("partition_token")
    if isinstance(token, str) and token.strip().upper() == "NULL":
        token = None
    if token is not None:
        if not isinstance(token, str):
            raise _error("partition_token must be text, a token from a child partitions record")
        found = next((p for p in partitions if p.token == token), None)
        if found is None:
            raise _error(f"partition_token {token[:64]!r} is not a partition of change stream "
                         f"{stream.full_name}; pass NULL for the first query, then the tokens "
                         "its child partitions records return")  # fmt: skip
        if start < found.start_us:
            raise _error(f"start_timestamp {rfc3339(start)} is before partition {token}'s "
                         f"start {rfc3339(found.start_us)}; start at the start_timestamp of "
                         "the child partitions record that named it")  # fmt: skip
    return ReadArgs(start, end, token, heartbeat)


def stream_tables(catalog: Catalog, stream: ChangeStreamRecord) -> list[TableInfo]:
    """The tables a stream watches now (``FOR ALL``: every table of the warehouse)."""
    return tables_of(catalog, stream.definition)


def table_label(stream: ChangeStreamRecord, table: TableInfo) -> str:
    """A record's ``table_name``: the table's name in the stream's own schema, its full
    name in another (a ``FOR ALL`` stream watches every schema)."""
    if (table.database, table.schema_name) == (stream.database, stream.schema_name):
        return table.name
    return table.full_name


def open_at(partitions: list[PartitionRecord], moment: int) -> list[PartitionRecord]:
    """The partitions open at ``moment`` (it is in their ``[start_us, end_us)``)."""
    return [
        p for p in partitions if p.start_us <= moment and (p.end_us is None or moment < p.end_us)
    ]


def _first_query(partitions: list[PartitionRecord], start: int) -> Iterator[dict[str, Any]]:
    for sequence, partition in enumerate(open_at(partitions, start)):
        child = ChildPartition(partition.token)
        yield ChildPartitionsRecord(rfc3339(start), f"{sequence:08d}", (child,)).to_json()


def _written(table: TableInfo, version: int) -> tuple[str, str, bool]:
    """Who wrote a version, from its commit info (read once): its ``server_transaction_id``
    (the random part of the pipeline commit it belongs to, the same in every table a SQL
    transaction wrote; else table.version), its transaction tag, and whether the system
    wrote it."""
    writer, recorded = commit_writer(commit_info(table.uri, version) or {})
    app = recorded.get("app_id") if isinstance(recorded, dict) else None
    unique = app.rsplit(":", 1)[-1] if isinstance(app, str) else ""
    if len(unique) != 32 or any(c not in "0123456789abcdef" for c in unique):
        unique = f"{table.id}.{version}"
    if writer == "INGEST" and isinstance(recorded, dict):
        names = sorted({c.get("channel", "") for c in recorded.get("channels", [])})
        return unique, "channels=" + ",".join(names), False
    if writer == "DYNAMIC_TABLE" and isinstance(recorded, dict):
        name = str(recorded.get("statement", "")).removeprefix("refresh of ")
        return unique, "dynamic_table=" + name, True
    return unique, {"SQL": "sql", "SPARK_SINK": "spark_sink"}.get(writer or "", ""), False


def _first_version(table: TableInfo, catalog: Catalog, start: int) -> int:
    """The last version of ``table`` whose change stream timestamp is before ``start``
    (-1: none is)."""
    before = version_at(table.uri, start, strictly_before=True)
    version = before if before is not None else -1
    while version >= 0:  # stamps before start may still carry a later (sealed) timestamp
        stamp = timestamps(catalog, table, version - 1, version).get(version, 0)
        if stamp < start:
            return version
        version -= 1
    return version


#: One table version of a transaction.
_Member = tuple[TableInfo, int]


def _records(
    stream: ChangeStreamRecord, definition: ChangeStreamDefinition, members: list[_Member],
    moment: int, partitions: list[PartitionRecord],
) -> VersionRecords:  # fmt: skip
    """A transaction's records (a version of each table it wrote and the stream watches)
    under the definition in force at its timestamp."""
    open_now = open_at(partitions, moment)
    # A renamed table's records carry its new name.
    parts = [(table, version, table_label(stream, table), definition.watched_columns(table.id))
             for table, version in members]  # fmt: skip
    excluded = definition.excluded_mod_types
    capture = definition.value_capture_type
    key = (
        stream.uid, capture, excluded, tuple((t.id, v, label, w) for t, v, label, w in parts),
        tuple(p.token for p in open_now),
    )  # fmt: skip

    def events(table: TableInfo, version: int) -> Any:
        try:
            return change_events(table.uri, table.schema, version - 1, version)
        except StreamStaleError as exc:
            raise StreamStaleError(
                f"version {version} of {table.full_name} is no longer retained (log cleanup "
                f"or vacuum removed it); start the read later: {str(exc)[:160]}"
            ) from exc

    def build() -> VersionRecords:
        changes = [TableChange(t, events(t, v), label, w) for t, v, label, w in parts]
        transaction, tag, system = _written(*members[0])
        return build_records(changes, capture, moment, transaction, tag, system, open_now,
                             excluded)  # fmt: skip

    return _CACHE.get(key, build)


def _transactions(
    found: Iterator[tuple[int, str, int, int]], history: list[ChangeStreamDefinition],
    by_id: Mapping[int, TableInfo],
) -> Iterator[tuple[int, ChangeStreamDefinition, list[list[_Member]]]]:  # fmt: skip
    """The watched versions of ``found`` (in timestamp order) by timestamp, as
    transactions: versions of one timestamp that one pipeline commit wrote
    (:mod:`.timeline` gives them one) are one; with the definition in force then."""
    for moment, items in itertools.groupby(found, key=lambda item: item[0]):
        definition = definition_at(history, moment)
        if definition is None:
            continue
        watched = [(by_id[t], v) for _, _, t, v in items if definition.watches(t)]
        if len(watched) < 2:
            if watched:
                yield moment, definition, [watched]
            continue
        by_commit: dict[str, list[_Member]] = {}
        for table, version in watched:
            by_commit.setdefault(_written(table, version)[0], []).append((table, version))
        yield moment, definition, list(by_commit.values())


def _position(record: dict[str, Any]) -> tuple[str, str]:
    body = record["data_change_record"]
    return body["table_name"], body["record_sequence"]


def _must_seal(
    tables: list[TableInfo], seals: Mapping[int, Seal], partition: PartitionRecord,
    end: int | None, beat_due: bool,
) -> bool:  # fmt: skip
    """Whether a read needs a new seal to go on: a table has versions after its seal (or
    none), a heartbeat is due and no seal of the last moments serves it (the partitions
    of one stream share their seals), or the end (of the read, of the partition) is
    reached in time but not yet sealed."""
    if not tables:
        return False
    if any(t.id not in seals or newest_version(t.uri) > seals[t.id].version for t in tables):
        return True
    upto = min(seals[t.id].heartbeat_us for t in tables)
    now = clock()
    if beat_due and upto < now - SHARED_SEAL_US:
        return True
    if end is not None and upto < end <= now:
        return True
    return partition.end_us is not None and upto < partition.end_us - 1


def _gone(stream: ChangeStreamRecord) -> ObjectNotFoundError:
    return ObjectNotFoundError(
        f"change stream {stream.full_name} was dropped or replaced during the read; its "
        "partitions ended with it"
    )


def _versions(
    catalog: Catalog, stream: ChangeStreamRecord, table: TableInfo, after: int, sealed: int,
    start: int, limit: int, progress: dict[int, int], ended: dict[int, int], last: int | None,
) -> Iterator[tuple[int, str, int, int]]:  # fmt: skip
    """``(timestamp, table name, table id, version)`` of the sealed versions of ``table`` after
    ``after`` up to ``limit``, in order; ``progress`` follows what was handed out. A table
    watched up to ``last`` only is ``ended`` there once a version after it is found."""
    label = table_label(stream, table)
    for version, moment in timestamps(catalog, table, after, sealed).items():
        if last is not None and moment > last:
            ended[table.id] = last
        if moment > limit:
            return
        if moment >= start:
            yield moment, label, table.id, version
        progress[table.id] = version


class _Watch:
    """What one read watches as it goes: the stream's history and the tables it names
    from the read's start on, with each table's reading progress."""

    def __init__(self, catalog: Catalog, stream: ChangeStreamRecord, start: int) -> None:
        self.catalog, self.stream, self.start = catalog, stream, start
        self.history = catalog.change_stream_history(stream.uid)
        self.current: list[TableInfo] = []
        self.past: list[tuple[TableInfo, int]] = []
        self.dropped: list[tuple[TableInfo, int]] = []
        self.progress: dict[int, int] = {}
        self.ended: dict[int, int] = {}
        self.read_at = -TABLES_EVERY_S

    def tables(self, force: bool = False) -> None:
        """Look again at the tables (a new one under ``FOR ALL``, a rename) now and then,
        or now (``force``: the history changed)."""
        if not force and time.monotonic() - self.read_at < TABLES_EVERY_S:
            return
        if not self.history:  # dropped or replaced since the read began
            raise _gone(self.stream)
        found = read_tables(self.catalog, self.history, self.start)
        self.current, self.read_at = found.current, time.monotonic()
        self.past = [(t, last) for t, last in found.past if self.ended.get(t.id) != last]
        self.dropped = found.dropped
        for table in [*self.current, *(t for t, _ in [*self.past, *self.dropped])]:
            if table.id not in self.progress:
                self.progress[table.id] = _first_version(table, self.catalog, self.start)

    def changed(self) -> bool:
        """Whether an ALTER changed the history: read after the seals, as the partitions
        are, so it knows every ALTER before their heartbeats."""
        history = self.catalog.change_stream_history(self.stream.uid)
        if history == self.history:
            return False
        if not history:
            raise _gone(self.stream)
        self.history = history
        self.tables(force=True)
        return True

    def sealing(self, seals: Mapping[int, Seal]) -> list[TableInfo]:
        """The tables the read seals: the current ones, and the dropped ones no seal
        covers up to their drop (nothing is written to them since: one seal does)."""
        return [*self.current, *(t for t, moment in self.dropped
                                 if t.id not in seals or seals[t.id].heartbeat_us < moment)]

    def found(self, seals: Mapping[int, Seal], limit: int) -> Iterator[tuple[int, str, int, int]]:
        """The sealed versions up to ``limit`` of every table, in timestamp order; of a
        past table (sealed by the ALTER that left it) up to its last moment; of a dropped
        one, every version its seals cover (those committed before its drop)."""
        watched: list[tuple[TableInfo, int | None]] = [
            (t, None) for t in [*self.current, *(t for t, _ in self.dropped)]
        ]
        return heapq.merge(*(
            _versions(self.catalog, self.stream, t, self.progress[t.id], seals[t.id].version,
                      self.start, limit if last is None else min(limit, last), self.progress,
                      self.ended, last)
            for t, last in [*watched, *self.past] if t.id in seals
        ))  # fmt: skip


def _sealed_records(
    stream: ChangeStreamRecord, watch: _Watch, seals: Mapping[int, Seal],
    tables: list[TableInfo], limit: int, partitions: list[PartitionRecord], token: str,
) -> Iterator[tuple[int, list[dict[str, Any]]]]:  # fmt: skip
    """Each moment's records of partition ``token``, of the versions sealed up to
    ``limit``: in timestamp order (tables merged), each transaction built on demand."""
    by_id = {t.id: t for t in [*tables, *(t for t, _ in [*watch.past, *watch.dropped])]}
    for moment, definition, transactions in _transactions(
        watch.found(seals, limit), watch.history, by_id
    ):
        records = [
            record for members in transactions
            for record in _records(stream, definition, members, moment,
                                   partitions).by_token.get(token, ())
        ]  # fmt: skip
        if len(transactions) > 1:  # tables' versions that share a moment by chance
            records.sort(key=_position)  # in the order of positions (the SDK's)
        yield moment, records


def _children(partition: PartitionRecord, partitions: list[PartitionRecord]) -> dict[str, Any]:
    """The child partitions record that ends an ended partition's read."""
    assert partition.end_us is not None
    children = [p for p in partitions if partition.token in p.parents]
    return ChildPartitionsRecord(
        rfc3339(partition.end_us), "00000000",
        tuple(ChildPartition(c.token, c.parents) for c in children),
    ).to_json()  # fmt: skip


def read(
    catalog: Catalog, stream: ChangeStreamRecord, args: ReadArgs,
    stop: threading.Event | None = None, until_us: int | None = None,
) -> Iterator[dict[str, Any]]:  # fmt: skip
    """The records of one read until the partition ends, the end timestamp (or
    ``until_us``: a bounded read) is passed, or ``stop`` is set. Each is built as its
    class (:mod:`ingest_sdk.change_records`) and yielded as its JSON form (``to_json``):
    every face writes it with orjson, and a version's records are cached in that form.
    A version's records follow the stream's definition at its timestamp (:mod:`.history`).

    Raises:
        ObjectNotFoundError: the stream was dropped or replaced (before or during it).
    """
    partitions = catalog.list_partitions(stream.uid)
    if args.token is None:
        yield from _first_query(partitions, args.start_us)
        return
    partition = next((p for p in partitions if p.token == args.token), None)
    if partition is None:
        raise _gone(stream)
    end = min((e for e in (args.end_us, until_us) if e is not None), default=None)
    watch = _Watch(catalog, stream, args.start_us)
    last_beat = args.start_us - 1
    quiet_since = time.monotonic()
    while stop is None or not stop.is_set():
        watch.tables()
        seals = catalog.latest_seals(watch.progress)
        tables = watch.sealing(seals)
        beat_due = time.monotonic() - quiet_since >= args.heartbeat_ms / 1000
        if _must_seal(tables, seals, partition, end, beat_due):
            sealed, _ = seal(catalog, tables)
            seals = {**seals, **sealed}
        # Read after the seals: a split or merge ends partitions in its seal's catalog
        # transaction, so this list knows every end the seals imply (and an ALTER its
        # moment, so the history read after them is final up to their heartbeats).
        partitions = catalog.list_partitions(stream.uid)
        partition = next((p for p in partitions if p.token == args.token), None)
        if partition is None:
            raise _gone(stream)
        if watch.changed():
            continue  # seal the tables it watches now first
        # A table a commit of several tables holds has no seal yet (-1: wait for it).
        upto = min((seals[t.id].heartbeat_us if t.id in seals else -1 for t in tables),
                   default=clock())  # fmt: skip
        last = None if partition.end_us is None else partition.end_us - 1
        limit = min(bound for bound in (upto, end, last) if bound is not None)
        for moment, records in _sealed_records(stream, watch, seals, tables, limit, partitions,
                                               partition.token):  # fmt: skip
            yield from records
            if records:
                quiet_since = time.monotonic()
                last_beat = max(last_beat, moment)
            if stop is not None and stop.is_set():
                return
        # The child record only if the read's range reaches the parent's last moment: a
        # read ending earlier ends with a heartbeat (below), so that the reader resumes
        # the parent, whose later records it has not had, instead of moving on.
        if (
            partition.end_us is not None
            and upto >= partition.end_us - 1
            and (end is None or end >= partition.end_us - 1)
        ):
            yield _children(partition, partitions)
            return
        if end is not None and upto >= end:
            if last_beat < end:  # the read's end, as progress a resumed read starts from
                yield HeartbeatRecord(rfc3339(end)).to_json()
            return
        if time.monotonic() - quiet_since >= args.heartbeat_ms / 1000 and limit > last_beat:
            last_beat = limit
            quiet_since = time.monotonic()
            yield HeartbeatRecord(rfc3339(limit)).to_json()
        time.sleep(POLL_S)
