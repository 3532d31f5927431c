"""SQL sessions of ``POST /v1/sql``: whose they are, what they hold, when they end.

The service, not the Spark worker, owns the sessions: each one's ``USE`` defaults and
whether it has an open transaction, so a worker restart loses only open transactions,
and never silently. A session is named by its client and belongs to the token that
named it. Its transaction is in one of three states:

- ``none``: statements run in auto-commit;
- ``open``: BEGIN went through; statements run in the transaction;
- ``aborted``: the transaction was lost (worker restart, idle timeout); every statement
  answers ``TRANSACTION_ABORTED`` until the client ends the block: ROLLBACK succeeds,
  COMMIT answers ``TRANSACTION_ABORTED`` (nothing was committed). Both return the session
  to ``none``. So a statement meant for the transaction never runs outside it, and a
  COMMIT never answers success for a transaction that lost statements.

Sessions and open transactions are bounded (``SqlLimits``): past a bound a new session or
BEGIN is refused with 429, never made room for by ending another client's session. A
session idle for ``idle_seconds`` ends; its name is remembered so that its next
statement hears it (``SESSION_EXPIRED``, or ``TRANSACTION_ABORTED`` if a transaction was
open) instead of silently starting over with default settings.

Nothing here does I/O: the caller runs statements and closes worker sessions.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ingest_sdk.errors import SqlStatementError
from pipelines.sql.statements import DEFAULT_DATABASE, DEFAULT_SCHEMA

__all__ = [
    "SqlBusyError",
    "SqlLimits",
    "SqlSession",
    "SqlSessionError",
    "SqlSessions",
    "SqlWorkerError",
]

MiB = 1024 * 1024


class SqlSessionError(SqlStatementError):
    """The session's state refuses the statement (its transaction was lost, it expired,
    or it needs a session it does not have); nothing ran."""

    status: ClassVar[int] = 409


class SqlBusyError(SqlStatementError):
    """Too many sessions or open transactions: end one, or retry later."""

    status: ClassVar[int] = 429


class SqlWorkerError(SqlStatementError):
    """The service's SQL worker failed while running the statement."""

    status: ClassVar[int] = 503


@dataclass(frozen=True, slots=True)
class SqlLimits:
    """Bounds of the SQL face."""

    #: Named sessions held at once; past it a new session name is refused (429).
    max_sessions: int = 256
    #: Transactions open at once; past it BEGIN is refused (429).
    max_transactions: int = 32
    #: A session unused this long ends (its transaction, if any, is rolled back).
    idle_seconds: float = 3600.0
    #: Largest answer, in Arrow bytes; past it the rows are cut and ``truncated`` is set.
    max_answer_bytes: int = 256 * MiB
    #: Ended sessions remembered, so their next statement is told.
    remembered_endings: int = 10_000


@dataclass(slots=True)
class SqlSession:
    """One client's session, as the service knows it."""

    owner: str
    name: str
    database: str = DEFAULT_DATABASE
    schema: str = DEFAULT_SCHEMA
    state: str = "none"
    last_used: float = 0.0
    busy: int = 0
    ended_because: str | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        """The worker's name for the session: the owner and the client's name."""
        return f"{self.owner}/{self.name}"

    @property
    def has_defaults(self) -> bool:
        return (self.database, self.schema) == (DEFAULT_DATABASE, DEFAULT_SCHEMA)


class SqlSessions:
    """The sessions of one service."""

    def __init__(self, limits: SqlLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._sessions: dict[str, SqlSession] = {}
        self._endings: OrderedDict[str, SqlSession] = OrderedDict()

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    @property
    def open_transactions(self) -> int:
        return sum(s.state == "open" for s in self._sessions.values())

    def begin(self, owner: str, name: str, kind: str) -> SqlSession:
        """The session a statement of ``kind`` (``classify``'s kind, or ``"other"``) runs
        in, marked busy; call :meth:`finish` with its answer.

        Raises:
            SqlSessionError: the session's transaction was lost, or the session expired.
            SqlBusyError: no room for a new session, or for another open transaction.
        """
        key = f"{owner}/{name}"
        session = self._sessions.get(key)
        if session is None:
            session = self._new(owner, name, key)
        if session.state == "aborted" and kind != "rollback":
            if kind == "commit":
                session.state = "none"
            why = session.ended_because or "the service's SQL worker restarted"
            raise SqlSessionError(
                f"the session's transaction was lost ({why}); none of its statements were "
                "committed. Send ROLLBACK, then run the transaction again",
                sql_code="TRANSACTION_ABORTED",
            )
        full = self.open_transactions >= self.limits.max_transactions
        if kind == "begin" and session.state == "none" and full:
            raise SqlBusyError(
                f"{self.limits.max_transactions} transactions are open, the most this "
                "service allows: COMMIT or ROLLBACK one, or retry later",
                sql_code="TOO_MANY_TRANSACTIONS",
                retry_after=1.0,
            )
        session.busy += 1
        session.last_used = self._clock()
        return session

    def _new(self, owner: str, name: str, key: str) -> SqlSession:
        ended = self._endings.pop(key, None)
        if len(self._sessions) >= self.limits.max_sessions:
            if ended is not None:  # keep the ending to tell once there is room
                self._endings[key] = ended
            raise SqlBusyError(
                f"{self.limits.max_sessions} SQL sessions are open, the most this service "
                "allows: end one (DELETE /v1/sql/sessions/<name>), send statements without a "
                f"session, or retry later (sessions end after "
                f"{self.limits.idle_seconds:g} s unused)",
                sql_code="TOO_MANY_SESSIONS",
                retry_after=1.0,
            )
        session = SqlSession(owner, name, last_used=self._clock())
        self._sessions[key] = session
        if ended is None:
            return session
        if ended.state in ("open", "aborted"):
            session.state = "aborted"
            session.ended_because = ended.ended_because
        elif not ended.has_defaults:
            raise SqlSessionError(
                f"the session {name!r} {ended.ended_because}; it starts over with the default "
                f"database and schema ({DEFAULT_DATABASE}.{DEFAULT_SCHEMA}), not "
                f"{ended.database}.{ended.schema}: send USE again, then the statement",
                sql_code="SESSION_EXPIRED",
            )
        return session

    def finish(self, session: SqlSession, kind: str, answer: dict[str, Any] | None) -> None:
        """Record what the worker answered (``None``: no answer, the worker failed; the
        session keeps its state, and the worker reports a lost transaction next time)."""
        session.busy -= 1
        session.last_used = self._clock()
        if answer is None:
            return
        state = answer.get("session") or {}
        session.database = str(state.get("database") or session.database)
        session.schema = str(state.get("schema") or session.schema)
        error = answer.get("error") or {}
        if error.get("code") == "TRANSACTION_ABORTED":
            session.state = "none" if kind in ("commit", "rollback") else "aborted"
        else:
            session.state = "open" if state.get("transaction") else "none"

    def find(self, key: str) -> SqlSession | None:
        """The open session of a worker key (``owner/name``), if any."""
        return self._sessions.get(key)

    def transaction_keys(self) -> list[str]:
        """The sessions whose transaction is open or lost and not yet ended by the client
        (what must be told after a service restart)."""
        held = [s.key for s in self._sessions.values() if s.state in ("open", "aborted")]
        held += [s.key for s in self._endings.values() if s.state in ("open", "aborted")]
        return sorted(held)

    def restore(self, keys: list[str], because: str) -> None:
        """Sessions that held a transaction when the service stopped: their next statement
        answers ``TRANSACTION_ABORTED`` (``because`` says why)."""
        for key in keys:
            owner, _, name = key.partition("/")
            if owner and name and key not in self._sessions:
                self._remember(SqlSession(owner, name, state="aborted", ended_because=because))

    def close(self, owner: str, name: str) -> SqlSession | None:
        """End a session at its client's request (its transaction is rolled back)."""
        return self._sessions.pop(f"{owner}/{name}", None)

    def expire(self) -> list[SqlSession]:
        """End the sessions idle past the limit; they are remembered so that their next
        statement is told. Returns them (the caller closes them in the worker)."""
        now = self._clock()
        ended = [
            s for s in self._sessions.values()
            if not s.busy and now - s.last_used > self.limits.idle_seconds
        ]  # fmt: skip
        for session in ended:
            del self._sessions[session.key]
            session.ended_because = (
                f"ended after {self.limits.idle_seconds:g} s without a statement"
            )
            self._remember(session)
        return ended

    def _remember(self, session: SqlSession) -> None:
        self._endings[session.key] = session
        while len(self._endings) > self.limits.remembered_endings:
            self._endings.popitem(last=False)
