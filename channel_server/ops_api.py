"""``GET /health`` and ``GET /metrics`` (Prometheus text), open without a token."""

from __future__ import annotations

from aiohttp import web

from channel_server.http_common import SERVICE, Routes, json_answer
from channel_server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE

__all__ = ["setup"]

routes = Routes()


def setup(app: web.Application) -> None:
    app.add_routes(routes)


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return json_answer({"status": "ok", "buffer_bytes": service.channels.budget.used})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[SERVICE].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )
