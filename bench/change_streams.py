"""Change streams: how fast a reader gets the records, and how soon after their commit.

Two benchmarks, each one JSON document with its baseline measured in the same run.

1. ``cs_throughput``: a table ``T (ID NUMBER PRIMARY KEY, GRP, AMOUNT, V)`` watched by a
   change stream with ``OPTIONS (partitions = 8)``, filled as the service fills tables
   (ingest commits with row ids reserved in the catalog, one Parquet file each): 1M rows
   in 10 commits, then an UPDATE of 10% of them (``ID % 10 = 0``, through a session on a
   local Spark): 1.1M mods in 11 versions. Then the same for a table ``U`` without a
   primary key (its mods keyed by the row id). Delivered mods (changed rows) per second:

   (a) in-process: the 8 partitions' bounded reads (``read(..., until_us=...)``) on 8
       threads, from the stream's creation to just after the last commit, every mod
       counted; twice, each time with an empty record cache (in a process the first
       partition to reach a version converts it and the others take it from the cache),
       with where the time goes (the change data feed read, values into Python, the mods,
       grouping them into records, the catalog and the log, waiting for another
       partition's conversion);
   (b) over HTTP: a service process started for the measurement (``python -m
       channel_server --port 0 --change-stream-check-seconds 0``: the balancer off, so the
       partitions stay 8), and 8 concurrent ``read_change_stream`` calls of the async SDK
       in one event loop, ``end_timestamp`` just after the last commit, every record
       parsed. The service is fresh for each table, so its record cache is cold (each
       version is read from the log and converted once, in the service, during the
       measurement); then the same reads again on that service (the cache warm).

   Baseline: what a user would write without change streams, the table's change data
   feed read with delta-rs, ``DeltaTable(uri).load_cdf(starting_version, ending_version)``
   over the same versions, each batch into Python row dicts (``to_pylist``) and iterated;
   the better of two runs. Its rate is the same mods over its time (its raw feed rows,
   update pre- and post-images apart, are reported too). Target: at least 50% of the
   baseline's rate. Also reported: CPU seconds of each side (the baseline's and the
   in-process reads' process; over HTTP the service's plus the client's) and their ratio,
   steadier than wall time on a shared machine; the cyclic garbage collector's time and
   collections during the in-process reads and the baseline; when each face's first
   record came.
2. ``cs_latency``: a service process (the balancer on, as shipped), a table with a primary
   key watched by a change stream of 8 partitions, rows arriving through one channel at
   500 rows/s (``max_client_lag`` 0.2 s), and a reader following every open partition
   over HTTP (``heartbeat_milliseconds=1000``; children after all their parents, if the
   balancer splits or merges) for 60 s. For each data change record: latency = when the
   reader got it (parsed, in the benchmark's process) minus the record's
   ``commit_timestamp`` (the version's commit stamp: one machine, one clock; checked
   against the stamp in the Delta log). Then 10 s with no rows: the latency of the idle
   heartbeats (received minus the heartbeat's timestamp). Target: p99 under 1.5 s.

Both report the load average (sampled every 5 s during the run; the machine may be
shared). Scale: ``--scale`` (``python -m bench.change_streams --scale 0.01``) or
``BENCH_CHANGE_STREAMS_SCALE`` multiplies the rows and the latency window;
``BENCH_QUICK=1`` means scale 0.01. Progress goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pyarrow as pa
from deltalake import DeltaTable

from bench.dynamic_tables import FEED_BATCHES_PER_S, Feed, _ingest
from bench.ingest import ROOT, _percentile, _Server
from bench.pipelines import _Bench, _ms, _rows, _timed, cli
from flush.commit_clock import clock, commit_ts

MILLION = 1_000_000
COMMITS = 10
UPDATE_SHARE = 10  # the UPDATE touches rows with ID % UPDATE_SHARE = 0
PARTITIONS = 8
THROUGHPUT_HEARTBEAT_MS = 10_000
THROUGHPUT_RATIO_MIN = 0.5
LATENCY_SECONDS = 60.0
IDLE_SECONDS = 10.0
FEED_ROWS_PER_S = 500

FEED_LAG_S = 0.2
LATENCY_HEARTBEAT_MS = 1000
LATENCY_P99_MAX_S = 1.5
CATCH_UP_S = 60.0  # after the feed stops, the reader must have every row within this
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_STARTED = time.perf_counter()


def default_scale() -> float:
    if os.environ.get("BENCH_CHANGE_STREAMS_SCALE"):
        return float(os.environ["BENCH_CHANGE_STREAMS_SCALE"])
    return 0.01 if os.environ.get("BENCH_QUICK", "") not in ("", "0") else 1.0


def _progress(message: str) -> None:
    print(
        f"[bench.change_streams {time.perf_counter() - _STARTED:7.1f}s] {message}",
        file=sys.stderr,
        flush=True,
    )


def _micros(text: str) -> int:
    """An RFC 3339 timestamp of a record as µs since the epoch."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _summary_s(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "p50_s": round(statistics.median(values), 3),
        "p95_s": round(_percentile(values, 0.95), 3),
        "p99_s": round(_percentile(values, 0.99), 3),
        "max_s": round(max(values), 3),
        "min_s": round(min(values), 3),
        "mean_s": round(statistics.fmean(values), 3),
    }


class _Load:
    """The 1-minute load average every 5 s on a thread, while the benchmark runs."""

    def __init__(self) -> None:
        self.start = [round(x, 2) for x in os.getloadavg()]
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(5.0):
            self.samples.append(os.getloadavg()[0])

    def report(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(10)
        samples = self.samples or [os.getloadavg()[0]]
        return {
            "at_start": self.start,
            "at_end": [round(x, 2) for x in os.getloadavg()],
            "one_minute_during_run": {
                "min": round(min(samples), 2),
                "max": round(max(samples), 2),
                "mean": round(statistics.fmean(samples), 2),
                "samples": len(samples),
            },
        }


class _CsServer(_Server):
    """A service process (as :class:`bench.ingest._Server`) with extra options."""

    def __init__(self, warehouse: Path, *options: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "channel_server",
                "--port",
                "0",
                "--warehouse",
                str(warehouse),
                "--log-level",
                "WARNING",
                *options,
            ],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert self.process.stdout is not None
        self.url = orjson.loads(self.process.stdout.readline())["url"]

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the service process used so far (not its worker)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- where an in-process read's time goes ------------------------------------------------------


class _Phases:
    """Seconds spent in wrapped functions, summed over threads, each exclusive of the
    wrapped functions it calls (so a conversion inside a cache lookup counts once)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def wrap(self, label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack: list[list[float]] = self._local.__dict__.setdefault("stack", [])
            stack.append([0.0])
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                inner = stack.pop()[0]
                if stack:
                    stack[-1][0] += elapsed
                with self._lock:
                    self.spent[label] = self.spent.get(label, 0.0) + elapsed - inner
                    self.calls[label] = self.calls.get(label, 0) + 1

        return wrapper

    def report(self) -> dict[str, Any]:
        return {
            label: {"ms": _ms(seconds), "calls": self.calls[label]}
            for label, seconds in sorted(self.spent.items(), key=lambda kv: -kv[1])
        }


class _GcTime:
    """Time the cyclic garbage collector ran while the block ran, by generation (it
    interrupts whichever phase allocated; the phases include it)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._began
            self.collections[info["generation"]] += 1

    def __enter__(self) -> _GcTime:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc_info: object) -> None:
        gc.callbacks.remove(self._callback)

    def report(self) -> dict[str, Any]:
        return {
            "ms": _ms(sum(self.seconds)),
            "ms_by_generation": [_ms(s) for s in self.seconds],
            "collections_by_generation": self.collections,
        }


@contextlib.contextmanager
def _instrumented(catalog: Any) -> Iterator[_Phases]:
    """A fresh record cache (the read converts every version again) and the read's parts
    timed while the block runs."""
    import pipelines.change_streams.read as read_module
    import pipelines.change_streams.records as records
    from pipelines.change_streams.records import RecordCache

    phases = _Phases()
    cache = RecordCache()
    targets = [
        (read_module, "change_events", "cdf_read_load_cdf_and_cast"),
        (records, "json_values", "values_to_python_lists"),
        (records, "_mods", "mods_sort_and_row_loop"),
        (read_module, "build_records", "group_into_records_key_hash"),
        (read_module, "_written", "commit_info_writer_tag_and_id"),
        (read_module, "seal", "seal_catalog_write"),
        (read_module, "timestamps", "timestamps_seals_and_log"),
        (read_module, "_first_version", "first_version_log"),
        (read_module, "read_tables", "catalog_stream_tables"),
        (catalog, "change_stream_history", "catalog_change_stream_history"),
        (cache, "get", "cache_lookup_and_wait_for_another_partition"),
        (catalog, "latest_seals", "catalog_latest_seals"),
        (catalog, "list_partitions", "catalog_list_partitions"),
        (read_module, "newest_version", "log_newest_version_probe"),
    ]
    with contextlib.ExitStack() as patches:
        patches.enter_context(mock.patch.object(read_module, "_CACHE", cache))
        for owner, attribute, label in targets:
            wrapped = phases.wrap(label, getattr(owner, attribute))
            patches.enter_context(mock.patch.object(owner, attribute, wrapped))
        yield phases


# -- 1. throughput --------------------------------------------------------------------------


def _count(record: dict[str, Any]) -> int:
    change = record.get("data_change_record")
    return len(change["mods"]) if change is not None else 0


def _in_process(catalog: Any, stream: Any, start_us: int, end_us: int) -> dict[str, Any]:
    """The partitions' bounded reads on one thread each, with a fresh record cache."""
    from pipelines.change_streams.read import ReadArgs, read

    with _instrumented(catalog) as phases, _GcTime() as collector:
        started, cpu = time.perf_counter(), time.process_time()
        first = list(read(catalog, stream, ReadArgs(start_us, None, None, THROUGHPUT_HEARTBEAT_MS)))
        tokens = [
            c["token"] for r in first for c in r["child_partitions_record"]["child_partitions"]
        ]
        results: dict[str, dict[str, Any]] = {}
        errors: list[BaseException] = []

        def follow(token: str) -> None:
            mods = records = 0
            first_at = None
            began = time.perf_counter()
            try:
                args = ReadArgs(start_us, None, token, THROUGHPUT_HEARTBEAT_MS)
                for record in read(catalog, stream, args, until_us=end_us):
                    if "data_change_record" in record:
                        first_at = first_at or time.perf_counter()
                        mods += _count(record)
                        records += 1
            except BaseException as exc:
                errors.append(exc)
            results[token] = {
                "mods": mods,
                "records": records,
                "first_record_s": round((first_at or began) - began, 3),
                "seconds": round(time.perf_counter() - began, 3),
            }

        threads = [
            threading.Thread(target=follow, args=(t,), name=f"bench-cs-{t[:6]}") for t in tokens
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if errors:
        raise RuntimeError("an in-process partition read failed") from errors[0]
    mods = sum(r["mods"] for r in results.values())
    return {
        "partitions": len(tokens),
        "mods": mods,
        "records": sum(r["records"] for r in results.values()),
        "seconds": round(seconds, 3),
        "mods_per_s": round(mods / seconds),
        "process_cpu_s": round(cpu, 2),
        "first_record_s": min(r["first_record_s"] for r in results.values()),
        "per_partition": sorted(results.values(), key=lambda r: -r["mods"]),
        "phases_summed_over_threads": phases.report(),
        "cyclic_gc_within_the_phases": collector.report(),
    }


async def _http_reads(url: str, name: str, start: str, end: str) -> dict[str, Any]:
    """The first query, then every partition's read at once, over HTTP (async SDK)."""
    from ingest_sdk import AsyncStreamingIngestClient

    async with AsyncStreamingIngestClient("bench-cs-throughput", url=url) as client:
        started, cpu = time.perf_counter(), time.process_time()
        first = [
            r
            async for r in client.read_change_stream(
                name, start, heartbeat_milliseconds=THROUGHPUT_HEARTBEAT_MS
            )
        ]
        first_query_s = time.perf_counter() - started
        tokens = [
            c["token"] for r in first for c in r["child_partitions_record"]["child_partitions"]
        ]

        async def follow(token: str) -> dict[str, Any]:
            mods = records = 0
            first_at = None
            began = time.perf_counter()
            async for record in client.read_change_stream(
                name,
                start,
                end_timestamp=end,
                partition_token=token,
                heartbeat_milliseconds=THROUGHPUT_HEARTBEAT_MS,
            ):
                if "data_change_record" in record:
                    first_at = first_at or time.perf_counter()
                    mods += _count(record)
                    records += 1
            return {
                "mods": mods,
                "records": records,
                "first_record_s": round((first_at or began) - began, 3),
                "seconds": round(time.perf_counter() - began, 3),
            }

        results = await asyncio.gather(*(follow(token) for token in tokens))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    mods = sum(r["mods"] for r in results)
    return {
        "partitions": len(tokens),
        "mods": mods,
        "records": sum(r["records"] for r in results),
        "seconds": round(seconds, 3),
        "mods_per_s": round(mods / seconds),
        "first_query_s": round(first_query_s, 3),
        "client_cpu_s": round(cpu, 2),
        "first_record_s": min(r["first_record_s"] for r in results),
        "per_partition": sorted(results, key=lambda r: -r["mods"]),
    }


def _baseline(uri: str, first: int, last: int) -> dict[str, Any]:
    """A user's read of the same changes: delta-rs' change data feed into row dicts."""
    with _GcTime() as collector:
        started, cpu = time.perf_counter(), time.process_time()
        rows = 0
        feed = DeltaTable(uri).load_cdf(starting_version=first, ending_version=last)
        for batch in pa.RecordBatchReader.from_stream(feed):  # delta-rs hands out arro3 batches
            for row in batch.to_pylist():
                rows += row["_commit_version"] >= 0  # touch each row as a consumer would
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "seconds": round(seconds, 3),
        "process_cpu_s": round(cpu, 2),
        "cdf_rows": rows,
        "cyclic_gc": collector.report(),
    }


def _throughput_case(
    bench: _Bench, table: str, columns: str, rows: int, expected_updates: int
) -> dict[str, Any]:
    """One table and its change stream: fill, update, then every read and the baseline."""
    session = bench.session
    stream_name = f"CS_{table}"
    session.sql(f"CREATE TABLE {table} ({columns})")
    session.sql(
        f"CREATE CHANGE STREAM {stream_name} FOR {table} OPTIONS (partitions = {PARTITIONS})"
    )
    info = session.require_table(table)
    stream = session.catalog.get_change_stream("DB", "PUBLIC", stream_name)
    assert stream is not None
    first_version = bench.version(table) + 1
    _progress(
        f"cs_throughput: {table}: {rows:,} rows in {COMMITS} ingest commits, then an "
        f"UPDATE of ID % {UPDATE_SHARE} = 0"
    )
    ingest_s, _ = _timed(lambda: _ingest(session, table, rows, COMMITS))
    update_s, answer = _timed(
        lambda: session.sql(
            f"UPDATE {table} SET AMOUNT = AMOUNT + 1 WHERE ID % {UPDATE_SHARE} = 0"
        ).collect()
    )
    assert answer[0][0] == expected_updates, (answer, expected_updates)
    last_version = bench.version(table)
    end_us = clock() + 1
    expected = rows + expected_updates
    _progress(f"cs_throughput: {table}: the baseline (delta-rs load_cdf into row dicts), twice")
    baseline_runs = [_baseline(info.uri, first_version, last_version) for _ in range(2)]
    baseline = min(baseline_runs, key=lambda r: r["seconds"])
    _progress(f"cs_throughput: {table}: in-process reads of {PARTITIONS} partitions, twice")
    runs = [_in_process(session.catalog, stream, stream.created_us, end_us) for _ in range(2)]
    for run in runs:
        assert run["mods"] == expected, (run["mods"], expected)
    best = min(runs, key=lambda r: r["seconds"])
    _progress(f"cs_throughput: {table}: HTTP reads from a fresh service (cold cache), then warm")
    server = _CsServer(bench.folder / "warehouse", "--change-stream-check-seconds", "0")
    try:
        name = f"DB.PUBLIC.{stream_name}"
        start_text, end_text = _rfc3339(stream.created_us), _rfc3339(end_us)
        cpu_before = server.cpu_s()
        cold = asyncio.run(_http_reads(server.url, name, start_text, end_text))
        cold["service_cpu_s"] = round(server.cpu_s() - cpu_before, 2)
        cpu_before = server.cpu_s()
        warm = asyncio.run(_http_reads(server.url, name, start_text, end_text))
        warm["service_cpu_s"] = round(server.cpu_s() - cpu_before, 2)
        peak_rss = server.peak_rss_bytes()
    finally:
        server.stop()
    for run in (cold, warm):
        assert run["mods"] == expected, (run["mods"], expected)
        run["cpu_over_baseline"] = round(
            baseline["process_cpu_s"] / (run["service_cpu_s"] + run["client_cpu_s"]), 3
        )
    for run in runs:
        run["cpu_over_baseline"] = round(baseline["process_cpu_s"] / run["process_cpu_s"], 3)
    baseline_rate = expected / baseline["seconds"]
    return {
        "table": table,
        "columns": columns,
        "versions": [first_version, last_version],
        "mods": expected,
        "inserted": rows,
        "updated": expected_updates,
        "fill_ingest_s": round(ingest_s, 2),
        "fill_update_s": round(update_s, 2),
        "baseline": {
            "what": "DeltaTable(uri).load_cdf(starting_version, ending_version), each batch "
            "to_pylist(), every row touched; the better of two runs",
            **baseline,
            "cdf_rows_per_s": round(baseline["cdf_rows"] / baseline["seconds"]),
            "mods_per_s": round(baseline_rate),
            "runs": baseline_runs,
        },
        "in_process": {
            "best_mods_per_s": best["mods_per_s"],
            "best_over_baseline": round(best["mods_per_s"] / baseline_rate, 3),
            "runs": runs,
        },
        "http_cold_service": {
            **cold,
            "over_baseline": round(cold["mods_per_s"] / baseline_rate, 3),
        },
        "http_same_service_warm_cache": {
            **warm,
            "over_baseline": round(warm["mods_per_s"] / baseline_rate, 3),
        },
        "service_peak_rss_mb": round(peak_rss / 2**20),
    }


def _rfc3339(micros: int) -> str:
    from pipelines.change_streams.records import rfc3339

    return rfc3339(micros)


def run_throughput(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    rows = _rows(scale, MILLION, least=10_000)
    updates = len(range(0, rows, UPDATE_SHARE))
    load = _Load()
    bench = _Bench("cs-throughput")
    try:
        keyed = _throughput_case(
            bench,
            "T",
            "ID NUMBER PRIMARY KEY, GRP NUMBER, AMOUNT FLOAT, V VARCHAR(20)",
            rows,
            updates,
        )
        by_row_id = _throughput_case(
            bench, "U", "ID NUMBER, GRP NUMBER, AMOUNT FLOAT, V VARCHAR(20)", rows, updates
        )
        ratios: dict[str, float] = {}
        cpu_ratios: dict[str, float] = {}
        for case in (keyed, by_row_id):
            name = case["table"]
            ratios[f"{name}_in_process"] = case["in_process"]["best_over_baseline"]
            ratios[f"{name}_http_cold"] = case["http_cold_service"]["over_baseline"]
            cpu_ratios[f"{name}_in_process"] = max(
                r["cpu_over_baseline"] for r in case["in_process"]["runs"]
            )
            cpu_ratios[f"{name}_http_cold"] = case["http_cold_service"]["cpu_over_baseline"]
        return {
            "benchmark": "cs_throughput",
            "scale": scale,
            "cpus": os.cpu_count(),
            "load_average": load.report(),
            "spark_master": "local[2] (the fill's UPDATE only)",
            "partitions": PARTITIONS,
            "measured": "mods delivered per second: in-process, read() of every partition on "
            "a thread each; over HTTP, a fresh service and every partition's read at once "
            "through the async SDK, records parsed; both from the stream's creation to just "
            "after the last commit",
            "primary_key_table": keyed,
            "row_id_table": by_row_id,
            "over_baseline": ratios,
            "cpu_over_baseline": cpu_ratios,
            "spark_session_start_s": bench.spark_start_s,
            "targets": {
                "over_baseline_min": THROUGHPUT_RATIO_MIN,
                "met": {key: ratio >= THROUGHPUT_RATIO_MIN for key, ratio in ratios.items()},
            },
        }
    finally:
        bench.close()


# -- 2. latency ----------------------------------------------------------------------------


class _Follower:
    """Every open partition of a change stream followed over HTTP (the async SDK on an
    event loop thread of its own), children started once all their parents ended; each
    record's arrival time (µs, this process's clock) kept."""

    def __init__(self, url: str, name: str, start: str) -> None:
        self.url, self.name, self.since = url, name, start
        #: (commit_timestamp text, received µs, mods, server_transaction_id)
        self.changes: list[tuple[str, int, int, str]] = []
        #: (heartbeat timestamp text, received µs)
        self.beats: list[tuple[str, int]] = []
        self.mods = 0
        self.partitions_read: list[str] = []
        self.child_records = 0
        self.errors: list[str] = []
        self._children: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._done: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-cs-follower", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(120):
            raise RuntimeError("the reader did not start within 120 s")
        if self.errors:
            raise RuntimeError(f"the reader failed: {self.errors[0]}")

    def stop(self) -> None:
        if self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            self._ready.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        from ingest_sdk import AsyncStreamingIngestClient

        self._stopped = asyncio.Event()
        async with AsyncStreamingIngestClient("bench-cs-latency", url=self.url) as client:
            first = [
                r
                async for r in client.read_change_stream(
                    self.name, self.since, heartbeat_milliseconds=LATENCY_HEARTBEAT_MS
                )
            ]
            for record in first:
                for child in record["child_partitions_record"]["child_partitions"]:
                    self._launch(client, child["token"], self.since)
            self._ready.set()
            await self._stopped.wait()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _launch(self, client: Any, token: str, start: str) -> None:
        self.partitions_read.append(token)
        task = asyncio.get_running_loop().create_task(self._follow(client, token, start))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self, client: Any, token: str, start: str) -> None:
        try:
            async for record in client.read_change_stream(
                self.name,
                start,
                partition_token=token,
                heartbeat_milliseconds=LATENCY_HEARTBEAT_MS,
            ):
                received = clock()
                change = record.get("data_change_record")
                if change is not None:
                    mods = len(change["mods"])
                    self.mods += mods
                    self.changes.append(
                        (
                            change["commit_timestamp"],
                            received,
                            mods,
                            change["server_transaction_id"],
                        )
                    )
                elif "heartbeat_record" in record:
                    self.beats.append((record["heartbeat_record"]["timestamp"], received))
                else:
                    self.child_records += 1
                    child = record["child_partitions_record"]
                    for item in child["child_partitions"]:
                        self._children[item["token"]] = (
                            child["start_timestamp"],
                            tuple(item["parent_partition_tokens"]),
                        )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors.append(f"{token[:8]}: {type(exc).__name__}: {str(exc)[:300]}")
            return
        self._done.add(token)
        for child, (at, parents) in self._children.items():
            if child not in self.partitions_read and all(p in self._done for p in parents):
                self._launch(client, child, at)


def _latencies(
    follower: _Follower, table_uri: str, table_id: int, window: tuple[int, int]
) -> dict[str, Any]:
    """The data change records' latencies, by the record's commit_timestamp and by the
    Delta log's stamp of its version; records received in ``window`` (µs)."""
    by_record, by_log, skew_us = [], [], []
    versions: set[int] = set()
    mods = 0
    for stamp, received, count, transaction in follower.changes:
        if not window[0] <= received <= window[1]:
            continue
        committed = _micros(stamp)
        owner, version = (int(x) for x in transaction.split("."))
        assert owner == table_id, transaction
        logged = commit_ts(table_uri, version) or committed
        by_record.append((received - committed) / 1e6)
        by_log.append((received - logged) / 1e6)
        skew_us.append(committed - logged)
        versions.add(version)
        mods += count
    return {
        "records": len(by_record),
        "mods": mods,
        "versions": len(versions),
        "latency_by_commit_timestamp": _summary_s(by_record),
        "latency_by_log_commit_stamp": _summary_s(by_log),
        "commit_timestamp_minus_log_stamp_us": {
            "max": max(skew_us, default=0),
            "min": min(skew_us, default=0),
        },
    }


def _beat_latencies(beats: list[tuple[str, int]], window: tuple[int, int]) -> dict[str, Any]:
    lags = [
        (received - _micros(stamp)) / 1e6
        for stamp, received in beats
        if window[0] <= received <= window[1]
    ]
    return _summary_s(lags)


def run_latency(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    seconds = max(2.0, LATENCY_SECONDS * scale)
    idle = max(1.0, IDLE_SECONDS * min(1.0, scale * 10))
    load = _Load()
    folder = Path(tempfile.mkdtemp(prefix="bench-cs-latency-"))
    warehouse = folder / "warehouse"
    _progress("cs_latency: starting the service (balancer on, every 5 s)")
    server = _CsServer(warehouse)
    feed: Feed | None = None
    follower: _Follower | None = None
    try:
        from catalog import SqliteCatalog
        from ingest_sdk import StreamingIngestClient

        with StreamingIngestClient("bench-cs", url=server.url) as client:
            started, _ = _timed(
                lambda: client.sql(
                    "CREATE TABLE SRC (ID NUMBER PRIMARY KEY, GRP NUMBER, AMOUNT FLOAT, "
                    "V VARCHAR(20))"
                )
            )
            client.sql(f"CREATE CHANGE STREAM CS FOR SRC OPTIONS (partitions = {PARTITIONS})")
        catalog = SqliteCatalog(warehouse / "catalog.sqlite")
        try:
            table = catalog.get_table("DB", "PUBLIC", "SRC")
            stream = catalog.get_change_stream("DB", "PUBLIC", "CS")
            assert table is not None and stream is not None
            _progress(
                f"cs_latency: worker up ({started:.1f} s); following {PARTITIONS} "
                f"partitions, then feeding {FEED_ROWS_PER_S} rows/s for {seconds:.0f} s"
            )
            follower = _Follower(server.url, "CS", _rfc3339(clock()))
            follower.start()
            feed = Feed(server.url, FEED_ROWS_PER_S, max_client_lag=FEED_LAG_S)
            cpu_before = server.cpu_s()
            active_start = clock()
            feed.start()
            time.sleep(seconds)
            feed.stop()
            fed, feed = feed.rows, None
            deadline = time.monotonic() + CATCH_UP_S
            while follower.mods < fed and time.monotonic() < deadline and not follower.errors:
                time.sleep(0.1)
            active_end = clock()
            active_cpu = server.cpu_s() - cpu_before
            _progress(
                f"cs_latency: {fed:,} rows fed, {follower.mods:,} mods read; "
                f"{idle:.0f} s idle (heartbeats)"
            )
            time.sleep(0.5)  # the last records' partitions go quiet
            idle_start = clock()
            cpu_before = server.cpu_s()
            time.sleep(idle)
            idle_end = clock()
            idle_cpu = server.cpu_s() - cpu_before
            follower.stop()
            open_now = [p for p in catalog.list_partitions(stream.uid) if p.end_us is None]
            changes = _latencies(follower, table.uri, table.id, (active_start, active_end))
        finally:
            catalog.close()
        if follower.errors:
            raise RuntimeError(f"the reader failed: {follower.errors[:3]}")
        assert follower.mods == fed, (follower.mods, fed)
        p99 = changes["latency_by_commit_timestamp"].get("p99_s", float("inf"))
        idle_beats = _beat_latencies(follower.beats, (idle_start, idle_end))
        return {
            "benchmark": "cs_latency",
            "scale": scale,
            "cpus": os.cpu_count(),
            "load_average": load.report(),
            "feed_rows_per_s": FEED_ROWS_PER_S,
            "feed_batches_per_s": FEED_BATCHES_PER_S,
            "max_client_lag_s": FEED_LAG_S,
            "heartbeat_milliseconds": LATENCY_HEARTBEAT_MS,
            "seconds": seconds,
            "rows_fed": fed,
            "mods_read": follower.mods,
            "partitions_at_start": PARTITIONS,
            "partitions_open_at_end": len(open_now),
            "partitions_read": len(follower.partitions_read),
            "child_partitions_records": follower.child_records,
            "worker_start_s": round(started, 1),
            "measured": "received (after parsing, async SDK) minus the record's "
            "commit_timestamp; per data change record",
            "data_change_records": changes,
            "heartbeats_while_feeding": _beat_latencies(follower.beats, (active_start, active_end)),
            "idle_seconds": idle,
            "idle_heartbeat_latency": idle_beats,
            "service_cpu_s": {
                "while_feeding": round(active_cpu, 2),
                "idle_with_reads_open": round(idle_cpu, 2),
                "idle_share_of_one_core": round(idle_cpu / idle, 3),
            },
            "targets": {"latency_p99_max_s": LATENCY_P99_MAX_S, "met": p99 < LATENCY_P99_MAX_S},
        }
    finally:
        if feed is not None:
            with contextlib.suppress(Exception):
                feed.stop()
        if follower is not None:
            with contextlib.suppress(Exception):
                follower.stop()
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "cs_throughput": run_throughput,
    "cs_latency": run_latency,
}


def main() -> None:
    cli("python -m bench.change_streams", __doc__, BENCHMARKS)


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
