"""``/v1/channels``: open, insert rows (Arrow IPC or JSON), wait for commits, close,
status, drop and list channels. Catalog reads run in worker threads, never on the event
loop; an insert into a channel open here reads nothing from the catalog."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

import pyarrow as pa
from aiohttp import web

from channel_server.http_common import (
    REQUEST_CHANNEL,
    REQUEST_TABLE,
    SERVICE,
    Routes,
    insert_error_json,
    json_answer,
)
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
from channel_server.state import ChannelState
from ingest_sdk import ConversionOptions, InsertValidationResponse, OnErrorOption, convert_rows
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.durations import parse_max_client_lag
from ingest_sdk.errors import IngestError, InvalidRequestError
from ingest_sdk.wire import (
    ARROW_CONTENT_TYPE,
    HEADER_BATCH_SEQ,
    HEADER_END_OFFSET_TOKEN,
    HEADER_GENERATION,
    decode_arrow,
    loads_exact,
)

__all__ = ["setup"]

routes = Routes()
#: JSON row batches this large are converted in a worker thread, off the event loop.
THREAD_CONVERSION_ROWS = 2_000


def setup(app: web.Application) -> None:
    app.add_routes(routes)


def _channel_json(channel: ChannelState) -> dict[str, Any]:
    return {
        "table": channel.table.info.full_name,
        "channel": channel.name,
        "generation": channel.generation,
        "offset_token": channel.committed_token,
        "committed_batch_seq": channel.committed_seq,
        "last_batch_seq": channel.last_seq,
    }


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
    channel = await request.app[SERVICE].channels.open(
        table,
        name,
        max_client_lag=max_client_lag,
        on_error=on_error(body.get("on_error", "ABORT")),
        default_timezone=zone,
    )
    service = request.app[SERVICE]
    columns = channel.table.info.schema.declarations()
    hint = service.channels.request_bytes_hint
    # Where the channel's calls go (None: the URL the client used).
    server = service.config.advertise_url
    return json_answer({**_channel_json(channel), "columns": columns, "max_request_bytes": hint,
                        "server": server})  # fmt: skip


@routes.post("/v1/channels/rows")
async def insert_rows(request: web.Request) -> web.Response:
    """Arrow IPC (the SDK) or JSON rows (any HTTP client) for one channel batch."""
    channels = request.app[SERVICE].channels
    query = request.rel_url.query
    table_name = query.get("table") or ""
    channel_name = query.get("channel") or ""
    generation = coordinate(request, "generation", HEADER_GENERATION)
    batch_seq = coordinate(request, "batch_seq", HEADER_BATCH_SEQ)
    channel = await channels.lookup(table_name, channel_name, generation)
    if batch_seq <= channel.last_seq:  # a retry: answer before reading or checking the body
        outcome = channels.insert(table_name, channel_name, generation, batch_seq, None, None)
        return _insert_answer(0, outcome.duplicate)
    # Room in the buffer first, the body's length standing in for its rows: a body that
    # would be refused is never read, decoded or checked.
    held = channels.admit(channel, request.content_length or 0)
    try:
        data, token, response = await _checked_batch(request, channel)
        if data is _SKIPPED:
            channels.budget.release(held)
            return _insert_answer(0, False, response)
        outcome = channels.insert(
            table_name, channel_name, generation, batch_seq, data, token, held=held
        )
    except BaseException:
        channels.budget.release(held)
        raise
    return _insert_answer(outcome.accepted_rows, outcome.duplicate, response)


def _insert_answer(
    accepted: int, duplicate: bool, response: InsertValidationResponse | None = None
) -> web.Response:
    errors = response.insert_errors if response is not None else []
    return json_answer({"accepted_rows": accepted, "duplicate": duplicate,
                  "insert_errors": [insert_error_json(e) for e in errors]})  # fmt: skip


def _channel_names(request: web.Request, body: dict[str, Any]) -> tuple[str, str]:
    """The table and channel a body names, remembered for the failure log line first."""
    table, channel = body.get("table"), body.get("channel")
    request[REQUEST_TABLE] = table if isinstance(table, str) else ""
    request[REQUEST_CHANNEL] = channel if isinstance(channel, str) else ""
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
    channel = await request.app[SERVICE].channels.wait_for_commit(
        *_handle(request, body), target, timeout(body, 30.0)
    )
    return json_answer({**_channel_json(channel), "committed": channel.committed_seq >= target})


@routes.post("/v1/channels/close")
async def close_channel(request: web.Request) -> web.Response:
    body = await json_body(request)
    channel = await request.app[SERVICE].channels.close(
        *_handle(request, body), timeout(body, 60.0)
    )
    return json_answer(
        {
            **_channel_json(channel),
            "closed": not channel.valid and channel.committed_seq >= channel.last_seq,
        }
    )


@routes.post("/v1/channels/status")
async def channel_status(request: web.Request) -> web.Response:
    body = await json_body(request)
    wanted = field(body, "channels", list)
    asked = []
    for item in wanted:
        if not isinstance(item, dict):
            raise InvalidRequestError('each entry of "channels" must be an object {table, channel}')
        generation = field(item, "generation", int, required=False)
        generation = None if generation is None else bounded_int(generation, "generation")
        asked.append((field(item, "table", str), field(item, "channel", str), generation))
    channels = request.app[SERVICE].channels
    answers = await asyncio.to_thread(lambda: [asdict(channels.status(*each)) for each in asked])
    return json_answer({"channels": answers})


@routes.post("/v1/channels/drop")
async def drop_channel(request: web.Request) -> web.Response:
    body = await json_body(request)
    table, name = _channel_names(request, body)
    await request.app[SERVICE].channels.drop(table, name)
    return json_answer({"dropped": True})


@routes.get("/v1/channels")
async def show_channels(request: web.Request) -> web.Response:
    table = request.rel_url.query.get("table")
    shown = await asyncio.to_thread(request.app[SERVICE].channels.show, table)
    return json_answer({"channels": shown})
