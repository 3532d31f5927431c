"""What an incremental refresh by the query-delta engine reads: a source that did not
change since the last refresh adds no term to a join's delta, and a semi, anti or
one-sided outer join whose other side did not change reads its kept side's changes
only, not the kept side's rows (the refresh's work grows with the change).

Checked on the plan of the refresh's net change (the Deltas the refresh really built,
recorded on the way), and on the table's content against its query run fresh."""

from __future__ import annotations

import re

import pytest

from pipelines import Session
from tests.pipelines.dynamic_tables.checks import (
    assert_same_as_query,
    record_engine_refreshes,
    scanned,
)


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("engine_reads") / "warehouse", spark=spark)
    session.sql("CREATE TABLE F (ID NUMBER, K NUMBER, V NUMBER)")
    session.sql("CREATE TABLE D (K NUMBER, NAME VARCHAR(10))")
    session.sql("INSERT INTO D VALUES (1, 'one'), (2, 'two'), (NULL, 'none')")
    session.sql("INSERT INTO F VALUES (1, 1, 10), (2, 2, 20), (3, NULL, 30), (4, 5, 40)")
    yield session
    session.close()


@pytest.fixture
def built(monkeypatch):
    """The Deltas of each incremental refresh, as the refresh used them."""
    return record_engine_refreshes(monkeypatch)


def _refresh(session: Session, name: str, query: str) -> None:
    session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
    assert_same_as_query(session, name, query)


@pytest.mark.parametrize("join", ["JOIN", "LEFT JOIN", "RIGHT JOIN"])
def test_a_change_on_one_side_reads_the_other_side_only(wh, built, join):
    name = "R_" + join.split()[0]
    kept_left = join != "RIGHT JOIN"
    query = (f"SELECT F.ID, F.V, D.NAME FROM F {join} D ON F.K = D.K" if kept_left
             else f"SELECT F.ID, F.V, D.NAME FROM D {join} F ON F.K = D.K")  # fmt: skip
    wh.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
           f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    wh.sql("UPDATE F SET V = V + 1 WHERE ID IN (1, 3)")
    wh.sql("INSERT INTO F VALUES (9, 2, 90)")
    _refresh(wh, name, query)
    assert len(built) == 1
    assert not scanned(wh, built[0], "F"), "F's rows were read: only its changes should be"
    assert scanned(wh, built[0], "D")  # the side that did not change is joined with
    wh.sql("UPDATE D SET NAME = 'uno' WHERE K = 1")  # now the other side changes alone
    _refresh(wh, name, query)
    assert len(built) == 2
    if join == "JOIN":  # the two-term rule: D's change joined with F as it was
        assert scanned(wh, built[1], "F")


def test_semi_and_anti_joins_read_the_kept_sides_changes(wh, built):
    queries = {
        "R_SEMI": "SELECT ID, V FROM F WHERE K IN (SELECT K FROM D)",
        "R_ANTI": "SELECT ID, V FROM F WHERE K NOT IN (SELECT K FROM D WHERE K IS NOT NULL)",
    }
    for name, query in queries.items():
        wh.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
               f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    wh.sql("UPDATE F SET K = 2 WHERE ID = 4")
    wh.sql("DELETE FROM F WHERE ID = 2")
    for name, query in queries.items():
        _refresh(wh, name, query)
    assert len(built) == 2
    assert not any(scanned(wh, deltas, "F") for deltas in built)


def test_nothing_changed_below_an_aggregate_reads_nothing(wh, built):
    query = "SELECT D.K, count(*) AS N FROM D GROUP BY D.K"
    other = "SELECT F.K, count(DISTINCT F.V) AS S FROM F GROUP BY F.K"  # no state: recomputed
    for name, text in (("R_AGG_D", query), ("R_AGG_F", other)):
        wh.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
               f"REFRESH_MODE = INCREMENTAL AS {text}")  # fmt: skip
    wh.sql("INSERT INTO F VALUES (10, 1, 100)")
    _refresh(wh, "R_AGG_F", other)
    assert scanned(wh, built[0], "F")  # the touched group is recomputed from F
    _refresh(wh, "R_AGG_D", query)  # D did not change: NO_DATA, no engine at all
    assert len(built) == 1


def _version(session: Session, table: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(session.require_table(table).uri).version()


def _files(session: Session, table: str, version: int) -> set[str]:
    from deltalake import DeltaTable

    uri = session.require_table(table).uri
    return {re.sub(r"^file:/*", "/", f) for f in DeltaTable(uri, version=version).file_uris()}


@pytest.mark.parametrize("query", [
    "SELECT K, count(*) AS N, sum(V) AS S, max(V) AS M FROM F GROUP BY K",
    "SELECT K + 1 AS K1, sum(V) AS S FROM F GROUP BY K HAVING count(*) > 0",
    "SELECT count(*) AS N, min(V) AS M FROM F",
], ids=["group_by", "having", "scalar"])  # fmt: skip
def test_an_aggregate_reads_its_old_groups_from_the_table_itself(wh, built, query):
    """The touched groups' rows at the old versions are the dynamic table's own rows:
    the source is read at the new version only (no file the change removed)."""
    name = "R_KEPT"
    wh.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
           f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    before = _version(wh, "F")
    wh.sql("UPDATE F SET V = V + 1 WHERE K = 1")
    wh.sql("DELETE FROM F WHERE ID = 10")
    wh.sql("INSERT INTO F VALUES (11, 7, 70), (12, NULL, 5)")
    after = _version(wh, "F")
    _refresh(wh, name, query)
    read = {re.sub(r"^file:/*", "/", path) for path in built[0].net().inputFiles()}
    gone = _files(wh, "F", before) - _files(wh, "F", after)
    assert gone, "the change removed no file: the test checks nothing"
    assert not read & gone, "F was read at the old version"
    assert scanned(wh, built[0], name)  # the old groups come from the table
