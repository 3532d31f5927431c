"""The per-table flush task: waits for the earliest deadline, then commits.

One task per table. It sleeps until the earliest deadline among the table's
pending batches (or a size/close trigger), takes every pending batch, and hands
them to :class:`flush.TableWriter` in a worker thread. A failure puts the
batches back and the flush is retried with jittered exponential backoff; a
producer is never told a token is committed before it is. A table found gone from
the catalog after a failure (dropped on another service, or by SQL) is not retried:
the task hands it to ``on_dropped`` and ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import pyarrow as pa
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    wait_exponential_jitter,
)

from catalog import Catalog
from channel_server.metrics import Metrics
from channel_server.state import BufferBudget, PendingBatch, TableState
from flush import ChannelProgress, TableWriter, replay_commits
from flush.commit import ChannelFencedError, CommitRecord, Laps
from ingest_sdk.errors import TableNotFoundError
from ingest_sdk.validation import check_offset_token
from ingest_sdk.wire import pack_txn_version, unpack_txn_version

__all__ = ["TableFlusher"]

log = logging.getLogger(__name__)


def _progress(batches: list[PendingBatch]) -> list[ChannelProgress]:
    """Each channel's newest position and token after these batches (insert order kept)."""
    by_channel: dict[str, ChannelProgress] = {}
    for batch in batches:
        previous = by_channel.get(batch.channel.name)
        token = batch.channel.committed_token if previous is None else previous.offset_token
        if batch.offset_token is not None:
            token = batch.offset_token
        by_channel[batch.channel.name] = ChannelProgress(
            channel=batch.channel.name,
            generation=batch.generation,
            batch_seq=batch.batch_seq,
            offset_token=token,
            rows=(previous.rows if previous else 0) + batch.rows,
        )
    return list(by_channel.values())


def _unfit(progress: ChannelProgress) -> str | None:
    """Why a channel's position cannot go into a commit, or None if it can.

    The door refuses such values; this keeps one channel's bad state (from a bug, or a
    client older than a check) from failing every flush of its table.
    """
    try:
        pack_txn_version(progress.generation, progress.batch_seq)
        check_offset_token(progress.offset_token)
    except ValueError as exc:
        return str(exc)
    return None


class TableDroppedError(Exception):
    """A flush failed and the table is no longer in the catalog: it was dropped (on
    another service sharing the catalog, or by SQL), so no attempt can ever commit."""


class TableFlusher:
    """Flushes one table's buffer into Delta commits until stopped, or until it finds its
    table dropped."""

    def __init__(
        self,
        table: TableState,
        catalog: Catalog,
        budget: BufferBudget,
        retry_initial: float,
        retry_max: float,
        metrics: Metrics,
        on_flush: Callable[[TableState, int, float], None] | None = None,
        on_dropped: Callable[[TableState], Awaitable[None]] | None = None,
    ) -> None:
        self.table = table
        self.catalog = catalog
        self.budget = budget
        self.writer = TableWriter(table.info.uri, table.info.schema)
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.on_flush = on_flush
        #: Called (in this flusher's task, which then ends) when a failed flush finds the
        #: table gone from the catalog: the owner invalidates its channels and frees them.
        self.on_dropped = on_dropped
        self.metrics = metrics
        self.task: asyncio.Task[None] | None = None
        #: Moving estimate of one flush's duration; flushes start this much before the
        #: deadline so rows are committed by arrival + max_client_lag, not after it.
        self.flush_estimate = 0.0
        #: An attempt failed without an answer: its commit may have landed, so batches put
        #: back are checked against the log before they go into a commit with newer ones.
        self._unanswered = False
        #: A commit may be missing from the catalog (an attempt failed after its commit, or
        #: the index update failed): the next index update replays every commit it lacks.
        self.unindexed = False

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"flush {self.table.info.full_name}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _run(self) -> None:
        table = self.table
        while True:
            if not table.pending and not self.unindexed:
                table.flush_now = False  # a flush asked for with nothing pending is done
                table.wakeup.clear()
                await table.wakeup.wait()
                continue
            # Nothing pending but a commit the catalog lacks (its update failed): it is
            # recorded now, retried like a flush, not left for the next rows to bring.
            delay = table.earliest_deadline - self.flush_estimate - time.monotonic()
            if table.pending and delay > 0 and not table.flush_now:
                table.wakeup.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(table.wakeup.wait(), delay)
                continue  # re-evaluate: a batch with an earlier deadline may have woken us
            table.flush_now = False
            try:
                await self._flush_retrying()
            except TableDroppedError as dropped:
                log.warning(
                    "%s; its channels are invalidated and their buffered rows discarded",
                    dropped,
                    extra={"table": table.info.full_name},
                )
                if self.on_dropped is not None:
                    await self.on_dropped(table)
                return
            table.flush_error = None

    async def _flush_retrying(self) -> None:
        """:meth:`flush_once` until it succeeds, with jittered exponential backoff.

        Raises:
            TableDroppedError: an attempt failed and the table is gone from the catalog.
        """
        async for attempt in AsyncRetrying(
            wait=wait_exponential_jitter(
                multiplier=self.retry_initial, max=self.retry_max, jitter=self.retry_initial
            ),
            retry=retry_if_not_exception_type(TableDroppedError),
            before_sleep=self._record_failure,
            reraise=True,
        ):
            with attempt:
                try:
                    await self.flush_once()
                except Exception as error:
                    if await asyncio.to_thread(self._dropped):
                        raise TableDroppedError(
                            f"table {self.table.info.full_name} (id {self.table.info.id}) was "
                            "dropped: it is no longer in the catalog"
                        ) from error
                    raise

    def _dropped(self) -> bool:
        """Whether the catalog no longer holds the table's id (in a worker thread; ids
        are never reused, so the answer holds for good). A catalog that cannot answer
        either counts as "not dropped": the flush is retried as after any failure."""
        try:
            return self.catalog.get_table_by_id(self.table.info.id) is None
        except Exception:
            log.debug("cannot tell whether %s was dropped", self.table.info.full_name,
                      exc_info=True)  # fmt: skip
            return False

    def _record_failure(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        name = self.table.info.full_name
        self.table.flush_error = f"{type(error).__name__}: {error}"
        self.metrics.flush_failures.labels(name).inc()
        log.warning(
            "flush of %s failed (attempt %d), retrying in %.2f s: %s",
            name,
            state.attempt_number,
            state.upcoming_sleep,
            self.table.flush_error,
            extra={"table": name, "attempt": state.attempt_number},
        )

    def _drop_unfit(self, batches: list[PendingBatch], unfit: dict[str, str]) -> list[PendingBatch]:
        """Invalidate the channels whose position cannot be committed and free their
        batches; the rest of the flush goes on."""
        kept = []
        for batch in batches:
            reason = unfit.get(batch.channel.name)
            if reason is None:
                kept.append(batch)
                continue
            if batch.channel.valid:
                log.error("channel %s of %s cannot be committed and was invalidated: %s",
                          batch.channel.name, self.table.info.full_name, reason)  # fmt: skip
                batch.channel.invalidate(
                    f"its uncommitted rows were discarded: they cannot be committed ({reason}); "
                    "reopen the channel and resume after the latest committed offset token"
                )
            self.budget.release(batch.nbytes)
        return kept

    def _take(self) -> list[PendingBatch]:
        """Every pending batch that can be committed; the others are freed. If working
        that out fails, everything taken is put back first."""
        taken = self.table.take_pending()
        try:
            batches = [batch for batch in taken if batch.channel.valid]
            unfit = {p.channel: why for p in _progress(batches) if (why := _unfit(p)) is not None}
        except BaseException:
            self.table.put_back(taken)
            raise
        # A reopen or drop already discarded the batches of invalid channels; free any
        # that slipped by.
        self.budget.release(sum(batch.nbytes for batch in taken if not batch.channel.valid))
        return self._drop_unfit(batches, unfit) if unfit else batches

    def _write(
        self, parts: list[pa.Table], progress: list[ChannelProgress], timings: dict[str, float]
    ) -> CommitRecord:
        """Steps 1 to 4 in one worker thread: row ids from the catalog (where SQL sessions
        reserve theirs too), the Delta commit, then the catalog's index of it. If the
        index update fails the commit still stands (the next update, a channel's open and
        start-up replay what the catalog lacks)."""
        laps = Laps(timings)
        first_row_id = self.catalog.reserve_row_ids(
            self.table.info.id, sum(p.num_rows for p in parts)
        )
        laps.lap("row_ids")
        record = self.writer.commit_flush(parts, progress, first_row_id, timings)
        laps = Laps(timings)
        self._index(record, "commit")  # Step 4
        laps.lap("catalog")
        return record

    def _index(self, record: CommitRecord, what: str) -> None:
        """Step 4 of a flush or a fence: record the commit in the catalog (every commit it
        lacks, in order, when one may be missing). A failure leaves the commit standing:
        the table is marked unindexed, and the next update, a channel's open and start-up
        replay what the catalog lacks.

        Raises:
            TableNotFoundError: the catalog no longer holds the table: it was dropped
                (on another service) while the commit travelled, so the commit may have
                landed in a folder already purged, and it is not acknowledged.
        """
        recorded = True
        try:
            if self.unindexed:
                self.reindex()
            else:
                recorded = self.catalog.apply_commit(self.table.info.id, record)
        except Exception:
            self.unindexed = True
            log.exception("catalog update after %s %d failed", what, record.version)
        if not recorded:
            raise TableNotFoundError(
                f"table {self.table.info.full_name} was dropped while its {what} "
                f"{record.version} was in flight; the {what} is not acknowledged"
            )

    def fence(
        self, channel: str, generation: int, resume: bool, fallback_token: str | None
    ) -> CommitRecord:
        """An open's fence commit (:meth:`flush.TableWriter.fence`), in a worker thread,
        then the catalog's index of it (a failed index update leaves the fence standing,
        as after a flush). Call with the table's lock held: no flush of it is in flight.

        Raises:
            ChannelFencedError: an open of a newer generation fenced first.
            TableNotFoundError: the table was dropped meanwhile.
        """
        info = self.catalog.get_table_by_id(self.table.info.id)
        if info is None:
            raise TableNotFoundError(f"table {self.table.info.full_name} was dropped")
        try:
            record = self.writer.fence(channel, generation, info.next_row_id, resume=resume,
                                       fallback_token=fallback_token)  # fmt: skip
        except ChannelFencedError:
            raise  # refused before anything was committed
        except BaseException:
            self.unindexed = True  # it may have committed
            raise
        self._index(record, "fence commit")
        return record

    def reindex(self) -> None:
        """Record in the catalog every flush commit of the log it lacks, in order."""
        replay_commits(self.catalog, self.table.info.id)
        self.unindexed = False

    async def _drop_landed(self, batches: list[PendingBatch]) -> list[PendingBatch]:
        """After an attempt that failed without an answer: the batches its commit already
        holds (the log has their channel at their generation and at or past their
        batch_seq) are indexed in the catalog, acknowledged and freed; the rest go on. If
        it raises, nothing was acknowledged or freed."""
        positions = await asyncio.to_thread(self.writer.landed_positions, _progress(batches))
        done: list[PendingBatch] = []
        kept: list[PendingBatch] = []
        for batch in batches:
            landed = positions.get(batch.channel.name)
            generation, seq = unpack_txn_version(landed) if landed is not None else (0, 0)
            same = generation == batch.generation and seq >= batch.batch_seq
            (done if same else kept).append(batch)
        if done:  # that commit's answer, and its index update, were lost: index, then wake
            try:
                await asyncio.to_thread(self.reindex)
            except Exception:
                log.exception("catalog update after a commit whose answer was lost failed")
            self._acknowledge(_progress(done))
            self.budget.release(sum(b.nbytes for b in done))
        self._unanswered = False
        return kept

    def _acknowledge(self, progress: list[ChannelProgress]) -> None:
        """Step 5: wake the producers waiting for these positions."""
        for item in progress:
            channel = self.table.channels.get(item.channel)
            if channel is not None and channel.generation == item.generation:
                channel.mark_committed(item.batch_seq, item.offset_token, item.rows)

    def _drop_fenced(
        self, batches: list[PendingBatch], fenced: ChannelFencedError
    ) -> list[PendingBatch]:
        """The channels an open elsewhere fenced (a newer generation is in the log): their
        handles are invalidated and every batch of theirs is discarded, never committed;
        the other channels' batches are returned, to be committed at once."""
        kept, dropped = [], 0
        for batch in batches:
            if batch.channel.name not in fenced.channels:
                kept.append(batch)
                continue
            channel = batch.channel
            self.budget.release(batch.nbytes)
            dropped += batch.rows
            if channel.valid:
                channel.invalidate(
                    f"channel {channel.name} was opened again (its table's log holds a newer "
                    "generation, opened on another server or by a newer handle); its "
                    "uncommitted rows were discarded. Reopen the channel and resume after "
                    "the latest committed offset token"
                )
                self.budget.release(self.table.discard_channel(channel))  # arrived meanwhile
        log.warning("channel(s) %s of %s were fenced by a newer open; %d buffered row(s) "
                    "discarded", ", ".join(fenced.channels), self.table.info.full_name,
                    dropped, extra={"table": self.table.info.full_name})  # fmt: skip
        return kept

    async def flush_once(self) -> None:
        """Commit every pending batch of the table in one Delta commit (steps in TableWriter).

        Every batch taken ends one way: committed and acknowledged; found committed by an
        attempt whose answer was lost, and acknowledged; discarded with its channel
        invalidated (fenced, unfit, replaced) and its room freed; or, when the attempt
        fails or is cancelled, put back in front of the buffer for the next one.
        """
        table = self.table
        asked = time.monotonic()
        async with table.lock:
            started = time.monotonic()
            batches = self._take()
            timings = {"lock": started - asked}
            try:
                if batches and self._unanswered:
                    batches = await self._drop_landed(batches)
            except BaseException:
                table.put_back(batches)
                raise
            committed = await self._commit(batches, timings)
            if committed is None:
                return
            batches, progress, record = committed
            if record.rows:
                table.ingest_files += 1
                table.ingest_bytes += record.file_bytes
            self._acknowledge(progress)  # Step 5
            self.budget.release(sum(b.nbytes for b in batches))
            self._observe(batches, record, started, timings)

    async def _commit(
        self, batches: list[PendingBatch], timings: dict[str, float]
    ) -> tuple[list[PendingBatch], list[ChannelProgress], CommitRecord] | None:
        """Steps 1 to 4 for these batches, less those of channels an open elsewhere fenced
        meanwhile. Returns the batches committed, their channels' positions and the
        commit; None if none was left to commit. On failure (or cancellation) the batches
        not discarded are put back before it raises."""
        try:
            while batches:
                progress = _progress(batches)
                parts = [b.data for b in batches if b.data is not None and b.rows]
                try:
                    record = await asyncio.to_thread(self._write, parts, progress, timings)
                except ChannelFencedError as fenced:
                    # An open elsewhere fenced some channels (nothing was committed): their
                    # handles are stale. The others commit now, without them.
                    batches = self._drop_fenced(batches, fenced)
                    continue
                except BaseException:
                    self._unanswered = self.unindexed = True  # it may have committed
                    raise
                return batches, progress, record
            if self.unindexed:
                await asyncio.to_thread(self.reindex)
            return None
        except BaseException:
            self.table.put_back(batches)
            raise

    def _observe(
        self, batches: list[PendingBatch], record: CommitRecord, started: float,
        timings: dict[str, float],
    ) -> None:  # fmt: skip
        """Metrics of a committed flush (its phases too), and the flush-time estimate."""
        table = self.table
        now = time.monotonic()
        took = now - started
        name = table.info.full_name
        self.metrics.flush_duration.labels(name).observe(took)
        self.metrics.rows_committed.labels(name).inc(record.rows)
        latency = self.metrics.commit_latency.labels(name)
        phase = self.metrics.flush_phase
        waited, in_server = phase.labels("lag_wait"), phase.labels("in_server")
        for batch in batches:
            latency.observe(now - batch.arrived)
            in_server.observe(now - batch.arrived)
            waited.observe(max(0.0, started - batch.arrived))
        timings["flush"] = took
        for key, seconds in timings.items():
            phase.labels(key).observe(seconds)
        self.flush_estimate = 0.7 * self.flush_estimate + 0.3 * took
        if self.on_flush is not None:
            self.on_flush(table, record.rows, took)
