"""Change streams in the SQLite catalog: their own namespace per schema (a change stream
is read through its function, ``READ_<name>``, never as a table, so it may share a name
with one)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from catalog.base import ObjectAlreadyExistsError, TableBusyError
from catalog.records import (
    EXCLUDE_OPTIONS,
    KEY_SPACE,
    AlterSeal,
    ChangeStreamDefinition,
    ChangeStreamRecord,
    PartitionRecord,
    Seal,
    held_tables,
)
from catalog.sqlite_layout import (
    CHANGE_STREAM_COLUMNS,
    DEFINITION_COLUMNS,
    ORPHAN_HISTORY,
    ORPHAN_PARTITIONS,
    PARTITION_COLUMNS,
    IntegrityError,
    namespace_statements,
    replacing,
)

if TYPE_CHECKING:
    from catalog.sqlite import _Transaction

__all__ = ["ChangeStreamStore", "Repartition", "SealCompute", "seal_commit"]

#: Given the tables' newest seals, their new ones (read inside the write transaction).
SealCompute = Callable[[dict[int, Seal]], dict[int, Seal]]
#: Given the new heartbeat and the stream's partitions: the tokens to end at the
#: heartbeat + 1 and the partitions that follow them.
Repartition = Callable[
    [int, list[PartitionRecord]], tuple[Sequence[str], Sequence[PartitionRecord]]
]
#: Seals older than the longest retention (and a day) are forgotten; so are entries of
#: a stream's history superseded that long ago (whatever its retention becomes).
_SEAL_KEPT_US = 31 * 86_400 * 1_000_000


#: A stream's partitions, oldest first.
_LINEAGE = (
    f"SELECT {PARTITION_COLUMNS} FROM change_stream_partitions WHERE stream_uid=?"
    " ORDER BY start_us, lo"
)


def _latest_query(table_ids: Iterable[int]) -> tuple[str, tuple[int, ...]]:
    """The query of the tables' newest seals (their newest version, highest heartbeat)."""
    ids = tuple(sorted(set(table_ids)))
    return (
        "SELECT table_id, max(version), max(heartbeat_us) FROM change_stream_seals"
        f" WHERE table_id IN ({', '.join('?' * len(ids))}) GROUP BY table_id",
        ids,
    )


def _latest(rows: Iterable[tuple[Any, ...]]) -> dict[int, Seal]:
    return {row[0]: Seal(row[1], row[2]) for row in rows}


def _partition(row: tuple[Any, ...]) -> PartitionRecord:
    values = list(row)
    values[6] = tuple(orjson.loads(values[6]))
    return PartitionRecord(*values)


def _insert_partitions(db: sqlite3.Connection, partitions: Iterable[PartitionRecord]) -> None:
    db.executemany(
        f"INSERT INTO change_stream_partitions ({PARTITION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(p.token, p.stream_uid, p.lo, p.hi, p.start_us, p.end_us,
          orjson.dumps(list(p.parents)).decode()) for p in partitions],
    )  # fmt: skip


def _record(row: tuple[Any, ...]) -> ChangeStreamRecord:
    values = list(row)
    values[4] = bool(values[4])
    values[5] = tuple(orjson.loads(values[5]))
    values[11] = tuple((int(t), tuple(c)) for t, c in orjson.loads(values[11] or "[]"))
    values[12] = tuple((str(o), bool(on)) for o, on in orjson.loads(values[12] or "[]"))
    return ChangeStreamRecord(*values)


def _definition(row: tuple[Any, ...]) -> ChangeStreamDefinition:
    """A history row: ``from_us`` then :data:`DEFINITION_COLUMNS`."""
    from_us, for_all, table_ids, capture, lists, exclusions = row
    return ChangeStreamDefinition(
        from_us, bool(for_all), tuple(orjson.loads(table_ids)), capture,
        tuple((int(t), tuple(c)) for t, c in orjson.loads(lists or "[]")),
        tuple((str(o), bool(on)) for o, on in orjson.loads(exclusions or "[]")),
    )  # fmt: skip


#: A stream's history, oldest first; a stream made before histories were kept (no row)
#: has its current definition since its creation.
_HISTORY = (
    f"SELECT from_us, {DEFINITION_COLUMNS} FROM change_stream_history WHERE stream_uid=?"
    f" UNION ALL SELECT created_us, {DEFINITION_COLUMNS} FROM change_streams WHERE uid=?"
    " AND NOT EXISTS (SELECT 1 FROM change_stream_history WHERE stream_uid=?) ORDER BY 1"
)
#: Append the stream's current definition to its history, from a moment (the row of a
#: stream made before histories were kept goes in first, from its creation).
_APPEND_HISTORY = (
    f"INSERT INTO change_stream_history (stream_uid, from_us, {DEFINITION_COLUMNS})"
    f" SELECT uid, ?, {DEFINITION_COLUMNS} FROM change_streams WHERE id=?"
    f" {replacing('stream_uid, from_us', f'stream_uid, from_us, {DEFINITION_COLUMNS}')}"
)
_LEGACY_HISTORY = (
    f"INSERT INTO change_stream_history (stream_uid, from_us, {DEFINITION_COLUMNS})"
    f" SELECT uid, created_us, {DEFINITION_COLUMNS} FROM change_streams WHERE id=? AND NOT"
    " EXISTS (SELECT 1 FROM change_stream_history h WHERE h.stream_uid = change_streams.uid)"
)


def _held(db: sqlite3.Connection, table_ids: Iterable[int]) -> dict[int, int]:
    """The tables among ``table_ids`` a decided commit of several tables is rolling
    forward, each with that commit's id: they are sealed only by its end
    (:func:`seal_commit`), which gives all of its versions one timestamp."""
    wanted, held = set(table_ids), {}
    for commit_id, plan in db.execute("SELECT id, plan FROM pending_commits WHERE state='decided'"):
        held.update(dict.fromkeys(held_tables(orjson.loads(plan)) & wanted, commit_id))
    return held


def _write_seal(db: sqlite3.Connection, table_id: int, version: int, heartbeat_us: int) -> None:
    db.execute(
        "INSERT INTO change_stream_seals VALUES (?, ?, ?, ?) ON CONFLICT (table_id,"
        " version) DO UPDATE SET heartbeat_us=CASE WHEN excluded.heartbeat_us >"
        " change_stream_seals.heartbeat_us THEN excluded.heartbeat_us"
        " ELSE change_stream_seals.heartbeat_us END",
        (table_id, version, heartbeat_us, heartbeat_us),
    )
    db.execute(
        "DELETE FROM change_stream_seals WHERE table_id=? AND heartbeat_us < ? AND version < ?",
        (table_id, heartbeat_us - _SEAL_KEPT_US, version),
    )


def _seal(
    db: sqlite3.Connection, table_ids: Iterable[int], compute: SealCompute, strict: bool = False
) -> dict[int, Seal]:
    """Write the seals ``compute`` makes from the tables' newest ones (and forget the
    seals older than any retention). A table a commit holds (:func:`_held`) keeps its
    newest seal, or with ``strict`` (a seal that must cover every table) none is written.

    Raises:
        TableBusyError: ``strict`` and a table is held.
    """
    table_ids = list(table_ids)
    latest = _latest(db.execute(*_latest_query(table_ids)).fetchall())
    held = _held(db, table_ids)
    if held and strict:
        raise TableBusyError(sorted(held), sorted(set(held.values())))
    sealed = {t: s for t, s in compute(latest).items() if t not in held}
    for table_id, seal in sealed.items():
        _write_seal(db, table_id, seal.version, seal.heartbeat_us)
    return {**{t: latest[t] for t in held if t in latest}, **sealed}


def _watched(db: sqlite3.Connection, table_ids: Iterable[int]) -> set[int]:
    """The tables among ``table_ids`` a change stream watches now."""
    wanted, found = set(table_ids), set()
    for for_all, ids in db.execute("SELECT for_all, table_ids FROM change_streams"):
        if for_all:
            return wanted
        found |= wanted & set(orjson.loads(ids))
    return found


def seal_commit(
    db: sqlite3.Connection, plan: Mapping[str, Any], versions: Mapping[int, int], floor_us: int
) -> None:
    """Inside the end of a decided commit of several tables (``versions``: the version
    it wrote in each): seal each watched one just before and at its version, all at one
    heartbeat S, so that every version has the change stream timestamp S (one moment
    for the transaction). Its tables were held since the decision, so no seal covers
    those versions yet; if one does (a commit decided by an older release), nothing is
    written and each version keeps a timestamp of its own."""
    written = held_tables(plan)
    if not written or not written <= set(versions):
        return
    tables = {t: versions[t] for t in _watched(db, written)}
    if not tables:
        return
    latest = _latest(db.execute(*_latest_query(tables)).fetchall())
    if any(seal.version >= tables[t] for t, seal in latest.items()):
        return
    stamp = max([floor_us, *(s.heartbeat_us + tables[t] - s.version for t, s in latest.items())])
    for table_id, version in tables.items():
        _write_seal(db, table_id, version - 1, stamp - 1)
        _write_seal(db, table_id, version, stamp)


def _lists_text(column_lists: Iterable[tuple[int, Sequence[str]]]) -> str:
    return orjson.dumps([[t, list(c)] for t, c in column_lists]).decode()


def _exclusions_text(exclusions: Mapping[str, bool]) -> str:
    """The explicit ``exclude_*`` options, in :data:`EXCLUDE_OPTIONS` order."""
    return orjson.dumps([[o, exclusions[o]] for o in EXCLUDE_OPTIONS if o in exclusions]).decode()


class ChangeStreamStore:
    """The change-stream half of :class:`catalog.sqlite.SqliteCatalog` (a mixin)."""

    if TYPE_CHECKING:

        def _immediate(self) -> _Transaction: ...
        def _read(self, sql: str, args: tuple = ()) -> list[tuple]: ...  # type: ignore[type-arg]

    def create_change_stream(
        self, database: str, schema_name: str, name: str, *, for_all: bool,
        table_ids: tuple[int, ...], value_capture_type: str, retention_s: int,
        created_us: int, replace: bool = False, partitions: int = 1,
        column_lists: Sequence[tuple[int, Sequence[str]]] = (),
        exclusions: Mapping[str, bool] | None = None,
    ) -> ChangeStreamRecord:  # fmt: skip
        key = (database, schema_name, name)
        now = time.time()
        uid = uuid.uuid4().hex
        width = KEY_SPACE // partitions
        first = [
            PartitionRecord(uuid.uuid4().hex, uid, i * width,
                            KEY_SPACE if i == partitions - 1 else (i + 1) * width,
                            created_us, None, ())
            for i in range(partitions)
        ]  # fmt: skip
        with self._immediate() as db:
            if replace:
                db.execute(
                    "DELETE FROM change_streams WHERE database=? AND schema_name=? AND name=?",
                    key,
                )
            for sql, args in namespace_statements(database, schema_name, now):
                db.execute(sql, args)
            try:
                db.execute(
                    "INSERT INTO change_streams (database, schema_name, name, for_all, "
                    "table_ids, value_capture_type, retention_s, created_at, created_us, uid,"
                    " column_lists, exclusions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*key, int(for_all), orjson.dumps(list(table_ids)).decode(),
                     value_capture_type, retention_s, now, created_us, uid,
                     _lists_text(column_lists), _exclusions_text(exclusions or {})),
                )  # fmt: skip
            except IntegrityError as exc:
                raise ObjectAlreadyExistsError(
                    f"change stream {'.'.join(key)} already exists; use CREATE OR REPLACE "
                    "CHANGE STREAM to replace it, or IF NOT EXISTS to keep it"
                ) from exc
            db.execute(ORPHAN_PARTITIONS)
            db.execute(ORPHAN_HISTORY)
            _insert_partitions(db, first)
            stream_id = db.execute(
                "SELECT id FROM change_streams WHERE database=? AND schema_name=? AND name=?", key
            ).fetchone()[0]
            db.execute(_APPEND_HISTORY, (created_us, stream_id))
        found = self.get_change_stream(database, schema_name, name)
        assert found is not None
        return found

    def get_change_stream(
        self, database: str, schema_name: str, name: str
    ) -> ChangeStreamRecord | None:
        rows = self._read(
            f"SELECT {CHANGE_STREAM_COLUMNS} FROM change_streams "
            "WHERE database=? AND schema_name=? AND name=?",
            (database, schema_name, name),
        )
        return _record(rows[0]) if rows else None

    def list_change_streams(self) -> list[ChangeStreamRecord]:
        rows = self._read(
            f"SELECT {CHANGE_STREAM_COLUMNS} FROM change_streams "
            "ORDER BY database, schema_name, name"
        )
        return [_record(row) for row in rows]

    def alter_change_stream(
        self, stream_id: int, *, for_all: bool | None = None,
        table_ids: tuple[int, ...] | None = None, value_capture_type: str | None = None,
        retention_s: int | None = None,
        column_lists: Sequence[tuple[int, Sequence[str]]] | None = None,
        exclusions: Mapping[str, bool] | None = None, at_seal: AlterSeal | None = None,
    ) -> bool:  # fmt: skip
        """Change what the stream watches or its options (``exclusions`` are merged into
        those set before), in one catalog transaction; False if it is gone. With
        ``at_seal``, the new definition joins the stream's history from the seal's moment
        (:class:`AlterSeal`); a retention change alone needs none.

        Raises:
            ValueError: the stream was altered since ``at_seal.expected`` was read.
        """
        changes: dict[str, Any] = {}
        if for_all is not None:
            changes["for_all"] = int(for_all)
        if table_ids is not None:
            changes["table_ids"] = orjson.dumps(list(table_ids)).decode()
            changes["column_lists"] = _lists_text(column_lists or ())
        if value_capture_type is not None:
            changes["value_capture_type"] = value_capture_type
        if retention_s is not None:
            changes["retention_s"] = retention_s
        with self._immediate() as db:
            found = db.execute(
                f"SELECT {CHANGE_STREAM_COLUMNS} FROM change_streams WHERE id=?", (stream_id,)
            ).fetchone()
            if found is None:
                return False
            current = _record(found)
            if exclusions:
                changes["exclusions"] = _exclusions_text({**dict(current.exclusions),
                                                          **exclusions})  # fmt: skip
            if at_seal is not None:
                history = [_definition(r) for r in db.execute(_HISTORY, (current.uid,) * 3)]
                if history[-1] != at_seal.expected:
                    raise ValueError(f"change stream {current.full_name} was altered meanwhile")
                sealed = _seal(db, at_seal.table_ids, at_seal.compute, strict=True)
                heartbeat = max([at_seal.floor_us, *(x.heartbeat_us for x in sealed.values())])
                moment = max(heartbeat + 1, history[-1].from_us + 1)
                db.execute(_LEGACY_HISTORY, (stream_id,))
            assignments = ", ".join(f"{column}=?" for column in changes) or "id=id"
            db.execute(f"UPDATE change_streams SET {assignments} WHERE id=?",
                       (*changes.values(), stream_id))  # fmt: skip
            if at_seal is not None:
                db.execute(_APPEND_HISTORY, (moment, stream_id))
                db.execute(
                    "DELETE FROM change_stream_history WHERE stream_uid=? AND from_us < (SELECT"
                    " max(from_us) FROM change_stream_history WHERE stream_uid=? AND from_us < ?)",
                    (current.uid, current.uid, moment - _SEAL_KEPT_US),
                )
            return True

    def change_stream_history(self, stream_uid: str) -> list[ChangeStreamDefinition]:
        """The stream's definitions, oldest first, each in force from its ``from_us``."""
        return [_definition(row) for row in self._read(_HISTORY, (stream_uid,) * 3)]

    def drop_change_stream(self, stream_id: int) -> bool:
        with self._immediate() as db:
            dropped = db.execute("DELETE FROM change_streams WHERE id=?", (stream_id,)).rowcount
            db.execute(ORPHAN_PARTITIONS)
            db.execute(ORPHAN_HISTORY)
            return dropped == 1

    def list_partitions(self, stream_uid: str) -> list[PartitionRecord]:
        return [_partition(row) for row in self._read(_LINEAGE, (stream_uid,))]

    def latest_seals(self, table_ids: Iterable[int]) -> dict[int, Seal]:
        return _latest(self._read(*_latest_query(table_ids)))

    def seals_between(self, table_id: int, after: int, to: int) -> list[Seal]:
        """The seals of versions in ``[after, to]``, the last one before ``after`` and the
        first one at or after ``to``, oldest first."""
        rows = self._read(
            "SELECT version, heartbeat_us, covers_us FROM change_stream_seals WHERE table_id=?"
            " AND version >= coalesce((SELECT max(version) FROM change_stream_seals"
            " WHERE table_id=? AND version < ?), ?) AND version <= coalesce((SELECT"
            " min(version) FROM change_stream_seals WHERE table_id=? AND version >= ?), ?)"
            " ORDER BY version",
            (table_id, table_id, after, after, table_id, to, to),
        )
        return [Seal(*row) for row in rows]

    def seal_tables(
        self, table_ids: Iterable[int], compute: SealCompute,
        stream_uid: str | None = None, repartition: Repartition | None = None,
        floor_us: int = 0,
    ) -> tuple[dict[int, Seal], list[PartitionRecord]]:  # fmt: skip
        """Seal tables in one write transaction: ``compute`` gets their newest seals and
        returns the new ones (it reads the tables' logs while no other seal can land).
        With ``repartition``, the partitions of ``stream_uid`` it names end at the new
        heartbeat + 1 (the new seals' heartbeat, at least ``floor_us``), where the
        partitions it returns start, in the same transaction.

        Returns the seals written and the new partitions.

        Raises:
            ValueError: a partition to end is not open (another repartition ended it).
            TableBusyError: with ``repartition``, a decided commit holds a table.
        """
        with self._immediate() as db:
            sealed = _seal(db, table_ids, compute, strict=repartition is not None)
            if repartition is None or stream_uid is None:
                return sealed, []
            heartbeat = max([floor_us, *(s.heartbeat_us for s in sealed.values())])
            current = [_partition(row) for row in db.execute(_LINEAGE, (stream_uid,))]
            ended, added = repartition(heartbeat, current)
            for token in ended:
                if (
                    db.execute(
                        "UPDATE change_stream_partitions SET end_us=? WHERE token=? AND"
                        " stream_uid=? AND end_us IS NULL",
                        (heartbeat + 1, token, stream_uid),
                    ).rowcount
                    != 1
                ):
                    raise ValueError(f"partition {token} is not open")
            _insert_partitions(db, added)
            return sealed, list(added)
