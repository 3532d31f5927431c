"""Change streams in the SQLite catalog: their own namespace per schema (a change stream
is read through its function, ``READ_<name>``, never as a table, so it may share a name
with one)."""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from catalog.base import ObjectAlreadyExistsError
from catalog.records import ChangeStreamRecord
from catalog.sqlite_layout import CHANGE_STREAM_COLUMNS, namespace_statements

if TYPE_CHECKING:
    from catalog.sqlite import _Transaction

__all__ = ["ChangeStreamStore"]


def _record(row: tuple[Any, ...]) -> ChangeStreamRecord:
    values = list(row)
    values[4] = bool(values[4])
    values[5] = tuple(orjson.loads(values[5]))
    return ChangeStreamRecord(*values)


class ChangeStreamStore:
    """The change-stream half of :class:`catalog.sqlite.SqliteCatalog` (a mixin)."""

    if TYPE_CHECKING:

        def _immediate(self) -> _Transaction: ...
        def _read(self, sql: str, args: tuple = ()) -> list[tuple]: ...  # type: ignore[type-arg]

    def create_change_stream(
        self, database: str, schema_name: str, name: str, *, for_all: bool,
        table_ids: tuple[int, ...], value_capture_type: str, retention_s: int,
        created_us: int, replace: bool = False,
    ) -> ChangeStreamRecord:  # fmt: skip
        key = (database, schema_name, name)
        now = time.time()
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
                    "table_ids, value_capture_type, retention_s, created_at, created_us, uid)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*key, int(for_all), orjson.dumps(list(table_ids)).decode(),
                     value_capture_type, retention_s, now, created_us, uuid.uuid4().hex),
                )  # fmt: skip
            except sqlite3.IntegrityError as exc:
                raise ObjectAlreadyExistsError(
                    f"change stream {'.'.join(key)} already exists; use CREATE OR REPLACE "
                    "CHANGE STREAM to replace it, or IF NOT EXISTS to keep it"
                ) from exc
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
    ) -> bool:  # fmt: skip
        """Change what the stream watches or its options; False if it is gone."""
        changes: dict[str, Any] = {}
        if for_all is not None:
            changes["for_all"] = int(for_all)
        if table_ids is not None:
            changes["table_ids"] = orjson.dumps(list(table_ids)).decode()
        if value_capture_type is not None:
            changes["value_capture_type"] = value_capture_type
        if retention_s is not None:
            changes["retention_s"] = retention_s
        assignments = ", ".join(f"{column}=?" for column in changes) or "id=id"
        with self._immediate() as db:
            return db.execute(
                f"UPDATE change_streams SET {assignments} WHERE id=?",
                (*changes.values(), stream_id),
            ).rowcount == 1  # fmt: skip

    def drop_change_stream(self, stream_id: int) -> bool:
        with self._immediate() as db:
            return db.execute("DELETE FROM change_streams WHERE id=?", (stream_id,)).rowcount == 1
