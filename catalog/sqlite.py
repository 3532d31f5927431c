"""The embedded catalog: one SQLite file in WAL mode with full fsync.

It is an index. The Delta log is the point of truth for what is committed, and
:meth:`SqliteCatalog.apply_commit` is how flush commits reach the index (after each
flush, and again at start-up for any commit the index missed). What lives only here
is made durable before it is acknowledged: databases and schemas, table definitions,
channel generations (bumped on every open), row-id reservations, streams and pending
pipeline commits. A database or schema also exists while a table or stream names it
(see :data:`NAMED_SCHEMAS`).
Several processes (the service, SQL sessions) may share one file: every write is one
``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import contextlib
import math
import sqlite3
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar, cast

import orjson

from catalog.base import (
    Catalog,
    ObjectAlreadyExistsError,
    RowIdsExhaustedError,
)
from catalog.records import (
    ChannelRecord,
    CommitRecord,
    DatabaseRecord,
    SchemaRecord,
    StreamRecord,
    TableInfo,
)
from catalog.sql_values import INT64_MAX, CheckedConnection, printable_reports
from catalog.sqlite_change_streams import ChangeStreamStore
from catalog.sqlite_commits import PendingCommitStore
from catalog.sqlite_dynamic import DynamicTableStore
from catalog.sqlite_layout import (
    CHANNEL_COLUMNS,
    MIGRATION_COLUMNS,
    ORPHAN_OFFSETS,
    STREAM_COLUMNS,
    TABLE_COLUMNS,
    IntegrityError,
    check_not_busy,
    drop_contents,
    find_databases,
    find_schemas,
    forget_table,
    namespace_statements,
    to_channel,
    to_stream,
    to_table,
)
from catalog.sqlite_views import ViewStore
from ingest_sdk import TableSchema
from ingest_sdk.errors import TableAlreadyExistsError, TableNotFoundError
from ingest_sdk.schema import quote_identifier
from ingest_sdk.wire import pack_txn_version

__all__ = ["SqlCatalog"]

_T = TypeVar("_T")


class SqlCatalog(PendingCommitStore, ViewStore, DynamicTableStore, ChangeStreamStore, Catalog):
    """The catalog's operations, in SQL that SQLite and PostgreSQL both run (see
    :mod:`catalog.postgres` for the few forms it rewrites). Calls are short and serialised
    by a lock, so the event loop and the flush threads can share one connection; other
    processes wait for the database's write lock: every write transaction holds the
    catalog's one lock, so writes mean the same on both databases.

    A subclass says how a call gets a connection (:meth:`_query`, :meth:`_transaction`)
    and how its transactions begin.
    """

    #: The statements that begin a write transaction, and a read-only snapshot.
    _BEGIN_WRITE: tuple[str, ...] = ("BEGIN IMMEDIATE",)
    _BEGIN_SNAPSHOT: tuple[str, ...] = ("BEGIN DEFERRED",)

    @abstractmethod
    def _query(self, read: Callable[..., _T], *args: Any) -> _T:
        """``read(connection, *args)`` outside a transaction: statements that change
        nothing."""

    @abstractmethod
    def _transaction(self, begin: tuple[str, ...]) -> _Transaction:
        """A ``with`` block of one transaction begun by ``begin``: committed at its end,
        rolled back on an error."""

    def _write(self, statements: list[tuple[str, tuple]]) -> list[int]:  # type: ignore[type-arg]
        with self._immediate() as db:
            return [db.execute(sql, args).rowcount for sql, args in statements]

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:  # type: ignore[type-arg]
        return self._checked_query(_fetch_all, sql, args)

    def _checked_query(self, read: Callable[..., _T], *args: Any) -> _T:
        """:meth:`_query` on a connection whose statements' arguments are checked
        (:mod:`catalog.sql_values`), as every read of the catalog's is."""
        return self._query(_checking(read), *args)

    def _immediate(self) -> _Transaction:
        """A write transaction for reads and writes that must see no one in between."""
        return _checked_transaction(self._transaction(self._BEGIN_WRITE))

    def _snapshot(self) -> _Transaction:
        """A read transaction: several reads of one state, without the write lock."""
        return _checked_transaction(self._transaction(self._BEGIN_SNAPSHOT))

    # Databases and schemas
    def create_database(self, name: str) -> tuple[DatabaseRecord, bool]:
        now = time.time()
        with self._immediate() as db:
            existing = find_databases(db, name)
            # Recorded even when only implied, so it outlives the tables that implied it.
            db.execute("INSERT INTO databases VALUES (?, ?) ON CONFLICT DO NOTHING", (name, now))
        return (existing[0], False) if existing else (DatabaseRecord(name, now), True)

    def create_schema(self, database: str, name: str) -> tuple[SchemaRecord, bool]:
        now = time.time()
        with self._immediate() as db:
            existing = find_schemas(db, database, name)
            for sql, args in namespace_statements(database, name, now):
                db.execute(sql, args)
        return (existing[0], False) if existing else (SchemaRecord(database, name, now), True)

    def get_database(self, name: str) -> DatabaseRecord | None:
        found = self._checked_query(find_databases, name)
        return found[0] if found else None

    def get_schema(self, database: str, name: str) -> SchemaRecord | None:
        found = self._checked_query(find_schemas, database, name)
        return found[0] if found else None

    def list_databases(self) -> list[DatabaseRecord]:
        return self._checked_query(find_databases)

    def list_schemas(self, database: str | None = None) -> list[SchemaRecord]:
        return self._checked_query(find_schemas, database)

    def drop_database(self, name: str, cascade: bool = False) -> list[TableInfo] | None:
        with self._immediate() as db:
            if not find_databases(db, name):
                return None
            what = f"database {quote_identifier(name)}"
            dropped = drop_contents(db, "database=?", (name,), what, cascade)
            db.execute("DELETE FROM schemas WHERE database=?", (name,))
            db.execute("DELETE FROM databases WHERE name=?", (name,))
        return dropped

    def drop_schema(
        self, database: str, name: str, cascade: bool = False
    ) -> list[TableInfo] | None:
        with self._immediate() as db:
            if not find_schemas(db, database, name):
                return None
            what = f"schema {SchemaRecord(database, name, 0.0).full_name}"
            dropped = drop_contents(
                db, "database=? AND schema_name=?", (database, name), what, cascade
            )
            db.execute("DELETE FROM schemas WHERE database=? AND name=?", (database, name))
        return dropped

    # Tables
    def create_table(
        self, database: str, schema_name: str, name: str, uri: str, schema: TableSchema,
        properties: dict[str, Any] | None = None,
    ) -> TableInfo:  # fmt: skip
        now = time.time()
        try:
            self._write(
                [
                    *namespace_statements(database, schema_name, now),
                    (
                        "INSERT INTO tables (database, schema_name, name, uri, columns, "
                        "created_at, properties) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (
                            database,
                            schema_name,
                            name,
                            uri,
                            orjson.dumps(schema.declarations()).decode(),
                            now,
                            orjson.dumps(properties or {}).decode(),
                        ),
                    ),
                ]
            )
        except IntegrityError as exc:
            raise TableAlreadyExistsError(
                f"table {database}.{schema_name}.{name} already exists; use if_not_exists=True "
                "to keep it, or drop it first"
            ) from exc
        return self.get_table(database, schema_name, name)

    def get_table(self, database: str, schema_name: str, name: str) -> TableInfo:
        rows = self._read(
            f"SELECT {TABLE_COLUMNS} FROM tables WHERE database=? AND schema_name=? AND name=?",
            (database, schema_name, name),
        )
        if not rows:
            raise TableNotFoundError(
                f"table {database}.{schema_name}.{name} does not exist; create it with "
                "create_table first (names are case-insensitive unless quoted)"
            )
        return to_table(rows[0])

    def get_table_by_id(self, table_id: int) -> TableInfo | None:
        rows = self._read(f"SELECT {TABLE_COLUMNS} FROM tables WHERE id=?", (table_id,))
        return to_table(rows[0]) if rows else None

    def list_tables(self) -> list[TableInfo]:
        rows = self._read(
            f"SELECT {TABLE_COLUMNS} FROM tables ORDER BY database, schema_name, name"
        )
        return [to_table(row) for row in rows]

    def drop_table(self, table_id: int, name: str | None = None) -> None:
        # Streams stay: a stream on a dropped table is stale until replaced or dropped.
        with self._immediate() as db:
            check_not_busy(db, [table_id])
            forget_table(db, table_id, name)

    def list_dropped_tables(self) -> list[tuple[TableInfo, int]]:
        rows = self._read(f"SELECT {TABLE_COLUMNS}, dropped_us FROM dropped_tables ORDER BY id")
        return [(to_table(row[:-1]), int(row[-1])) for row in rows]

    def expired_dropped_tables(self, now_us: int) -> list[TableInfo]:
        rows = self._read(
            f"SELECT {TABLE_COLUMNS} FROM dropped_tables WHERE keep_until_us <= ?", (now_us,)
        )
        return [to_table(row) for row in rows]

    def forget_dropped_table(self, table_id: int) -> None:
        self._write([
            ("DELETE FROM dropped_tables WHERE id=?", (table_id,)),
            ("DELETE FROM change_stream_seals WHERE table_id=?", (table_id,)),
        ])  # fmt: skip

    def open_channel(
        self, table_id: int, name: str, min_generation: int = 1, server: str = ""
    ) -> ChannelRecord:
        now = time.time()
        with self._immediate() as db:  # bumped and read back in one transaction
            row = db.execute(
                "INSERT INTO channels (table_id, name, generation, last_activity, created_at,"
                " committed_position, server)"
                " VALUES (?, ?, CASE WHEN ? > 1 THEN ? ELSE 1 END, ?, ?, 0, ?)"
                " ON CONFLICT (table_id, name) DO UPDATE SET generation = CASE"
                " WHEN excluded.generation > channels.generation + 1"
                " THEN excluded.generation ELSE channels.generation + 1 END,"
                " last_activity = excluded.last_activity, server = excluded.server"
                f" RETURNING {CHANNEL_COLUMNS}",
                (table_id, name, min_generation, min_generation, now, now, server),
            ).fetchone()
        return to_channel(row)

    def get_channel(self, table_id: int, name: str) -> ChannelRecord | None:
        rows = self._read(
            f"SELECT {CHANNEL_COLUMNS} FROM channels WHERE table_id=? AND name=?", (table_id, name)
        )
        return to_channel(rows[0]) if rows else None

    def list_channels(self, table_id: int | None = None) -> list[ChannelRecord]:
        if table_id is None:
            rows = self._read(f"SELECT {CHANNEL_COLUMNS} FROM channels ORDER BY table_id, name")
        else:
            rows = self._read(
                f"SELECT {CHANNEL_COLUMNS} FROM channels WHERE table_id=? ORDER BY name",
                (table_id,),
            )
        return [to_channel(row) for row in rows]

    def drop_channel(self, table_id: int, name: str) -> bool:
        (count,) = self._write(
            [("DELETE FROM channels WHERE table_id=? AND name=?", (table_id, name))]
        )
        return count > 0

    def apply_commit(self, table_id: int, record: CommitRecord) -> bool:
        """Record one flush commit; idempotent; False if the catalog holds no such table
        (dropped, perhaps while the commit travelled). Each channel moves by its own position
        (generation, batch_seq), so a commit applied after a newer one of another writer
        (several services on one table) still records its channels, and an older position
        never overwrites a newer one. A channel whose position predates their keeping
        (an upgraded catalog) moves with a commit above the applied version of the
        upgrade: the older code recorded every commit up to it."""
        now = time.time()
        with self._immediate() as db:
            (positions_from,) = db.execute(
                "SELECT positions_from FROM tables WHERE id=?", (table_id,)
            ).fetchone() or (None,)
            if positions_from is None:
                return False
            newer = int(record.version > positions_from)
            for progress in record.channels:
                position = pack_txn_version(progress.generation, progress.batch_seq)
                db.execute(
                    "UPDATE channels SET offset_token=?, rows_committed=rows_committed+?,"
                    " last_activity=?, committed_position=? WHERE table_id=? AND name=? AND"
                    " (committed_position < ? OR (committed_position IS NULL AND ? = 1))",
                    (progress.offset_token, progress.rows, now, position, table_id,
                     progress.channel, position, newer),
                )  # fmt: skip
            db.execute(
                "UPDATE tables SET applied_version=CASE WHEN applied_version > ?"
                " THEN applied_version ELSE ? END, next_row_id=CASE WHEN next_row_id > ?"
                " THEN next_row_id ELSE ? END WHERE id=?",
                (record.version, record.version, record.next_row_id, record.next_row_id,
                 table_id),
            )  # fmt: skip
        return True

    def rename_table(self, table_id: int, database: str, schema_name: str, name: str) -> None:
        now = time.time()
        try:
            *_, count = self._write(
                [
                    *namespace_statements(database, schema_name, now),
                    (
                        "UPDATE tables SET database=?, schema_name=?, name=? WHERE id=?",
                        (database, schema_name, name, table_id),
                    ),
                ]
            )
        except IntegrityError as exc:
            raise TableAlreadyExistsError(
                f"table {database}.{schema_name}.{name} already exists; choose another name"
            ) from exc
        if count == 0:
            raise TableNotFoundError(f"table id {table_id} does not exist any more")

    def set_table_properties(self, table_id: int, properties: dict[str, Any]) -> TableInfo:
        with self._immediate() as db:
            row = db.execute("SELECT properties FROM tables WHERE id=?", (table_id,)).fetchone()
            if row is None:
                raise TableNotFoundError(f"table id {table_id} does not exist any more")
            merged = {**orjson.loads(row[0]), **properties}
            db.execute(
                "UPDATE tables SET properties=? WHERE id=?",
                (orjson.dumps(merged).decode(), table_id),
            )
        info = self.get_table_by_id(table_id)
        assert info is not None
        return info

    def reserve_row_ids(self, table_id: int, count: int) -> int:
        if count < 0:
            raise ValueError(f"cannot reserve {count} row ids")
        with self._immediate() as db:
            # Checked before the sum, which SQLite would take past 64 bits as a float.
            row = db.execute(
                "UPDATE tables SET next_row_id = next_row_id + ? WHERE id=? AND next_row_id <= ?"
                " RETURNING next_row_id",
                (count, table_id, INT64_MAX - min(count, INT64_MAX)),
            ).fetchone()
            if row is None:
                left = db.execute("SELECT ? - next_row_id FROM tables WHERE id=?",
                                  (INT64_MAX, table_id)).fetchone()  # fmt: skip
        if row is None and left is not None:
            raise RowIdsExhaustedError(
                f"table id {table_id} has {left[0]} row ids left, fewer than the {count} "
                "asked for: its sequence cannot pass 2**63 - 1; copy its rows into a new table"
            )
        if row is None:
            raise TableNotFoundError(f"table id {table_id} does not exist any more")
        return int(row[0]) - count

    def take_lease(self, name: str, holder: str, seconds: float, now: float | None = None) -> bool:
        moment = time.time() if now is None else now
        with self._immediate() as db:
            row = db.execute("SELECT holder, expires_at FROM leases WHERE name=?", (name,))
            current = row.fetchone()
            if current is not None and current[0] != holder and current[1] > moment:
                return False
            db.execute(
                "INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?) ON CONFLICT"
                " (name) DO UPDATE SET holder=excluded.holder, expires_at=excluded.expires_at",
                (name, holder, moment + seconds),
            )
        return True

    def release_lease(self, name: str, holder: str) -> None:
        self._write([("DELETE FROM leases WHERE name=? AND holder=?", (name, holder))])

    def lease_holder(self, name: str) -> tuple[str, float] | None:
        rows = self._read("SELECT holder, expires_at FROM leases WHERE name=?", (name,))
        return (str(rows[0][0]), float(rows[0][1])) if rows else None

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
        """Record one compaction run (keys as :data:`MIGRATION_COLUMNS`, without ids)."""
        names = MIGRATION_COLUMNS.split(", ")[2:]
        run = printable_reports(run)  # its error may quote any text
        with self._immediate() as db:
            (run_id,) = db.execute(
                f"INSERT INTO migrations (table_id, {', '.join(names)}) VALUES "
                f"(?, {', '.join('?' for _ in names)}) RETURNING id",
                (table_id, *(run.get(name) for name in names)),
            ).fetchone()
        return int(run_id)

    def list_migrations(self, table_id: int) -> list[dict[str, Any]]:
        rows = self._read(
            f"SELECT {MIGRATION_COLUMNS} FROM migrations WHERE table_id=? ORDER BY id", (table_id,)
        )
        names = MIGRATION_COLUMNS.split(", ")
        return [dict(zip(names, row, strict=True)) for row in rows]

    def remove_inactive_channels(self, before: float, keep: set[tuple[int, str]]) -> int:
        if math.isnan(before):  # no moment: compares true on PostgreSQL, false on SQLite
            return 0
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

    def create_stream(
        self,
        database: str,
        schema_name: str,
        name: str,
        table_id: int,
        mode: str,
        offset_version: int,
        comment: str = "",
        replace: bool = False,
        view: tuple[int, Sequence[str], Mapping[int, int]] | None = None,
    ) -> StreamRecord:
        now = time.time()
        view_id, uids, bases = view if view is not None else (None, (), {})
        with self._immediate() as db:
            if replace:
                db.execute(
                    "DELETE FROM streams WHERE database=? AND schema_name=? AND name=?",
                    (database, schema_name, name),
                )
                db.execute(ORPHAN_OFFSETS)
            for sql, args in namespace_statements(database, schema_name, now):
                db.execute(sql, args)
            try:
                (stream_id,) = db.execute(
                    "INSERT INTO streams (database, schema_name, name, table_id, mode,"
                    " offset_version, created_at, offset_moved_at, comment, uid, view_id,"
                    " view_uids) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (database, schema_name, name, table_id, mode, offset_version, now, now,
                     comment, uuid.uuid4().hex, view_id, orjson.dumps(list(uids)).decode()),
                ).fetchone()  # fmt: skip
            except IntegrityError as exc:
                raise ObjectAlreadyExistsError(
                    f"stream {database}.{schema_name}.{name} already exists; use CREATE OR "
                    "REPLACE STREAM to recreate it, or IF NOT EXISTS to keep it"
                ) from exc
            db.executemany(
                "INSERT INTO stream_offsets (stream_id, table_id, version) VALUES (?, ?, ?)",
                [(stream_id, t, v) for t, v in sorted(bases.items())],
            )
        stream = self.get_stream(database, schema_name, name)
        assert stream is not None
        return stream

    def get_stream(self, database: str, schema_name: str, name: str) -> StreamRecord | None:
        rows = self._read(
            f"SELECT {STREAM_COLUMNS} FROM streams WHERE database=? AND schema_name=? AND name=?",
            (database, schema_name, name),
        )
        return to_stream(rows[0]) if rows else None

    def get_stream_by_id(self, stream_id: int) -> StreamRecord | None:
        rows = self._read(f"SELECT {STREAM_COLUMNS} FROM streams WHERE id=?", (stream_id,))
        return to_stream(rows[0]) if rows else None

    def list_streams(self, table_id: int | None = None) -> list[StreamRecord]:
        where, args = "", tuple[int, ...]()
        if table_id is not None:  # its own streams, and streams on views that read it
            where = ("WHERE table_id=? OR id IN"
                     " (SELECT stream_id FROM stream_offsets WHERE table_id=?)")  # fmt: skip
            args = (table_id, table_id)
        rows = self._read(
            f"SELECT {STREAM_COLUMNS} FROM streams {where} ORDER BY database, schema_name, name",
            args,
        )
        return [to_stream(row) for row in rows]

    def drop_stream(self, stream_id: int) -> bool:
        count, _ = self._write([("DELETE FROM streams WHERE id=?", (stream_id,)),
                                (ORPHAN_OFFSETS, ())])  # fmt: skip
        return count > 0


def _fetch_all(db: sqlite3.Connection, sql: str, args: tuple) -> list[tuple]:  # type: ignore[type-arg]
    return db.execute(sql, args).fetchall()


def _checking(read: Callable[..., _T]) -> Callable[..., _T]:
    """``read`` on the connection with each statement's arguments checked
    (:mod:`catalog.sql_values`)."""

    def on_checked(db: sqlite3.Connection, *args: Any) -> _T:
        return read(cast(sqlite3.Connection, CheckedConnection(db)), *args)

    return on_checked


@contextlib.contextmanager
def _checked_transaction(
    transaction: AbstractContextManager[sqlite3.Connection],
) -> Iterator[sqlite3.Connection]:
    """A transaction whose statements' arguments are checked (:mod:`catalog.sql_values`)."""
    with transaction as db:
        yield cast(sqlite3.Connection, CheckedConnection(db))


#: A ``with`` block of one transaction, whatever the connection (the stores' type of it).
_Transaction = AbstractContextManager[sqlite3.Connection]
