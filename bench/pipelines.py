"""The pipeline layer: reading streams, and consuming them, beside plain table reads.

Three benchmarks, each one JSON document with its baseline measured in the same run,
all through ``pipelines.Session`` on a local Spark (``local[2]``) and a fresh warehouse.
Tables are ``(ID INT, V VARCHAR(20))``, filled as the service fills them: several
ingest commits (``flush.TableWriter.commit_flush``, row ids reserved in the catalog).

1. ``stream_read_vs_scan``: a 1M-row table (10 commits); a standard stream; an UPDATE
   of 1% of the rows, scattered (``ID % 100 = 0``, every file rewritten) or contiguous
   (``ID < 10000``, what a compaction-friendly layout sees; a second stream made after
   the first update), each stream read while it holds only its own update. Reading the
   stream fully (``SELECT * FROM s``, to Arrow) against
   a full scan of the table (``SELECT * FROM t``, to Arrow, the same output path).
   Target: the stream read takes at most 10% of the scan. Also reported: the floor of
   any statement (``SELECT 1`` to Arrow through the session: Spark's job and the
   binding) and both shares with that floor taken off.
2. ``append_only_growth``: tables of 1M and 4M rows (10 and 40 commits); an
   ``APPEND_ONLY = TRUE`` stream; then 100 ingest commits of 1,000 rows. Reading the
   stream at 1M against reading it at 4M. Target: within 1.5x (the read does not grow
   with the table).
3. ``consuming_insert``: a source table with a stream holding 10,000 inserted rows (an
   ingest commit before each round); ``INSERT INTO t2 SELECT ID, V FROM s`` timed from
   the statement to its commit, in a warm session. Baseline: the same INSERT from a
   plain table of 10,000 rows. Target: under 2 s.

Every time is the median of 3 runs after one warm-up (below scale 0.01, the smoke run,
which checks the steps and not the numbers: one run after the warm-up). ``phases_*``
fields break one extra (untimed) run down by where its time went: delta-rs' change data
feed read, Spark evaluating the query into Arrow, the ingest conversion checks, staging
the Parquet file, the Delta commit, and the catalog's commit records.

Scale: ``--scale`` (``python -m bench.pipelines --scale 0.01``) or
``BENCH_PIPELINES_SCALE`` multiplies every row count (table sizes, update share stays
1%, change counts); ``BENCH_QUICK=1`` means scale 0.01. Below scale 1 the growth
benchmark makes 25 commits instead of 100 (below 0.01, 5). Progress goes to stderr.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from unittest import mock

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from flush import TableWriter
from flush.spark_tables import spark_session

if TYPE_CHECKING:
    from pipelines import Session

MILLION = 1_000_000
REPEATS = 3
SMOKE_BELOW = 0.01  # a scale under it is a smoke run: every step once, numbers meaningless
SMOKE_REPEATS = 1
STREAM_READ_SHARE_MAX = 0.10
GROWTH_RATIO_MAX = 1.5
CONSUMING_INSERT_MAX_S = 2.0
_STARTED = time.perf_counter()


def default_scale() -> float:
    if os.environ.get("BENCH_PIPELINES_SCALE"):
        return float(os.environ["BENCH_PIPELINES_SCALE"])
    return 0.01 if os.environ.get("BENCH_QUICK", "") not in ("", "0") else 1.0


def _progress(message: str) -> None:
    print(f"[bench.pipelines {time.perf_counter() - _STARTED:7.1f}s] {message}",
          file=sys.stderr, flush=True)  # fmt: skip


def _rows(scale: float, full: int, least: int = 100) -> int:
    return max(least, round(full * scale))


def _smoke(scale: float) -> bool:
    """Whether ``scale`` is a smoke run's (``--scale 0.001`` in the test suite)."""
    return scale < SMOKE_BELOW


def _repeats(scale: float) -> int:
    """Timed runs after the warm-up: :data:`REPEATS`, one in a smoke run."""
    return SMOKE_REPEATS if _smoke(scale) else REPEATS


def _timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    outcome = action()
    return time.perf_counter() - started, outcome


def _median(action: Callable[[], Any], repeats: int = REPEATS) -> tuple[float, list[float], Any]:
    """One warm-up, then the median of ``repeats`` runs (seconds), every run, the last outcome."""
    action()
    times, outcome = [], None
    for _ in range(repeats):
        seconds, outcome = _timed(action)
        times.append(seconds)
    return statistics.median(times), times, outcome


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# -- the warehouse ---------------------------------------------------------------------------


class _Bench:
    """A Spark session, a warehouse folder and a Session on it; closed together."""

    def __init__(self, name: str) -> None:
        from pyspark.sql import SparkSession

        from pipelines import Session

        self.folder = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        existing = SparkSession.getActiveSession()
        seconds, self.spark = _timed(lambda: spark_session("local[2]", app_name="bench-pipelines"))
        self.spark.sparkContext.setLogLevel("ERROR")
        self._own_spark = existing is None
        self.spark_start_s = round(seconds, 1) if self._own_spark else None
        self.session: Session = Session(self.folder / "warehouse", spark=self.spark)
        _progress(f"{name}: Spark ready ({seconds:.1f} s), warehouse {self.folder}")

    def close(self) -> None:
        self.session.close()
        if self._own_spark:  # never stop a session the caller made (tests share theirs)
            self.spark.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def create_table(self, name: str) -> None:
        self.session.sql(f"CREATE TABLE {name} (id INT, v VARCHAR(20))")

    def ingest(self, name: str, rows: int, commits: int = 1) -> None:
        """``rows`` rows (``ID`` = row id, ``V`` its text) in ``commits`` ingest commits,
        as the service's flusher makes them: ids reserved, one Parquet file per commit."""
        info = self.session.require_table(name)
        catalog = self.session.catalog
        writer = TableWriter(info.uri, info.schema)
        arrow_schema = info.schema.to_arrow()
        per_commit = -(-rows // commits)
        left = rows
        while left > 0:
            count = min(per_commit, left)
            first = catalog.reserve_row_ids(info.id, count)
            ids = pa.array(range(first, first + count), pa.int64())
            part = pa.table([ids.cast(arrow_schema.field("ID").type), pc.cast(ids, pa.string())],
                            schema=arrow_schema)  # fmt: skip
            record = writer.commit_flush([part], [], first)
            catalog.apply_commit(info.id, record)
            left -= count

    def files(self, name: str) -> int:
        return len(DeltaTable(self.session.require_table(name).uri).file_uris())

    def version(self, name: str) -> int:
        return DeltaTable(self.session.require_table(name).uri).version()

    def arrow(self, text: str) -> pa.Table:
        return self.session.sql(text).toArrow()

    def events(self, stream: str) -> int:
        """How many change data feed events the stream's range holds (what is read)."""
        from pipelines.streams.changes import change_events

        record = self.session.require_stream(stream)
        info = self.session.catalog.get_table_by_id(record.table_id)
        assert info is not None
        to = DeltaTable(info.uri).version()
        return change_events(info.uri, info.schema, record.offset_version, to).num_rows


@contextlib.contextmanager
def _phases(session: Session) -> Iterator[dict[str, float]]:
    """Seconds spent in the parts of a statement, summed while the block runs.

    Wraps (for the block only) the functions the pipeline layer calls by name; what is
    left (``unattributed``) is parsing, binding and Spark's analysis and planning. The
    parts do not nest: ``spark_create_dataframe`` is the change events (or a DML's
    result row) sent to Spark, ``spark_to_arrow`` a query run into Arrow.
    """
    import pipelines.sql.dml
    import pipelines.streams.changes
    import pipelines.transactions.commit

    spent: dict[str, float] = {}

    def timed(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

        return wrapper

    frame_class = type(session.spark.range(1))  # pyspark's classic DataFrame
    targets: list[tuple[Any, str, str]] = [
        (pipelines.streams.changes, "change_events", "cdf_read_delta_rs"),
        (pipelines.streams.changes, "net_events", "netting_arrow"),
        (pipelines.sql.dml, "check_arrow_batch", "conversion_checks"),
        (pipelines.transactions.commit, "stage_change_set", "stage_parquet"),
        (pipelines.transactions.commit, "commit_staged", "delta_commit"),
        (pipelines.transactions.commit, "check_unchanged", "validate_rows_unchanged"),
        (session.catalog, "reserve_commit", "catalog_reserve_commit"),
        (session.catalog, "decide_commit", "catalog_decide_commit"),
        (session.catalog, "finish_commit", "catalog_finish_commit"),
        (session.catalog, "reserve_row_ids", "catalog_reserve_row_ids"),
        (session, "check_stream_fresh", "stream_staleness_check"),
        (session.spark, "createDataFrame", "spark_create_dataframe"),
        (frame_class, "toArrow", "spark_to_arrow"),
    ]
    with contextlib.ExitStack() as stack:
        for owner, attribute, label in targets:
            original = getattr(owner, attribute)
            stack.enter_context(mock.patch.object(owner, attribute, timed(label, original)))
        started = time.perf_counter()
        yield spent
        total = time.perf_counter() - started
        spent["unattributed"] = total - sum(spent.values())  # parse, bind, Spark planning
        spent["total"] = total
    for label in list(spent):
        spent[label] = _ms(spent[label])  # type: ignore[assignment]


# -- 1. stream read against a full scan -------------------------------------------------------


def _stream_case(
    bench: _Bench, stream: str, scan_s: float, floor_s: float, repeats: int
) -> dict[str, Any]:
    seconds, times, data = _median(lambda: bench.arrow(f"SELECT * FROM {stream}"), repeats)
    with _phases(bench.session) as phases:
        bench.arrow(f"SELECT * FROM {stream}")
    return {
        "stream_rows": data.num_rows,
        "cdf_events": bench.events(stream),
        "stream_read_ms": _ms(seconds),
        "stream_read_ms_runs": [_ms(t) for t in times],
        "share_of_full_scan": round(seconds / scan_s, 4),
        # Both times less what any statement costs (Spark's job, binding): what grows
        # with the data read.
        "share_of_full_scan_above_floor": round((seconds - floor_s) / (scan_s - floor_s), 4),
        "phases_ms_one_read": phases,
    }


def run_stream_read(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    rows = _rows(scale, MILLION, least=1000)
    changed = rows // 100
    repeats = _repeats(scale)
    bench = _Bench("stream-read")
    try:
        bench.create_table("T")
        _progress(f"stream_read_vs_scan: ingesting {rows:,} rows in 10 commits")
        ingest_s, _ = _timed(lambda: bench.ingest("T", rows, commits=10))
        files_before = bench.files("T")
        bench.session.sql("CREATE STREAM S_SCATTERED ON TABLE T")
        _progress(f"stream_read_vs_scan: UPDATE {changed:,} scattered rows (ID % 100 = 0)")
        with _phases(bench.session) as scattered_update:
            result = bench.session.sql("UPDATE T SET v = 'x' WHERE id % 100 = 0").collect()
        assert result[0][0] == changed, result
        # Each stream is read while it holds exactly its own update (1% of the rows); the
        # scan baseline is timed first, on the table after the update.
        _progress("stream_read_vs_scan: full scans (baseline)")
        scan_s, scan_times, scanned = _median(lambda: bench.arrow("SELECT * FROM T"), repeats)
        assert scanned.num_rows == rows, scanned.num_rows
        floor_s, _, _ = _median(lambda: bench.arrow("SELECT 1 AS one"), repeats)
        _progress("stream_read_vs_scan: reading the stream of the scattered update")
        scattered = _stream_case(bench, "S_SCATTERED", scan_s, floor_s, repeats)
        assert scattered["stream_rows"] == 2 * changed, scattered["stream_rows"]
        bench.session.sql("CREATE STREAM S_CONTIGUOUS ON TABLE T")
        _progress(f"stream_read_vs_scan: UPDATE {changed:,} contiguous rows (ID < {changed})")
        with _phases(bench.session) as contiguous_update:
            result = bench.session.sql(f"UPDATE T SET v = 'y' WHERE id < {changed}").collect()
        assert result[0][0] == changed, result
        _progress("stream_read_vs_scan: reading the stream of the contiguous update")
        contiguous = _stream_case(bench, "S_CONTIGUOUS", scan_s, floor_s, repeats)
        assert contiguous["stream_rows"] == 2 * changed, contiguous["stream_rows"]
        with _phases(bench.session) as scan_phases:
            bench.arrow("SELECT * FROM T")
        share = max(scattered["share_of_full_scan"], contiguous["share_of_full_scan"])
        return {
            "benchmark": "pipelines_stream_read_vs_scan",
            "scale": scale,
            "cpus": os.cpu_count(),
            "spark_master": "local[2]",
            "table_rows": rows,
            "rows_updated": changed,
            "table_files_ingested": files_before,
            "table_files_after_updates": bench.files("T"),
            "ingest_s": round(ingest_s, 2),
            "update_scattered_phases_ms_once_cold": scattered_update,
            "update_contiguous_phases_ms_once": contiguous_update,
            "baseline_full_scan_ms": _ms(scan_s),
            "baseline_statement_floor_ms": _ms(floor_s),
            "baseline_full_scan_ms_runs": [_ms(t) for t in scan_times],
            "baseline_phases_ms_one_scan": scan_phases,
            "scattered_update": scattered,
            "contiguous_update": contiguous,
            "spark_session_start_s": bench.spark_start_s,
            "targets": {
                "stream_read_share_of_scan_max": STREAM_READ_SHARE_MAX,
                "met": {
                    "scattered": scattered["share_of_full_scan"] <= STREAM_READ_SHARE_MAX,
                    "contiguous": contiguous["share_of_full_scan"] <= STREAM_READ_SHARE_MAX,
                    "both": share <= STREAM_READ_SHARE_MAX,
                },
            },
        }
    finally:
        bench.close()


# -- 2. append-only stream read as the table grows --------------------------------------------


def run_append_only_growth(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    commits = 100 if scale >= 1 else 5 if _smoke(scale) else 25
    repeats = _repeats(scale)
    commit_rows = _rows(scale, 1000, least=100)
    bench = _Bench("append-only")
    try:
        sizes: dict[str, Any] = {}
        for millions, ingest_commits in ((1, 10), (4, 40)):
            rows = _rows(scale, millions * MILLION, least=1000)
            name = f"T{millions}M"
            bench.create_table(name)
            _progress(f"append_only_growth: {name}: {rows:,} rows in {ingest_commits} commits")
            bench.ingest(name, rows, commits=ingest_commits)
            bench.session.sql(f"CREATE STREAM S{millions}M ON TABLE {name} APPEND_ONLY = TRUE")
            _progress(f"append_only_growth: {name}: {commits} commits of {commit_rows:,} rows")
            started = time.perf_counter()
            for _ in range(commits):
                bench.ingest(name, commit_rows)
            appends_s = time.perf_counter() - started
            _progress(f"append_only_growth: {name}: reading the stream")
            read_stream, scan = f"SELECT * FROM S{millions}M", f"SELECT * FROM {name}"
            seconds, times, data = _median(functools.partial(bench.arrow, read_stream), repeats)
            assert data.num_rows == commits * commit_rows, data.num_rows
            with _phases(bench.session) as phases:
                bench.arrow(read_stream)
            scan_s, _ = _timed(functools.partial(bench.arrow, scan))
            sizes[f"{millions}m"] = {
                "table_rows": rows + commits * commit_rows,
                "table_versions": bench.version(name) + 1,
                "table_files": bench.files(name),
                "stream_rows": data.num_rows,
                "stream_read_ms": _ms(seconds),
                "stream_read_ms_runs": [_ms(t) for t in times],
                "phases_ms_one_read": phases,
                "append_commits_s": round(appends_s, 2),
                "full_scan_ms_once_informational": _ms(scan_s),
            }
        small, large = sizes["1m"]["stream_read_ms"], sizes["4m"]["stream_read_ms"]
        ratio = round(large / small, 2)
        return {
            "benchmark": "pipelines_append_only_growth",
            "scale": scale,
            "cpus": os.cpu_count(),
            "spark_master": "local[2]",
            "commits_after_stream": commits,
            "rows_per_commit": commit_rows,
            "baseline_at_1m": sizes["1m"],
            "at_4m": sizes["4m"],
            "ratio_4m_vs_1m": ratio,
            "spark_session_start_s": bench.spark_start_s,
            "targets": {"ratio_max": GROWTH_RATIO_MAX, "met": ratio <= GROWTH_RATIO_MAX},
        }
    finally:
        bench.close()


# -- 3. consuming a stream with INSERT ... SELECT ---------------------------------------------


def run_consuming_insert(scale: float | None = None) -> dict[str, Any]:
    scale = default_scale() if scale is None else scale
    changes = _rows(scale, 10_000, least=100)
    base_rows = _rows(scale, MILLION, least=1000)
    repeats = _repeats(scale)
    bench = _Bench("consuming-insert")
    session = bench.session
    try:
        for name in ("SRC", "DST", "PLAIN", "DST_PLAIN"):
            bench.create_table(name)
        _progress(f"consuming_insert: source table of {base_rows:,} rows, then a stream")
        bench.ingest("SRC", base_rows, commits=10)
        session.sql("CREATE STREAM CS ON TABLE SRC")
        bench.ingest("PLAIN", changes)
        consume = "INSERT INTO DST SELECT id, v FROM CS"
        plain = "INSERT INTO DST_PLAIN SELECT id, v FROM PLAIN"

        def one_round() -> float:
            bench.ingest("SRC", changes)  # the stream now holds `changes` inserted rows
            seconds, result = _timed(lambda: session.sql(consume))
            inserted = result.collect()[0][0]
            assert inserted == changes, inserted
            return seconds

        _progress(f"consuming_insert: {repeats} + 1 rounds of {changes:,} changes")
        one_round()  # warm-up
        times = [one_round() for _ in range(repeats)]
        bench.ingest("SRC", changes)
        with _phases(session) as phases:
            session.sql(consume)
        stream = session.require_stream("CS")
        assert stream.offset_version == bench.version("SRC"), "the stream did not move"
        assert len(bench.arrow("SELECT * FROM CS")) == 0
        consumed_rows = bench.arrow("SELECT id FROM DST").num_rows
        assert consumed_rows == (repeats + 2) * changes, consumed_rows
        _progress("consuming_insert: baseline, the same INSERT from a plain table")
        plain_s, plain_times, _ = _median(lambda: session.sql(plain), repeats)
        with _phases(session) as plain_phases:
            session.sql(plain)
        seconds = statistics.median(times)
        return {
            "benchmark": "pipelines_consuming_insert",
            "scale": scale,
            "cpus": os.cpu_count(),
            "spark_master": "local[2]",
            "source_table_rows": base_rows,
            "changes_per_round": changes,
            "statement": consume,
            "consuming_insert_s": round(seconds, 3),
            "consuming_insert_s_runs": [round(t, 3) for t in times],
            "phases_ms_one_round": phases,
            "baseline_plain_insert_s": round(plain_s, 3),
            "baseline_plain_insert_s_runs": [round(t, 3) for t in plain_times],
            "baseline_phases_ms_one_insert": plain_phases,
            "ratio_vs_plain_insert": round(seconds / plain_s, 2),
            "spark_session_start_s": bench.spark_start_s,
            "targets": {
                "consuming_insert_max_s": CONSUMING_INSERT_MAX_S,
                "met": seconds < CONSUMING_INSERT_MAX_S,
            },
        }
    finally:
        bench.close()


#: The plan guard may add at most this share of the statement floor (SELECT 1 through a
#: session, measured in the same run) to every statement.
GUARD_MAX_SHARE_OF_FLOOR = 0.10
GUARD_RUNS, GUARD_WARM_UP = 40, 10  # interleaved pairs, and the first ones left out
SMOKE_GUARD_RUNS, SMOKE_GUARD_WARM_UP = 3, 1


def run_plan_guard(scale: float | None = None) -> dict[str, Any]:
    """What the SQL boundary costs a statement: Spark's parse and analysis of a query over
    one of the binder's views, through the guard (two plans walked as JSON) and through
    plain ``spark.sql`` (what statements paid before the guard), interleaved; the
    difference against the statement floor (``SELECT 1`` through a session). 40 pairs,
    the first 10 left out as warm-up (a smoke run: 3, the first left out)."""
    from pipelines.sql.plan_guard import guarded_frame

    scale = default_scale() if scale is None else scale
    runs, warm_up = (SMOKE_GUARD_RUNS, SMOKE_GUARD_WARM_UP) if _smoke(scale) else (
        GUARD_RUNS, GUARD_WARM_UP)  # fmt: skip
    bench = _Bench("plan-guard")
    try:
        bench.create_table("G")
        bench.ingest("G", _rows(scale, 100_000, least=1000), commits=10)
        query = ("SELECT v, count(*) AS n, max(id) AS top FROM G WHERE id > 10 GROUP BY v "
                 "ORDER BY n DESC LIMIT 5")  # fmt: skip
        bench.session.sql(query)  # binds G to a view, as every statement does
        view = bench.session.views[-1]
        bound = query.replace("FROM G", f"FROM {view} AS G")
        guarded_runs, plain_runs = [], []
        for _ in range(runs):  # interleaved, so both see the same machine and JIT state
            guarded_runs.append(_timed(lambda: guarded_frame(bench.spark, bound, [view]).schema)[0])
            plain_runs.append(_timed(lambda: bench.spark.sql(bound).schema)[0])
        guarded_runs, plain_runs = guarded_runs[warm_up:], plain_runs[warm_up:]
        guarded_s, plain_s = statistics.median(guarded_runs), statistics.median(plain_runs)
        floor_s, _, _ = _median(lambda: bench.arrow("SELECT 1 AS one"), _repeats(scale))
        overhead_s = guarded_s - plain_s
        return {
            "benchmark": "pipelines_plan_guard",
            "scale": scale,
            "cpus": os.cpu_count(),
            "statement": query,
            "guarded_compile_ms": _ms(guarded_s),
            "guarded_compile_ms_runs": [_ms(t) for t in guarded_runs],
            "baseline_spark_sql_compile_ms": _ms(plain_s),
            "baseline_spark_sql_compile_ms_runs": [_ms(t) for t in plain_runs],
            "guard_overhead_ms": _ms(overhead_s),
            "baseline_statement_floor_ms": _ms(floor_s),
            "overhead_share_of_floor": round(overhead_s / floor_s, 3),
            "targets": {
                "max_share_of_floor": GUARD_MAX_SHARE_OF_FLOOR,
                "met": overhead_s <= GUARD_MAX_SHARE_OF_FLOOR * floor_s,
            },
        }
    finally:
        bench.close()


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "plan_guard": run_plan_guard,
    "stream_read_vs_scan": run_stream_read,
    "append_only_growth": run_append_only_growth,
    "consuming_insert": run_consuming_insert,
}


def cli(prog: str, doc: str | None, benchmarks: dict[str, Callable[..., dict[str, Any]]]) -> None:
    """``python -m <prog> [names] [--scale S]``: run benchmarks, print each one's JSON."""
    import argparse

    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help=f"any of {', '.join(benchmarks)} (default: all)")
    parser.add_argument("--scale", type=float, default=None, help="sizes x SCALE (default 1)")
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in benchmarks]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}")
    for name in args.names or list(benchmarks):
        print(orjson.dumps(benchmarks[name](args.scale)).decode(), flush=True)


def main() -> None:
    cli("python -m bench.pipelines", __doc__, BENCHMARKS)


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
