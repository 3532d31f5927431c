"""The Delta commit protocol: rows and offset tokens become durable together or not at all.

One flush of a table makes exactly one Delta commit holding the add actions of
its Parquet files, one app transaction per channel in the flush (``app_id`` =
the channel, ``version`` = generation and batch_seq packed in one integer), and
each channel's new offset token in the commit metadata under
:data:`COMMIT_METADATA_KEY`. An open of a channel makes a **fence**: the same kind of
commit without files, for that channel alone at ``(generation, 0)``, carrying the
channel's newest token in the log at the version it lands on
(:meth:`TableWriter.fence`); every commit of an older generation of the channel is
refused after it. The catalog is only an index of these commits:
:func:`commits_after` reads them back so start-up recovery can replay any
commit the catalog has not recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import orjson
import pyarrow as pa
from deltalake import DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction

from catalog.base import Catalog
from catalog.records import ChannelProgress, ChannelRecord, CommitRecord
from flush.change_commit import commit_conflict_retries
from flush.commit_clock import commit_actions, commit_info, stamped
from flush.failpoints import failpoint
from flush.parquet_files import WrittenFile, write_parquet_file
from flush.tables import ROW_ID_COLUMN, commit_history, delta_schema
from ingest_sdk import TableSchema
from ingest_sdk.wire import pack_txn_version, unpack_txn_version

__all__ = [
    "COMMIT_METADATA_KEY",
    "ChannelFencedError",
    "ChannelProgress",
    "CommitRecord",
    "Laps",
    "TableWriter",
    "app_id",
    "commits_after",
    "replay_commits",
]

COMMIT_METADATA_KEY = "ingest"

log = logging.getLogger(__name__)


class ChannelFencedError(RuntimeError):
    """A channel in the flush already committed a later position (a newer generation):
    this writer holds a stale handle and must not commit for it.

    Attributes:
        channels: the names of the fenced channels.
    """

    def __init__(self, channels: list[str]) -> None:
        super().__init__(f"channel(s) {', '.join(channels)} moved on to a newer generation")
        self.channels = channels


#: Commits by other writers a writer follows one by one to keep its channels' positions;
#: past it, it looks each position up again.
MOVE_GAP = 32


def app_id(channel: str) -> str:
    """The Delta app-transaction id of a channel (one table, one log: the name suffices)."""
    return f"ingest-channel:{channel}"


def _metadata(channels: list[ChannelProgress], next_row_id: int, rows: int) -> str:
    return orjson.dumps(
        {"channels": [asdict(c) for c in channels], "next_row_id": next_row_id, "rows": rows}
    ).decode()


def _record(version: int, text: str) -> CommitRecord:
    body = orjson.loads(text)
    return CommitRecord(
        version=version,
        channels=tuple(ChannelProgress(**c) for c in body["channels"]),
        next_row_id=body["next_row_id"],
        rows=body["rows"],
    )


def commits_after(table_uri: str, version: int) -> list[CommitRecord]:
    """Flush commits newer than ``version``, oldest first (for recovery)."""
    _, entries = commit_history(table_uri, since=version)
    records = [
        _record(entry["version"], entry[COMMIT_METADATA_KEY])
        for entry in entries
        if COMMIT_METADATA_KEY in entry
    ]
    return sorted(records, key=lambda record: record.version)


def flush_commits_down(table_uri: str, top: int) -> Iterator[CommitRecord]:
    """The flush (and fence) commits from version ``top`` down, newest first, each read
    from its own commit file; they end where log cleanup removed the files (older
    commits are gone too)."""
    for version in range(top, -1, -1):
        info = commit_info(table_uri, version)
        if info is None:
            return
        text = info.get(COMMIT_METADATA_KEY)
        if text:
            yield _record(version, text)


def replay_commits(catalog: Catalog, table_id: int) -> list[CommitRecord]:
    """Record in the catalog every flush commit of the table's log it has not recorded,
    oldest first; returns them. Nothing for a table the catalog no longer has.

    Those are the commits above the catalog's applied version and, with several services
    on one table, a commit at or below it: a service killed between its Delta commit and
    the catalog update while another recorded a newer one. Such a commit is the newest
    of each of its channels, so a channel whose position in the log is past the one in
    the catalog names it (:func:`_late_commits`)."""
    info = catalog.get_table_by_id(table_id)
    if info is None:
        return []
    records = commits_after(info.uri, info.applied_version)
    for record in records:
        catalog.apply_commit(info.id, record)
    late = _late_commits(info.uri, info.applied_version, catalog.list_channels(info.id))
    for record in late:
        catalog.apply_commit(info.id, record)
    return sorted(records + late, key=lambda record: record.version)


def _late_commits(
    table_uri: str, applied_version: int, channels: list[ChannelRecord]
) -> list[CommitRecord]:
    """The commits at or below ``applied_version`` holding a channel's position in the
    log that the catalog's ``channels`` are behind, oldest first. Channels without a
    recorded position (an upgraded catalog: the older code recorded every commit) are
    not looked at."""
    table = DeltaTable(table_uri)
    behind: dict[str, int] = {}
    for channel in channels:
        position = table.transaction_version(app_id(channel.name))
        known = channel.committed_position
        if known is not None and position is not None and position > known:
            behind[channel.name] = position
    found: dict[int, CommitRecord] = {}
    for record in flush_commits_down(table_uri, min(applied_version, table.version())):
        if not behind:
            break
        for progress in record.channels:
            position = pack_txn_version(progress.generation, progress.batch_seq)
            if behind.get(progress.channel) == position:
                del behind[progress.channel]
                found[record.version] = record
    return [found[version] for version in sorted(found)]


@dataclass(frozen=True, slots=True)
class _Carried:
    """Where a channel position was committed: its version and the token it carried."""

    position: int
    version: int
    offset_token: str | None


class TableWriter:
    """Writes flushes and fences into one Delta table; keeps the log loaded between them.

    A flush refreshes the loaded log once, before it commits: the commit is made on that
    version and lands exactly one above it or not at all (``flush.commit_clock`` turns
    delta-rs' own retries off), so the writer knows its version without reading the log
    again. The channels' positions in the log (``transaction_version``) are looked up
    only for what this writer does not already know: a log still at the version of the
    writer's own last commit holds, for each channel it committed, exactly the position
    it wrote there.
    """

    def __init__(self, table_uri: str, schema: TableSchema) -> None:
        self.table_uri = table_uri
        self.schema = schema
        self.arrow_schema = delta_schema(schema)
        self._table = DeltaTable(table_uri)
        #: The log version :attr:`_positions` describes (None: nothing known yet).
        self._known_version: int | None = None
        #: Each channel's packed position in the log at :attr:`_known_version` (None: the
        #: log holds none), as looked up or as this writer's own commit wrote it.
        self._positions: dict[str, int | None] = {}
        #: The newest commit of each channel this writer made or read back: a position is
        #: committed once, so an entry stays true, and it answers for the channel as long
        #: as the log's position of the channel is the entry's.
        self._carried: dict[str, _Carried] = {}

    def committed_generation(self, channel: str) -> int:
        """The generation of the channel's newest commit in the log (0: none).

        A channel's catalog row can go (drop, retention) while the log keeps its app
        transaction; a new open must start above it, or its first batches would look
        already landed (and be acknowledged unwritten) or fenced.
        """
        self._table.update_incremental()
        landed = self._table.transaction_version(app_id(channel))
        return 0 if landed is None else unpack_txn_version(landed)[0]

    def _log_positions(self, channels: list[ChannelProgress]) -> dict[str, int | None]:
        """Each channel's position in the loaded log: known ones from this writer's own
        bookkeeping, moved by the app transactions of the commits other writers added
        since the version it describes, the rest looked up."""
        version = self._table.version()
        if version != self._known_version:  # another writer committed, or nothing is known
            self._positions = self._moved_positions(version)
            self._known_version = version
        for progress in channels:
            if progress.channel not in self._positions:
                self._positions[progress.channel] = self._table.transaction_version(
                    app_id(progress.channel)
                )
        return {p.channel: self._positions[p.channel] for p in channels}

    def _moved_positions(self, version: int) -> dict[str, int | None]:
        """The known positions moved to ``version`` by the ``txn`` actions of the commits
        after :attr:`_known_version`, each read once (``transaction_version`` would read
        every commit since the last checkpoint, per channel: on a bucket, a GET each, so
        several writers on one table spent their flushes re-reading the log). Nothing is
        known (everything is looked up) when the gap is wide, the log went back, or a
        commit file is gone (cleaned up)."""
        known = self._known_version
        if known is None or not self._positions or not known < version <= known + MOVE_GAP:
            return {}
        positions = dict(self._positions)
        by_app = {app_id(channel): channel for channel in positions}
        for moved in range(known + 1, version + 1):
            actions = commit_actions(self.table_uri, moved)
            if actions is None:
                return {}
            for action in actions:
                txn = action.get("txn")
                if txn is not None and txn.get("appId") in by_app:
                    positions[by_app[txn["appId"]]] = int(txn["version"])
        return positions

    def landed_positions(self, channels: list[ChannelProgress]) -> dict[str, int | None]:
        """Each channel's packed position (``pack_txn_version``) in the newest log (None:
        the log holds none): what an attempt that failed without an answer committed."""
        self._table.update_incremental()
        return self._log_positions(channels)

    def _landed(self, channels: list[ChannelProgress]) -> CommitRecord | None:
        """The commit of this exact flush if an earlier attempt already made it (a retry
        whose first commit landed but whose answer was lost). Loads the newest version.

        Raises:
            ChannelFencedError: a channel is already past this flush (a newer generation
                committed): this is a stale writer, and committing would reorder the channel.
        """
        positions = self.landed_positions(channels)
        landed_all = True
        fenced = []
        for progress in channels:
            target = pack_txn_version(progress.generation, progress.batch_seq)
            landed = positions[progress.channel]
            if landed is not None and landed > target:
                fenced.append(progress.channel)
            elif landed is None or landed < target:
                landed_all = False
        if fenced:
            raise ChannelFencedError(fenced)
        if not landed_all:
            return None
        # Every channel is at or past this flush: find the commit that carried it.
        for record in reversed(commits_after(self.table_uri, -1)):
            if any(
                (c.channel, c.generation, c.batch_seq)
                == (channels[0].channel, channels[0].generation, channels[0].batch_seq)
                for c in record.channels
            ):
                return record
        return None

    def _write_rows(
        self, parts: list[pa.Table], first_row_id: int
    ) -> tuple[int, WrittenFile | None]:
        """Steps 1 and 2: the rows with their ids, as one fsynced Parquet file under
        ``_ingest/``; returns the row count and the file (None: no rows)."""
        rows = sum(part.num_rows for part in parts)
        if not rows:
            return 0, None
        data = pa.concat_tables(parts)  # chunks are written as they are: no copy
        data = data.append_column(
            self.arrow_schema.field(ROW_ID_COLUMN),
            pa.array(range(first_row_id, first_row_id + rows), pa.int64()),
        )
        return rows, write_parquet_file(self.table_uri, data)

    def _commit_on_loaded(
        self, actions: list[AddAction | RemoveAction], metadata: dict[str, str],
        txns: list[Transaction],
    ) -> int:  # fmt: skip
        """One commit attempt on the loaded version; returns that version. The commit lands
        exactly one above it or is refused (``CommitFailedError``: another commit took that
        version; the stamp is for it only, see flush.commit_clock)."""
        base = self._table.version()
        self._table.create_write_transaction(
            actions, "append", self.arrow_schema,
            commit_properties=stamped(self._table, metadata, txns),
        )  # fmt: skip
        return base

    def _committed(self, base: int, channels: list[ChannelProgress]) -> None:
        """What a commit of this writer on version ``base`` tells it: the channels'
        positions at ``base + 1`` (when it knew those at ``base``) and their tokens."""
        packed = [pack_txn_version(c.generation, c.batch_seq) for c in channels]
        if channels and self._known_version == base:  # the log moved by this commit alone
            self._known_version = base + 1
            self._positions.update({c.channel: p for c, p in zip(channels, packed, strict=True)})
        for channel, position in zip(channels, packed, strict=True):
            self._note_carried(channel.channel, _Carried(position, base + 1, channel.offset_token))

    def _note_carried(self, channel: str, carried: _Carried) -> None:
        known = self._carried.get(channel)
        if known is None or known.position < carried.position:
            self._carried[channel] = carried

    def _commit(
        self, actions: list[AddAction | RemoveAction], channels: list[ChannelProgress],
        metadata: dict[str, str],
    ) -> tuple[int, CommitRecord | None]:  # fmt: skip
        """Step 3: one Delta commit on the loaded version; its version. A concurrent commit
        (compaction, DML, a pipeline commit, another flush, a fence) makes delta-rs refuse
        it: nothing landed, so it goes again on the newest version, the channels checked
        again there (fencing). If that check finds this flush landed after all, its record
        comes back instead."""
        txns = [Transaction(app_id(c.channel), pack_txn_version(c.generation, c.batch_seq))
                for c in channels]  # fmt: skip
        for attempt in commit_conflict_retries():
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    if channels and (landed := self._landed(channels)) is not None:
                        return landed.version, landed
                    if not channels:
                        self._table.update_incremental()
                base = self._commit_on_loaded(actions, metadata, txns)
        self._committed(base, channels)
        return base + 1, None

    def carried(self, channel: str, position: int) -> tuple[int, str | None] | None:
        """The version and offset token of the commit that carried ``position`` (packed)
        of ``channel``, the channel's newest in the loaded log; None when the log no
        longer holds that commit's file (log cleanup) or it carries no token record.

        Known without reading when this writer made or read that commit before; else the
        commit files are read from the loaded version down to it (each channel met on the
        way is remembered at its newest position, so an open of it next reads nothing).
        """
        known = self._carried.get(channel)
        if known is not None and known.position == position:
            return known.version, known.offset_token
        seen: set[str] = set()
        for record in flush_commits_down(self.table_uri, self._table.version()):
            for item in record.channels:
                name = item.channel
                if name in seen:
                    continue
                seen.add(name)
                packed = pack_txn_version(item.generation, item.batch_seq)
                self._note_carried(name, _Carried(packed, record.version, item.offset_token))
                if name == channel:
                    if packed != position:  # a commit not ours moved the app transaction
                        log.warning("the newest commit of channel %s in %s (version %d) is "
                                    "not at its position in the log", channel,
                                    self.table_uri, record.version)  # fmt: skip
                        return None
                    return record.version, item.offset_token
        return None  # not found before log cleanup removed older commits

    def fence(
        self, channel: str, generation: int, next_row_id: int, *, resume: bool,
        fallback_token: str | None,
    ) -> CommitRecord:  # fmt: skip
        """An open's fence: one commit without files holding the channel's app transaction
        at ``(generation, 0)`` and, in the commit metadata, the channel's token, so that no
        commit of an older generation of the channel lands after it (:meth:`_landed`
        refuses ours; delta-rs refuses one made on a version before the fence).

        The token is the one the log holds for the channel at the version the fence is
        made on (the commit of the channel's position there): the fence lands exactly one
        version above it or is refused and made again on the newest version, token read
        again, so no commit of the channel comes between the token and the fence.
        ``resume`` False (the catalog had no row of the channel: new, dropped or retired)
        makes it None; ``fallback_token`` (the catalog's) is used when the log no longer
        holds the commit of the channel's position (log cleanup).

        ``next_row_id``: the catalog's next row id (the fence reserves none; the commit
        records it as every flush commit does).

        Raises:
            ChannelFencedError: the log already holds a later position of the channel: an
                open of a newer generation (on another server) fenced first.
        """
        target = pack_txn_version(generation, 0)
        probe = [ChannelProgress(channel, generation, 0, None, 0)]
        for attempt in commit_conflict_retries():
            with attempt:
                position = self.landed_positions(probe)[channel]  # loads the newest version
                if position is not None and position > target:
                    raise ChannelFencedError([channel])
                if position == target:  # an earlier attempt landed, its answer was lost
                    found = self.carried(channel, position)
                    version, token = found or (self._table.version(), fallback_token)
                    progress = ChannelProgress(channel, generation, 0, token, 0)
                    return CommitRecord(version, (progress,), next_row_id, 0)
                token = None
                if resume and position is not None:
                    found = self.carried(channel, position)
                    token = found[1] if found is not None else fallback_token
                progress = ChannelProgress(channel, generation, 0, token, 0)
                metadata = {COMMIT_METADATA_KEY: _metadata([progress], next_row_id, 0)}
                failpoint("before_fence_commit")
                base = self._commit_on_loaded([], metadata, [Transaction(app_id(channel), target)])
        self._committed(base, [progress])
        failpoint("after_fence_commit")
        return CommitRecord(base + 1, (progress,), next_row_id, 0)

    def commit_flush(
        self,
        parts: list[pa.Table],
        channels: list[ChannelProgress],
        first_row_id: int,
        timings: dict[str, float] | None = None,
    ) -> CommitRecord:
        """Make one flush durable: rows and channel tokens in one Delta commit.

        Steps (the caller does 4 and 5):
          1. Attach row ids ``first_row_id..`` to the rows, in channel insert order.
          2. Write them as one Parquet file under ``_ingest/`` and fsync it.
          3. Commit to Delta, atomically: the add action, one app transaction per
             channel (fencing and idempotency) and every channel's new offset
             token in the commit metadata.
          4. Record the commit in the catalog (tokens, row ids, applied version).
          5. Acknowledge: wake the producers waiting for these tokens.

        A retried call after an attempt whose commit landed but whose answer was
        lost returns that commit instead of committing the rows twice. ``timings``, if
        given, gets the seconds of each phase (``landed_check``, ``parquet``,
        ``delta_commit``).

        Raises:
            Exception: any write or commit failure; nothing of this flush is visible then.
        """
        laps = Laps(timings)
        if channels and (landed := self._landed(channels)) is not None:
            return landed
        if not channels:
            self._table.update_incremental()
        laps.lap("landed_check")
        rows, written = self._write_rows(parts, first_row_id)  # Steps 1 and 2
        laps.lap("parquet")
        failpoint("after_parquet_write")
        next_row_id = first_row_id + rows
        metadata = {COMMIT_METADATA_KEY: _metadata(channels, next_row_id, rows)}
        failpoint("before_delta_commit")
        actions: list[AddAction | RemoveAction] = [written.add_action()] if written else []
        version, landed = self._commit(actions, channels, metadata)  # Step 3
        laps.lap("delta_commit")
        if landed is not None:
            return landed
        failpoint("after_delta_commit")
        file_bytes = written.size if written else 0
        return CommitRecord(version, tuple(channels), next_row_id, rows, file_bytes)


class Laps:
    """Seconds between successive :meth:`lap` calls, added up by name into ``into`` (a
    flush's phases for the metrics; nothing is kept when ``into`` is None)."""

    def __init__(self, into: dict[str, float] | None) -> None:
        self.into = into
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        if self.into is not None:
            self.into[name] = self.into.get(name, 0.0) + now - self._last
        self._last = now
