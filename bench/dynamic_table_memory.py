"""Peak driver memory of one refresh, at two source sizes with the same change.

``dt_refresh_memory`` builds the sources of :mod:`bench.dynamic_table_engine` (``T``
filled by 10 ingest commits, ``C`` 100k rows) twice, with 1M and with 4M rows of T, and
for each the pairs of its queries ``group_by_sums`` (a GROUP BY of counts and exact
sums, kept from the change and the table's hidden state) and ``join`` (``T JOIN C``),
each created ``REFRESH_MODE = INCREMENTAL`` and ``FULL`` (the baseline, measured in the
same run). A round is one UPDATE of the SAME 10,000 rows' worth at both sizes:
``AMOUNT = AMOUNT + 1 WHERE ID % 100 = r AND ID < 1,000,000`` (the same ids, so the
same 10 of the 1,000 groups, the same rows of C met; at 4M rows they sit in the first
quarter of T), then one refresh of each of the four tables for one data timestamp,
alternating which of a pair goes first. One warm-up round, then :data:`ROUNDS` measured
ones (a refresh's peak is the largest of its rounds'), then the live round (below).
After the rounds both tables of a pair and the query agree (checksums).

What is measured, and why so. In local mode the driver is two processes: the JVM (the
driver and the executors' tasks, in one heap) and this Python process (the refresh's
own code, the Arrow results it collects, delta-rs writing the commit).

- Each size runs in a fresh child process (``python -m bench.dynamic_table_memory
  --child ...``) with a fixed heap, ``spark.driver.memory`` = ``-Xms`` =
  :data:`DRIVER_MEMORY`: the 4M run does not inherit the 1M run's heap, and G1 sizes
  its generations in the same heap at both sizes.
- JVM heap, before each refresh: Python's ``gc.collect()`` (a py4j proxy left in a
  reference cycle keeps its JVM object live), ``System.gc()`` (a full, synchronous
  collection with G1), the heap's used bytes after it (``jvm_heap_live_before``), then
  ``resetPeakUsage()`` on every heap pool. After: the sum of the pools' peak used
  bytes (``jvm_heap_peak``) and the collections that ran. A pool's peak includes
  garbage not yet collected: in a 2g heap a refresh often runs without any collection,
  so its peak is the live heap before it plus what it allocated (eden up to its size,
  and G1's humongous objects, Spark's Tungsten pages among them, straight into the old
  generation). That is what the heap had to hold, not what was live, and it depends on
  GC timing.
- So one more round, the live round, measures the same refreshes differently: a thread
  calls ``System.gc()`` every :data:`LIVE_SAMPLE_S` during the refresh and after it, and
  keeps the largest heap used right after one (``jvm_heap_live_peak_sampled``; its
  growth over the heap before: ``live_peak_growth``, with Python's growth added). A
  sampled lower bound of the live peak that garbage does not inflate (a spike between
  two samples is missed; the forced collections slow the refresh, so its times and
  pool peaks are kept apart, under ``live_round``). It can be negative: a refresh that
  frees more than it keeps.
- Python: the process's resident high-water mark (``VmHWM``), reset before the refresh
  by writing ``5`` to ``/proc/self/clear_refs``, less the resident size then
  (``python_rss_growth``); freed memory that allocators keep would be reused without
  growing the RSS, so before each refresh Arrow's pool releases what it keeps and glibc
  trims its heap (``malloc_trim``). Arrow's own peak during the refresh, exact, from a
  proxy of the default pool (``arrow_pool_peak``); and the JVM's resident growth the
  same way (``jvm_rss_growth``: off-heap buffers and heap pages touched the first time).

The target's number, ``driver_peak_growth``: ``jvm_heap_peak - jvm_heap_live_before +
python_rss_growth``, the memory one refresh needed on the driver above what was live
before it. Reported per query and mode, at both sizes, with ``ratio_4m_over_1m`` of it
(and of its parts, the absolute peak ``jvm_heap_peak + python_rss_peak``, and the live
round's ``live_peak_growth``: ``ratio_4m_over_1m_live``). Target: the INCREMENTAL
refreshes' growth at 4M rows within 1.3x of theirs at 1M (``targets.met``, and
``met_live`` by the live round); FULL is the baseline (its result is read into Python
whole, so the join's grows with T).

Scale: ``--scale`` (or ``BENCH_DYNAMIC_TABLES_SCALE``, ``BENCH_QUICK=1``) multiplies the
sizes, C's rows and the change (floors: 10,000 and 40,000 rows of T, 1,000 of C, 100
rows changed); below scale 0.01 (the smoke run, which checks the path, not the numbers)
one size only (the first, its ratios taken against itself), no warm-up, and one round,
the live one, standing for the measured rounds too.
Times are reported, not judged: memory is the point. Progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.dynamic_table_engine import DIMENSION_ROWS, _ingest_dimension, _queries
from bench.dynamic_tables import (
    MILLION,
    _checksums,
    _create_source,
    _load,
    _progress,
    _refresh,
    _update,
    default_scale,
)
from bench.pipelines import _Bench, _ms, _rows, _timed, cli
from flush.commit_clock import clock
from flush.spark_tables import spark_session

NAME = "dt_refresh_memory"
SIZES = (MILLION, 4 * MILLION)
FLOORS = (10_000, 40_000)
CHANGE_ROWS = 10_000
LABELS = ("group_by_sums", "join")
KINDS = ("INCREMENTAL", "FULL")
MODES = ("incremental", "full")
ROUNDS = 2  # measured, after one warm-up round
SMOKE_ROUNDS = 0  # below scale 0.01: no warm-up, the live round stands for the measured
DRIVER_MEMORY = "2g"
RATIO_MAX = 1.3
LIVE_SAMPLE_S = 0.25
LIVE_KEYS = ("live_peak_growth", "jvm_heap_live_peak_sampled")
ROOT = Path(__file__).resolve().parents[1]


# -- measuring one action --------------------------------------------------------------


def _status_bytes(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_hwm(pid: int | str) -> None:
    """The process's resident high-water mark set to its resident size now."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")


def _release_python_memory() -> None:
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _collections(jvm: Any) -> int:
    management = jvm.java.lang.management.ManagementFactory
    return sum(c.getCollectionCount() for c in management.getGarbageCollectorMXBeans())


class _LiveSampler(threading.Thread):
    """Every :data:`LIVE_SAMPLE_S` until stopped: ``System.gc()`` and the heap used after
    it; the largest of those (a sampled peak of the live heap) and how many."""

    def __init__(self, jvm: Any) -> None:
        super().__init__(daemon=True)
        self.jvm = jvm
        self.samples = 0
        self.peak = 0
        self.stopped = threading.Event()

    def _sample(self) -> None:
        self.jvm.java.lang.System.gc()
        heap = self.jvm.java.lang.management.ManagementFactory.getMemoryMXBean()
        self.peak = max(self.peak, heap.getHeapMemoryUsage().getUsed())
        self.samples += 1

    def run(self) -> None:
        while not self.stopped.wait(LIVE_SAMPLE_S):
            self._sample()

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        self._sample()


@contextmanager
def _peak_memory(jvm: Any, jvm_pid: int, live: bool) -> Iterator[dict[str, Any]]:
    """The peaks of what runs inside (the module's docstring), filled in on exit; with
    ``live``, the JVM's heap also sampled after forced collections (which lowers the
    pools' peaks: such a round is reported apart)."""
    management = jvm.java.lang.management.ManagementFactory
    pools = [p for p in management.getMemoryPoolMXBeans() if p.getType().name() == "HEAP"]
    gc.collect()  # Python objects that hold JVM ones (py4j proxies) keep them live
    jvm.java.lang.System.gc()
    live_before = sum(p.getUsage().getUsed() for p in pools)
    for pool in pools:
        pool.resetPeakUsage()
    _release_python_memory()
    for pid in ("self", jvm_pid):
        _reset_hwm(pid)
    python_before = _status_bytes("self", "VmRSS")
    jvm_rss_before = _status_bytes(jvm_pid, "VmRSS")
    default_pool = pa.default_memory_pool()
    proxy = pa.proxy_memory_pool(default_pool)
    pa.set_memory_pool(proxy)
    collections = _collections(jvm)
    sampler = _LiveSampler(jvm)
    if live:
        sampler.start()
    found: dict[str, Any] = {}
    try:
        yield found
    finally:
        if live:
            sampler.stop()
        pa.set_memory_pool(default_pool)
    heap_peak = sum(p.getPeakUsage().getUsed() for p in pools)
    python_peak = _status_bytes("self", "VmHWM")
    found.update({
        "jvm_heap_live_before": live_before,
        "jvm_heap_peak": heap_peak,
        "jvm_heap_peak_by_pool": {p.getName(): p.getPeakUsage().getUsed() for p in pools},
        "collections": _collections(jvm) - collections - sampler.samples,
        **({"jvm_heap_live_peak_sampled": sampler.peak, "forced_collections": sampler.samples,
            "live_peak_growth": sampler.peak - live_before + python_peak - python_before}
           if live else {}),
        "jvm_rss_growth": _status_bytes(jvm_pid, "VmHWM") - jvm_rss_before,
        "python_rss_before": python_before,
        "python_rss_peak": python_peak,
        "python_rss_growth": python_peak - python_before,
        "arrow_pool_peak": proxy.max_memory(),
        "driver_peak_growth": heap_peak - live_before + python_peak - python_before,
        "driver_peak_absolute": heap_peak + python_peak,
    })  # fmt: skip


# -- one size, in a child process ------------------------------------------------------


def _create_pairs(session: Any, queries: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    tables: dict[str, dict[str, int]] = {}
    for label in LABELS:
        tables[label] = {}
        for kind in KINDS:
            name = f"{queries[label]['table']}_{kind[0]}"
            _progress(f"{NAME}: CREATE DYNAMIC TABLE {name} ({label}, {kind})")
            query = queries[label]["query"]
            session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
                        f"REFRESH_MODE = {kind} AS {query}").collect()  # fmt: skip
            tables[label][kind] = session.require_table(name).id
    return tables


def _round(
    bench: _Bench, tables: dict[str, dict[str, int]], number: int, change: int, jvm_pid: int,
    live: bool = False,
) -> dict[str, dict[str, Any]]:
    """One UPDATE of ``change`` rows, then each table refreshed under :func:`_peak_memory`."""
    session = bench.session
    where = f"ID % 100 = {number + 1} AND ID < {change * 100}"
    _update(session, where, "AMOUNT = AMOUNT + 1", change)
    moment = clock()
    found: dict[str, dict[str, Any]] = {}
    for position, label in enumerate(LABELS):
        found[label] = {}
        order = KINDS if (number + position) % 2 == 0 else KINDS[::-1]
        for kind in order:
            refresh = functools.partial(_refresh, session, tables[label][kind], moment)
            with _peak_memory(bench.spark._jvm, jvm_pid, live) as peaks:
                seconds, record = _timed(refresh)
            assert record.action == kind, (label, kind, record.action, record.reason)
            found[label][kind] = {"ms": _ms(seconds), **peaks}
            sampled = peaks.get("jvm_heap_live_peak_sampled")
            _progress(f"{NAME}:   round {number} {label} {kind}: {seconds:.2f} s, driver "
                      f"growth {peaks['driver_peak_growth'] / 2**20:,.0f} MiB (heap peak "
                      f"{peaks['jvm_heap_peak'] / 2**20:,.0f}, live sampled "
                      f"{(sampled or 0) / 2**20:,.0f}, python rss +"
                      f"{peaks['python_rss_growth'] / 2**20:,.0f})")  # fmt: skip
    return found


def _largest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number's largest over the rounds (a peak is a maximum); ``ms`` per round."""
    keys = [k for k in runs[0] if k not in ("ms", "jvm_heap_peak_by_pool")]
    return {**{k: max(run[k] or 0 for run in runs) for k in keys},
            "ms_rounds": [run["ms"] for run in runs], "rounds": runs}  # fmt: skip


def measure_size(
    rows: int, dimension_rows: int, change: int, rounds: int, warm_up: bool,
    own_jvm: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The child's work: one source size, its tables, a warm-up round (unless not
    ``warm_up``), ``rounds`` measured rounds and the live one (with no measured round, the
    smoke run's, the live round stands for them too), in this process on a Spark session
    with the fixed heap (not ``own_jvm``: the smoke run's, on the session this process
    has, left running)."""
    spark = spark_session("local[2]", app_name="bench-dt-memory", **{
        "spark.driver.memory": DRIVER_MEMORY,
        "spark.driver.extraJavaOptions": f"-Xms{DRIVER_MEMORY}"})  # fmt: skip
    bench = _Bench("dt-memory")
    try:
        session = bench.session
        jvm = spark._jvm
        assert jvm is not None
        jvm_pid = int(jvm.java.lang.ProcessHandle.current().pid())
        _progress(f"{NAME}: T of {rows:,} rows (10 commits), C of {dimension_rows:,} rows")
        _create_source(bench, rows)
        session.sql("CREATE TABLE C (ID NUMBER, REGION VARCHAR(20))")
        _ingest_dimension(session, "C", dimension_rows)
        queries = _queries(dimension_rows, known_limit=False)
        tables = _create_pairs(session, queries)
        if warm_up:
            _round(bench, tables, 0, change, jvm_pid)  # warm-up
        runs = [_round(bench, tables, n, change, jvm_pid) for n in range(1, rounds + 1)]
        live = _round(bench, tables, rounds + 1, change, jvm_pid, live=True)
        runs = runs or [live]
        for label in LABELS:
            table, query = queries[label]["table"], queries[label]["query"]
            sums = _checksums(session, queries[label]["sums"],
                              [f"{table}_I", f"{table}_F", f"({query})"])  # fmt: skip
            assert sums[0] == sums[1] == sums[2], (label, sums)
        return {
            "source_rows": rows,
            "jvm_max_heap": int(jvm.java.lang.Runtime.getRuntime().maxMemory()),
            "load_average": _load(),
            "refreshes": {
                label: {
                    kind.lower(): {
                        **_largest([run[label][kind] for run in runs]),
                        "live_round": live[label][kind],
                    }
                    for kind in KINDS
                }
                for label in LABELS
            },
        }
    finally:
        bench.close()
        if own_jvm:
            spark.stop()


def _child(*arguments: int | bool) -> dict[str, Any]:
    """:func:`measure_size` in a fresh process (its own JVM): its JSON document."""
    argv = [sys.executable, "-m", "bench.dynamic_table_memory", "--child",
            json.dumps(arguments)]  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- the entry -------------------------------------------------------------------------


def _ratios(by_size: list[dict[str, Any]], label: str, kind: str) -> dict[str, Any]:
    """Each number of the larger size over the smaller's (the smoke run's one size: over
    itself)."""
    small, large = (by_size[i]["refreshes"][label][kind] for i in (0, -1))
    small, large = ({**r, **{k: r["live_round"][k] for k in LIVE_KEYS}} for r in (small, large))
    keys = ("driver_peak_growth", "driver_peak_absolute", "jvm_heap_peak", "python_rss_growth",
            "arrow_pool_peak", "jvm_rss_growth", *LIVE_KEYS)
    return {key: round(large[key] / small[key], 2) if small[key] else None for key in keys}


def _by_size(by_size: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """``key`` of each refresh (the live round's for :data:`LIVE_KEYS`), by query, mode
    and source size."""
    def value(refresh: dict[str, Any]) -> Any:
        return refresh["live_round"][key] if key in LIVE_KEYS else refresh[key]

    return {label: {kind: {str(size["source_rows"]): value(size["refreshes"][label][kind])
                           for size in by_size} for kind in MODES}
            for label in LABELS}  # fmt: skip


def _met(ratios: dict[str, Any], key: str) -> dict[str, bool]:
    """Whether each query's INCREMENTAL refresh grew by at most :data:`RATIO_MAX`."""
    found = {label: ratios[label]["incremental"][key] for label in LABELS}
    return {label: ratio is not None and ratio <= RATIO_MAX for label, ratio in found.items()}


def run_refresh_memory(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    sizes = [_rows(scale, size, least=least) for size, least in zip(SIZES, FLOORS, strict=True)]
    dimension_rows = _rows(scale, DIMENSION_ROWS, least=1000)
    change = _rows(scale, CHANGE_ROWS, least=100)
    started = time.perf_counter()
    rounds = ROUNDS if scale >= 0.01 else SMOKE_ROUNDS
    if scale >= 0.01:
        by_size = [_child(rows, dimension_rows, change, rounds, True) for rows in sizes]
    else:  # the smoke run checks the path, not the numbers: no JVM of its own, one size
        sizes = sizes[:1]
        by_size = [measure_size(sizes[0], dimension_rows, change, rounds, False,
                                own_jvm=False)]  # fmt: skip
    ratios = {label: {kind: _ratios(by_size, label, kind) for kind in MODES} for label in LABELS}
    growth = _by_size(by_size, "driver_peak_growth")

    def ratio_of(key: str) -> dict[str, dict[str, Any]]:
        return {label: {kind: ratios[label][kind][key] for kind in MODES} for label in LABELS}

    return {
        "benchmark": NAME,
        "scale": scale,
        "cpus": os.cpu_count(),
        "load_average": _load(),
        "source_rows": sizes,
        "dimension_rows": dimension_rows,
        "rows_updated_per_round": change,
        "update": f"UPDATE T SET AMOUNT = AMOUNT + 1 WHERE ID % 100 = r AND ID < {change * 100}",
        "measured_rounds": rounds,
        "driver_memory": DRIVER_MEMORY,
        "measured": "per refresh, in a fresh process per size: JVM heap pools' peak used after "
        "System.gc() and resetPeakUsage(), less the heap used after that GC, plus the Python "
        "process's VmHWM (reset by clear_refs) less its RSS before; largest of the rounds. "
        "live: one more round, the heap sampled after a System.gc() every 0.25 s instead",
        "driver_peak_growth": growth,
        "baseline_full_driver_peak_growth": {label: growth[label]["full"] for label in LABELS},
        "ratio_4m_over_1m": ratio_of("driver_peak_growth"),
        "live_peak_growth": _by_size(by_size, "live_peak_growth"),
        "ratio_4m_over_1m_live": ratio_of("live_peak_growth"),
        "python_rss_growth": _by_size(by_size, "python_rss_growth"),
        "ratios_of_each_part": ratios,
        "sizes": by_size,
        "wall_s": round(time.perf_counter() - started, 1),
        "targets": {
            "ratio_4m_over_1m_max": RATIO_MAX,
            "met": _met(ratios, "driver_peak_growth"),
            "met_live": _met(ratios, "live_peak_growth"),
        },
    }


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {NAME: run_refresh_memory}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure_size(*json.loads(sys.argv[2]))), flush=True)
        return
    cli("python -m bench.dynamic_table_memory", __doc__, BENCHMARKS)


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
