"""Compaction: rewrite a mixed table's small files into large, sorted, zstd files.

A run, for one table:
  1. reads the current snapshot with delta-rs and picks the intermediate files
     (under ``_ingest/``) and undersized optimized files, packed in bins toward
     the target file size;
  2. rewrites them with Spark into zstd files under ``_compacted/<run>/``:
     - per bin, one Spark task (:mod:`flush.bin_rewrite`) reads the bin's files
       with Arrow, sorts them by the clustering columns (default: ingestion order,
       the hidden row id), writes one file and checks its row ids against those
       it read;
     - with clustering columns and more than one bin, the files of the run must
       cover non-overlapping ranges: up to ``MAX_RANGE_TASKS`` bins, the driver
       cuts the first clustering column into as many ranges of about equal rows
       and one Spark task per range reads all inputs, keeps its range and goes on
       as above; past that, Spark SQL range-partitions all inputs on the
       clustering columns, and the driver checks the row ids going out against
       those coming in (count and set);
  3. commits, with delta-rs, one transaction that removes the inputs and adds the
     outputs with ``dataChange=false`` and full statistics, so change-feed readers
     see nothing new. If an input file is gone by then (a concurrent delete or
     compaction), the run is abandoned and its outputs deleted.

Concurrent flush commits only append, so they never conflict. A concurrent commit
that removed an input (DML, a pipeline merge) makes delta-rs refuse the commit
("a concurrent transaction deleted data this operation read"), and the run is
abandoned; a lock file keeps two compactions of one table apart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from flush.bin_rewrite import BinTask, KeyRange, range_boundaries, rewrite_bin
from flush.change_commit import commit_conflict_retries
from flush.commit_clock import stamped
from flush.failpoints import failpoint
from flush.parquet_files import WrittenFile, file_stats
from flush.storage import fsync_folder
from flush.table_locks import TableLocked, table_lock
from flush.tables import INGEST_DIR, ROW_ID_COLUMN, live_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "COMPACTED_DIR",
    "CompactionAbandoned",
    "CompactionPolicy",
    "CompactionResult",
    "compact_table",
    "plan_bins",
]

#: Folder (inside the table) for files written by compaction.
COMPACTED_DIR = "_compacted"
#: A clustered run of up to this many bins runs one Arrow task per key range, each
#: reading all inputs: cheaper than Spark SQL's shuffle and row sort while the
#: ranges are few (measured on 340 MB in 3 ranges: 12-14 s against 28-35 s). More
#: bins go through Spark SQL's range partitioning, which reads the inputs once.
MAX_RANGE_TASKS = 8
MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """What a compaction run does.

    Attributes:
        target_file_bytes: bins are filled toward this size; an optimized file this
            large (or at least ``min_optimized_share`` of it) is left alone.
        clustering: columns to sort each output file by; empty means ingestion order.
        min_optimized_share: optimized files smaller than this share of the target
            are compacted again.
    """

    target_file_bytes: int = 128 * MiB
    clustering: tuple[str, ...] = ()
    min_optimized_share: float = 0.5


@dataclass(slots=True)
class CompactionResult:
    """One run, as recorded in the migration history."""

    table_uri: str
    started_at: float
    ended_at: float = 0.0
    status: str = "NOTHING_TO_DO"  # SUCCEEDED, ABANDONED, FAILED, NOTHING_TO_DO
    files_in: int = 0
    bytes_in: int = 0
    rows_in: int = 0
    files_out: int = 0
    bytes_out: int = 0
    rows_out: int = 0
    version: int | None = None
    error: str | None = None
    bins: list[int] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.ended_at - self.started_at


class CompactionAbandoned(RuntimeError):
    """The inputs changed under the run (a concurrent delete or compaction)."""


def _is_intermediate(path: str) -> bool:
    return path.startswith(INGEST_DIR + "/")


def plan_bins(files: list[dict[str, Any]], policy: CompactionPolicy) -> list[list[dict[str, Any]]]:
    """Pack the files worth compacting into bins of about ``target_file_bytes``.

    Files are taken in log order (oldest first) so bins hold neighbouring rows.
    A bin of one already-optimized file is dropped: rewriting it changes nothing.
    """
    small = policy.target_file_bytes * policy.min_optimized_share
    candidates = [f for f in files if _is_intermediate(f["path"]) or f["size_bytes"] < small]
    bins: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    size = 0
    for item in candidates:
        if current and size + item["size_bytes"] > policy.target_file_bytes:
            bins.append(current)
            current, size = [], 0
        current.append(item)
        size += item["size_bytes"]
    if current:
        bins.append(current)
    return [b for b in bins if len(b) > 1 or _is_intermediate(b[0]["path"])]


@contextlib.contextmanager
def _table_lock(table_uri: str) -> Iterator[None]:
    """One compaction per table at a time, never at once with a dynamic table's refresh
    commit (:func:`flush.table_locks.table_lock`); the second one gives up."""
    try:
        with table_lock(table_uri, wait=False):
            yield
    except TableLocked as exc:
        raise CompactionAbandoned(
            "another compaction or a dynamic table refresh of this table is running"
        ) from exc


def _sorted_ids(paths: list[str]) -> pa.Array:
    """Every row id in these files, sorted (to compare the sets going in and out)."""
    ids = ds.dataset(paths, format="parquet").to_table(columns=[ROW_ID_COLUMN]).column(0)
    return ids.take(pc.sort_indices(ids)).combine_chunks()


def _check_row_ids(table_uri: str, inputs: list[str], outputs: list[WrittenFile]) -> None:
    out_paths = [str(Path(table_uri) / o.path) for o in outputs]
    ids_in, ids_out = _sorted_ids(inputs), _sorted_ids(out_paths)
    if not ids_in.equals(ids_out):
        raise RuntimeError(f"row ids out ({len(ids_out)}) differ from row ids in ({len(ids_in)})")


def _bin_tasks(
    table_uri: str, bins: list[list[dict[str, Any]]], clustering: tuple[str, ...], run: str
) -> list[BinTask]:
    """One task per bin: its files, sorted by the clustering columns (or the row id)."""
    return [
        BinTask(
            table_uri=table_uri,
            inputs=tuple(item["path"] for item in group),
            output=f"{COMPACTED_DIR}/{run}/bin-{index:05d}.zstd.parquet",
            sort_columns=clustering,
            row_id_column=ROW_ID_COLUMN,
            expected_rows=_logged_rows(group),
        )
        for index, group in enumerate(bins)
    ]


def _range_tasks(
    table_uri: str, inputs: list[dict[str, Any]], clustering: tuple[str, ...], ranges: int,
    run: str,
) -> list[BinTask]:  # fmt: skip
    """One task per range of the first clustering column, each over all the inputs."""
    paths = tuple(item["path"] for item in inputs)
    column = clustering[0]
    boundaries = range_boundaries([str(Path(table_uri) / p) for p in paths], column, ranges)
    return [
        BinTask(
            table_uri=table_uri,
            inputs=paths,
            output=f"{COMPACTED_DIR}/{run}/range-{index:05d}.zstd.parquet",
            sort_columns=clustering,
            row_id_column=ROW_ID_COLUMN,
            expected_rows=None,  # per range unknown; the run's total is checked
            key_range=KeyRange(column, boundaries, index),
        )
        for index in range(len(boundaries) + 1)
    ]


def _run_tasks(spark: SparkSession, tasks: list[BinTask]) -> list[WrittenFile]:
    """Each task in its own Spark task; each writes and checks one file."""
    try:
        return spark.sparkContext.parallelize(tasks, len(tasks)).map(rewrite_bin).collect()
    except Exception as exc:
        raise RuntimeError(f"a bin rewrite task failed: {_task_failure(exc)}") from exc


def _logged_rows(group: list[dict[str, Any]]) -> int | None:
    """The bin's row count from the Delta log's stats, if every file has them."""
    counts: list[int | None] = [item.get("num_records") for item in group]
    known = [count for count in counts if count is not None]
    return sum(known) if len(known) == len(counts) else None


def _task_failure(exc: Exception) -> str:
    """The Python error line out of a Spark job failure (its text is a long Java trace)."""
    lines = [line.strip() for line in str(exc).splitlines()]
    found = [line for line in lines if line.startswith("flush.") or (
        ": " in line and line.split(": ", 1)[0].endswith(("Error", "Failed", "Exception"))
        and not line.startswith(("py4j", "org.apache", "java."))
    )]  # fmt: skip
    return found[-1] if found else (lines[0] if lines else type(exc).__name__)


def _rewrite_clustered(
    spark: SparkSession, table_uri: str, inputs: list[str], clustering: tuple[str, ...],
    outputs: int, run: str,
) -> list[WrittenFile]:  # fmt: skip
    """Spark SQL range-partitions ``inputs`` on ``clustering`` into ``outputs`` sorted files.

    The files of one run cover non-overlapping ranges of the clustering columns.
    Spark's writer does not fsync, so the driver does before anything is committed.
    """
    from pyspark.sql.pandas.types import from_arrow_schema

    target = Path(table_uri) / COMPACTED_DIR / run
    schema = pq.read_schema(inputs[-1])
    # The schema is known: giving it spares Spark a job that opens every footer.
    (
        spark.read.schema(from_arrow_schema(schema))
        .parquet(*inputs)
        .repartitionByRange(outputs, *clustering)
        .sortWithinPartitions(*clustering, ROW_ID_COLUMN)
        .write.option("compression", "zstd")
        .mode("error")
        .parquet(str(target))
    )
    for side_file in [*target.glob("_SUCCESS"), *target.glob(".*.crc")]:
        side_file.unlink()  # Spark's markers and checksums: not data, never referenced
    written = []
    for part in sorted(target.glob("part-*.parquet")):
        with open(part, "rb") as handle:
            os.fsync(handle.fileno())
        metadata = pq.read_metadata(part)
        relative = str(part.relative_to(table_uri))
        stats = file_stats(metadata, schema)
        written.append(WrittenFile(relative, part.stat().st_size, metadata.num_rows, stats))
    fsync_folder(target)
    return written


def compact_table(
    spark: SparkSession,
    table_uri: str,
    policy: CompactionPolicy = CompactionPolicy(),
    progress: Callable[[str], None] = lambda message: None,
) -> CompactionResult:
    """Run one compaction of a table; see the module docstring for the steps.

    Returns:
        The run's result; ``status`` says whether it committed (SUCCEEDED), found
        nothing to do, or was ABANDONED (inputs changed; outputs deleted).

    Raises:
        Exception: an unexpected failure; outputs are deleted first.
    """
    result = CompactionResult(table_uri, started_at=time.time())
    run = f"{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    outputs: list[WrittenFile] = []
    try:
        with _table_lock(table_uri):
            # Step 1: the snapshot and the plan.
            table = DeltaTable(table_uri)
            files = live_files(table)
            bins = plan_bins(files, policy)
            if not bins:
                result.ended_at = time.time()
                return result
            inputs = [item for group in bins for item in group]
            result.files_in = len(inputs)
            result.bytes_in = sum(item["size_bytes"] for item in inputs)
            result.rows_in = sum(item["num_records"] for item in inputs)
            result.bins = [len(group) for group in bins]
            progress(f"{len(inputs)} files ({result.bytes_in / MiB:.1f} MiB) in {len(bins)} bin(s)")
            # Step 2: rewrite with Spark, and check that nothing was lost or doubled.
            if not policy.clustering or len(bins) == 1:
                progress(f"rewriting {len(bins)} bin(s), one Spark task each")
                tasks = _bin_tasks(table_uri, bins, policy.clustering, run)
                outputs.extend(_run_tasks(spark, tasks))
            elif len(bins) <= MAX_RANGE_TASKS:
                tasks = _range_tasks(table_uri, inputs, policy.clustering, len(bins), run)
                progress(f"rewriting {len(tasks)} range(s) of {policy.clustering[0]}, "
                         "one Spark task each")  # fmt: skip
                outputs.extend(_run_tasks(spark, tasks))
            else:
                paths = [str(Path(table_uri) / item["path"]) for item in inputs]
                progress(f"range-partitioning into {len(bins)} clustered files")
                outputs.extend(
                    _rewrite_clustered(spark, table_uri, paths, policy.clustering, len(bins), run)
                )
                _check_row_ids(table_uri, paths, outputs)
            result.files_out = len(outputs)
            result.bytes_out = sum(o.size for o in outputs)
            result.rows_out = sum(o.rows for o in outputs)
            if result.rows_out != result.rows_in:
                raise RuntimeError(
                    f"rows out ({result.rows_out}) differ from rows in ({result.rows_in})"
                )
            progress(f"{len(outputs)} file(s) written and checked")
            failpoint("compaction_before_commit")
            # Step 3: one commit, if every input is still live.
            result.version = _commit(table_uri, inputs, outputs, run)
            failpoint("compaction_after_commit")
            result.status = "SUCCEEDED"
            progress(
                f"committed version {result.version}: {result.files_in} -> {result.files_out} files"
            )
    except CompactionAbandoned as exc:
        result.status, result.error = "ABANDONED", str(exc)
        _remove_outputs(table_uri, run)
    except BaseException as exc:
        result.status, result.error = "FAILED", f"{type(exc).__name__}: {exc}"
        _remove_outputs(table_uri, run)
        result.ended_at = time.time()
        raise
    result.ended_at = time.time()
    return result


def _commit(table_uri: str, inputs: list[dict], outputs: list[WrittenFile], run: str) -> int:
    """Remove the inputs and add the outputs in one commit (``dataChange=false``).

    Any concurrent commit makes delta-rs refuse this one (it is stamped for the next
    version only, see flush.commit_clock); it is retried on the newest version with its
    inputs checked again, and abandoned when a concurrent commit removed an input (a
    DELETE, UPDATE or MERGE, or another compaction).
    """
    for attempt in commit_conflict_retries():
        with attempt:
            latest = DeltaTable(table_uri)
            live = {row["path"] for row in live_files(latest)}
            gone = [item["path"] for item in inputs if item["path"] not in live]
            if gone:
                raise CompactionAbandoned(f"{len(gone)} input file(s) were removed concurrently")
            now = int(time.time() * 1000)
            actions: list[AddAction | RemoveAction] = [
                RemoveAction(item["path"], False, now, item["size_bytes"]) for item in inputs
            ]
            actions += [o.add_action(data_change=False) for o in outputs]
            latest.create_write_transaction(
                actions,
                "append",
                latest.schema(),
                commit_properties=stamped(latest, {"ingest.compaction": run}),
            )
            latest.update_incremental()
            return latest.version()
    raise AssertionError("unreachable: the retries raise when they give up")


def _remove_outputs(table_uri: str, run: str) -> None:
    for folder in (Path(table_uri) / COMPACTED_DIR).glob(f"{run}*"):
        shutil.rmtree(folder, ignore_errors=True)
