"""``POST /v1/sql``: SQL statements over HTTP, run in the service's Spark worker.

Body: ``{"statement": "...", "session": "name", "max_rows": 10000, "timeout": 300}``
(only ``statement`` is required). A session keeps its ``USE`` defaults and an open
transaction between requests; requests without one share the session ``default``.
The answer is an Arrow IPC stream when the request accepts
``application/vnd.apache.arrow.stream``, else JSON ``{"columns": [...], "rows":
[[...]], "truncated": false}`` (decimals as strings, so no digit is lost).
"""

from __future__ import annotations

import base64
import math
import re
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa
from aiohttp import web

from channel_server.handlers import SERVICE, routes
from channel_server.requests import field, json_body
from ingest_sdk.errors import InvalidRequestError

__all__ = ["ARROW_STREAM", "sql"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
MAX_STATEMENT_CHARS = 1_000_000
MAX_ROWS = 1_000_000
DEFAULT_ROWS = 10_000
MAX_TIMEOUT = 3_600.0
DEFAULT_TIMEOUT = 300.0
_SESSION = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def _decimal_as_text(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _request(body: dict[str, Any]) -> tuple[str, str, int, float]:
    statement = field(body, "statement", str)
    if not statement.strip() or len(statement) > MAX_STATEMENT_CHARS:
        raise InvalidRequestError(
            f'"statement" must be one SQL statement of 1 to {MAX_STATEMENT_CHARS} characters, '
            f"got {len(statement)} characters"
        )
    if "\x00" in statement:
        raise InvalidRequestError('"statement" must not contain NUL characters')
    session = field(body, "session", str, required=False)
    session = "default" if session is None else session
    if not _SESSION.fullmatch(session):
        raise InvalidRequestError(
            f'"session" must be 1 to 128 letters, digits, "_", "." or "-", got {session[:140]!r}'
        )
    max_rows = field(body, "max_rows", int, required=False)
    max_rows = DEFAULT_ROWS if max_rows is None else max_rows
    if not 1 <= max_rows <= MAX_ROWS:
        raise InvalidRequestError(f'"max_rows" must be from 1 to {MAX_ROWS}, got {max_rows}')
    timeout = field(body, "timeout", (int, float), required=False)
    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT:
        raise InvalidRequestError(f'"timeout" must be from 0 to {MAX_TIMEOUT:g} seconds')
    return statement, session, max_rows, float(timeout)


@routes.post("/v1/sql")
async def sql(request: web.Request) -> web.Response:
    """Run one statement; its rows (Arrow or JSON), or a 400 with the statement's code."""
    statement, session, max_rows, timeout = _request(await json_body(request))
    answer = await request.app[SERVICE].run_sql(statement, session, max_rows, timeout)
    data = base64.b64decode(answer["arrow"])
    if ARROW_STREAM in request.headers.get("Accept", ""):
        return web.Response(body=data, content_type=ARROW_STREAM)
    table = pa.ipc.open_stream(data).read_all()
    payload = {
        "columns": [{"name": f.name, "type": str(f.type)} for f in table.schema],
        "rows": [list(row.values()) for row in table.to_pylist()],
        "truncated": answer.get("truncated", False),
    }
    body = orjson.dumps(payload, default=_decimal_as_text, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, content_type="application/json")
