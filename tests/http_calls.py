"""One HTTP call as the service tests read it: status, JSON body and headers."""

from __future__ import annotations

from typing import Any

import aiohttp


async def call(http: aiohttp.ClientSession, method: str, path: str, **kwargs: Any) -> tuple:
    """``(status, body, headers)`` of one request; the body parsed as JSON."""
    async with http.request(method, path, **kwargs) as response:
        return response.status, await response.json(), response.headers


async def call_json(http: aiohttp.ClientSession, method: str, path: str, **kwargs: Any) -> tuple:
    """``(status, body)`` of one request."""
    status, body, _ = await call(http, method, path, **kwargs)
    return status, body
