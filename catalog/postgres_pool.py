"""The connections of a catalog on PostgreSQL: a small pool, transactions on it, and what
a broken connection means for the call that met it.

Why a pool: a write waits for the catalog's advisory lock while another process holds it
(up to ``lock_timeout``). On one shared connection every other call of the process would
wait behind that wait, reads included. Here each call takes a connection of its own (at
most :data:`POOL_SIZE` at once, opened on demand and kept for the next call), so a read
never waits behind a writer's wait: PostgreSQL's readers take no lock a writer holds.

Why it reconnects: a connection breaks when the server restarts or the network between
fails. The call that meets a broken connection drops it, and every idle one with it (a
restart broke them all); the next call opens a new one. A call is tried again once, on a
new connection, only when that is safe:

- a read: it changed nothing;
- a transaction whose connection broke before its ``COMMIT`` was sent: PostgreSQL rolls
  back a transaction whose connection ends, so nothing of it was committed
  (:class:`ConnectionLostError`).

A connection that breaks while ``COMMIT`` is on its way leaves the outcome unknown: the
call fails with :class:`CatalogUnavailableError` and is never repeated blindly; its caller
decides (a flush checks the Delta log, the point of truth, before it commits again).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

__all__ = [
    "POOL_SIZE", "CatalogUnavailableError", "ConnectionLostError", "ConnectionPool", "once_more",
]  # fmt: skip

T = TypeVar("T")
#: Connections a catalog holds at most, each used by one call at a time: the service's
#: flushes, handlers and periodic steps make their calls in worker threads at once.
POOL_SIZE = 8


class CatalogUnavailableError(RuntimeError):
    """The catalog's PostgreSQL server could not be reached or refused the login, or the
    connection broke during the call. Nothing of the call was committed, unless the
    message says the outcome is unknown (the connection broke while COMMIT was sent)."""


class ConnectionLostError(CatalogUnavailableError):
    """The connection broke before the call committed anything: safe to try again on a
    new connection (:func:`once_more`)."""


class PooledConnection(Protocol):
    """What the pool needs of a connection (``catalog.postgres``' ``_Connection``)."""

    @property
    def broken(self) -> bool: ...

    @property
    def reusable(self) -> bool: ...

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=PooledConnection)


def once_more(call: Callable[[], T]) -> T:
    """``call()``, and once more when its connection broke before it committed anything
    (the second attempt takes a new connection)."""
    try:
        return call()
    except ConnectionLostError:
        return call()


class ConnectionPool(Generic[C]):
    """The connections of one catalog: at most ``size`` at once, each used by one call at
    a time, opened on demand by ``connect(again)`` (``again``: a connection was opened
    before, so a failure now is an outage, not a mistake in the URL) and kept for the next
    call; a broken one is dropped, and the idle ones with it.

    Args:
        described: the server, database and user, for messages (never the password).
    """

    def __init__(self, connect: Callable[[bool], C], described: str, size: int = POOL_SIZE) -> None:
        self._connect = connect
        self._described = described
        self._turns = threading.BoundedSemaphore(size)
        self._guard = threading.Lock()
        self._idle: list[C] = []
        self._opened = False
        self._closed = False

    def run(self, read: Callable[..., T], *args: Any) -> T:
        """``read(connection, *args)`` outside a transaction (statements that change
        nothing), tried once more on a new connection when the connection broke."""

        def attempt() -> T:
            with self._turns:
                db = self._take()
                try:
                    return read(db, *args)
                finally:
                    self._give_back(db)

        return once_more(attempt)

    @contextlib.contextmanager
    def transaction(self, begin: Sequence[str]) -> Iterator[C]:
        """A transaction on a connection of its own, begun by ``begin``, committed when the
        block ends, rolled back on an error. ``begin`` is sent again on a new connection
        when the old one is found broken (nothing had been done).

        Raises:
            ConnectionLostError: the connection broke inside the block (nothing committed).
            CatalogUnavailableError: it broke while COMMIT was sent: the outcome is unknown.
        """
        with self._turns:
            db = once_more(lambda: self._begun(begin))
            try:
                try:
                    yield db
                except BaseException:
                    with contextlib.suppress(Exception):
                        db.execute("ROLLBACK")
                    raise
                try:
                    db.execute("COMMIT")
                except ConnectionLostError as exc:
                    raise CatalogUnavailableError(
                        f"the connection to the catalog in PostgreSQL ({self._described}) "
                        "broke while a transaction committed: whether it committed is "
                        "unknown; read the catalog again before repeating it"
                    ) from exc
            finally:
                self._give_back(db)

    def _begun(self, begin: Sequence[str]) -> C:
        db = self._take()
        try:
            for statement in begin:
                db.execute(statement)
        except BaseException:
            with contextlib.suppress(Exception):
                db.execute("ROLLBACK")
            self._give_back(db)
            raise
        return db

    def _take(self) -> C:
        with self._guard:
            if self._closed:
                raise CatalogUnavailableError("the catalog was closed")
            if self._idle:
                return self._idle.pop()
            again = self._opened
        db = self._connect(again)
        with self._guard:
            self._opened = True
        return db

    def _give_back(self, db: C) -> None:
        with self._guard:
            if db.reusable and not self._closed:
                self._idle.append(db)
                return
            dropped = [db]
            if db.broken:  # what broke it (a restart) broke the idle ones too
                dropped, self._idle = dropped + self._idle, []
        for each in dropped:
            with contextlib.suppress(Exception):
                each.close()

    def close(self) -> None:
        """Close the idle connections; those in use close when their call ends."""
        with self._guard:
            self._closed = True
            idle, self._idle = self._idle, []
        for db in idle:
            with contextlib.suppress(Exception):
                db.close()
