"""``POST /v1/sql``: SQL statements over HTTP, run in the service's Spark worker.

Body: ``{"statement": "...", "session": "name", "max_rows": 10000, "timeout": 300}``
(only ``statement`` is required). A session keeps its ``USE`` defaults and an open
transaction between requests and belongs to the token that named it; a request without
one runs alone in auto-commit (see :mod:`channel_server.sql_sessions`).
``DELETE /v1/sql/sessions/{name}`` ends a session. The answer is an Arrow IPC stream
when the request accepts ``application/vnd.apache.arrow.stream``, else JSON
``{"columns": [...], "rows": [[...]], "truncated": false}`` (decimals as strings, so no
digit is lost), streamed to the client batch by batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from decimal import Decimal
from typing import Any

import orjson
import pyarrow as pa
from aiohttp import web

from channel_server.http_common import AUTH_TOKENS, SERVICE, Routes
from channel_server.requests import field, json_body
from channel_server.service import IN_BUCKET_GAP
from ingest_sdk.errors import InvalidRequestError, SqlStatementError

__all__ = ["ARROW_STREAM", "setup", "sql"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"
MAX_STATEMENT_CHARS = 1_000_000
MAX_ROWS = 1_000_000
DEFAULT_ROWS = 10_000
MAX_TIMEOUT = 3_600.0
DEFAULT_TIMEOUT = 300.0
_SESSION = re.compile(r"[A-Za-z0-9_.-]{1,128}")
#: The answer goes to the client in pieces of this size (it is never built twice).
CHUNK_BYTES = 1 << 20

routes = Routes()


def setup(app: web.Application) -> None:
    app.add_routes(routes)


def _decimal_as_text(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _request(body: dict[str, Any]) -> tuple[str, str | None, int, float]:
    statement = field(body, "statement", str)
    if not statement.strip() or len(statement) > MAX_STATEMENT_CHARS:
        raise InvalidRequestError(
            f'"statement" must be one SQL statement of 1 to {MAX_STATEMENT_CHARS} characters, '
            f"got {len(statement)} characters"
        )
    if "\x00" in statement:
        raise InvalidRequestError('"statement" must not contain NUL characters')
    session = field(body, "session", str, required=False)
    if session is not None and not _SESSION.fullmatch(session):
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


def owner_of(request: web.Request) -> str:
    """Who a session belongs to: a digest of the bearer token (sessions are scoped to the
    token that named them), or ``anonymous`` when the service runs without tokens."""
    if not request.app[AUTH_TOKENS]:
        return "anonymous"
    token = request.headers.get("Authorization", "")[len("Bearer ") :]
    return hashlib.sha256(token.encode()).hexdigest()[:24]


@routes.post("/v1/sql")
async def sql(request: web.Request) -> web.StreamResponse:
    """Run one statement; its rows (Arrow or JSON, streamed), or an error with its code."""
    statement, session, max_rows, timeout = _request(await json_body(request))
    service = request.app[SERVICE]
    if service.config.in_object_store:
        raise SqlStatementError(f"SQL {IN_BUCKET_GAP}", sql_code="NOT_SUPPORTED_IN_BUCKET")
    answer = await service.sql.run(owner_of(request), session, statement, max_rows, timeout)
    headers = {"X-Rows": str(answer.rows), "X-Truncated": str(answer.truncated).lower()}
    response = web.StreamResponse(headers=headers)
    if ARROW_STREAM in request.headers.get("Accept", ""):
        response.content_type = ARROW_STREAM
        await response.prepare(request)
        view = memoryview(answer.arrow)
        for start in range(0, len(view), CHUNK_BYTES):
            await response.write(view[start : start + CHUNK_BYTES])
        await response.write_eof()
        return response
    response.content_type = "application/json"
    await response.prepare(request)
    reader = pa.ipc.open_stream(answer.arrow)
    columns = [{"name": f.name, "type": str(f.type)} for f in reader.schema]
    await response.write(b'{"columns":' + orjson.dumps(columns) + b',"rows":[')
    first = True
    for batch in reader:
        rows = await asyncio.to_thread(_json_rows, batch)
        if rows:
            await response.write((b"" if first else b",") + rows)
            first = False
    truncated = b"true" if answer.truncated else b"false"
    await response.write(b'],"truncated":' + truncated + b"}")
    await response.write_eof()
    return response


def _json_rows(batch: pa.RecordBatch) -> bytes:
    """One batch's rows as JSON arrays, comma-separated (no brackets around them). Built
    column by column, so columns of the same name keep their own values; a float that JSON
    cannot hold (NaN, Infinity, -Infinity) is written as that text, never as null."""
    columns = [_json_values(column) for column in batch.columns]
    rows = [list(row) for row in zip(*columns, strict=True)] if columns else []
    text = orjson.dumps(rows, default=_decimal_as_text, option=orjson.OPT_NON_STR_KEYS)
    return text[1:-1]


def _json_values(column: pa.Array) -> list[Any]:
    values = column.to_pylist()
    if pa.types.is_floating(column.type):
        return [_FLOAT_TEXT.get(repr(v), v) if isinstance(v, float) else v for v in values]
    return values


_FLOAT_TEXT = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


@routes.delete("/v1/sql/sessions/{name}")
async def close_session(request: web.Request) -> web.Response:
    """End a session now (its open transaction, if any, is rolled back)."""
    name = request.match_info["name"]
    if not _SESSION.fullmatch(name):
        raise InvalidRequestError(
            f'a session name is 1 to 128 letters, digits, "_", "." or "-", got {name[:140]!r}'
        )
    closed = await request.app[SERVICE].sql.close_session(owner_of(request), name)
    return web.json_response({"session": name, "closed": closed})
