"""The synchronous face of the client, usable from plain threads.

It drives :class:`AsyncStreamingIngestClient` on a private event-loop thread;
there is no second implementation. Row conversion runs in the calling thread
(so many producer threads convert in parallel where Arrow releases the GIL),
and only the hand-off to the send buffer crosses to the loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections import deque
from collections.abc import AsyncGenerator, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from ingest_sdk.channel import AsyncChannel
from ingest_sdk.client import (
    DEFAULT_LIMITS,
    AsyncStreamingIngestClient,
    ClientLimits,
    OpenChannelRequest,
)
from ingest_sdk.schema import TableSchema
from ingest_sdk.transport import DEFAULT_RETRY, DEFAULT_TIMEOUTS, RetryPolicy, Timeouts
from ingest_sdk.validation import ChannelStatus, InsertValidationResponse, check_offset_token

__all__ = ["Channel", "StreamingIngestClient"]

T = TypeVar("T")


class _LoopThread:
    """An event loop running in a daemon thread, for one sync client."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync client cannot be used from its own loop thread")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def iterate(self, items: AsyncGenerator[T, None]) -> Iterator[T]:
        """An async generator as a plain iterator: each item is awaited on the loop thread.
        Closing the iterator (or dropping it) closes the async generator too."""
        end = object()

        async def step() -> Any:
            try:
                return await anext(items)
            except StopAsyncIteration:
                return end

        try:
            while (item := self.run(step())) is not end:
                yield item
        finally:
            if self.loop.is_running():
                closing = asyncio.run_coroutine_threadsafe(items.aclose(), self.loop)
                if threading.current_thread() is not self._thread:  # else it runs soon
                    with contextlib.suppress(Exception):
                        closing.result(timeout=30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


#: Hand-offs to the loop thread a producer may have outstanding before it waits for one.
MAX_PENDING_HANDOFFS = 64


class Channel:
    """Sync handle of an open channel; see :class:`ingest_sdk.channel.AsyncChannel`.

    ``insert_rows`` converts in the calling thread and hands the batch to the loop
    thread without waiting for it (the order is kept by the channel's FIFO enqueue);
    it waits only when the send buffer is full or many hand-offs are outstanding.
    A failure of a hand-off is raised by the next call.
    """

    def __init__(self, loop: _LoopThread, channel: AsyncChannel) -> None:
        self._loop = loop
        self._channel = channel
        self._handoffs: deque[concurrent.futures.Future[None]] = deque()
        self._lock = threading.Lock()  # one producer thread per handle at a time

    def _submit(self, batch: Any, end_offset_token: str | None) -> None:
        # Checked here too, so a bad token raises in the caller's call, not in a later one.
        check_offset_token(end_offset_token, "end_offset_token")
        with self._lock:
            while self._handoffs and self._handoffs[0].done():
                self._handoffs.popleft().result()  # raises a failed hand-off
            future = asyncio.run_coroutine_threadsafe(
                self._channel.enqueue(batch, end_offset_token), self._loop.loop
            )
            self._handoffs.append(future)
            while self._handoffs and (
                len(self._handoffs) > MAX_PENDING_HANDOFFS or self._channel.buffer_full()
            ):
                self._handoffs.popleft().result()  # backpressure: wait for the oldest

    def _drain(self) -> None:
        with self._lock:
            while self._handoffs:
                self._handoffs.popleft().result()

    @property
    def name(self) -> str:
        return self._channel.name

    @property
    def table(self) -> str:
        return self._channel.table

    @property
    def generation(self) -> int:
        return self._channel.generation

    @property
    def server(self) -> str | None:
        """The server holding the channel, which its calls go to (None: the client's)."""
        return self._channel.server

    def insert_rows(
        self,
        rows: Sequence[Mapping[str, Any]],
        start_offset_token: str | None = None,
        end_offset_token: str | None = None,
    ) -> InsertValidationResponse:
        check_offset_token(start_offset_token, "start_offset_token")
        batch, response, queue = self._channel.prepare_rows(rows)
        if queue:
            self._submit(batch, end_offset_token)
        return response

    def insert_row(
        self, row: Mapping[str, Any], offset_token: str | None = None
    ) -> InsertValidationResponse:
        return self.insert_rows([row], end_offset_token=offset_token)

    def insert_batch(self, data: Any, end_offset_token: str | None = None) -> None:
        self._submit(self._channel.prepare_batch(data), end_offset_token)

    def wait_until_sent(self, timeout: float | None = None) -> None:
        self._drain()
        self._loop.run(self._channel.wait_until_sent(timeout))

    def wait_for_commit(
        self, offset_token: str | None = None, timeout: float | None = None
    ) -> str | None:
        self._drain()
        return self._loop.run(self._channel.wait_for_commit(offset_token, timeout))

    def get_latest_committed_offset_token(self) -> str | None:
        return self._loop.run(self._channel.get_latest_committed_offset_token())

    def close(self, timeout: float | None = None) -> None:
        try:
            self._drain()
        finally:
            self._loop.run(self._channel.close(timeout))

    def is_valid(self) -> bool:
        return self._channel.is_valid()

    def is_closed(self) -> bool:
        return self._channel.is_closed()

    def get_table_schema(self) -> TableSchema:
        return self._channel.get_table_schema()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class StreamingIngestClient:
    """Streaming ingest client for threaded code; arguments as in the async client."""

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
        self._loop = _LoopThread(f"ingest-client-{name}")

        async def build() -> AsyncStreamingIngestClient:
            return AsyncStreamingIngestClient(
                name, url, token, max_client_lag, limits=limits, timeouts=timeouts, retry=retry
            )

        try:
            self._client = self._loop.run(build())
        except BaseException:
            self._loop.stop()
            raise
        self._closed = False

    def create_table(
        self, name: str, columns: Mapping[str, str], if_not_exists: bool = False
    ) -> dict[str, Any]:
        return self._loop.run(self._client.create_table(name, columns, if_not_exists))

    def describe_table(self, name: str) -> dict[str, Any]:
        return self._loop.run(self._client.describe_table(name))

    def list_tables(self) -> list[dict[str, Any]]:
        return self._loop.run(self._client.list_tables())

    def list_change_streams(self) -> list[dict[str, Any]]:
        return self._loop.run(self._client.list_change_streams())

    def describe_change_stream(self, name: str) -> dict[str, Any]:
        return self._loop.run(self._client.describe_change_stream(name))

    def drop_table(self, name: str) -> None:
        self._loop.run(self._client.drop_table(name))

    def set_clustering(self, name: str, columns: Sequence[str]) -> dict[str, Any]:
        return self._loop.run(self._client.set_clustering(name, columns))

    def compact(self, name: str) -> bool:
        return self._loop.run(self._client.compact(name))

    def sql(
        self,
        statement: str,
        session: str | None = None,
        max_rows: int | None = None,
        timeout: float | None = None,
    ) -> list[dict[str, Any]]:
        """Run one SQL statement in the service; its rows as dicts (see the async client)."""
        return self._loop.run(self._client.sql(statement, session, max_rows, timeout))

    def close_sql_session(self, session: str) -> bool:
        """End a SQL session now, its open transaction rolled back (see the async client)."""
        return self._loop.run(self._client.close_sql_session(session))

    def get_migration_history(self, name: str) -> list[dict[str, Any]]:
        return self._loop.run(self._client.get_migration_history(name))

    def read_change_stream(
        self,
        name: str,
        start_timestamp: datetime | str | float,
        *,
        end_timestamp: datetime | str | float | None = None,
        partition_token: str | None = None,
        heartbeat_milliseconds: int = 10_000,
    ) -> Iterator[dict[str, Any]]:
        """One query of change stream ``name``, its records as they come, as a plain
        iterator that blocks for the next one; arguments, records and errors as in
        :meth:`AsyncStreamingIngestClient.read_change_stream`. Close the iterator (or
        ``break`` out of the loop over it) to end the read early."""
        records = self._client.read_change_stream(
            name, start_timestamp, end_timestamp=end_timestamp,
            partition_token=partition_token, heartbeat_milliseconds=heartbeat_milliseconds,
        )  # fmt: skip
        return self._loop.iterate(records)

    def open_channel(self, request: OpenChannelRequest) -> Channel:
        return Channel(self._loop, self._loop.run(self._client.open_channel(request)))

    def get_latest_committed_offset_tokens(
        self, channels: Iterable[Channel | tuple[str, str]]
    ) -> list[ChannelStatus]:
        handles = [c._channel if isinstance(c, Channel) else c for c in channels]
        return self._loop.run(self._client.get_latest_committed_offset_tokens(handles))

    def drop_channel(self, request: OpenChannelRequest | tuple[str, str]) -> None:
        self._loop.run(self._client.drop_channel(request))

    def show_channels(self, table: str | None = None) -> list[dict[str, Any]]:
        return self._loop.run(self._client.show_channels(table))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run(self._client.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> StreamingIngestClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
