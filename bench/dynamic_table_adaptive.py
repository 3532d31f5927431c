"""Where an incremental refresh stops paying off: the engine's refresh beside a FULL one
for changes of growing size, the measure behind ADAPTIVE's threshold.

``dt_adaptive_shares`` builds the sources of :mod:`bench.dynamic_table_engine` (``T``,
1M rows in 10 commits, and ``C``, 100k rows; both scaled by ``--scale``) and three of
its queries, each created ``REFRESH_MODE = INCREMENTAL``, ``FULL`` and ``ADAPTIVE``: ``join``
(inner join of T and C), ``left_join`` and ``group_by`` (1,000 groups). For each share
``s`` of :data:`SHARES`, one UPDATE changes ``s`` of T's rows (``ID % 1000 < s x
1000``: rows scattered over every file, and for ``group_by`` every group touched from
``s = 0.001`` on, the worst case for recomputing groups), then every triple refreshes for
one data timestamp, rotating which twin goes first. One warm-up round at the
smallest share, untimed.

Reported per query and share: the INCREMENTAL and FULL refreshes' milliseconds and FULL
over INCREMENTAL, and the ADAPTIVE twin's action, reason and milliseconds over the faster
of the other two (``adaptive_over_best``: what its choice cost against knowing the answer);
per query, ``switch_share``: the smallest share at which FULL was faster (None: the
incremental refresh was faster at every share measured). After the rounds both twins
and the query agree (checksums). Scale as the other benchmarks (``--scale``,
``BENCH_DYNAMIC_TABLES_SCALE``, ``BENCH_QUICK=1``); below scale 0.01 (the smoke run)
one share and no warm-up.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from bench.dynamic_table_engine import _ingest_dimension, _queries
from bench.dynamic_tables import (
    MILLION,
    _checksums,
    _create_source,
    _jvm_options,
    _load,
    _progress,
    _refresh,
    _table_id,
    default_scale,
)
from bench.pipelines import _Bench, _ms, _rows, _timed, cli
from flush.commit_clock import clock

NAME = "dt_adaptive_shares"
SHARES = (0.001, 0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.5)
SMOKE_SHARES = (0.1,)
LABELS = ("join", "left_join", "group_by")
KINDS = ("INCREMENTAL", "FULL", "ADAPTIVE")


def _pairs(bench: _Bench, queries: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each query's INCREMENTAL, FULL and ADAPTIVE twins, created (initial refresh
    included)."""
    session = bench.session
    tables: dict[str, dict[str, int]] = {}
    for label in LABELS:
        spec = queries[label]
        tables[label] = {}
        for kind in KINDS:
            name = f"A{spec['table']}_{kind[0]}"
            _progress(f"{NAME}: CREATE DYNAMIC TABLE {name} ({label}, {kind})")
            session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
                        f"REFRESH_MODE = {kind} AS {spec['query']}").collect()  # fmt: skip
            tables[label][kind] = _table_id(session, name)
    return tables


def _round(
    bench: _Bench, tables: dict[str, dict[str, int]], share: float, number: int
) -> dict[str, dict[str, Any]]:
    """One UPDATE of ``share`` of T, then every triple refreshed: ms per twin."""
    session = bench.session
    below = max(1, round(share * 1000))
    session.sql(f"UPDATE T SET AMOUNT = AMOUNT + 1 WHERE ID % 1000 < {below}").collect()
    moment = clock()
    found: dict[str, dict[str, Any]] = {}
    for position, label in enumerate(LABELS):
        turn = (number + position) % len(KINDS)
        found[label] = {}
        for kind in KINDS[turn:] + KINDS[:turn]:
            seconds, record = _timed(functools.partial(_refresh, session, tables[label][kind],
                                                       moment))  # fmt: skip
            if kind == "ADAPTIVE":
                found[label]["adaptive_action"] = record.action
                found[label]["adaptive_reason"] = record.reason or None
            else:
                assert record.action == kind, (label, kind, record.action, record.reason)
            found[label][kind.lower() + "_ms"] = _ms(seconds)
        times = found[label]
        times["full_over_incremental"] = round(times["full_ms"] / times["incremental_ms"], 2)
        best = min(times["full_ms"], times["incremental_ms"])
        times["adaptive_over_best"] = round(times["adaptive_ms"] / best, 2)
        _progress(f"{NAME}:   share {share:.3f} {label}: incremental "
                  f"{times['incremental_ms']:,.0f} ms, full {times['full_ms']:,.0f} ms "
                  f"({times['full_over_incremental']}x), adaptive "
                  f"{times['adaptive_action']} {times['adaptive_ms']:,.0f} ms "
                  f"({times['adaptive_over_best']}x the best)")  # fmt: skip
    return found


def _switch(measured: dict[float, dict[str, Any]], label: str, shares: tuple[float, ...]) -> Any:
    """The smallest share at which FULL was faster (None: never)."""
    slower = [s for s in shares if measured[s][label]["full_over_incremental"] < 1]
    return slower[0] if slower else None


def run_adaptive_shares(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    rows = _rows(scale, MILLION, least=10_000)
    dimension_rows = _rows(scale, 100_000, least=1000)
    shares = SHARES if scale >= 0.01 else SMOKE_SHARES
    queries = _queries(dimension_rows, known_limit=False)
    bench = _Bench("dt-adaptive")
    try:
        session = bench.session
        _progress(f"{NAME}: T of {rows:,} rows (10 commits), C of {dimension_rows:,} rows")
        _create_source(bench, rows)
        session.sql("CREATE TABLE C (ID NUMBER, REGION VARCHAR(20))")
        _ingest_dimension(session, "C", dimension_rows)
        tables = _pairs(bench, queries)
        if scale >= 0.01:  # the smoke run's times mean nothing: no warm-up
            _round(bench, tables, shares[0], 0)
        measured = {share: _round(bench, tables, share, n + 1) for n, share in enumerate(shares)}
        for label in LABELS:
            spec = queries[label]
            names = [f"A{spec['table']}_{kind[0]}" for kind in KINDS] + [f"({spec['query']})"]
            sums = _checksums(session, spec["sums"], names)
            assert all(s == sums[0] for s in sums), (label, sums)
        per_query = {
            label: {
                "query": queries[label]["query"],
                "by_share": {str(share): measured[share][label] for share in shares},
                "switch_share": _switch(measured, label, shares),
            }
            for label in LABELS
        }
        return {
            "benchmark": NAME,
            "scale": scale,
            "cpus": os.cpu_count(),
            "load_average": _load(),
            "spark_submit_opts": _jvm_options(),
            "source_rows": rows,
            "dimension_rows": dimension_rows,
            "shares": list(shares),
            "update": "UPDATE T SET AMOUNT = AMOUNT + 1 WHERE ID % 1000 < share * 1000",
            "baseline_full_ms": {
                label: {str(s): measured[s][label]["full_ms"] for s in shares} for label in LABELS
            },
            "switch_share": {label: per_query[label]["switch_share"] for label in LABELS},
            "queries": per_query,
            "contents_equal_to_the_query": True,
        }
    finally:
        bench.close()


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {NAME: run_adaptive_shares}


def main() -> None:
    cli("python -m bench.dynamic_table_adaptive", __doc__, BENCHMARKS)


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
