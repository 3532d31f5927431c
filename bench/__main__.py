"""`make bench`: run every benchmark and print its JSON result (one document per line).

``python -m bench conversion`` runs one of them by name. ``--scale S`` multiplies each
one's sizes (rows, files, producers, measuring windows; each has a floor that still runs
every step); without it each runs at scale 1, the run docs/benchmarks.md reports, unless
its environment knobs say otherwise (its module's docstring: ``BENCH_QUICK=1`` and
others). ``--scale 0.001`` is the smoke run the test suite makes of every entry
(tests/bench/test_smoke.py): seconds to a minute each, numbers that mean nothing.
"""

from collections.abc import Callable
from typing import Any

from bench import (
    backpressure,
    bucket,
    catalog,
    change_streams,
    compaction,
    conversion,
    dynamic_table_adaptive,
    dynamic_table_engine,
    dynamic_table_memory,
    dynamic_tables,
    ingest,
    pipelines,
    tpch,
)
from bench.cli import run as run_cli
from bench.pipelines import cli
from ingest_sdk.process_exit import run_entry_point

BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "conversion": conversion.run,
    "ingest": ingest.run,
    "compaction": compaction.run,
    "backpressure": backpressure.run,
    "json": conversion.run_json,
    "stream_read_vs_scan": pipelines.run_stream_read,
    "append_only_growth": pipelines.run_append_only_growth,
    "consuming_insert": pipelines.run_consuming_insert,
    "plan_guard": pipelines.run_plan_guard,
    "dt_no_data": dynamic_tables.run_no_data,
    "dt_incremental_vs_full": dynamic_tables.run_incremental_vs_full,
    "dt_full_diff_vs_rewrite": dynamic_tables.run_full_diff_vs_rewrite,
    "dt_freshness": dynamic_tables.run_freshness,
    "dt_engine_vs_full": dynamic_table_engine.run_engine_vs_full,
    "dt_adaptive_shares": dynamic_table_adaptive.run_adaptive_shares,
    "dt_refresh_memory": dynamic_table_memory.run_refresh_memory,
    "dt_tpch": tpch.run_tpch,
    "cs_throughput": change_streams.run_throughput,
    "cs_latency": change_streams.run_latency,
    "cli": run_cli,
    "catalog": catalog.run,
    "bucket": bucket.run,
}


def main() -> None:
    cli("python -m bench", __doc__, BENCHMARKS)


if __name__ == "__main__":
    run_entry_point(main)
