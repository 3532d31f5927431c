"""`make bench`: run every benchmark and print its JSON result (one document per line).

``python -m bench conversion`` runs one of them by name.
"""

import sys

import orjson

from bench import (
    backpressure,
    change_streams,
    compaction,
    conversion,
    dynamic_tables,
    ingest,
    pipelines,
)
from ingest_sdk.process_exit import run_entry_point

BENCHMARKS = {
    "conversion": conversion.run,
    "ingest": ingest.run,
    "compaction": compaction.run,
    "backpressure": backpressure.run,
    "json": conversion.run_json,
    "stream_read_vs_scan": pipelines.run_stream_read,
    "append_only_growth": pipelines.run_append_only_growth,
    "consuming_insert": pipelines.run_consuming_insert,
    "dt_no_data": dynamic_tables.run_no_data,
    "dt_incremental_vs_full": dynamic_tables.run_incremental_vs_full,
    "dt_full_diff_vs_rewrite": dynamic_tables.run_full_diff_vs_rewrite,
    "dt_freshness": dynamic_tables.run_freshness,
    "cs_throughput": change_streams.run_throughput,
    "cs_latency": change_streams.run_latency,
}


def main() -> None:
    names = sys.argv[1:] or list(BENCHMARKS)
    for name in names:
        print(orjson.dumps(BENCHMARKS[name]()).decode(), flush=True)


if __name__ == "__main__":
    run_entry_point(main)
