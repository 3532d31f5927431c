"""The partition threads of :class:`~ingest_sdk.ChangeStreamReader`: one per open
partition, each running its partition's query and putting what it returns on the run's
queue, for the delivery loop.

A query that fails with a retriable error (the service restarted, the connection broke)
is repeated from the partition's watermark with jittered backoff; records at or before
the last one queued are skipped. Any other error is queued for the delivery loop, which
stops the reader with it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from ingest_sdk.change_records import (
    ChangeRecord,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
    record_kind,
)
from ingest_sdk.change_stream_positions import Partition, after, position, rfc3339, to_micros
from ingest_sdk.errors import IngestError
from ingest_sdk.transport import RetryPolicy

log = logging.getLogger("ingest_sdk.change_stream_reader")

#: ``query(partition_token, start_timestamp, end_timestamp, heartbeat_milliseconds)``:
#: the records of one read, as the read function returns them (``partition_token`` None:
#: the first query). Timestamps are RFC 3339 text.
Query = Callable[[str | None, str, str | None, int], Iterator[dict[str, Any]]]
#: Records queued between the partition threads and the delivery loop, at most.
QUEUE_SIZE = 4096
#: How often waiting threads look at the stop flag (seconds).
POLL_S = 0.05


class _Retry(IngestError):
    """A query ended before its partition did, without an error (retried)."""

    retriable = True


@dataclass(slots=True)
class Item:
    """One entry of the delivery queue. A record travels parsed (``record``, what the
    loop dispatches on) and as the query returned it (``raw``, what the callback gets)."""

    kind: str  # record | children | ended | error
    token: str
    record: DataChangeRecord | HeartbeatRecord | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    children: list[ChildPartitionsRecord] = field(default_factory=list)
    error: BaseException | None = None


def parse(raw: Any) -> ChangeRecord | None:
    """A record a query returned, parsed once, where it enters the reader; None for a
    kind this SDK does not know (a newer service's: skipped).

    Raises:
        MalformedRecordError: not a record, or a field of it not of its form.
    """
    kind = record_kind(raw)
    return None if kind is None else kind.from_json(raw)


@dataclass(slots=True)
class Run:
    """What one :meth:`ChangeStreamReader.run` shares with its partition threads. Each
    thread keeps its own run's: a thread still ending after its run returned (it waited
    for a slow connection) puts nothing into a later run's queue."""

    halt: threading.Event
    queue: queue.Queue[Item]
    slots: threading.Semaphore
    threads: list[threading.Thread] = field(default_factory=list)

    def put(self, item: Item) -> bool:
        """Queue ``item``, waiting while the queue is full; False if the run stops."""
        while not self.halt.is_set():
            try:
                self.queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False


class Halted(Exception):
    """The reader stops while a query waits to be retried."""


@contextlib.contextmanager
def closing(records: Iterator[dict[str, Any]]) -> Iterator[None]:
    """Close a query's iterator (a generator, an HTTP response) however the loop ends."""
    try:
        yield
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()


class PartitionThreads:
    """The reader's partition threads (a part of :class:`ChangeStreamReader`)."""

    name: str
    _query: Query
    _end_us: int | None
    _heartbeat_ms: int
    _retry: RetryPolicy
    _run: Run

    def _end_arg(self) -> str | None:
        return None if self._end_us is None else rfc3339(self._end_us)

    def _retrying(self, stop: threading.Event) -> Retrying:
        halt = self._run.halt

        def pause(seconds: float) -> None:
            if stop.wait(seconds) or halt.is_set():
                raise Halted

        return Retrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, IngestError) and exc.retriable),
            wait=wait_exponential_jitter(
                multiplier=self._retry.initial, max=self._retry.maximum, jitter=self._retry.initial
            ),
            stop=stop_after_delay(self._retry.deadline),
            sleep=pause,
            reraise=True,
        )

    def _follow(self, partition: Partition, run: Run) -> None:
        """A partition's thread: its query, retried from its watermark until it ends."""
        while not run.slots.acquire(timeout=POLL_S):
            if run.halt.is_set():
                return
        try:
            while not run.halt.is_set():
                outcome = self._retrying(run.halt)(self._query_once, partition, run)
                if outcome != "again":
                    return
        except Halted:
            return
        except BaseException as exc:
            run.put(Item("error", partition.token, error=exc))
        finally:
            run.slots.release()

    def _query_once(self, partition: Partition, run: Run) -> str:
        """One query of the partition, its records queued. Returns ``done`` (it ended, or
        the reader stops), or ``again`` (it broke off after progress: a new retry budget).

        Raises:
            IngestError: a retriable error before any progress (retried by the caller).
        """
        if run.halt.is_set():
            return "done"
        progressed = False
        children: list[ChildPartitionsRecord] = []
        start = rfc3339(partition.read_watermark)
        try:
            records = self._query(partition.token, start, self._end_arg(), self._heartbeat_ms)
            with closing(records):
                for raw in records:
                    if run.halt.is_set():
                        return "done"
                    queued = self._queue_record(partition, parse(raw), raw, children, run)
                    progressed = queued or progressed
        except IngestError as exc:
            if not exc.retriable or not (children or progressed):
                raise
            if not children:
                log.info(
                    "read of partition %s of %s broke off (%s); resuming from %s",
                    partition.token, self.name, exc, rfc3339(partition.read_watermark),
                )  # fmt: skip
                return "again"
        if children:  # the query ended after its child partitions records: finished
            run.put(Item("children", partition.token, children=children))
            return "done"
        if self._end_us is not None and partition.read_watermark >= self._end_us:
            run.put(Item("ended", partition.token))
            return "done"
        if run.halt.is_set():
            return "done"
        if progressed:
            return "again"
        raise _Retry(f"the read of partition {partition.token} of {self.name} ended before "
                     "the partition did")  # fmt: skip

    def _queue_record(
        self, partition: Partition, record: ChangeRecord | None, raw: dict[str, Any],
        children: list[ChildPartitionsRecord], run: Run,
    ) -> bool:  # fmt: skip
        """Queue one record of the partition's query; whether it was progress."""
        match record:
            case DataChangeRecord():
                pos = position(record)
                if not after(pos, partition.read_last):
                    return False  # handed before a retry or a restart
                partition.read_last = pos
                partition.read_watermark = max(partition.read_watermark, pos[0])
                return run.put(Item("record", partition.token, record, raw))
            case HeartbeatRecord():
                moment = to_micros(record.timestamp)
                if moment <= partition.read_watermark:
                    return False
                partition.read_watermark = moment
                return run.put(Item("record", partition.token, record, raw))
            case ChildPartitionsRecord():
                children.append(record)  # handed once the query has ended
                return True
        return False
