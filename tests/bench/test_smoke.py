"""Every ``make bench`` entry runs: each one, at smoke size, ends with status 0 and its JSON.

Nothing else runs the benchmarks, so a rename in the code they call would break them
unnoticed. Each case runs ``python -m bench NAME --scale 0.001`` (its sizes at their
floors, as small as a run that goes through all its steps) in a process of its own, as
``make bench`` runs it, except the entries that start a Spark session of their own,
which run together in one process on one session (:data:`SHARED_SPARK`); each checks only
the exit status and the JSON document on stdout: its name, its scale and, where it has
one, its baseline. Times are not checked: at this size they mean nothing.
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
# Seconds. On two cores at load 10-45 a case took 3-85 s, but dt_freshness 430-560 s
# (its service's worker JVM start, and the refreshes it waits for).
TIMEOUT = 600

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
    # Its own process per source size (a fresh JVM with a fixed heap each), but not at
    # smoke size (the shared session, below).
    "dt_refresh_memory": ("dt_refresh_memory", "baseline_full_driver_peak_growth"),
    "dt_tpch": ("dt_tpch", "baseline_full_ms_median"),
    "cs_throughput": ("cs_throughput", "over_baseline"),
    "cs_latency": ("cs_latency", None),
    "cli": ("cli_round_trip", "baseline_request_ms_median"),
    # Starts a PostgreSQL cluster of its own (without PostgreSQL, SQLite alone).
    "catalog": ("catalog_sqlite_vs_postgres", "baseline_sqlite_flush_ms"),
    # Starts moto's S3 server and a PostgreSQL cluster of its own (without PostgreSQL, the
    # local-vs-bucket part alone).
    "bucket": ("bucket", "baseline_local"),
}


def test_every_entry_has_a_case():
    from bench.__main__ import BENCHMARKS

    assert sorted(CASES) == sorted(BENCHMARKS)


#: Entries that run on a Spark session in their own process (``bench.pipelines._Bench``),
#: which they leave running when it was there before them: at smoke size they run one
#: after another in one process, on one session made first, as ``python -m bench a b``
#: runs them (a JVM start each would be most of their time). ``cs_throughput`` also
#: starts service processes of its own (no JVM: its Spark work is the fill's UPDATE);
#: ``compaction`` compacts on the shared session (its "cold" run is then warm).
SHARED_SPARK = (
    "stream_read_vs_scan", "append_only_growth", "consuming_insert", "plan_guard",
    "dt_no_data", "dt_incremental_vs_full", "dt_full_diff_vs_rewrite", "dt_engine_vs_full",
    "dt_adaptive_shares", "dt_tpch", "dt_refresh_memory", "cs_throughput", "compaction",
)  # fmt: skip
_ON_SHARED_SPARK = (
    "import sys\n"
    "from flush.spark_tables import spark_session\n"
    "spark_session('local[2]', app_name='bench-smoke')\n"
    "from bench.__main__ import main\n"
    "from ingest_sdk.process_exit import run_entry_point\n"
    "run_entry_point(main)\n"
)


def _run(argv: list[str], folder, timeout: float) -> tuple[int | None, str, str]:
    """``argv`` in its own process group (the services and JVMs it starts end with it),
    its temporary folders under ``folder``: (exit status, stdout, stderr)."""
    process = subprocess.Popen(
        argv, cwd=ROOT, env=dict(os.environ, TMPDIR=str(folder)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return None, stdout, f"ran over {timeout} s:\n{stderr}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever it left running
    return process.returncode, stdout, stderr


def _check(name: str, document: dict) -> None:
    benchmark, baseline = CASES[name]
    assert document["benchmark"] == benchmark
    assert document["scale"] == 0.001
    if baseline is not None:
        assert baseline in document, sorted(document)


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> tuple[dict[str, dict], str]:
    """The documents of the :data:`SHARED_SPARK` entries, by name, and the run's stderr."""
    status, stdout, stderr = _run(
        [sys.executable, "-c", _ON_SHARED_SPARK, *SHARED_SPARK, *SMOKE],
        tmp_path_factory.mktemp("shared_spark"), TIMEOUT * 3,
    )  # fmt: skip
    documents = [orjson.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    by_benchmark = {document["benchmark"]: document for document in documents}
    found = {name: by_benchmark[CASES[name][0]] for name in SHARED_SPARK
             if CASES[name][0] in by_benchmark}  # fmt: skip
    return found, f"exit status {status}:\n{stderr[-4000:]}"


@pytest.mark.parametrize("name", [name for name in CASES if name not in SHARED_SPARK])
def test_entry_runs_at_smoke_size(name, tmp_path):
    status, stdout, stderr = _run([sys.executable, "-m", "bench", name, *SMOKE], tmp_path,
                                  TIMEOUT)  # fmt: skip
    assert status == 0, stderr[-4000:]
    lines = stdout.splitlines()
    assert len(lines) == 1, stdout[-4000:]
    _check(name, orjson.loads(lines[0]))


@pytest.mark.parametrize("name", SHARED_SPARK)
def test_entry_runs_at_smoke_size_on_a_shared_spark_session(name, shared_run):
    found, outcome = shared_run
    assert name in found, f"python -m bench {name} did not end with its document: {outcome}"
    _check(name, found[name])
