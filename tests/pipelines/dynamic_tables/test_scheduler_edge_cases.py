"""The scheduler at its edges: clocks going backwards, ticks far in the past or the
future, a chain of thirty tables with a suspended middle, a downstream table nothing
reads, one data timestamp for the tables of one graph, and another client's refresh of
an upstream while a reader refreshes.

Written by the adversarial review of dynamic tables (issue 19; see
``test_refresh_exactly_once``). Among these are regression tests of defects the review
found and commit 9f00a2c fixed (a far-future tick blocking manual refreshes, reads of one
graph at two data timestamps, an upstream's later refresh failing a reader).
"""

from __future__ import annotations

import contextlib
import time

import pytest

import pipelines.dynamic_tables.definition as definition
from flush.commit_clock import clock
from pipelines import SqlError
from tests.pipelines.dynamic_tables.checks import assert_same_as_query

S = 1_000_000  # µs


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    return session


def test_clocks_going_backwards_and_far_past_ticks_run_nothing(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID, V FROM T")
    now = clock()
    base.refresh_due(now)  # the tick at or before now: NO_DATA, or nothing if before D
    count = len(base.catalog.list_refreshes())
    for moment in (now - 1, now - 3600 * S, 0, 1, -(2**62)):
        assert base.refresh_due(moment) == []
    assert len(base.catalog.list_refreshes()) == count
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(base, "D", "SELECT ID, V FROM T")


def test_a_far_future_tick_does_not_freeze_the_table(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID, V FROM T")
    with contextlib.suppress(SqlError):  # refusing such a tick is fine
        base.refresh_due(clock() + 100 * 365 * 86_400 * S)
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(base, "D", "SELECT ID, V FROM T")


def test_a_far_future_tick_does_not_stop_the_schedule(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID, V FROM T")
    with pytest.raises(SqlError, match="past the commit clock"):
        base.refresh_due(clock() + 100 * 365 * 86_400 * S)
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.refresh_due(clock() + 60 * S)  # the next regular tick
    assert_same_as_query(base, "D", "SELECT ID, V FROM T")


def test_a_chain_of_thirty_with_a_suspended_middle(base):
    """D1 <- D2 <- ... <- D30 (DOWNSTREAM but the last, 1 minute). Suspending D15 stops
    D1..D14 (no active reader) and makes D16..D30 skip; RESUME brings every table to
    its query at one data timestamp."""
    origin = (int(time.time()) // 3072 + 1) * 3072 * S
    count = 30
    for i in range(1, count + 1):
        source = "T" if i == 1 else f"D{i - 1}"
        lag = "'1 minute'" if i == count else "DOWNSTREAM"
        base.sql(f"CREATE DYNAMIC TABLE D{i} TARGET_LAG = {lag} INITIALIZE = ON_SCHEDULE AS "
                 f"SELECT ID + 1 AS ID, V FROM {source}")  # fmt: skip
    assert [r.action for r in base.refresh_due(origin)] == ["FULL"] * count
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.sql("ALTER DYNAMIC TABLE D15 SUSPEND")
    skipped = base.refresh_due(origin + 48 * S)
    assert [r.name.rsplit(".", 1)[1] for r in skipped] == [f"D{i}" for i in range(16, count + 1)]
    assert {r.reason.split(":")[0] for r in skipped} == {"UPSTREAM_SUSPENDED", "UPSTREAM_SKIPPED"}
    base.sql("ALTER DYNAMIC TABLE D15 RESUME")
    ran = [r for r in base.refresh_due(origin + 96 * S) if r.action != "SKIPPED"]
    assert len(ran) == count and {r.action for r in ran} == {"INCREMENTAL"}
    assert_same_as_query(base, f"D{count}", f"SELECT ID + {count} AS ID, V FROM T")
    stamps = {dt.data_timestamp_us for dt in base.catalog.list_dynamic_tables()}
    assert stamps == {origin + 96 * S}
    assert base.refresh_due(origin + 96 * S) == []


def test_a_downstream_table_without_readers_is_never_scheduled(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE E TARGET_LAG = DOWNSTREAM AS SELECT ID FROM D")
    now = clock()
    for step in range(1, 4):
        assert base.refresh_due(now + step * 1_800 * S) == []
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.sql("ALTER DYNAMIC TABLE E REFRESH")  # pulls D for the same data timestamp
    assert_same_as_query(base, "E", "SELECT ID FROM T")
    stamps = {dt.data_timestamp_us for dt in base.catalog.list_dynamic_tables()}
    assert len(stamps) == 1


def test_a_query_joining_two_tables_of_one_graph_sees_one_data_timestamp(base):
    base.sql("CREATE DYNAMIC TABLE B TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE C TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS "
             "SELECT ID FROM B UNION ALL SELECT ID FROM C")  # fmt: skip
    base.sql("INSERT INTO T VALUES (10, 'j')")
    base.sql("ALTER DYNAMIC TABLE C REFRESH")  # C at t1 (has 10)
    base.sql("INSERT INTO T VALUES (20, 'k')")
    base.sql("ALTER DYNAMIC TABLE B REFRESH")  # B at t2 (has 10, 20); no refresh at t1
    seen = base.sql("SELECT 'B' AS W, ID FROM B UNION ALL SELECT 'C' AS W, ID FROM C").collect()
    b_ids = sorted(int(r.ID) for r in seen if r.W == "B")
    c_ids = sorted(int(r.ID) for r in seen if r.W == "C")
    assert b_ids == c_ids, f"B read as {b_ids}, C as {c_ids}: two data timestamps"


def test_another_clients_refresh_of_an_upstream_does_not_fail_a_reader(
    base, session_factory, monkeypatch
):
    other = session_factory()
    base.sql("CREATE DYNAMIC TABLE B TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS SELECT ID * 10 AS X FROM B")
    base.sql("INSERT INTO T VALUES (5, 'e')")
    b_id = base.require_table("B").id
    original = definition.refresh
    fired = []

    def refresh(session, table_id, trigger, moment=None):
        record = original(session, table_id, trigger, moment)
        if table_id == b_id and not fired:  # A's manual refresh just refreshed B
            fired.append(True)
            other.sql("INSERT INTO T VALUES (6, 'f')")
            other.sql("ALTER DYNAMIC TABLE B REFRESH")
        return record

    monkeypatch.setattr(definition, "refresh", refresh)
    base.sql("ALTER DYNAMIC TABLE A REFRESH")
    monkeypatch.undo()
    assert 50 in [int(r.X) for r in base.sql("SELECT X FROM A").collect()]
