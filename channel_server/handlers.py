"""HTTP handlers: parse the request, call the service, answer JSON.

Every error a client can cause is an :class:`ingest_sdk.errors.IngestError`
that :func:`error_middleware` turns into a 4xx JSON answer with the wire code
the SDK maps back to the same class; anything else is a 500 and is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from aiohttp import web

from channel_server.catalog import TableInfo
from channel_server.service import IngestService
from channel_server.state import ChannelState
from ingest_sdk import ConversionOptions, InsertValidationResponse, OnErrorOption, convert_rows
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.durations import parse_max_client_lag
from ingest_sdk.errors import (
    AuthenticationError,
    IngestError,
    InsertValidationError,
    InvalidRequestError,
    error_code_of,
)
from ingest_sdk.wire import (
    ARROW_CONTENT_TYPE,
    HEADER_BATCH_SEQ,
    HEADER_END_OFFSET_TOKEN,
    HEADER_GENERATION,
    MAX_OFFSET_TOKEN_LENGTH,
    decode_arrow,
    dumps,
    loads,
)

__all__ = ["SERVICE", "auth_middleware", "error_middleware", "routes"]

log = logging.getLogger(__name__)
SERVICE = web.AppKey("service", IngestService)
AUTH_TOKENS = web.AppKey("auth_tokens", frozenset)
#: JSON row batches this large are converted in a worker thread, off the event loop.
THREAD_CONVERSION_ROWS = 2_000
routes = web.RouteTableDef()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(payload), status=status, content_type="application/json")


def _error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except InsertValidationError as exc:
        request.app[SERVICE].metrics.rejected_requests += 1
        return _json(
            _error_body(
                "INSERT_VALIDATION", str(exc), insert_errors=[_insert_error(exc.insert_error)]
            ),
            400,
        )
    except IngestError as exc:
        status, code = error_code_of(exc)
        if status < 500:
            request.app[SERVICE].metrics.rejected_requests += 1
        details = getattr(exc, "details", {})
        response = _json(_error_body(code, str(exc), **details), status)
        if "retry_after" in details:
            response.headers["Retry-After"] = f"{details['retry_after']:.3f}"
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json(_error_body(f"HTTP_{exc.status}", exc.reason or "error"), exc.status)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("internal error in %s %s", request.method, request.path)
        return _json(_error_body("INTERNAL", f"internal server error: {type(exc).__name__}"), 500)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    tokens = request.app[AUTH_TOKENS]
    if tokens and request.path.startswith("/v1/"):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or header[7:] not in tokens:
            raise AuthenticationError(
                "missing or wrong token: send 'Authorization: Bearer <token>' with a token "
                "the server was started with (--auth-token)"
            )
    return await handler(request)


# -- request parsing -----------------------------------------------------------------------


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = loads(await request.read())
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def _field(
    body: dict[str, Any] | Any, key: str, kind: type | tuple[type, ...], required: bool = True
) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidRequestError(f'the field "{key}" is required')
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidRequestError(f'the field "{key}" must be a {names}, got {value!r}')
    return value


def _handle(body: dict[str, Any]) -> tuple[str, str, int]:
    """The (table, channel, generation) that name a channel handle in a request body."""
    return _field(body, "table", str), _field(body, "channel", str), _field(body, "generation", int)


def _coordinate(request: web.Request, key: str, header: str) -> int:
    """A channel coordinate from the query string, or else from its header."""
    raw = request.rel_url.query.get(key, request.headers.get(header))
    if raw is None:
        raise InvalidRequestError(f'the parameter "{key}" is required')
    try:
        value = int(raw)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f'the parameter "{key}" must be an integer, got {raw!r}') from exc
    if value < 0:
        raise InvalidRequestError(f'the parameter "{key}" must not be negative')
    return value


def _token(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_OFFSET_TOKEN_LENGTH:
        raise InvalidRequestError(
            f'"{key}" must be a string of at most {MAX_OFFSET_TOKEN_LENGTH} characters'
        )
    return value


def _on_error(value: Any) -> OnErrorOption:
    try:
        return OnErrorOption.parse(value)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc


def _table_json(info: TableInfo) -> dict[str, Any]:
    return {
        "name": info.full_name,
        "database": info.database,
        "schema": info.schema_name,
        "table": info.name,
        "location": info.uri,
        "columns": info.schema.declarations(),
        "clustering": list(info.clustering),
        "created_at": info.created_at,
    }


def _insert_error(error: Any) -> dict[str, Any]:
    return {
        "row_index": error.row_index,
        "message": error.message,
        "extra_col_names": error.extra_col_names,
        "missing_not_null_col_names": error.missing_not_null_col_names,
        "null_value_for_not_null_col_names": error.null_value_for_not_null_col_names,
    }


def _channel_json(channel: ChannelState) -> dict[str, Any]:
    return {
        "table": channel.table.info.full_name,
        "channel": channel.name,
        "generation": channel.generation,
        "offset_token": channel.committed_token,
        "committed_batch_seq": channel.committed_seq,
        "last_batch_seq": channel.last_seq,
    }


# -- routes ---------------------------------------------------------------------------------


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json({"status": "ok", "buffer_bytes": service.budget.used})


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    text = service.metrics.prometheus(
        {
            "buffer_bytes_used": service.budget.used,
            "buffer_bytes_peak": service.budget.peak,
            "buffer_bytes_limit": service.budget.limit,
        }
    )
    return web.Response(text=text, content_type="text/plain")


@routes.post("/v1/tables")
async def create_table(request: web.Request) -> web.Response:
    body = await _body(request)
    name = _field(body, "name", str)
    columns = _field(body, "columns", dict)
    if_not_exists = bool(_field(body, "if_not_exists", bool, required=False))
    info, created = await asyncio.to_thread(
        request.app[SERVICE].create_table, name, columns, if_not_exists
    )
    return _json({**_table_json(info), "created": created}, 201 if created else 200)


@routes.get("/v1/tables")
async def list_tables(request: web.Request) -> web.Response:
    return _json({"tables": [_table_json(info) for info in request.app[SERVICE].list_tables()]})


@routes.get("/v1/tables/{name}")
async def describe_table(request: web.Request) -> web.Response:
    return _json(_table_json(request.app[SERVICE].describe_table(request.match_info["name"])))


@routes.delete("/v1/tables/{name}")
async def drop_table(request: web.Request) -> web.Response:
    info = await request.app[SERVICE].drop_table(request.match_info["name"])
    return _json({"dropped": info.full_name})


@routes.get("/v1/tables/{name}/migrations")
async def migrations(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json({"migrations": service.migrations(request.match_info["name"])})


@routes.put("/v1/tables/{name}/clustering")
async def set_clustering(request: web.Request) -> web.Response:
    body = await _body(request)
    columns = _field(body, "columns", list)
    info = request.app[SERVICE].set_clustering(request.match_info["name"], columns)
    return _json({**_table_json(info)})


@routes.post("/v1/tables/{name}/compact")
async def compact(request: web.Request) -> web.Response:
    """Start a background compaction now (202); its run appears in the migration history."""
    info, started = request.app[SERVICE].compact_now(request.match_info["name"])
    return _json({"table": info.full_name, "started": started}, 202)


@routes.post("/v1/channels/open")
async def open_channel(request: web.Request) -> web.Response:
    body = await _body(request)
    lag = body.get("max_client_lag")
    timezone = _field(body, "default_timezone", str, required=False) or "America/Los_Angeles"
    try:
        ConversionOptions(default_timezone=timezone)
        max_client_lag = parse_max_client_lag(lag) if lag is not None else None
    except IngestError as exc:
        raise InvalidRequestError(str(exc)) from exc
    channel = await request.app[SERVICE].open_channel(
        _field(body, "table", str),
        _field(body, "channel", str),
        max_client_lag=max_client_lag,
        on_error=_on_error(body.get("on_error", "ABORT")),
        default_timezone=timezone,
    )
    return _json({**_channel_json(channel), "columns": channel.table.info.schema.declarations()})


@routes.post("/v1/channels/rows")
async def insert_rows(request: web.Request) -> web.Response:
    """Arrow IPC (the SDK) or JSON rows (any HTTP client) for one channel batch."""
    service = request.app[SERVICE]
    query = request.rel_url.query
    table_name = query.get("table") or ""
    channel_name = query.get("channel") or ""
    is_arrow = request.content_type == ARROW_CONTENT_TYPE
    generation = _coordinate(request, "generation", HEADER_GENERATION)
    batch_seq = _coordinate(request, "batch_seq", HEADER_BATCH_SEQ)
    channel = service.channel_state(table_name, channel_name, generation)
    if batch_seq <= channel.last_seq:  # a retry: answer before reading or checking the body
        outcome = service.insert(table_name, channel_name, generation, batch_seq, None, None)
        return _json({"accepted_rows": 0, "duplicate": outcome.duplicate, "insert_errors": []})
    schema = channel.table.info.schema
    options = ConversionOptions(default_timezone=channel.default_timezone)
    response = InsertValidationResponse()
    if is_arrow:
        token = _token(request.headers.get(HEADER_END_OFFSET_TOKEN), HEADER_END_OFFSET_TOKEN)
        try:
            received = decode_arrow(await request.read())
        except (pa.ArrowInvalid, OSError) as exc:
            raise InvalidRequestError(f"the body is not a valid Arrow IPC stream: {exc}") from exc
        data = check_arrow_batch(schema, received, options) if received.num_rows else None
    else:
        body = await _body(request)
        rows = _field(body, "rows", list)
        token = _token(body.get("end_offset_token"), "end_offset_token")
        on_error = _on_error(body["on_error"]) if "on_error" in body else channel.on_error
        if len(rows) >= THREAD_CONVERSION_ROWS:
            batch, response = await asyncio.to_thread(convert_rows, schema, rows, on_error, options)
        else:
            batch, response = convert_rows(schema, rows, on_error, options)
        if on_error is OnErrorOption.SKIP_BATCH and response.has_errors():
            return _json(
                {
                    "accepted_rows": 0,
                    "duplicate": False,
                    "insert_errors": [_insert_error(e) for e in response.insert_errors],
                }
            )
        data = pa.Table.from_batches([batch]) if batch is not None else None
    outcome = service.insert(table_name, channel_name, generation, batch_seq, data, token)
    return _json(
        {
            "accepted_rows": outcome.accepted_rows,
            "duplicate": outcome.duplicate,
            "insert_errors": [_insert_error(e) for e in response.insert_errors],
        }
    )


@routes.post("/v1/channels/wait")
async def wait_for_commit(request: web.Request) -> web.Response:
    body = await _body(request)
    channel = await request.app[SERVICE].wait_for_commit(
        *_handle(body),
        _field(body, "batch_seq", int),
        float(_field(body, "timeout", (int, float), required=False) or 30.0),
    )
    target = body["batch_seq"]
    return _json({**_channel_json(channel), "committed": channel.committed_seq >= target})


@routes.post("/v1/channels/close")
async def close_channel(request: web.Request) -> web.Response:
    body = await _body(request)
    channel = await request.app[SERVICE].close_channel(
        *_handle(body),
        float(_field(body, "timeout", (int, float), required=False) or 60.0),
    )
    return _json(
        {
            **_channel_json(channel),
            "closed": not channel.valid and channel.committed_seq >= channel.last_seq,
        }
    )


@routes.post("/v1/channels/status")
async def channel_status(request: web.Request) -> web.Response:
    body = await _body(request)
    wanted = _field(body, "channels", list)
    service = request.app[SERVICE]
    answers = []
    for item in wanted:
        if not isinstance(item, dict):
            raise InvalidRequestError('each entry of "channels" must be an object {table, channel}')
        status = service.channel_status(
            _field(item, "table", str), _field(item, "channel", str),
            _field(item, "generation", int, required=False),
        )  # fmt: skip
        answers.append(asdict(status))
    return _json({"channels": answers})


@routes.post("/v1/channels/drop")
async def drop_channel(request: web.Request) -> web.Response:
    body = await _body(request)
    await request.app[SERVICE].drop_channel(
        _field(body, "table", str), _field(body, "channel", str)
    )
    return _json({"dropped": True})


@routes.get("/v1/channels")
async def show_channels(request: web.Request) -> web.Response:
    table = request.rel_url.query.get("table")
    return _json({"channels": request.app[SERVICE].list_channels(table)})
