"""Table maintenance: Delta checkpoints, log cleanup and vacuum of unreferenced files.

Delta's own vacuum (delta-rs's included) skips folders whose names start with
``_``, which is where this system keeps its data files (``_ingest/`` and
``_compacted/``; delta-rs's merges add ``_change_data/``, and their data files in
the table's root folder), so all of those are vacuumed here with one rule: a file is
deleted only when it is older than the retention period *and* no version a
reader may still be on references it. The versions kept are the latest one and,
for every commit inside the retention window that may have removed files (any
commit that is not a flush or a streaming micro-batch; those only add), the version
just before it. The live files are read again after the listing, so a commit landing
meanwhile keeps its files.
Files of a flush or compaction still writing are newer than the retention, so
they are never touched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from deltalake import DeltaTable

from catalog import Catalog, TableInfo
from flush.batch_commit import BATCH_METADATA_KEY
from flush.change_commit import commit_conflict_retries
from flush.commit import COMMIT_METADATA_KEY
from flush.commit_clock import stamped
from flush.tables import INGEST_DIR, TXN_RETENTION, TXN_RETENTION_KEY, commit_history, live_files

__all__ = [
    "DEFAULT_RETENTION_HOURS",
    "MaintenanceResult",
    "maintain_catalog_table",
    "maintain_table",
    "pending_commit_files",
    "stream_retention_hours",
    "vacuum_data_folders",
]

DEFAULT_RETENTION_HOURS = 168.0
#: Below this a vacuum could delete files that a slow reader or a pending commit needs.
MIN_RETENTION_HOURS = 1.0
DATA_FOLDERS = (INGEST_DIR, "_compacted", "_change_data")


@dataclass(slots=True)
class MaintenanceResult:
    checkpoint_version: int
    deleted_files: list[str] = field(default_factory=list)


def vacuum_data_folders(
    table_uri: str,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    *,
    dry_run: bool = False,
    allow_short_retention: bool = False,
    keep: Iterable[str] = (),
) -> list[str]:
    """Delete unreferenced data files (:data:`DATA_FOLDERS` and Parquet files in the
    table's root folder, where merges write); returns their paths.

    ``keep`` lists more files (relative to the table) that must stay: the staged change
    sets of pending pipeline commits (:func:`pending_commit_files`).

    Raises:
        ValueError: a retention under one hour without ``allow_short_retention``.
    """
    if retention_hours < MIN_RETENTION_HOURS and not allow_short_retention:
        raise ValueError(
            f"a retention under {MIN_RETENTION_HOURS} hour may delete files that readers or "
            "pending commits still need; pass allow_short_retention=True to force it"
        )
    root = Path(table_uri)
    cutoff = time.time() - retention_hours * 3600
    table, entries = commit_history(table_uri)
    keep = {f["path"] for f in live_files(table)} | set(keep)
    for entry in entries:
        version = entry.get("version", 0)
        recent = entry.get("timestamp", 0) / 1000 >= cutoff
        adds_only = COMMIT_METADATA_KEY in entry or BATCH_METADATA_KEY in entry
        if recent and version > 0 and not adds_only:
            keep |= {f["path"] for f in live_files(DeltaTable(table_uri, version=version - 1))}
    files = [path for folder in DATA_FOLDERS for path in sorted((root / folder).rglob("*"))]
    candidates = [
        path
        for path in files + sorted(root.glob("*.parquet"))
        if path.is_file()
        and str(path.relative_to(root)) not in keep
        and path.stat().st_mtime < cutoff
    ]
    # A commit that landed since the keep set was read may reference a candidate.
    keep |= {f["path"] for f in live_files(DeltaTable(table_uri))} if candidates else set()
    deleted = []
    for path in candidates:
        relative = str(path.relative_to(root))
        if relative not in keep:
            deleted.append(relative)
            if not dry_run:
                path.unlink()
    if not dry_run:
        for folder in DATA_FOLDERS:  # drop emptied run folders of compaction
            for directory in sorted((root / folder).glob("*/"), reverse=True):
                if directory.is_dir() and not any(directory.iterdir()):
                    directory.rmdir()
    return deleted


def stream_retention_hours(catalog: Catalog, info: TableInfo, retention_hours: float) -> float:
    """The retention a table's maintenance must keep so no stream on it goes stale.

    While a stream is unconsumed the table's history is kept from the stream's last
    offset move, for up to the table's ``max_data_extension_time_in_days`` (the reference
    system's MAX_DATA_EXTENSION_TIME_IN_DAYS, default 14): a stream older than that is
    stale anyway (``STALE_AFTER``). The change feed a stream reads needs the files of
    every commit after its offset, which vacuum would otherwise delete once compacted.
    """
    streams = catalog.list_streams(info.id)
    if not streams:
        return retention_hours
    now = time.time()
    days = max(info.properties["data_retention_time_in_days"],
               info.properties["max_data_extension_time_in_days"])  # fmt: skip
    oldest = min(stream.offset_moved_at for stream in streams)
    needed = min(now - oldest, days * 86_400.0) / 3600 + 1.0  # an hour of slack
    return max(retention_hours, needed)


def pending_commit_files(catalog: Catalog, table_id: int) -> set[str]:
    """Files of a table that pending pipeline commits will add or merge (their plans
    list ``tables`` of ``{"table_id", "staged": {"path", ...}}``, see pipelines' commit).
    They are unreferenced by the log until the commit lands, however long it waits."""
    return {
        entry["staged"]["path"]
        for pending in catalog.pending_commits()
        for entry in pending.plan.get("tables", [])
        if entry.get("table_id") == table_id and entry.get("staged")
    }


def maintain_table(
    table_uri: str,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    *,
    allow_short_retention: bool = False,
    keep: Iterable[str] = (),
) -> MaintenanceResult:
    """Checkpoint the log, clean up expired log files, and vacuum the data folders
    (never the files in ``keep``). A table made before pipeline commits' app
    transactions expired gets its retention (:data:`flush.tables.TXN_RETENTION`)."""
    table = DeltaTable(table_uri)
    if TXN_RETENTION_KEY not in table.metadata().configuration:  # made by an older version
        for attempt in commit_conflict_retries():  # a concurrent commit: on the newest
            with attempt:
                table = DeltaTable(table_uri)
                table.alter.set_table_properties({TXN_RETENTION_KEY: TXN_RETENTION},
                                                 commit_properties=stamped(table))  # fmt: skip
    table.create_checkpoint()
    table.cleanup_metadata()
    deleted = vacuum_data_folders(
        table_uri, retention_hours, allow_short_retention=allow_short_retention, keep=keep
    )
    return MaintenanceResult(checkpoint_version=table.version(), deleted_files=deleted)


def maintain_catalog_table(
    catalog: Catalog,
    info: TableInfo,
    retention_hours: float = DEFAULT_RETENTION_HOURS,
    *,
    allow_short_retention: bool = False,
) -> MaintenanceResult:
    """:func:`maintain_table` for a table of the catalog: the retention extended for its
    streams (:func:`stream_retention_hours`), the staged files of pending commits kept."""
    return maintain_table(
        info.uri,
        stream_retention_hours(catalog, info, retention_hours),
        allow_short_retention=allow_short_retention,
        keep=pending_commit_files(catalog, info.id),
    )
