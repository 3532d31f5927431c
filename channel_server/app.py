"""The aiohttp application factory: the service in a typed AppKey, its periodic steps in
its context, and each API module's routes and state added by its ``setup(app)``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from catalog import open_catalog
from channel_server import (
    change_stream_api,
    change_stream_listing,
    channels_api,
    ops_api,
    schedules,
    sql_api,
    tables_api,
)
from channel_server.config import ServerConfig
from channel_server.http_common import AUTH_TOKENS, SERVICE, auth_middleware, error_middleware
from channel_server.service import IngestService
from flush.store_check import check_object_store

__all__ = ["CONFIG", "create_app"]

log = logging.getLogger(__name__)
CONFIG = web.AppKey("config", ServerConfig)
#: Each adds its routes (and any state of its own) to the application.
API_MODULES = (ops_api, tables_api, channels_api, sql_api, change_stream_listing,
               change_stream_api)  # fmt: skip


async def _service_context(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    if config.in_object_store:  # before anything commits there
        await asyncio.to_thread(check_object_store, str(config.warehouse))
    catalog = await asyncio.to_thread(open_catalog, config.catalog_location)
    service = IngestService(config, catalog)
    replayed = await asyncio.to_thread(service.recover)
    log.info("start-up recovery replayed %d commit(s) into the catalog", replayed,
             extra={"replayed_commits": replayed})  # fmt: skip
    app[SERVICE] = service
    tasks = schedules.start(service)
    try:
        yield
    finally:
        await schedules.stop(service, tasks)
        await service.stop()
        await schedules.release_leases(service)
        catalog.close()


def create_app(config: ServerConfig | None = None) -> web.Application:
    """Build the service application; start it with ``web.run_app`` or an ``AppRunner``."""
    config = config or ServerConfig()
    app = web.Application(
        middlewares=[error_middleware, auth_middleware],
        client_max_size=config.limits.max_request_bytes,
    )
    app[CONFIG] = config
    app[AUTH_TOKENS] = config.auth_tokens
    app.cleanup_ctx.append(_service_context)  # first: the modules' contexts use the service
    for module in API_MODULES:
        module.setup(app)
    return app
