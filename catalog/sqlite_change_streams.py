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

from catalog.base import ObjectAlreadyExistsError
from catalog.records import (
    EXCLUDE_OPTIONS,
    KEY_SPACE,
    ChangeStreamRecord,
    PartitionRecord,
    Seal,
)
from catalog.sqlite_layout import (
    CHANGE_STREAM_COLUMNS,
    ORPHAN_PARTITIONS,
    PARTITION_COLUMNS,
    namespace_statements,
)

if TYPE_CHECKING:
    from catalog.sqlite import _Transaction

__all__ = ["ChangeStreamStore", "Repartition", "SealCompute"]

#: Given the tables' newest seals, their new ones (read inside the write transaction).
SealCompute = Callable[[dict[int, Seal]], dict[int, Seal]]
#: Given the new heartbeat and the stream's partitions: the tokens to end at the
#: heartbeat + 1 and the partitions that follow them.
Repartition = Callable[
    [int, list[PartitionRecord]], tuple[Sequence[str], Sequence[PartitionRecord]]
]
#: Seals older than the longest retention (and a day) are forgotten.
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
            except sqlite3.IntegrityError as exc:
                raise ObjectAlreadyExistsError(
                    f"change stream {'.'.join(key)} already exists; use CREATE OR REPLACE "
                    "CHANGE STREAM to replace it, or IF NOT EXISTS to keep it"
                ) from exc
            db.execute(ORPHAN_PARTITIONS)
            _insert_partitions(db, first)
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
        exclusions: Mapping[str, bool] | None = None,
    ) -> bool:  # fmt: skip
        """Change what the stream watches or its options (``exclusions`` are merged into
        those set before); False if it is gone."""
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
            if exclusions:
                found = db.execute(
                    "SELECT exclusions FROM change_streams WHERE id=?", (stream_id,)
                ).fetchone()
                before = dict(orjson.loads(found[0] or "[]")) if found else {}
                changes["exclusions"] = _exclusions_text({**before, **exclusions})
            assignments = ", ".join(f"{column}=?" for column in changes) or "id=id"
            return db.execute(
                f"UPDATE change_streams SET {assignments} WHERE id=?",
                (*changes.values(), stream_id),
            ).rowcount == 1  # fmt: skip

    def drop_change_stream(self, stream_id: int) -> bool:
        with self._immediate() as db:
            dropped = db.execute("DELETE FROM change_streams WHERE id=?", (stream_id,)).rowcount
            db.execute(ORPHAN_PARTITIONS)
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
        """
        with self._immediate() as db:
            sealed = compute(_latest(db.execute(*_latest_query(table_ids)).fetchall()))
            for table_id, seal in sealed.items():
                db.execute(
                    "INSERT INTO change_stream_seals VALUES (?, ?, ?, ?) ON CONFLICT (table_id,"
                    " version) DO UPDATE SET heartbeat_us=max(heartbeat_us, excluded.heartbeat_us)",
                    (table_id, seal.version, seal.heartbeat_us, seal.heartbeat_us),
                )
                db.execute(
                    "DELETE FROM change_stream_seals WHERE table_id=? AND heartbeat_us < ?"
                    " AND version < ?",
                    (table_id, seal.heartbeat_us - _SEAL_KEPT_US, seal.version),
                )
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
