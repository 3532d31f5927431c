"""The asyncio client: tables, channels and committed-token lookups.

:class:`StreamingIngestClient` (``ingest_sdk.sync_client``) is the same client
driven from plain threads; there is one implementation, this one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from ingest_sdk.change_stream_positions import rfc3339, to_micros
from ingest_sdk.channel import AsyncChannel
from ingest_sdk.durations import parse_max_client_lag
from ingest_sdk.errors import ConfigurationError, TransportError
from ingest_sdk.rows import DEFAULT_TIMEZONE, ConversionOptions
from ingest_sdk.schema import TableSchema
from ingest_sdk.transport import (
    DEFAULT_RETRY,
    DEFAULT_TIMEOUTS,
    RetryPolicy,
    Timeouts,
    Transport,
    error_from_answer,
)
from ingest_sdk.validation import ChannelStatus, OnErrorOption
from ingest_sdk.wire import loads

__all__ = [
    "AsyncStreamingIngestClient", "ClientLimits", "OpenChannelRequest", "change_stream_params",
]  # fmt: skip

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """Client-side bounds."""

    #: Converted rows a channel may hold before ``insert_rows`` waits for the sender.
    max_buffer_bytes: int = 64 * MiB
    #: Largest request the sender builds from queued batches.
    max_request_bytes: int = 16 * MiB


@dataclass(frozen=True, slots=True)
class OpenChannelRequest:
    """What to open: ``database.schema.table`` and the channel name, plus channel options."""

    name: str
    database: str
    schema: str
    table: str
    on_error: OnErrorOption | str = OnErrorOption.ABORT
    default_timezone: str = DEFAULT_TIMEZONE

    @property
    def table_name(self) -> str:
        return f"{self.database}.{self.schema}.{self.table}"


DEFAULT_LIMITS = ClientLimits()


def _timestamp(name: str, value: datetime | str | float | None) -> str | None:
    """A timestamp parameter: RFC 3339 text as given (the service checks it), a datetime
    (naive: UTC) or a number of seconds since the epoch, as RFC 3339 text."""
    if value is None or isinstance(value, str):
        return value
    return rfc3339(to_micros(value, name))


def change_stream_params(
    start_timestamp: datetime | str | float,
    end_timestamp: datetime | str | float | None = None,
    partition_token: str | None = None,
    heartbeat_milliseconds: int = 10_000,
) -> dict[str, str]:
    """The query parameters of ``GET /v1/change-streams/{name}/read``. Only the types are
    checked here; the server checks the values (and says what to pass instead).

    Raises:
        ConfigurationError: a value of the wrong type.
    """
    start = _timestamp("start_timestamp", start_timestamp)
    if start is None:
        raise ConfigurationError("start_timestamp is required")
    if isinstance(heartbeat_milliseconds, bool) or not isinstance(heartbeat_milliseconds, int):
        raise ConfigurationError(
            f"heartbeat_milliseconds must be an int (1,000 to 300,000), got "
            f"{heartbeat_milliseconds!r}"
        )
    if partition_token is not None and not isinstance(partition_token, str):
        raise ConfigurationError(
            "partition_token must be text, a token of a child partitions record"
        )
    params = {"start_timestamp": start, "heartbeat_milliseconds": str(heartbeat_milliseconds)}
    end = _timestamp("end_timestamp", end_timestamp)
    if end is not None:
        params["end_timestamp"] = end
    if partition_token is not None:
        params["partition_token"] = partition_token
    return params


def _status(item: Mapping[str, Any]) -> ChannelStatus:
    return ChannelStatus(**{key: item.get(key) for key in ChannelStatus.__slots__})  # type: ignore[arg-type]


class AsyncStreamingIngestClient:
    """Streaming ingest client for asyncio code.

    Args:
        name: the client's name (shown in server logs).
        url: the channel service, e.g. ``http://127.0.0.1:8080``.
        token: bearer token, if the service requires one.
        max_client_lag: how long the server may buffer this client's rows before
            committing: seconds (``1.0``) or text (``"1 second"``, ``"2 minutes"``);
            0.05 s to 10 minutes.
    """

    def __init__(
        self,
        name: str,
        url: str = "http://127.0.0.1:8080",
        token: str | None = None,
        max_client_lag: float | str = 1.0,
        *,
        limits: ClientLimits = DEFAULT_LIMITS,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.name = name
        self.max_client_lag = parse_max_client_lag(max_client_lag)
        self.limits = limits
        self.transport = Transport(url, token, timeouts, retry)
        self._channels: set[AsyncChannel] = set()

    async def __aenter__(self) -> AsyncStreamingIngestClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- tables -----------------------------------------------------------------------------

    async def create_table(
        self, name: str, columns: Mapping[str, str], if_not_exists: bool = False
    ) -> dict[str, Any]:
        """Create ``DB.SCHEMA.TABLE`` (and a missing database and schema)."""
        TableSchema.parse(columns)  # fail fast, with the same message the server would give
        return await self.transport.request(  # type: ignore[no-any-return]
            "POST",
            "/v1/tables",
            json={"name": name, "columns": dict(columns), "if_not_exists": if_not_exists},
        )

    async def describe_table(self, name: str) -> dict[str, Any]:
        return await self.transport.request("GET", f"/v1/tables/{quote(name, safe='')}")  # type: ignore[no-any-return]

    async def list_tables(self) -> list[dict[str, Any]]:
        return (await self.transport.request("GET", "/v1/tables"))["tables"]  # type: ignore[no-any-return]

    async def list_change_streams(self) -> list[dict[str, Any]]:
        """The change streams, as ``GET /v1/change-streams`` lists them."""
        return (await self.transport.request("GET", "/v1/change-streams"))["change_streams"]  # type: ignore[no-any-return]

    async def describe_change_stream(self, name: str) -> dict[str, Any]:
        """One change stream (``ChangeStreamNotFoundError`` if there is none)."""
        path = f"/v1/change-streams/{quote(name, safe='')}"
        return await self.transport.request("GET", path)  # type: ignore[no-any-return]

    async def drop_table(self, name: str) -> None:
        await self.transport.request("DELETE", f"/v1/tables/{quote(name, safe='')}")

    async def set_clustering(self, name: str, columns: Sequence[str]) -> dict[str, Any]:
        """Columns compaction sorts each file by (empty: ingestion order)."""
        return await self.transport.request(  # type: ignore[no-any-return]
            "PUT", f"/v1/tables/{quote(name, safe='')}/clustering", json={"columns": list(columns)}
        )

    async def compact(self, name: str) -> bool:
        """Queue a background compaction of the table now; False if one is queued or running."""
        answer = await self.transport.request("POST", f"/v1/tables/{quote(name, safe='')}/compact")
        return bool(answer["started"])

    async def get_migration_history(self, name: str) -> list[dict[str, Any]]:
        """Compaction runs of the table: times, files/bytes/rows in and out, version, status."""
        answer = await self.transport.request(
            "GET", f"/v1/tables/{quote(name, safe='')}/migrations"
        )
        return answer["migrations"]  # type: ignore[no-any-return]

    # -- SQL --------------------------------------------------------------------------------

    async def sql(
        self,
        statement: str,
        session: str | None = None,
        max_rows: int | None = None,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """Run one SQL statement in the service (``POST /v1/sql``); its rows as dicts.

        ``session`` names a server-side session (its ``USE`` defaults and open transaction
        last between calls; it belongs to this client's token); without one the statement
        runs alone in auto-commit. Never retried: a statement may change data. Decimals come
        back as strings (no digit lost).

        Raises:
            SqlStatementError: the statement failed (``sql_code`` says why); nothing changed.
        """
        body: dict[str, Any] = {"statement": statement}
        for key, value in (("session", session), ("max_rows", max_rows), ("timeout", timeout)):
            if value is not None:
                body[key] = value
        answer = await self.transport.request(
            "POST", "/v1/sql", json=body, retry=False, extra_timeout=float(timeout or 300)
        )
        names = [column["name"] for column in answer["columns"]]
        return [dict(zip(names, row, strict=True)) for row in answer["rows"]]

    async def close_sql_session(self, session: str) -> bool:
        """End a SQL session of this client's token now (its open transaction is rolled
        back); False if there was none. Sessions also end after an idle spell."""
        answer = await self.transport.request(
            "DELETE", f"/v1/sql/sessions/{quote(session, safe='')}", retry=False
        )
        return bool(answer["closed"])

    # -- change streams ---------------------------------------------------------------------

    def read_change_stream(
        self,
        name: str,
        start_timestamp: datetime | str | float,
        *,
        end_timestamp: datetime | str | float | None = None,
        partition_token: str | None = None,
        heartbeat_milliseconds: int = 10_000,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """One query of change stream ``name`` (``NAME``, ``SCHEMA.NAME`` or
        ``DB.SCHEMA.NAME``; missing parts are ``DB`` and ``PUBLIC``), its records as they
        come: ``async for record in client.read_change_stream(...)``.

        Each record is a dict holding one of ``data_change_record``, ``heartbeat_record``
        and ``child_partitions_record`` (``docs/change-streams.md``);
        :func:`~ingest_sdk.record_from_json` parses one into its class. Without
        ``partition_token`` this is the first query: it returns the partitions to read,
        as child partitions records, and ends. With one, the iterator ends when the
        partition ends (after its child partitions record) or ``end_timestamp`` is
        reached; until then it waits for records, a heartbeat arriving about every
        ``heartbeat_milliseconds`` when nothing changes.

        Timestamps are datetimes (naive ones are UTC), RFC 3339 text, or numbers of
        seconds since the epoch (1769860800 is 2026-01-31T12:00:00Z). Opening the read
        is retried as other calls are; once records came, nothing is retried. Close the
        iterator to end a read early (``contextlib.aclosing``, or ``break`` and let it
        go): that ends the read in the service too.

        Raises:
            ConfigurationError: an argument of the wrong type (at once).
            InvalidRequestError: the service refused the arguments (400; the message
                says what to pass), or the stream does not exist (404).
            BackpressureError: too many reads are open on the service, after retries.
            TransportError: the service could not be reached, or the connection broke
                or went silent for ``heartbeat_milliseconds`` plus the request timeout
                after records came: resume from the last record.
            ServiceError: the read failed after it began (the error's class and message
                come from the service: ``STREAM_STALE`` and others).
        """
        params = change_stream_params(
            start_timestamp, end_timestamp, partition_token, heartbeat_milliseconds
        )
        path = f"/v1/change-streams/{quote(name, safe='')}/read"
        idle = heartbeat_milliseconds / 1000 + self.transport.timeouts.request
        return self._records(path, params, idle)

    async def _records(
        self, path: str, params: dict[str, str], idle: float
    ) -> AsyncGenerator[dict[str, Any], None]:
        lines = self.transport.stream_lines(path, params=params, idle_timeout=idle)
        try:
            async for line in lines:
                try:
                    record = loads(line)
                except ValueError as exc:
                    raise TransportError(
                        f"GET {path}: the answer held a line that is not JSON ({exc}); "
                        "resume from the last record"
                    ) from exc
                if isinstance(record, dict) and "error" in record:
                    raise error_from_answer(400, line)
                yield record
        finally:
            await lines.aclose()

    # -- channels ---------------------------------------------------------------------------

    async def open_channel(self, request: OpenChannelRequest) -> AsyncChannel:
        """Open (or reopen) a channel. Any older handle of it is invalidated, and what it had
        buffered in the server is discarded; resume after ``get_latest_committed_offset_token``."""
        on_error = OnErrorOption.parse(request.on_error)
        options = ConversionOptions(default_timezone=request.default_timezone)
        answer = await self.transport.request(
            "POST",
            "/v1/channels/open",
            json={
                "table": request.table_name,
                "channel": request.name,
                "max_client_lag": self.max_client_lag,
                "on_error": on_error.value,
                "default_timezone": request.default_timezone,
            },
        )
        channel = AsyncChannel(
            self,
            table=answer["table"],
            name=answer["channel"],
            generation=answer["generation"],
            schema=TableSchema.parse(answer["columns"]),
            offset_token=answer["offset_token"],
            on_error=on_error,
            options=options,
            max_request_bytes=answer.get("max_request_bytes"),
            server=answer.get("server"),
        )
        self._channels.add(channel)
        return channel

    def _forget(self, channel: AsyncChannel) -> None:
        self._channels.discard(channel)

    async def get_latest_committed_offset_tokens(
        self, channels: Iterable[AsyncChannel | tuple[str, str]]
    ) -> list[ChannelStatus]:
        """Committed tokens of many channels in one call, each with an explicit status.

        Pass handles (their generation is checked: a replaced handle reports
        ``INVALIDATED``) or ``(table, channel)`` pairs (no generation check).
        """
        # One call per server: a handle is asked of the server holding it (only that one
        # knows its generation is open), a pair of the client's.
        by_server: dict[str | None, list[tuple[int, dict[str, Any]]]] = {}
        for index, item in enumerate(channels):
            if isinstance(item, AsyncChannel):
                ask = {"table": item.table, "channel": item.name, "generation": item.generation}
                by_server.setdefault(item.server, []).append((index, ask))
            else:
                table, name = item
                by_server.setdefault(None, []).append((index, {"table": table, "channel": name}))
        found: dict[int, ChannelStatus] = {}
        for server, asked in by_server.items():
            answer = await self.transport.request(
                "POST", "/v1/channels/status", json={"channels": [a for _, a in asked]},
                server=server,
            )  # fmt: skip
            for (index, _), item in zip(asked, answer["channels"], strict=True):
                found[index] = _status(item)
        return [found[index] for index in sorted(found)]

    async def drop_channel(self, request: OpenChannelRequest | tuple[str, str]) -> None:
        """Drop a channel and its committed token; open handles of it are invalidated."""
        if isinstance(request, OpenChannelRequest):
            table, name = request.table_name, request.name
        else:
            table, name = request
        await self.transport.request(
            "POST", "/v1/channels/drop", json={"table": table, "channel": name}
        )

    async def show_channels(self, table: str | None = None) -> list[dict[str, Any]]:
        """SHOW CHANNELS: name, table, generation, committed token, rows, activity, status."""
        params = {"table": table} if table else None
        return (await self.transport.request("GET", "/v1/channels", params=params))["channels"]  # type: ignore[no-any-return]

    async def close(self) -> None:
        """Close every open channel (each waits for its rows to commit), then the session."""
        try:
            channels: Sequence[AsyncChannel] = list(self._channels)
            results = await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, Exception):
                    raise result
        finally:
            await self.transport.close()
