"""Compaction throughput beside delta-rs's own ``optimize.compact()``, and scan speed-up.

A table of 1,000 small intermediate files (as flushes leave them) is copied
twice: one copy is compacted by our Spark job (clustered by ``K``), the other by
``DeltaTable.optimize.compact()``, in the same run. Reported: MB/s and rows/s
in for each, and the time of a filtered scan (1% of ``K``) before and after.

Targets (issue 4): within 2x of delta-rs's throughput; the filtered scan at least
5x faster after compaction with clustering.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction

from flush import create_table
from flush.compaction import CompactionPolicy, compact_table
from flush.parquet_files import write_parquet_file
from flush.spark_tables import spark_session
from flush.tables import ROW_ID_COLUMN
from ingest_sdk import TableSchema, convert_rows

SCHEMA = TableSchema.parse(
    {"ID": "NUMBER(18,0) NOT NULL", "K": "NUMBER(9,0)", "NAME": "VARCHAR(64)",
     "PRICE": "FLOAT", "TS": "TIMESTAMP_NTZ(6)"}
)  # fmt: skip
MiB = 1024 * 1024


def build_table(uri: str, files: int, rows_per_file: int) -> int:
    """``files`` intermediate files committed in one Delta commit; returns total bytes."""
    import random

    create_table(uri, SCHEMA)
    rng = random.Random(5)
    actions: list[AddAction] = []
    total = 0
    for number in range(files):
        first = number * rows_per_file
        rows = [
            {"ID": first + i, "K": rng.randrange(10_000),
             "NAME": f"customer-{rng.randrange(10**9)}", "PRICE": rng.random() * 100,
             "TS": 1_700_000_000 + first + i}
            for i in range(rows_per_file)
        ]  # fmt: skip
        batch, _ = convert_rows(SCHEMA, rows)
        data = pa.Table.from_batches([batch]).append_column(
            pa.field(ROW_ID_COLUMN, pa.int64(), nullable=False),
            pa.array(range(first, first + rows_per_file), pa.int64()),
        )
        written = write_parquet_file(uri, data)
        actions.append(written.add_action())
        total += written.size
    table = DeltaTable(uri)
    table.create_write_transaction(actions, "append", table.schema())  # type: ignore[arg-type]
    return total


def filtered_scan_seconds(uri: str, repeats: int = 5) -> float:
    """Median time of a scan for 1% of K, through delta-rs with file skipping."""
    times = []
    predicate = (pc.field("K") >= pa.scalar(5000, pa.int64())) & (
        pc.field("K") < pa.scalar(5100, pa.int64())
    )
    for _ in range(repeats):
        started = time.perf_counter()
        table = DeltaTable(uri).to_pyarrow_dataset().to_table(filter=predicate)
        times.append(time.perf_counter() - started)
    assert table.num_rows > 0
    return statistics.median(times)


def run(files: int = 1000, rows_per_file: int = 1000) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    try:
        source = str(folder / "source")
        total_bytes = build_table(source, files, rows_per_file)
        ours, warm, theirs = str(folder / "ours"), str(folder / "warm"), str(folder / "theirs")
        for copy in (ours, warm, theirs):
            shutil.copytree(source, copy)
        rows = files * rows_per_file
        scan_before = filtered_scan_seconds(source)

        started = time.perf_counter()
        spark = spark_session(app_name="bench-compaction")
        spark.sparkContext.setLogLevel("ERROR")
        spark_start = time.perf_counter() - started
        result = compact_table(spark, ours, CompactionPolicy(clustering=("K",)))
        assert result.status == "SUCCEEDED", result.error
        # The same job again in the now-warm JVM: what a long-lived Spark deployment sees.
        warm_result = compact_table(spark, warm, CompactionPolicy(clustering=("K",)))
        assert warm_result.status == "SUCCEEDED", warm_result.error
        spark.stop()

        started = time.perf_counter()
        metrics = DeltaTable(theirs).optimize.compact(target_size=128 * MiB)
        delta_rs_seconds = time.perf_counter() - started

        assert DeltaTable(ours).to_pyarrow_table().num_rows == rows
        scan_after = filtered_scan_seconds(ours)
        ours_mb_s = total_bytes / MiB / result.duration
        theirs_mb_s = total_bytes / MiB / delta_rs_seconds
        return {
            "benchmark": "compaction",
            "files_in": files,
            "rows_in": rows,
            "mb_in": round(total_bytes / MiB, 1),
            "ours_spark": {
                "seconds": round(result.duration, 2),
                "mb_per_s": round(ours_mb_s, 1),
                "rows_per_s": round(rows / result.duration),
                "files_out": result.files_out,
                "spark_session_start_s": round(spark_start, 1),
            },
            "ours_spark_warm_jvm": {
                "seconds": round(warm_result.duration, 2),
                "mb_per_s": round(total_bytes / MiB / warm_result.duration, 1),
                "rows_per_s": round(rows / warm_result.duration),
            },
            "baseline_delta_rs_optimize_compact": {
                "seconds": round(delta_rs_seconds, 2),
                "mb_per_s": round(theirs_mb_s, 1),
                "rows_per_s": round(rows / delta_rs_seconds),
                "files_out": int(metrics.get("numFilesAdded", 0)),
            },
            "throughput_ratio_ours_vs_delta_rs": round(ours_mb_s / theirs_mb_s, 2),
            "throughput_ratio_warm_vs_delta_rs": round(
                total_bytes / MiB / warm_result.duration / theirs_mb_s, 2
            ),
            "filtered_scan_ms_before": round(scan_before * 1000, 1),
            "filtered_scan_ms_after_clustered": round(scan_after * 1000, 1),
            "scan_speedup": round(scan_before / scan_after, 1),
            "targets": {
                "throughput_ratio_min": 0.5,
                "scan_speedup_min": 5.0,
                "met": {
                    "throughput": ours_mb_s / theirs_mb_s >= 0.5,
                    "scan_speedup": scan_before / scan_after >= 5.0,
                },
            },
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
