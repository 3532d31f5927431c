"""The catalog's hot path on SQLite (the baseline) and on PostgreSQL, in one run (``catalog``).

What a flush and a channel's open ask of the catalog, on the two catalogs the service
runs on: the default SQLite file (WAL, ``synchronous=FULL``: each commit is fsynced) and
a PostgreSQL database reached over TCP on 127.0.0.1 (:class:`catalog.PostgresCatalog`),
on a throwaway cluster the benchmark starts (``tests/postgres_server.py``, with
PostgreSQL's durable defaults: ``fsync``, ``synchronous_commit`` and ``full_page_writes``
on, so each commit is fsynced there too). The run makes a new SQLite file in a temporary
folder and a new PostgreSQL database; each measurement has a table of its own in them,
and a channel for each of its processes.

1. Each of ``open_channel`` (a reopen of the process's own channel: its generation
   bumped, then the channel read back), ``reserve_row_ids`` (100 ids of the one table,
   the row every flush of the table updates) and ``apply_commit`` (one flush's record
   with one ``ChannelProgress``, the process's channel, as a flush of one channel makes
   it), from 1, 4 and 16 processes at once on the one table. The processes are forked,
   each opens its own catalog connection and makes :data:`WARM_UP` calls (psycopg
   prepares a statement after five runs), then they wait at a barrier and are released
   together; each calls the operation in a loop for the window (:data:`WINDOW_S`).
   Reported per catalog: calls per second of all processes together (calls over the time
   from the first release to the last call's end), the latency of a call (p50, p99, max),
   the fewest and most calls one process made (how evenly the catalog's lock was
   shared), and the CPU time per call of the calling processes and of their PostgreSQL
   backends (``/proc``; steadier than the wall times on a shared machine, and what
   bounds the calls per second on two cores). SQLite's writers wait for the lock in
   SQLite's busy handler, which sleeps (1 ms, then longer, up to 100 ms a time);
   PostgreSQL's wait in the server for the catalog's advisory lock.

   ``apply_commit`` needs a table version above the one applied, or it returns having
   written nothing: the versions come from a counter the processes share, taken before
   each call (untimed). A process may still reach the catalog after a process that took a
   later version, and then its call writes nothing: ``applied`` says how many calls moved
   the catalog (counted from the channels' ``rows_committed``), the rest were such no-op
   transactions (one process: none).
2. The catalog part of one flush, single process: ``reserve_row_ids`` then ``apply_commit``
   (the two catalog writes a flush makes, around its Delta commit), back to back, on each
   catalog in turn, in blocks of :data:`BLOCK` flushes, so the machine's load falls on
   both alike. Reported: p50 and p99 of the pair (and of each call) and its CPU time on
   each, and PostgreSQL minus SQLite. Target (issue 34): a PostgreSQL-backed flush at most 2 ms
   slower on loopback, judged on the medians. For information, a third catalog in the
   same rotation: PostgreSQL with ``synchronous_commit=off`` for the benchmark's
   connections (a commit does not wait for its WAL to reach the disk), which shows what
   the fsync costs.

``--scale S`` multiplies the window (5 s, at least 0.1 s) and the flushes (2,000 each, at
least 20); below 0.01 (``--scale 0.001``, the smoke run of tests/bench/test_smoke.py: a
few seconds, numbers meaning nothing) the processes are 1 and 2 and each makes 2 warm-up
calls; ``BENCH_QUICK=1`` means scale 0.01. Without
PostgreSQL's binaries or psycopg, SQLite alone is measured and ``postgres`` says why.
The load average is reported with each measurement: on a shared machine it moves the
numbers more than anything measured here.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import quote

from catalog import open_catalog
from catalog.base import Catalog
from catalog.records import ChannelProgress, CommitRecord
from ingest_sdk import TableSchema

OPERATIONS = ("open_channel", "reserve_row_ids", "apply_commit")
PROCESSES = (1, 4, 16)
#: Below this scale, a smoke run: fewer processes and warm-up calls (the same steps).
SMOKE_BELOW = 0.01
SMOKE_PROCESSES = (1, 2)
SMOKE_WARM_UP = 2
WINDOW_S = 5.0
MIN_WINDOW_S = 0.1
FLUSHES = 2000
MIN_FLUSHES = 20
#: Flushes on one catalog before the next catalog's turn.
BLOCK = 50
#: Calls each process makes before the barrier (psycopg prepares a statement after 5 runs).
WARM_UP = 20
#: Rows of a flush: the row ids it reserves and the rows its ChannelProgress counts.
ROWS = 100
TARGET_FLUSH_OVER_MS = 2.0
#: PostgreSQL's own defaults, said out loud: the tests' cluster runs without them.
DURABLE = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}
#: Seconds a process waits at the barrier for the others (their catalogs open in turn).
BARRIER_TIMEOUT_S = 600.0
SCHEMA = TableSchema.parse({"ID": "NUMBER(38,0) NOT NULL", "ITEM": "VARCHAR(100)"})


def _quick_scale() -> float:
    return 0.01 if os.environ.get("BENCH_QUICK", "") not in ("", "0") else 1.0


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def _latency(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": _ms(statistics.median(values)),
        "p99_ms": _ms(_percentile(values, 0.99)),
        "max_ms": _ms(max(values)),
    }


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _backend(catalog: Catalog) -> int | None:
    """The process id of a PostgreSQL catalog's server process (its backend); None for
    SQLite, whose work is done in the caller's process."""
    from catalog.postgres import PostgresCatalog

    if not isinstance(catalog, PostgresCatalog):
        return None
    return int(catalog._read("SELECT pg_backend_pid()")[0][0])


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user and system) of process ``pid`` so far (``/proc``, in clock ticks);
    0.0 for None."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_per_call(client_s: float, server_s: float, calls: int) -> dict[str, float]:
    """Milliseconds of CPU per call: the calling processes', their PostgreSQL backends'."""
    return {
        "client": round(client_s * 1000 / calls, 3),
        "server": round(server_s * 1000 / calls, 3),
        "total": round((client_s + server_s) * 1000 / calls, 3),
    }


# -- the run's catalogs ----------------------------------------------------------------------


class _Places:
    """The run's catalogs: a SQLite file in the run's temporary folder and a database of
    the run's PostgreSQL cluster, each new for the run; each measurement has a table of
    its own in them (:func:`_prepare`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.server: Any = None  # tests.postgres_server.PostgresServer, once started
        self.unavailable: str | None = None
        self.dsn: str | None = None
        self._tables = 0

    def start_postgres(self) -> None:
        from tests.postgres_server import PostgresServer, PostgresUnavailable

        server = PostgresServer(settings=DURABLE)
        try:
            server.start()
        except PostgresUnavailable as error:
            self.unavailable = str(error)
            return
        self.server = server
        self.dsn = server.create_database()

    @property
    def kinds(self) -> tuple[str, ...]:
        return ("sqlite", "postgres") if self.server is not None else ("sqlite",)

    def location(self, kind: str, options: str = "") -> str:
        """The run's catalog of ``kind`` (``sqlite`` or ``postgres``); ``options``:
        PostgreSQL settings of the connections (``-c name=value``)."""
        if kind == "sqlite":
            return str(self.folder / "catalog.sqlite")
        assert self.dsn is not None
        return f"{self.dsn}?options={quote(options)}" if options else self.dsn

    def table_name(self) -> str:
        self._tables += 1
        return f"T{self._tables}"

    def postgres_facts(self) -> dict[str, Any]:
        if self.server is None:
            return {"unavailable": self.unavailable}
        import psycopg

        with psycopg.connect(self.server.dsn) as connection:
            row = connection.execute("SHOW server_version").fetchone()
        return {
            "server_version": row[0] if row else None,
            "psycopg": psycopg.__version__,
            "connection": "TCP to 127.0.0.1",
            "settings": DURABLE,
            "initdb_s": round(self.server.initdb_seconds, 2),
            "start_s": round(self.server.start_seconds, 2),
        }

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


def _prepare(location: str, table: str, channels: int) -> int:
    """Create the measurement's table and open its ``channels`` channels; its id."""
    catalog = open_catalog(location)
    try:
        info = catalog.create_table("BENCH", "PUBLIC", table, f"/bench/BENCH/PUBLIC/{table}",
                                    SCHEMA)  # fmt: skip
        for index in range(channels):
            catalog.open_channel(info.id, f"C{index}")
    finally:
        catalog.close()
    return info.id


# -- one operation from N processes -----------------------------------------------------------


class _Calls:
    """One process's calls of one operation: ``before()`` (untimed) makes the arguments of
    the next ``call(arguments)``."""

    def __init__(
        self, catalog: Catalog, table_id: int, operation: str, channel: str, versions: Any
    ) -> None:
        self.catalog, self.table_id, self.operation = catalog, table_id, operation
        self.channel, self.versions = channel, versions
        record = catalog.get_channel(table_id, channel)
        assert record is not None
        self.generation = record.generation
        self.batch_seq = 0

    def before(self) -> Any:
        if self.operation != "apply_commit":
            return None
        with self.versions.get_lock():
            self.versions.value += 1
            version = self.versions.value
        self.batch_seq += 1
        return CommitRecord(
            version=version,
            channels=(ChannelProgress(self.channel, self.generation, self.batch_seq,
                                      str(self.batch_seq), ROWS),),
            next_row_id=version * ROWS,
            rows=ROWS,
        )  # fmt: skip

    def call(self, argument: Any) -> None:
        if self.operation == "open_channel":
            self.catalog.open_channel(self.table_id, self.channel)
        elif self.operation == "reserve_row_ids":
            self.catalog.reserve_row_ids(self.table_id, ROWS)
        else:
            self.catalog.apply_commit(self.table_id, argument)

    def rows_committed(self) -> int:
        record = self.catalog.get_channel(self.table_id, self.channel)
        assert record is not None
        return record.rows_committed


def _worker(
    location: str, table_id: int, operation: str, index: int, window_s: float, warm_up: int,
    barrier: Any, versions: Any, results: Any,
) -> None:  # fmt: skip
    """One process of a measurement: warm up, wait for the others, call for the window."""
    try:
        catalog = open_catalog(location)
        calls = _Calls(catalog, table_id, operation, f"C{index}", versions)
        for _ in range(warm_up):
            calls.call(calls.before())
        committed = calls.rows_committed()
        backend = _backend(catalog)
        barrier.wait(BARRIER_TIMEOUT_S)
        client_cpu, server_cpu = time.process_time(), _cpu_s(backend)
        began = now = time.perf_counter()
        deadline = began + window_s
        latencies = []
        while now < deadline:
            argument = calls.before()
            start = time.perf_counter()
            calls.call(argument)
            now = time.perf_counter()
            latencies.append(now - start)
        client_cpu = time.process_time() - client_cpu
        server_cpu = _cpu_s(backend) - server_cpu
        applied = (calls.rows_committed() - committed) // ROWS
        catalog.close()
        results.put({"began": began, "ended": now, "latencies": latencies, "applied": applied,
                     "client_cpu": client_cpu, "server_cpu": server_cpu})  # fmt: skip
    except BaseException:
        results.put({"error": traceback.format_exc()})


def _from_processes(
    location: str, table: str, operation: str, processes: int, window_s: float, warm_up: int
) -> dict[str, Any]:
    """``operation`` on a new ``table`` from ``processes`` processes released together,
    for ``window_s``, after ``warm_up`` calls each."""
    table_id = _prepare(location, table, processes)
    context = multiprocessing.get_context("fork")  # the imports are made: a fork is cheap
    barrier = context.Barrier(processes)
    versions = context.Value("q", 1_000)
    results = context.Queue()
    workers = [
        context.Process(
            target=_worker, name=f"bench-catalog-{index}",
            args=(location, table_id, operation, index, window_s, warm_up, barrier, versions,
                  results),
        )
        for index in range(processes)
    ]  # fmt: skip
    load = _load()
    for worker in workers:
        worker.start()
    try:
        outcomes = [results.get(timeout=BARRIER_TIMEOUT_S + window_s + 120) for _ in workers]
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
                worker.join()
    failed = [outcome["error"] for outcome in outcomes if "error" in outcome]
    if failed:
        raise RuntimeError(f"a process of {operation} x {processes} failed:\n{failed[0]}")
    latencies = [value for outcome in outcomes for value in outcome["latencies"]]
    began = min(outcome["began"] for outcome in outcomes)
    seconds = max(outcome["ended"] for outcome in outcomes) - began
    per_process = [len(outcome["latencies"]) for outcome in outcomes]
    measured = {
        "calls": len(latencies),
        "seconds": round(seconds, 3),
        "calls_per_s": round(len(latencies) / seconds, 1),
        **_latency(latencies),
        "calls_per_process_min_max": [min(per_process), max(per_process)],
        "cpu_ms_per_call": _cpu_per_call(
            sum(outcome["client_cpu"] for outcome in outcomes),
            sum(outcome["server_cpu"] for outcome in outcomes),
            len(latencies),
        ),
        "load_average": [load, _load()],
    }
    if operation == "apply_commit":
        measured["applied"] = sum(outcome["applied"] for outcome in outcomes)
    return measured


# -- the catalog part of one flush ------------------------------------------------------------


class _Flusher:
    """A flush's two catalog writes, one catalog, one process."""

    def __init__(self, location: str, table: str) -> None:
        self.table_id = _prepare(location, table, 1)
        self.catalog = open_catalog(location)
        record = self.catalog.get_channel(self.table_id, "C0")
        assert record is not None
        self.generation = record.generation
        self.version = 0
        self.reserve: list[float] = []
        self.apply: list[float] = []
        self.both: list[float] = []
        self.backend = _backend(self.catalog)
        self.client_cpu = 0.0  # of the timed flushes
        self.server_cpu = 0.0

    def block(self, flushes: int) -> None:
        """``flushes`` timed flushes, their CPU counted."""
        client, server = time.process_time(), _cpu_s(self.backend)
        for _ in range(flushes):
            self.flush()
        self.client_cpu += time.process_time() - client
        self.server_cpu += _cpu_s(self.backend) - server

    def flush(self, timed: bool = True) -> None:
        self.version += 1
        start = time.perf_counter()
        first = self.catalog.reserve_row_ids(self.table_id, ROWS)
        reserved = time.perf_counter()
        progress = ChannelProgress("C0", self.generation, self.version, str(self.version), ROWS)
        self.catalog.apply_commit(
            self.table_id, CommitRecord(self.version, (progress,), first + ROWS, ROWS)
        )
        end = time.perf_counter()
        if timed:
            self.reserve.append(reserved - start)
            self.apply.append(end - reserved)
            self.both.append(end - start)

    def report(self) -> dict[str, Any]:
        record = self.catalog.get_channel(self.table_id, "C0")
        assert record is not None and record.rows_committed == self.version * ROWS
        self.catalog.close()
        return {
            "flushes": len(self.both),
            "flush_p50_ms": _ms(statistics.median(self.both)),
            "flush_p99_ms": _ms(_percentile(self.both, 0.99)),
            "flush_max_ms": _ms(max(self.both)),
            "reserve_row_ids_p50_ms": _ms(statistics.median(self.reserve)),
            "reserve_row_ids_p99_ms": _ms(_percentile(self.reserve, 0.99)),
            "apply_commit_p50_ms": _ms(statistics.median(self.apply)),
            "apply_commit_p99_ms": _ms(_percentile(self.apply, 0.99)),
            "cpu_ms_per_flush": _cpu_per_call(self.client_cpu, self.server_cpu, len(self.both)),
        }


def _flushes(places: _Places, flushes: int, warm_up: int) -> dict[str, dict[str, Any]]:
    """Each catalog in turn, :data:`BLOCK` flushes at a time, ``flushes`` on each."""
    locations = {"sqlite": places.location("sqlite")}
    if places.server is not None:
        locations["postgres"] = places.location("postgres")
        locations["postgres_synchronous_commit_off"] = places.location(
            "postgres", "-c synchronous_commit=off"
        )
    flushers = {name: _Flusher(location, places.table_name())
                for name, location in locations.items()}  # fmt: skip
    load = _load()
    for flusher in flushers.values():
        for _ in range(warm_up):
            flusher.flush(timed=False)
    done = 0
    while done < flushes:
        block = min(BLOCK, flushes - done)
        for flusher in flushers.values():
            flusher.block(block)
        done += block
    reports = {name: flusher.report() for name, flusher in flushers.items()}
    for report in reports.values():
        report["load_average"] = [load, _load()]
    return reports


# -- the run ----------------------------------------------------------------------------------


def _over(measured: dict[str, dict[str, Any]], key: str) -> float | None:
    if "postgres" not in measured:
        return None
    return round(measured["postgres"][key] - measured["sqlite"][key], 3)


def run(scale: float | None = None) -> dict[str, Any]:
    scale = _quick_scale() if scale is None else scale
    window_s = max(MIN_WINDOW_S, WINDOW_S * scale)
    flushes = max(MIN_FLUSHES, round(FLUSHES * scale))
    smoke = scale < SMOKE_BELOW
    processes_measured = SMOKE_PROCESSES if smoke else PROCESSES
    warm_up = SMOKE_WARM_UP if smoke else WARM_UP
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="bench-catalog-"))
    places = _Places(folder)
    try:
        places.start_postgres()
        operations: dict[str, dict[str, dict[str, Any]]] = {}
        for operation in OPERATIONS:
            for processes in processes_measured:
                measured: dict[str, Any] = {}
                for kind in places.kinds:  # one after the other, the same load on both
                    location, table = places.location(kind), places.table_name()
                    measured[kind] = _from_processes(
                        location, table, operation, processes, window_s, warm_up
                    )
                if "postgres" in measured:
                    measured["postgres_over_sqlite_calls_per_s"] = round(
                        measured["postgres"]["calls_per_s"] / measured["sqlite"]["calls_per_s"],
                        3,
                    )
                operations.setdefault(operation, {})[str(processes)] = measured
        flush = _flushes(places, flushes, warm_up)
        postgres = places.postgres_facts()
    finally:
        places.stop()
        shutil.rmtree(folder, ignore_errors=True)
    over_p50 = _over(flush, "flush_p50_ms")
    return {
        "benchmark": "catalog_sqlite_vs_postgres",
        "scale": scale,
        "window_s": window_s,
        "processes": list(processes_measured),
        "rows_per_flush": ROWS,
        "sqlite": {"version": sqlite3.sqlite_version, "journal_mode": "wal", "synchronous": "FULL"},
        "postgres": postgres,
        "operations": operations,
        "flush": flush,
        "baseline_sqlite_flush_ms": {
            "p50": flush["sqlite"]["flush_p50_ms"],
            "p99": flush["sqlite"]["flush_p99_ms"],
        },
        "flush_postgres_minus_sqlite_ms": {"p50": over_p50, "p99": _over(flush, "flush_p99_ms")},
        "target_flush_over_ms": TARGET_FLUSH_OVER_MS,
        "meets_target": None if over_p50 is None else over_p50 <= TARGET_FLUSH_OVER_MS,
        "seconds": round(time.perf_counter() - started, 1),
        "cpus": os.cpu_count(),
        "load_average": {
            "at_start": load_at_start,
            "at_end": [round(x, 2) for x in os.getloadavg()],
        },
    }


def main() -> None:
    from bench.pipelines import cli

    cli("python -m bench.catalog", __doc__, {"catalog": run})


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
