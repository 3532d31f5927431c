"""``EXISTS`` and ``IN (SELECT ...)`` where Spark plans an existence join (inside an
``OR``, in a select list: a ``Join`` of type ``ExistenceJoin(exists#n)`` that marks
each left row) and uncorrelated ``EXISTS`` (a scalar subquery under ``LIMIT 1``),
refreshed by the query-delta engine (pipelines/incremental/existence.py): every refresh
after the first is INCREMENTAL and leaves the table equal to its query run fresh by
Spark (as a multiset), NULL keys on both sides, ``NOT IN``'s NULL rule and non-equi
conditions included.
"""

from __future__ import annotations

import pytest

from pipelines import SqlError
from tests.pipelines.dynamic_tables.batched import assert_every_step_refreshes_incrementally
from tests.pipelines.dynamic_tables.checks import engine_warehouse, refresh_modes

SOURCES = [
    "CREATE TABLE T (ID NUMBER, K NUMBER, V NUMBER)",
    "CREATE TABLE S (K NUMBER, W NUMBER)",
    "INSERT INTO T VALUES (1, 1, 5), (2, 2, 20), (3, NULL, 1), (4, 3, NULL), (5, 4, 7)",
    "INSERT INTO S VALUES (1, 1), (3, 9), (4, 2)",
]

#: Each definition a branch of a UNION ALL (its name first), so that one refresh of a
#: few tables checks them all (each branch is an existence join of its own).
FILTERS = {
    "exists_or": "SELECT ID FROM T WHERE V > 10 OR EXISTS (SELECT 1 FROM S WHERE S.K = T.K)",
    "in_or": "SELECT ID FROM T WHERE T.K IN (SELECT K FROM S) OR T.V IS NULL",
    "not_in_or": "SELECT ID FROM T WHERE T.K NOT IN (SELECT K FROM S) OR T.V > 10",
    "not_exists_or": ("SELECT ID FROM T WHERE NOT EXISTS (SELECT 1 FROM S WHERE S.K = T.K) "
                      "OR T.V > 10"),
    "non_equi": ("SELECT ID FROM T WHERE T.V > 10 OR EXISTS "
                 "(SELECT 1 FROM S WHERE S.K = T.K AND S.W < T.V)"),
    "not_exists_non_equi": ("SELECT ID FROM T WHERE NOT EXISTS "
                            "(SELECT 1 FROM S WHERE S.K = T.K AND S.W < T.V) OR T.K IS NULL"),
    "uncorrelated_or": "SELECT ID FROM T WHERE V > 10 OR EXISTS (SELECT 1 FROM S WHERE W > 5)",
    "same_table": ("SELECT ID FROM T WHERE V IS NULL OR EXISTS "
                   "(SELECT 1 FROM T T2 WHERE T2.K = T.K AND T2.ID <> T.ID)"),
}
MARKS = {
    "in": "SELECT ID, T.K IN (SELECT K FROM S) AS E FROM T",
    "not_in": "SELECT ID, T.K NOT IN (SELECT K FROM S WHERE W > 1) AS E FROM T",
    "exists": "SELECT ID, EXISTS (SELECT 1 FROM S) AS E FROM T",
}


def _branches(queries: dict[str, str]) -> str:
    return " UNION ALL ".join(f"SELECT '{name}' AS Q, * FROM ({query})"
                              for name, query in queries.items())  # fmt: skip


QUERIES = {
    "Q_FILTERS": _branches(FILTERS),
    "Q_MARKS": _branches(MARKS),
    "Q_GROUPED": ("SELECT T.K IN (SELECT K FROM S) OR V > 10 AS HIT, count(*) AS N "
                  "FROM T GROUP BY 1"),
}

#: Each step (its statements one change) is followed by a refresh of every table: T
#: alone, S alone, both, S emptied. (Cut for time from 5 steps: S's insert shares the
#: step of its updates, of other keys.)
STEPS: list[str | list[str]] = [
    ["INSERT INTO T VALUES (6, 2, 3), (7, NULL, 50), (8, 9, NULL)",
     "UPDATE T SET K = 1 WHERE ID = 5",
     "UPDATE T SET V = V WHERE ID = 1"],  # (changes nothing any query reads)
    ["INSERT INTO S VALUES (2, 30)",  # a new match for T's key 2
     "UPDATE S SET K = 9 WHERE K = 4",  # a key moves: 4 loses its match, 9 gains one
     "UPDATE S SET W = W + 100 WHERE K = 1"],  # moves the non-equi condition only
    ["INSERT INTO S VALUES (NULL, 0)",  # a NULL key: NOT IN is never true now
     "DELETE FROM T WHERE ID IN (2, 3)"],
    "DELETE FROM S",  # no row: every EXISTS false, every NOT IN true
]


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = engine_warehouse(tmp_path_factory.mktemp("existence"), spark, SOURCES, QUERIES)
    yield session
    session.close()


def test_every_refresh_is_incremental_and_exact(wh):
    assert_every_step_refreshes_incrementally(wh, STEPS, QUERIES)


def test_auto_resolves_to_adaptive_and_a_limit_the_query_wrote_is_named(wh):
    """An ``OR EXISTS`` table declared AUTO is maintained by the engine (ADAPTIVE); a
    scalar subquery under a ``LIMIT 1`` whose rows differ (the user's LIMIT, not the
    form Spark gives an uncorrelated EXISTS) is still refused, as ``LIMIT``."""
    wh.sql("CREATE DYNAMIC TABLE Q_AUTO TARGET_LAG = '1 hour' AS SELECT * FROM T "
           "WHERE V > 10 OR EXISTS (SELECT 1 FROM S WHERE S.K = T.K)")
    assert refresh_modes(wh)["Q_AUTO"][0] == "ADAPTIVE"
    with pytest.raises(SqlError) as refused:
        wh.sql("CREATE DYNAMIC TABLE Q_LIMIT TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL "
               "AS SELECT ID, (SELECT W FROM S LIMIT 1) AS W FROM T")
    assert refused.value.code == "DYNAMIC_TABLE_NOT_INCREMENTAL"
    assert "LIMIT" in str(refused.value)
