"""The scheduler end to end through ``session.refresh_due(now)`` with a controllable clock:
the reference's aligned examples, DOWNSTREAM chains, skipping after a stall, failing and
suspended upstreams, and a restart (a new session goes on from the catalog).

Times are offsets from an origin ``O`` in the near future (set for each test) that is a
multiple of every period used (3072 s), so the reference's times (0:00, 0:48, 1:36, ...)
come out exactly;
the tables are created ON_SCHEDULE, so their first tick is their initial refresh.
"""

from __future__ import annotations

import time

import pytest

from tests.pipelines.conftest import rows
from tests.pipelines.dynamic_tables.checks import assert_consistent, assert_same_as_query

S = 1_000_000  # µs
ORIGIN = 0  # set for each test: module import can be an hour before the test runs


@pytest.fixture(autouse=True)
def origin():
    """A multiple of 3072 s at least 10 minutes ahead: every tick a test names is in the
    future, so each refresh reads its sources' newest versions as it runs."""
    global ORIGIN
    ORIGIN = ((int(time.time()) + 600) // 3072 + 1) * 3072 * S


def at(minutes: int, seconds: int = 0) -> int:
    return ORIGIN + (minutes * 60 + seconds) * S


def ran(records):
    """(name, action or reason) of each history row a call returned, in order."""
    return [(r.name.rsplit(".", 1)[-1], r.action if r.action != "SKIPPED" else r.reason)
            for r in records]  # fmt: skip


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    return session


def create(session, name, lag, query):
    session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = {lag} INITIALIZE = ON_SCHEDULE "
                f"AS {query}")  # fmt: skip


def test_a_two_minute_table_over_a_one_minute_one(base):
    """The reference: A (2 min) reads B (1 min): B every 48 s, A every 96 s, together at
    0:00 and 1:36."""
    create(base, "B", "'1 minute'", "SELECT ID, V FROM T")
    create(base, "A", "'2 minutes'", "SELECT ID FROM B WHERE ID > 1")
    timeline = {
        at(0): [("B", "FULL"), ("A", "FULL")],
        at(0, 30): [],
        at(0, 48): [("B", "NO_DATA")],
        at(1, 36): [("B", "NO_DATA"), ("A", "NO_DATA")],
        at(2, 24): [("B", "NO_DATA")],
        at(2, 30): [],
    }
    for now, expected in timeline.items():
        assert ran(base.refresh_due(now)) == expected, (now - ORIGIN) / S
    base.sql("INSERT INTO T VALUES (3, 'c')")
    assert ran(base.refresh_due(at(3, 12))) == [("B", "INCREMENTAL"), ("A", "INCREMENTAL")]
    assert rows(base.sql("SELECT ID FROM A")) == [(2,), (3,)]
    stamps = {dt.data_timestamp_us for dt in base.catalog.list_dynamic_tables()}
    assert stamps == {at(3, 12)}  # one snapshot


def test_five_minutes_over_five_and_one(base):
    """The reference: A (5 min) reads B (5 min) and C (1 min): C every 48 s, A and B every
    192 s, on C's ticks; A with 4 minutes is refused."""
    create(base, "B", "'5 minutes'", "SELECT ID FROM T")
    create(base, "C", "'1 minute'", "SELECT ID FROM T WHERE ID > 1")
    create(base, "A", "'5 minutes'", "SELECT B.ID FROM B JOIN C ON B.ID = C.ID")
    expected = {
        at(0): ["B", "C", "A"], at(0, 48): ["C"], at(1, 36): ["C"], at(2, 24): ["C"],
        at(3, 12): ["B", "C", "A"], at(4, 0): ["C"], at(4, 48): ["C"], at(5, 36): ["C"],
        at(6, 24): ["B", "C", "A"],
    }  # fmt: skip
    for now, names in expected.items():
        assert [n for n, _ in ran(base.refresh_due(now))] == names, (now - ORIGIN) / S
    history = base.sql("SELECT DATA_TIMESTAMP FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
                       "NAME => 'A'))").collect()  # fmt: skip
    assert len(history) == 3


def test_downstream_chains(base):
    create(base, "D1", "DOWNSTREAM", "SELECT ID FROM T")
    create(base, "D2", "'10 minutes'", "SELECT ID FROM D1")
    create(base, "E1", "'10 minutes'", "SELECT ID FROM T")
    create(base, "E2", "DOWNSTREAM", "SELECT ID FROM E1")
    create(base, "F1", "DOWNSTREAM", "SELECT ID FROM T")
    create(base, "F2", "DOWNSTREAM", "SELECT ID FROM F1")
    assert sorted(n for n, _ in ran(base.refresh_due(at(0)))) == ["D1", "D2", "E1"]
    assert ran(base.refresh_due(at(3, 12))) == []
    assert sorted(n for n, _ in ran(base.refresh_due(at(6, 24)))) == ["D1", "D2", "E1"]


def test_a_stall_becomes_one_skipped_row_then_the_latest_tick(base):
    create(base, "B", "'1 minute'", "SELECT ID FROM T")
    assert ran(base.refresh_due(at(0))) == [("B", "FULL")]
    records = base.refresh_due(at(8, 20))  # ticks 0:48 ... 7:12 were missed
    assert ran(records) == [("B", "SCHEDULE_OVERRUN"), ("B", "NO_DATA")]
    assert records[0].skipped_ticks == 9
    assert records[1].data_timestamp_us == at(8, 0)
    assert ran(base.refresh_due(at(8, 20))) == []  # handled: nothing runs twice


def test_failing_and_suspended_upstreams_make_readers_skip(base):
    create(base, "B", "'1 minute'", "SELECT 10 / ID AS Q FROM T")
    create(base, "A", "'1 minute'", "SELECT Q FROM B")
    assert ran(base.refresh_due(at(0))) == [("B", "FULL"), ("A", "FULL")]
    base.sql("INSERT INTO T VALUES (0, 'zero')")
    failed = [("B", "FAILED"), ("A", "UPSTREAM_FAILED:DB.PUBLIC.B")]
    assert ran(base.refresh_due(at(0, 48))) == failed
    failed_again = [("B", "FAILED"), ("A", "UPSTREAM_FAILED:DB.PUBLIC.B")]
    assert ran(base.refresh_due(at(0, 50))) == []
    assert ran(base.refresh_due(at(0, 96))) == failed_again
    skips = [r for r in base.catalog.list_refreshes(base.require_table("A").id)
             if r.state == "SKIPPED"]  # fmt: skip
    assert [(r.reason, r.skipped_ticks) for r in skips] == [("UPSTREAM_FAILED:DB.PUBLIC.B", 2)]
    base.sql("DELETE FROM T WHERE ID = 0")
    base.sql("ALTER DYNAMIC TABLE B SUSPEND")
    assert ran(base.refresh_due(at(2, 24))) == [("A", "UPSTREAM_SUSPENDED:DB.PUBLIC.B")]
    base.sql("ALTER DYNAMIC TABLE B RESUME")  # B's tick missed while suspended: reported
    resumed = [("B", "SCHEDULE_OVERRUN"), ("B", "INCREMENTAL"), ("A", "NO_DATA")]
    assert ran(base.refresh_due(at(3, 12))) == resumed


def test_a_suspended_reader_stops_a_downstream_table_it_alone_needs(base):
    create(base, "D", "DOWNSTREAM", "SELECT ID FROM T")
    create(base, "A", "'1 minute'", "SELECT ID FROM D")
    assert ran(base.refresh_due(at(0))) == [("D", "FULL"), ("A", "FULL")]
    base.sql("ALTER DYNAMIC TABLE A SUSPEND")
    assert ran(base.refresh_due(at(0, 48))) == []


def test_a_new_session_goes_on_from_the_catalog(base, session_factory):
    create(base, "B", "'1 minute'", "SELECT ID FROM T")
    assert ran(base.refresh_due(at(0))) == [("B", "FULL")]
    assert ran(base.refresh_due(at(0, 48))) == [("B", "NO_DATA")]
    other = session_factory()  # same warehouse: as after a restart of the service
    assert ran(other.refresh_due(at(0, 50))) == []
    assert ran(other.refresh_due(at(1, 36))) == [("B", "NO_DATA")]


def test_a_query_reads_the_tables_of_one_graph_at_one_data_timestamp(base):
    create(base, "B", "'1 minute'", "SELECT ID, V FROM T")
    create(base, "A", "'2 minutes'", "SELECT ID FROM B")
    base.refresh_due(at(0))
    base.sql("INSERT INTO T VALUES (3, 'c')")
    assert ran(base.refresh_due(at(0, 48))) == [("B", "INCREMENTAL")]  # A still at 0:00
    assert rows(base.sql("SELECT ID FROM B")) == [(1,), (2,), (3,)]  # alone: its newest
    together = "SELECT B.ID, A.ID FROM B FULL OUTER JOIN A ON A.ID = B.ID"
    assert rows(base.sql(together)) == [(1, 1), (2, 2)]  # both as of 0:00
    base.sql("CREATE TABLE SNAP AS " + together.replace("B.ID, A.ID", "B.ID AS X, A.ID AS Y"))
    assert rows(base.sql("SELECT X, Y FROM SNAP")) == [(1, 1), (2, 2)]
    base.refresh_due(at(1, 36))
    assert rows(base.sql(together)) == [(1, 1), (2, 2), (3, 3)]


def test_adaptive_tables_go_full_on_schedule_for_one_large_change(base):
    """AUTO over stateless queries is ADAPTIVE: on schedule, 2,000 rows inserted into 2
    make B and A (reading B) refresh FULL (CHANGE_TOO_LARGE, the measure in the message);
    the next tick's one-row change is INCREMENTAL again. Both equal their queries."""
    create(base, "B", "'1 minute'", "SELECT ID, V FROM T")
    create(base, "A", "'1 minute'", "SELECT ID FROM B WHERE ID > 1")
    assert ran(base.refresh_due(at(0))) == [("B", "FULL"), ("A", "FULL")]
    base.sql("INSERT INTO T SELECT id, 'n' FROM range(10, 2010)")
    assert ran(base.refresh_due(at(0, 48))) == [("B", "FULL"), ("A", "FULL")]
    base.sql("UPDATE T SET V = 'u' WHERE ID = 2")
    base.sql("DELETE FROM T WHERE ID = 10")
    assert ran(base.refresh_due(at(1, 36))) == [("B", "INCREMENTAL"), ("A", "INCREMENTAL")]
    for name, query in (("B", "SELECT ID, V FROM T"), ("A", "SELECT ID FROM T WHERE ID > 1")):
        assert_same_as_query(base, name, query)
        assert_consistent(base, name)
        history = base.catalog.list_refreshes(base.require_table(name).id)
        assert [(r.trigger, r.action, r.reason) for r in history] == [
            ("SCHEDULED", "INCREMENTAL", ""),
            ("SCHEDULED", "FULL", "CHANGE_TOO_LARGE"),
            ("INITIAL", "FULL", ""),
        ]
        assert "changed 2,000 rows" in history[1].error, history[1].error
        assert "changed 2 rows" in history[0].error, history[0].error
