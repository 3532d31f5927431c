"""The catalog: databases, schemas, tables and channels.

It is an index. The Delta log is the point of truth for what is committed, and
:meth:`Catalog.apply_commit` is how commits reach the index (after each flush,
and again at start-up for any commit the index missed). Two things live only
here and are made durable before they are acknowledged: table definitions and
channel generations (bumped on every open, see docs/architecture.md, the commit protocol).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from flush.commit import CommitRecord
from ingest_sdk import TableSchema
from ingest_sdk.errors import TableAlreadyExistsError, TableNotFoundError
from ingest_sdk.schema import quote_identifier

__all__ = ["Catalog", "ChannelRecord", "SqliteCatalog", "TableInfo"]


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table as the catalog knows it. ``id`` is never reused, so a dropped and
    recreated table is a new table with new channels."""

    id: int
    database: str
    schema_name: str
    name: str
    uri: str
    schema: TableSchema
    created_at: float
    applied_version: int
    next_row_id: int
    clustering: tuple[str, ...] = ()

    @property
    def full_name(self) -> str:
        """``DB.SCHEMA.TABLE``, parts quoted where needed, so the name reads back as this
        table (``DB.S."with space"``)."""
        return ".".join(quote_identifier(p) for p in (self.database, self.schema_name, self.name))


@dataclass(frozen=True, slots=True)
class ChannelRecord:
    """A channel's durable state: generation and what is committed."""

    table_id: int
    name: str
    generation: int
    offset_token: str | None
    rows_committed: int
    last_activity: float
    created_at: float


class Catalog(ABC):
    """What the service needs from a catalog; :class:`SqliteCatalog` is the default."""

    @abstractmethod
    def create_table(
        self, database: str, schema_name: str, name: str, uri: str, schema: TableSchema
    ) -> TableInfo: ...

    @abstractmethod
    def get_table(self, database: str, schema_name: str, name: str) -> TableInfo: ...

    @abstractmethod
    def get_table_by_id(self, table_id: int) -> TableInfo | None: ...

    @abstractmethod
    def list_tables(self) -> list[TableInfo]: ...

    @abstractmethod
    def drop_table(self, table_id: int) -> None: ...

    @abstractmethod
    def open_channel(self, table_id: int, name: str, min_generation: int = 1) -> ChannelRecord:
        """Open or reopen a channel: its generation becomes one more than before, and at
        least ``min_generation`` (the service passes one more than the generation the
        table's Delta log holds, since a dropped or retired channel's row is gone)."""

    @abstractmethod
    def get_channel(self, table_id: int, name: str) -> ChannelRecord | None: ...

    @abstractmethod
    def list_channels(self, table_id: int | None = None) -> list[ChannelRecord]: ...

    @abstractmethod
    def drop_channel(self, table_id: int, name: str) -> bool: ...

    @abstractmethod
    def apply_commit(self, table_id: int, record: CommitRecord) -> None: ...

    @abstractmethod
    def remove_inactive_channels(self, before: float, keep: set[tuple[int, str]]) -> int: ...

    @abstractmethod
    def set_clustering(self, table_id: int, columns: tuple[str, ...]) -> None: ...

    @abstractmethod
    def record_migration(self, table_id: int, run: dict[str, Any]) -> int: ...

    @abstractmethod
    def list_migrations(self, table_id: int) -> list[dict[str, Any]]: ...

    @abstractmethod
    def close(self) -> None: ...


_SCHEMA = """
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
    clustering TEXT NOT NULL DEFAULT '[]',
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
    last_activity REAL NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (table_id, name));
"""
_TABLE_COLUMNS = (
    "id, database, schema_name, name, uri, columns, created_at, applied_version, next_row_id,"
    " clustering"
)
_MIGRATION_COLUMNS = (
    "id, table_id, started_at, ended_at, status, files_in, bytes_in, rows_in, files_out,"
    " bytes_out, rows_out, version, error"
)
_CHANNEL_COLUMNS = (
    "table_id, name, generation, offset_token, rows_committed, last_activity, created_at"
)


def _table(row: tuple) -> TableInfo:  # type: ignore[type-arg]
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
    )


def _channel(row: tuple) -> ChannelRecord:  # type: ignore[type-arg]
    return ChannelRecord(*row)


class SqliteCatalog(Catalog):
    """The embedded catalog: one SQLite file in WAL mode with full fsync.

    Calls are short and serialised by a lock, so the event loop and the flush
    threads can share one connection.
    """

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a generation bump must survive power loss
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, statements: list[tuple[str, tuple]]) -> list[int]:  # type: ignore[type-arg]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                counts = [self._db.execute(sql, args).rowcount for sql, args in statements]
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return counts

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:  # type: ignore[type-arg]
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def create_table(
        self, database: str, schema_name: str, name: str, uri: str, schema: TableSchema
    ) -> TableInfo:
        now = time.time()
        try:
            self._write(
                [
                    ("INSERT OR IGNORE INTO databases VALUES (?, ?)", (database, now)),
                    (
                        "INSERT OR IGNORE INTO schemas VALUES (?, ?, ?)",
                        (database, schema_name, now),
                    ),
                    (
                        "INSERT INTO tables (database, schema_name, name, uri, columns, created_at)"
                        " VALUES (?, ?, ?, ?, ?, ?)",
                        (
                            database,
                            schema_name,
                            name,
                            uri,
                            orjson.dumps(schema.declarations()).decode(),
                            now,
                        ),
                    ),
                ]
            )
        except sqlite3.IntegrityError as exc:
            raise TableAlreadyExistsError(
                f"table {database}.{schema_name}.{name} already exists; use if_not_exists=True "
                "to keep it, or drop it first"
            ) from exc
        return self.get_table(database, schema_name, name)

    def get_table(self, database: str, schema_name: str, name: str) -> TableInfo:
        rows = self._read(
            f"SELECT {_TABLE_COLUMNS} FROM tables WHERE database=? AND schema_name=? AND name=?",
            (database, schema_name, name),
        )
        if not rows:
            raise TableNotFoundError(
                f"table {database}.{schema_name}.{name} does not exist; create it with "
                "create_table first (names are case-insensitive unless quoted)"
            )
        return _table(rows[0])

    def get_table_by_id(self, table_id: int) -> TableInfo | None:
        rows = self._read(f"SELECT {_TABLE_COLUMNS} FROM tables WHERE id=?", (table_id,))
        return _table(rows[0]) if rows else None

    def list_tables(self) -> list[TableInfo]:
        rows = self._read(
            f"SELECT {_TABLE_COLUMNS} FROM tables ORDER BY database, schema_name, name"
        )
        return [_table(row) for row in rows]

    def drop_table(self, table_id: int) -> None:
        self._write(
            [
                ("DELETE FROM channels WHERE table_id=?", (table_id,)),
                ("DELETE FROM migrations WHERE table_id=?", (table_id,)),
                ("DELETE FROM tables WHERE id=?", (table_id,)),
            ]
        )

    def open_channel(self, table_id: int, name: str, min_generation: int = 1) -> ChannelRecord:
        now = time.time()
        self._write(
            [
                (
                    "INSERT INTO channels (table_id, name, generation, last_activity, created_at)"
                    " VALUES (?, ?, MAX(1, ?), ?, ?) ON CONFLICT (table_id, name) DO UPDATE SET"
                    " generation = MAX(generation + 1, excluded.generation),"
                    " last_activity = excluded.last_activity",
                    (table_id, name, min_generation, now, now),
                )
            ]
        )
        record = self.get_channel(table_id, name)
        assert record is not None
        return record

    def get_channel(self, table_id: int, name: str) -> ChannelRecord | None:
        rows = self._read(
            f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE table_id=? AND name=?", (table_id, name)
        )
        return _channel(rows[0]) if rows else None

    def list_channels(self, table_id: int | None = None) -> list[ChannelRecord]:
        if table_id is None:
            rows = self._read(f"SELECT {_CHANNEL_COLUMNS} FROM channels ORDER BY table_id, name")
        else:
            rows = self._read(
                f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE table_id=? ORDER BY name",
                (table_id,),
            )
        return [_channel(row) for row in rows]

    def drop_channel(self, table_id: int, name: str) -> bool:
        (count,) = self._write(
            [("DELETE FROM channels WHERE table_id=? AND name=?", (table_id, name))]
        )
        return count > 0

    def apply_commit(self, table_id: int, record: CommitRecord) -> None:
        """Record one flush commit; idempotent, and older commits never overwrite newer ones."""
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                (applied,) = self._db.execute(
                    "SELECT applied_version FROM tables WHERE id=?", (table_id,)
                ).fetchone() or (None,)
                if applied is None or applied >= record.version:
                    self._db.execute("ROLLBACK")
                    return
                for progress in record.channels:
                    self._db.execute(
                        "UPDATE channels SET offset_token=?, rows_committed=rows_committed+?,"
                        " last_activity=? WHERE table_id=? AND name=?",
                        (progress.offset_token, progress.rows, now, table_id, progress.channel),
                    )
                self._db.execute(
                    "UPDATE tables SET applied_version=?, next_row_id=MAX(next_row_id, ?)"
                    " WHERE id=?",
                    (record.version, record.next_row_id, table_id),
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def set_clustering(self, table_id: int, columns: tuple[str, ...]) -> None:
        self._write(
            [
                (
                    "UPDATE tables SET clustering=? WHERE id=?",
                    (orjson.dumps(list(columns)).decode(), table_id),
                )
            ]
        )

    def record_migration(self, table_id: int, run: dict[str, Any]) -> int:
        """Record one compaction run (keys as :data:`_MIGRATION_COLUMNS`, without ids)."""
        names = _MIGRATION_COLUMNS.split(", ")[2:]
        with self._lock:
            cursor = self._db.execute(
                f"INSERT INTO migrations (table_id, {', '.join(names)}) VALUES "
                f"(?, {', '.join('?' for _ in names)})",
                (table_id, *(run.get(name) for name in names)),
            )
            return int(cursor.lastrowid or 0)

    def list_migrations(self, table_id: int) -> list[dict[str, Any]]:
        rows = self._read(
            f"SELECT {_MIGRATION_COLUMNS} FROM migrations WHERE table_id=? ORDER BY id", (table_id,)
        )
        names = _MIGRATION_COLUMNS.split(", ")
        return [dict(zip(names, row, strict=True)) for row in rows]

    def remove_inactive_channels(self, before: float, keep: set[tuple[int, str]]) -> int:
        stale = [
            (table_id, name)
            for table_id, name in self._read(
                "SELECT table_id, name FROM channels WHERE last_activity < ?", (before,)
            )
            if (table_id, name) not in keep
        ]
        if stale:
            self._write(
                [("DELETE FROM channels WHERE table_id=? AND name=?", key) for key in stale]
            )
        return len(stale)
