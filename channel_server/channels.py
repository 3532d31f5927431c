"""Channels: their lifecycle, inserts into per-table buffers, commits waited for, and
the flushers that commit the buffers (one per table with live channels).

Every rule of the commit protocol lives here, in :mod:`channel_server.flusher` and in
:mod:`flush`; the HTTP layer (:mod:`channel_server.channels_api`) only parses and answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from catalog import Catalog, ChannelRecord, CommitRecord, TableInfo
from channel_server.config import ServerConfig
from channel_server.flusher import TableFlusher
from channel_server.metrics import Metrics
from channel_server.state import BufferBudget, ChannelState, PendingBatch, TableState
from channel_server.tables import MAX_REMEMBERED, DynamicTableReadOnlyError, Tables
from flush.commit import ChannelFencedError
from flush.tables import INGEST_DIR, drop_table, live_files
from ingest_sdk import ChannelStatus, OnErrorOption
from ingest_sdk.errors import (
    BackpressureError,
    ChannelInvalidatedError,
    ChannelNotFoundError,
    InvalidRequestError,
    SchemaError,
    TableNotFoundError,
)
from ingest_sdk.schema import check_object_name
from ingest_sdk.wire import pack_txn_version

__all__ = ["Channels", "InsertOutcome", "intermediate_files"]

log = logging.getLogger(__name__)

MAX_CHANNEL_NAME = 512
#: Called after each flush of a table: (its state, rows committed, seconds taken).
OnFlush = Callable[[TableState, int, float], None]


@dataclass(frozen=True, slots=True)
class InsertOutcome:
    accepted_rows: int
    duplicate: bool


def intermediate_files(uri: str) -> tuple[int, int]:
    """How many intermediate files (and bytes) the table's current version holds."""
    files = live_files(DeltaTable(uri))
    mine = [f["size_bytes"] for f in files if f["path"].startswith(INGEST_DIR + "/")]
    return len(mine), sum(mine)


def _channel_name(name: Any) -> str:
    if not isinstance(name, str):
        raise InvalidRequestError(f"a channel name must be a string, got {name!r}")
    try:
        return check_object_name(name, "a channel name", MAX_CHANNEL_NAME)
    except SchemaError as exc:
        raise InvalidRequestError(str(exc)) from exc


class Channels:
    """The open channels of this service, their tables' buffers and flushers."""

    def __init__(
        self,
        config: ServerConfig,
        catalog: Catalog,
        tables: Tables,
        metrics: Metrics,
        on_flush: OnFlush | None = None,
        server: str = "",
    ) -> None:
        self.config = config
        #: How the catalog names this server as a channel's (its advertised URL or id).
        self.server = server
        self.catalog = catalog
        self.tables = tables
        self.metrics = metrics
        self.budget = BufferBudget(config.limits.max_buffer_bytes)
        self._on_flush = on_flush
        self._live: dict[int, TableState] = {}
        self._flushers: dict[int, TableFlusher] = {}
        self._dropped_channels: set[tuple[int, str]] = set()
        self._watch_metrics()

    def _watch_metrics(self) -> None:
        watch, budget = self.metrics.watch, self.budget
        watch("ingest_buffer_bytes_used", "Bytes of rows buffered in the server now.",
              lambda: budget.used)  # fmt: skip
        watch("ingest_buffer_bytes_peak", "Most bytes of rows ever buffered at once.",
              lambda: budget.peak)  # fmt: skip
        watch("ingest_buffer_bytes_limit", "Buffer limit; past it inserts get 429.",
              lambda: budget.limit)  # fmt: skip
        watch("ingest_producers_waiting",
              "Producers refused for lack of buffer room, waiting their turn.",
              lambda: budget.waiting)  # fmt: skip
        watch("ingest_open_channels", "Channel handles open on this server.",
              lambda: sum(c.valid for t in self._live.values()
                          for c in t.channels.values()))  # fmt: skip

    # -- tables' live state -----------------------------------------------------------------

    @property
    def live_tables(self) -> Mapping[int, TableState]:
        """The tables with live state here (a channel opened since start-up), by id."""
        return self._live

    def table_state(self, info: TableInfo) -> TableState:
        """The live state of a table (its buffer and flusher), started on first use."""
        table = self._live.get(info.id)
        if table is None:
            table = self._live[info.id] = TableState(info)
            table.ingest_files, table.ingest_bytes = intermediate_files(info.uri)
            flusher = TableFlusher(
                table,
                self.catalog,
                self.budget,
                self.config.flush.retry_initial,
                self.config.flush.retry_max,
                self.metrics,
                on_flush=self._on_flush,
                on_dropped=self._dropped_elsewhere,
            )
            self._flushers[info.id] = flusher
            flusher.start()
        return table

    async def stop_table(self, table_id: int) -> None:
        """Invalidate a dropped table's handles, discard its buffer, stop its flusher."""
        table = self._live.pop(table_id, None)
        if table is None:
            return
        await self._close_table(table, "the table was dropped")
        flusher = self._flushers.pop(table_id, None)
        if flusher is not None:
            await flusher.stop()

    async def _close_table(self, table: TableState, reason: str) -> None:
        """Invalidate every handle of a dropped table and free everything it buffered."""
        async with table.lock:  # no flush of it in flight
            table.dropped = True
            for channel in table.channels.values():
                if channel.valid:
                    channel.invalidate(reason)
            self.budget.release(sum(batch.nbytes for batch in table.take_pending()))

    async def _dropped_elsewhere(self, table: TableState) -> None:
        """A table found gone from the catalog while this service served it: dropped on
        another service sharing the catalog, or by SQL. Its handles are invalidated (the
        producer's next call and its waits hear that the table was dropped), its buffer
        is freed, and this service forgets it. Called by its flusher, whose task ends."""
        table_id = table.info.id
        if self._live.get(table_id) is table:
            del self._live[table_id]
            self._flushers.pop(table_id, None)
        self.tables.forget_dropped(table.info)
        await asyncio.to_thread(self._purge_late_commit, table.info)
        await self._close_table(
            table,
            f"its table {table.info.full_name} was dropped (on another service or by SQL), "
            "and the rows it had not committed were discarded; create the table again and "
            "open the channel again",
        )

    def _purge_late_commit(self, info: TableInfo) -> None:
        """Delete the folder of a table dropped and purged while a commit of its was in
        flight here (that commit may have landed after the purge); nothing while the
        catalog keeps the dropped table (for its change streams) or if it cannot say."""
        try:
            if any(kept.id == info.id for kept, _ in self.catalog.list_dropped_tables()):
                return
            if drop_table(info.uri, self.config.warehouse):
                log.info("deleted what a late commit left of the dropped table %s at %s",
                         info.full_name, info.uri)  # fmt: skip
        except Exception:
            log.exception("cannot purge the dropped table %s at %s", info.full_name, info.uri)

    async def _forget_replaced(self, info: TableInfo) -> None:
        """Forget the live state of a table of ``info``'s name that is no longer in the
        catalog (replaced behind this service by ``info``): its flusher learns that only
        at its next failed flush, and an idle one never would."""
        for stale in [t for t in self._live.values() if t.info.full_name == info.full_name]:
            if stale.info.id == info.id:
                continue
            if await asyncio.to_thread(self.catalog.get_table_by_id, stale.info.id) is None:
                flusher = self._flushers.pop(stale.info.id, None)
                await self._dropped_elsewhere(stale)
                if flusher is not None:
                    await flusher.stop()

    async def stop(self) -> None:
        """Flush what is buffered (best effort), then stop every flusher."""
        for table_id, flusher in list(self._flushers.items()):
            table = self._live[table_id]
            if table.pending:
                try:
                    await asyncio.wait_for(flusher.flush_once(), timeout=10)
                except Exception:
                    log.exception("final flush of %s failed", table.info.full_name)
            await flusher.stop()

    def remove_inactive(self) -> int:
        """Forget channels idle past the retention period (none open here)."""
        before = time.time() - self.config.channel_retention_seconds
        open_now = {
            (table.info.id, name)
            for table in self._live.values()
            for name, channel in table.channels.items()
            if channel.valid and channel.last_activity >= before
        }
        return self.catalog.remove_inactive_channels(before, open_now)

    # -- channels --------------------------------------------------------------------------

    async def open(
        self,
        table_name: str,
        channel_name: str,
        *,
        max_client_lag: float | None = None,
        on_error: OnErrorOption = OnErrorOption.ABORT,
        default_timezone: str = "America/Los_Angeles",
    ) -> ChannelState:
        """Open or reopen a channel: a new durable generation that invalidates older handles
        and discards what they had buffered here, made a fence in the table's log before
        the answer.

        Steps, under the table's lock (no flush of the table in flight here):

        1. The catalog bumps the generation (above any generation the log holds).
        2. An older handle open here is invalidated and its buffered rows discarded.
        3. The fence: one Delta commit without files holding the channel's app
           transaction at ``(generation, 0)`` and the channel's token as the log holds it
           at the version the fence lands on (:meth:`flush.TableWriter.fence`). From then
           on a commit of any older handle of the channel, on any server sharing the
           warehouse, is refused, and that server invalidates the handle and discards its
           rows. The catalog records the fence as it records a flush.
        4. The answer: the new handle with that token (None for a channel the catalog did
           not hold: new, dropped or retired).

        Raises:
            DynamicTableReadOnlyError: the table is dynamic (only its refreshes write it).
            ChannelInvalidatedError: an open of the channel on another server fenced a
                newer generation while this one ran (the newest open wins).
        """
        name = _channel_name(channel_name)
        info, dynamic = await self.tables.to_write(table_name)
        await self._forget_replaced(info)
        if dynamic is not None:  # before its table state: no flusher for it either
            sources = await asyncio.to_thread(self.tables.base_sources, dynamic)
            raise DynamicTableReadOnlyError(
                f"{info.full_name} is a dynamic table: only its refreshes write it, so no "
                "channel can be opened on it, and nothing was changed. Insert the rows into "
                f"the tables its query reads{sources} and refresh it "
                f"(ALTER DYNAMIC TABLE {info.full_name} REFRESH through POST /v1/sql), or open "
                "the channel on a table that is not dynamic"
            )
        table = self.table_state(info)
        lag = (
            max_client_lag
            if max_client_lag is not None
            else self.config.flush.default_max_client_lag
        )
        async with table.lock:  # never while a flush of this table is in flight
            flusher = self._flushers[table.info.id]
            record, known = await asyncio.to_thread(self._bump, flusher, name)  # Step 1
            old = table.channels.get(name)
            if old is not None:  # Step 2
                old.invalidate(
                    f"channel {name} was reopened (generation {record.generation}); its "
                    "uncommitted rows were discarded"
                )
                self.budget.release(table.discard_channel(old))
            fence = await asyncio.to_thread(self._fence, flusher, record, known)  # Step 3
            channel = ChannelState(
                table=table,
                name=name,
                generation=record.generation,
                committed_token=fence.channels[0].offset_token,
                rows_committed=record.rows_committed,
                max_client_lag=lag,
                on_error=on_error,
                default_timezone=default_timezone,
            )
            table.channels[name] = channel
        self.metrics.channels_opened.labels(table.info.full_name).inc()
        log.info("opened channel %s on %s (generation %d)", name, table.info.full_name,
                 channel.generation, extra={"table": table.info.full_name, "channel": name,
                                            "generation": channel.generation})  # fmt: skip
        return channel

    def _bump(self, flusher: TableFlusher, name: str) -> tuple[ChannelRecord, bool]:
        """Step 1 of :meth:`open` (a worker thread): the catalog's new generation, and
        whether the catalog held the channel before (else its token starts at None)."""
        table_id = flusher.table.info.id
        if flusher.unindexed:  # the catalog's token is the fallback: bring it up to date
            flusher.reindex()
        known = self.catalog.get_channel(table_id, name) is not None
        logged = flusher.writer.committed_generation(name)
        record = self.catalog.open_channel(table_id, name, logged + 1, self.server)
        try:
            pack_txn_version(record.generation, 0)
        except ValueError as exc:
            raise InvalidRequestError(
                f"channel {name} cannot be opened again: {exc}. Dropping it does not help "
                "(the table's log keeps its generation); use a channel of another name"
            ) from exc
        return record, known

    @staticmethod
    def _fence(flusher: TableFlusher, record: ChannelRecord, known: bool) -> CommitRecord:
        """Step 3 of :meth:`open` (a worker thread): the fence commit."""
        try:
            return flusher.fence(record.name, record.generation, known, record.offset_token)
        except ChannelFencedError as exc:
            raise ChannelInvalidatedError(
                f"channel {record.name} on {flusher.table.info.full_name} was opened again on "
                f"another server while this open (generation {record.generation}) ran; the "
                "newest open wins. Open it again if this producer should own it"
            ) from exc

    async def lookup(self, table_name: str, channel_name: str, generation: int) -> ChannelState:
        """:meth:`state`, for the event loop: when the table's definition is not remembered
        or the channel is not open here, its catalog reads run in a worker thread (the
        loop never waits for the catalog)."""
        info = self.tables.remembered(table_name)
        table = self._live.get(info.id) if info is not None else None
        if table is None or channel_name not in table.channels:
            return await asyncio.to_thread(self.state, table_name, channel_name, generation)
        return self.state(table_name, channel_name, generation)

    def state(self, table_name: str, channel_name: str, generation: int) -> ChannelState:
        """The live state of a handle, or the error that says why it has none.

        Raises:
            TableNotFoundError: the table does not exist (and was not dropped here).
            ChannelNotFoundError: the channel was never opened on the table.
            ChannelInvalidatedError: the handle was replaced (reopen, drop, restart, close).
        """
        try:
            info = self.tables.cached(table_name)  # no catalog read per batch
        except TableNotFoundError as exc:
            if self.tables.was_dropped(table_name):
                raise ChannelInvalidatedError(
                    f"channel {channel_name}: its table {table_name} was dropped; recreate the "
                    "table and open the channel again"
                ) from exc
            raise
        table = self._live.get(info.id)
        channel = table.channels.get(channel_name) if table else None
        if channel is None:
            if (info.id, channel_name) in self._dropped_channels:
                raise ChannelInvalidatedError(
                    f"channel {channel_name} on {info.full_name} was dropped; open it again"
                )
            record = self.catalog.get_channel(info.id, channel_name)
            if record is not None and record.server not in ("", self.server):
                raise ChannelInvalidatedError(
                    f"channel {channel_name} on {info.full_name} is open on the server "
                    f"{record.server} (its newest open): send its calls there, or reopen it "
                    "here and resume after the latest committed offset token"
                )
            if record is not None:
                reason = "it is not open on this server (the server restarted since)"
            elif self.tables.dropped_here(info):
                reason = "its table was dropped and created again since this handle was opened"
            else:
                raise ChannelNotFoundError(
                    f"channel {channel_name} does not exist on {info.full_name}; open it "
                    "before inserting"
                )
            raise ChannelInvalidatedError(
                f"channel {channel_name} on {info.full_name}: {reason}; reopen it and resume "
                "after the latest committed offset token"
            )
        if generation > channel.generation:
            raise ChannelInvalidatedError(
                f"channel {channel_name} on {info.full_name}: this handle's generation "
                f"{generation} was never opened on this server (its open generation is "
                f"{channel.generation}); the handle comes from another server or an older copy "
                "of the warehouse. Reopen the channel"
            )
        if channel.generation != generation:
            raise ChannelInvalidatedError(
                f"channel {channel_name} was reopened (generation {channel.generation}, this "
                f"handle has {generation}); its uncommitted rows were discarded. Reopen the "
                "channel and resume after the latest committed offset token"
            )
        if not channel.valid:
            raise ChannelInvalidatedError(f"channel {channel_name}: {channel.invalid_reason}")
        return channel

    def insert(
        self,
        table_name: str,
        channel_name: str,
        generation: int,
        batch_seq: int,
        data: pa.Table | None,
        offset_token: str | None,
        held: int | None = None,
    ) -> InsertOutcome:
        """Buffer one checked batch (or a token-only batch) of a channel generation.

        A ``batch_seq`` at or below the newest accepted one is a retry: acknowledged,
        ignored.

        Args:
            held: bytes already taken from the buffer budget by :meth:`admit` for this
                request; on success they become the batch's own (else the caller gives
                them back). None: take the batch's size now.
        """
        channel = self.state(table_name, channel_name, generation)
        if batch_seq <= channel.last_seq:
            self.metrics.duplicate_batches.labels(channel.table.info.full_name).inc()
            if held:
                self.budget.release(held)
            return InsertOutcome(0, duplicate=True)
        rows = data.num_rows if data is not None else 0
        nbytes = data.nbytes if data is not None else 0
        if held is None:
            self.admit(channel, nbytes)
        else:
            self.budget.settle(held, nbytes)
        channel.last_seq = batch_seq
        channel.last_activity = time.time()
        channel.table.add(
            PendingBatch(
                channel=channel,
                generation=generation,
                batch_seq=batch_seq,
                data=data,
                rows=rows,
                nbytes=nbytes,
                offset_token=offset_token,
                deadline=time.monotonic() + channel.max_client_lag,
            ),
            self.config.flush.max_bytes,
        )
        table_label = channel.table.info.full_name
        self.metrics.rows_inserted.labels(table_label).inc(rows)
        self.metrics.bytes_inserted.labels(table_label).inc(nbytes)
        self.metrics.batches_inserted.labels(table_label).inc()
        return InsertOutcome(rows, duplicate=False)

    def admit(self, channel: ChannelState, nbytes: int) -> int:
        """Take ``nbytes`` of buffer room for a channel's next batch, fairly among the
        producers waiting for room, before its body is read (a refused body costs no
        memory). Returns the bytes taken.

        Raises:
            BackpressureError: no room for this producer now (429 with Retry-After).
        """
        try:
            self.budget.reserve(
                nbytes,
                retry_after=min(1.0, channel.max_client_lag),
                who=(channel.table.info.id, channel.name),
            )
        except BackpressureError:
            # The buffer is full: flush now rather than at the batches' deadlines, so room
            # comes back as fast as commits can make it.
            for table in self._live.values():
                if table.pending and not table.flush_now:
                    table.request_flush()
            raise
        return nbytes

    @property
    def request_bytes_hint(self) -> int:
        """The largest request a client should build: an eighth of the buffer (so several
        producers fit at once and take turns), within the request size limit."""
        limits = self.config.limits
        return max(64 * 1024, min(limits.max_request_bytes, limits.max_buffer_bytes // 8))

    async def wait_for_commit(
        self, table_name: str, channel_name: str, generation: int, batch_seq: int, timeout: float
    ) -> ChannelState:
        """Wait until the channel's batches up to ``batch_seq`` are committed (or timeout)."""
        channel = await self.lookup(table_name, channel_name, generation)
        if batch_seq > channel.last_seq:
            raise InvalidRequestError(
                f"batch {batch_seq} was never received on channel {channel_name} (newest is "
                f"{channel.last_seq})"
            )
        await channel.wait_committed(batch_seq, min(timeout, self.config.limits.max_wait_seconds))
        if not channel.valid:
            raise ChannelInvalidatedError(f"channel {channel_name}: {channel.invalid_reason}")
        return channel

    async def close(
        self, table_name: str, channel_name: str, generation: int, timeout: float
    ) -> ChannelState:
        """Flush now, wait until everything the handle sent is committed, then close it.

        Raises:
            ChannelInvalidatedError: the handle was replaced before its rows committed
                (they were discarded).
        """
        channel = await self.lookup(table_name, channel_name, generation)
        if channel.committed_seq < channel.last_seq:
            # Only when something of this handle waits: a needless request would flush
            # other channels' batches early.
            channel.table.request_flush()
        await channel.wait_committed(
            channel.last_seq, min(timeout, self.config.limits.max_wait_seconds)
        )
        if channel.committed_seq >= channel.last_seq and channel.valid:
            channel.invalidate(f"channel {channel_name} was closed")
        elif not channel.valid and channel.committed_seq < channel.last_seq:
            # Replaced while its rows waited (a reopen here, or a fence of an open on
            # another server): they were discarded, never committed.
            raise ChannelInvalidatedError(f"channel {channel_name}: {channel.invalid_reason}")
        return channel

    async def drop(self, table_name: str, channel_name: str) -> bool:
        info = await asyncio.to_thread(self.tables.describe, table_name)
        table = self._live.get(info.id)
        if table is not None:
            async with table.lock:
                channel = table.channels.pop(channel_name, None)
                if channel is not None:
                    channel.invalidate(f"channel {channel_name} was dropped")
                    self.budget.release(table.discard_channel(channel))
        dropped = await asyncio.to_thread(self.catalog.drop_channel, info.id, channel_name)
        if dropped:
            if len(self._dropped_channels) > MAX_REMEMBERED:
                self._dropped_channels.clear()
            self._dropped_channels.add((info.id, channel_name))
        else:
            raise ChannelNotFoundError(f"channel {channel_name} does not exist on {info.full_name}")
        return True

    def status(
        self, table_name: str, channel_name: str, generation: int | None = None
    ) -> ChannelStatus:
        """The committed token of a channel, with an explicit status."""
        try:
            info = self.tables.describe(table_name)
        except TableNotFoundError as exc:
            return ChannelStatus(table_name, channel_name, "TABLE_NOT_FOUND", message=str(exc))
        record = self.catalog.get_channel(info.id, channel_name)
        if record is None:
            return ChannelStatus(
                info.full_name, channel_name, "CHANNEL_NOT_FOUND",
                message=f"channel {channel_name} does not exist on {info.full_name}",
            )  # fmt: skip
        table = self._live.get(info.id)
        live = table.channels.get(channel_name) if table else None
        # A valid handle here is the channel's only writer (older ones are fenced), so its
        # token is the newest; a replaced one's may be behind another server's commits.
        token = live.committed_token if live is not None and live.valid else record.offset_token
        ok = ChannelStatus(
            table=info.full_name,
            channel=channel_name,
            status="OK",
            offset_token=token,
            generation=record.generation,
            committed_batch_seq=live.committed_seq if live else None,
        )
        stale = live is None or live.generation != generation or not live.valid
        if generation is not None and stale:
            reason = (
                live.invalid_reason
                if live is not None and live.generation == generation
                else f"generation {generation} is not the open generation"
                f" ({record.generation if live else 'none open on this server'})"
            )
            return replace(ok, status="INVALIDATED", message=reason)
        if table is not None and table.flush_error:
            return replace(
                ok, status="FLUSH_FAILING", message=f"flush is being retried: {table.flush_error}"
            )
        return ok

    def show(self, table_name: str | None = None) -> list[dict[str, Any]]:
        """SHOW CHANNELS: every channel in the catalog with its live status."""
        tables = {info.id: info for info in self.tables.all()}
        if table_name is not None:
            wanted = self.tables.describe(table_name)
            records: list[ChannelRecord] = self.catalog.list_channels(wanted.id)
        else:
            records = self.catalog.list_channels()
        result = []
        for record in records:
            info = tables.get(record.table_id)
            if info is None:
                continue
            table = self._live.get(record.table_id)
            live = table.channels.get(record.name) if table else None
            current = live if live is not None and live.valid else None
            if current is not None:
                status = "FLUSH_FAILING" if table and table.flush_error else "OPEN"
            else:
                status = "CLOSED"
            result.append(
                {
                    "table": info.full_name,
                    "channel": record.name,
                    "generation": record.generation,
                    "offset_token": current.committed_token if current else record.offset_token,
                    "rows_committed": current.rows_committed if current else record.rows_committed,
                    "last_activity": max(record.last_activity, live.last_activity if live else 0),
                    "status": status,
                    "server": record.server or None,
                }
            )
        return result
