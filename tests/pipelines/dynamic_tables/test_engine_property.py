"""Property: dynamic tables the query-delta engine maintains (joins, aggregates, windows,
semi/anti/outer joins, set operations, generators and VALUES, nested two levels) equal their query run fresh
after every incremental refresh, whatever DML their sources saw.

Random rounds of inserts (NULL keys and values, duplicate rows), updates (of keys and of
values, to NULL, and back to the value a row had) and deletes go to two tables; after
each round every dynamic table is refreshed and compared, as a multiset, with its
query run fresh (every table of a round in one Spark job). Every refresh after the
first is INCREMENTAL or NO_DATA (never a silent FULL), and every table's row ids stay
unique. One warehouse serves every example, each going on from the state the last one
left: an explicit example of one round holding every kind of change on both tables,
then one generated one (seeded; each round refreshes every table).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from flush import read_table
from flush.tables import ROW_ID_COLUMN
from pipelines import Session
from tests.pipelines.dynamic_tables.batched import assert_all_same_as_queries

DEFINITIONS = {
    "AGG": "SELECT K, count(*) AS N, sum(V) AS S, min(V) AS MN, max(V) AS MX, "
           "count(DISTINCT V) AS D FROM T GROUP BY K",
    "SCALAR": "SELECT count(*) AS N, sum(V) AS S FROM T",
    "DIST": "SELECT DISTINCT K FROM U",
    "INNER": "SELECT T.ID, T.V, U.W FROM T JOIN U ON T.K = U.K",
    "LEFT": "SELECT T.ID, U.W FROM T LEFT JOIN U ON T.K = U.K AND U.W > 1",
    "FULL": "SELECT T.ID, U.ID AS UID FROM T FULL JOIN U ON T.K = U.K",
    "EXISTS": "SELECT ID, V FROM T WHERE EXISTS (SELECT 1 FROM U WHERE U.K = T.K)",
    "NOTIN": "SELECT ID FROM T WHERE K NOT IN (SELECT K FROM U)",
    "WIN": "SELECT ID, K, row_number() OVER (PARTITION BY K ORDER BY V, ID) AS RN, "
           "sum(V) OVER (PARTITION BY K) AS TOTAL FROM T",
    "JOIN_AGG": "SELECT U.W, count(*) AS N, sum(T.V) AS S FROM T JOIN U ON T.K = U.K GROUP BY U.W",
    "WIN_JOIN": "SELECT T.ID, U.W, rank() OVER (PARTITION BY U.W ORDER BY T.V) AS R "
                "FROM T JOIN U ON T.K = U.K",
    "OUTER_AGGS": "SELECT A.K, A.N, B.M FROM (SELECT K, count(*) AS N FROM T GROUP BY K) A "
                  "LEFT JOIN (SELECT K, max(W) AS M FROM U GROUP BY K) B ON A.K = B.K",
    "UNION_JOINS": "SELECT T.ID, U.W FROM T JOIN U ON T.K = U.K UNION ALL "
                   "SELECT T.ID, U.W FROM T JOIN U ON T.ID = U.ID",
    "NOTIN_AGG": "SELECT ID FROM T WHERE V NOT IN (SELECT max(W) FROM U GROUP BY K)",
    "SETS": "SELECT K FROM T INTERSECT SELECT K FROM U",
    "SCALAR_SUB": "SELECT ID, (SELECT count(*) FROM U WHERE U.K = T.K) AS C FROM T",
    "ROLLUP_JOIN": "SELECT T.K, U.W, count(*) AS N, sum(T.V) AS S, grouping_id() AS G "
                   "FROM T JOIN U ON T.K = U.K GROUP BY ROLLUP (T.K, U.W)",
    "DISTINCTS": "SELECT K, count(DISTINCT V) AS DV, count(DISTINCT ID) AS DI FROM T GROUP BY K",
    "GENERATED": "SELECT E, C.NAME, count(*) AS N FROM T LEFT JOIN (VALUES (1, 'one'), "
                 "(2, 'two')) AS C(K, NAME) ON T.K = C.K LATERAL VIEW explode(array(T.V, T.K)) "
                 "X AS E GROUP BY E, C.NAME",
}  # fmt: skip
IDS = st.integers(min_value=0, max_value=6)
KEYS = st.sampled_from([1, 2, 3, None])
VALUES = st.sampled_from([1, 2, 5, None])
ROW = st.tuples(st.sampled_from(["T", "U"]), IDS, KEYS, VALUES)
TABLES = st.sampled_from(["T", "U"])
OPERATION = st.one_of(
    st.tuples(st.just("insert"), st.lists(ROW, min_size=1, max_size=4)),
    st.tuples(st.just("set_value"), TABLES, IDS, VALUES),
    st.tuples(st.just("set_key"), TABLES, IDS, KEYS),
    st.tuples(st.just("update_back"), TABLES, IDS),
    st.tuples(st.just("delete"), TABLES, IDS),
    st.tuples(st.just("nothing")),
)
VALUE_COLUMN = {"T": "V", "U": "W"}


def literal(value):
    return "NULL" if value is None else str(value)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("engine_property") / "warehouse", spark=spark)
    for statement in (
        "CREATE TABLE T (ID NUMBER, K NUMBER, V NUMBER)",
        "CREATE TABLE U (ID NUMBER, K NUMBER, W NUMBER)",
        "INSERT INTO T VALUES (1, 1, 1), (2, 2, 2), (3, NULL, 5), (4, 1, 1), (4, 1, 1)",
        "INSERT INTO U VALUES (1, 1, 2), (2, 2, NULL), (5, 1, 5)",
        *(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' "
          f"REFRESH_MODE = INCREMENTAL AS {query}" for name, query in DEFINITIONS.items()),
    ):  # fmt: skip
        session.sql(statement)
    yield session
    session.close()


def apply(session: Session, operation) -> None:
    kind = operation[0]
    if kind == "insert":
        for table in ("T", "U"):
            values = [f"({i}, {literal(k)}, {literal(v)})"
                      for name, i, k, v in operation[1] if name == table]  # fmt: skip
            if values:
                session.sql(f"INSERT INTO {table} VALUES {', '.join(values)}")
    elif kind == "set_value":
        _, table, key, value = operation
        session.sql(f"UPDATE {table} SET {VALUE_COLUMN[table]} = {literal(value)} "
                    f"WHERE ID = {key}")  # fmt: skip
    elif kind == "set_key":
        _, table, key, value = operation
        session.sql(f"UPDATE {table} SET K = {literal(value)} WHERE ID = {key}")
    elif kind == "update_back":  # a change undone before the refresh sees it
        _, table, key = operation
        column = VALUE_COLUMN[table]
        session.sql(f"UPDATE {table} SET {column} = {column} + 100 WHERE ID = {key}")
        session.sql(f"UPDATE {table} SET {column} = {column} - 100 WHERE ID = {key}")
    elif kind == "delete":
        _, table, key = operation
        session.sql(f"DELETE FROM {table} WHERE ID = {key}")


def test_every_definition_is_maintained_by_the_engine(warehouse):
    rows = warehouse.sql("SHOW DYNAMIC TABLES").collect()
    modes = {row["name"]: row["refresh_mode"] for row in rows}
    assert modes == dict.fromkeys(DEFINITIONS, "INCREMENTAL"), modes


#: Every kind of change on both tables, in one round, each on rows of its own (the
#: generated examples, kept few for the suite's time, draw mostly inserts and no-ops):
#: inserts of NULL keys and values and of a duplicate row, values and keys set (to NULL
#: and from NULL), a change undone, deletes (of a duplicated row too).
EVERY_KIND = [
    [("insert", [("T", 6, None, 2), ("T", 6, None, 2), ("U", 6, 3, None), ("T", 5, 3, 1)]),
     ("set_value", "T", 2, None), ("set_key", "U", 5, None), ("update_back", "T", 1),
     ("set_key", "T", 3, 3), ("set_value", "U", 1, 5), ("delete", "T", 4),
     ("delete", "U", 2), ("nothing",)],
]


#: One generated example besides the explicit one (two, before: each round refreshes
#: every definition, a minute here; the seeded examples this small draw a few inserts and
#: updates the explicit one holds too, and the shapes meet every kind of change one by
#: one in the other engine tests, test_engine_attack.py and test_engine_*.py).
@settings(
    max_examples=1,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rounds=st.lists(st.lists(OPERATION, min_size=1, max_size=3), min_size=1, max_size=2))
@example(rounds=EVERY_KIND)
def test_every_refresh_equals_the_query_run_fresh(warehouse, rounds):
    session = warehouse
    for operations in rounds:
        for operation in operations:
            apply(session, operation)
        for name in DEFINITIONS:
            session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
        assert_all_same_as_queries(session, DEFINITIONS, operations)
        history = session.sql(
            "SELECT NAME, REFRESH_ACTION FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
            f"RESULT_LIMIT => {len(DEFINITIONS)}))"
        ).collect()
        actions = {row.NAME: row.REFRESH_ACTION for row in history}
        assert set(actions.values()) <= {"INCREMENTAL", "NO_DATA"}, actions
    for name in DEFINITIONS:
        ids = read_table(session.require_table(name).uri).column(ROW_ID_COLUMN).to_pylist()
        assert len(ids) == len(set(ids)), name
