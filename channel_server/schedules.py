"""The service's periodic work, each step on a schedule of its own: channel retention,
SQL session expiry, pipeline commit recovery (and the folders of dropped tables), the
Spark worker kept running while dynamic tables refresh on a schedule, and change stream
partition balancing.

One step's failure is logged and the step runs again at its next period; it never stops
the others or the service. The steps that one service of several on a warehouse must run
alone (partition balancing, channel retention) run only while their service holds the
step's lease in the catalog (:meth:`catalog.Catalog.take_lease`), renewed at each period
and given up when the service stops; another service takes an expired one over. The
dynamic tables' scheduler (the worker's refresh loop) runs on the service holding its
lease too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from catalog import CatalogUnavailableError
from channel_server.service import IngestService, refreshes_scheduled
from flush import purge_dropped
from pipelines.change_streams.balance import Balancer
from pipelines.dynamic_tables.scheduler import SCHEDULER_LEASE, SCHEDULER_LEASE_SECONDS
from pipelines.transactions.commit import recover_pending

__all__ = ["periodic", "release_leases", "start", "stop"]

log = logging.getLogger(__name__)
#: How often the service looks for pipeline commits left by a dead owner.
PIPELINE_RECOVERY_SECONDS = 10.0
#: How often the service checks that the worker refreshing dynamic tables runs.
REFRESH_WORKER_CHECK_SECONDS = 2.0


#: A step's lease lasts this many of its periods (a service that stopped without giving
#: it up, or died, hands it over after that long).
LEASE_PERIODS = 3
#: The shortest lease, so a short period does not make a lease flap under load.
MIN_LEASE_SECONDS = 10.0


def periodic(
    what: str,
    seconds: float,
    step: Callable[[], Awaitable[None]],
    *,
    wait_first: bool = False,
    lease: Callable[[float], Awaitable[bool]] | None = None,
) -> asyncio.Task[None]:
    """Run ``step`` now (or after one period) and then every ``seconds``; a failure is
    logged as "``what`` failed" and the step runs again at its next period. With
    ``lease``, each run first takes or renews it for a few periods and is skipped while
    another holder's runs."""
    lease_seconds = max(MIN_LEASE_SECONDS, LEASE_PERIODS * seconds)

    async def loop() -> None:
        if wait_first:
            await asyncio.sleep(seconds)
        while True:
            try:
                if lease is None or await lease(lease_seconds):
                    await step()
            except CatalogUnavailableError as exc:  # an outage, not a bug: no traceback
                log.warning("%s failed: %s", what, exc)
            except Exception:
                log.exception("%s failed", what)
            await asyncio.sleep(seconds)

    return asyncio.create_task(loop(), name=what)


#: The leases of the steps one service of several runs alone.
RETENTION_LEASE = "channel-retention"
BALANCER_LEASE = "change-stream-balancer"


def _lease(service: IngestService, name: str) -> Callable[[float], Awaitable[bool]]:
    async def take(seconds: float) -> bool:
        return await asyncio.to_thread(service.catalog.take_lease, name, service.id, seconds)

    return take


def start(service: IngestService) -> list[asyncio.Task[None]]:
    """Start the service's periodic steps; :func:`stop` ends them."""
    config = service.config
    tasks = [
        periodic("channel retention sweep", config.retention_check_seconds,
                 functools.partial(_retention, service),
                 lease=_lease(service, RETENTION_LEASE)),
        periodic("SQL session expiry", min(60.0, max(0.05, config.sql.idle_seconds / 4)),
                 functools.partial(_expire_sessions, service), wait_first=True),
        periodic("pipeline commit recovery", PIPELINE_RECOVERY_SECONDS,
                 functools.partial(_recover_pipelines, service)),
        periodic("starting the dynamic table refresh worker", REFRESH_WORKER_CHECK_SECONDS,
                 functools.partial(_keep_refreshing, service)),
    ]  # fmt: skip
    if config.change_stream_check_seconds > 0:
        balancer = Balancer(service.catalog, config.change_stream_balance)
        tasks.append(periodic("balancing change stream partitions",
                              config.change_stream_check_seconds,
                              functools.partial(_balance, balancer),
                              lease=_lease(service, BALANCER_LEASE)))  # fmt: skip
    return tasks


async def stop(service: IngestService, tasks: list[asyncio.Task[None]]) -> None:
    """End the steps."""
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def release_leases(service: IngestService) -> None:
    """Give the steps' leases up, so another service takes them at once; after the
    service stopped its worker, whose refresh loop takes the scheduler's lease itself."""
    for name in (RETENTION_LEASE, BALANCER_LEASE, SCHEDULER_LEASE):
        try:
            await asyncio.to_thread(service.catalog.release_lease, name, service.id)
        except Exception:  # the catalog may be gone; the lease then expires
            log.exception("giving up the lease %s failed", name)


async def _retention(service: IngestService) -> None:
    """Remove channels idle longer than the retention period."""
    removed = await asyncio.to_thread(service.channels.remove_inactive)
    if removed:
        log.info("removed %d channel(s) idle past the retention period", removed)


async def _expire_sessions(service: IngestService) -> None:
    """End SQL sessions idle past their limit (their transactions rolled back)."""
    ended = await service.sql.expire_idle()
    if ended:
        log.info("ended %d SQL session(s) idle past the limit", ended)


async def _recover_pipelines(service: IngestService) -> None:
    """Roll forward pipeline commits whose owner died or gave up (a SQL session's worker
    killed mid-commit, a client process gone), so their streams and tables are free
    again without waiting for the next writer or session; and delete the folders of
    dropped tables no change stream keeps any longer."""
    ended = await asyncio.to_thread(recover_pending, service.catalog)
    if ended:
        log.info("recovered %d pipeline commit(s)", ended)
    purged = await asyncio.to_thread(purge_dropped, service.catalog, service.config.warehouse)
    if purged:
        log.info("deleted the folders of %d dropped table(s)", purged)


async def _keep_refreshing(service: IngestService) -> None:
    """Start the worker (and with it the refresh loop) if dynamic tables need it, this
    service is their scheduler and the worker is not running: after a restart of the
    service, the worker's death, or the scheduler's lease coming to this service.

    One service of several on a warehouse schedules the refreshes: the one holding
    :data:`SCHEDULER_LEASE`, which it renews here every few seconds and its worker's
    loop takes before each round (the same holder: the service's id)."""
    catalog = service.catalog
    scheduled = await asyncio.to_thread(refreshes_scheduled, service.config, catalog)
    service.schedules_refreshes = scheduled and await asyncio.to_thread(
        catalog.take_lease, SCHEDULER_LEASE, service.id, SCHEDULER_LEASE_SECONDS
    )
    if service.schedules_refreshes and service.worker.pid is None:
        await service.worker.request({"ping": True})


async def _balance(balancer: Balancer) -> None:
    """Split change stream partitions that stay hot, merge adjacent ones that stay cold
    (:class:`pipelines.change_streams.balance.Balancer`)."""
    for done in await asyncio.to_thread(balancer.check):
        log.info("change stream partitions: %s", done)
