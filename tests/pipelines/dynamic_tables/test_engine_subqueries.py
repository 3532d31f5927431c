"""Uncorrelated scalar subqueries (``WHERE x > (SELECT avg(x) FROM t)``; in projections,
filters, join conditions and grouped aggregates) refreshed by the query-delta engine: every refresh after the first is INCREMENTAL and leaves the table
equal to its query run fresh (as a multiset), whether a change moves the subquery's
value or not; where the value holds, the operator's input is read for its change only.
"""

from __future__ import annotations

import pytest

from pipelines import SqlError
from tests.pipelines.dynamic_tables.batched import assert_every_step_refreshes_incrementally
from tests.pipelines.dynamic_tables.checks import (
    assert_same_as_query,
    bag,
    create_incremental,
    engine_warehouse,
    record_engine_refreshes,
    scanned,
)

SOURCES = [
    "CREATE TABLE A (ID NUMBER, K NUMBER, V DOUBLE, S VARCHAR, D DATE)",
    "CREATE TABLE B (K NUMBER, W NUMBER)",
    "CREATE VIEW BV AS SELECT K, W * 2 AS W2 FROM B WHERE W IS NOT NULL",
    """INSERT INTO A VALUES (1, 1, 1.0, 'a', DATE'2020-01-01'), (2, 1, 5.0, 'b', NULL),
       (3, 2, 9.0, NULL, DATE'1999-12-31'), (4, 2, NULL, 'c', DATE'2024-02-29'),
       (5, NULL, -0.0, 'd', DATE'2020-01-01')""",
    "INSERT INTO B VALUES (1, 10), (2, 20), (NULL, 5)",
]
#: Each step is followed by a refresh of every table. (Cut for time from 5 steps, then 4:
#: the NaN of A shares a step with the change of B that keeps every value over B, and the
#: inserts that move the values over A and over B are one step.)
STEPS: list[str | list[str]] = [
    ["INSERT INTO A VALUES (6, 1, 100.0, 'e', DATE'2021-06-01')",  # moves avg and sum
     "INSERT INTO B VALUES (3, 1)"],  # moves max(K), min(W) and count(*), keeps max(W)
    ["UPDATE B SET W = W + 1 WHERE K = 1",  # every subquery over B keeps its value
     "UPDATE A SET V = 'NaN' WHERE ID = 2"],  # a NaN average
    "DELETE FROM B",  # no row: every subquery over B is NULL (count(*) is 0)
]

QUERIES = {
    "filter": "SELECT ID, V FROM A WHERE V > (SELECT avg(V) FROM A)",
    "share": ("SELECT ID, V / (SELECT sum(V) FROM A) AS SHARE, CASE WHEN K = "
              "(SELECT min(K) FROM B) THEN 'low' ELSE 'other' END AS L FROM A"),
    "merged": ("SELECT ID, (SELECT max(W) FROM B) AS MW, (SELECT count(*) FROM B) AS N "
               "FROM A WHERE K = (SELECT max(K) FROM B)"),
    "having": ("SELECT K, count(*) AS N, sum(V) AS S FROM A WHERE V <= (SELECT max(V) FROM A) "
               "GROUP BY K HAVING sum(V) > (SELECT avg(V) FROM A)"),
    "nested": ("SELECT ID FROM A WHERE V >= (SELECT avg(V) FROM A WHERE K < "
               "(SELECT max(K) FROM B))"),
    "in_join_input": ("SELECT A.ID, B.W FROM A JOIN B ON A.K = B.K "
                      "WHERE B.W < (SELECT max(W2) FROM BV) AND A.V + B.W > (SELECT avg(V) FROM A)"),
    "left_join_condition": ("SELECT A.ID, B.W FROM A LEFT JOIN B ON A.K = B.K "
                            "AND B.W > (SELECT min(W) FROM B) + A.V"),
    "aggregate": ("SELECT K, sum(V) / (SELECT sum(V) FROM A) AS SHARE, "
                  "count(*) * (SELECT count(*) FROM B) AS N FROM A GROUP BY K"),
    "strings_and_dates": ("SELECT ID, S FROM A WHERE S > (SELECT min(S) FROM A) "
                          "AND D >= (SELECT min(D) FROM A WHERE D > DATE'2000-01-01')"),
    "key": "SELECT K > (SELECT avg(K) FROM B) AS HIGH, count(*) AS N FROM A GROUP BY 1",
}


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = engine_warehouse(tmp_path_factory.mktemp("subqueries"), spark, SOURCES,
                               {f"Q_{name}": query for name, query in QUERIES.items()})
    yield session
    session.close()


def test_every_refresh_is_incremental_and_exact(wh):
    assert_every_step_refreshes_incrementally(
        wh, STEPS, {f"Q_{name}": query for name, query in QUERIES.items()}, no_data=True)


def test_a_value_that_holds_reads_only_the_change(wh, monkeypatch):
    """A change to the subquery's source that leaves its value as it was refreshes the
    filter row-wise: the filtered table, which did not change, is not read; a change that
    moves the value reads it whole (every row may now pass or fail)."""
    wh.sql("CREATE TABLE P (ID NUMBER, K NUMBER)")
    wh.sql("CREATE TABLE Q (K NUMBER)")
    wh.sql("INSERT INTO P VALUES (1, 1), (2, 2), (3, 3)")
    wh.sql("INSERT INTO Q VALUES (2)")
    query = "SELECT ID FROM P WHERE K <= (SELECT max(K) FROM Q)"
    create_incremental(wh, {"Q_READS": query})
    seen = record_engine_refreshes(monkeypatch)
    wh.sql("INSERT INTO Q VALUES (1)")  # max(K) stays 2
    wh.sql("ALTER DYNAMIC TABLE Q_READS REFRESH")
    assert not scanned(wh, seen[-1], "P")
    assert_same_as_query(wh, "Q_READS", query)
    wh.sql("INSERT INTO Q VALUES (3)")  # max(K) moves to 3: row 3 passes now
    wh.sql("ALTER DYNAMIC TABLE Q_READS REFRESH")
    assert scanned(wh, seen[-1], "P")
    assert bag(wh, "SELECT ID FROM Q_READS") == bag(wh, "SELECT ID FROM P")


@pytest.mark.parametrize("query", [
    "SELECT sum(V) * (SELECT max(W) FROM B) AS X FROM A",  # a row even without input
])  # fmt: skip
def test_a_subquery_beside_a_global_aggregate_is_refused_by_name(wh, query):
    with pytest.raises(SqlError) as refused:
        wh.sql(f"CREATE DYNAMIC TABLE Q_REFUSED TARGET_LAG = '1 hour' "
               f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    assert refused.value.code == "DYNAMIC_TABLE_NOT_INCREMENTAL"
    assert "SUBQUERY_EXPRESSION" in str(refused.value)
