"""One HTTP call as the service tests read it: status, JSON body and headers; with
aiohttp in the tests' event loop, or blocking (:func:`call_url`) where a test drives
servers of their own loops or processes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
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


def call_url(url: str, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple:
    """``(status, body)`` of one blocking request with a JSON ``body``; the answer parsed
    as JSON, or its bytes when it is not JSON."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw
