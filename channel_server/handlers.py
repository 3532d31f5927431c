"""HTTP handlers: parse the request, call the service, answer JSON.

Every error a client can cause is an :class:`ingest_sdk.errors.IngestError`
that :func:`error_middleware` turns into a 4xx JSON answer with the wire code
the SDK maps back to the same class; anything else is a 500 and is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from aiohttp import HttpVersion11, hdrs, web

from catalog import TableInfo
from channel_server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from channel_server.requests import (
    arrow_names,
    bounded_int,
    check_token,
    coordinate,
    field,
    json_body,
    on_error,
    read_body,
    timeout,
    timezone,
)
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
    decode_arrow,
    dumps,
    loads_exact,
)

__all__ = ["SERVICE", "auth_middleware", "error_middleware", "routes"]

log = logging.getLogger(__name__)
SERVICE = web.AppKey("service", IngestService)
AUTH_TOKENS = web.AppKey("auth_tokens", frozenset)
#: JSON row batches this large are converted in a worker thread, off the event loop.
THREAD_CONVERSION_ROWS = 2_000
#: Keys of the request for the failure log line: the error, and the table and channel a
#: JSON body named (query and path parameters are read directly).
_FAILURE = web.RequestKey("failure", tuple)
_TABLE = web.RequestKey("table", str)
_CHANNEL = web.RequestKey("channel", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Routes(web.RouteTableDef):
    """Routes whose ``Expect`` header is answered by :func:`_expect`."""

    def route(self, method: str, path: str, **kwargs: Any) -> Any:
        return super().route(method, path, expect_handler=_expect, **kwargs)


routes = _Routes()
#: A table in a path: any name but "/" (aiohttp's default pattern also refuses "{" and
#: "}", which a table name may hold, so such a table could not be described or dropped).
_TABLE_PATH = "/v1/tables/{name:[^/]+}"


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(payload), status=status, content_type="application/json")


def _error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every error as JSON with its wire code, and log one line per failed request."""
    started = time.monotonic()
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _failure(request, exc.status, f"HTTP_{exc.status}", exc.reason or "error", {})
    except InsertValidationError as exc:
        errors = [_insert_error(exc.insert_error)]
        response = _failure(request, 400, "INSERT_VALIDATION", str(exc), {"insert_errors": errors})
    except IngestError as exc:
        status, code = error_code_of(exc)
        response = _failure(request, status, code, str(exc), getattr(exc, "details", {}))
    except Exception:
        log.exception("internal error in %s %s", request.method, request.path)
        message = "internal server error; the service log has the details"
        response = _failure(request, 500, "INTERNAL", message, {})
    _log_failure(request, response, time.monotonic() - started)
    if request.content.exception() is not None:
        # The body's stream broke (e.g. bad gzip): answer, then end the connection, and
        # mark the stream finished so aiohttp does not try to drain it (and fail loudly).
        response.force_close()
        request.content.feed_eof()
    return response


def _failure(
    request: web.Request, status: int, code: str, message: str, details: dict[str, Any]
) -> web.Response:
    request.app[SERVICE].metrics.rejected_requests.labels(code).inc()
    request[_FAILURE] = (code, message)
    response = _json(_error_body(code, message, **details), status)
    if "retry_after" in details:
        response.headers["Retry-After"] = f"{details['retry_after']:.3f}"
    return response


def _log_failure(request: web.Request, response: web.Response, seconds: float) -> None:
    code, message = request[_FAILURE]
    if code == "BACKPRESSURE":
        level = logging.DEBUG  # expected under load, counted in the metrics, retried
    else:
        level = logging.ERROR if response.status >= 500 else logging.WARNING
    query = request.rel_url.query
    log.log(
        level,
        "%s %s -> %d %s: %s",
        request.method,
        request.path,
        response.status,
        code,
        message,
        extra={
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "code": code,
            "table": request.get(_TABLE) or request.match_info.get("name") or query.get("table"),
            "channel": request.get(_CHANNEL) or query.get("channel"),
            "duration_ms": round(seconds * 1000, 1),
        },
    )


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


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` answered as aiohttp does; any other expectation a JSON 417.

    aiohttp handles the header before the middlewares run, so its own refusal is plain
    text, and a 500 when the value holds bytes that are not UTF-8.
    """
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim answer is not part of the response
        return None
    message = f"unknown Expect header {expect[:100]!r}; send 'Expect: 100-continue' or none"
    response = _failure(request, 417, "HTTP_417", message, {})
    _log_failure(request, response, 0.0)
    return response


# -- answers ---------------------------------------------------------------------------------


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
    return web.Response(
        body=request.app[SERVICE].metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )


@routes.post("/v1/tables")
async def create_table(request: web.Request) -> web.Response:
    body = await json_body(request)
    request[_TABLE] = body["name"] if isinstance(body.get("name"), str) else ""
    name = field(body, "name", str)
    columns = field(body, "columns", dict)
    if_not_exists = bool(field(body, "if_not_exists", bool, required=False))
    info, created = await asyncio.to_thread(
        request.app[SERVICE].create_table, name, columns, if_not_exists
    )
    return _json({**_table_json(info), "created": created}, 201 if created else 200)


@routes.get("/v1/tables")
async def list_tables(request: web.Request) -> web.Response:
    return _json({"tables": [_table_json(info) for info in request.app[SERVICE].list_tables()]})


@routes.get(_TABLE_PATH)
async def describe_table(request: web.Request) -> web.Response:
    return _json(_table_json(request.app[SERVICE].describe_table(request.match_info["name"])))


@routes.delete(_TABLE_PATH)
async def drop_table(request: web.Request) -> web.Response:
    info = await request.app[SERVICE].drop_table(request.match_info["name"])
    return _json({"dropped": info.full_name})


@routes.get(_TABLE_PATH + "/migrations")
async def migrations(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return _json({"migrations": service.migrations(request.match_info["name"])})


@routes.put(_TABLE_PATH + "/clustering")
async def set_clustering(request: web.Request) -> web.Response:
    body = await json_body(request)
    columns = field(body, "columns", list)
    info = request.app[SERVICE].set_clustering(request.match_info["name"], columns)
    return _json({**_table_json(info)})


@routes.post(_TABLE_PATH + "/compact")
async def compact(request: web.Request) -> web.Response:
    """Start a background compaction now (202); its run appears in the migration history."""
    info, started = request.app[SERVICE].compact_now(request.match_info["name"])
    return _json({"table": info.full_name, "started": started}, 202)


@routes.post("/v1/channels/open")
async def open_channel(request: web.Request) -> web.Response:
    body = await json_body(request)
    lag = body.get("max_client_lag")
    zone = body.get("default_timezone")
    zone = "America/Los_Angeles" if zone is None else timezone(zone)
    try:
        max_client_lag = parse_max_client_lag(lag) if lag is not None else None
    except IngestError as exc:
        raise InvalidRequestError(str(exc)) from exc
    table, name = _channel_names(request, body)
    channel = await request.app[SERVICE].open_channel(
        table,
        name,
        max_client_lag=max_client_lag,
        on_error=on_error(body.get("on_error", "ABORT")),
        default_timezone=zone,
    )
    return _json({**_channel_json(channel), "columns": channel.table.info.schema.declarations(),
                  "max_request_bytes": request.app[SERVICE].request_bytes_hint})  # fmt: skip


@routes.post("/v1/channels/rows")
async def insert_rows(request: web.Request) -> web.Response:
    """Arrow IPC (the SDK) or JSON rows (any HTTP client) for one channel batch."""
    service = request.app[SERVICE]
    query = request.rel_url.query
    table_name = query.get("table") or ""
    channel_name = query.get("channel") or ""
    generation = coordinate(request, "generation", HEADER_GENERATION)
    batch_seq = coordinate(request, "batch_seq", HEADER_BATCH_SEQ)
    channel = service.channel_state(table_name, channel_name, generation)
    if batch_seq <= channel.last_seq:  # a retry: answer before reading or checking the body
        outcome = service.insert(table_name, channel_name, generation, batch_seq, None, None)
        return _insert_answer(0, outcome.duplicate)
    # Room in the buffer first, the body's length standing in for its rows: a body that
    # would be refused is never read, decoded or checked.
    held = service.admit(channel, request.content_length or 0)
    try:
        data, token, response = await _checked_batch(request, channel)
        if data is _SKIPPED:
            service.budget.release(held)
            return _insert_answer(0, False, response)
        outcome = service.insert(
            table_name, channel_name, generation, batch_seq, data, token, held=held
        )
    except BaseException:
        service.budget.release(held)
        raise
    return _insert_answer(outcome.accepted_rows, outcome.duplicate, response)


def _insert_answer(
    accepted: int, duplicate: bool, response: InsertValidationResponse | None = None
) -> web.Response:
    errors = response.insert_errors if response is not None else []
    return _json({"accepted_rows": accepted, "duplicate": duplicate,
                  "insert_errors": [_insert_error(e) for e in errors]})  # fmt: skip


def _channel_names(request: web.Request, body: dict[str, Any]) -> tuple[str, str]:
    """The table and channel a body names, remembered for the failure log line first."""
    table, channel = body.get("table"), body.get("channel")
    request[_TABLE] = table if isinstance(table, str) else ""
    request[_CHANNEL] = channel if isinstance(channel, str) else ""
    return field(body, "table", str), field(body, "channel", str)


def _handle(request: web.Request, body: dict[str, Any]) -> tuple[str, str, int]:
    """The (table, channel, generation) of a channel handle in a body."""
    table, channel = _channel_names(request, body)
    return table, channel, bounded_int(field(body, "generation", int), "generation")


#: Stands for "ON_ERROR=SKIP_BATCH met a bad row: nothing to buffer" in :func:`_checked_batch`.
_SKIPPED: Any = object()


async def _checked_batch(
    request: web.Request, channel: ChannelState
) -> tuple[pa.Table | None, str | None, InsertValidationResponse]:
    """The rows of an insert request, checked against the table, and its end offset token."""
    schema = channel.table.info.schema
    options = ConversionOptions(default_timezone=channel.default_timezone)
    if request.content_type == ARROW_CONTENT_TYPE:
        token = check_token(request.headers.get(HEADER_END_OFFSET_TOKEN), HEADER_END_OFFSET_TOKEN)
        try:
            received = decode_arrow(await read_body(request))
        except (pa.ArrowException, OSError) as exc:  # e.g. a 128-bit integer: not implemented
            raise InvalidRequestError(f"the body is not a valid Arrow IPC stream: {exc}") from exc
        arrow_names(received.schema)
        try:
            # The IPC reader checks only the layout: offsets that run backwards or past the
            # data, dictionary indices out of range and strings that are not UTF-8 pass it,
            # and compute kernels then read outside the buffers (the whole server crashes).
            received.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise InvalidRequestError(
                f"the Arrow IPC stream holds invalid arrays ({exc}); send arrays that pass "
                "a full validation (pyarrow: validate(full=True))"
            ) from exc
        data = check_arrow_batch(schema, received, options) if received.num_rows else None
        return data, token, InsertValidationResponse()
    body = await json_body(request, loads_exact)  # numbers of row values keep every digit
    rows = field(body, "rows", list)
    token = check_token(body.get("end_offset_token"), "end_offset_token")
    mode = on_error(body["on_error"]) if "on_error" in body else channel.on_error
    if len(rows) >= THREAD_CONVERSION_ROWS:
        batch, response = await asyncio.to_thread(convert_rows, schema, rows, mode, options)
    else:
        batch, response = convert_rows(schema, rows, mode, options)
    if mode is OnErrorOption.SKIP_BATCH and response.has_errors():
        return _SKIPPED, token, response
    return (pa.Table.from_batches([batch]) if batch is not None else None), token, response


@routes.post("/v1/channels/wait")
async def wait_for_commit(request: web.Request) -> web.Response:
    body = await json_body(request)
    target = bounded_int(field(body, "batch_seq", int), "batch_seq")
    channel = await request.app[SERVICE].wait_for_commit(
        *_handle(request, body), target, timeout(body, 30.0)
    )
    return _json({**_channel_json(channel), "committed": channel.committed_seq >= target})


@routes.post("/v1/channels/close")
async def close_channel(request: web.Request) -> web.Response:
    body = await json_body(request)
    channel = await request.app[SERVICE].close_channel(
        *_handle(request, body), timeout(body, 60.0)
    )
    return _json(
        {
            **_channel_json(channel),
            "closed": not channel.valid and channel.committed_seq >= channel.last_seq,
        }
    )


@routes.post("/v1/channels/status")
async def channel_status(request: web.Request) -> web.Response:
    body = await json_body(request)
    wanted = field(body, "channels", list)
    service = request.app[SERVICE]
    answers = []
    for item in wanted:
        if not isinstance(item, dict):
            raise InvalidRequestError('each entry of "channels" must be an object {table, channel}')
        generation = field(item, "generation", int, required=False)
        status = service.channel_status(
            field(item, "table", str), field(item, "channel", str),
            None if generation is None else bounded_int(generation, "generation"),
        )  # fmt: skip
        answers.append(asdict(status))
    return _json({"channels": answers})


@routes.post("/v1/channels/drop")
async def drop_channel(request: web.Request) -> web.Response:
    body = await json_body(request)
    table, name = _channel_names(request, body)
    await request.app[SERVICE].drop_channel(table, name)
    return _json({"dropped": True})


@routes.get("/v1/channels")
async def show_channels(request: web.Request) -> web.Response:
    table = request.rel_url.query.get("table")
    return _json({"channels": request.app[SERVICE].list_channels(table)})
