"""``python -m channel_server``: run the channel service.

Prints one JSON line ``{"event": "listening", "url": ...}`` once it accepts
connections (with ``--port 0`` that is how a caller learns the port).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

from aiohttp import web

from catalog.postgres import CatalogUnavailableError
from channel_server.app import create_app
from channel_server.config import CompactionTrigger, FlushPolicy, Limits, ServerConfig, SqlLimits
from flush.storage import is_object_store
from flush.store_check import StoreConfigError
from ingest_sdk.durations import parse_duration
from ingest_sdk.errors import ConfigurationError
from ingest_sdk.logs import configure_logging
from ingest_sdk.process_exit import run_entry_point
from ingest_sdk.wire import dumps
from pipelines.change_streams.partitions import BalancePolicy

MiB = 1024 * 1024
log = logging.getLogger("channel_server")


def parse_args(argv: list[str] | None = None) -> ServerConfig:
    parser = argparse.ArgumentParser(prog="channel_server", description=__doc__)
    parser.add_argument("--host", default=os.environ.get("INGEST_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("INGEST_PORT", "8080")))
    parser.add_argument(
        "--warehouse",
        default=os.environ.get("INGEST_WAREHOUSE", "warehouse"),
        help="folder holding the Delta tables (default ./warehouse), or s3://bucket/prefix "
        "(S3 settings from the AWS_* environment variables)",
    )
    parser.add_argument(
        "--state-dir",
        default=os.environ.get("INGEST_STATE_DIR", "ingest-state"),
        help="with a warehouse in a bucket: the local folder for the service's own files "
        "(worker log, SQL journal, the default SQLite catalog); default ./ingest-state",
    )
    parser.add_argument(
        "--catalog",
        default=os.environ.get("INGEST_CATALOG"),
        help="the catalog: a SQLite file (default <warehouse>/catalog.sqlite) or a PostgreSQL "
        "URL postgresql://user@host:port/database (needs the postgres extra)",
    )
    parser.add_argument(
        "--auth-token",
        action="append",
        default=[],
        help="accept this bearer token (repeatable); none: no auth",
    )
    parser.add_argument(
        "--buffer-limit-mb",
        type=float,
        default=512,
        help="bytes of rows buffered before inserts get 429 (default 512 MiB)",
    )
    parser.add_argument(
        "--flush-bytes-mb",
        type=float,
        default=64,
        help="a table flushes at once past this many buffered MiB (default 64)",
    )
    parser.add_argument(
        "--default-max-client-lag",
        default="1 second",
        help="flush lag for channels that do not set one (default 1 second)",
    )
    parser.add_argument(
        "--channel-retention",
        default="30 days",
        help="remove channels idle this long (default 30 days)",
    )
    parser.add_argument(
        "--auto-compaction",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compact a table in the background past the thresholds (default on)",
    )
    parser.add_argument(
        "--compact-after-files",
        type=int,
        default=32,
        help="intermediate files that start a compaction (default 32)",
    )
    parser.add_argument(
        "--compact-after-mb",
        type=float,
        default=256,
        help="intermediate MiB that start a compaction (default 256)",
    )
    parser.add_argument(
        "--spark-master",
        default=None,
        help="Spark master for compaction (default $SPARK_MASTER or local[*])",
    )
    parser.add_argument(
        "--compaction-worker-idle",
        default="10 minutes",
        help="stop the Spark worker (compaction, SQL, refreshes; its JVM) after this idle time "
        "(default 10 minutes)",
    )
    parser.add_argument(
        "--spark-worker-nice", type=int, default=CompactionTrigger().worker_nice,
        help="niceness of the Spark worker (compaction, SQL, refreshes), 0 to 19: it takes "
             "the CPU flushes leave (default 10; 0: the service's priority)",
    )  # fmt: skip
    parser.add_argument(
        "--sql-max-sessions", type=int, default=256,
        help="POST /v1/sql sessions held at once; past it a new one gets 429 (default 256)",
    )  # fmt: skip
    parser.add_argument(
        "--sql-max-transactions", type=int, default=32,
        help="SQL transactions open at once; past it BEGIN gets 429 (default 32)",
    )  # fmt: skip
    parser.add_argument(
        "--sql-session-idle", default="1 hour",
        help="a SQL session unused this long ends, its transaction rolled back (default 1 hour)",
    )  # fmt: skip
    parser.add_argument(
        "--refresh-scheduler", action=argparse.BooleanOptionalAction, default=True,
        help="refresh dynamic tables on their schedule in the Spark worker (default on)",
    )  # fmt: skip
    parser.add_argument(
        "--change-stream-check-seconds", type=float, default=5.0,
        help="how often change stream partitions are checked for splits and merges "
             "(default 5; 0 turns the balancer off)",
    )  # fmt: skip
    parser.add_argument(
        "--change-stream-split-rows-per-s", type=float, default=20_000.0,
        help="split a change stream partition whose changed rows per second stay above "
             "this for 3 checks (default 20000)",
    )  # fmt: skip
    parser.add_argument(
        "--change-stream-merge-rows-per-s", type=float, default=10.0,
        help="merge adjacent partitions whose rates both stay below this (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--advertise-url", default=os.environ.get("INGEST_ADVERTISE_URL"),
        help="the URL producers reach this server by, when several serve one warehouse: "
             "channel opens answer it and the SDK sends the channel's calls there",
    )  # fmt: skip
    parser.add_argument(
        "--log-level",
        default=os.environ.get("INGEST_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO (default), WARNING or ERROR; logs are JSON lines on stderr",
    )
    args = parser.parse_args(argv)
    try:
        configure_logging(args.log_level)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return _config(args)
    except ConfigurationError as exc:
        parser.error(str(exc))


def _config(args: argparse.Namespace) -> ServerConfig:
    tokens = set(args.auth_token)
    if os.environ.get("INGEST_AUTH_TOKENS"):
        tokens |= set(os.environ["INGEST_AUTH_TOKENS"].split(","))
    return ServerConfig(
        host=args.host,
        port=args.port,
        warehouse=args.warehouse if is_object_store(args.warehouse) else Path(args.warehouse),
        state_dir=Path(args.state_dir),
        catalog=args.catalog or None,
        auth_tokens=frozenset(tokens),
        channel_retention_seconds=parse_duration(args.channel_retention, "channel retention"),
        flush=FlushPolicy(
            max_bytes=int(args.flush_bytes_mb * MiB),
            default_max_client_lag=parse_duration(args.default_max_client_lag, "max client lag"),
        ),
        limits=Limits(max_buffer_bytes=int(args.buffer_limit_mb * MiB)),
        compaction=CompactionTrigger(
            enabled=args.auto_compaction,
            max_intermediate_files=args.compact_after_files,
            max_intermediate_bytes=int(args.compact_after_mb * MiB),
            spark_master=args.spark_master,
            worker_idle_seconds=parse_duration(args.compaction_worker_idle, "worker idle time"),
            worker_nice=args.spark_worker_nice,
        ),
        sql=SqlLimits(
            max_sessions=args.sql_max_sessions,
            max_transactions=args.sql_max_transactions,
            idle_seconds=parse_duration(args.sql_session_idle, "SQL session idle time"),
        ),
        refresh_scheduler=args.refresh_scheduler,
        change_stream_check_seconds=args.change_stream_check_seconds,
        change_stream_balance=BalancePolicy(
            split_rows_per_s=args.change_stream_split_rows_per_s,
            merge_rows_per_s=args.change_stream_merge_rows_per_s,
        ),
        advertise_url=args.advertise_url or None,
    )


async def serve(config: ServerConfig) -> None:
    runner = web.AppRunner(create_app(config), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    url = f"http://{host}:{port}"
    print(dumps({"event": "listening", "url": url}).decode(), flush=True)
    log.info("listening on %s", url, extra={"url": url, "warehouse": str(config.warehouse),
             "buffer_limit_bytes": config.limits.max_buffer_bytes})  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        log.info("shutting down: flushing buffered rows")
    finally:
        await runner.cleanup()
    log.info("stopped")


def main(argv: list[str] | None = None) -> int:
    try:
        asyncio.run(serve(parse_args(argv)))
    except (CatalogUnavailableError, StoreConfigError) as exc:  # --catalog, --warehouse
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def run() -> NoReturn:
    """The ``channel-server`` script: ``main()`` with a deterministic exit status."""
    run_entry_point(main)


if __name__ == "__main__":
    run()
