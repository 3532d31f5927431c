"""TPC-H as dynamic tables: each query's incremental refresh after TPC-H's refresh
functions, beside a FULL refresh of the same query (issue 32).

``dt_tpch`` runs through ``pipelines.Session`` on a local Spark (``local[2]``) and a
fresh warehouse, as the other dynamic table benchmarks do (:mod:`bench.dynamic_tables`):

1. **Data**: DuckDB's TPC-H generator (``CALL dbgen(sf = SF)``) at scale factor
   ``SF = --scale`` (1 by default; 0.001, dbgen's smallest useful one, in the smoke run).
   The extension is the ``duckdb-extension-tpch`` package's file, of the same version as
   ``duckdb``, loaded by path: no extension is downloaded. The 8 tables are created
   through the Session with the types of :data:`bench.tpch_queries.TABLES` and filled as
   the service fills tables (ingest commits of Arrow batches, row ids reserved in the
   catalog), so loading costs what writing Parquet costs.
2. **Dynamic tables**: each of the 22 queries (:mod:`bench.tpch_queries`: no ORDER BY or
   LIMIT, validation parameters) twice, ``TARGET_LAG = '1 hour'``: ``REFRESH_MODE =
   INCREMENTAL`` (``TPCH_Qn_I``, the query-delta engine) and ``REFRESH_MODE = FULL``
   (``TPCH_Qn_F``). A query the engine does not cover is refused at CREATE
   (``DYNAMIC_TABLE_NOT_INCREMENTAL``): its reason is recorded and only the FULL twin
   runs (reported as "FULL with reason", not a failure).
3. **Refresh functions**: RF1 inserts ``SF x 1,500`` new orders (keys above every
   existing one) with their lineitems, in one ingest commit each: copies of existing
   orders chosen by a hash of the key, with new keys, so customers, parts, suppliers and
   dates stay those dbgen made. RF2 deletes as many old orders (the smallest keys) and
   their lineitems with ``DELETE`` statements.
4. **Refresh**: every pair for one data timestamp, alternating which twin goes first;
   each refresh timed as ``ALTER DYNAMIC TABLE ... REFRESH`` makes it, with the action of
   its history row (INCREMENTAL, FULL, NO_DATA: Q2, Q11 and Q16 read neither ORDERS nor
   LINEITEM). Then both twins and the query run fresh must agree (row count and a sum of
   row hashes).

Reported per query: the action, incremental and FULL ms, FULL over incremental; the
median ratio over the queries refreshed INCREMENTAL, and the refused queries with their
reasons. Target: median 10x, none slower than FULL. Progress goes to stderr.
"""

from __future__ import annotations

import functools
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from bench.dynamic_tables import _jvm_options, _load, _progress, _refresh, _table_id, default_scale
from bench.pipelines import _Bench, _ms, _timed, cli
from bench.tpch_queries import TABLES, queries
from flush import TableWriter
from flush.commit_clock import clock

if TYPE_CHECKING:
    import duckdb

    from pipelines import Session

NAME = "dt_tpch"
SPEEDUP_TARGET = 10.0  # median of FULL over INCREMENTAL
ORDERS_PER_SF = 1500  # what RF1 inserts and RF2 deletes, per scale factor
#: Below scale 0.01 (the smoke run, which checks that the run goes through its steps)
#: only these run: a semi join under a GROUP BY; all 22 take minutes even at SF 0.001.
SMOKE_QUERIES = ("q4",)
SMOKE_SCALE_BELOW = 0.01
COMMIT_ROWS = 1_000_000  # rows per ingest commit while loading
CHECKSUM = "SELECT count(*), sum(CAST(xxhash64({}) AS DECIMAL(38, 0))) FROM {}"


def _extension_path() -> Path:
    """The TPC-H extension's file inside the ``duckdb-extension-tpch`` package, for the
    installed ``duckdb``'s version: loaded by path, so nothing is downloaded."""
    from importlib import resources

    import duckdb

    root = Path(str(resources.files("duckdb_extension_tpch")))
    path = root / "extensions" / f"v{duckdb.__version__}" / "tpch.duckdb_extension"
    if not path.exists():
        found = sorted(p.parent.name for p in root.glob("extensions/*/tpch.duckdb_extension"))
        raise RuntimeError(f"duckdb {duckdb.__version__} needs duckdb-extension-tpch of the "
                           f"same version; the package holds {found}")  # fmt: skip
    return path


def _dbgen(scale: float) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB holding TPC-H at scale factor ``scale``."""
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False,
                                 "allow_unsigned_extensions": True})  # fmt: skip
    con.execute(f"LOAD '{_extension_path()}'")
    con.execute(f"CALL dbgen(sf = {scale})")
    return con


def _ingest_arrow(session: Session, name: str, rows: pa.Table) -> None:
    """``rows`` appended to ``name`` as the service's flusher commits them: ids reserved,
    one Parquet file per commit of at most :data:`COMMIT_ROWS` rows."""
    info = session.require_table(name)
    writer = TableWriter(info.uri, info.schema)
    schema = info.schema.to_arrow()
    rows = rows.rename_columns([c.upper() for c in rows.column_names]).cast(schema)
    for offset in range(0, rows.num_rows, COMMIT_ROWS):
        part = rows.slice(offset, COMMIT_ROWS)
        first = session.catalog.reserve_row_ids(info.id, part.num_rows)
        session.catalog.apply_commit(info.id, writer.commit_flush([part], [], first))


def _load_tables(session: Session, con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The 8 tables created through the Session and filled from DuckDB; their rows."""
    counts = {}
    for name, columns in TABLES.items():
        declared = ", ".join(f"{column} {kind}" for column, kind in columns)
        session.sql(f"CREATE TABLE {name} ({declared})")
        rows = con.execute(f"SELECT * FROM {name.lower()}").to_arrow_table()
        _ingest_arrow(session, name, rows)
        counts[name] = rows.num_rows
    return counts


def _rf1_rows(con: duckdb.DuckDBPyConnection, orders: int) -> tuple[pa.Table, pa.Table]:
    """RF1's new orders and their lineitems: ``orders`` existing orders (chosen by a hash
    of the key) copied under new keys above every existing one."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE rf1_keys AS
        SELECT o_orderkey AS old_key,
               (SELECT max(o_orderkey) FROM orders)
               + row_number() OVER (ORDER BY o_orderkey) AS new_key
        FROM (SELECT o_orderkey FROM orders ORDER BY hash(o_orderkey), o_orderkey
              LIMIT {orders})""")  # fmt: skip
    new_orders = con.execute(
        "SELECT * REPLACE (new_key AS o_orderkey) FROM orders "
        "JOIN rf1_keys ON o_orderkey = old_key ORDER BY new_key"
    ).to_arrow_table()
    new_lines = con.execute(
        "SELECT * REPLACE (new_key AS l_orderkey) FROM lineitem "
        "JOIN rf1_keys ON l_orderkey = old_key ORDER BY new_key, l_linenumber"
    ).to_arrow_table()
    keep = [c for c in new_orders.column_names if c not in ("old_key", "new_key")]
    lines = [c for c in new_lines.column_names if c not in ("old_key", "new_key")]
    return new_orders.select(keep), new_lines.select(lines)


def _refresh_functions(
    session: Session, con: duckdb.DuckDBPyConnection, orders: int
) -> dict[str, Any]:
    """RF1 (ingest commits of new orders and lineitems) then RF2 (``DELETE`` of the
    ``orders`` oldest orders and their lineitems); what each did and took."""
    new_orders, new_lines = _rf1_rows(con, orders)
    rf1_s, _ = _timed(lambda: (_ingest_arrow(session, "ORDERS", new_orders),
                               _ingest_arrow(session, "LINEITEM", new_lines)))  # fmt: skip
    last_key, lines = con.execute(f"""
        SELECT max(o_orderkey), (SELECT count(*) FROM lineitem WHERE l_orderkey <= max(o_orderkey))
        FROM (SELECT o_orderkey FROM orders ORDER BY o_orderkey LIMIT {orders})""").fetchone()  # type: ignore[misc]  # fmt: skip

    def rf2() -> None:
        deleted = session.sql(f"DELETE FROM LINEITEM WHERE L_ORDERKEY <= {last_key}").collect()
        assert deleted[0][0] == lines, (deleted, lines)
        deleted = session.sql(f"DELETE FROM ORDERS WHERE O_ORDERKEY <= {last_key}").collect()
        assert deleted[0][0] == orders, (deleted, orders)

    rf2_s, _ = _timed(rf2)
    return {"rf1": {"orders_inserted": new_orders.num_rows,
                    "lineitems_inserted": new_lines.num_rows, "ms": _ms(rf1_s)},
            "rf2": {"orders_deleted": orders, "lineitems_deleted": lines,
                    "orders_deleted_up_to_key": last_key, "ms": _ms(rf2_s)}}  # fmt: skip


def _create_pair(session: Session, label: str, query: str) -> dict[str, Any]:
    """The query's INCREMENTAL and FULL twins (each created with its initial refresh);
    a query the engine refuses gets only the FULL twin and the refusal's reason."""
    from pipelines import SqlError

    pair: dict[str, Any] = {"reason": None, "tables": {}}
    for kind in ("INCREMENTAL", "FULL"):
        name = f"TPCH_{label.upper()}_{kind[0]}"
        create = (f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
                  f"REFRESH_MODE = {kind} AS {query}")  # fmt: skip
        try:
            seconds, _ = _timed(lambda: session.sql(create).collect())  # noqa: B023
        except SqlError as error:
            if kind != "INCREMENTAL" or error.code != "DYNAMIC_TABLE_NOT_INCREMENTAL":
                raise
            pair["reason"] = _reason(str(error))
            _progress(f"{NAME}:   {label}: refused INCREMENTAL ({pair['reason']})")
            continue
        pair["tables"][kind] = {"name": name, "id": _table_id(session, name),
                                "create_s": round(seconds, 2)}  # fmt: skip
    return pair


def _reason(message: str) -> str:
    """The reason codes inside a DYNAMIC_TABLE_NOT_INCREMENTAL message: ``... cannot
    (<reasons>): use ...``."""
    start = message.find("cannot (")
    end = message.rfind("): use")
    return message[start + len("cannot (") : end] if 0 <= start < end else message


def _refresh_pair(
    session: Session, pair: dict[str, Any], moment: int, incremental_first: bool
) -> dict[str, Any]:
    """Each twin refreshed once for the data timestamp ``moment``: ms and history row."""
    kinds = [k for k in ("INCREMENTAL", "FULL") if k in pair["tables"]]
    if not incremental_first:
        kinds.reverse()
    found: dict[str, Any] = {"first": kinds[0]}
    for kind in kinds:
        table = pair["tables"][kind]
        seconds, record = _timed(functools.partial(_refresh, session, table["id"], moment))
        found[kind.lower()] = {"ms": _ms(seconds), "action": record.action,
                               "reason": record.reason, "inserted": record.rows_inserted,
                               "deleted": record.rows_deleted,
                               "updated": record.rows_updated}  # fmt: skip
    return found


def _query_result(label: str, query: str, pair: dict[str, Any], refreshed: dict[str, Any],
                  session: Session) -> dict[str, Any]:  # fmt: skip
    """One query's line of the report, after checking that its twins hold its rows."""
    names = [t["name"] for t in pair["tables"].values()]
    # The query's columns in the tables' types (a count is a long, its column NUMBER(38,0)).
    fields = session.sql(f"SELECT * FROM {names[-1]}").schema.fields
    columns = [f"`{f.name}`" for f in fields]
    cast = [f"CAST(`{f.name}` AS {f.dataType.simpleString()})" for f in fields]
    sums = [list(session.sql(CHECKSUM.format(", ".join(over), source)).collect()[0])
            for over, source in [*((columns, name) for name in names),
                                 (cast, f"({query})")]]  # fmt: skip
    if any(s != sums[-1] for s in sums):
        _progress(f"{NAME}: {label} differs from its query: {names} {sums}")
    full = refreshed["full"]
    result: dict[str, Any] = {
        "action": full["action"] if pair["reason"] else refreshed["incremental"]["action"],
        "refused_reason": pair["reason"], "full_ms": full["ms"], "full_action": full["action"],
        "result_rows": sums[-1][0],
        "contents_equal_to_the_query": all(s == sums[-1] for s in sums),
        "create_with_initial_refresh_s": {k.lower(): t["create_s"]
                                          for k, t in pair["tables"].items()},
        "refreshes": refreshed,
    }  # fmt: skip
    if not pair["reason"]:
        incremental = refreshed["incremental"]["ms"]
        result["incremental_ms"] = incremental
        result["full_over_incremental"] = round(full["ms"] / max(incremental, 0.1), 2)
    return result


def _summary(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Medians, the queries each action covers, the refused ones, and the targets."""
    by_action: dict[str, list[str]] = {}
    for label, r in results.items():
        by_action.setdefault(r["action"] if not r["refused_reason"]
                             else "FULL (refused INCREMENTAL)", []).append(label)  # fmt: skip
    incremental = {label: results[label]["full_over_incremental"]
                   for label in by_action.get("INCREMENTAL", [])}  # fmt: skip
    median = statistics.median(incremental.values()) if incremental else None
    return {
        "full_over_incremental_median": median,
        "full_over_incremental_median_of": "queries whose INCREMENTAL twin refreshed "
        "INCREMENTAL (NO_DATA and refused queries left out)",
        "queries_by_action": by_action,
        "refused_by_engine": {"count": sum(1 for r in results.values() if r["refused_reason"]),
                              "reasons": {label: r["refused_reason"] for label, r in
                                          results.items() if r["refused_reason"]}},
        "targets": {
            "full_over_incremental_median_min": SPEEDUP_TARGET,
            "median_met": median is not None and median >= SPEEDUP_TARGET,
            "none_slower_than_full": all(ratio >= 1.0 for ratio in incremental.values()),
            "slower_than_full": sorted(k for k, ratio in incremental.items() if ratio < 1.0),
        },
    }  # fmt: skip


def _create_all(session: Session, texts: dict[str, str]) -> dict[str, dict[str, Any]]:
    pairs = {}
    for label, query in texts.items():
        _progress(f"{NAME}: CREATE DYNAMIC TABLE TPCH_{label.upper()}_I / _F")
        pairs[label] = _create_pair(session, label, query)
    return pairs


def run_tpch(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    orders = max(1, round(scale * ORDERS_PER_SF))
    _progress(f"{NAME}: dbgen(sf = {scale})")
    dbgen_s, con = _timed(functools.partial(_dbgen, scale))
    bench = _Bench("dt-tpch")
    session = bench.session
    try:
        load_s, table_rows = _timed(functools.partial(_load_tables, session, con))
        _progress(f"{NAME}: loaded {table_rows} in {load_s:.1f} s")
        texts = {label: text for label, text in queries(scale).items()
                 if scale >= SMOKE_SCALE_BELOW or label in SMOKE_QUERIES}  # fmt: skip
        pairs = _create_all(session, texts)
        _progress(f"{NAME}: RF1 (+{orders:,} orders), RF2 (-{orders:,} orders)")
        applied = _refresh_functions(session, con, orders)
        moment = clock()
        refreshed = {}
        for position, (label, pair) in enumerate(pairs.items()):
            refreshed[label] = _refresh_pair(session, pair, moment, position % 2 == 0)
            r = refreshed[label]
            _progress(f"{NAME}:   {label}: " + ", ".join(
                f"{k} {r[k]['action']} {r[k]['ms']:,.0f} ms"
                for k in ("incremental", "full") if k in r))  # fmt: skip
        _progress(f"{NAME}: checking that both twins hold each query's rows")
        results = {label: _query_result(label, texts[label], pairs[label], refreshed[label],
                                        session) for label in pairs}  # fmt: skip
        differ = [label for label, r in results.items() if not r["contents_equal_to_the_query"]]
        report = {
            "benchmark": NAME, "scale": scale, "tpch_scale_factor": scale,
            "cpus": os.cpu_count(), "load_average": _load(), "spark_master": "local[2]",
            "spark_submit_opts": _jvm_options(),
            "table_rows": table_rows, "dbgen_s": round(dbgen_s, 1), "load_s": round(load_s, 1),
            "refresh_functions": applied,
            "measured": "refresh_with_upstreams(session, id, 'MANUAL', same data timestamp), "
            "once per twin after RF1 + RF2",
            "incremental_ms": {k: r.get("incremental_ms") for k, r in results.items()},
            "baseline_full_ms": {k: r["full_ms"] for k, r in results.items()},
            "baseline_full_ms_median": statistics.median(r["full_ms"] for r in results.values()),
            "full_over_incremental": {k: r.get("full_over_incremental")
                                      for k, r in results.items()},
            **_summary(results), "queries": results,
            "spark_session_start_s": bench.spark_start_s,
        }  # fmt: skip
        # A table that differs from its query fails the run, its numbers kept on stderr.
        if differ:
            _progress(f"{NAME}: report {orjson.dumps(report).decode()}")
            raise AssertionError(f"dynamic tables differ from their queries: {differ}")
        return report
    finally:
        con.close()
        bench.close()


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {NAME: run_tpch}


def main() -> None:
    cli("python -m bench.tpch", __doc__, BENCHMARKS)


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
