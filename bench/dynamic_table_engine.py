"""The query-delta engine: an INCREMENTAL refresh of joins, aggregates and windows beside
a FULL refresh of the same query.

``dt_engine_vs_full`` runs through ``pipelines.Session`` on a local Spark (``local[2]``)
and a fresh warehouse, as the other dynamic table benchmarks do
(:mod:`bench.dynamic_tables`). Two sources, filled as the service fills tables (ingest
commits, row ids reserved in the catalog):

- ``T (ID, GRP, AMOUNT, V)``, 1M rows in 10 commits, the generator of
  :mod:`bench.dynamic_tables` (``ID`` = row id, ``GRP = (ID // 100) % 5``,
  ``AMOUNT = ID / 2``);
- ``C (ID NUMBER, REGION VARCHAR(20))``, 100k rows in one commit: ``ID`` = row id
  (``0..n-1``), ``REGION = 'R' || (ID % 50)``.

T gets no join column: the join key is computed in the query, ``T.ID % n = C.ID`` (``n``
the rows of C), so every row of T finds exactly one row of C (the LEFT join's rows are
the inner join's; what differs is the rule the engine applies: the two-term delta of an
inner join, the recomputed kept-side rows of an outer join). Each query is created twice,
``REFRESH_MODE = INCREMENTAL`` (``<name>_I``, refreshed by the engine) and
``REFRESH_MODE = FULL`` (``<name>_F``: the query over the snapshots; nothing follows the
table, so the refresh overwrites it, the cheapest FULL refresh):

- ``group_by``: ``SELECT GRP, ID % 1000 AS K, count(*) AS N, sum(AMOUNT) AS S,
  min(AMOUNT) AS MN FROM T GROUP BY GRP, ID % 1000`` (1,000 groups: ``GRP`` follows
  from ``ID % 1000``);
- ``group_by_sums``: ``SELECT GRP, ID % 1000 AS K, count(*) AS N, sum(CAST(AMOUNT AS
  DECIMAL(20, 2))) AS S FROM T GROUP BY GRP, ID % 1000``: counts and exact sums only,
  which the table maintains from the change and its hidden state
  (:mod:`pipelines.incremental.algebraic`); ``group_by``'s ``min`` and float sum make
  the engine aggregate the touched groups' rows again;
- ``join``: ``SELECT T.ID, T.AMOUNT, C.REGION FROM T JOIN C ON T.ID % n = C.ID``;
- ``left_join``: the same with ``LEFT JOIN``;
- ``window``: ``SELECT ID, GRP, AMOUNT, row_number() OVER (PARTITION BY ID % 1000 ORDER
  BY ID) AS RN FROM T`` (1,000 partitions);
- ``window_few_partitions`` (a known limit, outside the targets): the same window
  ``PARTITION BY GRP``, 5 partitions, every one of them touched by any 1% update, so
  the engine recomputes the whole result twice (old and new) and cannot win. From
  scale 0.1 only: below it, it runs the same code as ``window`` and would only lengthen
  the smoke run.

A round updates 1% of T, ``UPDATE T SET AMOUNT = AMOUNT + 1 WHERE ID % 100 = r``, then
refreshes every pair for one data timestamp, alternating which of the pair goes first
(by round and by query). The keys of ``group_by`` and ``window`` are ``ID % 1000``, so
the update touches 1% of the groups and partitions (10 of 1,000): a key that every
update touched (``GRP``, or ``ID // 1000`` against a scattered update) leaves nothing to
skip. One warm-up round, then 2 timed ones (below scale 0.01, the smoke run: one timed
round and no warm-up, ``warm_up_round`` null). Reported
per refresh: milliseconds, the history's counts (inserted, deleted, updated), the Delta
files and bytes the refresh's commit added (``_delta_log``) next to the change's size
(source rows updated, result rows changed), the table's bytes, and what the round's
UPDATE wrote to T; per query, the median of the rounds for both, FULL over INCREMENTAL,
and where the last round's time went. After the rounds, both tables of a pair and the
query itself must agree (checksums), every ``_I`` refresh must have been INCREMENTAL and
every ``_F`` one FULL. Target: the incremental refresh at least 5x faster than FULL, for
each of the five queries.

Scale: ``--scale`` (``python -m bench dt_engine_vs_full --scale 0.01``) or
``BENCH_DYNAMIC_TABLES_SCALE`` multiplies both sources' rows (floors: 10,000 rows of T,
1,000 of C); ``BENCH_QUICK=1`` means scale 0.01. The group and partition keys stay
``ID % 1000``. Progress goes to stderr.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from bench.dynamic_tables import (
    INCREMENTAL_SPEEDUP_MIN,
    MILLION,
    _checksums,
    _counts,
    _create_source,
    _expected,
    _jvm_options,
    _load,
    _log_writes,
    _phases,
    _progress,
    _refresh,
    _refresh_targets,
    _table_bytes,
    _table_id,
    _update,
    _version,
    default_scale,
)
from bench.pipelines import _Bench, _ms, _rows, _timed, cli
from flush import TableWriter
from flush.commit_clock import clock

if TYPE_CHECKING:
    from pipelines import Session

DIMENSION_ROWS = 100_000
REGIONS = 50
KEYS = 1000  # groups of group_by, partitions of window: ID % KEYS
ROUNDS = 2  # after one warm-up round
SMOKE_ROUNDS = 1  # below scale 0.01: the smoke run's times mean nothing, its steps all run
KNOWN_LIMIT_MIN_SCALE = 0.1  # below it the smoke run skips the known-limit pair (same code)
NAME = "dt_engine_vs_full"


def _queries(dimension_rows: int, known_limit: bool) -> dict[str, dict[str, Any]]:
    """Each query: the short name of its tables, its text, the checksum over a table
    (``{}``) holding its rows, and whether it counts toward the targets (``known_limit``:
    include the pair outside them)."""
    join = f"SELECT T.ID, T.AMOUNT, C.REGION FROM T {{}} C ON T.ID % {dimension_rows} = C.ID"
    joined = "SELECT COUNT(*), SUM(ID), SUM(AMOUNT), COUNT(REGION), SUM(LENGTH(REGION) * ID)"
    window = "SELECT ID, GRP, AMOUNT, row_number() OVER (PARTITION BY {} ORDER BY ID) AS RN"
    windowed = "SELECT COUNT(*), SUM(ID), SUM(AMOUNT), SUM(RN), SUM(RN * ID)"
    grouped = "SELECT COUNT(*), SUM(N), SUM(S), SUM(MN), SUM(K * N), SUM(GRP * S)"
    group_by = (
        f"SELECT GRP, ID % {KEYS} AS K, count(*) AS N, sum(AMOUNT) AS S, min(AMOUNT) AS MN "
        f"FROM T GROUP BY GRP, ID % {KEYS}"
    )
    sums = (
        f"SELECT GRP, ID % {KEYS} AS K, count(*) AS N, sum(CAST(AMOUNT AS DECIMAL(20, 2))) "
        f"AS S FROM T GROUP BY GRP, ID % {KEYS}"
    )
    summed = "SELECT COUNT(*), SUM(N), SUM(S), SUM(K * N), SUM(GRP * S)"
    specs = [
        ("group_by", "G", group_by, grouped, True),
        ("group_by_sums", "GS", sums, summed, True),
        ("join", "J", join.format("JOIN"), joined, True),
        ("left_join", "L", join.format("LEFT JOIN"), joined, True),
        ("window", "W", f"{window.format(f'ID % {KEYS}')} FROM T", windowed, True),
        ("window_few_partitions", "WG", f"{window.format('GRP')} FROM T", windowed, False),
    ]
    return {
        label: {"table": table, "query": query, "sums": f"{sums} FROM {{}}", "target": target}
        for label, table, query, sums, target in specs
        if target or known_limit
    }


def _ingest_dimension(session: Session, name: str, rows: int) -> None:
    """``rows`` rows of ``(ID, REGION)`` in one ingest commit (ids reserved, one Parquet
    file): ``ID`` = row id, ``REGION = 'R' || (ID % REGIONS)``."""
    info = session.require_table(name)
    schema = info.schema.to_arrow()
    first = session.catalog.reserve_row_ids(info.id, rows)
    ids = np.arange(first, first + rows, dtype=np.int64)
    part = pa.table([pa.array(ids).cast(schema.field("ID").type),
                     pa.array(np.char.add("R", (ids % REGIONS).astype(str)))],
                    schema=schema)  # fmt: skip
    session.catalog.apply_commit(info.id, TableWriter(info.uri, info.schema)
                                 .commit_flush([part], [], first))  # fmt: skip


def _engine_targets(session: Session) -> list[tuple[Any, str, str]]:
    """What a refresh calls by name (:func:`bench.dynamic_tables._refresh_targets`), and
    the engine's own steps."""
    import pipelines.dynamic_tables.refresh_change as change
    import pipelines.transactions.table_sources as table_sources
    from pipelines.incremental.delta import Deltas

    return [
        *_refresh_targets(session),
        (change, "cached_plan_over_stand_ins", "engine_plan_over_stand_ins"),
        (table_sources, "read_changes", "engine_read_source_changes"),
        (Deltas, "materialised", "engine_touched_keys_to_relation"),
        (change, "_derived_incremental", "engine_build_delta_frames"),
        (change, "_overwrite", "full_overwrite_other"),
    ]


def _refresh_one(
    session: Session, table: dict[str, Any], kind: str, moment: int, rows_updated: int
) -> tuple[dict[str, Any], dict[str, float]]:
    """One refresh of the ``kind`` (INCREMENTAL, FULL) table of a query, for the data
    timestamp ``moment``: its time, counts, what it wrote, and its phases."""
    before = _version(table["uri"])
    with _phases(_engine_targets(session)) as spent:
        seconds, record = _timed(functools.partial(_refresh, session, table["id"], moment))
    assert record.action == kind, record
    counts = _counts(record)
    written = _log_writes(table["uri"], before + 1, _version(table["uri"]))
    table_bytes = _table_bytes(table["uri"])
    changed = counts["inserted"] + counts["deleted"] + counts["updated"]
    return {
        "ms": _ms(seconds), **counts, "result_rows_changed": changed,
        "source_rows_updated": rows_updated, **written, "table_bytes": table_bytes,
        "written_over_table_bytes": round(written["bytes_added"] / max(1, table_bytes), 3),
        "bytes_per_changed_row": round(written["bytes_added"] / max(1, changed), 1),
    }, spent  # fmt: skip


def run_engine_vs_full(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    rows = _rows(scale, MILLION, least=10_000)
    dimension_rows = _rows(scale, DIMENSION_ROWS, least=1000)
    queries = _queries(dimension_rows, scale >= KNOWN_LIMIT_MIN_SCALE)
    smoke = scale < 0.01  # one timed round, no warm-up
    timed_rounds = SMOKE_ROUNDS if smoke else ROUNDS
    bench = _Bench("dt-engine")
    session = bench.session
    try:
        _progress(f"{NAME}: T of {rows:,} rows (10 commits), C of {dimension_rows:,} rows")
        _create_source(bench, rows)
        session.sql("CREATE TABLE C (ID NUMBER, REGION VARCHAR(20))")
        _ingest_dimension(session, "C", dimension_rows)
        source_uri = session.require_table("T").uri
        tables: dict[str, dict[str, dict[str, Any]]] = {}
        for label, spec in queries.items():
            tables[label] = {}
            for kind, suffix in (("INCREMENTAL", "I"), ("FULL", "F")):
                name = f"{spec['table']}_{suffix}"
                _progress(f"{NAME}: CREATE DYNAMIC TABLE {name} ({label}, {kind})")
                create = (f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' "
                          f"REFRESH_MODE = {kind} AS {spec['query']}")  # fmt: skip
                create_s, _ = _timed(lambda: session.sql(create).collect())  # noqa: B023
                info = session.require_table(name)
                tables[label][kind] = {"name": name, "id": _table_id(session, name),
                                       "uri": info.uri, "create_s": round(create_s, 2)}  # fmt: skip
        shown = {r["name"]: (r["refresh_mode"], r["refresh_mode_reason"])
                 for r in session.sql("SHOW DYNAMIC TABLES").collect()}  # fmt: skip
        rounds: dict[str, list[dict[str, Any]]] = {label: [] for label in queries}
        warm_up: dict[str, dict[str, Any]] = {}
        phases: dict[str, dict[str, Any]] = {label: {} for label in queries}
        for number in range(int(smoke), timed_rounds + 1):
            residue = number + 1
            rows_updated = _expected(rows, residue)
            _progress(f"{NAME}: round {number}{' (warm-up)' if not number else ''}: UPDATE "
                      f"of 1% (ID % 100 = {residue}, {rows_updated:,} rows), then "
                      f"{2 * len(queries)} refreshes")  # fmt: skip
            source_before = _version(source_uri)
            update_s = _update(session, f"ID % 100 = {residue}", "AMOUNT = AMOUNT + 1",
                               rows_updated)  # fmt: skip
            update_written = _log_writes(source_uri, source_before + 1, _version(source_uri))
            moment = clock()
            for position, label in enumerate(queries):
                order = (["INCREMENTAL", "FULL"] if (number + position) % 2 == 0
                         else ["FULL", "INCREMENTAL"])  # fmt: skip
                found: dict[str, Any] = {"round": number, "update_s": round(update_s, 2),
                                         "source_update_written": update_written,
                                         "first": order[0]}  # fmt: skip
                for kind in order:
                    found[kind.lower()], phases[label][kind.lower()] = _refresh_one(
                        session, tables[label][kind], kind, moment, rows_updated
                    )
                found["full_over_incremental"] = round(
                    found["full"]["ms"] / found["incremental"]["ms"], 2
                )
                _progress(f"{NAME}:   {label}: incremental {found['incremental']['ms']:,.0f} "
                          f"ms, full {found['full']['ms']:,.0f} ms "
                          f"({found['full_over_incremental']}x)")  # fmt: skip
                if number:
                    rounds[label].append(found)
                else:
                    warm_up[label] = found
        _progress(f"{NAME}: checking that both tables of each pair hold the query's rows")
        results: dict[str, Any] = {}
        for label, spec in queries.items():
            names = [tables[label][kind]["name"] for kind in ("INCREMENTAL", "FULL")]
            sums = _checksums(session, spec["sums"], [*names, f"({spec['query']})"])
            assert sums[0] == sums[1] == sums[2], (label, sums)
            runs = rounds[label]
            incremental = statistics.median(r["incremental"]["ms"] for r in runs)
            full = statistics.median(r["full"]["ms"] for r in runs)
            results[label] = {
                "query": spec["query"],
                "tables": {kind.lower(): tables[label][kind]["name"] for kind in tables[label]},
                "effective_modes": {
                    kind.lower(): shown[tables[label][kind]["name"]][0] for kind in tables[label]
                },
                "create_with_initial_refresh_s": {
                    kind.lower(): tables[label][kind]["create_s"] for kind in tables[label]
                },
                "result_rows": sums[0][0],
                "incremental_ms_median": incremental,
                "full_ms_median": full,
                "full_over_incremental": round(full / incremental, 2),
                "full_over_incremental_rounds": [r["full_over_incremental"] for r in runs],
                "counts_toward_targets": spec["target"],
                "rounds": runs,
                "warm_up_round": warm_up.get(label),
                "phases_ms_last_round": phases[label],
                "contents_equal_to_the_query": True,
            }
        ratios = {label: r["full_over_incremental"] for label, r in results.items()
                  if r["counts_toward_targets"]}  # fmt: skip
        return {
            "benchmark": NAME,
            "scale": scale,
            "cpus": os.cpu_count(),
            "load_average": _load(),
            "spark_submit_opts": _jvm_options(),
            "spark_master": "local[2]",
            "source_rows": rows,
            "dimension_rows": dimension_rows,
            "rows_updated_per_round": _expected(rows, 1),
            "timed_rounds": timed_rounds,
            "update": "UPDATE T SET AMOUNT = AMOUNT + 1 WHERE ID % 100 = r",
            "measured": "refresh_with_upstreams(session, id, 'MANUAL', same data timestamp); "
            "bytes from the refresh's Delta commit",
            **{
                key: {label: r[field] for label, r in results.items()}
                for key, field in (
                    ("incremental_ms_median", "incremental_ms_median"),
                    ("baseline_full_ms_median", "full_ms_median"),
                    ("full_over_incremental", "full_over_incremental"),
                )
            },
            "queries": results,
            "spark_session_start_s": bench.spark_start_s,
            "targets": {
                "full_over_incremental_min": INCREMENTAL_SPEEDUP_MIN,
                "met": {label: ratio >= INCREMENTAL_SPEEDUP_MIN for label, ratio in ratios.items()},
                "met_every_round": {
                    label: min(results[label]["full_over_incremental_rounds"])
                    >= INCREMENTAL_SPEEDUP_MIN
                    for label in ratios
                },
                "known_limit_outside_targets": [
                    label for label, r in results.items() if not r["counts_toward_targets"]
                ],
            },
        }
    finally:
        bench.close()


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {NAME: run_engine_vs_full}


def main() -> None:
    cli("python -m bench.dynamic_table_engine", __doc__, BENCHMARKS)


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
