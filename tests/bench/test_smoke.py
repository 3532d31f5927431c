"""Every ``make bench`` entry runs: each one, at smoke size, ends with status 0 and its JSON.

Nothing else runs the benchmarks, so a rename in the code they call would break them
unnoticed. Each case runs ``python -m bench NAME --scale 0.001`` (its sizes at their
floors, as small as a run that goes through all its steps) in a process of its own, as
``make bench`` runs it, and checks only the exit status and the JSON document on stdout:
its name, its scale and, where it has one, its baseline. Times are not checked: at this
size they mean nothing.
"""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ("--scale", "0.001")
TIMEOUT = 600  # seconds; a case took 1-80 s on two cores (dt_tpch 80 s at load 10-18)

#: Entry: the ``benchmark`` field of its document, and the key of its baseline (None:
#: its targets are absolute).
CASES = {
    "conversion": ("row_conversion", "baseline_pyarrow_from_pylist"),
    "json": ("json_rows_parse", None),  # a baseline per body, under "bodies"
    "ingest": ("ingest_end_to_end", "peer_write_deltalake_per_batch"),
    "compaction": ("compaction", "baseline_delta_rs_optimize_compact"),
    # Only when both runs ended without an error (a failed run is reported, not raised).
    "backpressure": ("backpressure_fairness", "comparison_limited_vs_baseline"),
    "stream_read_vs_scan": ("pipelines_stream_read_vs_scan", "baseline_full_scan_ms"),
    "append_only_growth": ("pipelines_append_only_growth", "baseline_at_1m"),
    "consuming_insert": ("pipelines_consuming_insert", "baseline_plain_insert_s"),
    "plan_guard": ("pipelines_plan_guard", "baseline_spark_sql_compile_ms"),
    "dt_no_data": ("dt_no_data", None),
    "dt_incremental_vs_full": ("dt_incremental_vs_full", "baseline_full_ms_median"),
    "dt_full_diff_vs_rewrite": ("dt_full_diff_vs_rewrite", "baseline_rewrite_ctas_ms_median"),
    "dt_freshness": ("dt_freshness", None),
    "dt_engine_vs_full": ("dt_engine_vs_full", "baseline_full_ms_median"),
    "dt_adaptive_shares": ("dt_adaptive_shares", "baseline_full_ms"),
    "dt_tpch": ("dt_tpch", "baseline_full_ms_median"),
    "cs_throughput": ("cs_throughput", "over_baseline"),
    "cs_latency": ("cs_latency", None),
}


def test_every_entry_has_a_case():
    from bench.__main__ import BENCHMARKS

    assert sorted(CASES) == sorted(BENCHMARKS)


@pytest.mark.parametrize("name", list(CASES))
def test_entry_runs_at_smoke_size(name, tmp_path):
    # Its own process group, so the services and JVMs it started end with it; its
    # temporary folders under tmp_path.
    process = subprocess.Popen(
        [sys.executable, "-m", "bench", name, *SMOKE], cwd=ROOT, env=dict(os.environ, TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail(f"python -m bench {name} ran over {TIMEOUT} s:\n{stderr[-4000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever it left running
    assert process.returncode == 0, stderr[-4000:]
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout[-4000:]
    document = orjson.loads(lines[0])
    benchmark, baseline = CASES[name]
    assert document["benchmark"] == benchmark
    assert document["scale"] == 0.001
    if baseline is not None:
        assert baseline in document, sorted(document)
