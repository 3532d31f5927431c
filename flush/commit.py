"""The Delta commit protocol: rows and offset tokens become durable together or not at all.

One flush of a table makes exactly one Delta commit holding the add actions of
its Parquet files, one app transaction per channel in the flush (``app_id`` =
the channel, ``version`` = generation and batch_seq packed in one integer), and
each channel's new offset token in the commit metadata under
:data:`COMMIT_METADATA_KEY`. The catalog is only an index of these commits:
:func:`commits_after` reads them back so start-up recovery can replay any
commit the catalog has not recorded.
"""

from __future__ import annotations

from dataclasses import asdict

import orjson
import pyarrow as pa
from deltalake import DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction

from catalog.records import ChannelProgress, CommitRecord
from flush.change_commit import commit_conflict_retries
from flush.commit_clock import stamped
from flush.failpoints import failpoint
from flush.parquet_files import write_parquet_file
from flush.tables import ROW_ID_COLUMN, commit_history, delta_schema
from ingest_sdk import TableSchema
from ingest_sdk.wire import pack_txn_version, unpack_txn_version

__all__ = [
    "COMMIT_METADATA_KEY",
    "ChannelFencedError",
    "ChannelProgress",
    "CommitRecord",
    "TableWriter",
    "app_id",
    "commits_after",
]

COMMIT_METADATA_KEY = "ingest"


class ChannelFencedError(RuntimeError):
    """A channel in the flush already committed a later position (a newer generation):
    this writer holds a stale handle and must not commit for it.

    Attributes:
        channels: the names of the fenced channels.
    """

    def __init__(self, channels: list[str]) -> None:
        super().__init__(f"channel(s) {', '.join(channels)} moved on to a newer generation")
        self.channels = channels


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


class TableWriter:
    """Writes flushes into one Delta table; keeps the log loaded between flushes."""

    def __init__(self, table_uri: str, schema: TableSchema) -> None:
        self.table_uri = table_uri
        self.schema = schema
        self.arrow_schema = delta_schema(schema)
        self._table = DeltaTable(table_uri)

    def committed_generation(self, channel: str) -> int:
        """The generation of the channel's newest commit in the log (0: none).

        A channel's catalog row can go (drop, retention) while the log keeps its app
        transaction; a new open must start above it, or its first batches would look
        already landed (and be acknowledged unwritten) or fenced.
        """
        self._table.update_incremental()
        landed = self._table.transaction_version(app_id(channel))
        return 0 if landed is None else unpack_txn_version(landed)[0]

    def _landed(self, channels: list[ChannelProgress]) -> CommitRecord | None:
        """The commit of this exact flush if an earlier attempt already made it.

        Raises:
            ChannelFencedError: a channel is already past this flush (a newer generation
                committed): this is a stale writer, and committing would reorder the channel.
        """
        self._table.update_incremental()
        landed_all = True
        fenced = []
        for progress in channels:
            target = pack_txn_version(progress.generation, progress.batch_seq)
            landed = self._table.transaction_version(app_id(progress.channel))
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

    def commit_flush(
        self, parts: list[pa.Table], channels: list[ChannelProgress], first_row_id: int
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
        lost returns that commit instead of committing the rows twice.

        Raises:
            Exception: any write or commit failure; nothing of this flush is visible then.
        """
        if channels and (landed := self._landed(channels)) is not None:
            return landed
        # Step 1
        rows = sum(part.num_rows for part in parts)
        next_row_id = first_row_id + rows
        actions: list[AddAction | RemoveAction] = []
        file_bytes = 0
        if rows:
            data = pa.concat_tables(parts)  # chunks are written as they are: no copy
            data = data.append_column(
                self.arrow_schema.field(ROW_ID_COLUMN),
                pa.array(range(first_row_id, next_row_id), pa.int64()),
            )
            # Step 2
            written = write_parquet_file(self.table_uri, data)
            actions.append(written.add_action())
            file_bytes = written.size
        failpoint("after_parquet_write")
        # Step 3
        metadata = {COMMIT_METADATA_KEY: _metadata(channels, next_row_id, rows)}
        txns = [Transaction(app_id(c.channel), pack_txn_version(c.generation, c.batch_seq))
                for c in channels]  # fmt: skip
        failpoint("before_delta_commit")
        # A concurrent commit (compaction, DML, a pipeline commit, another flush) makes
        # delta-rs refuse this one (the stamp is for the next version only, see
        # flush.commit_clock): nothing landed, so it goes again on the newest version.
        for attempt in commit_conflict_retries():
            with attempt:
                if attempt.retry_state.attempt_number > 1:
                    self._table.update_incremental()
                self._table.create_write_transaction(
                    actions, "append", self.arrow_schema,
                    commit_properties=stamped(self._table, metadata, txns),
                )  # fmt: skip
        failpoint("after_delta_commit")
        # The handle does not see its own commit until refreshed. With a concurrent
        # writer (compaction) the version read here may be a later one; recovery only
        # needs "at or after this flush", which that still is.
        self._table.update_incremental()
        return CommitRecord(self._table.version(), tuple(channels), next_row_id, rows, file_bytes)
