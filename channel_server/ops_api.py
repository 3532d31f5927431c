"""``GET /health`` and ``GET /metrics`` (Prometheus text), open without a token.

``/health`` answers 200 ``{"status": "ok", ...}`` while the catalog and the tables' store
can be reached, and 503 ``{"status": "unavailable", "catalog": why, "store": why, ...}``
while either cannot (a catalog on PostgreSQL whose server is down, a bucket whose store
does not answer): an orchestrator then knows the service cannot commit. It stays cheap:
the catalog probes at most once a second (:meth:`catalog.Catalog.unreachable`), the store
at most once in five (:meth:`IngestService.store_unreachable`), each in a thread of its
own, so the answer never waits behind their calls, locks or the event loop's threads; a
store's probe that takes longer than half a second (its client retries) is answered with
the last probe's result, and its own shows from the next call on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from aiohttp import web

from channel_server.http_common import SERVICE, Routes, json_answer
from channel_server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

__all__ = ["PROBE_WAIT", "Probe", "setup"]

routes = Routes()
#: Seconds ``/health`` waits for the catalog's probe; one that takes longer is an answer
#: too (the catalog does not answer).
PROBE_WAIT = 5.0
#: Seconds ``/health`` waits for the store's probe before it answers with the last one's.
STORE_PROBE_WAIT = 0.5


class Probe:
    """A probe (of the catalog, of the store) as ``/health`` runs it: one at a time, in a
    daemon thread (a probe stuck on a dead network never holds up the process's exit);
    callers while it runs share its answer."""

    def __init__(self, what: str, wait: float = PROBE_WAIT, keep_last: bool = False) -> None:
        self.what = what
        #: Seconds a caller waits for a running probe; past it the answer is that the probe
        #: did not answer, or with ``keep_last`` the last probe's answer (a store's probe
        #: may wait out its client's retries: ``/health`` answers at once all the same).
        self.wait, self.keep_last = wait, keep_last
        self._running: asyncio.Future[str | None] | None = None
        self._last: str | None = None

    async def problem(self, unreachable: Callable[[], str | None]) -> str | None:
        """Why it cannot be reached, None when it can."""
        if self._running is None or self._running.done():
            self._running = _in_daemon_thread(unreachable)
        try:
            self._last = await asyncio.wait_for(asyncio.shield(self._running), self.wait)
        except TimeoutError:
            if not self.keep_last:
                return f"the {self.what} did not answer a probe within {self.wait:g} s"
        return self._last


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


PROBES = web.AppKey("probes", dict[str, Probe])


def setup(app: web.Application) -> None:
    app.add_routes(routes)
    app[PROBES] = {"catalog": Probe("catalog"),
                   "store": Probe("table storage", STORE_PROBE_WAIT, keep_last=True)}  # fmt: skip


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    buffered = service.channels.budget.used
    probes = request.app[PROBES]
    catalog, store = await asyncio.gather(
        probes["catalog"].problem(service.catalog.unreachable),
        probes["store"].problem(service.store_unreachable),
    )
    if catalog is None and store is None:
        return json_answer({"status": "ok", "buffer_bytes": buffered})
    found = {"catalog": catalog, "store": store}
    body = {"status": "unavailable", **{k: v for k, v in found.items() if v is not None},
            "buffer_bytes": buffered}  # fmt: skip
    return json_answer(body, 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[SERVICE].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )
