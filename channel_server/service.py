"""The ingest service: its parts, built once per process, and what takes more than one.

- :class:`channel_server.tables.Tables`: table definitions;
- :class:`channel_server.channels.Channels`: channels, buffers and flushers;
- :class:`channel_server.compaction.Compaction`: compaction runs;
- :class:`channel_server.spark_worker.SparkWorker`: the Spark process that compacts, runs
  SQL statements (:class:`channel_server.sql_service.SqlService`) and refreshes dynamic
  tables;
- :mod:`channel_server.schedules`: the periodic steps (started by the application).

The HTTP layer only parses and answers; every rule of the commit protocol lives in
:mod:`channel_server.channels`, :mod:`channel_server.flusher` and :mod:`flush`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import socket
import sys
import time
import uuid
from dataclasses import replace

from catalog import CATALOG_VARIABLE, Catalog, TableInfo
from channel_server.channels import Channels
from channel_server.compaction import Compaction
from channel_server.config import ServerConfig
from channel_server.metrics import Metrics
from channel_server.spark_worker import SparkWorker
from channel_server.sql_service import SqlService
from channel_server.tables import Tables
from flush import purge_dropped, replay_commits
from flush.storage import describe_store_error, exists
from ingest_sdk.errors import InvalidRequestError
from pipelines.dynamic_tables.scheduler import SERVICE_ID_VARIABLE

__all__ = ["IngestService", "refreshes_scheduled", "spark_worker_command"]

log = logging.getLogger(__name__)
#: Why the Spark parts refuse a warehouse in a bucket (pyspark ships no S3 file system).
#: Seconds between two probes of a bucket's store by ``/health``.
STORE_PROBE_INTERVAL = 5.0
IN_BUCKET_GAP = (
    "does not run on a warehouse in a bucket yet: Spark here reads local tables only. "
    "Ingest through channels works; for SQL, dynamic tables and compaction use a local "
    "warehouse folder"
)


def spark_worker_command(config: ServerConfig) -> list[str]:
    """The Spark worker's command line, run at its niceness through ``nice(1)`` (a POSIX
    tool; without it the worker runs at the service's priority). The catalog's location
    goes in :data:`CATALOG_VARIABLE`, never on the command line (a URL may hold a
    password)."""
    trigger = config.compaction
    nice = shutil.which("nice") if trigger.worker_nice else None
    return [
        *([nice, "-n", str(trigger.worker_nice)] if nice else []),
        sys.executable, "-m", "pipelines.worker", "--serve",
        "--warehouse", str(config.warehouse),
        "--target-file-mb", str(trigger.target_file_mb),
        *(["--spark-master", trigger.spark_master] if trigger.spark_master else []),
        *(["--refresh-scheduler"] if config.refresh_scheduler else []),
        *trigger.extra_args,
    ]  # fmt: skip


def refreshes_scheduled(config: ServerConfig, catalog: Catalog) -> bool:
    """Whether a dynamic table refreshes on a schedule (the worker's refresh loop must
    run): one active, with a time lag or initialized on schedule."""
    if not config.refresh_scheduler:
        return False
    return any(dt.state == "ACTIVE" for dt in catalog.list_dynamic_tables())


class IngestService:
    """One warehouse served by this process: its catalog and the service's parts."""

    def __init__(self, config: ServerConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = Metrics()
        #: This service among others on the warehouse (the holder of its leases).
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        #: Whether this service's worker schedules the dynamic tables' refreshes (some
        #: are scheduled and it holds the scheduler's lease; ``schedules`` decides).
        self.schedules_refreshes = False
        self.worker = SparkWorker(
            spark_worker_command(config),
            config.local_folder / "_logs" / "spark-worker.log",
            config.compaction.worker_idle_seconds,
            on_death=self.metrics.worker_restarts.inc,
            environment={
                CATALOG_VARIABLE: str(config.catalog_location),
                SERVICE_ID_VARIABLE: self.id,
            },
        )
        self.tables = Tables(config, catalog, self.metrics)
        # Spark reads and writes local tables only here: in a bucket no compaction runs.
        trigger = replace(config.compaction, enabled=False) if config.in_object_store else \
            config.compaction  # fmt: skip
        self.compaction = Compaction(trigger, self.worker, self.metrics, catalog, self.id)
        self.channels = Channels(
            config, catalog, self.tables, self.metrics, on_flush=self.compaction.after_flush,
            server=config.advertise_url or self.id,
        )  # fmt: skip
        #: ``POST /v1/sql``: sessions, and statements run in the same worker.
        journal = config.local_folder / "_service" / "sql_transactions.json"
        self.sql = SqlService(self.worker, config.sql, self.metrics, journal)
        sql_keeps_alive = self.worker.keep_alive
        self.worker.keep_alive = lambda: sql_keeps_alive() or self.schedules_refreshes
        self.started_at = time.time()
        self._store_probed_at = -math.inf
        self._store_problem: str | None = None

    def store_unreachable(self) -> str | None:
        """Why the bucket holding the tables cannot be reached, None when it can (and for
        a local folder); asks the store at most once in :data:`STORE_PROBE_INTERVAL`."""
        if not self.config.in_object_store:
            return None
        now = time.monotonic()
        if now - self._store_probed_at >= STORE_PROBE_INTERVAL:
            try:
                exists(str(self.config.warehouse))
                self._store_problem = None
            except OSError as exc:
                self._store_problem = f"the table storage cannot be reached: " \
                    f"{describe_store_error(exc, 300)}"  # fmt: skip
            self._store_probed_at = now
        return self._store_problem

    def recover(self) -> int:
        """Replay Delta commits the catalog has not recorded (crash after commit). Returns
        how many were replayed."""
        replayed = 0
        for info in self.catalog.list_tables():
            if not exists(info.uri, "_delta_log"):
                log.error("table %s has no Delta log at %s; skipping", info.full_name, info.uri)
                continue
            for record in replay_commits(self.catalog, info.id):
                replayed += 1
                log.info("recovered commit %d of %s", record.version, info.full_name,
                         extra={"table": info.full_name, "version": record.version})  # fmt: skip
        return replayed

    async def drop_table(self, name: str) -> TableInfo:
        """Drop a table: its channels, its catalog entry, then its folder.

        Raises:
            DynamicTableReadOnlyError: a dynamic table (``DROP DYNAMIC TABLE`` drops it).
            TableBusyError: a pending pipeline commit writes the table.
        """
        info, dynamic = await self.tables.to_write(name)
        await asyncio.to_thread(self.tables.check_droppable, info, dynamic)  # before stopping
        await self.channels.stop_table(info.id)
        await asyncio.to_thread(self.tables.forget, info)
        try:
            await asyncio.to_thread(purge_dropped, self.catalog, self.config.warehouse)
        except OSError as exc:  # dropped all the same: the recovery task purges it later
            log.warning("table %s is dropped; deleting its files failed and is left to the "
                        "recovery task: %s", info.full_name, describe_store_error(exc))  # fmt: skip
        return info

    async def compact_now(self, table_name: str) -> tuple[TableInfo, bool]:
        """Start a background compaction of a table; False if one is already running.

        Raises:
            InvalidRequestError: the warehouse is in a bucket (see :data:`IN_BUCKET_GAP`).
        """
        if self.config.in_object_store:
            raise InvalidRequestError(f"compaction {IN_BUCKET_GAP}")
        info = await asyncio.to_thread(self.tables.describe, table_name)
        return info, self.compaction.start(self.channels.table_state(info))

    async def stop(self) -> None:
        """Flush what is buffered (best effort), stop the flushers, the compaction runs
        and the worker."""
        await self.channels.stop()
        await self.compaction.stop()
        await self.worker.stop()
