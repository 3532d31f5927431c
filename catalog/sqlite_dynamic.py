"""Dynamic tables in the SQLite catalog: definitions, sources, refresh history, and the
refresh claim that pending commits carry.

A dynamic table is a row of ``tables`` (its folder, columns and row ids work as any
table's) plus a ``dynamic_tables`` row holding its definition and refresh state. A
refresh is applied by a pending commit whose plan holds :data:`REFRESH_PLAN_KEY`: the
commit's decision claims the table's next refresh (compare-and-swap on
``refresh_seq``), and its end records the refresh (data timestamp, source versions,
history row) in the same transaction that forgets the commit. So a refresh is
recorded exactly when its Delta commit is, whoever rolls it forward.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from catalog.base import RefreshClaimConflict
from catalog.records import (
    REFRESH_PLAN_KEY,
    DynamicSource,
    DynamicTableRecord,
    RefreshRecord,
    TableInfo,
    full_name,
)
from catalog.sql_values import printable_reports
from catalog.sqlite_layout import (
    DYNAMIC_COLUMNS,
    REFRESH_COLUMNS,
    TABLE_COLUMNS,
    IntegrityError,
    namespace_statements,
    to_table,
)
from ingest_sdk import TableSchema
from ingest_sdk.errors import TableAlreadyExistsError, TableNotFoundError

if TYPE_CHECKING:
    from catalog.sqlite import _Transaction

__all__ = [
    "HISTORY_MAX_ROWS", "HISTORY_RETENTION_SECONDS", "DynamicTableStore", "claim_refresh",
    "finish_refresh", "release_refresh",
]  # fmt: skip

#: Refresh history kept per dynamic table: 7 days, and at most this many rows.
HISTORY_RETENTION_SECONDS = 7 * 86_400.0
HISTORY_MAX_ROWS = 20_000
#: Columns of ``dynamic_tables`` that :meth:`DynamicTableStore.set_dynamic_table` may set.
_SETTABLE = {"target_lag_us", "state", "state_reason", "last_tick_us", "owner"}
_REFRESH_SETTABLE = {
    "action", "state", "reason", "error", "rows_inserted", "rows_deleted", "rows_updated",
    "table_version", "ended_at", "skipped_ticks", "data_timestamp_us", "source_versions",
    "took_s",
}  # fmt: skip


def _record(db: sqlite3.Connection, row: tuple[Any, ...]) -> DynamicTableRecord:
    sources = tuple(
        DynamicSource(*source)
        for source in db.execute(
            "SELECT source_id, kind, name, marker, version FROM dynamic_table_sources"
            " WHERE dt_table_id=? ORDER BY position",
            (row[0],),
        )
    )
    return DynamicTableRecord(*row, sources=sources)  # type: ignore[misc]


def _refresh(row: tuple[Any, ...]) -> RefreshRecord:
    values = list(row)
    values[10] = orjson.loads(values[10])
    return RefreshRecord(*values)


def _refresh_update(values: dict[str, Any]) -> tuple[str, list[Any]]:
    """The ``SET`` list and its arguments for the history columns ``values`` sets."""
    unknown = set(values) - _REFRESH_SETTABLE
    if unknown:
        raise ValueError(f"cannot set {sorted(unknown)} of a refresh")
    values = printable_reports(values)  # an error may quote any text a value held
    if "source_versions" in values:
        values = {**values, "source_versions": orjson.dumps(values["source_versions"]).decode()}
    return ", ".join(f"{column}=?" for column in values), list(values.values())


def claim_refresh(db: sqlite3.Connection, commit_id: int, plan: Mapping[str, Any]) -> None:
    """Inside :meth:`decide_commit`'s transaction: claim the refresh a commit's plan
    applies (its expected ``refresh_seq``, no other commit holding the table).

    Raises:
        RefreshClaimConflict: another refresh was applied or claimed meanwhile, or the
            dynamic table was dropped or replaced.
    """
    refresh = plan.get(REFRESH_PLAN_KEY)
    if not refresh:
        return
    found = db.execute(
        "SELECT refresh_seq, claimed_by, uid FROM dynamic_tables WHERE table_id=?",
        (refresh["dt"],),
    ).fetchone()
    if (
        found is None
        or found[0] != refresh["seq"]
        or found[1] not in (None, commit_id)
        or found[2] != refresh["uid"]
    ):
        raise RefreshClaimConflict(refresh["dt"])
    db.execute(
        "UPDATE dynamic_tables SET claimed_by=? WHERE table_id=?", (commit_id, refresh["dt"])
    )


def _insert_refresh(db: sqlite3.Connection, record: Mapping[str, Any]) -> int:
    """Add a history row; the table's rows past the retention go."""
    now = time.time()
    values = {
        **printable_reports(record),
        "source_versions": orjson.dumps(record.get("source_versions", {})).decode(),
    }
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    (refresh_id,) = db.execute(
        f"INSERT INTO dynamic_table_refreshes ({columns}) VALUES ({marks}) RETURNING id",
        tuple(values.values()),
    ).fetchone()
    db.execute(
        "DELETE FROM dynamic_table_refreshes WHERE dt_table_id=? AND (started_at < ?"
        " OR id <= (SELECT id FROM dynamic_table_refreshes WHERE dt_table_id=?"
        " ORDER BY id DESC LIMIT 1 OFFSET ?))",
        (record["dt_table_id"], now - HISTORY_RETENTION_SECONDS, record["dt_table_id"],
         HISTORY_MAX_ROWS),
    )  # fmt: skip
    return refresh_id


def _move_no_data(
    db: sqlite3.Connection, table_id: int, expected_seq: int, data_timestamp_us: int,
    source_versions: Mapping[int, int],
) -> bool:  # fmt: skip
    """Move the data timestamp and the sources' versions of a refresh that found nothing
    new, if ``refresh_seq`` is still ``expected_seq`` and no refresh holds a claim."""
    moved = db.execute(
        "UPDATE dynamic_tables SET refresh_seq=refresh_seq+1, data_timestamp_us=?"
        " WHERE table_id=? AND refresh_seq=? AND claimed_by IS NULL",
        (data_timestamp_us, table_id, expected_seq),
    ).rowcount
    for position, version in source_versions.items() if moved else ():
        db.execute(
            "UPDATE dynamic_table_sources SET version=? WHERE dt_table_id=? AND position=?",
            (version, table_id, position),
        )
    return bool(moved)


def finish_refresh(
    db: sqlite3.Connection, commit_id: int, plan: Mapping[str, Any], versions: Mapping[int, int]
) -> None:
    """Inside :meth:`finish_commit`'s transaction: record the refresh the commit applied
    (next ``refresh_seq``, data timestamp, the table version holding it, the sources'
    versions, the history row), and make an initializing table active, unless the
    claim says ``"activate": False``: a table ``CREATE OR REPLACE`` builds becomes
    active only when :meth:`swap_dynamic_table` gives it its name, and stays its
    creator's until then (a creator that died leaves it to be dropped)."""
    refresh = plan.get(REFRESH_PLAN_KEY)
    if not refresh:
        return
    dt = refresh["dt"]
    version = versions.get(dt)
    activate = bool(refresh.get("activate", True))
    updated = db.execute(
        "UPDATE dynamic_tables SET refresh_seq=refresh_seq+1, claimed_by=NULL,"
        " data_timestamp_us=?, data_version=?,"
        " owner=CASE WHEN state='INITIALIZING' AND ? = 0 THEN owner ELSE '' END,"
        " state=CASE WHEN state='INITIALIZING' AND ? = 1 THEN 'ACTIVE' ELSE state END"
        " WHERE table_id=? AND claimed_by=?",
        (refresh["data_timestamp_us"], version, int(activate), int(activate), dt, commit_id),
    ).rowcount
    if not updated:
        return  # finished already (recovery and the owner may both try)
    for position, source_version in refresh["sources"].items():
        db.execute(
            "UPDATE dynamic_table_sources SET version=? WHERE dt_table_id=? AND position=?",
            (source_version, dt, int(position)),
        )
    inserted, deleted, changed = refresh["counts"]
    db.execute(
        "UPDATE dynamic_table_refreshes SET state='SUCCEEDED', action=?, rows_inserted=?,"
        " rows_deleted=?, rows_updated=?, table_version=?, ended_at=? WHERE id=?",
        (refresh["action"], inserted, deleted, changed, version, time.time(),
         refresh["history"]),
    )  # fmt: skip


def release_refresh(db: sqlite3.Connection, commit_id: int) -> None:
    """Inside :meth:`abandon_commit`'s transaction: the refresh it claimed was not applied."""
    db.execute("UPDATE dynamic_tables SET claimed_by=NULL WHERE claimed_by=?", (commit_id,))


class DynamicTableStore:
    """The dynamic-table half of :class:`catalog.sqlite.SqliteCatalog` (a mixin)."""

    if TYPE_CHECKING:

        def _immediate(self) -> _Transaction: ...
        def _snapshot(self) -> _Transaction: ...
        def _read(self, sql: str, args: tuple = ()) -> list[tuple]: ...  # type: ignore[type-arg]

    def create_dynamic_table(
        self,
        names: tuple[str, str, str],
        uri: str,
        schema: TableSchema,
        definition: Mapping[str, Any],
        sources: Sequence[DynamicSource],
    ) -> tuple[TableInfo, DynamicTableRecord]:
        """Record a new dynamic table, INITIALIZING: its ``tables`` row (``uri`` already
        holds its Delta table), its definition (the ``dynamic_tables`` columns in
        ``definition``: query, defaults, lag, modes, owner, comment) and its sources.

        Raises:
            TableAlreadyExistsError: a table has the name; nothing was recorded.
        """
        now = time.time()
        database, schema_name, name = names
        with self._immediate() as db:
            for sql, args in namespace_statements(database, schema_name, now):
                db.execute(sql, args)
            try:
                (table_id,) = db.execute(
                    "INSERT INTO tables (database, schema_name, name, uri, columns, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                    (database, schema_name, name, uri,
                     orjson.dumps(schema.declarations()).decode(), now),
                ).fetchone()  # fmt: skip
            except IntegrityError as exc:
                raise TableAlreadyExistsError(
                    f"table {'.'.join(names)} already exists; choose another name"
                ) from exc
            db.execute(
                "INSERT INTO dynamic_tables (table_id, uid, query, default_database,"
                " default_schema, target_lag_us, refresh_mode, mode_reason, row_ids, initialize,"
                " state, owner, created_at, comment)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'INITIALIZING', ?, ?, ?)",
                (table_id, uuid.uuid4().hex, definition["query"], definition["default_database"],
                 definition["default_schema"], definition["target_lag_us"],
                 definition["refresh_mode"], definition["mode_reason"], definition["row_ids"],
                 definition["initialize"], definition["owner"], now,
                 definition.get("comment", "")),
            )  # fmt: skip
            for position, source in enumerate(sources):
                db.execute(
                    "INSERT INTO dynamic_table_sources VALUES (?, ?, ?, ?, ?, ?, NULL)",
                    (table_id, position, source.source_id, source.kind, source.name,
                     source.marker),
                )  # fmt: skip
            info = to_table(
                db.execute(f"SELECT {TABLE_COLUMNS} FROM tables WHERE id=?", (table_id,)).fetchone()
            )
            record = _record(db, db.execute(
                f"SELECT {DYNAMIC_COLUMNS} FROM dynamic_tables WHERE table_id=?", (table_id,)
            ).fetchone())  # fmt: skip
        return info, record

    def get_dynamic_table(self, table_id: int) -> DynamicTableRecord | None:
        with self._snapshot() as db:
            row = db.execute(
                f"SELECT {DYNAMIC_COLUMNS} FROM dynamic_tables WHERE table_id=?", (table_id,)
            ).fetchone()
            return _record(db, row) if row else None

    def list_dynamic_tables(self) -> list[DynamicTableRecord]:
        with self._snapshot() as db:
            rows = db.execute(
                f"SELECT {DYNAMIC_COLUMNS} FROM dynamic_tables ORDER BY table_id"
            ).fetchall()
            return [_record(db, row) for row in rows]

    def set_dynamic_table(self, table_id: int, **values: Any) -> bool:
        """Set some of ``target_lag_us``, ``state``, ``state_reason``, ``last_tick_us``
        and ``owner``; returns whether the table is still recorded."""
        unknown = set(values) - _SETTABLE
        if unknown:
            raise ValueError(f"cannot set {sorted(unknown)} of a dynamic table")
        columns = ", ".join(f"{column}=?" for column in values)
        with self._immediate() as db:
            cursor = db.execute(
                f"UPDATE dynamic_tables SET {columns} WHERE table_id=?",
                (*printable_reports(values).values(), table_id),
            )
            return cursor.rowcount == 1

    def swap_dynamic_table(self, old_id: int, new_id: int) -> None:
        """``CREATE OR REPLACE``'s last step, atomically: drop the old table (its rows,
        definition and history), give the new one its name and make it active.

        Raises:
            TableBusyError: a pending commit writes the old table; nothing changed.
        """
        from catalog.sqlite_layout import check_not_busy, forget_table

        with self._immediate() as db:
            check_not_busy(db, [old_id])
            names = db.execute(
                "SELECT database, schema_name, name FROM tables WHERE id=?", (old_id,)
            ).fetchone()
            if names is None:
                raise TableAlreadyExistsError("the dynamic table being replaced was dropped")
            replacing = db.execute(
                "SELECT 1 FROM dynamic_tables WHERE table_id=?", (new_id,)
            ).fetchone()
            if replacing is None:
                raise TableNotFoundError(
                    "the dynamic table replacing it was dropped; nothing was replaced"
                )
            forget_table(db, old_id)
            db.execute(
                "UPDATE tables SET database=?, schema_name=?, name=? WHERE id=?", (*names, new_id)
            )
            db.execute(
                "UPDATE dynamic_tables SET state='ACTIVE', owner='' WHERE table_id=?"
                " AND state='INITIALIZING'",
                (new_id,),
            )
            db.execute(
                "UPDATE dynamic_table_refreshes SET name=? WHERE dt_table_id=?",
                (full_name(*names), new_id),
            )

    # Refresh history
    def add_refresh(self, record: Mapping[str, Any]) -> int:
        """Record a refresh (the ``dynamic_table_refreshes`` columns in ``record``); older
        rows past the retention (:data:`HISTORY_RETENTION_SECONDS`,
        :data:`HISTORY_MAX_ROWS` per table) go."""
        with self._immediate() as db:
            return _insert_refresh(db, record)

    def update_refresh(self, refresh_id: int, **values: Any) -> None:
        columns, args = _refresh_update(values)
        with self._immediate() as db:
            db.execute(f"UPDATE dynamic_table_refreshes SET {columns} WHERE id=?",
                       (*args, refresh_id))  # fmt: skip

    def fold_refresh(self, refresh_id: int, into_id: int, **values: Any) -> bool:
        columns, args = _refresh_update(values)
        with self._immediate() as db:
            tables = db.execute(
                "SELECT dt_table_id FROM dynamic_table_refreshes WHERE id IN (?, ?)",
                (refresh_id, into_id),
            ).fetchall()
            if refresh_id == into_id or len(tables) != 2 or tables[0] != tables[1]:
                return False
            if values:
                db.execute(f"UPDATE dynamic_table_refreshes SET {columns} WHERE id=?",
                           (*args, into_id))  # fmt: skip
            db.execute("DELETE FROM dynamic_table_refreshes WHERE id=?", (refresh_id,))
        return True

    def list_refreshes(
        self, dt_table_id: int | None = None, limit: int = HISTORY_MAX_ROWS,
        executing: bool = False,
    ) -> list[RefreshRecord]:  # fmt: skip
        """The newest refreshes first (of one dynamic table, or of all; ``executing``:
        only those in state EXECUTING)."""
        conditions = ["dt_table_id=?"] if dt_table_id is not None else []
        conditions += ["state='EXECUTING'"] if executing else []
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        args = (dt_table_id,) if dt_table_id is not None else ()
        rows = self._read(
            f"SELECT {REFRESH_COLUMNS} FROM dynamic_table_refreshes {where}"
            " ORDER BY id DESC LIMIT ?",
            (*args, limit),
        )
        return [_refresh(row) for row in rows]

    def get_refresh(self, refresh_id: int) -> RefreshRecord | None:
        rows = self._read(
            f"SELECT {REFRESH_COLUMNS} FROM dynamic_table_refreshes WHERE id=?", (refresh_id,)
        )
        return _refresh(rows[0]) if rows else None

    def record_no_data(
        self, table_id: int, expected_seq: int, data_timestamp_us: int,
        source_versions: Mapping[int, int], refresh_id: int,
        shown: Mapping[str, Any] | None = None,
    ) -> bool:  # fmt: skip
        """A refresh that found no change in its sources: move the data timestamp and
        the sources' versions, and close its history row as NO_DATA (``shown``: its
        ``source_versions``), if no other refresh was applied or claimed meanwhile
        (compare-and-swap on ``refresh_seq``). One catalog write."""
        with self._immediate() as db:
            if not _move_no_data(db, table_id, expected_seq, data_timestamp_us, source_versions):
                return False
            db.execute(
                "UPDATE dynamic_table_refreshes SET state='SUCCEEDED', action='NO_DATA',"
                " rows_inserted=0, rows_deleted=0, rows_updated=0, ended_at=?, table_version="
                "(SELECT data_version FROM dynamic_tables WHERE table_id=?),"
                " source_versions=COALESCE(?, source_versions) WHERE id=?",
                (
                    time.time(),
                    table_id,
                    orjson.dumps(shown).decode() if shown is not None else None,
                    refresh_id,
                ),
            )
        return True

    def add_no_data_refresh(
        self, record: Mapping[str, Any], expected_seq: int, source_versions: Mapping[int, int]
    ) -> int | None:
        """:meth:`record_no_data` for a refresh that found no change before it opened a
        history row: the row (``record``, completed as SUCCEEDED NO_DATA) is added in the
        same write. Returns its id, or None (nothing written) if another refresh was
        applied or claimed meanwhile. The whole of a NO_DATA refresh: one catalog write."""
        table_id = record["dt_table_id"]
        with self._immediate() as db:
            if not _move_no_data(db, table_id, expected_seq, record["data_timestamp_us"],
                                 source_versions):  # fmt: skip
                return None
            (version,) = db.execute(
                "SELECT data_version FROM dynamic_tables WHERE table_id=?", (table_id,)
            ).fetchone()
            return _insert_refresh(db, {
                **record, "state": "SUCCEEDED", "action": "NO_DATA", "rows_inserted": 0,
                "rows_deleted": 0, "rows_updated": 0, "table_version": version,
                "ended_at": time.time(),
            })  # fmt: skip
