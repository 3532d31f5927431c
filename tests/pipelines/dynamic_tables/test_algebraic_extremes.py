"""MIN and MAX kept as aggregation state (pipelines/incremental/extremes.py): a change
that inserts, or deletes values beyond a group's extreme, refreshes from the change and
the table alone (the source's rows are not read); a change that deletes a value equal to
a group's extreme (the extreme itself, a duplicate of it, -0.0 for 0.0) recomputes that
group, and that group only, from its rows. Every refresh is INCREMENTAL and leaves the
table equal to its query run fresh."""

from __future__ import annotations

import pytest

import pipelines.incremental.delta as delta_module
import pipelines.incremental.extremes as extremes_module
from pipelines import Session
from tests.pipelines.dynamic_tables.batched import assert_all_same_as_queries
from tests.pipelines.dynamic_tables.checks import (
    assert_same_as_query,
    create_incremental,
    record_engine_refreshes,
    scanned,
)

SOURCE = ("CREATE TABLE X (ID NUMBER, K VARCHAR, I INT, N NUMBER(10, 2), F DOUBLE, "
          "S VARCHAR, D DATE, T TIMESTAMP, L TIMESTAMP_LTZ)")  # fmt: skip
ROWS = ("(1, 'a', 5, 1.50, 1.5, 'm', DATE'2024-03-01', TIMESTAMP'2024-03-01 10:00:00', "
        "TIMESTAMP'2024-03-01 10:00:00'), "
        "(2, 'a', 3, -2.25, CAST('-0.0' AS DOUBLE), 'c', DATE'2024-01-01', "
        "TIMESTAMP'2024-01-01 00:00:00', TIMESTAMP'2024-01-01 00:00:00'), "
        "(3, 'a', 9, 7.00, NULL, NULL, NULL, NULL, NULL), "
        "(4, 'b', 2, 0.00, 0.0, 'b', DATE'2023-12-31', TIMESTAMP'2023-12-31 23:59:59', "
        "TIMESTAMP'2023-12-31 23:59:59'), "
        "(5, 'b', NULL, NULL, CAST('NaN' AS DOUBLE), 'zz', DATE'2025-06-01', "
        "TIMESTAMP'2025-06-01 12:00:00', TIMESTAMP'2025-06-01 12:00:00'), "
        "(6, NULL, -3, 3.33, CAST('-Infinity' AS DOUBLE), '', DATE'2020-02-29', "
        "TIMESTAMP'2020-02-29 00:00:00', TIMESTAMP'2020-02-29 00:00:00')")  # fmt: skip
_ALL = ", ".join(f"min({c}) AS MIN_{c}, max({c}) AS MAX_{c}" for c in "INFSDTL")
QUERIES = {
    "typed": f"SELECT K, {_ALL}, count(*) AS C FROM X GROUP BY K",
    "mixed": "SELECT K, sum(I) AS S, max(I) - min(I) AS W, avg(N) AS M, min(F) AS LO "
             "FROM X GROUP BY K",
    "scalar": "SELECT min(I) AS LO, max(F) AS HI, count(F) AS C, max(S) AS MS FROM X",
}
#: Each step, then the groups (of K) whose rows the refresh of "typed" reads again (a
#: value deleted that equals an extreme of one of its columns; empty: the source's rows
#: are not read at all). Two cases of two groups share a step (cut for time from 8 steps).
STEPS: list[tuple[str, set]] = [
    ("INSERT INTO X VALUES (7, 'a', 9, 9.99, CAST('Infinity' AS DOUBLE), 'zzz', "
     "DATE'2030-01-01', TIMESTAMP'2030-01-01 00:00:00', TIMESTAMP'2030-01-01 00:00:00'), "
     "(8, 'c', NULL, NULL, NULL, NULL, NULL, NULL, NULL), "
     "(9, 'b', 1, -9.00, 0.0, 'a', DATE'2001-01-01', TIMESTAMP'2001-01-01 00:00:00', "
     "TIMESTAMP'2001-01-01 00:00:00'), (10, 'c', 4, 4.00, 4.0, 'c', DATE'2024-04-04', "
     "TIMESTAMP'2024-04-04 04:04:04', TIMESTAMP'2024-04-04 04:04:04')",
     set()),  # inserts only: NULLs, infinities, a new group
    ("DELETE FROM X WHERE ID = 1", set()),  # no value of row 1 is an extreme of a
    # 3: I = 9, one of a's two maxima of I; 4: b's maximum of I, one of its minima of F
    ("DELETE FROM X WHERE ID IN (3, 4)", {"a", "b"}),
    ("UPDATE X SET F = 0.0 WHERE ID = 2", {"a"}),  # a's -0.0, its minimum of F (= 0.0)
    # 7: a's maxima move to c; 5: b's NaN, its maximum of F, gone
    ("UPDATE X SET K = CASE ID WHEN 7 THEN 'c' ELSE K END, "
     "F = CASE ID WHEN 5 THEN 1.0 ELSE F END WHERE ID IN (5, 7)", {"a", "b"}),
    ("DELETE FROM X WHERE K = 'a' OR K IS NULL", {"a", None}),  # groups gone (one NULL)
]


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("extremes") / "warehouse", spark=spark)
    session.sql(SOURCE)
    session.sql(f"INSERT INTO X VALUES {ROWS}")
    create_incremental(session, {f"E_{name}": query for name, query in QUERIES.items()})
    yield session
    session.close()


def test_min_and_max_are_kept_from_the_change(wh, monkeypatch):
    built = record_engine_refreshes(monkeypatch)
    restricted: list[set] = []
    original = delta_module.Deltas.restricted

    def recording(self, rows, keys, touched):
        restricted[-1] |= {row[0] for row in touched.select("_INGEST_K0").collect()}
        return original(self, rows, keys, touched)

    monkeypatch.setattr(delta_module.Deltas, "restricted", recording)
    checked: list[int] = []  # the refreshes that looked for groups that lost an extreme
    unsafe = extremes_module.unsafe
    monkeypatch.setattr(extremes_module, "unsafe",
                        lambda *args: checked.append(1) or unsafe(*args))  # fmt: skip
    tables = {f"E_{name}": query for name, query in QUERIES.items()}
    assert_all_same_as_queries(wh, tables, "the first refresh")
    for step, recomputed in STEPS:
        wh.sql(step)
        for name in QUERIES:
            built.clear()
            checked.clear()
            restricted.append(set())
            status = wh.sql(f"ALTER DYNAMIC TABLE E_{name} REFRESH").collect()[0].status
            assert "INCREMENTAL" in status, (name, step, status)
            assert len(built) == 1 and built[0].layout is not None, (name, step)
            if name == "typed":  # only the groups that lost an extreme are read
                assert restricted[-1] == recomputed, step
                assert scanned(wh, built[0], "X") == bool(recomputed), step
            elif step.startswith("INSERT"):  # the others: inserts never read the source
                assert not scanned(wh, built[0], "X"), (name, step)
            if step.startswith("INSERT"):  # nothing deleted: no job looks for lost extremes
                assert not checked, (name, step)
            elif recomputed and name == "typed":
                assert checked, step
        assert_all_same_as_queries(wh, tables, step)


def test_tables_without_state_keep_recomputing(wh, monkeypatch):
    """MIN of a BINARY keeps no state, nor does a MIN table created before MIN was kept
    (made here by hiding MIN from the state while it is created): both refresh
    INCREMENTAL by recomputing their touched groups."""
    import pyarrow as pa
    from deltalake import DeltaTable

    import pipelines.incremental.extremes as extremes
    from flush.tables import state_columns

    queries = {"E_BINARY": "SELECT K, min(CAST(S AS BINARY)) AS B, max(I) AS HI FROM X "
                           "GROUP BY K",
               "E_OLD": "SELECT K, min(F) AS LO, sum(I) AS S FROM X GROUP BY K"}  # fmt: skip
    with monkeypatch.context() as patched:
        patched.setattr(extremes, "kept", lambda aggregate: (
            False if aggregate.getClass().getSimpleName() in ("Min", "Max") else None))
        wh.sql(f"CREATE DYNAMIC TABLE E_OLD TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL "
               f"AS {queries['E_OLD']}")  # fmt: skip
    wh.sql(f"CREATE DYNAMIC TABLE E_BINARY TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL "
           f"AS {queries['E_BINARY']}")  # fmt: skip
    wh.sql("INSERT INTO X VALUES (11, 'c', 7, NULL, -1.0, 'q', NULL, NULL, NULL)")
    for name, query in queries.items():
        uri = wh.require_table(name).uri
        assert state_columns(pa.schema(DeltaTable(uri).schema())) == [], name
        status = wh.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status
        assert "INCREMENTAL" in status, (name, status)
        assert_same_as_query(wh, name, query)
    typed = state_columns(pa.schema(DeltaTable(wh.require_table("E_typed").uri).schema()))
    assert len(typed) == 1 + 2 * 2 * len("INFSDTL") + 1  # rows, 14 extremes, count(*)
