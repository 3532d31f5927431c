"""``GET /health`` and ``GET /metrics`` (Prometheus text), open without a token.

``/health`` answers 200 ``{"status": "ok", ...}`` while the catalog can be reached, and
503 ``{"status": "unavailable", "catalog": why, ...}`` while it cannot (a catalog on
PostgreSQL whose server is down or unreachable): an orchestrator then knows the service
cannot commit. It stays cheap: the catalog probes at most once a second
(:meth:`catalog.Catalog.unreachable`), in a thread of its own, so the answer never waits
behind the catalog's calls, its lock or the event loop's worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from aiohttp import web

from channel_server.http_common import SERVICE, Routes, json_answer
from channel_server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

__all__ = ["PROBE_WAIT", "CatalogProbe", "setup"]

routes = Routes()
#: Seconds ``/health`` waits for the catalog's probe; one that takes longer is an answer
#: too (the catalog does not answer).
PROBE_WAIT = 5.0


class CatalogProbe:
    """The catalog's probe as ``/health`` runs it: one at a time, in a daemon thread (a
    probe stuck on a dead network never holds up the process's exit); callers while it
    runs share its answer."""

    def __init__(self) -> None:
        self._running: asyncio.Future[str | None] | None = None

    async def problem(self, unreachable: Callable[[], str | None]) -> str | None:
        """Why the catalog cannot be reached, None when it can."""
        if self._running is None or self._running.done():
            self._running = _in_daemon_thread(unreachable)
        try:
            return await asyncio.wait_for(asyncio.shield(self._running), PROBE_WAIT)
        except TimeoutError:
            return f"the catalog did not answer a probe within {PROBE_WAIT:g} s"


def _in_daemon_thread(call: Callable[[], str | None]) -> asyncio.Future[str | None]:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[str | None] = loop.create_future()

    def settle(result: str | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = call()
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed: the service stopped
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="catalog-probe", daemon=True).start()
    return future


PROBE = web.AppKey("catalog_probe", CatalogProbe)


def setup(app: web.Application) -> None:
    app.add_routes(routes)
    app[PROBE] = CatalogProbe()


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    buffered = service.channels.budget.used
    problem = await request.app[PROBE].problem(service.catalog.unreachable)
    if problem is None:
        return json_answer({"status": "ok", "buffer_bytes": buffered})
    body = {"status": "unavailable", "catalog": problem, "buffer_bytes": buffered}
    return json_answer(body, 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[SERVICE].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )
