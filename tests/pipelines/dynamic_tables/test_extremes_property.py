"""Property: dynamic tables whose MIN and MAX are kept as aggregation state
(pipelines/incremental/extremes.py) equal their query run fresh after every refresh,
whatever DML their source saw, and every refresh is INCREMENTAL (NO_DATA when the
source did not change).

Random rounds of inserts (NULL keys and values, duplicate rows), updates (of keys and
of values, to NULL, and away and back to the value a row had), deletes of rows, deletes
and updates of a group's current MIN or MAX, and empty changes (a DELETE or an UPDATE
matching no row) go to one source; after each round each table (MIN and MAX of INT,
DOUBLE with -0.0, NaN and infinities, STRING and DATE, beside count(*), count(x) and an
exact sum; grouped by a key that may be NULL, and scalar) is refreshed and compared, as
a multiset, with its query run fresh. One warehouse serves every example, each going on
from the state the last one left; a last test compares each table's hidden state with
that of a table created fresh over the final source.

Zeros: Spark's MIN and MAX take -0.0 and 0.0 for equal values, so over a group holding
both either is Spark's answer (the query's own depends on the order it reads the rows
in). The comparison tells -0.0 from 0.0 (as checks.bag does) except where the source
holds both in one group.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from flush.tables import state_columns
from pipelines import Session
from tests.pipelines.dynamic_tables.checks import bag, canon, create_incremental

DEFINITIONS = {
    "M_GROUPED": "SELECT K, min(I) AS LI, max(I) AS HI, min(F) AS LF, max(F) AS HF, "
                 "min(S) AS LS, max(S) AS HS, min(D) AS LD, max(D) AS HD, count(*) AS N, "
                 "count(F) AS NF, sum(I) AS SI FROM X GROUP BY K",
    "M_SCALAR": "SELECT min(I) AS LI, max(F) AS HF, min(F) AS LF, max(S) AS HS, min(D) AS LD, "
                "count(*) AS N, sum(I) AS S FROM X",
}  # fmt: skip
#: The grouping columns of each table (its state's key).
KEYS = {"M_GROUPED": ["K"], "M_SCALAR": []}
#: Each value column and the SQL literals it takes (NULL among them).
LITERALS = {
    "I": ["0", "-1", "5", "7", "NULL"],
    "F": ["0.0", "CAST('-0.0' AS DOUBLE)", "1.5", "-2.5", "CAST('NaN' AS DOUBLE)",
          "CAST('Infinity' AS DOUBLE)", "NULL"],
    "S": ["''", "'a'", "'B'", "'zz'", "NULL"],
    "D": ["DATE'2024-01-01'", "DATE'1999-12-31'", "DATE'2030-06-30'", "NULL"],
}  # fmt: skip
COLUMNS = list(LITERALS)
IDS = st.integers(min_value=0, max_value=6)
KEY = st.sampled_from(["'a'", "'b'", "'c'", "NULL"])
ROW = st.tuples(IDS, KEY, *(st.sampled_from(LITERALS[c]) for c in COLUMNS))
COLUMN = st.sampled_from(COLUMNS)
OPERATION = st.one_of(
    st.tuples(st.just("insert"), st.lists(ROW, min_size=1, max_size=3)),
    st.tuples(st.just("duplicate"), IDS),
    st.tuples(st.just("set_value"), IDS, COLUMN, st.integers(0, 6)),
    st.tuples(st.just("set_key"), IDS, KEY),
    st.tuples(st.just("update_back"), IDS),
    st.tuples(st.just("delete"), IDS),
    st.tuples(st.just("extreme"), KEY, COLUMN, st.booleans(), st.sampled_from(["delete", "null"])),
    st.tuples(st.just("empty")),
)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("extremes_property") / "warehouse", spark=spark)
    session.sql("CREATE TABLE X (ID NUMBER, K VARCHAR, I INT, F DOUBLE, S VARCHAR, D DATE)")
    session.sql("INSERT INTO X VALUES (1, 'a', 5, 1.5, 'a', DATE'2024-01-01'), "
                "(2, 'a', -1, CAST('-0.0' AS DOUBLE), 'zz', NULL), "
                "(3, 'b', 7, CAST('NaN' AS DOUBLE), '', DATE'1999-12-31'), "
                "(3, 'b', 7, CAST('NaN' AS DOUBLE), '', DATE'1999-12-31'), "
                "(4, NULL, NULL, NULL, NULL, NULL), (5, 'c', 0, -2.5, 'B', DATE'2030-06-30')")
    create_incremental(session, DEFINITIONS)
    yield session
    session.close()


def _group(key: str) -> str:
    return "K IS NULL" if key == "NULL" else f"K = {key}"


def _extreme(session: Session, key: str, column: str, least: bool, how: str) -> None:
    """Delete (or set to NULL) the rows of group ``key`` holding its MIN (MAX) of
    ``column``: the group loses its extreme, and every copy of it."""
    found = session.sql(f"SELECT {'min' if least else 'max'}({column}) AS E, "
                        f"CAST({'min' if least else 'max'}({column}) AS STRING) AS T "
                        f"FROM X WHERE {_group(key)}").collect()[0]  # fmt: skip
    if found.E is None:
        return
    value = {"I": str(found.E), "S": f"'{found.E}'", "F": f"CAST('{found.T}' AS DOUBLE)",
             "D": f"DATE'{found.T}'"}[column]  # fmt: skip
    where = f"{_group(key)} AND {column} = {value}"
    if how == "delete":
        session.sql(f"DELETE FROM X WHERE {where}")
    else:
        session.sql(f"UPDATE X SET {column} = NULL WHERE {where}")


def apply(session: Session, operation) -> None:
    kind, *args = operation
    if kind == "insert":
        session.sql("INSERT INTO X VALUES " + ", ".join(f"({', '.join(map(str, row))})"
                                                        for row in args[0]))  # fmt: skip
    elif kind == "duplicate":  # the row (rows) of an id again: duplicate rows
        session.sql(f"INSERT INTO X SELECT * FROM X WHERE ID = {args[0]}")
    elif kind == "set_value":
        row, column, pick = args
        literal = LITERALS[column][pick % len(LITERALS[column])]
        session.sql(f"UPDATE X SET {column} = {literal} WHERE ID = {row}")
    elif kind == "set_key":
        session.sql(f"UPDATE X SET K = {args[1]} WHERE ID = {args[0]}")
    elif kind == "update_back":  # away and back before the refresh sees it
        session.sql(f"UPDATE X SET I = I + 100, F = F * 2 WHERE ID = {args[0]}")
        session.sql(f"UPDATE X SET I = I - 100, F = F / 2 WHERE ID = {args[0]}")
    elif kind == "delete":
        session.sql(f"DELETE FROM X WHERE ID = {args[0]}")
    elif kind == "extreme":
        _extreme(session, *args)
    else:  # statements that change no row
        session.sql("DELETE FROM X WHERE ID = 99")
        session.sql("UPDATE X SET I = 1 WHERE ID = 99")


def _unsigned(value: object) -> object:
    return 0.0 if isinstance(value, float) and value == 0.0 else value


def _zeros_meet(session: Session) -> bool:
    """Whether some group (of K, or the whole source) holds both -0.0 and 0.0 in F."""
    signs = "count(DISTINCT CAST(F AS STRING))"
    grouped = session.sql(f"SELECT {signs} AS N FROM X WHERE F = 0 GROUP BY K").collect()
    return any(r.N > 1 for r in grouped) or session.sql(
        f"SELECT {signs} AS N FROM X WHERE F = 0").collect()[0].N > 1  # fmt: skip


def assert_equal_to_query(session: Session, name: str, query: str) -> None:
    content, fresh = bag(session, f"SELECT * FROM {name}"), bag(session, query)
    if content == fresh:
        return
    unsigned = [Counter({tuple(canon(_unsigned(v)) for v in row): n for row, n in b.items()})
                for b in (_raw(session, f"SELECT * FROM {name}"), _raw(session, query))]
    assert unsigned[0] == unsigned[1] and _zeros_meet(session), (
        f"{name} differs from its query: only in {name}: {list((content - fresh).items())}; "
        f"only in the query: {list((fresh - content).items())}")


def _raw(session: Session, query: str) -> Counter:
    return Counter(tuple(row) for row in session.sql(query).collect())


def test_every_table_keeps_min_and_max_as_state(warehouse):
    for name in DEFINITIONS:
        schema = pa.schema(DeltaTable(warehouse.require_table(name).uri).schema())
        assert state_columns(schema), name


def _source(session: Session) -> tuple[int, Counter]:
    return (DeltaTable(session.require_table("X").uri).version(),
            bag(session, "SELECT * FROM X"))  # fmt: skip


#: No shrinking: every example goes on from the warehouse the last one left, so a
#: smaller example would not replay the failure (the failing operations are in the
#: assertion's message).
@settings(max_examples=1, deadline=None, derandomize=True, database=None,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(operations=st.lists(OPERATION, min_size=1, max_size=5))
# Explicit first: each group's extremes lost (deleted, set to NULL, every copy), of each
# type, beside inserts of NaN and -0.0, a group moved, a change undone, an empty change.
@example([("extreme", "'a'", "F", True, "delete"), ("extreme", "'b'", "I", False, "null"),
          ("insert", [(6, "'a'", "5", "CAST('-0.0' AS DOUBLE)", "'a'", "NULL"),
                      (6, "'a'", "5", "CAST('-0.0' AS DOUBLE)", "'a'", "NULL"),
                      (0, "'b'", "NULL", "CAST('NaN' AS DOUBLE)", "'zz'", "DATE'2030-06-30'")])])
@example([("delete", 3), ("extreme", "NULL", "S", False, "delete"), ("empty",),
          ("extreme", "'c'", "D", False, "null"), ("duplicate", 5)])
@example([("extreme", "'a'", "S", True, "null"), ("set_key", 5, "NULL"), ("update_back", 2),
          ("set_value", 1, "F", 4), ("extreme", "'a'", "I", False, "delete")])
def test_every_refresh_equals_the_query_run_fresh(warehouse, operations):
    """INCREMENTAL when the source's rows changed, NO_DATA when it has no new version
    (either for a new version of the same rows: a DELETE of no row, an update back)."""
    session = warehouse
    version, rows = _source(session)
    for operation in operations:
        event(operation[0])  # shown by --hypothesis-show-statistics
        apply(session, operation)
    new_version, new_rows = _source(session)
    allowed = ({"NO_DATA"} if new_version == version else
               {"INCREMENTAL"} if new_rows != rows else {"INCREMENTAL", "NO_DATA"})  # fmt: skip
    for name, query in DEFINITIONS.items():
        session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
        newest = session.catalog.list_refreshes(session.require_table(name).id, limit=1)[0]
        assert newest.state == "SUCCEEDED" and newest.action in allowed, (name, operations)
        assert_equal_to_query(session, name, query)


def _state(session: Session, name: str, keys: list[str]) -> dict:
    """Each group's hidden state, zeros unsigned where both signs meet in a group, and
    an exact sum's state (a DECIMAL beside its count of non-NULL values) None where it
    counts no value: it is 0 or NULL then (the sum is NULL either way)."""
    table = DeltaTable(session.require_table(name).uri)
    schema = pa.schema(table.schema())
    names = state_columns(schema)
    sums = {c for c in names if pa.types.is_decimal(schema.field(c).type) and f"{c}_N" in names}
    meet = _zeros_meet(session)

    def value(row: dict, c: str) -> object:
        if c in sums and row[f"{c}_N"] == 0:
            return None
        return canon(_unsigned(row[c]) if meet else row[c])

    return {tuple(row[k] for k in keys): {c: value(row, c) for c in names}
            for row in table.to_pyarrow_table(columns=[*keys, *names]).to_pylist()}  # fmt: skip


def test_the_state_equals_a_fresh_tables(warehouse):
    """After every example: each table's hidden state is the state a table created now
    over the same source computes from its rows."""
    session = warehouse
    for name, query in DEFINITIONS.items():
        session.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name}_FRESH TARGET_LAG = '1 hour' "
                    f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
        kept, fresh = (_state(session, n, KEYS[name]) for n in (name, f"{name}_FRESH"))
        differ = {k: (kept.get(k), fresh.get(k)) for k in kept.keys() | fresh.keys()
                  if kept.get(k) != fresh.get(k)}  # fmt: skip
        assert not differ, (name, differ, bag(session, "SELECT * FROM X"))
