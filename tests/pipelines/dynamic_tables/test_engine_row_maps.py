"""Generators (explode, posexplode, inline, their outer forms, LATERAL VIEW, stack,
json_tuple) and constant relations (VALUES, SELECT without FROM, range) refreshed by the
query-delta engine: every refresh after the first is INCREMENTAL and leaves the table
equal to its query run fresh (as a multiset), under inserts, updates of the collections
and values, deletes, rows whose collection is empty or NULL and JSON text that is
malformed, not an object, NULL or without the fields read."""

from __future__ import annotations

import pytest

from pipelines import SqlError
from tests.pipelines.dynamic_tables.batched import assert_every_step_refreshes_incrementally
from tests.pipelines.dynamic_tables.checks import create_incremental, engine_warehouse

#: A and M are JSON text: the queries read them as an array of ints and a map.
SOURCE = "CREATE TABLE G (ID NUMBER, K VARCHAR, A VARCHAR, M VARCHAR)"
VIEW = ("CREATE VIEW GV AS SELECT ID, K, from_json(A, 'array<int>') AS A, "
        "from_json(M, 'map<string,int>') AS M FROM G")  # fmt: skip
ROWS = [
    """(1, 'a', '[1, 2, 2]', '{"x": 1, "y": 2}')""",
    "(2, 'b', '[]', '{}')",
    "(3, 'a', NULL, NULL)",
    """(4, NULL, '[null, 5]', '{"z": null}')""",
    """(7, 'a', '[1, 2, 2]', '{"x": 1, "y": 2}')""",  # 1's collections, updated below
    """(8, 'c', '[7]', '{"x": 7}')""",
    "(9, 'b', '[3, 3]', '{}')",
]
#: One change, then one refresh: its cases touch rows of their own (inserts, deletes and
#: updates of each kind; cut for time from six steps, then three, then two, to one).
STEPS: list[str | list[str]] = [
    ["""INSERT INTO G VALUES (5, 'c', '[7]', '{"x": 7}'), (6, 'b', '[3, 3]', '{}')""",
     "DELETE FROM G WHERE ID IN (4, 9)",  # a NULL key, a NULL element; repeated elements
     "UPDATE G SET K = 'z' WHERE ID = 1",  # the collection as it was
     # 7: one element moves, one is new; 8: to NULL; 2 and 3: from empty and NULL
     "UPDATE G SET A = CASE ID WHEN 7 THEN '[9, 1, 2]' WHEN 8 THEN NULL ELSE '[4]' END, "
     """M = CASE ID WHEN 7 THEN M WHEN 8 THEN NULL ELSE '{"w": 4}' END """
     "WHERE ID IN (2, 3, 7, 8)"],
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
    session = engine_warehouse(
        tmp_path_factory.mktemp("row_maps"), spark,
        [SOURCE, VIEW, f"INSERT INTO G VALUES {', '.join(ROWS)}"],
        {f"D_{name}": query for name, query in QUERIES.items()},
    )  # fmt: skip
    yield session
    session.close()


def test_every_refresh_is_incremental_and_exact(wh):
    assert_every_step_refreshes_incrementally(
        wh, STEPS, {f"D_{name}": query for name, query in QUERIES.items()})  # fmt: skip


def test_an_update_that_keeps_the_collection_changes_no_made_row(wh):
    """A made row's id is its input row's and its position: an update of another column
    the query does not read leaves the exploded rows as they were (a stream sees none)."""
    wh.sql("CREATE STREAM EXPLODED ON TABLE D_lateral_view")
    wh.sql("""UPDATE G SET M = '{"q": 0}' WHERE ID = 1""")
    wh.sql("ALTER DYNAMIC TABLE D_lateral_view REFRESH")
    assert wh.sql("SELECT count(*) FROM EXPLODED").collect()[0][0] == 0


#: Stack and json_tuple read the values of a row; range joins them.
VALUES_SOURCE = "CREATE TABLE S (ID NUMBER, K VARCHAR, X NUMBER, Y NUMBER, J VARCHAR)"
VALUES_ROWS = [
    """(1, 'a', 1, 10, '{"a": 1, "b": "x"}')""",
    """(2, 'b', NULL, 20, '{"a": null}')""",  # a NULL field, a missing one
    "(3, 'a', 3, NULL, 'not json')",
    "(4, NULL, NULL, NULL, NULL)",
    "(5, 'c', 5, 50, '[1, 2]')",  # JSON, not an object
    """(9, 'b', 6, 60, '{"b": "y", "a": 6}')""",
]
VALUES_STEPS = [  # 8: a field that is an object (inserts, updates and deletes in one step)
    ["""INSERT INTO S VALUES (6, 'b', 6, 60, '{"b": "y", "a": 6}'), (7, 'c', 7, 70, '{"a": 7'), """
     """(8, 'a', 8, 80, '{"a": {"n": [1]}, "b": 8}')""",
     "DELETE FROM S WHERE ID IN (4, 9)",
     """UPDATE S SET J = '{"a": 2, "b": "z"}', X = 2 WHERE ID = 2"""],
]
VALUES_QUERIES = {
    "stack": "SELECT ID, P, V FROM S LATERAL VIEW stack(3, 'x', X, 'y', Y, 'xy', X + Y) t AS P, V",
    "stack_short_row": "SELECT ID, A, B FROM S LATERAL VIEW stack(2, X, Y, ID) t AS A, B",
    "stack_nulls": "SELECT ID, V FROM S LATERAL VIEW OUTER stack(3, X, NULL, Y) t AS V",
    "stack_select": "SELECT K, stack(2, X, K, Y, 'const') AS (N, T) FROM S WHERE ID <> 3",
    "stack_grouped": ("SELECT P, count(V) AS N, sum(V) AS T, count(*) AS C FROM S "
                      "LATERAL VIEW stack(2, 'x', X, 'y', Y) t AS P, V GROUP BY P"),
    "json_tuple": "SELECT ID, A, B FROM S LATERAL VIEW json_tuple(J, 'a', 'b') t AS A, B",
    "json_outer": "SELECT ID, A FROM S LATERAL VIEW OUTER json_tuple(J, 'a') t AS A",
    "json_select": "SELECT ID, json_tuple(J, 'b', 'missing') FROM S WHERE ID > 1",
    "json_grouped": ("SELECT A, count(*) AS N FROM S LATERAL VIEW json_tuple(J, 'a') t AS A "
                     "GROUP BY A"),
    "json_of_stack": ("SELECT ID, T, A FROM S LATERAL VIEW stack(2, J, K) s AS T "
                      "LATERAL VIEW json_tuple(T, 'a') j AS A"),
    "range_joined": "SELECT S.ID, r.id AS R FROM S JOIN range(0, 10, 3) r ON S.X >= r.id",
    "range_negative_step": ("SELECT S.ID, r.id AS R FROM S JOIN range(10, 0, -4) r "
                            "ON S.ID <= r.id"),
    "range_empty": "SELECT S.ID, r.id AS R FROM S LEFT JOIN range(5, 5) r ON S.ID = r.id",
    "range_grouped": ("SELECT r.id % 3 AS G, count(S.ID) AS N, sum(S.Y) AS T FROM range(8) r "
                      "LEFT JOIN S ON S.ID = r.id GROUP BY r.id % 3"),
    "range_aggregate": ("SELECT count(*) AS N, sum(r.id) AS T FROM range(1, 100, 7) r "
                        "CROSS JOIN S WHERE S.X IS NOT NULL"),
    "range_union": "SELECT ID FROM S UNION ALL SELECT id FROM range(-2, 1)",
    "range_rows": ("SELECT r.id, r.id * 2 AS D FROM range(10, -5, -3) r "
                   "WHERE EXISTS (SELECT 1 FROM S WHERE S.X = r.id)"),
}


@pytest.fixture(scope="module")
def vh(tmp_path_factory, spark):
    session = engine_warehouse(
        tmp_path_factory.mktemp("row_maps_values"), spark,
        [VALUES_SOURCE, f"INSERT INTO S VALUES {', '.join(VALUES_ROWS)}"],
        {f"D_{name}": query for name, query in VALUES_QUERIES.items()},
    )  # fmt: skip
    yield session
    session.close()


def test_stack_json_tuple_and_range_refresh_incrementally_and_exactly(vh):
    assert_every_step_refreshes_incrementally(
        vh, VALUES_STEPS, {f"D_{name}": query for name, query in VALUES_QUERIES.items()})  # fmt: skip


def test_an_update_of_a_column_not_read_changes_no_stacked_or_ranged_row(vh):
    """A stacked row's id is its input row's and its position, a json_tuple row's its
    input row's, a range row's its value: an update of a column the query does not read
    changes none of them (a stream sees nothing)."""
    names = ("stack", "json_tuple", "range_joined")
    for name in names:
        vh.sql(f"CREATE OR REPLACE STREAM ST_{name} ON TABLE D_{name}")
    vh.sql("UPDATE S SET K = 'moved' WHERE ID IN (1, 2, 3)")
    for name in names:
        vh.sql(f"ALTER DYNAMIC TABLE D_{name} REFRESH")
        assert vh.sql(f"SELECT count(*) FROM ST_{name}").collect()[0][0] == 0, name


def test_a_range_alone_is_no_dynamic_table(vh):
    """A definition must read a table (its refreshes follow the tables' changes): a
    range alone is refused for that, not as a relation the engine cannot evaluate."""
    with pytest.raises(SqlError) as refused:
        create_incremental(vh, {"D_RANGE_ALONE": "SELECT id FROM range(10, -5, -3)"})
    assert "must read at least one table" in str(refused.value)
    assert "CONSTANT_RELATION" not in str(refused.value)


@pytest.mark.parametrize(("query", "reason"), [
    ("SELECT GV.ID, w.keyword FROM GV CROSS JOIN sql_keywords() w", "GENERATOR:sql_keywords"),
])  # fmt: skip
def test_generators_and_relations_it_does_not_cover_are_refused_by_name(wh, query, reason):
    with pytest.raises(SqlError) as refused:
        wh.sql(f"CREATE DYNAMIC TABLE D_REFUSED TARGET_LAG = '1 hour' "
               f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    assert refused.value.code == "DYNAMIC_TABLE_NOT_INCREMENTAL"
    assert reason in str(refused.value)
