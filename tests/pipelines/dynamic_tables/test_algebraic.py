"""Aggregations maintained from their change alone (pipelines/incremental/algebraic.py): a
dynamic table whose query ends in a GROUP BY or a scalar aggregate of COUNTs, exact SUMs
and AVGs of integers and decimals, MINs and MAXs keeps hidden state per group, and its
incremental refreshes read the source's changes and the table, not the source's rows
(but the rows of a group that lost a value equal to its MIN or MAX). Every refresh is INCREMENTAL and leaves
the table equal to its query run fresh (as a multiset); readers never see the state."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flush.tables import state_columns
from pipelines import Session
from tests.pipelines.dynamic_tables.batched import assert_all_same_as_queries
from tests.pipelines.dynamic_tables.checks import (
    assert_same_as_query,
    create_incremental,
    record_engine_refreshes,
    scanned,
)

#: E: a decimal of 8 decimals, whose sums a Spark addition past 38 digits would round.
SOURCE = ("CREATE TABLE A (ID NUMBER, K VARCHAR, V INT, D NUMBER(10, 2), B BIGINT, "
          "E NUMBER(20, 8))")  # fmt: skip
ROWS = ("(1, 'a', 1, 1.50, 9223372036854775000, 0.00000001), (2, 'a', NULL, NULL, 700, NULL), "
        "(3, 'b', 3, 2.25, NULL, 1.23456789), (4, NULL, 4, -1.00, 1, -0.00000005), "
        "(5, 'c', NULL, 0.00, 2, 99999999999.99999999)")  # fmt: skip
#: Each step is followed by a refresh of every table. (Cut for time from 8 steps, then 6,
#: then 4: cases of other rows share a step; the inserts into groups that are, are new
#: and come back are one step; every group goes at once.)
STEPS: list[str | list[str]] = [
    # 1: a row moves to another group; 3: sums lose a value, counts a row
    ["UPDATE A SET K = CASE ID WHEN 1 THEN 'b' ELSE K END, V = CASE ID WHEN 3 THEN NULL "
     "ELSE V END, D = CASE ID WHEN 3 THEN NULL ELSE D END WHERE ID IN (1, 3)",
     "DELETE FROM A WHERE K = 'c'",  # a group is gone
     "UPDATE A SET V = 0 WHERE ID = 2"],  # a row the sum of V counts now, worth 0
    # 6: into a group that is; 7: a new group of NULLs; 8: the group gone comes back
    "INSERT INTO A VALUES (6, 'b', 6, 0.01, 6, 0.00000003), (7, 'd', NULL, NULL, NULL, NULL), "
    "(8, 'c', 80, 8.00, 8, 0.00000001)",
    "DELETE FROM A",  # every group gone; the scalar aggregates stay, at zero rows
]

#: Queries the state maintains (each table keeps state columns).
KEPT = {
    "counts_and_sums": "SELECT K, count(*) AS N, count(V) AS NV, sum(V) AS S, sum(D) AS SD, "
                       "sum(E) AS SE, avg(E) AS ME FROM A GROUP BY K",
    "expressions": "SELECT concat(K, '!') AS KX, sum(V) * 2 + count(*) AS X, "
                   "sum(D) / 4 AS Q, count(V, D) AS BOTH, avg(D) AS M, "
                   "sum(D) - avg(D) AS R FROM A GROUP BY K",
    "key_expressions": "SELECT V % 2 AS M, ID % 2 AS P, count(*) AS N, sum(B) AS SB FROM A "
                       "GROUP BY V % 2, ID % 2",
    "scalar": "SELECT count(*) AS N, sum(V) AS S, sum(D) AS SD, count(K) AS NK, avg(D) AS M, "
              "avg(V) AS MV, avg(CAST(D AS DECIMAL(30, 4))) AS MW FROM A",
    "projected": "SELECT S, N FROM (SELECT K, sum(V) AS S, count(*) AS N FROM A GROUP BY K)",
    "min_max": "SELECT K, min(V) AS LO, max(D) AS HI FROM A GROUP BY K",
}
#: Kept tables that read a group's rows again when it lost its MIN or MAX.
EXTREMES = {"min_max"}
#: Queries that keep recomputing the touched groups (no state columns; their refreshes
#: are the engine property test's).
RECOMPUTED = {
    "having": "SELECT K, sum(V) AS S FROM A GROUP BY K HAVING count(*) > 1",
    "others": "SELECT K, avg(CAST(V AS DOUBLE)) AS M, count(DISTINCT V) AS DV, "
              "sum(CAST(V AS DOUBLE)) AS F FROM A GROUP BY K",
}


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("algebraic") / "warehouse", spark=spark)
    session.sql(SOURCE)
    session.sql(f"INSERT INTO A VALUES {ROWS}")
    create_incremental(session, {f"G_{n}": q for n, q in {**KEPT, **RECOMPUTED}.items()})
    yield session
    session.close()


@pytest.fixture
def built(monkeypatch):
    """The Deltas of each incremental refresh, as the refresh used them."""
    return record_engine_refreshes(monkeypatch)


def _state(session: Session, name: str) -> list[str]:
    return state_columns(pa.schema(DeltaTable(session.require_table(name).uri).schema()))


def test_which_tables_keep_state(wh):
    for name in KEPT:
        assert _state(wh, f"G_{name}"), name
    for name in RECOMPUTED:
        assert _state(wh, f"G_{name}") == [], name


def test_every_refresh_is_incremental_and_exact(wh, built):
    tables = {f"G_{name}": query for name, query in KEPT.items()}
    assert_all_same_as_queries(wh, tables, "the first refresh")
    for step in STEPS:
        for statement in [step] if isinstance(step, str) else step:
            wh.sql(statement)
        inserts_only = isinstance(step, str) and step.startswith("INSERT")
        built.clear()
        for name in tables:
            status = wh.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status
            assert "INCREMENTAL" in status, (name, step, status)
        assert_all_same_as_queries(wh, tables, step)
        assert len(built) == len(KEPT) and all(d.layout is not None for d in built), step
        for name, deltas in zip(KEPT, built, strict=True):  # the state path reads A's
            if name not in EXTREMES or inserts_only:  # changes, not its rows
                assert not scanned(wh, deltas, "A"), (name, step)


def test_readers_never_see_the_state(wh):
    name = "G_counts_and_sums"
    columns = ["K", "N", "NV", "S", "SD", "SE", "ME"]
    assert wh.sql(f"SELECT * FROM {name}").columns == columns
    assert [r[0] for r in wh.sql(f"DESCRIBE TABLE {name}").collect()] == columns
    version = DeltaTable(wh.require_table(name).uri).version()
    assert wh.sql(f"SELECT * FROM {name} AT (VERSION => {version})").columns == columns
    wh.sql(f"CREATE STREAM G_STREAM ON TABLE {name}")
    assert [c for c in wh.sql("SELECT * FROM G_STREAM").columns
            if not c.startswith("METADATA$")] == columns  # fmt: skip


def test_a_change_of_the_state_alone_shows_in_no_stream(wh):
    """A row counted by nothing the table shows (a NULL V) changes the group's hidden
    row count only: the table's row is rewritten with its new state, and a stream on
    the table sees no change."""
    wh.sql("CREATE OR REPLACE DYNAMIC TABLE G_SUMS TARGET_LAG = '1 hour' "
           "REFRESH_MODE = INCREMENTAL AS SELECT K, sum(V) AS S FROM A GROUP BY K")
    assert _state(wh, "G_SUMS")
    wh.sql("INSERT INTO A VALUES (20, 'x', 5, NULL, NULL, NULL)")
    wh.sql("ALTER DYNAMIC TABLE G_SUMS REFRESH")
    wh.sql("CREATE STREAM G_SUMS_STREAM ON TABLE G_SUMS")
    uri = wh.require_table("G_SUMS").uri
    before = DeltaTable(uri).version()
    wh.sql("INSERT INTO A VALUES (21, 'x', NULL, NULL, NULL, NULL)")
    status = wh.sql("ALTER DYNAMIC TABLE G_SUMS REFRESH").collect()[0].status
    assert "INCREMENTAL" in status, status
    assert DeltaTable(uri).version() == before + 1  # the state changed: a commit
    assert wh.sql("SELECT count(*) FROM G_SUMS_STREAM").collect()[0][0] == 0
    wh.sql("DELETE FROM A WHERE ID = 20")  # x's sum is NULL now, its row count 1
    wh.sql("ALTER DYNAMIC TABLE G_SUMS REFRESH")
    assert [tuple(r) for r in wh.sql("SELECT K, S FROM G_SUMS WHERE K = 'x'").collect()] == [
        ("x", None)]
    assert wh.sql("SELECT count(*) FROM G_SUMS_STREAM").collect()[0][0] == 2  # an update
    wh.sql("DELETE FROM A WHERE ID = 21")
    wh.sql("ALTER DYNAMIC TABLE G_SUMS REFRESH")
    assert wh.sql("SELECT count(*) FROM G_SUMS WHERE K = 'x'").collect()[0][0] == 0
    assert_same_as_query(wh, "G_SUMS", "SELECT K, sum(V) AS S FROM A GROUP BY K")
