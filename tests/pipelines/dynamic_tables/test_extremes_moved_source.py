"""A dynamic table that keeps MIN and MAX as aggregation state (hidden state columns per
group, pipelines/incremental/extremes.py) whose source moved behaves as a stateless
table does (test_moved_source.py, docs/dynamic-tables.md "Failures"): renamed away, its
refresh fails with SOURCE_RENAMED; dropped, SOURCE_DROPPED; replaced (CREATE OR REPLACE
TABLE, or dropped or renamed away and another created under the name),
SOURCE_REPLACED. A failed refresh changes nothing: not the rows, not the hidden state,
not the data timestamp. Renamed back, the same table refreshes again, INCREMENTAL, with
every change made meanwhile (under the other name too), extremes lost included; CREATE
OR REPLACE DYNAMIC TABLE defines it again over what exists now. The source is read
directly or through a view."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flush.tables import state_columns
from pipelines import Session, SqlError
from tests.pipelines.dynamic_tables.checks import bag

SOURCE = "CREATE TABLE R (ID NUMBER, G VARCHAR, X INT, T VARCHAR)"
ROWS = ("(1, 'a', 1, 'p'), (2, 'a', 5, 'q'), (3, 'b', 2, 'z'), (4, 'b', 9, 'a'), "
        "(5, 'c', 4, NULL), (6, NULL, 8, 'n')")  # fmt: skip
QUERY = ("SELECT G, min(X) AS LO, max(X) AS HI, max(T) AS MT, count(*) AS N, sum(X) AS S "
         "FROM {reads} GROUP BY G")  # fmt: skip


@pytest.fixture(params=["table"])
def reads(request, session):
    """R with its rows, and D (its MIN/MAX over R, or over view RV of R: the first test
    only, the suite's time), created."""
    session.sql(SOURCE)
    session.sql(f"INSERT INTO R VALUES {ROWS}")
    name = "R"
    if request.param == "view":
        session.sql("CREATE VIEW RV AS SELECT ID, G, X, T FROM R")
        name = "RV"
    _define(session, "D", name)
    assert state_columns(pa.schema(DeltaTable(session.require_table("D").uri).schema()))
    return name


def _define(session: Session, name: str, reads: str) -> None:
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
                f"REFRESH_MODE = INCREMENTAL AS {QUERY.format(reads=reads)}")  # fmt: skip


def hidden_state(session: Session, name: str) -> dict:
    """Each group's (G's) hidden state columns, by name; an exact sum's state (a DECIMAL
    beside its count of non-NULL values) None where it counts no value: a table keeps 0
    or NULL there (the sum is NULL either way; one created fresh has NULL)."""
    table = DeltaTable(session.require_table(name).uri)
    schema = pa.schema(table.schema())
    names = state_columns(schema)
    found = table.to_pyarrow_table(columns=["G", *names]).to_pylist()
    for row in found:
        for c in names:
            if pa.types.is_decimal(schema.field(c).type) and row.get(f"{c}_N") == 0:
                row[c] = None
    return {row.pop("G"): row for row in found}


def snapshot(session: Session) -> tuple:
    """D's rows, hidden state, data timestamp and Delta version."""
    info = session.require_table("D")
    dt = session.catalog.get_dynamic_table(info.id)
    assert dt is not None
    return (bag(session, "SELECT * FROM D"), hidden_state(session, "D"), dt.data_timestamp_us,
            DeltaTable(info.uri).version())  # fmt: skip


def history(session: Session) -> list[tuple]:
    table = session.require_table("D")
    return [(r.trigger, r.state, r.action if r.state == "SUCCEEDED" else r.reason)
            for r in session.catalog.list_refreshes(table.id)]  # fmt: skip


def fails(session: Session, reason: str) -> str:
    """D's manual refresh fails with ``reason`` and changes nothing; its message."""
    before = snapshot(session)
    with pytest.raises(SqlError, match=reason) as failed:
        session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert snapshot(session) == before
    assert history(session)[0] == ("MANUAL", "FAILED", reason)
    return str(failed.value)


def assert_fresh(session: Session, reads: str) -> None:
    """D equals its query run fresh, and its state that of a table created now."""
    assert bag(session, "SELECT * FROM D") == bag(session, QUERY.format(reads=reads))
    _define(session, "D_FRESH", reads)
    assert hidden_state(session, "D") == hidden_state(session, "D_FRESH")


def refreshes_incrementally(session: Session, reads: str) -> None:
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert history(session)[0] == ("MANUAL", "SUCCEEDED", "INCREMENTAL")
    assert_fresh(session, reads)


@pytest.mark.parametrize("reads", ["table", "view"], indirect=True)
def test_renamed_away_and_back_refreshes_every_change_made_meanwhile(session, reads):
    session.sql("DELETE FROM R WHERE ID = 1")  # a's MIN, before the rename
    session.sql("ALTER TABLE R RENAME TO R_OLD")
    assert "renamed to DB.PUBLIC.R_OLD" in fails(session, "SOURCE_RENAMED")
    # Changed under its other name: b's MAX updated away, c given a new MIN, a new group.
    session.sql("UPDATE R_OLD SET X = 3 WHERE ID = 4")
    session.sql("INSERT INTO R_OLD VALUES (7, 'c', -4, 'zz'), (8, 'd', NULL, NULL)")
    fails(session, "SOURCE_RENAMED")  # again: nothing counted twice, nothing changed
    session.sql("ALTER TABLE R_OLD RENAME TO R")
    refreshes_incrementally(session, reads)
    assert history(session) == [("MANUAL", "SUCCEEDED", "INCREMENTAL"),
                                ("MANUAL", "FAILED", "SOURCE_RENAMED"),
                                ("MANUAL", "FAILED", "SOURCE_RENAMED"),
                                ("INITIAL", "SUCCEEDED", "FULL")]  # fmt: skip
    session.sql("DELETE FROM R WHERE ID = 7")  # c's new MIN lost again
    refreshes_incrementally(session, reads)


def test_renamed_away_and_another_created_under_the_name(session, reads):
    session.sql("ALTER TABLE R RENAME TO R_OLD")
    fails(session, "SOURCE_RENAMED")
    session.sql(SOURCE)
    session.sql(f"INSERT INTO R VALUES {ROWS}")  # the same rows: another table still
    fails(session, "SOURCE_REPLACED")
    _mend(session, reads)


def test_dropped_then_created_again(session, reads):
    session.sql("DELETE FROM R WHERE ID = 4")  # b's MAX, never refreshed
    session.sql("DROP TABLE R")
    fails(session, "SOURCE_DROPPED")
    session.sql(SOURCE)
    session.sql("INSERT INTO R VALUES (10, 'a', 100, 'x')")
    fails(session, "SOURCE_REPLACED")
    _mend(session, reads)


def test_replaced_by_create_or_replace_table(session, reads):
    session.sql("CREATE OR REPLACE TABLE R (ID NUMBER, G VARCHAR, X INT, T VARCHAR)")
    session.sql("INSERT INTO R VALUES (20, 'b', 0, 'y'), (21, 'b', 0, NULL)")
    fails(session, "SOURCE_REPLACED")
    fails(session, "SOURCE_REPLACED")
    _mend(session, reads)


def _mend(session: Session, reads: str) -> None:
    """CREATE OR REPLACE DYNAMIC TABLE D reads the R of now (through a view: RV, which
    reads R by name, so it is the view of the new R); its state is the new R's, and it
    refreshes INCREMENTAL from there, extremes lost included."""
    session.sql("INSERT INTO R VALUES (40, 'b', 7, 'k'), (41, 'b', 50, 'l')")
    _define(session, "D", reads)
    assert history(session) == [("INITIAL", "SUCCEEDED", "FULL")]
    assert_fresh(session, reads)
    session.sql("DELETE FROM R WHERE ID = 41")  # b's MAX: b is aggregated again
    session.sql("INSERT INTO R VALUES (30, 'e', 1, 'e'), (31, NULL, NULL, NULL)")
    refreshes_incrementally(session, reads)


def test_scheduled_refreshes_fail_and_readers_skip_until_renamed_back(session):
    """Through the scheduler (a controlled clock, as test_moved_source.py): one FAILED
    row whose count of ticks grows, its reader SKIPPED (UPSTREAM_FAILED), and after the
    rename back both refresh INCREMENTAL at one data timestamp."""
    from tests.pipelines.dynamic_tables.test_moved_source import ran

    origin = ((int(time.time()) + 600) // 3072 + 1) * 3072 * 1_000_000  # a tick ahead

    def at(seconds: int) -> int:
        return origin + seconds * 1_000_000

    session.sql(SOURCE)
    session.sql(f"INSERT INTO R VALUES {ROWS}")
    for name, query in (("D", QUERY.format(reads="R")), ("D_DOWN", "SELECT G, HI FROM D")):
        session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' INITIALIZE = "
                    f"ON_SCHEDULE REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip
    assert ran(session.refresh_due(at(0))) == {"D": "FULL", "D_DOWN": "FULL"}
    session.sql("DELETE FROM R WHERE ID = 4")  # b's MAX
    session.sql("ALTER TABLE R RENAME TO R_OLD")
    before = snapshot(session)
    failed = {"D": "SOURCE_RENAMED", "D_DOWN": "UPSTREAM_FAILED:DB.PUBLIC.D"}
    assert ran(session.refresh_due(at(48))) == failed
    assert ran(session.refresh_due(at(96))) == failed
    assert snapshot(session) == before
    table = session.require_table("D")
    newest = session.catalog.list_refreshes(table.id, limit=1)[0]
    assert (newest.trigger, newest.state, newest.reason, newest.skipped_ticks) == (
        "SCHEDULED", "FAILED", "SOURCE_RENAMED", 1)  # fmt: skip
    session.sql("ALTER TABLE R_OLD RENAME TO R")
    assert ran(session.refresh_due(at(144))) == {"D": "INCREMENTAL", "D_DOWN": "INCREMENTAL"}
    assert_fresh(session, "R")
    assert bag(session, "SELECT * FROM D_DOWN") == bag(session, "SELECT G, HI FROM D")
