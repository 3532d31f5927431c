"""The embedded catalog: one SQLite file shared by the processes of one machine.

:class:`catalog.sqlite.SqlCatalog` holds the operations; this module only says how a
call gets the file's one connection, and that a write lock held by another process past
the busy timeout makes the catalog unavailable for now (as a PostgreSQL lock timeout
does), not a failure of the call.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from catalog.postgres_pool import CatalogUnavailableError
from catalog.sqlite import SqlCatalog
from catalog.sqlite_commits import ensure_catalog_id
from catalog.sqlite_layout import ADDED_COLUMNS, BACKFILLS, SCHEMA

__all__ = ["BUSY_TIMEOUT", "SqliteCatalog"]

_T = TypeVar("_T")
#: Seconds a call waits for another process's write transaction on the file.
BUSY_TIMEOUT = 30.0


class SqliteCatalog(SqlCatalog):
    """The embedded catalog: one SQLite file in WAL mode with full fsync, shared by the
    processes of one machine (every write a ``BEGIN IMMEDIATE`` transaction; others wait
    up to 30 s for it)."""

    _db: sqlite3.Connection
    _lock: threading.Lock

    def __init__(self, path: str | Path, busy_timeout: float = BUSY_TIMEOUT) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path, self._busy_timeout = Path(path), busy_timeout
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            str(path), check_same_thread=False, isolation_level=None, timeout=busy_timeout
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # a generation bump must survive power loss
        self._db.executescript(SCHEMA)
        try:
            with self._immediate() as db:  # one process upgrades, the others wait
                for (table, column), declaration in ADDED_COLUMNS.items():
                    present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                    if column not in present:
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
                        if (table, column) in BACKFILLS:
                            db.execute(BACKFILLS[table, column])
                ensure_catalog_id(db)
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _query(self, read: Callable[..., _T], *args: Any) -> _T:
        with self._lock, self._busy_as_unavailable():
            return read(self._db, *args)

    @contextlib.contextmanager
    def _transaction(self, begin: tuple[str, ...]) -> Iterator[sqlite3.Connection]:
        with self._busy_as_unavailable(), _LockedTransaction(self._lock, self._db, begin) as db:
            yield db

    @contextlib.contextmanager
    def _busy_as_unavailable(self) -> Iterator[None]:
        """Another process holding the file's write lock past the busy timeout is the
        catalog being unavailable for now (503 at the door, as on PostgreSQL), not a
        failure of the call (500)."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            raise CatalogUnavailableError(
                f"the catalog file {self._path} is busy: another process held its write "
                f"lock for {self._busy_timeout:g} s; nothing of this call was committed, "
                "try it again"
            ) from exc


class _LockedTransaction:
    """``with`` block of one transaction, begun by ``begin``, under the connection lock."""

    def __init__(
        self, lock: threading.Lock, db: sqlite3.Connection, begin: tuple[str, ...]
    ) -> None:
        self._lock, self._db, self._begin = lock, db, begin

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            for statement in self._begin:
                self._db.execute(statement)
        except BaseException:
            with contextlib.suppress(Exception):
                self._db.execute("ROLLBACK")
            self._lock.release()
            raise
        return self._db

    def __exit__(self, kind: object, value: object, traceback: object) -> None:
        try:
            self._db.execute("ROLLBACK" if kind is not None else "COMMIT")
        finally:
            self._lock.release()
