"""Attacks on reading only the source files a change can meet
(:mod:`pipelines.incremental.pruning`), with pruning forced on (``PRUNE_FROM_BYTES = 0``)
over sources of several files, one commit each: NULL keys of a GROUP BY or a window
(NULL matches NULL there, and a file's bounds leave NULLs out); keys that move from one
file's range to another's; keys at a file's
bounds of DECIMAL(10,2), BIGINT near 2^63, DECIMAL(38,0) past 2^63 (whose files a SQL
update rewrote: delta-rs' merge writes their bounds as 2^63 - 1) and DATE; a compaction
between refreshes; a stream on a view. Every refresh must stay INCREMENTAL and equal to
its query run fresh."""

from __future__ import annotations

from decimal import Decimal

import pytest

from flush.compaction import compact_table
from pipelines.incremental import pruning
from tests.pipelines.dynamic_tables.checks import assert_same_as_query, bag, pruning_warehouse

BIG = 2**60
HUGE = 10**30


def _ins(table: str, rows: list[str]) -> str:
    return f"INSERT INTO {table} VALUES " + ", ".join(rows)


SOURCES = [
    "CREATE TABLE T (ID BIGINT, K INT, V INT)",
    "CREATE TABLE D (ID INT, K DECIMAL(10,2))",
    "CREATE TABLE E (K DECIMAL(10,2), W VARCHAR)",
    "CREATE TABLE B (ID INT, K BIGINT)",
    "CREATE TABLE B2 (K BIGINT, W VARCHAR)",
    "CREATE TABLE H (ID INT, K DECIMAL(38,0))",
    "CREATE TABLE H2 (K DECIMAL(38,0), W VARCHAR)",
    "CREATE TABLE DT (ID INT, D DATE)",
    "CREATE TABLE DT2 (D DATE, W VARCHAR)",
    # T: keys -10..-6, 0..9, 10..19 (two rows each), and a file of a NULL key among 100, 101
    *[_ins("T", [f"({low * 10 + i}, {low + i // 2}, {i})" for i in range(20)])
      for low in (-10, 0, 10)],
    _ins("T", ["(900, 100, 1)", "(901, NULL, 2)", "(902, 101, 3)"]),
    _ins("D", ["(1, -5.00)", "(2, -0.01)"]),
    _ins("D", ["(3, 0.00)", "(4, 9.99)", "(5, 5.55)"]),
    _ins("D", ["(6, 10.00)", "(7, 99999999.99)"]),
    _ins("E", ["(-0.01, 'a')", "(0.00, 'b')"]),
    _ins("E", ["(9.99, 'c')", "(10.00, 'd')"]),
    _ins("B", [f"({i}, {BIG + i})" for i in range(3)]),
    _ins("B", [f"({i}, {-BIG - i})" for i in range(3, 6)]),
    _ins("B", [f"({i}, {2**63 - 1 - i})" for i in range(6, 8)]),
    _ins("B2", [f"({BIG + 1}, 'p')", f"({-BIG - 4}, 'q')"]),
    _ins("B2", [f"({2**63 - 2}, 'r')"]),
    _ins("H", [f"({i}, {HUGE + i})" for i in range(3)]),
    _ins("H", [f"({i}, {HUGE + 1000 + i})" for i in range(3, 6)]),
    _ins("H", [f"({i}, {-HUGE - i})" for i in range(6, 9)]),
    _ins("H2", [f"({HUGE + 1}, 'x')"]),
    _ins("H2", [f"({HUGE + 2000}, 'y')"]),
    _ins("DT", ["(1, DATE '1969-12-31')", "(2, DATE '1970-01-01')"]),
    _ins("DT", ["(3, DATE '2024-02-29')", "(4, DATE '2024-03-01')"]),
    _ins("DT2", ["(DATE '1970-01-01', 'e')"]),
    _ins("DT2", ["(DATE '2024-03-01', 'f')"]),
]
QUERIES = {
    # NULL is a group: its rows in a file of other keys are read too
    "null_group": "SELECT K, sum(CAST(V AS DOUBLE)) AS S, count(*) AS N FROM T GROUP BY K",
    "null_window": "SELECT ID, K, row_number() OVER (PARTITION BY K ORDER BY V, ID) AS RN FROM T",
    "types": "SELECT D.ID, E.W FROM D JOIN E ON D.K = E.K"
             " UNION ALL SELECT B.ID, B2.W FROM B JOIN B2 ON B.K = B2.K"
             " UNION ALL SELECT H.ID, H2.W FROM H JOIN H2 ON H.K = H2.K"
             " UNION ALL SELECT DT.ID, DT2.W FROM DT JOIN DT2 ON DT.D = DT2.D",
}


def _compact_t(session) -> None:
    """T compacted into one file, then a file of new keys (two files: prunable again)."""
    assert compact_table(session.spark, session.require_table("T").uri).status == "SUCCEEDED"
    session.sql("INSERT INTO T VALUES (950, 50, 4), (951, 51, 5)")


STEPS = [
    # a NULL key alone (no other key touched); new keys at the other sides' file bounds
    ["INSERT INTO T VALUES (903, NULL, 7)", "INSERT INTO D VALUES (8, 9.99)",
     f"INSERT INTO B2 VALUES ({2**63 - 1}, 'm')", f"INSERT INTO H2 VALUES ({HUGE + 1002}, 'z')",
     "INSERT INTO DT2 VALUES (DATE '1969-12-31', 'g')", "INSERT INTO E VALUES (99999999.99, 'e')"],
    # keys move from one file's range to another's
    ["UPDATE T SET K = 15 WHERE ID = -97",
     "UPDATE D SET K = 0.00 WHERE ID = 7", f"UPDATE B SET K = {BIG + 1} WHERE ID = 7",
     f"UPDATE H SET K = {HUGE + 2} WHERE ID = 4", f"UPDATE H SET K = {-HUGE} WHERE ID = 8",
     "UPDATE DT SET D = DATE '2024-03-01' WHERE ID = 1"],
    # H's keys past 2^63 that the update rewrote: the merge's bounds of their file are
    # 2^63 - 1 (and -2^63 for those below -2^63)
    [_compact_t, "UPDATE T SET V = V + 1 WHERE K IS NULL OR K = 1",
     "DELETE FROM T WHERE K BETWEEN -10 AND -8",
     f"INSERT INTO H2 VALUES ({HUGE + 1003}, 'k'), ({-HUGE - 7}, 'n')"],
]


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    yield from pruning_warehouse(tmp_path_factory.mktemp("pruning_attack"), spark, SOURCES,
                                 {f"PA_{name}": query for name, query in QUERIES.items()})  # fmt: skip


def test_every_refresh_is_incremental_and_exact(wh):
    for name, query in QUERIES.items():
        assert_same_as_query(wh, f"PA_{name}", query)
    for step in STEPS:
        for statement in step:
            statement(wh) if callable(statement) else wh.sql(statement)
        for name, query in QUERIES.items():
            status = wh.sql(f"ALTER DYNAMIC TABLE PA_{name} REFRESH").collect()[0].status
            assert "INCREMENTAL" in status or "NO_DATA" in status, (name, step, status)
            assert_same_as_query(wh, f"PA_{name}", query)


def test_a_stream_on_a_view_is_the_difference_of_its_snapshots(wh):
    """A stream on a view runs the same engine (and the same pruning): a NULL key alone
    (its group's other rows in a file of other keys), then a key set to NULL."""
    views = {"VN": "SELECT K, sum(CAST(V AS DOUBLE)) AS S, count(*) AS N FROM T GROUP BY K"}
    wh.sql("CREATE TABLE SINK (K NUMBER)")
    for name, query in views.items():
        wh.sql(f"CREATE VIEW {name} AS {query}")
        wh.sql(f"CREATE STREAM {name}_S ON VIEW {name}")
    for step in ["INSERT INTO T VALUES (904, NULL, 9)",
                 "UPDATE T SET K = NULL WHERE ID = 951"]:
        before = {name: bag(wh, f"SELECT * FROM {name}") for name in views}
        for statement in step.split("; "):
            wh.sql(statement)
        for name in views:
            after = bag(wh, f"SELECT * FROM {name}")
            columns = ", ".join(wh.sql(f"SELECT * FROM {name}").columns)
            changed = f"SELECT {columns} FROM {name}_S WHERE METADATA$ACTION = "
            inserted, deleted = bag(wh, changed + "'INSERT'"), bag(wh, changed + "'DELETE'")
            assert before[name] + inserted == after + deleted, (name, step)
            wh.sql(f"INSERT INTO SINK SELECT K FROM {name}_S")  # consumes the stream


def test_a_file_holding_a_null_is_kept_for_a_null_key():
    """The bounds of a file leave NULLs out: with ``nulls`` (a GROUP BY's NULL key), a
    file whose null count is not 0 (or unknown) is kept whatever its bounds."""
    files = [
        {"path": "a", "min.K": Decimal(1), "max.K": Decimal(5), "null_count.K": 0},
        {"path": "b", "min.K": Decimal(7), "max.K": Decimal(9), "null_count.K": 2},
        {"path": "c", "min.K": Decimal(7), "max.K": Decimal(9)},
        {"path": "d", "min.K": Decimal(7), "max.K": Decimal(9), "null_count.K": 0},
    ]
    assert [f["path"] for f in pruning.kept_files(files, "K", [])] == []
    assert [f["path"] for f in pruning.kept_files(files, "K", [], nulls=True)] == ["b", "c"]
    assert [f["path"] for f in pruning.kept_files(files, "K", [Decimal(3)], nulls=True)] == [
        "a", "b", "c"]  # fmt: skip


def test_an_integral_decimal_bound_at_a_64_bit_limit_bounds_nothing_past_it():
    """delta-rs' merge writes a DECIMAL(38,0) bound past 2^63 as 2^63 - 1 (and below
    -2^63 as -2^63): such a bound is no bound on its side."""
    huge = Decimal(10**30)
    files = [
        {"path": "up", "min.K": Decimal(2**63 - 1), "max.K": Decimal(2**63 - 1)},
        {"path": "down", "min.K": Decimal(-(2**63)), "max.K": Decimal(-(2**63))},
        {"path": "small", "min.K": Decimal(1), "max.K": Decimal(5)},
    ]
    assert [f["path"] for f in pruning.kept_files(files, "K", [huge])] == ["up"]
    assert [f["path"] for f in pruning.kept_files(files, "K", [-huge])] == ["down"]
    assert [f["path"] for f in pruning.kept_files(files, "K", [Decimal(3)])] == ["small"]
