"""INTERSECT ALL and EXCEPT ALL refreshed by the query-delta engine: Spark plans them as
a count per distinct row (an aggregation over a union of both sides) and
``replicaterows``, which repeats each row as many times as its count says. Every refresh
after the first is INCREMENTAL and leaves the table equal to its query run fresh (as a
multiset): counts going up, down, to zero and back, NULLs (equal to each other in a set
operation), a side emptied, and the operators under a join and over an aggregate."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.pipelines.dynamic_tables.batched import assert_every_step_refreshes_incrementally
from tests.pipelines.dynamic_tables.checks import (
    bag,
    engine_warehouse,
    row_ids,
)

SOURCES = [
    "CREATE TABLE L (ID NUMBER, K VARCHAR, V NUMBER)",
    "CREATE TABLE R (ID NUMBER, K VARCHAR, V NUMBER)",
    "INSERT INTO L VALUES (1, 'a', 1), (2, 'a', 1), (3, 'a', 1), (4, 'b', 2), "
    "(5, NULL, NULL), (6, NULL, NULL), (7, 'c', 3)",
    "INSERT INTO R VALUES (1, 'a', 1), (2, 'a', 1), (3, NULL, NULL), (4, 'd', 4)",
]
#: Each step is followed by a refresh. (Cut for time from 6 steps: the counts going up
#: and down share a step, as do the side emptied and the rows coming back on the other.)
STEPS: list[str | list[str]] = [
    # R's counts up: a above L's (0 to 3 in R EXCEPT ALL L), b new, NULL up from 1 to 2
    # in the intersection; a's count in L from 3 to 1 (down in the intersection)
    ["INSERT INTO R VALUES (5, 'a', 1), (6, 'a', 1), (7, 'b', 2), (15, NULL, NULL)",
     "DELETE FROM L WHERE ID IN (1, 2)"],
    ["UPDATE R SET K = 'c', V = 3 WHERE ID = 4",  # d leaves, c comes
     "UPDATE L SET V = 9 WHERE ID = 3"],  # L's last a leaves: a gone from the intersection
    ["INSERT INTO L VALUES (8, 'a', 1), (9, 'a', 1), (10, NULL, NULL)",  # a back in L
     "DELETE FROM R"],  # one side emptied
    # a back in the intersection
    "INSERT INTO R VALUES (11, 'a', 1), (12, 'a', 1), (13, 'a', 1), (14, NULL, NULL)",
]
QUERIES = {
    "intersect_all": "SELECT K, V FROM L INTERSECT ALL SELECT K, V FROM R",
    "except_all": "SELECT K, V FROM L EXCEPT ALL SELECT K, V FROM R",
    "except_all_other_way": "SELECT K, V FROM R EXCEPT ALL SELECT K, V FROM L",
    "intersect_all_joined": ("SELECT i.K, i.V, L.ID FROM (SELECT K, V FROM L INTERSECT ALL "
                             "SELECT K, V FROM R) i JOIN L ON i.K = L.K"),
    "counted": ("SELECT K, count(*) AS N FROM (SELECT K, V FROM L EXCEPT ALL "
                "SELECT K, V FROM R) GROUP BY K"),
    "of_aggregates": ("SELECT K, count(*) AS N FROM L GROUP BY K INTERSECT ALL "
                      "SELECT K, count(*) AS N FROM R GROUP BY K"),
}


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = engine_warehouse(tmp_path_factory.mktemp("bag_sets"), spark, SOURCES, QUERIES)
    yield session
    session.close()


def test_every_refresh_is_incremental_and_exact(wh):
    assert_every_step_refreshes_incrementally(wh, STEPS, QUERIES)


def test_a_lowered_count_deletes_the_last_copies_and_keeps_the_others(wh):
    """A count going from 3 to 2 deletes one row: the copies' ids are the group's id and
    their position, so the copies that stay keep theirs."""
    wh.sql("CREATE TABLE S (K VARCHAR)")
    wh.sql("INSERT INTO S VALUES ('x'), ('x'), ('x')")
    wh.sql("CREATE DYNAMIC TABLE SX TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL AS "
           "SELECT K FROM S EXCEPT ALL SELECT 'y'")
    uri = wh.require_table("SX").uri
    ids = set(row_ids(uri))
    assert len(ids) == 3
    wh.sql("DELETE FROM S WHERE K = 'x'")
    wh.sql("INSERT INTO S VALUES ('x'), ('x')")
    status = wh.sql("ALTER DYNAMIC TABLE SX REFRESH").collect()[0].status
    assert "INCREMENTAL" in status
    kept = set(row_ids(uri))
    assert len(kept) == 2 and kept < ids


def test_a_stream_on_an_intersect_all_view_is_the_difference_of_its_snapshots(wh):
    wh.sql("CREATE TABLE P (K VARCHAR)")
    wh.sql("CREATE TABLE Q (K VARCHAR)")
    wh.sql("INSERT INTO P VALUES ('x'), ('x'), ('x'), ('y'), (NULL)")
    wh.sql("INSERT INTO Q VALUES ('x'), ('x'), ('y'), ('y'), (NULL)")
    wh.sql("CREATE VIEW PQ AS SELECT K FROM P INTERSECT ALL SELECT K FROM Q")
    wh.sql("CREATE STREAM SPQ ON VIEW PQ")
    before = bag(wh, "SELECT K FROM PQ")
    wh.sql("DELETE FROM Q WHERE K = 'y'")  # y: 1 copy to none
    wh.sql("INSERT INTO Q VALUES ('x'), ('x'), (NULL)")  # x: 2 copies to 3; NULL stays 1
    after = bag(wh, "SELECT K FROM PQ")
    seen = bag(wh, 'SELECT K, "METADATA$ACTION" FROM SPQ')
    expected = Counter({(*row, "INSERT"): n for row, n in (after - before).items()})
    expected.update({(*row, "DELETE"): n for row, n in (before - after).items()})
    assert seen == expected and expected  # x inserted once, y deleted once
