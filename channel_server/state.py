"""In-memory state of open channels and of each table's buffer.

Nothing here is durable: a restart forgets every open channel, so a handle from
before the restart gets *channel invalidated* and its producer resumes from the
committed token. That is what makes a restart safe: rows that were only in this
memory can never be followed by later rows of the same handle.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Hashable
from dataclasses import dataclass, field

import pyarrow as pa

from catalog import TableInfo
from ingest_sdk import OnErrorOption
from ingest_sdk.errors import BackpressureError

__all__ = ["BufferBudget", "ChannelState", "PendingBatch", "TableState"]


class BufferBudget:
    """Bounds the bytes of rows buffered in the server (backpressure, 429), fairly.

    When a producer is refused it takes a place in a queue; while anyone waits, room
    that frees up goes to the waiters in the order they were refused, and a newcomer
    gets room only if there is enough for everyone ahead of it too. So no producer
    starves while others keep getting in, however their retries line up. A waiter that
    stops asking (it gave up, or its process died) leaves the queue after ``patience``
    seconds, so it cannot hold the others back.
    """

    def __init__(self, limit: int, patience: float = 5.0) -> None:
        self.limit = limit
        self.patience = patience
        self.used = 0
        self.peak = 0
        #: who -> (bytes asked, monotonic time of the last refusal); dict order = queue order.
        self._waiting: dict[Hashable, tuple[int, float]] = {}

    @property
    def waiting(self) -> int:
        """How many producers wait for room."""
        return len(self._waiting)

    def reserve(self, size: int, retry_after: float, who: Hashable | None = None) -> None:
        """Take ``size`` bytes for ``who`` or raise :class:`BackpressureError` (nothing taken).

        A request larger than the whole limit still gets in when the buffer is empty and
        nobody waits ahead of it, so no single request is refused forever.
        """
        now = time.monotonic()
        for key, (_, seen) in list(self._waiting.items()):
            if now - seen > self.patience:
                del self._waiting[key]
        ahead = 0
        for key, (asked, _) in self._waiting.items():
            if key == who:
                break
            ahead += asked
        if self.used + ahead + size > self.limit and (self.used > 0 or ahead > 0):
            if who is not None:
                self._waiting[who] = (size, now)  # keeps its place if it already had one
            position = list(self._waiting).index(who) + 1 if who is not None else 0
            raise BackpressureError(
                f"the server buffer is full ({self.used} of {self.limit} bytes used, "
                f"{len(self._waiting)} producer(s) waiting, this one is number {position}); "
                f"retry after {retry_after:.2f} s",
                retry_after=retry_after,
            )
        self._waiting.pop(who, None)
        self.used += size
        self.peak = max(self.peak, self.used)

    def settle(self, reserved: int, actual: int) -> None:
        """Replace a reservation made from an estimate (the body's length) by the size of
        what was decoded; may pass the limit by that difference, once per request."""
        self.used += actual - reserved
        self.peak = max(self.peak, self.used)

    def release(self, size: int) -> None:
        self.used -= size


@dataclass(eq=False, slots=True)
class ChannelState:
    """One open channel generation."""

    table: TableState
    name: str
    generation: int
    committed_token: str | None
    rows_committed: int
    max_client_lag: float
    on_error: OnErrorOption
    default_timezone: str
    last_seq: int = 0  # newest batch accepted
    committed_seq: int = 0  # newest batch durable in Delta
    invalid_reason: str | None = None
    last_activity: float = field(default_factory=time.time)
    _committed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def valid(self) -> bool:
        return self.invalid_reason is None

    def invalidate(self, reason: str) -> None:
        self.invalid_reason = reason
        self._notify()

    def mark_committed(self, batch_seq: int, token: str | None, rows: int) -> None:
        self.committed_seq = max(self.committed_seq, batch_seq)
        self.committed_token = token
        self.rows_committed += rows
        self._notify()

    def _notify(self) -> None:
        self._committed.set()
        self._committed = asyncio.Event()

    async def wait_committed(self, batch_seq: int, timeout: float) -> bool:
        """Wait until ``batch_seq`` is durable; False on timeout or invalidation."""
        deadline = time.monotonic() + timeout
        while self.committed_seq < batch_seq and self.valid:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._committed.wait(), remaining)
            except TimeoutError:
                return False
        return self.committed_seq >= batch_seq


@dataclass(eq=False, slots=True)
class PendingBatch:
    """Rows (possibly none: a token-only batch) accepted from one channel request."""

    channel: ChannelState
    generation: int
    batch_seq: int
    data: pa.Table | None
    rows: int
    nbytes: int
    offset_token: str | None
    deadline: float  # monotonic time by which it must be committed
    arrived: float = field(default_factory=time.monotonic)


@dataclass(eq=False, slots=True)
class TableState:
    """A table's open channels and the batches waiting for its next flush."""

    info: TableInfo
    channels: dict[str, ChannelState] = field(default_factory=dict)
    pending: list[PendingBatch] = field(default_factory=list)
    pending_bytes: int = 0
    #: The earliest deadline among ``pending`` (inf when empty), kept as batches come and go.
    earliest_deadline: float = math.inf
    #: Held for a whole flush, and by open/drop, so a generation changes between flushes only.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    flush_now: bool = False
    flush_error: str | None = None
    dropped: bool = False
    #: Intermediate files (and bytes) since the last compaction; drive the trigger.
    ingest_files: int = 0
    ingest_bytes: int = 0

    def add(self, batch: PendingBatch, max_bytes: int) -> None:
        """Queue a batch; wake the flusher only if it must now flush sooner than it planned."""
        self.pending.append(batch)
        self.pending_bytes += batch.nbytes
        wake = batch.deadline < self.earliest_deadline
        self.earliest_deadline = min(self.earliest_deadline, batch.deadline)
        if self.pending_bytes >= max_bytes:
            self.flush_now = wake = True
        if wake:
            self.wakeup.set()

    def take_pending(self) -> list[PendingBatch]:
        batches, self.pending, self.pending_bytes = self.pending, [], 0
        self.earliest_deadline = math.inf
        return batches

    def put_back(self, batches: list[PendingBatch]) -> None:
        """Return batches of a failed flush to the front, in their original order."""
        self.pending[:0] = batches
        self.pending_bytes += sum(batch.nbytes for batch in batches)
        self.earliest_deadline = min(
            [self.earliest_deadline, *(batch.deadline for batch in batches)]
        )

    def discard_channel(self, channel: ChannelState) -> int:
        """Drop the uncommitted batches of one channel generation; returns bytes freed."""
        kept = [b for b in self.pending if b.channel is not channel]
        freed = self.pending_bytes - sum(b.nbytes for b in kept)
        self.pending, self.pending_bytes = kept, self.pending_bytes - freed
        self.earliest_deadline = min((b.deadline for b in kept), default=math.inf)
        return freed

    def request_flush(self) -> None:
        self.flush_now = True
        self.wakeup.set()
