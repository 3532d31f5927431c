"""``python -m flush.compact``: compact (and maintain) tables of a warehouse with Spark.

    python -m flush.compact --warehouse ./warehouse --table DB.SCHEMA.TABLE
    python -m flush.compact --warehouse ./warehouse --all --spark-master spark://host:7077
    python -m flush.compact --warehouse ./warehouse --serve

Each run is recorded in the catalog's migration history (also shown over HTTP and
the SDK). Progress goes to stderr; one JSON line per table to stdout.

``--serve`` keeps one Spark session warm and compacts the tables named on stdin,
one JSON object per line (``{"table": "DB.SCHEMA.TABLE"}``), answering each with
one JSON line on stdout, until stdin closes. The channel service runs its
background compactions this way: a run in a warm session takes about a quarter of
the time of one in a fresh process.

This is the composition point of compaction: it reads table locations and
clustering columns from the catalog and records runs there; the job itself
(:mod:`flush.compaction`) knows only the Delta table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

import orjson

from catalog import CATALOG_VARIABLE
from flush.compaction import CompactionPolicy, CompactionResult, compact_table
from flush.maintenance import DEFAULT_RETENTION_HOURS, maintain_catalog_table

MiB = 1024 * 1024


def _progress(table: str) -> Any:
    started = time.monotonic()

    def report(message: str) -> None:
        print(
            f"[{time.monotonic() - started:7.1f}s] {table}: {message}", file=sys.stderr, flush=True
        )

    return report


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m flush.compact",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--warehouse", required=True, help="the service's warehouse folder")
    parser.add_argument("--catalog", default=os.environ.get(CATALOG_VARIABLE),
                        help="catalog: a SQLite file (default <warehouse>/catalog.sqlite) or "
                        "a postgresql:// URL (default $INGEST_CATALOG)")  # fmt: skip
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--table", action="append", help="DB.SCHEMA.TABLE (repeatable)")
    which.add_argument("--all", action="store_true", help="every table in the catalog")
    which.add_argument("--serve", action="store_true",
                       help="compact the tables named on stdin, one JSON line each")  # fmt: skip
    parser.add_argument("--target-file-mb", type=float, default=128, help="default 128")
    parser.add_argument("--spark-master", default=os.environ.get("SPARK_MASTER", "local[*]"))
    parser.add_argument("--spark-driver-memory", default=None, help="e.g. 4g")
    parser.add_argument("--spark-executor-memory", default=None, help="e.g. 8g")
    parser.add_argument("--maintenance", action=argparse.BooleanOptionalAction, default=True,
                        help="also checkpoint, clean the log and vacuum (default on)")  # fmt: skip
    parser.add_argument("--retention-hours", type=float, default=DEFAULT_RETENTION_HOURS,
                        help="vacuum keeps unreferenced files this long (default 168)")  # fmt: skip
    parser.add_argument("--allow-short-retention", action="store_true",
                        help="permit a retention under 1 hour (tests only)")  # fmt: skip
    return parser.parse_args(argv)


def run_record(result: CompactionResult) -> dict[str, Any]:
    record = asdict(result)
    record.pop("bins")
    record.pop("table_uri")
    return record


def compact_and_record(
    spark: Any, catalog: Any, info: Any, args: argparse.Namespace
) -> dict[str, Any]:
    """Compact one catalog table, record the run in its history, maintain it; the JSON record."""
    report = _progress(info.full_name)
    policy = CompactionPolicy(
        target_file_bytes=int(args.target_file_mb * MiB), clustering=info.clustering
    )
    try:
        result = compact_table(spark, info.uri, policy, progress=report)
    except Exception as exc:
        result = CompactionResult(info.uri, time.time(), time.time(), "FAILED", error=repr(exc))
        report(f"failed: {exc!r}")
    catalog.record_migration(info.id, run_record(result))
    output: dict[str, Any] = {"table": info.full_name, **run_record(result)}
    if args.maintenance:
        done = maintain_catalog_table(
            catalog, info, args.retention_hours, allow_short_retention=args.allow_short_retention
        )
        output["vacuumed_files"] = len(done.deleted_files)
        report(f"maintenance: checkpoint at {done.checkpoint_version}, "
               f"{len(done.deleted_files)} file(s) vacuumed")  # fmt: skip
    report(f"{result.status} in {result.duration:.1f}s")
    return output


def serve(
    spark: Any,
    catalog: Any,
    args: argparse.Namespace,
    requests: IO[str],
    replies: IO[str],
    answer: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Answer each request line with one JSON line until ``requests`` ends.

    A bad request (not JSON, no such table) or a failed compaction gets
    ``{"status": "FAILED", "error": ...}`` and the worker goes on. An error outside
    the compaction itself (maintenance, the catalog) ends the worker; the service
    reports it as died and starts a new one for the next run. ``answer`` replaces the
    compaction answer (the pipelines worker also answers SQL requests).
    """
    for line in requests:
        if not line.strip():
            continue
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            request = {"error": repr(exc)}
        if answer is None:
            reply = answer_compaction(spark, catalog, args, request)
        else:
            reply = answer(request)
        replies.write(orjson.dumps(reply).decode())
        replies.write("\n")
        replies.flush()


def answer_compaction(
    spark: Any, catalog: Any, args: argparse.Namespace, request: dict[str, Any]
) -> dict[str, Any]:
    """The answer to one compaction request ``{"table": "DB.SCHEMA.TABLE"}``."""
    from ingest_sdk.schema import split_table_name

    name = request.get("table") if isinstance(request, dict) else None
    try:
        if "error" in request:
            raise ValueError(request["error"])
        info = catalog.get_table(*split_table_name(name))  # type: ignore[arg-type]
    except Exception as exc:
        return {"table": name, "status": "FAILED", "error": repr(exc)}
    return compact_and_record(spark, catalog, info, args)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from catalog import CATALOG_FILE, open_catalog
    from flush.spark_tables import spark_session
    from ingest_sdk.schema import split_table_name

    replies = sys.stdout
    if args.serve:
        # Answers get their own copy of stdout; anything else printed (by Spark, by a
        # library) goes to stderr, so the answer stream holds only answers.
        replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    catalog = open_catalog(args.catalog or Path(args.warehouse) / CATALOG_FILE)
    tables = []  # resolved before Spark starts: a mistyped name fails fast
    if args.all:
        tables = catalog.list_tables()
    elif args.table:
        tables = [catalog.get_table(*split_table_name(name)) for name in args.table]
    config = {}
    if args.spark_driver_memory:
        config["spark.driver.memory"] = args.spark_driver_memory
    if args.spark_executor_memory:
        config["spark.executor.memory"] = args.spark_executor_memory
    spark = spark_session(args.spark_master, app_name="streaming-ingest-compaction", **config)
    spark.sparkContext.setLogLevel("ERROR")
    failures = 0
    try:
        if args.serve:
            serve(spark, catalog, args, sys.stdin, replies)
            return 0
        for info in tables:
            output = compact_and_record(spark, catalog, info, args)
            failures += output["status"] == "FAILED"
            print(orjson.dumps(output).decode(), flush=True)
    finally:
        spark.stop()
        catalog.close()
    return 1 if failures else 0


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
