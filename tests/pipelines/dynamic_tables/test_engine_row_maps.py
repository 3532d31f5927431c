"""Generators (explode, posexplode, inline, their outer forms, LATERAL VIEW) and constant
relations (VALUES, SELECT without FROM) refreshed by the query-delta engine: every
refresh after the first is INCREMENTAL and leaves the table equal to its query run fresh
(as a multiset), under inserts, updates of the collections, deletes and rows whose
collection is empty or NULL."""

from __future__ import annotations

import pytest

from pipelines import Session, SqlError
from tests.pipelines.dynamic_tables.checks import assert_same_as_query, create_incremental

#: A and M are JSON text: the queries read them as an array of ints and a map.
SOURCE = "CREATE TABLE G (ID NUMBER, K VARCHAR, A VARCHAR, M VARCHAR)"
VIEW = ("CREATE VIEW GV AS SELECT ID, K, from_json(A, 'array<int>') AS A, "
        "from_json(M, 'map<string,int>') AS M FROM G")  # fmt: skip
ROWS = [
    """(1, 'a', '[1, 2, 2]', '{"x": 1, "y": 2}')""",
    "(2, 'b', '[]', '{}')",
    "(3, 'a', NULL, NULL)",
    """(4, NULL, '[null, 5]', '{"z": null}')""",
]
#: Each step is followed by a refresh.
STEPS = [
    """INSERT INTO G VALUES (5, 'c', '[7]', '{"x": 7}'), (6, 'b', '[3, 3]', '{}')""",
    "UPDATE G SET A = '[9, 1, 2]' WHERE ID = 1",  # one element moves, one is new
    "UPDATE G SET A = NULL, M = NULL WHERE ID = 5",
    """UPDATE G SET A = '[4]', M = '{"w": 4}' WHERE ID IN (2, 3)""",
    "DELETE FROM G WHERE ID IN (4, 6)",
    "UPDATE G SET K = 'z' WHERE ID = 1",  # the collection as it was
]

QUERIES = {
    "lateral_view": "SELECT ID, K, E FROM GV LATERAL VIEW explode(A) t AS E",
    "outer": "SELECT ID, E FROM GV LATERAL VIEW OUTER explode(A) t AS E",
    "posexplode": "SELECT ID, P, E FROM GV LATERAL VIEW posexplode(A) t AS P, E",
    "map": "SELECT ID, MK, MV FROM GV LATERAL VIEW explode_outer(M) t AS MK, MV",
    "inline": ("SELECT ID, X, Y FROM GV LATERAL VIEW inline(transform(A, v -> "
               "named_struct('x', v, 'y', v * 2))) t AS X, Y"),
    "select_list": "SELECT ID, explode(A) AS E FROM GV WHERE K IS NOT NULL",
    "grouped": "SELECT E, count(*) AS N, sum(ID) AS S FROM GV LATERAL VIEW explode(A) t AS E GROUP BY E",
    "values_join": ("SELECT GV.ID, v.NAME FROM GV JOIN (VALUES ('a', 'alpha'), ('b', 'beta'), "
                    "('a', 'again')) AS v(K, NAME) ON GV.K = v.K"),
    "union_constant": "SELECT ID, K FROM GV UNION ALL SELECT -1, 'constant' UNION ALL SELECT -1, 'constant'",
    "values_alone_under_a_join": ("SELECT count(*) AS N FROM GV CROSS JOIN "
                                  "(SELECT 1 AS ONE) AS o WHERE GV.ID > o.ONE"),
}


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("row_maps") / "warehouse", spark=spark)
    session.sql(SOURCE)
    session.sql(VIEW)
    session.sql(f"INSERT INTO G VALUES {', '.join(ROWS)}")
    create_incremental(session, {f"D_{name}": query for name, query in QUERIES.items()})
    yield session
    session.close()


def test_every_refresh_is_incremental_and_exact(wh):
    for name, query in QUERIES.items():
        assert_same_as_query(wh, f"D_{name}", query)
    for step in STEPS:
        wh.sql(step)
        for name, query in QUERIES.items():
            status = wh.sql(f"ALTER DYNAMIC TABLE D_{name} REFRESH").collect()[0].status
            assert "INCREMENTAL" in status, (name, step, status)
            assert_same_as_query(wh, f"D_{name}", query)


def test_an_update_that_keeps_the_collection_changes_no_made_row(wh):
    """A made row's id is its input row's and its position: an update of another column
    the query does not read leaves the exploded rows as they were (a stream sees none)."""
    wh.sql("CREATE STREAM EXPLODED ON TABLE D_lateral_view")
    wh.sql("""UPDATE G SET M = '{"q": 0}' WHERE ID = 1""")
    wh.sql("ALTER DYNAMIC TABLE D_lateral_view REFRESH")
    assert wh.sql("SELECT count(*) FROM EXPLODED").collect()[0][0] == 0


@pytest.mark.parametrize(("query", "reason"), [
    ("SELECT ID, S FROM GV LATERAL VIEW stack(2, ID, ID + 1) t AS S", "GENERATOR:stack"),
    ("SELECT GV.ID FROM GV JOIN range(3) r ON GV.ID = r.id", "CONSTANT_RELATION"),
])  # fmt: skip
def test_generators_and_relations_it_does_not_cover_are_refused_by_name(wh, query, reason):
    with pytest.raises(SqlError) as refused:
        wh.sql(f"CREATE DYNAMIC TABLE D_REFUSED TARGET_LAG = '1 hour' "
               f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    assert refused.value.code == "DYNAMIC_TABLE_NOT_INCREMENTAL"
    assert reason in str(refused.value)
