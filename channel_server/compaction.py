"""When the service compacts a table: after a flush leaves too many intermediate files
(:class:`channel_server.config.CompactionTrigger`), or when asked
(``POST /v1/tables/{name}/compact``). The runs go to the Spark worker, one table at a time.

Of several services on one warehouse, one compacts a table at a time: a run first takes
the table's lease in the catalog (``compaction:<table id>``) and keeps renewing it while
the worker compacts; a run that finds another service's lease skips (its flushes will
ask again). A service that dies hands the lease over when it expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from catalog import Catalog
from channel_server.channels import intermediate_files
from channel_server.config import CompactionTrigger
from channel_server.metrics import Metrics
from channel_server.spark_worker import SparkWorker, SparkWorkerDied
from channel_server.state import TableState

__all__ = ["Compaction"]

log = logging.getLogger(__name__)
#: Seconds a compaction lease lasts without renewal; a run renews it every third of that.
LEASE_SECONDS = 60.0


class Compaction:
    """The compaction runs this service queued, at most one per table."""

    def __init__(
        self, trigger: CompactionTrigger, worker: SparkWorker, metrics: Metrics,
        catalog: Catalog, holder: str,
    ) -> None:  # fmt: skip
        self.trigger = trigger
        self.worker = worker
        self.metrics = metrics
        self.catalog = catalog
        #: This service, as the holder of compaction leases.
        self.holder = holder
        self._runs: dict[int, asyncio.Task[None]] = {}

    def after_flush(self, table: TableState, rows: int, seconds: float) -> None:
        """A flush's hook: compact once the table holds too many intermediate files."""
        trigger = self.trigger
        if trigger.enabled and (
            table.ingest_files > trigger.max_intermediate_files
            or table.ingest_bytes > trigger.max_intermediate_bytes
        ):
            self.start(table)

    def start(self, table: TableState) -> bool:
        """Queue a compaction of a table in the worker unless one is queued or running."""
        running = self._runs.get(table.info.id)
        if running is not None and not running.done():
            return False
        self._runs[table.info.id] = asyncio.create_task(
            self._run(table), name=f"compact {table.info.full_name}"
        )
        return True

    def run_of(self, table_id: int) -> asyncio.Task[None] | None:
        """The newest run queued for a table (done or not), None if there was none."""
        return self._runs.get(table_id)

    async def _run(self, table: TableState) -> None:
        name, lease = table.info.full_name, f"compaction:{table.info.id}"
        try:
            taken = await self._take(lease)
        except Exception as exc:  # the catalog is unreachable: the next flush asks again
            log.warning("compaction of %s not started: %s", name, exc, extra={"table": name})
            return
        if not taken:
            holder = await asyncio.to_thread(self.catalog.lease_holder, lease)
            log.info("compaction of %s skipped: the service %s compacts it", name,
                     holder[0] if holder else "?", extra={"table": name})  # fmt: skip
            self.metrics.compactions.labels(name, "SKIPPED").inc()
            return
        renewing = asyncio.create_task(self._renew(lease), name=f"renew {lease}")
        try:
            await self._compact(table)
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await asyncio.to_thread(self.catalog.release_lease, lease, self.holder)

    async def _take(self, lease: str) -> bool:
        return await asyncio.to_thread(self.catalog.take_lease, lease, self.holder, LEASE_SECONDS)

    async def _renew(self, lease: str) -> None:
        """Keep the lease while the run lasts (a lost renewal is tried again next time)."""
        while True:
            await asyncio.sleep(LEASE_SECONDS / 3)
            try:
                await self._take(lease)
            except Exception:
                log.exception("renewing %s failed", lease)

    async def _compact(self, table: TableState) -> None:
        name = table.info.full_name
        log.info("compacting %s", name)
        try:
            record = await self.worker.compact(name)
        except SparkWorkerDied as exc:
            log.error("compaction of %s failed: %s", name, exc, extra={"table": name})
            self.metrics.compactions.labels(name, "FAILED").inc()
        else:
            self.metrics.compactions.labels(name, str(record.get("status"))).inc()
            if record.get("status") == "FAILED":
                log.error("compaction of %s failed: %s (log %s)", name, record.get("error"),
                          self.worker.log_path, extra={"table": name})  # fmt: skip
            else:
                log.info("compaction of %s: %s, %s -> %s files", name, record.get("status"),
                         record.get("files_in"), record.get("files_out"),
                         extra={"table": name, "run": record})  # fmt: skip
        table.ingest_files, table.ingest_bytes = await asyncio.to_thread(
            intermediate_files, table.info.uri
        )

    async def stop(self) -> None:
        """Cancel the runs queued or running (a run cut half way leaves its table as it
        was)."""
        for run in self._runs.values():
            if not run.done():
                run.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run
        self._runs.clear()
