"""Views in the SQLite catalog: named queries sharing one namespace per schema with
tables and streams (a view's name is checked against them in the same transaction)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from catalog.base import ObjectAlreadyExistsError
from catalog.records import ViewRecord
from catalog.sqlite_layout import VIEW_COLUMNS, IntegrityError, namespace_statements

if TYPE_CHECKING:
    from catalog.sqlite import _Transaction

__all__ = ["ViewStore"]


class ViewStore:
    """The view half of :class:`catalog.sqlite.SqliteCatalog` (a mixin)."""

    if TYPE_CHECKING:

        def _immediate(self) -> _Transaction: ...
        def _read(self, sql: str, args: tuple = ()) -> list[tuple]: ...  # type: ignore[type-arg]

    def create_view(
        self,
        database: str,
        schema_name: str,
        name: str,
        query: str,
        defaults: tuple[str, str],
        comment: str = "",
        replace: bool = False,
    ) -> ViewRecord:
        now = time.time()
        key = (database, schema_name, name)
        with self._immediate() as db:
            for what in ("tables", "streams"):
                taken = db.execute(
                    f"SELECT 1 FROM {what} WHERE database=? AND schema_name=? AND name=?", key
                ).fetchone()
                if taken:
                    raise ObjectAlreadyExistsError(
                        f"{'table' if what == 'tables' else 'stream'} {'.'.join(key)} already "
                        "has this name; a view needs a name of its own in its schema"
                    )
            if replace:
                db.execute("DELETE FROM views WHERE database=? AND schema_name=? AND name=?", key)
            for sql, args in namespace_statements(database, schema_name, now):
                db.execute(sql, args)
            try:
                db.execute(
                    "INSERT INTO views (database, schema_name, name, query, default_database,"
                    " default_schema, created_at, comment, uid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*key, query, *defaults, now, comment, uuid.uuid4().hex),
                )
            except IntegrityError as exc:
                raise ObjectAlreadyExistsError(
                    f"view {'.'.join(key)} already exists; use CREATE OR REPLACE VIEW to "
                    "replace it, or IF NOT EXISTS to keep it"
                ) from exc
        view = self.get_view(database, schema_name, name)
        assert view is not None
        return view

    def get_view(self, database: str, schema_name: str, name: str) -> ViewRecord | None:
        rows = self._read(
            f"SELECT {VIEW_COLUMNS} FROM views WHERE database=? AND schema_name=? AND name=?",
            (database, schema_name, name),
        )
        return ViewRecord(*rows[0]) if rows else None

    def list_views(self) -> list[ViewRecord]:
        rows = self._read(f"SELECT {VIEW_COLUMNS} FROM views ORDER BY database, schema_name, name")
        return [ViewRecord(*row) for row in rows]

    def drop_view(self, view_id: int) -> bool:
        with self._immediate() as db:
            return db.execute("DELETE FROM views WHERE id=?", (view_id,)).rowcount == 1
