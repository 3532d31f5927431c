"""Reading a whole change stream: every partition, parents before children, each data
change record handed to the application once, with durable progress.

A change stream's records live in partitions that split and merge
(docs/change-streams.md). An application that reads one has to run the first query,
one query per partition in parallel, start a partition's children only once all its
parents have ended and their records were handled, start one query per child although
every parent of a merge names it, and remember where each partition was so a restart
neither loses nor repeats a record. :class:`ChangeStreamReader` does all of that.

How it works, one thread per role:

- **Partition threads** (one per open partition, at most ``max_concurrency`` at once)
  run their partition's query and put what it returns on one queue. A query that fails
  with a retriable error (the service restarted, the connection broke) is repeated
  from the partition's watermark with jittered backoff; records at or before the last
  one queued are skipped. Any other error stops the reader with that error.
- **The delivery loop** (the thread that called :meth:`ChangeStreamReader.run`) takes
  the queue in order, hands each data change record to the callback, and moves the
  partition's watermark. When a partition's query has ended with its child partitions
  record, the partition is finished; a child whose parents have all finished is
  started then, once, so each child's records come after all of its parents'.
- **The checkpoint** is a SQLite file (WAL, ``synchronous=FULL``). The callback gets
  ``(record, db)``, ``db`` being the connection inside the open transaction that also
  writes the progress, so whatever the callback writes through ``db`` commits
  atomically with it: exactly once. A transaction covers a batch (:class:`CheckpointPolicy`).
  Effects outside ``db`` are at least once: after a crash the records of the last
  uncommitted batch are handed again.

Positions. A data change record's position in its partition is ``(commit_timestamp,
table_name, record_sequence)`` (with ``server_transaction_id`` kept beside it), the
order the partition returns its records in. A partition's **watermark** is the newest
commit timestamp or heartbeat handed for it: every record of the partition before it
was handed. It never goes backwards. A restarted reader queries each unfinished
partition from its watermark (inclusive) and skips records at or before the last
position handed.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ingest_sdk.change_records import ChildPartitionsRecord, DataChangeRecord, HeartbeatRecord
from ingest_sdk.change_stream_checkpoint import Checkpoint
from ingest_sdk.change_stream_partitions import (
    POLL_S,
    QUEUE_SIZE,
    Halted,
    Item,
    PartitionThreads,
    Query,
    Run,
    closing,
    parse,
)
from ingest_sdk.change_stream_positions import (
    Partition,
    Position,
    after,
    position,
    rfc3339,
    to_datetime,
    to_micros,
)
from ingest_sdk.errors import ConfigurationError, IngestError
from ingest_sdk.transport import RetryPolicy

__all__ = ["ChangeStreamReader", "CheckpointPolicy", "Query"]
# Re-exported: what callers of this module used before it was split by job.
__all__ += ["Position", "position", "rfc3339", "to_datetime", "to_micros"]

log = logging.getLogger(__name__)

#: The application's callback: a record and the checkpoint's connection, inside the
#: transaction that commits the record's progress.
Callback = Callable[[dict[str, Any], sqlite3.Connection], None]


class _ReadsChangeStreams(Protocol):
    def read_change_stream(
        self,
        name: str,
        start_timestamp: str,
        *,
        end_timestamp: str | None = None,
        partition_token: str | None = None,
        heartbeat_milliseconds: int = 10_000,
    ) -> Iterator[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class CheckpointPolicy:
    """When the delivery loop commits: after ``max_records`` records handed to the
    callback, or ``max_delay`` seconds after the batch's first one, whichever comes
    first. Bigger batches cost fewer fsyncs; a crash hands at most one batch again to
    effects outside the checkpoint's database."""

    max_records: int = 1000
    max_delay: float = 0.1

    def __post_init__(self) -> None:
        if self.max_records < 1 or not 0 < self.max_delay <= 60:
            raise ConfigurationError(
                "CheckpointPolicy needs max_records >= 1 and 0 < max_delay <= 60 seconds, "
                f"got {self.max_records} and {self.max_delay}"
            )


DEFAULT_CHECKPOINT = CheckpointPolicy()
#: Retries of a partition's query: bounded by ``deadline`` seconds without progress.
DEFAULT_READ_RETRY = RetryPolicy(initial=0.1, maximum=5.0, deadline=120.0)


class ChangeStreamReader(PartitionThreads, Checkpoint):
    """Reads every partition of a change stream, parents before children, and hands each
    data change record to ``callback`` once, with progress checkpointed in SQLite.

    Args:
        source: a :class:`~ingest_sdk.StreamingIngestClient` (reads over HTTP with its
            ``read_change_stream``), or a :data:`Query` callable (for in-process use).
        name: the change stream, as the source names it (``CS`` or ``DB.SCHEMA.CS``).
        start_timestamp: where the read starts: RFC 3339 text, a datetime (naive: UTC)
            or a number of seconds since the epoch. A checkpoint of the stream resumes
            where it was, and must have started here (else :meth:`run` raises, saying
            how to resume it or :meth:`reset` it).
        checkpoint_path: the SQLite file of the checkpoint, created once the first query
            succeeded (a refused start writes nothing). Several readers (of different
            streams) may share one file.
        callback: ``callback(record, db)``, called from the thread running :meth:`run`,
            in order. ``record`` is a dict ``{"data_change_record": {...},
            "partition_token": ...}`` (with ``heartbeats``, ``{"heartbeat_record": ...}``
            too), as the query returned it; :func:`~ingest_sdk.record_from_json` makes
            it a :class:`~ingest_sdk.DataChangeRecord`. ``db`` is the checkpoint's
            connection inside the transaction that also commits this record's progress:
            write through it for exactly-once effects; never commit or roll back. An
            exception stops the reader: the batch is rolled back and :meth:`run` raises
            it.
        heartbeat_milliseconds: the queries' heartbeat interval; a stop is seen within it.
        end_timestamp: read up to this time and end (None: read until stopped); the same
            forms as ``start_timestamp``. A resumed reader may extend it (or drop it),
            not bring it earlier.
        max_concurrency: queries running at once. An open partition beyond it waits until
            another partition ends, which without ``end_timestamp`` may be long: keep it
            at least the number of partitions the stream may have.
        heartbeats: also hand heartbeat records to the callback (those that move the
            partition's watermark).
        checkpoint: the batch sizes of commits.
        retry: the backoff of a failed query, and how long it is retried without progress.
    """

    def __init__(
        self,
        source: _ReadsChangeStreams | Query,
        name: str,
        *,
        start_timestamp: str | datetime | float,
        checkpoint_path: str | Path,
        callback: Callback,
        heartbeat_milliseconds: int = 1000,
        end_timestamp: str | datetime | float | None = None,
        max_concurrency: int = 64,
        heartbeats: bool = False,
        checkpoint: CheckpointPolicy = DEFAULT_CHECKPOINT,
        retry: RetryPolicy = DEFAULT_READ_RETRY,
    ) -> None:
        if hasattr(source, "read_change_stream"):
            client: _ReadsChangeStreams = source  # type: ignore[assignment]

            def query(
                token: str | None, start: str, end: str | None, heartbeat_ms: int
            ) -> Iterator[dict[str, Any]]:
                return client.read_change_stream(
                    name,
                    start,
                    end_timestamp=end,
                    partition_token=token,
                    heartbeat_milliseconds=heartbeat_ms,
                )

            self._query: Query = query
        elif callable(source):
            self._query = source
        else:
            raise ConfigurationError(
                "source must be a StreamingIngestClient (the sync client; an async client's "
                "read_change_stream is an async iterator) or a query callable"
            )
        if max_concurrency < 1:
            raise ConfigurationError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.name = name
        self._start_us = to_micros(start_timestamp, "start_timestamp")
        self._end_us = None if end_timestamp is None else to_micros(end_timestamp, "end_timestamp")
        if self._end_us is not None and self._end_us < self._start_us:
            raise ConfigurationError("end_timestamp is before start_timestamp")
        self._path = Path(checkpoint_path)
        self._callback = callback
        self._heartbeat_ms = heartbeat_milliseconds
        self._max_concurrency = max_concurrency
        self._heartbeats = heartbeats
        self._policy = checkpoint
        self._retry = retry
        self._state_lock = threading.Lock()  # guards _partitions' watermarks and _low
        self._partitions: dict[str, Partition] = {}
        self._low: int | None = None
        self._running = threading.Lock()
        self._resumed = False
        self._run = self._new_run()

    # ------------------------------------------------------------------ public state

    @property
    def watermarks(self) -> dict[str, datetime]:
        """Each unfinished partition's watermark: every record of the partition before
        it was handed to the callback."""
        with self._state_lock:
            return {
                p.token: to_datetime(p.watermark)
                for p in self._partitions.values()
                if p.state == "open"
            }

    @property
    def low_watermark(self) -> datetime | None:
        """Every record of the stream before this time was handed to the callback (the
        minimum of the unfinished partitions' watermarks). Never goes backwards. None
        before :meth:`run` has loaded the checkpoint."""
        with self._state_lock:
            return None if self._low is None else to_datetime(self._low)

    def _update_low(self) -> None:
        """Called with ``_state_lock`` held."""
        open_marks = [p.watermark for p in self._partitions.values() if p.state == "open"]
        if open_marks:
            low = min(open_marks)
        else:  # everything ended: as far as any partition got
            low = max((p.watermark for p in self._partitions.values()), default=self._start_us)
        self._low = low if self._low is None else max(self._low, low)

    # ------------------------------------------------------------------ run

    def run(self, stop: threading.Event | None = None) -> None:
        """Read until every partition has ended (with ``end_timestamp``) or ``stop`` is
        set; then commit what was handed and return.

        Raises:
            ServiceError: a query failed with an error that repeating will not fix (a
                4xx answer: unknown stream or partition, a start outside retention...).
            TransportError: the service stayed unreachable for ``retry.deadline``.
            ConfigurationError: the checkpoint belongs to a read that cannot resume
                with these arguments (the message names the file and what to do), or
                the file is not a checkpoint.
            Exception: whatever the callback raised (its batch is rolled back).
        """
        if not self._running.acquire(blocking=False):
            raise ConfigurationError("this reader is already running")
        stop = stop or threading.Event()
        self._run = run = self._new_run()
        db: sqlite3.Connection | None = None
        try:
            db = self._open_checkpoint(create=False)
            self._resumed = db is not None and self._load(db)
            with self._state_lock:
                if not self._resumed:
                    self._partitions = {}
                self._low = None
                self._update_low()
            if not self._resumed:
                db = self._first_query(db, stop)
            if db is not None and not stop.is_set():
                self._start_ready()
                self._deliver(db, stop)
        finally:
            run.halt.set()
            if db is not None and db.in_transaction:
                db.rollback()
            deadline = time.monotonic() + self._heartbeat_ms / 1000 + 5
            for thread in run.threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if db is not None:
                db.close()
            self._running.release()

    def _new_run(self) -> Run:
        return Run(threading.Event(), queue.Queue(QUEUE_SIZE),
                   threading.Semaphore(self._max_concurrency))  # fmt: skip

    # ------------------------------------------------------------------ the first query

    def _first_query(
        self, db: sqlite3.Connection | None, stop: threading.Event
    ) -> sqlite3.Connection | None:
        """Run the first query (partition token NULL); once it succeeded, begin the
        stream's checkpoint with its partitions (creating the file if ``db`` is None).
        A refused or stopped first query writes nothing. The checkpoint's connection, or
        None if the reader stopped."""

        def once() -> list[ChildPartitionsRecord]:
            found: list[ChildPartitionsRecord] = []
            records = self._query(
                None, rfc3339(self._start_us), self._end_arg(), self._heartbeat_ms
            )
            with closing(records):
                for raw in records:
                    record = parse(raw)
                    if isinstance(record, ChildPartitionsRecord):
                        found.append(record)
            return found

        try:
            children = self._retrying(stop)(once)
        except Halted:
            return db
        db = db or self._open_checkpoint(create=True)
        assert db is not None
        db.execute("BEGIN IMMEDIATE")
        try:
            self._write_start(db)
            for child in children:
                self._add_children(child, parent=None)
            with self._state_lock:
                self._update_low()
            self._save(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return db

    # ------------------------------------------------------------------ lineage

    def _add_children(self, record: ChildPartitionsRecord, parent: str | None) -> None:
        """Know the children a child partitions record names (once each, whoever names
        them). A child starting after ``end_timestamp`` has nothing to read: it ends."""
        start = to_micros(record.start_timestamp)
        for child in record.child_partitions:
            token = child.token
            if token in self._partitions:
                continue
            parents = tuple(t for t in child.parent_partition_tokens if t)
            if parent is not None and parent not in parents:
                parents = (*parents, parent)
            ended = self._end_us is not None and start > self._end_us
            made = Partition(
                token, parents, start, start, state="ended" if ended else "open",
                read_watermark=start, dirty=True,
            )  # fmt: skip
            with self._state_lock:
                self._partitions[token] = made

    def _ready(self, partition: Partition) -> bool:
        if partition.state != "open" or partition.started:
            return False
        return all(
            t in self._partitions and self._partitions[t].state != "open" for t in partition.parents
        )

    def _start_ready(self) -> None:
        """Start one query per partition whose parents have all ended (and were handled)."""
        for partition in list(self._partitions.values()):
            if self._ready(partition):
                with self._state_lock:  # its parents are done for good: not waited for
                    partition.started, partition.parents, partition.dirty = True, (), True
                thread = threading.Thread(
                    target=self._follow, args=(partition, self._run),
                    name=f"change-stream-{self.name}-{partition.token[:12]}", daemon=True,
                )  # fmt: skip
                self._run.threads.append(thread)
                thread.start()

    def _stuck(self) -> bool:
        """Whether open partitions wait for parents no query can finish any more."""
        if any(t.is_alive() for t in self._run.threads) or not self._run.queue.empty():
            return False
        return any(p.state == "open" for p in self._partitions.values())

    # ------------------------------------------------------------------ partition threads

    # ------------------------------------------------------------------ delivery

    def _deliver(self, db: sqlite3.Connection, stop: threading.Event) -> None:
        """Hand the queue to the callback in order, committing in batches."""
        handed = 0
        batch_started = 0.0
        while True:
            if stop.is_set():
                break
            if not db.in_transaction and self._finished():
                break
            wait = POLL_S
            if db.in_transaction:
                wait = min(
                    wait, max(0.0, batch_started + self._policy.max_delay - time.monotonic())
                )
            try:
                item: Item | None = (
                    self._run.queue.get(timeout=wait) if wait > 0 else self._run.queue.get_nowait()
                )
            except queue.Empty:
                item = None
            if item is not None:
                if not db.in_transaction:
                    db.execute("BEGIN IMMEDIATE")
                    batch_started = time.monotonic()
                if item.kind == "error":
                    assert item.error is not None
                    self._save(db)  # what was handed stays handed
                    raise self._noted(item.error)
                handed += self._handle(item, db)
            if db.in_transaction and (
                handed >= self._policy.max_records
                or time.monotonic() >= batch_started + self._policy.max_delay
            ):
                self._save(db)
                handed = 0
            elif item is None and not db.in_transaction and self._stuck():
                raise IngestError(
                    f"change stream {self.name}: partitions "
                    f"{sorted(p.token for p in self._partitions.values() if p.state == 'open')} "
                    "wait for parents that no running query will end"
                )
        if db.in_transaction:
            self._save(db)

    def _noted(self, error: BaseException) -> BaseException:
        """A query's error, with a note on the checkpoint when the read resumed one: its
        partitions may belong to a stream dropped and made again under this name."""
        if self._resumed:
            error.add_note(
                f"(the read resumed the checkpoint {self._path}: if {self.name} was dropped "
                "and made again, or no longer has those partitions, its progress there does "
                "not apply; " + self._how_to_reset() + ")"
            )
        return error

    def _finished(self) -> bool:
        return all(p.state != "open" for p in self._partitions.values())

    def _handle(self, item: Item, db: sqlite3.Connection) -> int:
        """One queue entry, inside the open transaction; how many records were handed."""
        partition = self._partitions[item.token]
        record = item.record
        if isinstance(record, DataChangeRecord):
            pos = position(record)
            if not after(pos, partition.last):
                return 0
            self._hand(item, db)
            with self._state_lock:
                partition.last = pos
                partition.watermark = max(partition.watermark, pos[0])
                partition.dirty = True
                self._update_low()
            return 1
        if isinstance(record, HeartbeatRecord):
            moment = to_micros(record.timestamp)
            if moment <= partition.watermark:
                return 0
            handed = 0
            if self._heartbeats:
                self._hand(item, db)
                handed = 1
            with self._state_lock:
                partition.watermark = moment
                partition.dirty = True
                self._update_low()
            return handed
        with self._state_lock:
            partition.state = "finished" if item.kind == "children" else "ended"
            partition.dirty = True
        for child in item.children:
            self._add_children(child, parent=item.token)
        with self._state_lock:
            self._update_low()
        self._start_ready()
        return 0

    def _hand(self, item: Item, db: sqlite3.Connection) -> None:
        try:
            self._callback({**item.raw, "partition_token": item.token}, db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if not db.in_transaction:
            raise ConfigurationError(
                "the callback committed or rolled back the checkpoint's transaction; it must "
                "only write through db (the reader commits)"
            )
