"""Backpressure: fairness of admission between producers, and the server's memory, under load.

16 producer processes (8 sending lists of dicts through ``insert_rows``, 8 sending Arrow
tables through ``insert_batch``, each with its own client and channel) insert ~1 MiB batches
as fast as they can for ``seconds`` (default 45 s) into a server process started with
``--buffer-limit-mb 8 --no-auto-compaction``. The same producers then run for the same time
against a server with a 512 MiB buffer: the baseline, measured in the same run.

Reported per run: each producer's admitted requests, their min/max/mean/stddev and Jain's
fairness index (overall and within each kind, as a rows producer also pays for conversion on
the client), each producer's longest stall (time between two admissions), admissions per
10 s, the producers that failed and why (``BackpressureError`` once the SDK's retry deadline
passed, or anything else), and the server's peak RSS (``VmHWM``) beside its RSS sampled every
0.25 s, its CPU time, 429s and flushes.

Counting, from the producer's side. Two client modes (``BENCH_BACKPRESSURE_CLIENT``):

- ``one`` (default): ``ClientLimits(max_buffer_bytes=1)``, so a channel has one ~1 MiB
  request in flight and an insert call returns once the previous request was acknowledged
  (admitted). Admitted = insert calls returned in the window minus the one still in flight.
- ``sdk``: the SDK's default limits, as an application runs it. Insert calls return once
  the batch is in the channel's 64 MiB send buffer (they say nothing about admission), and
  the sender merges queued batches into requests of up to 16 MiB, twice the 8 MiB limit.
  Admitted = inserts committed by the end of the window: insert ``n`` carries offset token
  ``str(n)``, and a thread in each producer reads the channel's committed token every 0.5 s.

The committed count is reported in both modes. The SDK retries a refused request (429)
within ``RetryPolicy.deadline``; the benchmark sets 30 s (the SDK default, 120 s, is longer
than a run, so a starved producer would never fail inside it); a producer whose channel
failed stops. At the end of the window every producer reports what it saw and is stopped
(terminated if it is still blocked a few seconds later); nothing after the window counts.

One table shared by all producers (the default): the buffer budget is global to the server
and one table's flush frees every channel's bytes at once, so channels of one table compete
in lock-step, the hardest case for fairness, as in ``bench/ingest.py``.
``BENCH_BACKPRESSURE_TABLES=each`` gives one table per producer.

Knobs (environment, or ``python -m bench.backpressure --help``):
``BENCH_BACKPRESSURE_SECONDS`` (45) per run, ``BENCH_QUICK=1`` (15 s per run),
``BENCH_BACKPRESSURE_CLIENT`` (``one``/``sdk``), ``BENCH_BACKPRESSURE_RETRY_DEADLINE`` (30),
``BENCH_BACKPRESSURE_REQUEST_MB`` (1.0), ``BENCH_BACKPRESSURE_TABLES`` (``one``/``each``).
``scale`` (``python -m bench backpressure --scale S``) multiplies the producers (16, at
least 2) and the seconds per run (45, at least 1, in place of the two knobs above).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from bench.conversion import SCHEMA, make_rows
from bench.pipelines import _rows
from ingest_sdk import (
    ClientLimits,
    OpenChannelRequest,
    RetryPolicy,
    StreamingIngestClient,
    convert_rows,
)

ROOT = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
PRODUCERS = 16  # the first half send rows (insert_rows), the second half Arrow (insert_batch)
SECONDS = 45.0  # per run
LIMITED_BUFFER_MB = 8.0
BASELINE_BUFFER_MB = 512.0
MAX_CLIENT_LAG = 1.0  # the SDK's default
DISTINCT_BATCHES = 2  # distinct payloads per producer, cycled
SETUP_TIMEOUT = 180.0  # every producer has its data ready and its channel open
REPORT_GRACE = 30.0  # after the window, for the last reports to arrive
EXIT_GRACE = 5.0  # after its report, for a producer process to end before it is terminated
PROGRESS_EVERY = 0.5  # seconds between reads of a channel's committed offset token
SAMPLE_EVERY = 0.25  # seconds between samples of the server's VmRSS
MAX_INSERTS = 1_000_000  # per producer and run: a bound on the insert loop besides time
CLIENT_MODES = ("one", "sdk")
ADMITTED_MEANS = {
    "one": "requests (one insert call each) the server acknowledged within the window: insert "
    "calls returned minus the one still in flight",
    "sdk": "inserts (one call each) whose rows were committed by the window's end, read from "
    "the channel's committed offset token (insert n carries token n)",
}


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def default_seconds() -> float:
    if os.environ.get("BENCH_BACKPRESSURE_SECONDS"):
        return float(os.environ["BENCH_BACKPRESSURE_SECONDS"])
    return 15.0 if os.environ.get("BENCH_QUICK", "") not in ("", "0") else SECONDS


# -- the server process ----------------------------------------------------------------------


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (bytes) of a live process; empty once it is gone."""
    values: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return values


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class _Server:
    """``python -m channel_server`` on a free loopback port, its stderr in a file."""

    def __init__(self, warehouse: Path, buffer_limit_mb: float, log: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "channel_server", "--host", "127.0.0.1", "--port", "0",
             "--warehouse", str(warehouse), "--buffer-limit-mb", str(buffer_limit_mb),
             "--no-auto-compaction", "--log-level", "WARNING"],
            stdout=subprocess.PIPE, stderr=self._log, env=env, cwd=ROOT,
        )  # fmt: skip
        self.log_path = log
        try:
            self.url = self._read_url(timeout=60.0)
        except BaseException:
            self.stop()
            raise

    def _read_url(self, timeout: float) -> str:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        if not ready:
            raise RuntimeError(f"the server did not report its URL within {timeout} s")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the server exited (code {self.process.poll()}): {self.log_tail()}")
        return str(orjson.loads(line)["url"])

    def log_tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def metrics(self) -> dict[str, float]:
        """``ingest_*`` samples of /metrics, by name without the prefix: each name summed over
        its label values, and each labelled sample also under ``name{labels}``."""
        values: dict[str, float] = {}
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if not line.startswith("ingest_"):
                continue
            series, _, rest = line.rpartition("}") if "{" in line else line.partition(" ")
            if "{" in line:
                series += "}"
            try:
                value = float(rest.split()[0])
            except (ValueError, IndexError):
                continue
            name = series.split("{", 1)[0].removeprefix("ingest_")
            values[name] = values.get(name, 0.0) + value
            if "{" in series:
                values[series.removeprefix("ingest_")] = value
        return values

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


class _Sampler(threading.Thread):
    """Samples the server's VmRSS (and buffer use, from /metrics) until stopped."""

    def __init__(self, server: _Server, limit_seconds: float) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.server = server
        self.rss: list[int] = []
        self.buffer: list[float] = []
        self._stop_event = threading.Event()
        self._max_samples = int(limit_seconds / SAMPLE_EVERY) + 1

    def run(self) -> None:
        for number in range(self._max_samples):
            if self._stop_event.is_set():
                return
            status = _proc_status(self.server.process.pid)
            if "VmRSS" in status:
                self.rss.append(status["VmRSS"])
            if number % 2 == 0:
                with contextlib.suppress(Exception):
                    self.buffer.append(self.server.metrics().get("buffer_bytes_used", 0.0))
            self._stop_event.wait(SAMPLE_EVERY)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(10)


# -- one producer process ----------------------------------------------------------------------


def _error(exc: BaseException, at: float) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc)[:300], "at_s": round(at, 2)}


def _committed(channel: Any) -> int | None:
    """Inserts committed so far (insert ``n`` carries token ``str(n)``); None if unknown."""
    try:
        token = channel.get_latest_committed_offset_token()
    except Exception:
        return None
    return int(token) + 1 if token is not None else 0


def _producer(
    url: str, table_name: str, index: int, arrow: bool, rows_per_request: int, seconds: float,
    client_mode: str, retry_deadline: float, barrier: Any, results: Any,
) -> None:  # fmt: skip
    """Insert as fast as the client lets it for ``seconds``; report progress at the end.

    The main thread inserts; a watcher thread reads the committed offset token and, at the
    end of the window, puts the report on ``results`` even while an insert call is blocked.
    """
    report: dict[str, Any] = {"producer": index, "kind": "arrow" if arrow else "rows",
                              "returns_s": [], "progress": [], "error": None}  # fmt: skip
    started = time.perf_counter()
    try:
        rows = make_rows(DISTINCT_BATCHES * rows_per_request, seed=300 + index)
        slices = [rows[i : i + rows_per_request] for i in range(0, len(rows), rows_per_request)]
        pool: list[Any] = slices
        if arrow:
            pool = []
            for part in slices:
                batch, _ = convert_rows(SCHEMA, part)
                assert batch is not None
                pool.append(pa.Table.from_batches([batch]))
        convert_rows(SCHEMA, rows[:1000])  # the first call pays one-time costs: not in the window
        database, schema, table = table_name.split(".")
        limits = ClientLimits(max_buffer_bytes=1) if client_mode == "one" else ClientLimits()
        client = StreamingIngestClient(
            f"bp{index}", url=url, max_client_lag=MAX_CLIENT_LAG, limits=limits,
            retry=RetryPolicy(deadline=retry_deadline),
        )  # fmt: skip
        channel = client.open_channel(OpenChannelRequest(f"bp{index}", database, schema, table))
    except BaseException as exc:
        report["error"] = _error(exc, time.perf_counter() - started)
        with contextlib.suppress(Exception):
            barrier.abort()  # the parent stops waiting for a producer that never starts
        results.put(report)
        raise
    try:
        barrier.wait(timeout=SETUP_TIMEOUT)
        started = time.perf_counter()
        end = started + seconds

        def watch() -> None:
            progress: list[tuple[float, int]] = report["progress"]
            for _ in range(int(seconds / PROGRESS_EVERY) + 2):
                wait = min(PROGRESS_EVERY, end - time.perf_counter())
                if wait > 0:
                    time.sleep(wait)
                count = _committed(channel)
                if count is not None:
                    progress.append((round(time.perf_counter() - started, 2), count))
                if time.perf_counter() >= end:
                    break
            # A copy: the queue pickles it later, in its own thread, while inserts go on.
            results.put({**report, "returns_s": list(report["returns_s"]),
                         "progress": list(progress)})  # fmt: skip

        watcher = threading.Thread(target=watch, name="watch", daemon=True)
        watcher.start()
        returns: list[float] = report["returns_s"]
        try:
            for number in range(MAX_INSERTS):
                if time.perf_counter() >= end:
                    break
                payload = pool[number % len(pool)]
                if arrow:
                    channel.insert_batch(payload, end_offset_token=str(number))
                else:
                    channel.insert_rows(payload, end_offset_token=str(number))
                returns.append(round(time.perf_counter() - started, 3))
        except Exception as exc:
            if time.perf_counter() < end:  # a failure after the window is not the run's
                report["error"] = _error(exc, time.perf_counter() - started)
        watcher.join(seconds + 10)
    finally:
        # Nothing after the window is measured: leave without waiting for queued rows (the
        # parent terminates this process if closing hangs).
        with contextlib.suppress(Exception):
            channel.close(timeout=1.0)
        with contextlib.suppress(Exception):
            client.close()


# -- one run against one server ----------------------------------------------------------------


def _jain(values: list[int]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one producer gets everything."""
    squares = sum(v * v for v in values)
    return round(sum(values) ** 2 / (len(values) * squares), 3) if squares else 0.0


def _spread(values: list[int]) -> dict[str, Any]:
    return {
        "min": min(values),
        "max": max(values),
        "mean": round(statistics.fmean(values), 1),
        "stddev": round(statistics.pstdev(values), 1),
        "jain": _jain(values),
    }


def _summarise(report: dict[str, Any], seconds: float, client_mode: str) -> dict[str, Any]:
    """Admitted and committed inserts, admissions per 10 s and the longest stall of a producer.

    Admission times: in mode ``one`` the return of insert call k+1 marks the acknowledgement
    of request k (exact to one request); in mode ``sdk`` the reads of the committed token.
    """
    progress = [(t, n) for t, n in report["progress"] if t <= seconds + 1.0]
    committed = progress[-1][1] if progress else 0
    if client_mode == "one":
        times = [t for t in report["returns_s"] if t <= seconds][1:]
    else:
        times, previous = [], 0
        for t, count in progress:
            times += [t] * max(0, count - previous)
            previous = max(previous, count)
    buckets = [0] * math.ceil(seconds / 10)
    for t in times:
        buckets[min(len(buckets) - 1, int(t // 10))] += 1
    error = report["error"]
    marks = [0.0, *times, min(seconds, error["at_s"]) if error else seconds]
    return {
        "admitted": len(times),
        "committed": committed,
        "longest_stall_s": round(max(b - a for a, b in itertools.pairwise(marks)), 1),
        "admitted_per_10s": buckets,
        "insert_calls_returned": sum(1 for t in report["returns_s"] if t <= seconds),
        "error": error,
    }


def _run_once(
    folder: Path, buffer_limit_mb: float, producer_count: int, seconds: float,
    rows_per_request: int, client_mode: str, retry_deadline: float, tables: str,
) -> dict[str, Any]:  # fmt: skip
    context = multiprocessing.get_context("spawn")
    name = f"buffer_{buffer_limit_mb:g}mb"
    begun = time.perf_counter()
    server = _Server(folder / name, buffer_limit_mb, folder / f"{name}.log")
    processes: list[Any] = []
    sampler: _Sampler | None = None
    reports: list[dict[str, Any]] = []
    try:
        table_names = (
            [f"bench.public.bp_{i}" for i in range(producer_count)] if tables == "each"
            else ["bench.public.bp"] * producer_count
        )  # fmt: skip
        with StreamingIngestClient("bench-admin", url=server.url) as admin:
            for table_name in sorted(set(table_names)):
                admin.create_table(table_name, SCHEMA.declarations())
        idle_rss = _proc_status(server.process.pid).get("VmRSS", 0)
        cpu_before = _cpu_seconds(server.process.pid)
        barrier = context.Barrier(producer_count + 1)
        results = context.Queue()
        for i in range(producer_count):
            process = context.Process(
                target=_producer,
                args=(server.url, table_names[i], i, i >= producer_count // 2, rows_per_request,
                      seconds, client_mode, retry_deadline, barrier, results),
                daemon=True,
            )  # fmt: skip
            process.start()
            processes.append(process)
        try:
            barrier.wait(timeout=SETUP_TIMEOUT)
        except threading.BrokenBarrierError:
            with contextlib.suppress(Exception):
                while len(reports) < producer_count:
                    reports.append(results.get(timeout=2))
            raise RuntimeError(
                f"producers did not start: {[r['error'] for r in reports if r['error']]}; "
                f"server log: {server.log_tail()}"
            ) from None
        sampler = _Sampler(server, seconds + REPORT_GRACE + 10)
        sampler.start()
        started = time.perf_counter()
        setup_seconds = started - begun
        deadline = started + seconds + REPORT_GRACE
        while len(reports) < producer_count and time.perf_counter() < deadline:
            with contextlib.suppress(Exception):
                reports.append(results.get(timeout=max(0.1, deadline - time.perf_counter())))
        reported_after = time.perf_counter() - started
        sampler.stop()
        status = _proc_status(server.process.pid)
        cpu = _cpu_seconds(server.process.pid) - cpu_before
        metrics: dict[str, float] = {}
        with contextlib.suppress(Exception):
            metrics = server.metrics()
        exit_by = time.perf_counter() + EXIT_GRACE
        for process in processes:
            process.join(max(0.1, exit_by - time.perf_counter()))
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        if sampler is not None:
            sampler.stop()
        stopping = time.perf_counter()
        server.stop()
        stop_seconds = time.perf_counter() - stopping
    by_index = {r["producer"]: r for r in reports}
    producers = []
    for i in range(producer_count):
        report = by_index.get(i) or {
            "producer": i, "kind": "arrow" if i >= producer_count // 2 else "rows", "returns_s": [],
            "progress": [], "error": {"type": "NoReport", "message": "no report in time",
                                      "at_s": None},
        }  # fmt: skip
        producers.append(
            {"producer": i, "kind": report["kind"], **_summarise(report, seconds, client_mode)}
        )
    admitted = [p["admitted"] for p in producers]
    failed = [
        {"producer": p["producer"], "kind": p["kind"], "admitted_before": p["admitted"],
         **p["error"]}
        for p in producers if p["error"]
    ]  # fmt: skip
    stalls = [p["longest_stall_s"] for p in producers]
    rss = sampler.rss if sampler else []
    buffer = sampler.buffer if sampler else []
    result: dict[str, Any] = {
        "buffer_limit_mb": buffer_limit_mb,
        "admitted_per_producer": admitted,
        **_spread(admitted),
        "rows_producers": _spread([p["admitted"] for p in producers if p["kind"] == "rows"]),
        "arrow_producers": _spread([p["admitted"] for p in producers if p["kind"] == "arrow"]),
        "admitted_total": sum(admitted),
        "rows_admitted_total": sum(admitted) * rows_per_request,
        "failed": failed,
        "longest_stall_s_per_producer": stalls,
        "longest_stall_s_max": max(stalls),
        "admitted_per_10s_per_producer": [p["admitted_per_10s"] for p in producers],
        "committed_per_producer": [p["committed"] for p in producers],
        "insert_calls_returned_per_producer": [p["insert_calls_returned"] for p in producers],
    }
    return {
        **result,
        "server_peak_rss_mb": round(status.get("VmHWM", 0) / MiB, 1),
        "server_rss_sampled_max_mb": round(max(rss, default=0) / MiB, 1),
        "server_rss_sampled_mean_mb": round(statistics.fmean(rss) / MiB, 1) if rss else 0.0,
        "server_rss_idle_mb": round(idle_rss / MiB, 1),
        "server_cpu_s": round(cpu, 1),
        "server_buffer_peak_mb": round(metrics.get("buffer_bytes_peak", 0) / MiB, 2),
        "server_buffer_sampled_mean_mb": round(statistics.fmean(buffer) / MiB, 2)
        if buffer
        else 0.0,
        "server_rejected_requests": int(metrics.get("rejected_requests_total", 0)),
        "server_rejected_429": int(metrics['rejected_requests_total{code="BACKPRESSURE"}'])
        if 'rejected_requests_total{code="BACKPRESSURE"}' in metrics
        else None,
        "server_batches_inserted": int(metrics.get("batches_inserted_total", 0)),
        "server_flushes": int(
            metrics.get("flushes_total", metrics.get("flush_duration_seconds_count", 0))
        ),
        "server_producers_waiting_at_end": metrics.get("producers_waiting"),
        "seconds_setup": round(setup_seconds, 1),
        "seconds_until_all_reported": round(reported_after, 1),
        "seconds_server_stop": round(stop_seconds, 1),
    }


def run(
    scale: float | None = None, seconds: float | None = None, client_mode: str | None = None,
    retry_deadline: float | None = None, request_mb: float | None = None,
    tables: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    producers = PRODUCERS if scale is None else _rows(scale, PRODUCERS, least=2)
    if seconds is None:
        seconds = default_seconds() if scale is None else max(1.0, SECONDS * scale)
    client_mode = client_mode or os.environ.get("BENCH_BACKPRESSURE_CLIENT", "one")
    if client_mode not in CLIENT_MODES:
        raise ValueError(f"client mode must be one of {CLIENT_MODES}, not {client_mode!r}")
    if retry_deadline is None:
        retry_deadline = _env_float("BENCH_BACKPRESSURE_RETRY_DEADLINE", 30.0)
    if request_mb is None:
        request_mb = _env_float("BENCH_BACKPRESSURE_REQUEST_MB", 1.0)
    tables = tables or os.environ.get("BENCH_BACKPRESSURE_TABLES", "one")
    if tables not in ("one", "each"):
        raise ValueError(f"tables must be 'one' or 'each', not {tables!r}")
    sample, _ = convert_rows(SCHEMA, make_rows(2000, seed=1))
    assert sample is not None
    row_bytes = sample.nbytes / sample.num_rows
    rows_per_request = max(1, round(request_mb * MiB / row_bytes))
    folder = Path(tempfile.mkdtemp(prefix="bench-backpressure-"))
    runs: dict[str, dict[str, Any]] = {}
    try:
        for label, limit in (("limited", LIMITED_BUFFER_MB), ("baseline", BASELINE_BUFFER_MB)):
            try:
                runs[label] = _run_once(folder, limit, producers, seconds, rows_per_request,
                                        client_mode, retry_deadline, tables)  # fmt: skip
            except Exception as exc:  # report the other run; the error says what broke
                runs[label] = {"buffer_limit_mb": limit,
                               "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    limited, baseline = runs["limited"], runs["baseline"]
    result: dict[str, Any] = {
        "benchmark": "backpressure_fairness",
        "scale": scale,
        "producers": producers,
        "producer_kinds": ["rows"] * (producers // 2) + ["arrow"] * (producers - producers // 2),
        "seconds_per_run": seconds,
        "client_mode": client_mode,
        "admitted_means": ADMITTED_MEANS[client_mode],
        "insert_rows": rows_per_request,
        "insert_mb": round(rows_per_request * row_bytes / MiB, 2),
        "tables": "one shared table" if tables == "one" else "one table per producer",
        "sdk_retry_deadline_s": retry_deadline,
        "max_client_lag_s": MAX_CLIENT_LAG,
        "cpus": os.cpu_count(),
        f"limited_{LIMITED_BUFFER_MB:g}mb": limited,
        f"baseline_{BASELINE_BUFFER_MB:g}mb": baseline,
    }
    if "error" not in limited and "error" not in baseline:
        pairs = {
            "jain": lambda r: r["jain"],
            "jain_within_rows": lambda r: r["rows_producers"]["jain"],
            "jain_within_arrow": lambda r: r["arrow_producers"]["jain"],
            "min_over_max": lambda r: round(r["min"] / max(r["max"], 1), 3),
            "failed": lambda r: len(r["failed"]),
            "longest_stall_s_max": lambda r: r["longest_stall_s_max"],
            "admitted_total": lambda r: r["admitted_total"],
            "peak_rss_mb": lambda r: r["server_peak_rss_mb"],
        }
        result["comparison_limited_vs_baseline"] = {
            key: [pick(limited), pick(baseline)] for key, pick in pairs.items()
        }
    return result


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m bench.backpressure",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=None, help="per run (default 45)")
    parser.add_argument("--quick", action="store_true", help="15 s per run")
    parser.add_argument("--client", choices=CLIENT_MODES, default=None, help="default one")
    parser.add_argument(
        "--retry-deadline",
        type=float,
        default=None,
        help="the SDK RetryPolicy.deadline of every producer (default 30 s)",
    )
    parser.add_argument("--request-mb", type=float, default=None, help="per insert (1.0)")
    parser.add_argument("--tables", choices=["one", "each"], default=None)
    args = parser.parse_args()
    seconds = args.seconds if args.seconds is not None else (15.0 if args.quick else None)
    result = run(None, seconds, args.client, args.retry_deadline, args.request_mb, args.tables)
    print(orjson.dumps(result).decode(), flush=True)


if __name__ == "__main__":
    main()
