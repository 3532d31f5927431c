"""Property: after any DML on their sources, every refresh leaves each dynamic table equal
(as a multiset) to its query run fresh, and the stateless ones refresh INCREMENTALly.

Random rounds of inserts (NULLs and duplicates included), updates (to a new value, to
NULL, and back to the value a row had) and deletes go to two tables; after each round
every dynamic table is refreshed and compared with its query. The tables cover
projection and filter, UNION ALL through a view and a CTE (nested), a self-union, and
an aggregate (FULL, by value), so both kinds of refresh and both kinds of row id are
exercised on one history. One warehouse serves every example: each example goes on
from the state the last one left, which is what a long-lived table sees.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flush import read_table
from flush.tables import ROW_ID_COLUMN
from pipelines import Session

DEFINITIONS = {
    "P": "SELECT ID, upper(V) AS U, ID * 2 AS TWICE FROM T WHERE ID % 3 <> 0 OR V IS NULL",
    "UN": "WITH C AS (SELECT ID, V FROM T WHERE V IS NOT NULL) "
          "SELECT ID, V FROM C UNION ALL SELECT ID, V FROM VU "
          "UNION ALL (SELECT ID, 'k' AS V FROM T WHERE ID > 4 UNION ALL SELECT ID, V FROM C)",
    "SELF": "SELECT ID FROM T UNION ALL SELECT ID FROM T WHERE ID > 2",
    "AGG": "SELECT V, count(*) AS N, sum(ID) AS S FROM T GROUP BY V",
}  # fmt: skip
STATELESS = {"P", "UN", "SELF"}
IDS = st.integers(min_value=0, max_value=8)
VALUES = st.sampled_from(["a", "b", "c", None])
ROW = st.tuples(st.sampled_from(["T", "U"]), IDS, VALUES)
OPERATION = st.one_of(
    st.tuples(st.just("insert"), st.lists(ROW, min_size=1, max_size=4)),
    st.tuples(st.just("update"), st.sampled_from(["T", "U"]), IDS, VALUES),
    st.tuples(st.just("update_back"), st.sampled_from(["T", "U"]), IDS),
    st.tuples(st.just("delete"), st.sampled_from(["T", "U"]), IDS),
)


def bag(frame) -> Counter:
    """A DataFrame's rows as a multiset (NULLs and duplicates count)."""
    return Counter(tuple(row) for row in frame.collect())


def literal(value):
    return "NULL" if value is None else f"'{value}'"


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("dt_property") / "warehouse", spark=spark)
    for statement in (
        "CREATE TABLE T (ID NUMBER, V VARCHAR)",
        "CREATE TABLE U (ID NUMBER, V VARCHAR)",
        "INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, NULL), (5, 'a'), (5, 'a')",
        "INSERT INTO U VALUES (1, 'c'), (7, NULL)",
        "CREATE VIEW VU AS SELECT ID, V FROM U WHERE ID <> 0",
        # AGG is the FULL table among them (the engine has its own property test).
        *(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' "
          f"{'' if name in STATELESS else 'REFRESH_MODE = FULL '}AS {query}"
          for name, query in DEFINITIONS.items()),
    ):  # fmt: skip
        session.sql(statement)
    yield session
    session.close()


def apply(session: Session, operation) -> None:
    kind = operation[0]
    if kind == "insert":
        for table in ("T", "U"):
            values = [f"({i}, {literal(v)})" for name, i, v in operation[1] if name == table]
            if values:
                session.sql(f"INSERT INTO {table} VALUES {', '.join(values)}")
    elif kind == "update":
        _, table, key, value = operation
        session.sql(f"UPDATE {table} SET V = {literal(value)} WHERE ID = {key}")
    elif kind == "update_back":  # a change that is undone before the refresh sees it
        _, table, key = operation
        session.sql(f"UPDATE {table} SET V = 'tmp' WHERE ID = {key}")
        session.sql(f"UPDATE {table} SET V = 'a' WHERE ID = {key} AND V = 'tmp'")
    else:
        _, table, key = operation
        session.sql(f"DELETE FROM {table} WHERE ID = {key}")


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rounds=st.lists(st.lists(OPERATION, min_size=1, max_size=3), min_size=1, max_size=2))
def test_every_refresh_equals_the_query_run_fresh(warehouse, rounds):  # fmt: skip
    session = warehouse
    for operations in rounds:
        for operation in operations:
            apply(session, operation)
        for name, query in DEFINITIONS.items():
            session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
            assert bag(session.sql(f"SELECT * FROM {name}")) == bag(session.sql(query)), name
        actions = {
            r.NAME: r.REFRESH_ACTION
            for r in session.sql("SELECT NAME, REFRESH_ACTION FROM TABLE("
                                 "DYNAMIC_TABLE_REFRESH_HISTORY(RESULT_LIMIT => 4))").collect()
        }  # fmt: skip
        for name in STATELESS:  # never a silent FULL
            assert actions[name] in ("INCREMENTAL", "NO_DATA"), (name, actions)
        assert actions["AGG"] in ("FULL", "NO_DATA")
    # Every table's row ids stay unique (packed from the sources' ids, or reserved).
    for name in DEFINITIONS:
        ids = read_table(session.require_table(name).uri).column(ROW_ID_COLUMN).to_pylist()
        assert len(ids) == len(set(ids)), name
