"""The SQLite catalog's layout: its tables, their columns, and rows as records.

Kept apart from :mod:`catalog.sqlite` (the operations) so each stays readable; nothing
here opens a connection of its own.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import orjson

from catalog.base import ObjectNotEmptyError, TableBusyError
from catalog.records import (
    APPEND_INTENT,
    DEFAULT_PROPERTIES,
    ROWS_INTENT,
    ChannelRecord,
    CommitIntent,
    DatabaseRecord,
    PendingCommit,
    SchemaRecord,
    StreamClaim,
    StreamRecord,
    TableInfo,
    full_name,
)
from ingest_sdk import TableSchema

__all__ = [
    "ADDED_COLUMNS",
    "BACKFILLS",
    "CHANGE_STREAM_COLUMNS",
    "CHANNEL_COLUMNS",
    "DEFINITION_COLUMNS",
    "DYNAMIC_COLUMNS",
    "MIGRATION_COLUMNS",
    "NAMED_DATABASES",
    "NAMED_SCHEMAS",
    "ORPHAN_HISTORY",
    "ORPHAN_OFFSETS",
    "ORPHAN_PARTITIONS",
    "PARTITION_COLUMNS",
    "PENDING_COLUMNS",
    "REFRESH_COLUMNS",
    "SCHEMA",
    "STREAM_COLUMNS",
    "TABLE_COLUMNS",
    "VIEW_COLUMNS",
    "IntegrityError",
    "check_not_busy",
    "claims_text",
    "drop_contents",
    "drop_dynamic_rows",
    "find_databases",
    "find_schemas",
    "forget_table",
    "namespace_statements",
    "replacing",
    "to_channel",
    "to_claim",
    "to_pending",
    "to_stream",
    "to_table",
]  # fmt: skip
#: The error a statement raises when it breaks a unique key, whichever database runs it:
#: the PostgreSQL catalog's connection raises this class too (:mod:`catalog.postgres`).
IntegrityError = sqlite3.IntegrityError
SCHEMA = """
CREATE TABLE IF NOT EXISTS databases (
    name TEXT PRIMARY KEY, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS schemas (
    database TEXT NOT NULL, name TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (database, name));
CREATE TABLE IF NOT EXISTS tables (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    database TEXT NOT NULL, schema_name TEXT NOT NULL, name TEXT NOT NULL,
    uri TEXT NOT NULL, columns TEXT NOT NULL, created_at REAL NOT NULL,
    applied_version INTEGER NOT NULL DEFAULT 0, next_row_id INTEGER NOT NULL DEFAULT 0,
    clustering TEXT NOT NULL DEFAULT '[]', properties TEXT NOT NULL DEFAULT '{}',
    UNIQUE (database, schema_name, name));
CREATE TABLE IF NOT EXISTS migrations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, table_id INTEGER NOT NULL,
    started_at REAL NOT NULL, ended_at REAL NOT NULL, status TEXT NOT NULL,
    files_in INTEGER NOT NULL, bytes_in INTEGER NOT NULL, rows_in INTEGER NOT NULL,
    files_out INTEGER NOT NULL, bytes_out INTEGER NOT NULL, rows_out INTEGER NOT NULL,
    version INTEGER, error TEXT);
CREATE TABLE IF NOT EXISTS channels (
    table_id INTEGER NOT NULL, name TEXT NOT NULL, generation INTEGER NOT NULL,
    offset_token TEXT, rows_committed INTEGER NOT NULL DEFAULT 0,
    last_activity REAL NOT NULL, created_at REAL NOT NULL, committed_position INTEGER,
    PRIMARY KEY (table_id, name));
CREATE TABLE IF NOT EXISTS streams (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    database TEXT NOT NULL, schema_name TEXT NOT NULL, name TEXT NOT NULL,
    table_id INTEGER NOT NULL, mode TEXT NOT NULL, offset_version INTEGER NOT NULL,
    created_at REAL NOT NULL, offset_moved_at REAL NOT NULL, comment TEXT NOT NULL DEFAULT '',
    claimed_by INTEGER, uid TEXT NOT NULL DEFAULT '',
    UNIQUE (database, schema_name, name));
CREATE TABLE IF NOT EXISTS stream_offsets (
    stream_id INTEGER NOT NULL, table_id INTEGER NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (stream_id, table_id));
CREATE INDEX IF NOT EXISTS stream_offsets_by_table ON stream_offsets (table_id);
CREATE TABLE IF NOT EXISTS pending_commits (
    id INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL, plan TEXT NOT NULL,
    claims TEXT NOT NULL, created_at REAL NOT NULL,
    state TEXT NOT NULL DEFAULT 'decided', intents TEXT NOT NULL DEFAULT '',
    decided_seq INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS views (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    database TEXT NOT NULL, schema_name TEXT NOT NULL, name TEXT NOT NULL,
    query TEXT NOT NULL, default_database TEXT NOT NULL, default_schema TEXT NOT NULL,
    created_at REAL NOT NULL, comment TEXT NOT NULL DEFAULT '', uid TEXT NOT NULL,
    UNIQUE (database, schema_name, name));
CREATE TABLE IF NOT EXISTS dynamic_tables (
    table_id INTEGER PRIMARY KEY, uid TEXT NOT NULL, query TEXT NOT NULL,
    default_database TEXT NOT NULL, default_schema TEXT NOT NULL, target_lag_us INTEGER,
    refresh_mode TEXT NOT NULL, mode_reason TEXT NOT NULL, row_ids TEXT NOT NULL,
    initialize TEXT NOT NULL, state TEXT NOT NULL, state_reason TEXT NOT NULL DEFAULT '',
    owner TEXT NOT NULL DEFAULT '', data_timestamp_us INTEGER, data_version INTEGER,
    refresh_seq INTEGER NOT NULL DEFAULT 0, claimed_by INTEGER, last_tick_us INTEGER,
    created_at REAL NOT NULL, comment TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS dynamic_table_sources (
    dt_table_id INTEGER NOT NULL, position INTEGER NOT NULL, source_id INTEGER NOT NULL,
    kind TEXT NOT NULL, name TEXT NOT NULL, marker TEXT NOT NULL, version INTEGER,
    PRIMARY KEY (dt_table_id, position));
CREATE TABLE IF NOT EXISTS dynamic_table_refreshes (
    id INTEGER PRIMARY KEY AUTOINCREMENT, dt_table_id INTEGER NOT NULL, name TEXT NOT NULL,
    refresh_uid TEXT NOT NULL, trigger TEXT NOT NULL, action TEXT, state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '', error TEXT NOT NULL DEFAULT '',
    data_timestamp_us INTEGER NOT NULL, source_versions TEXT NOT NULL DEFAULT '{}',
    rows_inserted INTEGER, rows_deleted INTEGER, rows_updated INTEGER, table_version INTEGER,
    started_at REAL NOT NULL, ended_at REAL, owner TEXT NOT NULL DEFAULT '',
    skipped_ticks INTEGER NOT NULL DEFAULT 0, took_s REAL);
CREATE INDEX IF NOT EXISTS dynamic_table_refreshes_by_table
    ON dynamic_table_refreshes (dt_table_id, id);
CREATE TABLE IF NOT EXISTS change_streams (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    database TEXT NOT NULL, schema_name TEXT NOT NULL, name TEXT NOT NULL,
    for_all INTEGER NOT NULL, table_ids TEXT NOT NULL, value_capture_type TEXT NOT NULL,
    retention_s INTEGER NOT NULL, created_at REAL NOT NULL, created_us INTEGER NOT NULL,
    uid TEXT NOT NULL, UNIQUE (database, schema_name, name));
CREATE TABLE IF NOT EXISTS change_stream_partitions (
    token TEXT PRIMARY KEY, stream_uid TEXT NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    start_us INTEGER NOT NULL, end_us INTEGER, parents TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS change_stream_partitions_by_stream
    ON change_stream_partitions (stream_uid);
CREATE TABLE IF NOT EXISTS change_stream_seals (
    table_id INTEGER NOT NULL, version INTEGER NOT NULL, heartbeat_us INTEGER NOT NULL,
    covers_us INTEGER NOT NULL, PRIMARY KEY (table_id, version));
CREATE TABLE IF NOT EXISTS change_stream_history (
    stream_uid TEXT NOT NULL, from_us INTEGER NOT NULL, for_all INTEGER NOT NULL,
    table_ids TEXT NOT NULL, value_capture_type TEXT NOT NULL, column_lists TEXT NOT NULL,
    exclusions TEXT NOT NULL, PRIMARY KEY (stream_uid, from_us));
CREATE TABLE IF NOT EXISTS catalog_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS dropped_tables (
    id INTEGER PRIMARY KEY, database TEXT NOT NULL, schema_name TEXT NOT NULL,
    name TEXT NOT NULL, uri TEXT NOT NULL, columns TEXT NOT NULL, created_at REAL NOT NULL,
    applied_version INTEGER NOT NULL, next_row_id INTEGER NOT NULL, clustering TEXT NOT NULL,
    properties TEXT NOT NULL, dropped_us INTEGER NOT NULL, keep_until_us INTEGER NOT NULL);
"""
#: Columns added after the first release, for catalogs made by older versions (a
#: pending commit of an older version was decided, and its intents are its plan's).
ADDED_COLUMNS = {
    ("tables", "properties"): "TEXT NOT NULL DEFAULT '{}'",
    ("streams", "uid"): "TEXT NOT NULL DEFAULT ''",
    ("streams", "view_id"): "INTEGER",
    ("streams", "view_uids"): "TEXT NOT NULL DEFAULT '[]'",
    ("pending_commits", "state"): "TEXT NOT NULL DEFAULT 'decided'",
    ("pending_commits", "intents"): "TEXT NOT NULL DEFAULT ''",
    ("pending_commits", "decided_seq"): "INTEGER NOT NULL DEFAULT 0",
    ("change_streams", "column_lists"): "TEXT NOT NULL DEFAULT '[]'",
    ("change_streams", "exclusions"): "TEXT NOT NULL DEFAULT '[]'",
    ("dynamic_table_refreshes", "took_s"): "REAL",
    # The newest applied position (generation << 40 | batch_seq); NULL: applied before
    # positions were kept, 0: none yet.
    ("channels", "committed_position"): "INTEGER",
    # The applied version when positions began to be kept (set at the upgrade that adds
    # this column): a channel without a position moves with commits above it only.
    ("tables", "positions_from"): "INTEGER NOT NULL DEFAULT 0",
    # The server holding the channel's newest open (several servers on one warehouse).
    ("channels", "server"): "TEXT NOT NULL DEFAULT ''",
}
#: What fills a column of :data:`ADDED_COLUMNS` in, in the transaction that adds it.
BACKFILLS = {
    ("tables", "positions_from"): "UPDATE tables SET positions_from = applied_version",
}


def replacing(key: str, columns: str) -> str:
    """The clause that makes an INSERT replace the row of the same ``key`` (its columns
    ``columns``, comma separated), as SQLite's ``INSERT OR REPLACE`` does, in the form
    SQLite and PostgreSQL share."""
    keys = set(key.split(", "))
    sets = ", ".join(f"{c} = excluded.{c}" for c in columns.split(", ") if c not in keys)
    return f"ON CONFLICT ({key}) DO UPDATE SET {sets}"


TABLE_COLUMNS = (
    "id, database, schema_name, name, uri, columns, created_at, applied_version, next_row_id,"
    " clustering, properties"
)
_REPLACE_DROPPED = replacing("id", f"{TABLE_COLUMNS}, dropped_us, keep_until_us")
STREAM_COLUMNS = (
    "id, database, schema_name, name, table_id, mode, offset_version, created_at,"
    " offset_moved_at, comment, claimed_by, uid, view_id, view_uids,"
    " (SELECT json_group_array(json_array(o.table_id, o.version)) FROM stream_offsets o"
    " WHERE o.stream_id = streams.id)"
)
#: Base offsets of streams that no longer exist (dropped, replaced, in a dropped schema).
ORPHAN_OFFSETS = "DELETE FROM stream_offsets WHERE stream_id NOT IN (SELECT id FROM streams)"
PENDING_COLUMNS = "id, owner, plan, claims, created_at, state, intents, decided_seq"
CHANGE_STREAM_COLUMNS = (
    "id, database, schema_name, name, for_all, table_ids, value_capture_type, retention_s,"
    " created_at, created_us, uid, column_lists, exclusions"
)
PARTITION_COLUMNS = "token, stream_uid, lo, hi, start_us, end_us, parents"
#: Partitions of change streams that no longer exist (dropped or replaced).
ORPHAN_PARTITIONS = (
    "DELETE FROM change_stream_partitions WHERE stream_uid NOT IN (SELECT uid FROM change_streams)"
)
#: The definition columns of a change stream, in :class:`ChangeStreamDefinition` order
#: (after ``from_us``): the same names in ``change_streams`` and its history.
DEFINITION_COLUMNS = "for_all, table_ids, value_capture_type, column_lists, exclusions"
#: History of change streams that no longer exist (dropped or replaced).
ORPHAN_HISTORY = (
    "DELETE FROM change_stream_history WHERE stream_uid NOT IN (SELECT uid FROM change_streams)"
)
VIEW_COLUMNS = (
    "id, database, schema_name, name, query, default_database, default_schema, created_at,"
    " comment, uid"
)
DYNAMIC_COLUMNS = (
    "table_id, uid, query, default_database, default_schema, target_lag_us, refresh_mode,"
    " mode_reason, row_ids, initialize, state, state_reason, owner, data_timestamp_us,"
    " data_version, refresh_seq, claimed_by, last_tick_us, created_at, comment"
)
REFRESH_COLUMNS = (
    "id, dt_table_id, name, refresh_uid, trigger, action, state, reason, error,"
    " data_timestamp_us, source_versions, rows_inserted, rows_deleted, rows_updated,"
    " table_version, started_at, ended_at, owner, skipped_ticks, took_s"
)
MIGRATION_COLUMNS = (
    "id, table_id, started_at, ended_at, status, files_in, bytes_in, rows_in, files_out,"
    " bytes_out, rows_out, version, error"
)
CHANNEL_COLUMNS = (
    "table_id, name, generation, offset_token, rows_committed, last_activity, created_at,"
    " committed_position, server"
)
#: Every (database, schema) something names: created schemas, and those of tables and
#: streams (a table made before schemas were objects, or renamed into one, implies it).
NAMED_SCHEMAS = (
    "SELECT database, name, created_at FROM schemas"
    " UNION ALL SELECT database, schema_name, created_at FROM tables"
    " UNION ALL SELECT database, schema_name, created_at FROM streams"
    " UNION ALL SELECT database, schema_name, created_at FROM views"
    " UNION ALL SELECT database, schema_name, created_at FROM change_streams"
)
NAMED_DATABASES = (
    f"SELECT name AS database, created_at FROM databases UNION ALL"
    f" SELECT database, created_at FROM ({NAMED_SCHEMAS}) named"
)


def to_table(row: tuple) -> TableInfo:  # type: ignore[type-arg]
    return TableInfo(
        id=row[0],
        database=row[1],
        schema_name=row[2],
        name=row[3],
        uri=row[4],
        schema=TableSchema.parse(orjson.loads(row[5])),
        created_at=row[6],
        applied_version=row[7],
        next_row_id=row[8],
        clustering=tuple(orjson.loads(row[9])),
        properties={**DEFAULT_PROPERTIES, **orjson.loads(row[10])},
    )


def to_channel(row: tuple) -> ChannelRecord:  # type: ignore[type-arg]
    return ChannelRecord(*row)


def to_stream(row: tuple) -> StreamRecord:  # type: ignore[type-arg]
    bases = tuple(sorted((int(t), int(v)) for t, v in orjson.loads(row[14] or "[]")))
    uids = tuple(orjson.loads(row[13] or "[]"))
    return StreamRecord(*row[:12], row[12], uids, bases)  # type: ignore[call-arg, arg-type]


def to_claim(item: list) -> StreamClaim:  # type: ignore[type-arg]
    """A claim as :func:`claims_text` wrote it (three items before streams on views)."""
    bases = tuple((int(t), int(v)) for t, v in item[3]) if len(item) > 3 else ()
    return StreamClaim(item[0], item[1], item[2], bases)


def claims_text(claims: Sequence[StreamClaim]) -> str:
    return orjson.dumps([[c.stream_id, c.expected, c.new, [list(b) for b in c.bases]]
                         for c in claims]).decode()  # fmt: skip


def to_pending(row: tuple) -> PendingCommit:  # type: ignore[type-arg]
    plan = orjson.loads(row[2])
    claims = tuple(to_claim(claim) for claim in orjson.loads(row[3]))
    if row[6]:
        intents = tuple(CommitIntent(table_id, kind) for table_id, kind in orjson.loads(row[6]))
    else:  # recorded by a version without intents: every table of its plan
        kinds = {False: APPEND_INTENT, True: ROWS_INTENT}
        intents = tuple(
            CommitIntent(
                entry["table_id"], kinds[(entry.get("staged") or {}).get("kind") == "merge"]
            )
            for entry in plan.get("tables", [])
        )
    return PendingCommit(row[0], row[1], plan, claims, row[4], row[5], intents, row[7])


def namespace_statements(
    database: str, schema_name: str, now: float
) -> list[tuple[str, tuple[Any, ...]]]:
    """Statements recording that a schema and its database exist (kept if recorded)."""
    return [
        ("INSERT INTO databases VALUES (?, ?) ON CONFLICT DO NOTHING", (database, now)),
        (
            "INSERT INTO schemas VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (database, schema_name, now),
        ),
    ]


def find_databases(db: sqlite3.Connection, name: str | None = None) -> list[DatabaseRecord]:
    """The databases (one, or all) as :data:`NAMED_DATABASES` finds them."""
    where, args = ("WHERE database=?", (name,)) if name is not None else ("", ())
    rows = db.execute(
        f"SELECT database, MIN(created_at) FROM ({NAMED_DATABASES}) named {where}"
        " GROUP BY database ORDER BY database",
        args,
    ).fetchall()
    return [DatabaseRecord(*row) for row in rows]


def find_schemas(
    db: sqlite3.Connection, database: str | None = None, name: str | None = None
) -> list[SchemaRecord]:
    conditions = [(c, v) for c, v in (("database=?", database), ("name=?", name)) if v is not None]
    where = f"WHERE {' AND '.join(c for c, _ in conditions)}" if conditions else ""
    rows = db.execute(
        f"SELECT database, name, MIN(created_at) FROM ({NAMED_SCHEMAS}) named {where}"
        " GROUP BY database, name ORDER BY database, name",
        tuple(v for _, v in conditions),
    ).fetchall()
    return [SchemaRecord(*row) for row in rows]


def drop_contents(
    db: sqlite3.Connection, where: str, args: tuple[str, ...], what: str, cascade: bool
) -> list[TableInfo]:
    """Inside a write transaction: delete the tables (with their channels and compaction
    history), streams, views and change streams matching ``where``, or refuse if there
    are any and not ``cascade``. Returns the tables deleted."""
    tables = [
        to_table(row)
        for row in db.execute(
            f"SELECT {TABLE_COLUMNS} FROM tables WHERE {where} ORDER BY schema_name, name", args
        )
    ]
    streams = [
        full_name(*row)
        for row in db.execute(
            f"SELECT database, schema_name, name FROM streams WHERE {where}"
            " ORDER BY schema_name, name",
            args,
        )
    ]
    views = [
        full_name(*row)
        for row in db.execute(
            f"SELECT database, schema_name, name FROM views WHERE {where}"
            " ORDER BY schema_name, name",
            args,
        )
    ]
    change_streams = [
        full_name(*row)
        for row in db.execute(
            f"SELECT database, schema_name, name FROM change_streams WHERE {where}"
            " ORDER BY schema_name, name",
            args,
        )
    ]
    if (tables or streams or views or change_streams) and not cascade:
        raise ObjectNotEmptyError(
            what, [t.full_name for t in tables], streams, views, change_streams
        )
    check_not_busy(db, [t.id for t in tables])
    db.execute(f"DELETE FROM streams WHERE {where}", args)
    db.execute(f"DELETE FROM views WHERE {where}", args)
    db.execute(f"DELETE FROM change_streams WHERE {where}", args)
    db.execute(ORPHAN_PARTITIONS)
    db.execute(ORPHAN_HISTORY)
    db.execute(ORPHAN_OFFSETS)
    for table in tables:  # after its change streams: those that stay decide its keeping
        forget_table(db, table.id)
    return tables


def check_not_busy(db: sqlite3.Connection, table_ids: list[int]) -> None:
    """Inside a write transaction: refuse to drop tables a pending commit names (its
    roll-forward must find them).

    Raises:
        TableBusyError: a pending commit holds an intent on one of ``table_ids``.
    """
    wanted = set(table_ids)
    rows = db.execute(f"SELECT {PENDING_COLUMNS} FROM pending_commits").fetchall()
    holders = [p for p in map(to_pending, rows) if any(i.table_id in wanted for i in p.intents)]
    if holders:
        busy = sorted({i.table_id for p in holders for i in p.intents if i.table_id in wanted})
        raise TableBusyError(busy, [p.id for p in holders])


#: The longest retention of the change streams that watch a table (``?``), now or in a
#: definition still kept (the history), or every table (``FOR ALL``); NULL: none does.
_WATCHED_FOR = (
    "SELECT max(retention_s) FROM change_streams c WHERE c.for_all = 1"
    " OR EXISTS (SELECT 1 FROM json_each(c.table_ids) WHERE value = ?)"
    " OR EXISTS (SELECT 1 FROM change_stream_history h WHERE h.stream_uid = c.uid AND"
    " (h.for_all = 1 OR EXISTS (SELECT 1 FROM json_each(h.table_ids) WHERE value = ?)))"
)


def forget_table(db: sqlite3.Connection, table_id: int, name: str | None = None) -> None:
    """Inside a write transaction: delete a table's row with its channels, compaction
    history and dynamic-table rows (its streams stay: stale until replaced or dropped).

    The row moves to ``dropped_tables`` (named ``name`` if given: a table moved aside
    before its drop), kept as long as the change streams that watch it keep their
    records (none: at once), so that what they recorded before the drop stays readable;
    its folder goes when it expires (``purge_dropped`` in flush.catalog_tables)."""
    keep_s = db.execute(_WATCHED_FOR, (table_id, table_id)).fetchone()[0] or 0
    now = int(time.time() * 1_000_000)
    db.execute(
        f"INSERT INTO dropped_tables ({TABLE_COLUMNS}, dropped_us, keep_until_us)"
        f" SELECT {TABLE_COLUMNS}, ?, ? FROM tables WHERE id=? {_REPLACE_DROPPED}",
        (now, now + keep_s * 1_000_000, table_id),
    )
    if name is not None:
        db.execute("UPDATE dropped_tables SET name=? WHERE id=?", (name, table_id))
    db.execute("DELETE FROM tables WHERE id=?", (table_id,))
    db.execute("DELETE FROM channels WHERE table_id=?", (table_id,))
    db.execute("DELETE FROM migrations WHERE table_id=?", (table_id,))
    drop_dynamic_rows(db, table_id)


def drop_dynamic_rows(db: sqlite3.Connection, table_id: int) -> None:
    """Inside a write transaction: forget a dropped table's dynamic-table definition,
    sources and refresh history (nothing if it was a plain table)."""
    db.execute("DELETE FROM dynamic_tables WHERE table_id=?", (table_id,))
    db.execute("DELETE FROM dynamic_table_sources WHERE dt_table_id=?", (table_id,))
    db.execute("DELETE FROM dynamic_table_refreshes WHERE dt_table_id=?", (table_id,))
