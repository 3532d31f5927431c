"""Committing a streaming micro-batch to a Delta table exactly once.

A streaming engine replays a micro-batch after a crash, with the same batch id and
possibly other rows split into other files. Each writer (``app_id``, one per
streaming query) keeps its files under ``_ingest/sink-<hash of app_id>/``:

1. tasks stage their files under ``staging/`` (unique names, fsync'd);
2. the driver's commit of batch ``b`` reads the app transaction ``app_id`` from the
   table. If it is at ``b`` or later the batch landed before: every staged file is
   deleted and nothing is written (a replay leaves no duplicate and no orphan).
   Otherwise no file named for ``b`` is referenced by the log, so leftovers of an
   earlier attempt (``b-*.parquet``) are deleted, the staged files are renamed to
   ``b-0.parquet``, ``b-1.parquet``... and one Delta commit adds them with the app
   transaction ``(app_id, b)``; then ``staging/`` is emptied (files of failed tasks).

The engine runs one batch of a query at a time, so nothing else writes these folders
while a commit cleans them. Files of a query that is never restarted stay
unreferenced and the maintenance vacuum removes them after the retention.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import orjson
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction

from flush.change_commit import commit_conflict_retries
from flush.failpoints import failpoint
from flush.parquet_files import WrittenFile, fsync_dir, write_parquet_file
from flush.tables import INGEST_DIR

__all__ = ["BATCH_METADATA_KEY", "commit_batch", "discard_staged", "stage_batch_file"]

BATCH_METADATA_KEY = "ingest.batch"
_STAGING = "staging"


def _folder(app_id: str) -> str:
    """The writer's folder inside the table (a hash: app ids are user text)."""
    return f"{INGEST_DIR}/sink-{hashlib.sha256(app_id.encode()).hexdigest()[:16]}"


def stage_batch_file(table_uri: str, app_id: str | None, rows: pa.Table) -> WrittenFile:
    """Write one task's rows (the table's Delta schema) as a staged file (``app_id``
    None: a one-off append's file, where flushes keep theirs)."""
    folder = INGEST_DIR if app_id is None else f"{_folder(app_id)}/{_STAGING}"
    return write_parquet_file(table_uri, rows, folder=folder)


def discard_staged(table_uri: str, files: Sequence[WrittenFile]) -> None:
    """Delete staged files of a batch that will not commit (an aborted attempt)."""
    for written in files:
        Path(table_uri, written.path).unlink(missing_ok=True)


def _clear_staging(root: Path, app_id: str) -> None:
    shutil.rmtree(root / _folder(app_id) / _STAGING, ignore_errors=True)


def commit_batch(
    table_uri: str, app_id: str | None, batch_id: int, files: Sequence[WrittenFile]
) -> int | None:
    """Add the staged ``files`` of batch ``batch_id`` in one Delta commit, once.

    ``app_id`` None is a one-off append (a batch write): no replay to guard against.

    Returns:
        The version of the commit, or None when the batch had landed before.
    """
    root = Path(table_uri)
    if app_id is not None:
        landed = DeltaTable(table_uri).transaction_version(app_id)
        if landed is not None and landed >= batch_id:
            _clear_staging(root, app_id)
            return None
        folder = root / _folder(app_id)
        for leftover in folder.glob(f"{batch_id}-*.parquet"):  # never referenced: not landed
            leftover.unlink()
        finals = []
        for index, staged in enumerate(sorted(files, key=lambda f: f.path)):
            final = f"{_folder(app_id)}/{batch_id}-{index}.parquet"
            os.replace(root / staged.path, root / final)
            finals.append(WrittenFile(final, staged.size, staged.rows, staged.stats))
        fsync_dir(folder)
        files = finals
    failpoint("sink_before_commit")
    properties = CommitProperties(
        custom_metadata={
            BATCH_METADATA_KEY: orjson.dumps({"app_id": app_id, "batch": batch_id}).decode()
        },
        app_transactions=[Transaction(app_id, batch_id)] if app_id is not None else None,
    )
    # Appends conflict only with metadata changes; retry those races like the flusher.
    for attempt in commit_conflict_retries():
        with attempt:
            table = DeltaTable(table_uri)
            if app_id is not None and (table.transaction_version(app_id) or -1) >= batch_id:
                return None  # a previous attempt of this call landed and then reported failure
            table.create_write_transaction(
                [written.add_action() for written in files if written.rows],
                "append",
                table.schema(),
                commit_properties=properties,
            )
    failpoint("sink_after_commit")
    if app_id is not None:
        _clear_staging(root, app_id)
    return DeltaTable(table_uri).version()
