"""The service's Spark worker: one long-lived process, one warm Spark, two kinds of work.

``python -m pipelines.worker --serve --warehouse W`` reads one JSON request per line
and answers one JSON line each: ``{"table": ...}`` compacts a table (as
``python -m flush.compact --serve`` does) and ``{"statement": ..., "session": ...}``
runs a SQL statement in the named session (sessions keep their USE defaults and
open transactions between requests). A statement's rows come back as an Arrow IPC
stream (base64), at most ``max_rows`` of them. One JVM on the machine, not two.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from flush.compact import answer_compaction, parse_args
from flush.compact import serve as serve_requests
from pipelines.errors import SqlError, evaluation_errors
from pipelines.session import Session

__all__ = ["SessionPool", "answer_statement", "main"]

#: Sessions kept at most; the least recently used one is closed (its transaction rolled back).
MAX_SESSIONS = 64


class SessionPool:
    """Named sessions on one warehouse and one Spark, least recently used closed first."""

    def __init__(self, warehouse: Path, spark: Any, catalog: Any) -> None:
        self.warehouse, self.spark, self.catalog = warehouse, spark, catalog
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def get(self, name: str) -> Session:
        session = self._sessions.pop(name, None)
        if session is None:
            session = Session(self.warehouse, spark=self.spark, catalog=self.catalog)
        self._sessions[name] = session
        while len(self._sessions) > MAX_SESSIONS:
            _, oldest = self._sessions.popitem(last=False)
            oldest.close()
        return session

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()
        self._sessions.clear()


def _arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def answer_statement(pool: SessionPool, request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one SQL request: rows (Arrow, base64) or an error with its code."""
    statement = request.get("statement")
    session_name = request.get("session") or "default"
    max_rows = int(request.get("max_rows") or 10_000)
    session = pool.get(str(session_name))
    try:
        with evaluation_errors():
            data = session.sql(str(statement)).limit(max_rows + 1).toArrow()
    except SqlError as exc:
        return {"error": {"code": exc.code, "message": str(exc)}}
    finally:
        session.release_views()  # the answer is materialised: its views can go
    truncated = data.num_rows > max_rows
    data = data.slice(0, max_rows)
    return {"arrow": base64.b64encode(_arrow_bytes(data)).decode(), "rows": data.num_rows,
            "truncated": truncated}  # fmt: skip


def serve(
    spark: Any, catalog: Any, args: argparse.Namespace, requests: IO[str], replies: IO[str]
) -> None:
    """Answer each request line with one JSON line until ``requests`` ends."""
    pool = SessionPool(Path(args.warehouse), spark, catalog)

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        if isinstance(request, dict) and "statement" in request:
            return answer_statement(pool, request)
        return answer_compaction(spark, catalog, args, request)

    try:
        serve_requests(spark, catalog, args, requests, replies, answer)
    finally:
        pool.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(["--serve", *(argv if argv is not None else sys.argv[1:])])
    from catalog import SqliteCatalog
    from flush.spark_tables import spark_session

    # Answers get their own copy of stdout; anything else printed goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    catalog = SqliteCatalog(args.catalog or Path(args.warehouse) / "catalog.sqlite")
    config = {}
    if args.spark_driver_memory:
        config["spark.driver.memory"] = args.spark_driver_memory
    spark = spark_session(args.spark_master, app_name="streaming-ingest-worker", **config)
    spark.sparkContext.setLogLevel("ERROR")
    try:
        serve(spark, catalog, args, sys.stdin, replies)
    finally:
        spark.stop()
        catalog.close()
    return 0


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
