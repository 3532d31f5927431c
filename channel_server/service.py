"""The ingest service: tables, channel lifecycle, inserts, commits and recovery.

The HTTP layer (:mod:`channel_server.handlers`) only parses and answers; every
rule of the commit protocol lives here and in :mod:`flush`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from catalog import Catalog, ChannelRecord, DynamicTableRecord, TableInfo, did_you_mean
from catalog import TableBusyError as CatalogTableBusy
from channel_server.compaction_worker import CompactionWorker, CompactionWorkerDied
from channel_server.config import ServerConfig
from channel_server.flusher import TableFlusher
from channel_server.metrics import Metrics
from channel_server.sql_service import SqlService
from channel_server.state import BufferBudget, ChannelState, PendingBatch, TableState
from flush import create_catalog_table, purge_dropped, replay_commits
from flush.tables import INGEST_DIR, live_files
from ingest_sdk import ChannelStatus, OnErrorOption, TableSchema
from ingest_sdk.errors import (
    BackpressureError,
    ChannelInvalidatedError,
    ChannelNotFoundError,
    InvalidRequestError,
    SchemaError,
    ServiceError,
    TableBusyError,
    TableNotFoundError,
)
from ingest_sdk.schema import check_object_name, split_table_name
from pipelines.transactions.commit import busy_message

__all__ = ["DynamicTableReadOnlyError", "IngestService", "InsertOutcome"]

log = logging.getLogger(__name__)

MAX_CHANNEL_NAME = 512


class DynamicTableReadOnlyError(ServiceError):
    """A channel open or a table drop named a dynamic table (409): only its refreshes
    write it, and only ``DROP DYNAMIC TABLE`` drops it, as in SQL (``check_writable`` of
    :mod:`pipelines.sql.binding` answers the same code). Nothing was changed.

    The SDK has no class for this code yet (it belongs in :mod:`ingest_sdk.errors`'
    ``ERRORS_BY_CODE``); until it does, the SDK raises the 4xx fallback,
    :class:`InvalidRequestError`, with this message.
    """

    status, code = 409, "DYNAMIC_TABLE_READ_ONLY"


@dataclass(frozen=True, slots=True)
class InsertOutcome:
    accepted_rows: int
    duplicate: bool


def _intermediate_files(uri: str) -> tuple[int, int]:
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


class IngestService:
    """Owns the catalog, the open tables and their flushers."""

    def __init__(self, config: ServerConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self.budget = BufferBudget(config.limits.max_buffer_bytes)
        self.metrics = Metrics()
        self.metrics.watch("ingest_buffer_bytes_used", "Bytes of rows buffered in the server now.",
                           lambda: self.budget.used)  # fmt: skip
        self.metrics.watch("ingest_buffer_bytes_peak", "Most bytes of rows ever buffered at once.",
                           lambda: self.budget.peak)  # fmt: skip
        self.metrics.watch("ingest_buffer_bytes_limit", "Buffer limit; past it inserts get 429.",
                           lambda: self.budget.limit)  # fmt: skip
        self.metrics.watch("ingest_producers_waiting",
                           "Producers refused for lack of buffer room, waiting their turn.",
                           lambda: self.budget.waiting)  # fmt: skip
        self.metrics.watch("ingest_open_channels", "Channel handles open on this server.",
                           lambda: sum(c.valid for t in self._tables.values()
                                       for c in t.channels.values()))  # fmt: skip
        self._tables: dict[int, TableState] = {}
        # Table definitions by name: every insert looks its table up, and a definition only
        # changes by create/drop through this service.
        self._definitions: dict[str, TableInfo] = {}
        # What this process dropped, so a stale handle hears "dropped" only when it was.
        self._dropped: set[tuple[str, str, str]] = set()
        self._dropped_channels: set[tuple[int, str]] = set()
        self._flushers: dict[int, TableFlusher] = {}
        self.compaction_worker = CompactionWorker(
            self._compaction_command(),
            Path(config.warehouse) / "_logs" / "compaction-worker.log",
            config.compaction.worker_idle_seconds,
            on_death=self.metrics.worker_restarts.inc,
        )
        #: ``POST /v1/sql``: sessions, and statements run in the same worker.
        journal = Path(config.warehouse) / "_service" / "sql_transactions.json"
        self.sql = SqlService(self.compaction_worker, config.sql, self.metrics, journal)
        sql_keeps_alive = self.compaction_worker.keep_alive
        self.compaction_worker.keep_alive = lambda: sql_keeps_alive() or self.has_schedules()
        self.started_at = time.time()

    # -- lifecycle -------------------------------------------------------------------------

    def recover(self) -> int:
        """Replay Delta commits the catalog has not recorded (crash after commit). Returns
        how many were replayed."""
        replayed = 0
        for info in self.catalog.list_tables():
            if not (Path(info.uri) / "_delta_log").exists():
                log.error("table %s has no Delta log at %s; skipping", info.full_name, info.uri)
                continue
            for record in replay_commits(self.catalog, info.id):
                replayed += 1
                log.info("recovered commit %d of %s", record.version, info.full_name,
                         extra={"table": info.full_name, "version": record.version})  # fmt: skip
        return replayed

    # -- dynamic tables ------------------------------------------------------------------

    def has_schedules(self) -> bool:
        """Whether a dynamic table refreshes on a schedule (the worker's refresh loop must
        run): one active, with a time lag or initialized on schedule."""
        if not self.config.refresh_scheduler:
            return False
        return any(dt.state == "ACTIVE" for dt in self.catalog.list_dynamic_tables())

    async def keep_refreshing(self) -> None:
        """Start the worker (and with it the refresh loop) if dynamic tables need it and
        it is not running: after a restart of the service, or the worker's death."""
        if self.compaction_worker.pid is None and await asyncio.to_thread(self.has_schedules):
            await self.compaction_worker.request({"ping": True})

    # -- compaction ----------------------------------------------------------------------

    def _after_flush(self, table: TableState, rows: int, seconds: float) -> None:
        trigger = self.config.compaction
        if trigger.enabled and (
            table.ingest_files > trigger.max_intermediate_files
            or table.ingest_bytes > trigger.max_intermediate_bytes
        ):
            self.start_compaction(table)

    def start_compaction(self, table: TableState) -> bool:
        """Queue a compaction of a table in the worker unless one is queued or running."""
        if table.compaction is not None and not table.compaction.done():
            return False
        table.compaction = asyncio.create_task(
            self._run_compaction(table), name=f"compact {table.info.full_name}"
        )
        return True

    def _compaction_command(self) -> list[str]:
        """The worker's command line, run at its niceness through ``nice(1)`` (a POSIX
        tool; without it the worker runs at the service's priority)."""
        trigger = self.config.compaction
        nice = shutil.which("nice") if trigger.worker_nice else None
        return [
            *([nice, "-n", str(trigger.worker_nice)] if nice else []),
            sys.executable, "-m", "pipelines.worker", "--serve",
            "--warehouse", str(self.config.warehouse),
            "--catalog", str(self.config.catalog_file),
            "--target-file-mb", str(trigger.target_file_mb),
            *(["--spark-master", trigger.spark_master] if trigger.spark_master else []),
            *(["--refresh-scheduler"] if self.config.refresh_scheduler else []),
            *trigger.extra_args,
        ]  # fmt: skip

    async def _run_compaction(self, table: TableState) -> None:
        name = table.info.full_name
        log.info("compacting %s", name)
        try:
            record = await self.compaction_worker.compact(name)
        except CompactionWorkerDied as exc:
            log.error("compaction of %s failed: %s", name, exc, extra={"table": name})
            self.metrics.compactions.labels(name, "FAILED").inc()
        else:
            self.metrics.compactions.labels(name, str(record.get("status"))).inc()
            if record.get("status") == "FAILED":
                log.error("compaction of %s failed: %s (log %s)", name, record.get("error"),
                          self.compaction_worker.log_path, extra={"table": name})  # fmt: skip
            else:
                log.info("compaction of %s: %s, %s -> %s files", name, record.get("status"),
                         record.get("files_in"), record.get("files_out"),
                         extra={"table": name, "run": record})  # fmt: skip
        table.ingest_files, table.ingest_bytes = await asyncio.to_thread(
            _intermediate_files, table.info.uri
        )

    def compact_now(self, table_name: str) -> tuple[TableInfo, bool]:
        """Start a background compaction of a table; False if one is already running."""
        info = self.describe_table(table_name)
        return info, self.start_compaction(self._table_state(info))

    def set_clustering(self, table_name: str, columns: list[str]) -> TableInfo:
        """Columns compaction sorts by (empty: ingestion order); must be table columns."""
        info = self.describe_table(table_name)
        resolved = []
        for name in columns:
            column = info.schema.find(name) if isinstance(name, str) else None
            if column is None:
                raise InvalidRequestError(
                    f"clustering column {name!r} is not a column of {info.full_name} "
                    f"(columns: {', '.join(c.name for c in info.schema)})"
                )
            resolved.append(column.name)
        self.catalog.set_clustering(info.id, tuple(resolved))
        self._definitions.clear()
        return self.describe_table(table_name)

    def migrations(self, table_name: str) -> list[dict[str, Any]]:
        return self.catalog.list_migrations(self.describe_table(table_name).id)

    async def stop(self) -> None:
        """Flush what is buffered (best effort), then stop every flusher."""
        for table_id, flusher in list(self._flushers.items()):
            table = self._tables[table_id]
            if table.pending:
                try:
                    await asyncio.wait_for(flusher.flush_once(), timeout=10)
                except Exception:
                    log.exception("final flush of %s failed", table.info.full_name)
            await flusher.stop()
            if table.compaction is not None and not table.compaction.done():
                table.compaction.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await table.compaction
        await self.compaction_worker.stop()

    def remove_inactive_channels(self) -> int:
        before = time.time() - self.config.channel_retention_seconds
        open_now = {
            (table.info.id, name)
            for table in self._tables.values()
            for name, channel in table.channels.items()
            if channel.valid and channel.last_activity >= before
        }
        return self.catalog.remove_inactive_channels(before, open_now)

    # -- tables ----------------------------------------------------------------------------

    def create_table(
        self, name: str, columns: dict[str, str], if_not_exists: bool = False
    ) -> tuple[TableInfo, bool]:
        """Create a table (and its database and schema). Returns the table and whether it
        was created.

        Nothing is ever deleted here (:func:`flush.create_catalog_table`).
        """
        database, schema_name, table = split_table_name(name)
        info, created = create_catalog_table(
            self.catalog,
            self.config.warehouse,
            database,
            schema_name,
            table,
            TableSchema.parse(columns),
            if_not_exists,
        )
        if not created:
            return info, False
        log.info("created table %s", info.full_name, extra={"table": info.full_name,
                 "location": info.uri})  # fmt: skip
        return info, True

    def describe_table(self, name: str) -> TableInfo:
        info = self._definitions.get(name)
        if info is None:
            parts = split_table_name(name)
            try:
                info = self.catalog.get_table(*parts)
            except TableNotFoundError as exc:
                hint = did_you_mean(self.catalog, *parts, ["table"])
                if not hint:
                    raise
                text = str(exc).replace(" does not exist", f" does not exist{hint}", 1)
                raise TableNotFoundError(text) from exc
            if len(self._definitions) > 10_000:
                self._definitions.clear()  # bounded: names are client-chosen spellings
            self._definitions[name] = info
        return info

    def list_tables(self) -> list[TableInfo]:
        return self.catalog.list_tables()

    async def _table_to_write(self, name: str) -> tuple[TableInfo, DynamicTableRecord | None]:
        """The table ``name`` names now, for a call that writes it, with its dynamic-table
        definition (None: not a dynamic table).

        Resolved in the catalog, not from the cached definitions: SQL run by the worker
        may have dropped or replaced the table since it was cached. A table is dynamic
        from its creation on (ids are never reused), so a check by id holds for good. The
        definition is read in a thread: the catalog's read of it is a write transaction,
        which waits for other writers.

        Raises:
            TableNotFoundError: no such table.
        """
        cached = self._definitions.pop(name, None)
        info = self.describe_table(name)
        if cached is not None and cached.id != info.id:
            self._definitions.clear()  # replaced behind this service: stale in every spelling
            self._definitions[name] = info
        return info, await asyncio.to_thread(self.catalog.get_dynamic_table, info.id)

    def _base_sources(self, dynamic: DynamicTableRecord) -> str:
        """The tables that are not dynamic among those a dynamic table's query read when it
        was defined, as ``" (A, B)"``: rows go there, and a refresh brings them over."""
        names = [
            source.name
            for source in dynamic.sources
            if source.kind == "table" and self.catalog.get_dynamic_table(source.source_id) is None
        ]
        return f" ({', '.join(names)})" if names else ""

    def _check_not_busy(self, info: TableInfo) -> None:
        if holders := self.catalog.commits_holding([info.id]):
            busy = CatalogTableBusy([info.id], holders)
            raise TableBusyError(busy_message(self.catalog, busy))

    async def drop_table(self, name: str) -> TableInfo:
        """Drop a table: its channels, its catalog entry, then its folder.

        Raises:
            DynamicTableReadOnlyError: a dynamic table: SQL's ``DROP DYNAMIC TABLE`` drops
                it, as SQL's ``DROP TABLE`` refuses it too.
            TableBusyError: a pending pipeline commit writes the table.
        """
        info, dynamic = await self._table_to_write(name)
        if dynamic is not None:
            raise DynamicTableReadOnlyError(
                f"{info.full_name} is a dynamic table: DELETE /v1/tables refuses it, as SQL's "
                "DROP TABLE does, and nothing was changed. Drop it with the statement DROP "
                f"DYNAMIC TABLE {info.full_name} through POST /v1/sql, which also forgets its "
                "definition and refresh history"
            )
        self._check_not_busy(info)  # before its channels stop; the catalog checks again
        table = self._tables.pop(info.id, None)
        if table is not None:
            async with table.lock:
                table.dropped = True
                for channel in table.channels.values():
                    channel.invalidate("the table was dropped")
                    self.budget.release(table.discard_channel(channel))
            flusher = self._flushers.pop(info.id, None)
            if flusher is not None:
                await flusher.stop()
        try:
            self.catalog.drop_table(info.id)
        except CatalogTableBusy as exc:  # a commit reserved it meanwhile
            raise TableBusyError(busy_message(self.catalog, exc)) from None
        self._definitions.clear()
        if len(self._dropped) > 10_000:
            self._dropped.clear()  # bounded; forgetting only softens a later message
        self._dropped.add((info.database, info.schema_name, info.name))
        self.metrics.forget_table(info.full_name)
        log.info("dropped table %s", info.full_name, extra={"table": info.full_name})
        await asyncio.to_thread(purge_dropped, self.catalog, self.config.warehouse)
        return info

    def _table_state(self, info: TableInfo) -> TableState:
        table = self._tables.get(info.id)
        if table is None:
            table = self._tables[info.id] = TableState(info)
            table.ingest_files, table.ingest_bytes = _intermediate_files(info.uri)
            flusher = TableFlusher(
                table,
                self.catalog,
                self.budget,
                self.config.flush.retry_initial,
                self.config.flush.retry_max,
                self.metrics,
                on_flush=self._after_flush,
            )
            self._flushers[info.id] = flusher
            flusher.start()
        return table

    # -- channels --------------------------------------------------------------------------

    async def open_channel(
        self,
        table_name: str,
        channel_name: str,
        *,
        max_client_lag: float | None = None,
        on_error: OnErrorOption = OnErrorOption.ABORT,
        default_timezone: str = "America/Los_Angeles",
    ) -> ChannelState:
        """Open or reopen a channel: a new durable generation that invalidates older handles
        and discards what they had buffered here.

        Raises:
            DynamicTableReadOnlyError: the table is dynamic (only its refreshes write it).
        """
        name = _channel_name(channel_name)
        info, dynamic = await self._table_to_write(table_name)
        if dynamic is not None:  # before its table state: no flusher for it either
            sources = await asyncio.to_thread(self._base_sources, dynamic)
            raise DynamicTableReadOnlyError(
                f"{info.full_name} is a dynamic table: only its refreshes write it, so no "
                "channel can be opened on it, and nothing was changed. Insert the rows into "
                f"the tables its query reads{sources} and refresh it "
                f"(ALTER DYNAMIC TABLE {info.full_name} REFRESH through POST /v1/sql), or open "
                "the channel on a table that is not dynamic"
            )
        table = self._table_state(info)
        lag = (
            max_client_lag
            if max_client_lag is not None
            else self.config.flush.default_max_client_lag
        )
        async with table.lock:  # never while a flush of this table is in flight
            flusher = self._flushers[table.info.id]
            if flusher.unindexed:  # the token is read from the catalog: bring it up to date
                await asyncio.to_thread(flusher.reindex)
            logged = await asyncio.to_thread(flusher.writer.committed_generation, name)
            record = await asyncio.to_thread(
                self.catalog.open_channel, table.info.id, name, logged + 1
            )
            old = table.channels.get(name)
            if old is not None:
                old.invalidate(
                    f"channel {name} was reopened (generation {record.generation}); its "
                    "uncommitted rows were discarded"
                )
                self.budget.release(table.discard_channel(old))
            channel = ChannelState(
                table=table,
                name=name,
                generation=record.generation,
                committed_token=record.offset_token,
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

    def channel_state(self, table_name: str, channel_name: str, generation: int) -> ChannelState:
        """The live state of a handle, or the error that says why it has none.

        Raises:
            TableNotFoundError: the table does not exist (and was not dropped here).
            ChannelNotFoundError: the channel was never opened on the table.
            ChannelInvalidatedError: the handle was replaced (reopen, drop, restart, close).
        """
        try:
            info = self.describe_table(table_name)
        except TableNotFoundError as exc:
            if split_table_name(table_name) in self._dropped:
                raise ChannelInvalidatedError(
                    f"channel {channel_name}: its table {table_name} was dropped; recreate the "
                    "table and open the channel again"
                ) from exc
            raise
        table = self._tables.get(info.id)
        channel = table.channels.get(channel_name) if table else None
        if channel is None:
            if (info.id, channel_name) in self._dropped_channels:
                raise ChannelInvalidatedError(
                    f"channel {channel_name} on {info.full_name} was dropped; open it again"
                )
            if self.catalog.get_channel(info.id, channel_name) is not None:
                reason = "it is not open on this server (the server restarted since)"
            elif (info.database, info.schema_name, info.name) in self._dropped:
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
        channel = self.channel_state(table_name, channel_name, generation)
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
            for table in self._tables.values():
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
        channel = self.channel_state(table_name, channel_name, generation)
        if batch_seq > channel.last_seq:
            raise InvalidRequestError(
                f"batch {batch_seq} was never received on channel {channel_name} (newest is "
                f"{channel.last_seq})"
            )
        await channel.wait_committed(batch_seq, min(timeout, self.config.limits.max_wait_seconds))
        if not channel.valid:
            raise ChannelInvalidatedError(f"channel {channel_name}: {channel.invalid_reason}")
        return channel

    async def close_channel(
        self, table_name: str, channel_name: str, generation: int, timeout: float
    ) -> ChannelState:
        """Flush now, wait until everything the handle sent is committed, then close it."""
        channel = self.channel_state(table_name, channel_name, generation)
        if channel.committed_seq < channel.last_seq:
            # Only when something of this handle waits: a needless request would flush
            # other channels' batches early.
            channel.table.request_flush()
        await channel.wait_committed(
            channel.last_seq, min(timeout, self.config.limits.max_wait_seconds)
        )
        if channel.committed_seq >= channel.last_seq and channel.valid:
            channel.invalidate(f"channel {channel_name} was closed")
        return channel

    async def drop_channel(self, table_name: str, channel_name: str) -> bool:
        info = self.describe_table(table_name)
        table = self._tables.get(info.id)
        if table is not None:
            async with table.lock:
                channel = table.channels.pop(channel_name, None)
                if channel is not None:
                    channel.invalidate(f"channel {channel_name} was dropped")
                    self.budget.release(table.discard_channel(channel))
        dropped = await asyncio.to_thread(self.catalog.drop_channel, info.id, channel_name)
        if dropped:
            if len(self._dropped_channels) > 10_000:
                self._dropped_channels.clear()
            self._dropped_channels.add((info.id, channel_name))
        else:
            raise ChannelNotFoundError(f"channel {channel_name} does not exist on {info.full_name}")
        return True

    def channel_status(
        self, table_name: str, channel_name: str, generation: int | None = None
    ) -> ChannelStatus:
        """The committed token of a channel, with an explicit status."""
        try:
            info = self.describe_table(table_name)
        except TableNotFoundError as exc:
            return ChannelStatus(table_name, channel_name, "TABLE_NOT_FOUND", message=str(exc))
        record = self.catalog.get_channel(info.id, channel_name)
        if record is None:
            return ChannelStatus(
                info.full_name, channel_name, "CHANNEL_NOT_FOUND",
                message=f"channel {channel_name} does not exist on {info.full_name}",
            )  # fmt: skip
        table = self._tables.get(info.id)
        live = table.channels.get(channel_name) if table else None
        token = live.committed_token if live is not None else record.offset_token
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

    def list_channels(self, table_name: str | None = None) -> list[dict[str, Any]]:
        """SHOW CHANNELS: every channel in the catalog with its live status."""
        tables = {info.id: info for info in self.catalog.list_tables()}
        if table_name is not None:
            wanted = self.describe_table(table_name)
            records: list[ChannelRecord] = self.catalog.list_channels(wanted.id)
        else:
            records = self.catalog.list_channels()
        result = []
        for record in records:
            info = tables.get(record.table_id)
            if info is None:
                continue
            table = self._tables.get(record.table_id)
            live = table.channels.get(record.name) if table else None
            if live is not None and live.valid:
                status = "FLUSH_FAILING" if table and table.flush_error else "OPEN"
            else:
                status = "CLOSED"
            result.append(
                {
                    "table": info.full_name,
                    "channel": record.name,
                    "generation": record.generation,
                    "offset_token": live.committed_token if live else record.offset_token,
                    "rows_committed": live.rows_committed if live else record.rows_committed,
                    "last_activity": max(record.last_activity, live.last_activity if live else 0),
                    "status": status,
                }
            )
        return result
