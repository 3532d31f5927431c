"""A channel handle: convert on the client, buffer, and send in the background.

``insert_rows`` converts and validates rows in the caller (no network round
trip) and appends the Arrow batch to the handle's send buffer; it waits only
when that buffer is full (backpressure). A background sender drains the buffer:
everything queued at that moment goes in one request with the next
``batch_seq`` and the offset token of its last batch, and the request is retried
as it is until the server acknowledges it. If the sender fails for good
(invalidation, server unreachable past the retry deadline) the handle becomes
invalid and every later call raises that cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.errors import (
    ChannelClosedError,
    ChannelInvalidatedError,
    CommitTimeoutError,
    IngestError,
)
from ingest_sdk.rows import ConversionOptions, convert_rows
from ingest_sdk.schema import TableSchema
from ingest_sdk.validation import InsertValidationResponse, OnErrorOption, check_offset_token
from ingest_sdk.wire import (
    ARROW_CONTENT_TYPE,
    HEADER_BATCH_SEQ,
    HEADER_END_OFFSET_TOKEN,
    HEADER_GENERATION,
    encode_arrow,
)

if TYPE_CHECKING:
    from ingest_sdk.client import AsyncStreamingIngestClient

__all__ = ["AsyncChannel"]

#: Longest single server-side wait; wait_for_commit repeats it up to its own timeout.
_WAIT_SLICE = 30.0


@dataclass(slots=True)
class _Queued:
    batch: pa.RecordBatch | None
    offset_token: str | None
    nbytes: int


class AsyncChannel:
    """An open channel generation. Create it with ``client.open_channel``."""

    def __init__(
        self,
        client: AsyncStreamingIngestClient,
        table: str,
        name: str,
        generation: int,
        schema: TableSchema,
        offset_token: str | None,
        on_error: OnErrorOption,
        options: ConversionOptions,
        max_request_bytes: int | None = None,
        server: str | None = None,
    ) -> None:
        self._client = client
        #: The server holding this channel (its open answered it), which its calls go to;
        #: None: the client's URL.
        self.server = server
        #: Requests are built up to this size: the client's limit, or the server's hint if
        #: smaller (a request larger than an eighth of its buffer waits for others' turns).
        self.max_request_bytes = min(
            client.limits.max_request_bytes, max_request_bytes or client.limits.max_request_bytes
        )
        self.table = table
        self.name = name
        self.generation = generation
        self.schema = schema
        self.on_error = on_error
        self.options = options
        self._opened_token = offset_token
        self._arrow_schema = schema.to_arrow()
        self._queue: deque[_Queued] = deque()
        self._queued_bytes = 0
        self._enqueued = 0  # items ever queued
        self._sent = 0  # items ever acknowledged by the server
        self._next_seq = 1
        self._acked_seq = 0
        #: The newest batch_seq the server said is committed, and the token it named then:
        #: a wait for anything up to it needs no round trip.
        self._committed_seq = 0
        self._committed_token = offset_token
        self._token_seq: dict[str, int] = {}
        self._changed = asyncio.Condition()
        # Held for a whole enqueue (including a wait for room): asyncio locks are FIFO, so
        # batches enter the queue in the order their enqueue calls were scheduled.
        self._enqueue_order = asyncio.Lock()
        self._sender: asyncio.Task[None] | None = None
        self._error: IngestError | None = None
        self._closed = False

    # -- state ------------------------------------------------------------------------------

    def buffer_full(self) -> bool:
        """Whether the send buffer is at its limit (read from any thread; a hint only)."""
        return self._queued_bytes >= self._client.limits.max_buffer_bytes

    def is_valid(self) -> bool:
        return self._error is None and not self._closed

    def is_closed(self) -> bool:
        return self._closed

    def get_table_schema(self) -> TableSchema:
        return self.schema

    def _check_usable(self) -> None:
        if self._closed:
            raise ChannelClosedError(f"channel {self.name} is closed; open it again to insert")
        if self._error is not None:
            raise self._error

    # -- inserting --------------------------------------------------------------------------

    def prepare_rows(
        self, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[pa.RecordBatch | None, InsertValidationResponse, bool]:
        """Convert rows (pure CPU, safe from any thread). Returns the batch, the report and
        whether the call should be queued (SKIP_BATCH with errors queues nothing)."""
        self._check_usable()
        batch, response = convert_rows(self.schema, rows, self.on_error, self.options)
        skip = self.on_error is OnErrorOption.SKIP_BATCH and response.has_errors()
        return batch, response, not skip

    def prepare_batch(self, data: Any) -> pa.Table:
        """Check a RecordBatch, Table or pandas DataFrame against the schema (all or nothing)."""
        self._check_usable()
        if not isinstance(data, (pa.RecordBatch, pa.Table)):
            data = pa.Table.from_pandas(data, preserve_index=False)
        return check_arrow_batch(self.schema, data, self.options)

    async def enqueue(
        self, batch: pa.RecordBatch | pa.Table | None, end_offset_token: str | None
    ) -> None:
        """Queue converted rows (or a token alone) for sending; waits while the buffer is full."""
        self._check_usable()
        token = check_offset_token(end_offset_token, "end_offset_token")
        if isinstance(batch, pa.Table):
            batches = batch.combine_chunks().to_batches() or [None]
        else:
            batches = [batch]
        limit = self._client.limits.max_buffer_bytes
        async with self._enqueue_order, self._changed:
            for index, item in enumerate(batches):
                size = item.nbytes if item is not None else 0

                def has_room(size: int = size) -> bool:
                    # An empty buffer takes any batch, so one larger than the limit still goes.
                    return (
                        self._queued_bytes + size <= limit
                        or not self._queued_bytes
                        or self._error is not None
                    )

                await self._changed.wait_for(has_room)
                self._check_usable()
                last = index == len(batches) - 1
                self._queue.append(_Queued(item, token if last else None, size))
                self._queued_bytes += size
                self._enqueued += 1
            self._changed.notify_all()
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_loop(), name=f"send {self.name}")

    async def insert_rows(
        self,
        rows: Sequence[Mapping[str, Any]],
        start_offset_token: str | None = None,
        end_offset_token: str | None = None,
    ) -> InsertValidationResponse:
        """Insert rows; ``end_offset_token`` becomes the channel's token once they commit.

        ``insert_rows([], end_offset_token=t)`` commits ``t`` with no rows (progress for
        records the producer filtered out). ``start_offset_token`` is accepted for API
        compatibility; only the end token is kept.

        Raises:
            InsertValidationError: ON_ERROR=ABORT and a row is bad; nothing is queued.
            ChannelInvalidatedError, ChannelClosedError: the handle can no longer insert.
        """
        check_offset_token(start_offset_token, "start_offset_token")
        batch, response, queue = self.prepare_rows(rows)
        if queue:
            await self.enqueue(batch, end_offset_token)
        return response

    async def insert_row(
        self, row: Mapping[str, Any], offset_token: str | None = None
    ) -> InsertValidationResponse:
        return await self.insert_rows([row], end_offset_token=offset_token)

    async def insert_batch(self, data: Any, end_offset_token: str | None = None) -> None:
        """Insert a pyarrow RecordBatch/Table or pandas DataFrame, checked as a whole.

        Raises:
            InvalidTypeError, InvalidValueError: naming the first bad row, column and value;
                nothing is queued.
        """
        await self.enqueue(self.prepare_batch(data), end_offset_token)

    # -- sending ----------------------------------------------------------------------------

    async def _send_loop(self) -> None:
        limit = self.max_request_bytes
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: bool(self._queue))
                items: list[_Queued] = []
                size = 0
                while self._queue and (not items or size + self._queue[0].nbytes <= limit):
                    item = self._queue.popleft()
                    items.append(item)
                    size += item.nbytes
            seq = self._next_seq
            self._next_seq += 1
            token = next(
                (i.offset_token for i in reversed(items) if i.offset_token is not None), None
            )
            headers = {
                "Content-Type": ARROW_CONTENT_TYPE,
                HEADER_GENERATION: str(self.generation),
                HEADER_BATCH_SEQ: str(seq),
            }
            if token is not None:
                headers[HEADER_END_OFFSET_TOKEN] = token
            body = encode_arrow([i.batch for i in items if i.batch is not None], self._arrow_schema)
            try:
                await self._client.transport.request(
                    "POST",
                    "/v1/channels/rows",
                    data=body,
                    headers=headers,
                    params={"table": self.table, "channel": self.name},
                    server=self.server,
                )
            except IngestError as exc:
                await self._fail(exc)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug must not leave producers waiting forever
                await self._fail(IngestError(f"the sender of channel {self.name} failed: {exc!r}"))
                raise
            async with self._changed:
                self._acked_seq = seq
                self._sent += len(items)
                self._queued_bytes -= size
                for item in items:  # every token in this request commits with it
                    if item.offset_token is not None:
                        self._token_seq[item.offset_token] = seq
                self._changed.notify_all()

    async def _fail(self, error: IngestError) -> None:
        async with self._changed:
            self._error = error
            self._queue.clear()
            self._queued_bytes = 0
            self._changed.notify_all()

    async def _sent_target(self, offset_token: str | None, deadline: float) -> int:
        """The batch_seq whose commit answers the wait (sending what is queued first)."""
        async with self._changed:
            if offset_token is None:
                wanted = self._enqueued
                ok = await self._wait_for(
                    lambda: self._sent >= wanted or self._error is not None, deadline
                )
                if self._error is not None:
                    raise self._error
                if not ok:
                    raise CommitTimeoutError(f"rows of channel {self.name} were not sent in time")
                return self._acked_seq
            ok = await self._wait_for(
                lambda: (
                    offset_token in self._token_seq
                    or self._sent >= self._enqueued
                    or self._error is not None
                ),
                deadline,
            )
            if offset_token in self._token_seq:
                return self._token_seq[offset_token]
            if self._error is not None:
                raise self._error
            if not ok:
                raise CommitTimeoutError(f"offset token {offset_token!r} was not sent in time")
            raise ValueError(
                f"offset token {offset_token!r} was never inserted through this handle"
            )

    async def _wait_for(self, predicate: Any, deadline: float) -> bool:
        try:
            await asyncio.wait_for(
                self._changed.wait_for(predicate), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            return False
        return True

    async def wait_until_sent(self, timeout: float | None = None) -> None:
        """Return once every row inserted so far was received by the server, which has it
        in memory (not yet committed: :meth:`wait_for_commit` says when it is).

        Raises:
            CommitTimeoutError: not all sent within ``timeout`` seconds (300 by default).
            ChannelInvalidatedError: the handle was replaced; its unsent rows are gone.
        """
        await self._sent_target(None, time.monotonic() + (timeout if timeout is not None
                                                           else 300.0))  # fmt: skip

    async def wait_for_commit(
        self, offset_token: str | None = None, timeout: float | None = None
    ) -> str | None:
        """Return once ``offset_token`` (default: everything inserted so far) is committed.

        A position at or before one an earlier answer reported committed is answered at
        once, without asking the server again (a producer waiting for each of its batches
        in turn makes one round trip per commit, not one per batch).

        Returns:
            A committed offset token of the channel at or after the one waited for: the
            newest an answer of the server to this handle named (a wait an earlier answer
            covered is answered from it, so a later commit may not be in it yet).

        Raises:
            CommitTimeoutError: not committed within ``timeout`` seconds (it may still be later).
            ChannelInvalidatedError: the handle was replaced; its uncommitted rows are gone.
        """
        deadline = time.monotonic() + (timeout if timeout is not None else 300.0)
        seq = await self._sent_target(offset_token, deadline)
        if seq == 0:
            return self._opened_token  # nothing was ever sent through this handle
        if seq <= self._committed_seq and self._error is None:
            return self._committed_token  # an answer already said so: no round trip
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommitTimeoutError(
                    f"batch {seq} of channel {self.name} was not committed within {timeout} s"
                )
            answer = await self._client.transport.request(
                "POST",
                "/v1/channels/wait",
                json={"table": self.table, "channel": self.name, "generation": self.generation,
                      "batch_seq": seq, "timeout": min(remaining, _WAIT_SLICE)},
                extra_timeout=min(remaining, _WAIT_SLICE), server=self.server,
            )  # fmt: skip
            if answer["committed"]:
                self._note_committed(answer.get("committed_batch_seq", seq), answer["offset_token"])
                return answer["offset_token"]

    def _note_committed(self, seq: int, token: str | None) -> None:
        """Remember the newest committed position an answer named (each batch of a handle
        commits in order, so every batch_seq up to it is committed too)."""
        if seq > self._committed_seq:
            self._committed_seq, self._committed_token = seq, token

    async def get_latest_committed_offset_token(self) -> str | None:
        """The newest committed offset token of this channel (``None`` before any commit)."""
        (status,) = await self._client.get_latest_committed_offset_tokens([self])
        if status.status in ("TABLE_NOT_FOUND", "CHANNEL_NOT_FOUND"):
            raise ChannelInvalidatedError(status.message or status.status)
        return status.offset_token

    async def close(self, timeout: float | None = None) -> None:
        """Send what is queued, wait until it is committed, then close the handle."""
        if self._closed:
            return
        try:
            if self._error is None:
                await self._close_on_server(timeout)
        finally:  # whatever happened, this handle is done and its sender stops
            self._closed = True
            await self._stop_sender()
            self._client._forget(self)
        if self._error is not None and not isinstance(self._error, ChannelInvalidatedError):
            raise self._error

    async def _close_on_server(self, timeout: float | None) -> None:
        wait = timeout if timeout is not None else 300.0
        deadline = time.monotonic() + wait
        await self._sent_target(None, deadline)  # everything queued reaches the server
        answer = await self._client.transport.request(
            "POST",
            "/v1/channels/close",  # the server flushes now and answers once committed
            json={"table": self.table, "channel": self.name, "generation": self.generation,
                  "timeout": max(0.0, deadline - time.monotonic())},
            extra_timeout=wait, server=self.server,
        )  # fmt: skip
        if not answer["closed"]:
            raise CommitTimeoutError(
                f"channel {self.name}: rows were not committed within {wait} s"
            )

    async def _stop_sender(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None
