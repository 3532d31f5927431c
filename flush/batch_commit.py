"""Committing a streaming micro-batch to a Delta table exactly once.

A streaming engine replays a micro-batch after a crash, with the same batch id and
possibly other rows split into other files. Each writer (``writer_id``: one per
streaming query, or one per batch write) keeps its files under
``_ingest/sink-<hash of writer_id>/``:

1. tasks stage their files under ``staging/`` (unique names, fsync'd); a task that
   fails deletes its own, an aborted batch empties ``staging/``;
2. the driver's commit of batch ``b`` reads the app transaction ``writer_id`` from
   the table. If it is at ``b`` or later the batch landed before: every staged file is
   deleted and nothing is written (a replay leaves no duplicate and no orphan).
   Otherwise no file named for ``b`` is referenced by the log, so leftovers of an
   earlier attempt (``b-*.parquet``) are deleted, the staged files are renamed to
   ``b-<attempt>-0.parquet``, ``b-<attempt>-1.parquet``... (a fresh mtime: new to the
   log, so young for the vacuum) and one Delta commit adds them with the app
   transaction ``(writer_id, b)``; then ``staging/`` is emptied (files of failed tasks).

The engine runs one batch of a writer at a time, so nothing else writes these folders
while a commit cleans them. Files of a query that is never restarted stay
unreferenced and the maintenance vacuum removes them after the retention.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

import orjson
import pyarrow as pa
from deltalake import DeltaTable, Transaction

from flush.change_commit import commit_conflict_retries
from flush.commit_clock import stamped
from flush.failpoints import failpoint
from flush.parquet_files import WrittenFile, write_parquet_file
from flush.storage import fsync_folder
from flush.tables import INGEST_DIR, live_files

__all__ = [
    "BATCH_METADATA_KEY",
    "SinkTargetError",
    "commit_batch",
    "discard_staged",
    "stage_batch_file",
]

BATCH_METADATA_KEY = "ingest.batch"
_STAGING = "staging"


def _folder(writer_id: str) -> str:
    """The writer's folder inside the table (a hash: writer ids are user text)."""
    return f"{INGEST_DIR}/sink-{hashlib.sha256(writer_id.encode()).hexdigest()[:16]}"


class SinkTargetError(RuntimeError):
    """The table a writer writes to is gone, or is not the table its earlier batches
    went to (dropped, replaced, renamed away): its batches cannot continue there."""


def stage_batch_file(table_uri: str, writer_id: str, rows: pa.Table) -> WrittenFile:
    """Write one task's rows (the table's Delta schema) as a staged file."""
    if not (Path(table_uri) / "_delta_log").is_dir():  # never re-create a dropped table's folder
        raise SinkTargetError(f"the table at {table_uri} was dropped while the batch ran")
    return write_parquet_file(table_uri, rows, folder=f"{_folder(writer_id)}/{_STAGING}")


def discard_staged(table_uri: str, writer_id: str, files: Sequence[WrittenFile] = ()) -> None:
    """Delete staged files: ``files`` (a failed task's own), or with none given every
    staged file of the writer (an aborted batch: also the files of tasks that failed
    without reporting them)."""
    if files:
        for written in files:
            Path(table_uri, written.path).unlink(missing_ok=True)
    else:
        shutil.rmtree(Path(table_uri) / _folder(writer_id) / _STAGING, ignore_errors=True)


def _landed(table: DeltaTable, writer_id: str, batch_id: int) -> bool:
    landed = table.transaction_version(writer_id)
    return landed is not None and landed >= batch_id


def commit_batch(
    table_uri: str,
    writer_id: str,
    batch_id: int,
    files: Sequence[WrittenFile],
    *,
    once: bool = True,
) -> bool:
    """Add the staged ``files`` of batch ``batch_id`` in one Delta commit.

    ``once``: the batch is committed with the app transaction (``writer_id``,
    ``batch_id``) and never twice (a streaming query's micro-batch); without it the
    commit is a plain append (a one-off batch write: nothing replays it).

    Returns:
        Whether this call committed the batch (False: it had landed before).

    Raises:
        SinkTargetError: batch ``batch_id`` > 0 of a writer none of whose batches is in
            this table (the table was replaced or renamed away since the query began).
    """
    root = Path(table_uri)
    folder = root / _folder(writer_id)
    table = DeltaTable(table_uri)
    if once:
        landed = table.transaction_version(writer_id)
        if landed is not None and landed >= batch_id:
            discard_staged(table_uri, writer_id)
            return False
        if batch_id > 0 and landed is None:
            raise SinkTargetError(
                f"batch {batch_id} of the writer {writer_id[:80]} goes to {table_uri}, which "
                "holds none of its earlier batches: the table was replaced or renamed since "
                "the query started; start a new query (a new checkpoint location)"
            )
    leftovers = sorted(folder.glob(f"{batch_id}-*.parquet"))
    if leftovers:  # an earlier attempt's, never referenced (not landed); keep what is
        live = {f["path"] for f in live_files(table)}
        for leftover in leftovers:
            if str(leftover.relative_to(root)) not in live:
                leftover.unlink()
    attempt = uuid.uuid4().hex[:12]  # unique names: no rename can replace a committed file
    finals = []
    for index, staged in enumerate(sorted(files, key=lambda f: f.path)):
        final = f"{_folder(writer_id)}/{batch_id}-{attempt}-{index}.parquet"
        os.replace(root / staged.path, root / final)
        os.utime(root / final)  # new to the log now: vacuum keeps files younger than it
        finals.append(WrittenFile(final, staged.size, staged.rows, staged.stats))
    if finals:
        fsync_folder(folder)
    failpoint("sink_before_commit")
    custom = {BATCH_METADATA_KEY: orjson.dumps({"writer": writer_id, "batch": batch_id}).decode()}
    txns = [Transaction(writer_id, batch_id)] if once else None
    for attempt_ in commit_conflict_retries():  # refused after a concurrent commit: again
        with attempt_:
            table = DeltaTable(table_uri)
            if once and _landed(table, writer_id, batch_id):
                break  # an earlier try of this call landed, then reported a failure
            table.create_write_transaction(
                [written.add_action() for written in finals if written.rows],
                "append",
                table.schema(),
                commit_properties=stamped(table, custom, txns),
            )
    failpoint("sink_after_commit")
    discard_staged(table_uri, writer_id)  # files of failed tasks
    return True
