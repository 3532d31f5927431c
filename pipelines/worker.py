"""The service's Spark worker: one long-lived process, one warm Spark, two kinds of work.

``python -m pipelines.worker --serve --warehouse W`` reads one JSON request per line on
stdin and writes one **frame** per request on stdout: a JSON header line holding
``"bytes": N``, then exactly N bytes of payload (an Arrow IPC stream of a statement's
rows, or nothing). Framed answers have no size limit and can never run into the next
answer. Requests:

- ``{"table": "DB.S.T"}``: compact a table (as ``python -m flush.compact --serve``).
- ``{"statement": ..., "session": key, "database": ..., "schema": ..., "transaction":
  bool, "ephemeral": bool, "max_rows": n, "max_bytes": n, "timeout": s}``: run a
  statement in the named session. The service owns a session's defaults and knows
  whether it has an open transaction (``transaction``); a session that should have one
  but does not (this worker restarted since) answers ``TRANSACTION_ABORTED`` rather than
  running the statement outside it. An ephemeral session is closed after its statement.
- ``{"close_session": key}``: roll back and forget a session.
- ``{"ping": true}``: answered ``{"pong": true}`` (the service starts the worker so).

With ``--refresh-scheduler`` the worker also refreshes dynamic tables on their schedule,
on a thread of its own whose Spark jobs run in the FAIR scheduler pool ``refresh``: a
long statement or compaction shares the cores with them instead of holding them back.

Every answer to a statement carries the session's state (``database``, ``schema``,
``transaction``). A statement past its timeout has its Spark jobs cancelled (its job
group), and the worker goes on serving. Nothing a request does ends the worker, except
losing its JVM; the service starts a new one then.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa

from flush.compact import answer_compaction, parse_args
from pipelines.errors import SqlError, evaluation_errors
from pipelines.session import Session
from pipelines.sql.statements import classify
from pipelines.transactions.statement_deadline import statement_deadline

__all__ = ["SessionPool", "StatementClock", "answer_statement", "main", "write_frame"]

log = logging.getLogger("pipelines.worker")

#: The Spark scheduler pool of dynamic-table refreshes (FAIR against the default pool).
REFRESH_POOL = "refresh"
#: The message of any failure that is not the statement's own (its details go to the log).
INTERNAL = (
    "the statement failed inside the service; nothing was changed by it unless it was a "
    "COMMIT (check the table); the service log has the details"
)


class SessionPool:
    """Named sessions on one warehouse and one Spark. Never evicts: the service decides
    when a session ends and says so (``close``)."""

    def __init__(self, warehouse: Path, spark: Any, catalog: Any) -> None:
        self.warehouse, self.spark, self.catalog = warehouse, spark, catalog
        self._sessions: dict[str, Session] = {}

    def get(self, key: str, database: str, schema: str) -> Session:
        session = self._sessions.get(key)
        if session is None:
            session = Session(self.warehouse, spark=self.spark, catalog=self.catalog,
                              database=database, schema=schema)  # fmt: skip
            self._sessions[key] = session
        else:
            session.database, session.schema = database, schema
        return session

    def find(self, key: str) -> Session | None:
        return self._sessions.get(key)

    def close(self, key: str) -> bool:
        session = self._sessions.pop(key, None)
        if session is not None:
            session.close()
        return session is not None

    def close_all(self) -> None:
        for key in list(self._sessions):
            self.close(key)


class StatementClock:
    """Cancels one statement's Spark jobs once its time is up, and keeps cancelling any job
    it starts after that until the statement ends (a job group holds all its jobs)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.timed_out = False
        self._done = threading.Event()
        self._group = ""

    @contextmanager
    def running(self, timeout: float) -> Iterator[StatementClock]:
        self.timed_out = False
        self._done.clear()
        self._group = f"sql-{uuid.uuid4().hex}"
        context = self.spark.sparkContext
        context.setJobGroup(self._group, "SQL statement", interruptOnCancel=True)
        watcher = threading.Thread(target=self._watch, args=(timeout,), daemon=True)
        watcher.start()
        try:
            yield self
        finally:
            self.disarm()
            watcher.join()
            context.setJobGroup(f"after-{self._group}", "SQL answer", interruptOnCancel=True)

    def disarm(self) -> None:
        """From here on the statement runs to its end (it has committed)."""
        self._done.set()

    def _watch(self, timeout: float) -> None:
        if self._done.wait(timeout):
            return
        self.timed_out = True
        while True:
            self.spark.sparkContext.cancelJobGroup(self._group)
            if self._done.wait(0.2):
                return


def _state(session: Session | None) -> dict[str, Any]:
    if session is None:
        return {"transaction": False}
    return {"database": session.database, "schema": session.schema,
            "transaction": session.in_transaction}  # fmt: skip


def _error(code: str, message: str, session: Session | None) -> tuple[dict[str, Any], bytes]:
    return {"error": {"code": code, "message": message}, "session": _state(session)}, b""


def answer_statement(
    pool: SessionPool, clock: StatementClock, request: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """The answer to one SQL request: a header (rows, truncated, session state, or an
    error with its code) and the rows as an Arrow IPC stream."""
    text = str(request.get("statement"))
    key = str(request.get("session"))
    max_rows = int(request.get("max_rows") or 10_000)
    max_bytes = int(request.get("max_bytes") or 256 * 2**20)
    timeout = float(request.get("timeout") or 300)
    session = pool.get(key, str(request.get("database") or "DB"),
                       str(request.get("schema") or "PUBLIC"))  # fmt: skip
    try:
        try:
            kind = classify(text).kind
        except SqlError as exc:
            return _error(exc.code, str(exc), session)
        if request.get("transaction") and not session.in_transaction and kind != "rollback":
            return _error(
                "TRANSACTION_ABORTED",
                "the session's transaction was lost when the service's SQL worker restarted; "
                "none of its statements were committed: ROLLBACK, then run it again",
                session,
            )
        if request.get("ephemeral") and kind == "begin":
            return _error(
                "SESSION_REQUIRED",
                'BEGIN needs a session: send "session" with this and every statement of the '
                "transaction (without one, each statement runs alone and commits at once)",
                session,
            )
        with clock.running(timeout), statement_deadline(timeout):
            try:
                with evaluation_errors():
                    frame = session.sql(text)
                    if kind != "query":  # it has run (and committed): answer in full
                        clock.disarm()
                    data = frame.limit(max_rows + 1).toArrow()
            except SqlError as exc:
                if clock.timed_out and exc.code != "COMMIT_PENDING":  # decided: it lands
                    return _error(
                        "STATEMENT_TIMEOUT",
                        f"the statement ran longer than {timeout:g} s and was cancelled; "
                        "nothing it would change was changed. Raise the request's timeout "
                        "or make the statement cheaper",
                        session,
                    )
                return _error(exc.code, session.user_names(str(exc)), session)
    finally:
        session.release_views()  # the answer is materialised: its views can go
        if request.get("ephemeral"):
            pool.close(key)
    truncated = data.num_rows > max_rows
    data = data.slice(0, max_rows)
    if data.nbytes > max_bytes and data.num_rows:
        data = data.slice(0, max(0, data.num_rows * max_bytes // data.nbytes))
        truncated = True
    payload = _arrow_bytes(data)
    header = {"rows": data.num_rows, "truncated": truncated, "session": _state(session)}
    return header, payload


def _arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=8192)
    return sink.getvalue().to_pybytes()


def write_frame(replies: IO[bytes], header: dict[str, Any], payload: bytes = b"") -> None:
    """One answer: its header line (with the payload's length), then the payload."""
    replies.write(orjson.dumps({**header, "bytes": len(payload)}) + b"\n")
    replies.write(payload)
    replies.flush()


def _jvm_lost(exc: BaseException) -> bool:
    from py4j.protocol import Py4JNetworkError

    return isinstance(exc, Py4JNetworkError | ConnectionError)


def serve(
    spark: Any, catalog: Any, args: argparse.Namespace, requests: IO[bytes], replies: IO[bytes]
) -> None:
    """Answer each request line with one frame until ``requests`` ends.

    A request that fails in a way that is not the statement's fault is answered with an
    ``INTERNAL_ERROR`` (details to the log) and the worker goes on; only a lost JVM ends
    it, after answering.
    """
    pool = SessionPool(Path(args.warehouse), spark, catalog)
    clock = StatementClock(spark)
    refreshes = _refresh_loop(spark, catalog, args) if getattr(args, "refresh_scheduler",
                                                               False) else None  # fmt: skip
    try:
        for line in requests:
            if not line.strip():
                continue
            request: Any = None
            try:
                request = orjson.loads(line)
                if not isinstance(request, dict):
                    raise ValueError("a request must be a JSON object")
                if "statement" in request:
                    header, payload = answer_statement(pool, clock, request)
                elif "close_session" in request:
                    header, payload = {"closed": pool.close(str(request["close_session"]))}, b""
                elif "ping" in request:
                    header, payload = {"pong": True}, b""
                else:
                    header, payload = answer_compaction(spark, catalog, args, request), b""
            except Exception as exc:
                log.exception("request failed: %s", line[:200])
                key = request.get("session") if isinstance(request, dict) else None
                session = pool.find(str(key)) if key is not None else None
                header, payload = _error("INTERNAL_ERROR", INTERNAL, session)
                write_frame(replies, header, payload)
                if _jvm_lost(exc):
                    return
                continue
            write_frame(replies, header, payload)
    finally:
        if refreshes is not None:
            refreshes.stop(timeout=60)
        pool.close_all()


def _refresh_loop(spark: Any, catalog: Any, args: argparse.Namespace) -> Any:
    """Start the dynamic-table scheduler on its own thread and Spark pool."""
    from pipelines.dynamic_tables.scheduler import (
        SCHEDULER_LEASE,
        SCHEDULER_LEASE_SECONDS,
        SERVICE_ID_VARIABLE,
        RefreshLoop,
    )

    def in_refresh_pool() -> None:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", REFRESH_POOL)

    service = os.environ.get(SERVICE_ID_VARIABLE)
    lease = None
    if service:  # the service's worker: it schedules while its service holds the lease

        def lease() -> bool:
            return bool(catalog.take_lease(SCHEDULER_LEASE, service, SCHEDULER_LEASE_SECONDS))

    loop = RefreshLoop(lambda: Session(Path(args.warehouse), spark=spark, catalog=catalog),
                       before=in_refresh_pool, lease=lease)  # fmt: skip
    loop.start()
    return loop


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--refresh-scheduler", action="store_true",
                     help="refresh dynamic tables on their schedule")  # fmt: skip
    known, rest = own.parse_known_args(argv if argv is not None else sys.argv[1:])
    args = parse_args(["--serve", *rest])
    args.refresh_scheduler = known.refresh_scheduler
    from catalog import CATALOG_FILE, open_catalog
    from flush.spark_tables import spark_session

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    # Answers get their own copy of stdout; anything else printed goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    catalog = open_catalog(args.catalog or Path(args.warehouse) / CATALOG_FILE)
    config = {"spark.scheduler.mode": "FAIR"}  # statements, compaction and refreshes share
    if args.spark_driver_memory:
        config["spark.driver.memory"] = args.spark_driver_memory
    master = args.spark_master  # parse_args: --spark-master, else $SPARK_MASTER, else local[*]
    if master == "local[*]" and not os.environ.get("SPARK_MASTER"):
        # One task slot more than cores, and work split by cores: a statement whose
        # tasks are as many as the cores (a range, a small scan) leaves a slot where a
        # refresh's tasks start at once. FAIR pools share slots but never preempt a
        # running task, so without it a refresh waits for the statement's longest task.
        cores = len(os.sched_getaffinity(0))  # the CPUs this process may use
        master = f"local[{cores + 1}]"
        config["spark.default.parallelism"] = str(cores)
    spark = spark_session(master, app_name="streaming-ingest-worker", **config)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        serve(spark, catalog, args, sys.stdin.buffer, replies)
    finally:
        spark.stop()
        catalog.close()
    return 0


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
