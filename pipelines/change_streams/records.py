"""Data change records: a transaction's change feed as the reference's JSON records.

A transaction is one version of each table it wrote (one, but for a SQL transaction
that wrote several). A version's change feed (inserts, deletes, update pre-
and post-images) becomes one *mod* per changed row: an update whose images are equal
(copy-on-write noise) is none, and an update that changes the primary key is a DELETE
of the old key and an INSERT of the new one. A mod's ``keys`` are the table's primary
key columns, or the hidden row id (``METADATA$ROW_ID``) for a table without one. What
``new_values``/``old_values`` hold follows the value capture type:

============================  ====================  ==================================
type                          new_values            old_values
============================  ====================  ==================================
OLD_AND_NEW_VALUES (default)  changed columns       the same columns, before
NEW_VALUES                    changed columns       nothing
NEW_ROW                       every column          nothing
NEW_ROW_AND_OLD_VALUES        every column          changed columns, before
============================  ====================  ==================================

(an INSERT changes every column; a DELETE's "new" side is empty; "every column" is every
column a stream's column list names, when the table has one, and an UPDATE that changed
none of them is no mod). ``column_types`` lists
the key columns and the columns an UPDATE changed; every column for an INSERT, a
DELETE, and any change under the NEW_ROW types. Mods of one partition, table, type and
column set share a record, at most
:data:`MODS_PER_RECORD` of them. Values are JSON: integers as numbers, decimals as
text, timestamps as RFC 3339 text in UTC with microseconds, binary as base64, and
VARIANT, OBJECT and ARRAY values as the JSON they hold, embedded as stored
(``orjson.Fragment``: numbers of any size stay exact; records are written with orjson).
"""

from __future__ import annotations

import base64
import bisect
import gc
import math
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from catalog import PartitionRecord, TableInfo
from flush.tables import ROW_ID_COLUMN
from ingest_sdk.change_records import DataChangeRecord
from ingest_sdk.column_types import ColumnType, TypeKind

__all__ = [
    "MODS_PER_RECORD", "ROW_ID_KEY", "RecordCache", "TableChange", "VersionRecords",
    "json_values", "key_hash", "partition_of", "rfc3339", "transaction_records",
    "version_records",
]  # fmt: skip

MODS_PER_RECORD = 1000
#: The key of rows of a table without a primary key.
ROW_ID_KEY = "METADATA$ROW_ID"

_CODES = {
    TypeKind.FLOAT: "FLOAT64", TypeKind.VARCHAR: "STRING", TypeKind.BINARY: "BYTES",
    TypeKind.BOOLEAN: "BOOL", TypeKind.DATE: "DATE", TypeKind.TIME: "TIME",
    TypeKind.TIMESTAMP_NTZ: "TIMESTAMP", TypeKind.TIMESTAMP_LTZ: "TIMESTAMP",
    TypeKind.TIMESTAMP_TZ: "TIMESTAMP", TypeKind.VARIANT: "JSON", TypeKind.OBJECT: "JSON",
}  # fmt: skip


#: Columns holding JSON text (canonical: equal values are equal text).
_JSON_KINDS = (TypeKind.VARIANT, TypeKind.OBJECT, TypeKind.ARRAY)
#: The order of a transaction's mods by kind (stable: by row id within a kind).
_KIND_ORDER = {"DELETE": 0, "UPDATE": 1, "INSERT": 2}
#: Integers a record holds as JSON numbers (others as text: JSON readers lose them).
_INT64 = (-(2**63), 2**63 - 1)


def rfc3339(micros: int) -> str:
    """A timestamp in µs since the epoch as ``2022-09-27T12:30:00.123456Z``."""
    return datetime.fromtimestamp(micros / 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _type(column: ColumnType) -> dict[str, Any]:
    if column.kind is TypeKind.NUMBER:
        return {"code": "INT" if column.scale == 0 else "NUMERIC"}
    if column.kind is TypeKind.ARRAY:
        return {"code": "ARRAY", "array_element_type": {"code": "JSON"}}
    return {"code": _CODES[column.kind]}


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def json_values(values: pa.ChunkedArray | pa.Array, column: ColumnType) -> list[Any]:
    """A column's values as JSON-ready Python values (see the module docstring)."""
    kind, arrow = column.kind, values.type
    if pa.types.is_timestamp(arrow):
        if arrow.tz is not None:
            values = values.cast(pa.timestamp("us", "UTC"))
        return pc.strftime(values.cast(pa.timestamp("us")), "%Y-%m-%dT%H:%M:%SZ").to_pylist()
    if kind in (TypeKind.DATE, TypeKind.TIME) or pa.types.is_decimal(arrow):
        if pa.types.is_decimal(arrow) and column.scale == 0:
            try:
                return values.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]
            except pa.ArrowInvalid:  # some beyond 64 bits: those alone as exact text
                return [None if v is None else int(v) if _INT64[0] <= v <= _INT64[1]
                        else format(v, "f") for v in values.to_pylist()]  # fmt: skip
        return values.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
    if kind is TypeKind.BINARY:
        return [None if v is None else base64.b64encode(v).decode() for v in values.to_pylist()]
    if kind in _JSON_KINDS:  # the stored canonical JSON as is: parsing would round
        return [None if v is None else orjson.Fragment(v) for v in values.to_pylist()]
    if kind is TypeKind.FLOAT:
        return [_finite(v) for v in values.to_pylist()]
    return values.to_pylist()  # type: ignore[no-any-return]


def _same(a: Any, b: Any) -> bool:
    """Equal values; floats by their bits (-0.0 is not 0.0, NaN is NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b) and (
            a == b or (math.isnan(a) and math.isnan(b))
        )
    return bool(a == b) and type(a) is type(b)


def key_hash(key: list[Any]) -> int:
    """A key's place in the partitions' key space, [0, 2**32)."""
    return zlib.crc32(orjson.dumps(key))


def partition_of(partitions: Sequence[PartitionRecord]) -> Callable[[list[Any]], str]:
    """The token of the partition among ``partitions`` (adjacent key ranges covering the
    key space: those open at one moment) that holds a key (its JSON-ready values)."""
    ordered = sorted(partitions, key=lambda p: p.lo)
    bounds = [p.lo for p in ordered]
    return lambda key: ordered[bisect.bisect_right(bounds, key_hash(key)) - 1].token


@dataclass(frozen=True, slots=True)
class VersionRecords:
    """The data change records of one table version, by partition token, in order."""

    timestamp_us: int
    by_token: dict[str, list[dict[str, Any]]]
    mods: int


def _columns(table: TableInfo) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """(key column names, value column names, column_types of every column)."""
    key = list(table.primary_key)
    names = table.schema.names
    types = [
        {"name": c.name, "type": _type(c.type), "is_primary_key": c.name in key,
         "ordinal_position": i + 1}
        for i, c in enumerate(table.schema)
    ]  # fmt: skip
    if not key:
        key = [ROW_ID_KEY]
        types.insert(0, {"name": ROW_ID_KEY, "type": {"code": "INT64"}, "is_primary_key": True,
                         "ordinal_position": 0, "is_row_id": True})  # fmt: skip
    return key, [n for n in names if n not in key], types


def _mods(
    table: TableInfo, events: pa.Table, capture: str, watched: Sequence[str] | None
) -> list[tuple[str, tuple[str, ...], dict[str, Any], list[Any]]]:
    """``(mod_type, value columns, mod, key)`` of one version's events, by row id; of the
    ``watched`` value columns only (None: all), in the table's order."""
    key, value_columns, _ = _columns(table)
    if watched is not None:
        value_columns = [c for c in value_columns if c in watched]
    events = events.sort_by([(ROW_ID_COLUMN, "ascending"), ("_change_type", "descending")])
    columns = {c.name: json_values(events.column(c.name), c.type) for c in table.schema}
    columns[ROW_ID_KEY] = events.column(ROW_ID_COLUMN).to_pylist()
    # What a pre- and a post-image are compared by: the JSON values, but for JSON
    # columns their text (a Fragment only equals itself).
    compared = {**columns, **{c.name: events.column(c.name).to_pylist()
                              for c in table.schema if c.type.kind in _JSON_KINDS}}  # fmt: skip
    kinds = events.column("_change_type").to_pylist()
    ids = columns[ROW_ID_KEY]
    full_row = capture in ("NEW_ROW", "NEW_ROW_AND_OLD_VALUES")
    out: list[tuple[str, tuple[str, ...], dict[str, Any], list[Any]]] = []

    def emit(kind: str, at: int, before: int | None, changed: Sequence[str]) -> None:
        keys = [columns[k][at] for k in key]
        new: dict[str, Any] = {}
        old: dict[str, Any] = {}
        if kind != "DELETE":
            new = {c: columns[c][at] for c in (value_columns if full_row else changed)}
        if before is not None and capture in ("OLD_AND_NEW_VALUES", "NEW_ROW_AND_OLD_VALUES"):
            old = {c: columns[c][before] for c in changed}
        listed = tuple(value_columns) if full_row else tuple(changed)
        out.append((kind, listed, {"keys": dict(zip(key, keys, strict=True)),
                                   "new_values": new, "old_values": old}, keys))  # fmt: skip

    index, count = 0, len(kinds)
    while index < count:
        kind = kinds[index]
        if kind == "insert":
            emit("INSERT", index, None, value_columns)
        elif kind == "delete":
            emit("DELETE", index, index, value_columns)
        elif kind == "update_preimage" and index + 1 < count and ids[index + 1] == ids[index]:
            post = index + 1
            if any(not _same(compared[k][index], compared[k][post]) for k in key):
                emit("DELETE", index, index, value_columns)
                emit("INSERT", post, None, value_columns)
            else:
                changed = [
                    c for c in value_columns if not _same(compared[c][index], compared[c][post])
                ]
                if changed:
                    emit("UPDATE", post, index, changed)
            index += 1
        index += 1
    return out


@dataclass(frozen=True, slots=True)
class TableChange:
    """One table's part of a transaction: its version's change feed (``events``), the
    name records give it, and the value columns a column list names (None: all)."""

    table: TableInfo
    events: pa.Table
    table_name: str
    watched: Sequence[str] | None = None


def version_records(
    table: TableInfo, events: pa.Table, capture: str, timestamp_us: int,
    transaction_id: str, tag: str, system: bool, partitions: Sequence[PartitionRecord],
    table_name: str, watched: Sequence[str] | None = None,
    excluded: frozenset[str] = frozenset(),
) -> VersionRecords:  # fmt: skip
    """The records of a transaction that wrote one table (:func:`transaction_records`)."""
    return transaction_records([TableChange(table, events, table_name, watched)], capture,
                               timestamp_us, transaction_id, tag, system, partitions,
                               excluded)  # fmt: skip


def transaction_records(
    changes: Sequence[TableChange], capture: str, timestamp_us: int, transaction_id: str,
    tag: str, system: bool, partitions: Sequence[PartitionRecord],
    excluded: frozenset[str] = frozenset(),
) -> VersionRecords:  # fmt: skip
    """The records of one transaction (a version of each table it wrote, ``changes``) in
    every partition of ``partitions`` (those open at ``timestamp_us``): numbered across
    its tables and partitions, and counted over all of them.

    An UPDATE that changed none of a table's ``watched`` columns is no mod. Mods of the
    ``excluded`` types are left out before records are made, so the transaction's count
    and sequence numbers are those of the records emitted (Spanner's filters leave
    nothing to count either)."""
    token_of = partition_of(partitions)
    groups: OrderedDict[tuple[str, str, str, tuple[str, ...]], list[dict[str, Any]]]
    groups = OrderedDict()
    types_of: dict[str, list[dict[str, Any]]] = {}
    mods = 0
    for change in changes:
        types_of[change.table_name] = _columns(change.table)[2]
        # A table's DELETEs come first, its INSERTs last: a key one row left and another
        # took is deleted before it is inserted, whichever row has the lower id (applied
        # in record_sequence order, the records give the key's state after the version).
        made = _mods(change.table, change.events, capture, change.watched)
        kept = sorted((m for m in made if m[0] not in excluded),
                      key=lambda mod: _KIND_ORDER[mod[0]])  # fmt: skip
        mods += len(kept)
        for kind, listed, mod, key in kept:
            groups.setdefault((token_of(key), change.table_name, kind, listed), []).append(mod)
    chunks = [
        (group, entries[start : start + MODS_PER_RECORD])
        for group, entries in groups.items()
        for start in range(0, len(entries), MODS_PER_RECORD)
    ]
    tokens = {group[0] for group, _ in chunks}
    last_of: dict[str, int] = {group[0]: i for i, (group, _) in enumerate(chunks)}
    stamp = rfc3339(timestamp_us)
    by_token: dict[str, list[dict[str, Any]]] = {}
    for sequence, ((token, name, kind, listed), entries) in enumerate(chunks):
        shown = set(listed)
        by_token.setdefault(token, []).append(DataChangeRecord(
            commit_timestamp=stamp,
            record_sequence=f"{sequence:08d}",
            server_transaction_id=transaction_id,
            is_last_record_in_transaction_in_partition=last_of[token] == sequence,
            table_name=name,
            column_types=[t for t in types_of[name] if t["is_primary_key"] or t["name"] in shown],
            mods=entries,
            mod_type=kind,
            value_capture_type=capture,
            number_of_records_in_transaction=len(chunks),
            number_of_partitions_in_transaction=len(tokens),
            transaction_tag=tag,
            is_system_transaction=system,
        ).to_json())  # fmt: skip
    return VersionRecords(timestamp_us, by_token, mods)


class RecordCache:
    """Records of recent versions, shared by the partitions' readers of one process (each
    version is read and converted once, not once per partition). Bounded by mods."""

    def __init__(self, max_mods: int = 1_000_000) -> None:
        self._entries: OrderedDict[tuple[Any, ...], VersionRecords] = OrderedDict()
        self._mods = 0
        self._max = max_mods
        self._lock = threading.Lock()
        self._building: dict[tuple[Any, ...], threading.Lock] = {}

    def get(self, key: tuple[Any, ...], build: Callable[[], VersionRecords]) -> VersionRecords:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                return found
            building = self._building.setdefault(key, threading.Lock())
        with building:  # one reader builds; the others wait for it
            with self._lock:
                found = self._entries.get(key)
            if found is not None:
                return found
            # The cyclic collector paused while a version's records are made: they are
            # millions of small objects (no cycles) whose allocation would otherwise run
            # full collections over the whole cache again and again.
            collecting = gc.isenabled()
            gc.disable()
            try:
                made = build()
            except BaseException:
                with self._lock:
                    self._building.pop(key, None)
                raise
            finally:
                if collecting:
                    gc.enable()
            with self._lock:
                self._entries[key] = made
                self._mods += made.mods
                self._building.pop(key, None)
                while self._mods > self._max and len(self._entries) > 1:
                    _, dropped = self._entries.popitem(last=False)
                    self._mods -= dropped.mods
            return made
