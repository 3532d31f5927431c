"""One compaction bin, rewritten inside a Spark task with Arrow's Parquet reader and writer.

Spark schedules the bins (one task each, so a run spreads over the cluster's
cores); inside a task, Arrow's C++ reader and writer do the columnar work. This
is several times faster than Spark's own row-at-a-time Parquet writer for the
small, wide inputs compaction sees (measured in ``bench/compaction.py``).

A task:
  1. reads its input files (pyarrow dataset, the table's schema);
  2. sorts the rows by the sort columns, then the row id (ingestion order when
     there are no sort columns), so the output is deterministic;
  3. writes one zstd Parquet file with statistics for every column (dictionary
     encoding only for columns whose values repeat), fsyncs it
     and renames it into place (a retried or speculative attempt writes the same
     bytes and replaces it atomically);
  4. reads the written file's row ids back and checks they are exactly the ids it
     read, in order. With the checks on the way in (the row count the Delta log
     gives for the inputs, no row id twice) nothing is lost or doubled before
     anything is committed.

This module runs on executors: it imports only pyarrow and :mod:`flush.parquet_files`.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from flush.parquet_files import WrittenFile, file_stats
from flush.storage import fsync_folder

__all__ = ["BinCheckFailed", "BinTask", "KeyRange", "range_boundaries", "rewrite_bin"]

#: Rows per row group: large groups compress best; readers still skip by group stats.
ROW_GROUP_ROWS = 1024 * 1024


@dataclass(frozen=True, slots=True)
class KeyRange:
    """One of the ranges that ``boundaries`` cut the first sort column into.

    A row's range is the number of boundaries at or below its value, so range
    ``i`` holds ``boundaries[i-1] <= value < boundaries[i]``; nulls and NaN go to
    the last range, where sorting puts them. The ranges cover every row once.
    """

    column: str
    boundaries: tuple[Any, ...]
    index: int

    def predicate(self, kind: pa.DataType) -> ds.Expression | None:
        """The dataset filter for this range (None: every row)."""
        field = pc.field(self.column)
        parts = []
        if self.index > 0:
            parts.append(field >= pa.scalar(self.boundaries[self.index - 1], kind))
        if self.index < len(self.boundaries):
            parts.append(field < pa.scalar(self.boundaries[self.index], kind))
        if not parts:
            return None
        condition = parts[0] if len(parts) == 1 else parts[0] & parts[1]
        if self.index == len(self.boundaries):  # the last range also takes null and NaN
            condition = condition | field.is_null()
            if pa.types.is_floating(kind):
                condition = condition | field.is_nan()
        return condition


@dataclass(frozen=True, slots=True)
class BinTask:
    """What one task rewrites: ``inputs`` (relative to ``table_uri``) into ``output``.

    With ``key_range`` the task reads all of a clustered run's inputs and keeps the
    rows of its range, so the files of the run do not overlap on that column.
    """

    table_uri: str
    inputs: tuple[str, ...]
    output: str  # relative to the table root
    sort_columns: tuple[str, ...]
    row_id_column: str
    expected_rows: int | None  # from the Delta log's stats; None when unknown
    key_range: KeyRange | None = None


class BinCheckFailed(RuntimeError):
    """The written file does not hold exactly the rows read (never committed)."""


def rewrite_bin(task: BinTask) -> WrittenFile:
    """Rewrite one bin; see the module docstring. Raises :class:`BinCheckFailed`."""
    root = Path(task.table_uri)
    paths = [str(root / relative) for relative in task.inputs]
    dataset = _inputs_dataset(paths)
    if task.key_range is None:
        data = dataset.to_table()
    else:
        kind = dataset.schema.field(task.key_range.column).type
        data = dataset.to_table(filter=task.key_range.predicate(kind))
    if task.expected_rows is not None and data.num_rows != task.expected_rows:
        raise BinCheckFailed(
            f"read {data.num_rows} rows from {len(paths)} files whose Delta stats say "
            f"{task.expected_rows}"
        )
    data = _sorted(data, task)
    target = root / task.output
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    collected: list[pq.FileMetaData] = []
    with open(partial, "wb") as handle:
        pq.write_table(
            data, handle, compression="zstd", row_group_size=ROW_GROUP_ROWS,
            use_dictionary=_dictionary_columns(data), write_statistics=True,
            metadata_collector=collected,
        )  # fmt: skip
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, target)
    fsync_folder(target.parent)
    written_ids = pq.read_table(target, columns=[task.row_id_column]).column(0)
    if not written_ids.equals(data.column(task.row_id_column)):
        raise BinCheckFailed(
            f"{task.output}: the row ids written differ from the {data.num_rows} row ids read"
        )
    stats = file_stats(collected[0], data.schema)
    return WrittenFile(task.output, target.stat().st_size, data.num_rows, stats)


def range_boundaries(paths: list[str], column: str, ranges: int) -> tuple[Any, ...]:
    """Up to ``ranges - 1`` values cutting ``column`` into ranges of about equal rows.

    Read from the column alone (cheap); nulls and NaN are left out (they go to the
    last range). Repeated values give fewer, never empty, ranges.
    """
    values = _inputs_dataset(paths).to_table(columns=[column])
    known = pc.drop_null(values.column(0))
    if pa.types.is_floating(known.type):
        known = known.filter(pc.invert(pc.is_nan(known)))
    if len(known) == 0:
        return ()
    ordered = known.take(pc.sort_indices(known))
    lowest = ordered[0].as_py()
    picks: list[Any] = []
    for number in range(1, ranges):
        value = ordered[len(ordered) * number // ranges].as_py()
        if value != lowest and (not picks or value != picks[-1]):
            picks.append(value)
    return tuple(picks)


def _inputs_dataset(paths: list[str]) -> ds.Dataset:
    """The input files as one dataset with the newest file's schema (the last path):
    older undersized files, maybe written by another engine, are cast to it."""
    return ds.dataset(paths, schema=_plain_views(pq.read_schema(paths[-1])), format="parquet")


def _plain_views(schema: pa.Schema) -> pa.Schema:
    """String and binary views (which delta-rs merges write) as plain strings and binaries:
    pyarrow's ``take`` (the sort) has no kernel for views."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    return pa.schema([f.with_type(plain.get(f.type, f.type)) for f in schema], schema.metadata)


def _sorted(data: pa.Table, task: BinTask) -> pa.Table:
    """The rows in output order; refuses repeated row ids (unique per table).

    Flushes hand out row ids in commit order, so a bin of intermediate files read
    in log order is usually in ingestion order already: then the sort is skipped.
    """
    ids = data.column(task.row_id_column)
    if not task.sort_columns and len(ids) > 1:
        values = ids.combine_chunks()
        if pc.all(pc.greater(values[1:], values[:-1])).as_py():
            return data  # strictly increasing: sorted and without repeats
    if pc.count_distinct(ids).as_py() != len(ids):
        raise BinCheckFailed(f"{task.output}: the inputs hold repeated row ids")
    keys = [(name, "ascending") for name in (*task.sort_columns, task.row_id_column)]
    return data.take(pc.sort_indices(data, sort_keys=keys))


def _dictionary_columns(data: pa.Table, sample_rows: int = 65_536) -> list[str]:
    """Columns worth dictionary encoding: each value repeats ten times or more in a sample.

    For mostly-distinct columns a dictionary is built and then abandoned, which
    costs time and, measured on the benchmark table, makes files 8% larger.
    """
    sample = data.slice(0, sample_rows)
    if sample.num_rows == 0:
        return []
    return [
        field.name
        for field, column in zip(sample.schema, sample.columns, strict=True)
        if pc.count_distinct(column).as_py() * 10 <= sample.num_rows
    ]
