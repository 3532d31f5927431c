"""Running ``POST /v1/sql`` statements in the service's Spark worker, session by session.

Statements take turns with compaction runs in the one warm worker. A statement's
timeout travels with it: the worker cancels that statement's Spark jobs and goes on
serving everyone else. Only if the worker does not give the statement back within a
grace period after its timeout (stuck outside Spark) is the worker restarted; the
sessions that had a transaction open hear ``TRANSACTION_ABORTED`` on their next
statement (see :mod:`channel_server.sql_sessions`).

Errors answer with the statement's own code; a failure of the worker itself is logged
in full (its log's path and tail) and answered in plain words, never with paths,
tracebacks or class names.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from channel_server.metrics import Metrics
from channel_server.spark_worker import SparkWorker, SparkWorkerDied, WorkerBusy
from channel_server.sql_sessions import (
    SqlLimits,
    SqlSessionError,
    SqlSessions,
    SqlWorkerError,
)
from ingest_sdk.errors import SqlStatementError
from pipelines.errors import SqlError
from pipelines.sql.statements import DEFAULT_DATABASE, DEFAULT_SCHEMA, classify

__all__ = ["SqlAnswer", "SqlService"]

log = logging.getLogger(__name__)

#: Seconds past a statement's timeout the worker has to give it back before a restart.
GRACE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class SqlAnswer:
    """A statement's rows: an Arrow IPC stream, how many, and whether some were cut."""

    arrow: bytes
    rows: int
    truncated: bool


def statement_kind(statement: str) -> str:
    """``classify``'s kind of a statement, or ``"other"`` if it cannot be classified (the
    worker answers that statement's error)."""
    try:
        return classify(statement).kind
    except SqlError:
        return "other"


class SqlService:
    """The SQL face of one service: its sessions and the worker that runs statements."""

    def __init__(
        self, worker: SparkWorker, limits: SqlLimits, metrics: Metrics, journal: Path
    ) -> None:
        self.worker = worker
        self.limits = limits
        self.sessions = SqlSessions(limits)
        self.metrics = metrics
        self.journal = journal
        self._journaled: list[str] = []
        self._turns: dict[str, asyncio.Lock] = {}
        self._restore()
        # Open transactions live in the worker: it is not stopped for being idle meanwhile.
        worker.keep_alive = lambda: self.sessions.open_transactions > 0
        metrics.watch("ingest_sql_sessions_open", "SQL sessions open now.",
                      lambda: self.sessions.open_sessions)  # fmt: skip
        metrics.watch("ingest_sql_transactions_open", "SQL transactions open now.",
                      lambda: self.sessions.open_transactions)  # fmt: skip

    async def run(
        self, owner: str, name: str | None, statement: str, max_rows: int, timeout: float
    ) -> SqlAnswer:
        """Run one statement in the session ``name`` of ``owner`` (``None``: alone, in
        auto-commit).

        Raises:
            SqlStatementError: the statement failed (``sql_code`` says why; 400), its
                session refuses it (409), there is no room (429), or the worker failed (503).
        """
        started = time.monotonic()
        outcome = "INTERNAL_ERROR"
        try:
            answer = await self._run(owner, name, statement, max_rows, timeout)
            outcome = "OK"
            return answer
        except SqlStatementError as exc:
            outcome = str(exc.details.get("sql_code", "SQL_ERROR"))
            raise
        finally:
            self.metrics.sql_statements.labels(outcome).inc()
            self.metrics.sql_duration.observe(time.monotonic() - started)

    async def _run(
        self, owner: str, name: str | None, statement: str, max_rows: int, timeout: float
    ) -> SqlAnswer:
        kind = statement_kind(statement)
        request: dict[str, Any] = {
            "statement": statement, "max_rows": max_rows, "timeout": timeout,
            "max_bytes": self.limits.max_answer_bytes,
        }  # fmt: skip
        if name is None:
            if kind == "commit":
                raise _no_transaction()
            if kind == "begin":
                raise SqlSessionError(
                    'BEGIN needs a session: send "session" with it and with every statement '
                    "of the transaction (without one, each statement runs alone and commits "
                    "at once)",
                    sql_code="SESSION_REQUIRED",
                )
            request.update(session=f"{owner}/~{uuid.uuid4().hex}", ephemeral=True,
                           database=DEFAULT_DATABASE, schema=DEFAULT_SCHEMA)  # fmt: skip
            return _answer(*await self._exchange(request, timeout))
        # A session's statements run one after another, in the order they came: a statement
        # sent before its COMMIT was answered must see the COMMIT's outcome.
        turn = self._turns.setdefault(f"{owner}/{name}", asyncio.Lock())
        async with turn:
            return await self._in_session(owner, name, kind, request, timeout)

    async def _in_session(
        self, owner: str, name: str, kind: str, request: dict[str, Any], timeout: float
    ) -> SqlAnswer:
        session = self.sessions.begin(owner, name, kind)
        if kind == "commit" and session.state == "none":
            self.sessions.finish(session, kind, None)
            raise _no_transaction()
        answered: tuple[dict[str, Any], bytes] | None = None
        try:
            request.update(session=session.key, database=session.database,
                           schema=session.schema, transaction=session.state == "open")  # fmt: skip
            answered = await self._exchange(request, timeout)
        finally:
            self.sessions.finish(session, kind, answered[0] if answered else None)
            self._write_journal()
        return _answer(*answered)

    async def _exchange(
        self, request: dict[str, Any], timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        try:
            return await self.worker.exchange(
                request, answer_within=timeout + GRACE_SECONDS, queue_within=timeout
            )
        except WorkerBusy:
            raise SqlWorkerError(
                f"the service's SQL worker was busy with other statements for {timeout:g} s "
                "(the statement's timeout), so the statement did not run; retry, or raise "
                "its timeout",
                sql_code="WORKER_BUSY",
                retry_after=1.0,
            ) from None
        except SparkWorkerDied as exc:
            log.error("the SQL worker failed while running a statement: %s", exc)
            raise SqlWorkerError(
                "the service's SQL worker stopped while running the statement and was "
                "restarted. If the statement was a COMMIT or a change in auto-commit, check "
                "whether it applied; open transactions of this service's sessions were lost "
                "(their next statement answers TRANSACTION_ABORTED)",
                sql_code="WORKER_FAILED",
            ) from None

    async def close_session(self, owner: str, name: str) -> bool:
        """End a session at its client's request; whether it existed."""
        session = self.sessions.close(owner, name)
        if session is None:
            return False
        self._write_journal()
        await self._close_in_worker(session.key)
        return True

    async def expire_idle(self) -> int:
        """End the sessions idle past the limit (their transactions rolled back)."""
        ended = self.sessions.expire()
        for session in ended:
            await self._close_in_worker(session.key)
        for key, turn in list(self._turns.items()):  # turns of sessions no one is using
            if not turn.locked() and self.sessions.find(key) is None:
                del self._turns[key]
        return len(ended)

    def _restore(self) -> None:
        """Sessions that held a transaction when the service last stopped answer
        TRANSACTION_ABORTED next (their transactions died with the old worker)."""
        try:
            keys = orjson.loads(self.journal.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError):
            log.error("cannot read %s; open SQL transactions of the last run are not known",
                      self.journal)  # fmt: skip
            return
        if isinstance(keys, list):
            self.sessions.restore([str(k) for k in keys], "the service restarted")
            self._journaled = sorted(str(k) for k in keys)

    def _write_journal(self) -> None:
        """Record which sessions hold a transaction, when that changes (BEGIN, COMMIT,
        ROLLBACK, a loss), before the client hears the answer."""
        keys = self.sessions.transaction_keys()
        if keys == self._journaled:
            return
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.journal.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(keys))
        os.replace(temporary, self.journal)
        self._journaled = keys

    async def _close_in_worker(self, key: str) -> None:
        if self.worker.pid is None:
            return  # no worker, no session state to drop
        with contextlib.suppress(SparkWorkerDied):
            await self.worker.exchange({"close_session": key}, answer_within=60.0)


def _no_transaction() -> SqlSessionError:
    return SqlSessionError(
        "no transaction is open in this session, so nothing was committed: a transaction "
        "runs from BEGIN, sent with this session id, to COMMIT or ROLLBACK (without a "
        "session each statement commits by itself)",
        sql_code="NO_TRANSACTION",
    )


def _answer(header: dict[str, Any], payload: bytes) -> SqlAnswer:
    error = header.get("error")
    if error is not None:
        if not isinstance(error, dict):
            raise SqlWorkerError("the service's SQL worker could not read the request",
                                 sql_code="WORKER_FAILED")  # fmt: skip
        code = str(error.get("code") or "SQL_ERROR")
        message = str(error.get("message") or "the statement failed")
        error_class = SqlSessionError if code == "TRANSACTION_ABORTED" else SqlStatementError
        if code == "SESSION_REQUIRED":
            error_class = SqlSessionError
        raise error_class(message, sql_code=code)
    return SqlAnswer(payload, int(header.get("rows", 0)), bool(header.get("truncated")))
