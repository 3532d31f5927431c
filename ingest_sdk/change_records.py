"""The three kinds of change stream record, one class each, with their JSON form.

A change stream query returns, line by line, objects holding exactly one of
``data_change_record``, ``heartbeat_record`` and ``child_partitions_record``
(docs/change-streams.md). The service builds each record as its class and sends
``to_json()``; a reader parses a line once with :func:`record_from_json` (or a class's
``from_json``) and then works with the type. ``to_json(from_json(d)) == d`` for every
well-formed record ``d``, and ``from_json(r.to_json()) == r``.

``from_json`` checks the form, not the meaning: every field is present with its JSON
type, the mods and column types are objects of the reference's shape, timestamps are
RFC 3339, and ``mod_type``/``value_capture_type`` are among the reference's values.
Anything else is refused with :class:`~ingest_sdk.errors.MalformedRecordError`, naming
the field. Fields a newer service may add are ignored, as are keys beside the record
kind (the reader's ``partition_token``). The values of mods stay JSON values as parsed:
they are not copied, so a record built from parsed JSON shares its lists.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, TypeAlias

from ingest_sdk.errors import MalformedRecordError

__all__ = [
    "MOD_TYPES", "RECORD_KINDS", "VALUE_CAPTURE_TYPES", "ChangeRecord", "ChildPartition",
    "ChildPartitionsRecord", "DataChangeRecord", "HeartbeatRecord", "record_from_json",
    "record_kind",
]  # fmt: skip

MOD_TYPES = ("INSERT", "UPDATE", "DELETE")
VALUE_CAPTURE_TYPES = ("OLD_AND_NEW_VALUES", "NEW_VALUES", "NEW_ROW", "NEW_ROW_AND_OLD_VALUES")
_MOD_PARTS = ("keys", "new_values", "old_values")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


class _Fields:
    """Reads the fields of one record's body, each checked; errors name the field."""

    __slots__ = ("body", "where")

    def __init__(self, raw: Any, key: str) -> None:
        if not isinstance(raw, dict):
            raise MalformedRecordError(
                f"a change stream record must be a JSON object, got {_shown(raw)}"
            )
        body = raw.get(key)
        if not isinstance(body, dict):
            raise MalformedRecordError(f"{key} must be a JSON object, got {_shown(body)}")
        self.body, self.where = body, key

    def bad(self, name: str, wanted: str) -> MalformedRecordError:
        got = _shown(self.body[name]) if name in self.body else "nothing (it is missing)"
        return MalformedRecordError(f"{self.where}.{name} must be {wanted}, got {got}")

    def text(self, name: str) -> str:
        value = self.body.get(name)
        if not isinstance(value, str):
            raise self.bad(name, "text")
        return value

    def timestamp(self, name: str) -> str:
        value: Any = self.body.get(name)
        if not _is_timestamp(value):
            raise self.bad(name, "an RFC 3339 timestamp such as '2026-01-31T12:00:00.000000Z'")
        return value  # type: ignore[no-any-return]

    def flag(self, name: str) -> bool:
        value = self.body.get(name)
        if not isinstance(value, bool):
            raise self.bad(name, "true or false")
        return value

    def count(self, name: str) -> int:
        value: Any = self.body.get(name)
        if not _is_count(value):
            raise self.bad(name, "a whole number, 0 or more")
        return value

    def choice(self, name: str, allowed: tuple[str, ...]) -> str:
        value = self.body.get(name)
        if value not in allowed:
            raise self.bad(name, "one of " + ", ".join(allowed))
        return value  # type: ignore[no-any-return]

    def objects(self, name: str) -> list[Any]:
        value = self.body.get(name)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise self.bad(name, "a list of JSON objects")
        return value


def _is_timestamp(value: Any) -> bool:
    if not isinstance(value, str) or "T" not in value:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _column_type_ok(column: Any) -> bool:
    return (
        isinstance(column, dict)
        and isinstance(column.get("name"), str)
        and isinstance(column.get("type"), dict)
        and isinstance(column["type"].get("code"), str)
        and isinstance(column.get("is_primary_key"), bool)
        and _is_count(column.get("ordinal_position"))
    )


def _mod_ok(mod: Any) -> bool:
    return (
        isinstance(mod, dict)
        and isinstance(mod.get("keys"), dict)
        and isinstance(mod.get("new_values"), dict)
        and isinstance(mod.get("old_values"), dict)
    )


def _check_column_types(fields: _Fields) -> list[dict[str, Any]]:
    types = fields.objects("column_types")
    for i, column in enumerate(types):
        if not _column_type_ok(column):
            raise MalformedRecordError(
                f"{fields.where}.column_types[{i}] must hold name (text), type "
                '({"code": text}), is_primary_key (true or false) and ordinal_position '
                f"(a whole number), got {_shown(column)}"
            )
    return types


def _check_mods(fields: _Fields) -> list[dict[str, Any]]:
    mods = fields.objects("mods")
    for i, mod in enumerate(mods):
        for part in _MOD_PARTS:
            if not isinstance(mod.get(part), dict):
                raise MalformedRecordError(
                    f"{fields.where}.mods[{i}].{part} must be a JSON object, got "
                    f"{_shown(mod.get(part, 'nothing (it is missing)'))}"
                )
    return mods


@dataclass(frozen=True, slots=True)
class DataChangeRecord:
    """The changes of one transaction to one table in one partition, of one mod type.

    ``column_types`` and ``mods`` are the JSON lists as sent (see
    docs/change-streams.md for what they hold); they are not copied, and make the
    record unhashable (it compares by value).
    """

    KEY: ClassVar[str] = "data_change_record"

    commit_timestamp: str
    record_sequence: str
    server_transaction_id: str
    is_last_record_in_transaction_in_partition: bool
    table_name: str
    column_types: list[dict[str, Any]]
    mods: list[dict[str, Any]]
    mod_type: str
    value_capture_type: str
    number_of_records_in_transaction: int
    number_of_partitions_in_transaction: int
    transaction_tag: str
    is_system_transaction: bool

    def to_json(self) -> dict[str, Any]:
        """The record as sent: ``{"data_change_record": {...}}``, fields in wire order."""
        return {"data_change_record": {
            "commit_timestamp": self.commit_timestamp,
            "record_sequence": self.record_sequence,
            "server_transaction_id": self.server_transaction_id,
            "is_last_record_in_transaction_in_partition":
                self.is_last_record_in_transaction_in_partition,
            "table_name": self.table_name,
            "column_types": self.column_types,
            "mods": self.mods,
            "mod_type": self.mod_type,
            "value_capture_type": self.value_capture_type,
            "number_of_records_in_transaction": self.number_of_records_in_transaction,
            "number_of_partitions_in_transaction": self.number_of_partitions_in_transaction,
            "transaction_tag": self.transaction_tag,
            "is_system_transaction": self.is_system_transaction,
        }}  # fmt: skip

    @classmethod
    def from_json(cls, raw: Any) -> DataChangeRecord:
        """Parse ``{"data_change_record": {...}}``: one pass of checks (a reader parses
        every record); a record that fails them is checked again field by field, for
        the error that names the field.

        Raises:
            MalformedRecordError: a field is missing or not of its form.
        """
        body = raw.get(cls.KEY) if isinstance(raw, dict) else None
        if isinstance(body, dict):
            values: tuple[Any, ...] = tuple(map(body.get, _DATA_FIELDS))
            (stamp, sequence, transaction, last, table, types, mods, mod_type, capture,
             records, partitions, tag, system) = values  # fmt: skip
            if (
                _is_timestamp(stamp)
                and isinstance(sequence, str)
                and isinstance(transaction, str)
                and isinstance(last, bool)
                and isinstance(table, str)
                and isinstance(types, list)
                and all(map(_column_type_ok, types))
                and isinstance(mods, list)
                and all(map(_mod_ok, mods))
                and mod_type in MOD_TYPES
                and capture in VALUE_CAPTURE_TYPES
                and _is_count(records)
                and _is_count(partitions)
                and isinstance(tag, str)
                and isinstance(system, bool)
            ):
                return cls(*values)
        return cls._checked(raw)

    @classmethod
    def _checked(cls, raw: Any) -> DataChangeRecord:
        f = _Fields(raw, cls.KEY)
        return cls(
            f.timestamp("commit_timestamp"),
            f.text("record_sequence"),
            f.text("server_transaction_id"),
            f.flag("is_last_record_in_transaction_in_partition"),
            f.text("table_name"),
            _check_column_types(f),
            _check_mods(f),
            f.choice("mod_type", MOD_TYPES),
            f.choice("value_capture_type", VALUE_CAPTURE_TYPES),
            f.count("number_of_records_in_transaction"),
            f.count("number_of_partitions_in_transaction"),
            f.text("transaction_tag"),
            f.flag("is_system_transaction"),
        )


#: A data change record's fields, in the order they are sent.
_DATA_FIELDS = tuple(f.name for f in fields(DataChangeRecord))


@dataclass(frozen=True, slots=True)
class HeartbeatRecord:
    """Every record of the partition up to ``timestamp`` has been returned."""

    KEY: ClassVar[str] = "heartbeat_record"

    timestamp: str

    def to_json(self) -> dict[str, Any]:
        """The record as sent: ``{"heartbeat_record": {"timestamp": ...}}``."""
        return {"heartbeat_record": {"timestamp": self.timestamp}}

    @classmethod
    def from_json(cls, raw: Any) -> HeartbeatRecord:
        """Parse ``{"heartbeat_record": {...}}``.

        Raises:
            MalformedRecordError: the timestamp is missing or not RFC 3339.
        """
        return cls(_Fields(raw, cls.KEY).timestamp("timestamp"))


@dataclass(frozen=True, slots=True)
class ChildPartition:
    """A partition after the one read: its token and the partitions it follows (the
    reference writes ``[null]`` for the first query's; this service ``[]``)."""

    token: str
    parent_partition_tokens: tuple[str | None, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "parent_partition_tokens": list(self.parent_partition_tokens)}


def _child(where: str, raw: dict[str, Any]) -> ChildPartition:
    token, parents = raw.get("token"), raw.get("parent_partition_tokens")
    if not isinstance(token, str):
        raise MalformedRecordError(f"{where}.token must be text, got {_shown(token)}")
    if not isinstance(parents, list) or not all(p is None or isinstance(p, str) for p in parents):
        raise MalformedRecordError(
            f"{where}.parent_partition_tokens must be a list of tokens (text), got "
            f"{_shown(parents)}"
        )
    return ChildPartition(token, tuple(parents))


@dataclass(frozen=True, slots=True)
class ChildPartitionsRecord:
    """The partition ended: its records go on in ``child_partitions`` from
    ``start_timestamp``."""

    KEY: ClassVar[str] = "child_partitions_record"

    start_timestamp: str
    record_sequence: str
    child_partitions: tuple[ChildPartition, ...]

    def to_json(self) -> dict[str, Any]:
        """The record as sent: ``{"child_partitions_record": {...}}``."""
        return {"child_partitions_record": {
            "start_timestamp": self.start_timestamp,
            "record_sequence": self.record_sequence,
            "child_partitions": [child.to_json() for child in self.child_partitions],
        }}  # fmt: skip

    @classmethod
    def from_json(cls, raw: Any) -> ChildPartitionsRecord:
        """Parse ``{"child_partitions_record": {...}}``.

        Raises:
            MalformedRecordError: a field is missing or not of its form.
        """
        f = _Fields(raw, cls.KEY)
        where = f"{cls.KEY}.child_partitions"
        children = f.objects("child_partitions")
        return cls(
            f.timestamp("start_timestamp"),
            f.text("record_sequence"),
            tuple(_child(f"{where}[{i}]", c) for i, c in enumerate(children)),
        )


#: A record of any kind.
ChangeRecord: TypeAlias = DataChangeRecord | HeartbeatRecord | ChildPartitionsRecord
#: The record kinds by the key that holds them.
RECORD_KINDS: dict[str, type[ChangeRecord]] = {
    kind.KEY: kind for kind in (DataChangeRecord, HeartbeatRecord, ChildPartitionsRecord)
}


def record_kind(raw: Any) -> type[ChangeRecord] | None:
    """The class of a parsed JSON record, by the one kind key it holds; None for an
    object holding none (a kind this SDK does not know: readers skip it).

    Raises:
        MalformedRecordError: not a JSON object, or it holds more than one kind.
    """
    if not isinstance(raw, dict):
        raise MalformedRecordError(
            f"a change stream record must be a JSON object, got {_shown(raw)}"
        )
    found = [kind for key, kind in RECORD_KINDS.items() if key in raw]
    if len(found) > 1:
        raise MalformedRecordError(
            "a change stream record holds one of "
            f"{', '.join(RECORD_KINDS)}, this one {', '.join(k.KEY for k in found)}"
        )
    return found[0] if found else None


def record_from_json(raw: Any) -> ChangeRecord:
    """Parse one record of any kind (the object a query returns, or the dict a
    :class:`~ingest_sdk.ChangeStreamReader` hands its callback).

    Raises:
        MalformedRecordError: not a record of a known kind, or a field not of its form.
    """
    kind = record_kind(raw)
    if kind is None:
        raise MalformedRecordError(
            f"a change stream record holds one of {', '.join(RECORD_KINDS)}; this one has "
            f"{_shown(sorted(raw)[:5])}"
        )
    return kind.from_json(raw)
