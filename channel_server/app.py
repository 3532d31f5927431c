"""The aiohttp application factory: state in typed AppKeys, background work in cleanup_ctx."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from catalog import SqliteCatalog
from channel_server import (  # noqa: F401 - each registers its routes on the shared table
    change_stream_api,  # GET /v1/change-streams/{name}/read
    change_stream_listing,  # GET /v1/change-streams[/{name}]
    sql_api,  # POST /v1/sql
)
from channel_server.config import ServerConfig
from channel_server.handlers import AUTH_TOKENS, SERVICE, auth_middleware, error_middleware, routes
from channel_server.service import IngestService
from flush import purge_dropped
from pipelines.change_streams.balance import Balancer
from pipelines.transactions.commit import recover_pending

__all__ = ["create_app"]

log = logging.getLogger(__name__)
CONFIG = web.AppKey("config", ServerConfig)
#: How often the service looks for pipeline commits left by a dead owner.
PIPELINE_RECOVERY_SECONDS = 10.0
#: How often the service checks that the worker refreshing dynamic tables runs.
REFRESH_WORKER_CHECK_SECONDS = 2.0


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    catalog = SqliteCatalog(config.catalog_file)
    service = IngestService(config, catalog)
    replayed = await asyncio.to_thread(service.recover)
    log.info("start-up recovery replayed %d commit(s) into the catalog", replayed,
             extra={"replayed_commits": replayed})  # fmt: skip
    app[SERVICE] = service
    loops = [
        asyncio.create_task(_retention_loop(service), name="channel retention"),
        asyncio.create_task(_sql_session_loop(service), name="SQL session expiry"),
        asyncio.create_task(_pipeline_recovery_loop(service), name="pipeline commit recovery"),
        asyncio.create_task(_refresh_worker_loop(service), name="dynamic table refreshes"),
        asyncio.create_task(_balance_loop(service), name="change stream partitions"),
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop
        await service.stop()
        catalog.close()


async def _retention_loop(service: IngestService) -> None:
    """Remove channels idle longer than the retention period, now and then periodically."""
    while True:
        try:
            removed = await asyncio.to_thread(service.remove_inactive_channels)
            if removed:
                log.info("removed %d channel(s) idle past the retention period", removed)
        except Exception:
            log.exception("channel retention sweep failed")
        await asyncio.sleep(service.config.retention_check_seconds)


async def _sql_session_loop(service: IngestService) -> None:
    """End SQL sessions idle past their limit (their transactions rolled back)."""
    every = min(60.0, max(0.05, service.config.sql.idle_seconds / 4))
    while True:
        await asyncio.sleep(every)
        try:
            ended = await service.sql.expire_idle()
            if ended:
                log.info("ended %d SQL session(s) idle past the limit", ended)
        except Exception:
            log.exception("SQL session expiry failed")


async def _pipeline_recovery_loop(service: IngestService) -> None:
    """Roll forward pipeline commits whose owner died or gave up (a SQL session's worker
    killed mid-commit, a client process gone), so their streams and tables are free
    again without waiting for the next writer or session; and delete the folders of
    dropped tables no change stream keeps any longer."""
    while True:
        try:
            ended = await asyncio.to_thread(recover_pending, service.catalog)
            if ended:
                log.info("recovered %d pipeline commit(s)", ended)
            purged = await asyncio.to_thread(purge_dropped, service.catalog,
                                             service.config.warehouse)  # fmt: skip
            if purged:
                log.info("deleted the folders of %d dropped table(s)", purged)
        except Exception:
            log.exception("pipeline commit recovery failed")
        await asyncio.sleep(PIPELINE_RECOVERY_SECONDS)


async def _refresh_worker_loop(service: IngestService) -> None:
    """Keep the worker that refreshes dynamic tables running while any has a schedule."""
    while True:
        try:
            await service.keep_refreshing()
        except Exception:
            log.exception("starting the dynamic table refresh worker failed")
        await asyncio.sleep(REFRESH_WORKER_CHECK_SECONDS)


async def _balance_loop(service: IngestService) -> None:
    """Split change stream partitions that stay hot, merge adjacent ones that stay cold
    (:class:`pipelines.change_streams.balance.Balancer`)."""
    every = service.config.change_stream_check_seconds
    if every <= 0:
        return
    balancer = Balancer(service.catalog, service.config.change_stream_balance)
    while True:
        try:
            for done in await asyncio.to_thread(balancer.check):
                log.info("change stream partitions: %s", done)
        except Exception:
            log.exception("balancing change stream partitions failed")
        await asyncio.sleep(every)


def create_app(config: ServerConfig | None = None) -> web.Application:
    """Build the service application; start it with ``web.run_app`` or an ``AppRunner``."""
    config = config or ServerConfig()
    app = web.Application(
        middlewares=[error_middleware, auth_middleware],
        client_max_size=config.limits.max_request_bytes,
    )
    app[CONFIG] = config
    app[AUTH_TOKENS] = config.auth_tokens
    app.cleanup_ctx.append(_service_ctx)
    app.add_routes(routes)
    return app
