"""Intermediate Parquet files: written once, fsynced, described for the Delta log.

Flushes write small, lightly encoded files (snappy, no sorting) under the
table's ``_ingest/`` folder with unique names, so a crash can only leave an
unreferenced file behind, never a half-referenced one. Each file comes with the
Delta ``stats`` (row count, per-column min, max and null count) that let
readers skip it.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from flush.tables import INGEST_DIR

__all__ = ["WrittenFile", "file_stats", "write_parquet_file"]

#: Strings longer than this get no min/max statistics (a truncated max would be wrong).
MAX_STRING_STAT = 64


@dataclass(frozen=True, slots=True)
class WrittenFile:
    """A data file on disk, ready to be added to the Delta log."""

    path: str  # relative to the table root
    size: int
    rows: int
    stats: str

    def add_action(self, data_change: bool = True) -> AddAction:
        return AddAction(self.path, self.size, {}, int(time.time() * 1000), data_change, self.stats)


def _stat_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return orjson.Fragment(format(value, "f"))
    if isinstance(value, datetime):
        text = value.replace(tzinfo=None).isoformat(timespec="microseconds")
        return text + ("Z" if value.tzinfo is not None else "")
    if isinstance(value, date):
        return value.isoformat()
    return value


def file_stats(table: pa.Table) -> str:
    """Delta file statistics as JSON text: numRecords, minValues, maxValues, nullCount."""
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, column in zip(table.column_names, table.columns, strict=True):
        nulls[name] = column.null_count
        kind = column.type
        if not (
            pa.types.is_integer(kind)
            or pa.types.is_floating(kind)
            or pa.types.is_decimal(kind)
            or pa.types.is_date(kind)
            or pa.types.is_timestamp(kind)
            or pa.types.is_string(kind)
        ):
            continue
        if column.null_count == len(column):
            continue
        if pa.types.is_string(kind) and pc.max(pc.utf8_length(column)).as_py() > MAX_STRING_STAT:
            continue
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if isinstance(low, float) and (low != low or high != high):
            continue  # NaN has no order
        minimum[name], maximum[name] = _stat_value(low), _stat_value(high)
    stats = {
        "numRecords": table.num_rows,
        "minValues": minimum,
        "maxValues": maximum,
        "nullCount": nulls,
    }
    return orjson.dumps(stats).decode()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_parquet_file(
    table_uri: str,
    data: pa.Table,
    folder: str = INGEST_DIR,
    compression: str = "snappy",
    **parquet_options: Any,
) -> WrittenFile:
    """Write ``data`` as a new Parquet file inside the table folder and fsync it.

    The name is unique (uuid4), so no flush can overwrite another's file.
    """
    directory = Path(table_uri) / folder
    directory.mkdir(parents=True, exist_ok=True)
    relative = f"{folder}/{uuid.uuid4().hex}.parquet"
    target = Path(table_uri) / relative
    with open(target, "wb") as handle:
        pq.write_table(data, handle, compression=compression, **parquet_options)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(directory)
    return WrittenFile(relative, target.stat().st_size, data.num_rows, file_stats(data))
