"""A warehouse in an S3 bucket (moto) beside a local folder, and 1 vs 3 servers on one
bucket (``bucket``, issue 34).

1. Flush latency: two ``python -m channel_server`` processes, one on a local folder (the
   baseline), one on a moto bucket, a table and a producer channel each, taking turns
   batch by batch. Each batch of :data:`BATCH_ROWS` rows is waited for
   (``wait_for_commit``) before the next, so each is its own flush, at the lowest
   ``max_client_lag`` (0.05 s). Reported per side: p50/p90 of insert-to-commit, the
   median of each flush phase (``ingest_flush_phase_seconds``); bucket/local ratios.
2. Rows/s with 1 vs 3 servers on one bucket and one PostgreSQL catalog (durable, as
   ``bench/catalog.py``): :data:`CHANNELS` forked producers on a new table, all on the
   first server or spread over the three, each sending 100-row batches at
   ``max_client_lag`` 0.1 s with at most :data:`WINDOW` uncommitted (as fast as commits
   allow); the two take turns, :data:`ROUNDS` times. Reported: rows/s from the release
   to the last commit (medians), flushes and their phases, and what moto's request
   recorder saw: versions, commit conflicts (the service counts none: a refused commit
   is a second PUT of an existing ``_delta_log/N.json``), requests, log file GETs.

``--scale S`` multiplies the latency batches (200 a side, at least 3) and each
producer's rows (10,000, at least 200); below 0.01 (the smoke run) one round. moto and
PostgreSQL are child processes (delta-rs holds the GIL in some calls that wait on the
store); without PostgreSQL's binaries part 2 is skipped, saying why.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import shutil
import statistics
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import unquote

from prometheus_client.parser import text_string_to_metric_families

from bench.catalog import DURABLE
from bench.conversion import SCHEMA, make_rows
from bench.ingest import phase_medians
from bench.pipelines import _rows, _smoke
from ingest_sdk import OpenChannelRequest, StreamingIngestClient

BATCH_ROWS = 100
LATENCY_BATCHES = 200
LATENCY_LAG = 0.05
CHANNELS = 6
PRODUCER_ROWS = 10_000
WINDOW = 4
SPREAD_LAG = 0.1
ROUNDS = 3
_LOG_FILE = re.compile(r"/_delta_log/(\d{20})\.json(\?|$)")


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _scrape(servers: list[Any]) -> dict[str, Any]:
    """``GET /metrics`` of ``servers``, added up: flush phase bucket counts, flushes and
    failed flush attempts."""
    phases: dict[str, dict[float, float]] = {}
    found = {"flushes": 0.0, "flush_failures": 0.0}
    names = {"ingest_flush_duration_seconds_count": "flushes",
             "ingest_flush_failures_total": "flush_failures"}  # fmt: skip
    for server in servers:
        with urllib.request.urlopen(server.url + "/metrics") as response:
            text = response.read().decode()
        for sample in (s for f in text_string_to_metric_families(text) for s in f.samples):
            if sample.name == "ingest_flush_phase_seconds_bucket":
                counts = phases.setdefault(sample.labels["phase"], {})
                upper = float(sample.labels["le"])
                counts[upper] = counts.get(upper, 0.0) + sample.value
            elif sample.name in names:
                found[names[sample.name]] += sample.value
    return {"phases": phases, **found}


def _since(before: dict[str, Any], servers: list[Any]) -> dict[str, Any]:
    """The flushes of ``servers`` since the scrape ``before``: how many, and their phases."""
    after = _scrape(servers)
    return {
        "flushes": round(after["flushes"] - before["flushes"]),
        "flush_failures": round(after["flush_failures"] - before["flush_failures"]),
        "flush_phases_p50_ms": phase_medians(before["phases"], after["phases"]),
    }


def _server(folder: Path, name: str, warehouse: str | None, catalog: str | None = None) -> Any:
    """A started ``python -m channel_server`` (tests.servers.ProcessServer) with a state
    folder of its own; on ``warehouse`` (None: a folder in its state folder); with
    ``catalog``, on that PostgreSQL catalog, advertising its URL."""
    from tests.servers import ProcessServer

    state = folder / name
    state.mkdir()
    where = ("--warehouse", warehouse) if warehouse else ()
    server = ProcessServer(state / "warehouse", "--state-dir", str(state), *where,
                           "--log-level", "WARNING")  # fmt: skip
    if catalog:
        server.args += ["--catalog", catalog, "--advertise-url", server.url]
    return server.start()


# -- 1. flush latency, local folder vs bucket --------------------------------------------------


def _latency(folder: Path, warehouse: str, batches: int) -> dict[str, Any]:
    """Both servers, batch by batch in turn (the machine's load falls on both alike), after
    an untimed warm-up batch each (the first flush loads the table)."""
    rows, servers, channels = make_rows(BATCH_ROWS, seed=3), {}, {}
    took: dict[str, list[float]] = {"local": [], "bucket": []}
    with contextlib.ExitStack() as stack:
        for side, where in (("local", None), ("bucket", warehouse)):
            servers[side] = server = _server(folder, side, where)
            stack.callback(server.stop)
            client = StreamingIngestClient(side, url=server.url, max_client_lag=LATENCY_LAG)
            stack.enter_context(client)
            client.create_table("bench.public.latency", SCHEMA.declarations())
            request = OpenChannelRequest("c", "BENCH", "PUBLIC", "LATENCY")
            channels[side] = channel = client.open_channel(request)
            channel.insert_rows(rows, end_offset_token="warm")
            channel.wait_for_commit("warm", timeout=60)
        before = {side: _scrape([server]) for side, server in servers.items()}
        for number in range(batches):
            for side, channel in channels.items():
                began = time.perf_counter()
                channel.insert_rows(rows, end_offset_token=str(number))
                channel.wait_for_commit(str(number), timeout=60)
                took[side].append(time.perf_counter() - began)
        return {
            side: {
                "insert_to_commit_p50_ms": _ms(statistics.median(took[side])),
                "insert_to_commit_p90_ms": _ms(sorted(took[side])[int(0.9 * len(took[side]))]),
                **_since(before[side], [server]),
            }
            for side, server in servers.items()
        }


def _ratios(local: dict[str, Any], bucket: dict[str, Any]) -> dict[str, float | None]:
    """Bucket over local: insert-to-commit and the flush phases that touch the store."""
    ratios: dict[str, float | None] = {
        key: round(bucket[key] / local[key], 2)
        for key in ("insert_to_commit_p50_ms", "insert_to_commit_p90_ms")
    }
    for phase in ("landed_check", "parquet", "delta_commit", "catalog", "flush"):
        a, b = local["flush_phases_p50_ms"].get(phase), bucket["flush_phases_p50_ms"].get(phase)
        ratios[f"{phase}_p50"] = round(b / a, 2) if a and b is not None else None
    return ratios


# -- 2. 1 vs 3 servers on one table --------------------------------------------------------------


def _producer(url: str, table: str, index: int, rows: int, ready: Any, go: Any,
              results: Any) -> None:  # fmt: skip
    """One forked producer: its channel opened, it waits for the start, then sends its
    batches with at most :data:`WINDOW` of them uncommitted."""
    try:
        data = make_rows(rows, seed=10 + index)
        database, schema, name = table.split(".")
        with StreamingIngestClient(f"p{index}", url=url, max_client_lag=SPREAD_LAG) as client:
            channel = client.open_channel(OpenChannelRequest(f"p{index}", database, schema, name))
            ready.wait(300)
            go.wait(300)
            batches = range(0, rows, BATCH_ROWS)
            for number, first in enumerate(batches):
                if number >= WINDOW:
                    channel.wait_for_commit(str(number - WINDOW), timeout=300)
                channel.insert_rows(data[first : first + BATCH_ROWS], end_offset_token=str(number))
            channel.wait_for_commit(str(len(batches) - 1), timeout=300)
            results.put({"ended": time.perf_counter()})
    except BaseException:
        results.put({"error": traceback.format_exc()})


class _Recorder:
    """moto's request recorder, its log a file of ours: what a run asked of the store."""

    def __init__(self, endpoint: str, path: Path) -> None:
        self.endpoint, self.path = endpoint, path

    def _call(self, action: str) -> None:
        request = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}", b"",
                                         method="POST")  # fmt: skip
        urllib.request.urlopen(request).close()

    def start(self) -> None:
        self._call("reset-recording")
        self._call("start-recording")

    def stop(self, prefix: str) -> dict[str, int]:
        """Requests under the table's ``prefix`` since :meth:`start`; a Delta commit
        refused for a conflict is a second PUT of an existing ``_delta_log/N.json``."""
        self._call("stop-recording")
        puts: list[str] = []
        requests = log_gets = 0
        with open(self.path) as lines:
            for entry in map(json.loads, lines):
                if prefix not in unquote(entry["url"]):  # a listing's prefix is quoted
                    continue
                requests += 1
                if match := _LOG_FILE.search(entry["url"]):
                    if entry["method"] == "PUT":
                        puts.append(match.group(1))
                    log_gets += entry["method"] == "GET"
        return {"versions": len(set(puts)), "commit_puts": len(puts),
                "conflicts": len(puts) - len(set(puts)), "requests": requests,
                "log_file_gets": log_gets}  # fmt: skip


def _spread_run(servers: list[Any], spread: int, table: str, rows: int,
                recorder: _Recorder) -> dict[str, Any]:  # fmt: skip
    """:data:`CHANNELS` producers on a new ``table``, channel i on server ``i % spread``;
    timed from their release (every channel open, its fence committed) to the last commit."""
    with StreamingIngestClient("admin", url=servers[0].url) as admin:
        location = admin.create_table(table, SCHEMA.declarations())["location"]
    context = multiprocessing.get_context("fork")  # the imports are made: a fork is cheap
    ready, go, results = context.Barrier(CHANNELS + 1), context.Event(), context.Queue()
    workers = [context.Process(target=_producer, args=(servers[i % spread].url, table, i, rows,
                                                       ready, go, results))
               for i in range(CHANNELS)]  # fmt: skip
    try:
        for worker in workers:
            worker.start()
        ready.wait(300)
        before = _scrape(servers)
        recorder.start()
        started = time.perf_counter()
        go.set()
        outcomes = [results.get(timeout=900) for _ in workers]
    finally:
        for worker in workers:
            if worker.pid is not None:  # started
                worker.join(10)
                worker.kill()  # one still running after an error
    failed = [outcome["error"] for outcome in outcomes if "error" in outcome]
    if failed:
        raise RuntimeError(f"a producer failed:\n{failed[0]}")
    seconds = max(outcome["ended"] for outcome in outcomes) - started
    return {
        "rows_per_s": round(CHANNELS * rows / seconds),
        "seconds": round(seconds, 2),
        **recorder.stop(location.removeprefix("s3://").split("/", 1)[1]),
        **_since(before, servers),
    }


def _spreads(folder: Path, warehouse: str, dsn: str, rows: int, rounds: int,
             recorder: _Recorder) -> dict[str, Any]:  # fmt: skip
    """Three servers on one bucket and catalog; 1 and 3 in turn, ``rounds`` times."""
    runs: dict[str, list[dict[str, Any]]] = {"1": [], "3": []}
    with contextlib.ExitStack() as stack:
        servers = []
        for n in range(3):
            servers.append(_server(folder, f"s{n + 2}", warehouse, dsn))
            stack.callback(servers[-1].stop)
        for round_ in range(rounds):
            for spread in (1, 3):
                table = f"bench.public.spread{spread}_{round_}"
                runs[str(spread)].append(_spread_run(servers, spread, table, rows, recorder))
    medians = {k: statistics.median(r["rows_per_s"] for r in v) for k, v in runs.items()}
    return {"runs": runs, "rows_per_s_median": medians,
            "three_over_one": round(medians["3"] / medians["1"], 2)}  # fmt: skip


# -- the run ----------------------------------------------------------------------------------


def _with_postgres(folder: Path, s3: Any, rows: int, rounds: int) -> dict[str, Any]:
    """Part 2 on a new bucket and a PostgreSQL of its own (durable settings), or why not."""
    from tests.postgres_server import PostgresServer, PostgresUnavailable

    postgres = PostgresServer(settings=DURABLE)
    try:
        postgres.start()
    except PostgresUnavailable as error:
        return {"skipped": str(error)}
    try:
        recorder = _Recorder(s3.endpoint_url, folder / "moto-recording")
        warehouse = f"{s3.create_bucket().uri}/wh"
        return _spreads(folder, warehouse, postgres.create_database(), rows, rounds, recorder)
    finally:
        postgres.stop()


def run(scale: float | None = None) -> dict[str, Any]:
    from tests.s3_server import S3Server

    scale = 1.0 if scale is None else scale
    started, load = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    folder = Path(tempfile.mkdtemp(prefix="bench-bucket-"))
    with mock.patch.dict(os.environ, MOTO_RECORDER_FILEPATH=str(folder / "moto-recording")):
        s3 = S3Server().start()  # a child process; its request recorder writes into folder
    try:
        with s3.environ():
            batches = _rows(scale, LATENCY_BATCHES, least=3)
            latency = _latency(folder, f"{s3.create_bucket().uri}/wh", batches)
            rows = _rows(scale, PRODUCER_ROWS, least=200)
            spreads = _with_postgres(folder, s3, rows, 1 if _smoke(scale) else ROUNDS)
    finally:
        s3.stop()
        shutil.rmtree(folder, ignore_errors=True)
    servers = {"channels": CHANNELS, "rows_each": rows, "window_batches": WINDOW,
               "max_client_lag_ms": _ms(SPREAD_LAG), **spreads}  # fmt: skip
    return {
        "benchmark": "bucket",
        "scale": scale,
        "batch_rows": BATCH_ROWS,
        "latency": {"batches_each": batches, "max_client_lag_ms": _ms(LATENCY_LAG), **latency},
        "baseline_local": latency["local"],
        "bucket_over_local": _ratios(latency["local"], latency["bucket"]),
        "servers": servers,
        "seconds": round(time.perf_counter() - started, 1),
        "load_average": {"at_start": load, "at_end": [round(x, 2) for x in os.getloadavg()]},
    }
