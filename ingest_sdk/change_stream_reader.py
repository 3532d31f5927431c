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

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import orjson
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from ingest_sdk.errors import ConfigurationError, IngestError
from ingest_sdk.transport import RetryPolicy

__all__ = ["ChangeStreamReader", "CheckpointPolicy", "Query"]

log = logging.getLogger(__name__)

#: ``query(partition_token, start_timestamp, end_timestamp, heartbeat_milliseconds)``:
#: the records of one read, as the read function returns them (``partition_token`` None:
#: the first query). Timestamps are RFC 3339 text.
Query = Callable[[str | None, str, str | None, int], Iterator[dict[str, Any]]]
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
#: Records queued between the partition threads and the delivery loop, at most.
QUEUE_SIZE = 4096
#: How often waiting threads look at the stop flag (seconds).
POLL_S = 0.05

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS change_stream_reader (
    stream TEXT PRIMARY KEY,
    start_us INTEGER NOT NULL,
    end_us INTEGER,
    initialized INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS change_stream_reader_partitions (
    stream TEXT NOT NULL,
    token TEXT NOT NULL,
    parents TEXT NOT NULL,
    start_us INTEGER NOT NULL,
    watermark_us INTEGER NOT NULL,
    last_us INTEGER,
    last_table TEXT,
    last_sequence TEXT,
    last_transaction TEXT,
    state TEXT NOT NULL CHECK (state IN ('open', 'finished', 'ended')),
    PRIMARY KEY (stream, token)
);
"""


def to_micros(value: str | datetime) -> int:
    """A timestamp (RFC 3339 text or a datetime; naive means UTC) in µs since the epoch."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("z", "Z"))
        except ValueError:
            raise ConfigurationError(
                f"{value[:60]!r} is not a timestamp; write it as '2026-01-31T12:00:00Z'"
            ) from None
    else:
        moment = value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def to_datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def rfc3339(micros: int) -> str:
    """µs since the epoch as ``2026-01-31T12:00:00.123456Z`` (exact: no float)."""
    return to_datetime(micros).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: (commit µs, table_name, record_sequence, server_transaction_id); compared on the
#: first three, the order records of one partition come in.
Position = tuple[int, str, str, str]


def position(change: dict[str, Any]) -> Position:
    return (
        to_micros(change["commit_timestamp"]),
        str(change["table_name"]),
        str(change["record_sequence"]),
        str(change.get("server_transaction_id", "")),
    )


def _after(pos: Position, last: Position | None) -> bool:
    return last is None or pos[:3] > last[:3]


@dataclass(slots=True)
class _Partition:
    """One partition as the reader knows it. ``watermark``/``last`` are what was handed
    to the callback (delivery loop only); ``read_watermark``/``read_last`` what the
    partition's thread queued (its own), from which a retried query resumes."""

    token: str
    parents: tuple[str, ...]
    start_us: int
    watermark: int
    last: Position | None = None
    state: str = "open"  # open | finished (its child record handed) | ended (end_timestamp)
    started: bool = False
    read_watermark: int = 0
    read_last: Position | None = None
    dirty: bool = False


class _Retry(IngestError):
    """A query ended before its partition did, without an error (retried)."""

    retriable = True


@dataclass(slots=True)
class _Item:
    """One entry of the delivery queue."""

    kind: str  # record | children | ended | error
    token: str
    record: dict[str, Any] = field(default_factory=dict)
    children: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None


@dataclass(slots=True)
class _Run:
    """What one :meth:`ChangeStreamReader.run` shares with its partition threads. Each
    thread keeps its own run's: a thread still ending after its run returned (it waited
    for a slow connection) puts nothing into a later run's queue."""

    halt: threading.Event
    queue: queue.Queue[_Item]
    slots: threading.Semaphore
    threads: list[threading.Thread] = field(default_factory=list)

    def put(self, item: _Item) -> bool:
        """Queue ``item``, waiting while the queue is full; False if the run stops."""
        while not self.halt.is_set():
            try:
                self.queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False


class ChangeStreamReader:
    """Reads every partition of a change stream, parents before children, and hands each
    data change record to ``callback`` once, with progress checkpointed in SQLite.

    Args:
        source: a :class:`~ingest_sdk.StreamingIngestClient` (reads over HTTP with its
            ``read_change_stream``), or a :data:`Query` callable (for in-process use).
        name: the change stream, as the source names it (``CS`` or ``DB.SCHEMA.CS``).
        start_timestamp: where a new checkpoint starts (RFC 3339 text or a datetime).
            A checkpoint that exists resumes where it was; this is then ignored.
        checkpoint_path: the SQLite file of the checkpoint (created if missing). Several
            readers (of different streams) may share one file.
        callback: ``callback(record, db)``, called from the thread running :meth:`run`,
            in order. ``record`` is a dict ``{"data_change_record": {...},
            "partition_token": ...}`` (with ``heartbeats``, ``{"heartbeat_record": ...}``
            too). ``db`` is the checkpoint's connection inside the transaction that also
            commits this record's progress: write through it for exactly-once effects;
            never commit or roll back. An exception stops the reader: the batch is rolled
            back and :meth:`run` raises it.
        heartbeat_milliseconds: the queries' heartbeat interval; a stop is seen within it.
        end_timestamp: read up to this time and end (None: read until stopped). A resumed
            reader may extend it (or drop it), not bring it earlier.
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
        start_timestamp: str | datetime,
        checkpoint_path: str | Path,
        callback: Callback,
        heartbeat_milliseconds: int = 1000,
        end_timestamp: str | datetime | None = None,
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
        self._start_us = to_micros(start_timestamp)
        self._end_us = None if end_timestamp is None else to_micros(end_timestamp)
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
        self._partitions: dict[str, _Partition] = {}
        self._low: int | None = None
        self._running = threading.Lock()
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
                with these arguments.
            Exception: whatever the callback raised (its batch is rolled back).
        """
        if not self._running.acquire(blocking=False):
            raise ConfigurationError("this reader is already running")
        stop = stop or threading.Event()
        self._run = run = self._new_run()
        try:
            db = self._open()
        except BaseException:
            self._running.release()
            raise
        try:
            self._load(db)
            if not self._initialized(db):
                self._first_query(db, stop)
            if not stop.is_set():
                self._start_ready()
                self._deliver(db, stop)
        finally:
            run.halt.set()
            if db.in_transaction:
                db.rollback()
            deadline = time.monotonic() + self._heartbeat_ms / 1000 + 5
            for thread in run.threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            db.close()
            self._running.release()

    def _new_run(self) -> _Run:
        return _Run(threading.Event(), queue.Queue(QUEUE_SIZE),
                    threading.Semaphore(self._max_concurrency))  # fmt: skip

    # ------------------------------------------------------------------ checkpoint

    def _open(self) -> sqlite3.Connection:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self._path), isolation_level=None, timeout=30.0)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        return db

    def _initialized(self, db: sqlite3.Connection) -> bool:
        row = db.execute(
            "SELECT initialized FROM change_stream_reader WHERE stream = ?", (self.name,)
        ).fetchone()
        return bool(row and row[0])

    def _load(self, db: sqlite3.Connection) -> None:
        """The partitions from the checkpoint; a later ``end_timestamp`` reopens those that
        ended at the old one."""
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT start_us, end_us FROM change_stream_reader WHERE stream = ?", (self.name,)
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO change_stream_reader (stream, start_us, end_us) VALUES (?, ?, ?)",
                    (self.name, self._start_us, self._end_us),
                )
            else:
                start_us, end_us = row
                if start_us != self._start_us:
                    log.info(
                        "checkpoint of %s resumes its read from %s (start_timestamp %s ignored)",
                        self.name, rfc3339(start_us), rfc3339(self._start_us),
                    )  # fmt: skip
                self._start_us = start_us
                if end_us is not None and (self._end_us is None or self._end_us > end_us):
                    db.execute(
                        "UPDATE change_stream_reader_partitions SET state = 'open' "
                        "WHERE stream = ? AND state = 'ended'",
                        (self.name,),
                    )
                elif end_us != self._end_us:
                    raise ConfigurationError(
                        f"the checkpoint {self._path} read {self.name} up to "
                        f"{'the end' if end_us is None else rfc3339(end_us)}; a resumed reader "
                        "cannot stop earlier (pass that end_timestamp, a later one or none)"
                    )
                db.execute(
                    "UPDATE change_stream_reader SET end_us = ? WHERE stream = ?",
                    (self._end_us, self.name),
                )
            found = db.execute(
                "SELECT token, parents, start_us, watermark_us, last_us, last_table, "
                "last_sequence, last_transaction, state FROM change_stream_reader_partitions "
                "WHERE stream = ?",
                (self.name,),
            ).fetchall()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        partitions: dict[str, _Partition] = {}
        for token, parents, start, mark, last_us, table, sequence, transaction, state in found:
            last = None if last_us is None else (last_us, table, sequence, transaction)
            partitions[token] = _Partition(
                token, tuple(orjson.loads(parents)), start, mark, last, state,
                read_watermark=mark, read_last=last,
            )  # fmt: skip
        with self._state_lock:
            self._partitions = partitions
            self._low = None
            self._update_low()

    def _save(self, db: sqlite3.Connection) -> None:
        """Write the changed partitions and commit (the callback's writes with them).

        A finished partition no unstarted child waits for is forgotten: it is never read
        again, and the checkpoint stays as small as the stream's open partitions."""
        waited_for = {
            t for p in self._partitions.values() if p.state != "finished" for t in p.parents
        }
        for p in list(self._partitions.values()):
            if p.state == "finished" and p.token not in waited_for:
                db.execute(
                    "DELETE FROM change_stream_reader_partitions WHERE stream = ? AND token = ?",
                    (self.name, p.token),
                )
                with self._state_lock:
                    del self._partitions[p.token]
        for p in self._partitions.values():
            if not p.dirty:
                continue
            last = p.last or (None, None, None, None)
            db.execute(
                "INSERT INTO change_stream_reader_partitions (stream, token, parents, start_us, "
                "watermark_us, last_us, last_table, last_sequence, last_transaction, state) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, token) DO UPDATE SET "
                "parents = excluded.parents, "
                "watermark_us = max(watermark_us, excluded.watermark_us), "
                "last_us = excluded.last_us, last_table = excluded.last_table, "
                "last_sequence = excluded.last_sequence, "
                "last_transaction = excluded.last_transaction, state = excluded.state",
                (self.name, p.token, orjson.dumps(list(p.parents)).decode(), p.start_us,
                 p.watermark, *last, p.state),
            )  # fmt: skip
            p.dirty = False
        db.execute("COMMIT")

    # ------------------------------------------------------------------ the first query

    def _first_query(self, db: sqlite3.Connection, stop: threading.Event) -> None:
        """Run the first query (partition token NULL) and record its partitions."""

        def once() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            records = self._query(
                None, rfc3339(self._start_us), self._end_arg(), self._heartbeat_ms
            )
            with _closing(records):
                for record in records:
                    child = record.get("child_partitions_record")
                    if child is not None:
                        found.append(child)
            return found

        try:
            children = self._retrying(stop)(once)
        except _Halted:
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            for child in children:
                self._add_children(child, parent=None)
            db.execute(
                "UPDATE change_stream_reader SET initialized = 1 WHERE stream = ?", (self.name,)
            )
            self._save(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _end_arg(self) -> str | None:
        return None if self._end_us is None else rfc3339(self._end_us)

    def _retrying(self, stop: threading.Event) -> Retrying:
        halt = self._run.halt

        def pause(seconds: float) -> None:
            if stop.wait(seconds) or halt.is_set():
                raise _Halted

        return Retrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, IngestError) and exc.retriable),
            wait=wait_exponential_jitter(
                multiplier=self._retry.initial, max=self._retry.maximum, jitter=self._retry.initial
            ),
            stop=stop_after_delay(self._retry.deadline),
            sleep=pause,
            reraise=True,
        )

    # ------------------------------------------------------------------ lineage

    def _add_children(self, record: dict[str, Any], parent: str | None) -> None:
        """Know the children a child partitions record names (once each, whoever names
        them). A child starting after ``end_timestamp`` has nothing to read: it ends."""
        start = to_micros(record["start_timestamp"])
        for child in record.get("child_partitions", []):
            token = str(child["token"])
            if token in self._partitions:
                continue
            parents = tuple(str(t) for t in child.get("parent_partition_tokens") or () if t)
            if parent is not None and parent not in parents:
                parents = (*parents, parent)
            ended = self._end_us is not None and start > self._end_us
            made = _Partition(
                token, parents, start, start, state="ended" if ended else "open",
                read_watermark=start, dirty=True,
            )  # fmt: skip
            with self._state_lock:
                self._partitions[token] = made

    def _ready(self, partition: _Partition) -> bool:
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

    def _follow(self, partition: _Partition, run: _Run) -> None:
        """A partition's thread: its query, retried from its watermark until it ends."""
        while not run.slots.acquire(timeout=POLL_S):
            if run.halt.is_set():
                return
        try:
            while not run.halt.is_set():
                outcome = self._retrying(run.halt)(self._query_once, partition, run)
                if outcome != "again":
                    return
        except _Halted:
            return
        except BaseException as exc:
            run.put(_Item("error", partition.token, error=exc))
        finally:
            run.slots.release()

    def _query_once(self, partition: _Partition, run: _Run) -> str:
        """One query of the partition, its records queued. Returns ``done`` (it ended, or
        the reader stops), or ``again`` (it broke off after progress: a new retry budget).

        Raises:
            IngestError: a retriable error before any progress (retried by the caller).
        """
        if run.halt.is_set():
            return "done"
        progressed = False
        children: list[dict[str, Any]] = []
        start = rfc3339(partition.read_watermark)
        try:
            records = self._query(partition.token, start, self._end_arg(), self._heartbeat_ms)
            with _closing(records):
                for record in records:
                    if run.halt.is_set():
                        return "done"
                    progressed = self._queue_record(partition, record, children, run) or progressed
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
            run.put(_Item("children", partition.token, children=children))
            return "done"
        if self._end_us is not None and partition.read_watermark >= self._end_us:
            run.put(_Item("ended", partition.token))
            return "done"
        if run.halt.is_set():
            return "done"
        if progressed:
            return "again"
        raise _Retry(f"the read of partition {partition.token} of {self.name} ended before "
                     "the partition did")  # fmt: skip

    def _queue_record(
        self, partition: _Partition, record: dict[str, Any], children: list[dict[str, Any]],
        run: _Run,
    ) -> bool:  # fmt: skip
        """Queue one record of the partition's query; whether it was progress."""
        change = record.get("data_change_record")
        if change is not None:
            pos = position(change)
            if not _after(pos, partition.read_last):
                return False  # handed before a retry or a restart
            partition.read_last = pos
            partition.read_watermark = max(partition.read_watermark, pos[0])
            return run.put(_Item("record", partition.token, record=record))
        beat = record.get("heartbeat_record")
        if beat is not None:
            moment = to_micros(beat["timestamp"])
            if moment <= partition.read_watermark:
                return False
            partition.read_watermark = moment
            return run.put(_Item("record", partition.token, record=record))
        child = record.get("child_partitions_record")
        if child is not None:
            children.append(child)  # handed once the query has ended
            return True
        return False

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
                item: _Item | None = (
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
                    raise item.error
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

    def _finished(self) -> bool:
        return all(p.state != "open" for p in self._partitions.values())

    def _handle(self, item: _Item, db: sqlite3.Connection) -> int:
        """One queue entry, inside the open transaction; how many records were handed."""
        partition = self._partitions[item.token]
        if item.kind == "record":
            change = item.record.get("data_change_record")
            if change is not None:
                pos = position(change)
                if not _after(pos, partition.last):
                    return 0
                self._hand(item, db)
                with self._state_lock:
                    partition.last = pos
                    partition.watermark = max(partition.watermark, pos[0])
                    partition.dirty = True
                    self._update_low()
                return 1
            moment = to_micros(item.record["heartbeat_record"]["timestamp"])
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

    def _hand(self, item: _Item, db: sqlite3.Connection) -> None:
        try:
            self._callback({**item.record, "partition_token": item.token}, db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if not db.in_transaction:
            raise ConfigurationError(
                "the callback committed or rolled back the checkpoint's transaction; it must "
                "only write through db (the reader commits)"
            )


class _Halted(Exception):
    """The reader stops while a query waits to be retried."""


@contextlib.contextmanager
def _closing(records: Iterator[dict[str, Any]]) -> Iterator[None]:
    """Close a query's iterator (a generator, an HTTP response) however the loop ends."""
    try:
        yield
    finally:
        close = getattr(records, "close", None)
        if close is not None:
            close()
