"""ADAPTIVE refresh (issue 32, "Modes, decided per refresh"): incremental by default, FULL
for one refresh when the sources' changed rows since the last refresh exceed the share
``adaptive.FULL_ABOVE_SHARE`` of their rows (and ``FULL_FROM_ROWS`` rows), with the reason
``CHANGE_TOO_LARGE`` and the measure in the history; AUTO resolves to ADAPTIVE when the
stateless rewrite or the engine covers the query. The measure is read from the Delta
logs: these tests check it against the DML that made the commits.

The scheduled variant is in ``test_scheduler.py``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from deltalake import DeltaTable

from pipelines import SqlError
from pipelines.dynamic_tables import adaptive
from pipelines.dynamic_tables.adaptive import CHANGE_TOO_LARGE, Measure, measure
from pipelines.dynamic_tables.refresh_change import PinnedSource
from tests.pipelines.dynamic_tables.checks import assert_consistent, assert_same_as_query
from tests.pipelines.dynamic_tables.checks import newest_refresh as newest
from tests.pipelines.dynamic_tables.checks import refresh_modes as modes
from tests.pipelines.dynamic_tables.checks import refresh_status as refresh
from tests.pipelines.refusals import assert_refused

STATELESS = "SELECT ID, V FROM T WHERE ID % 2 = 0"
GROUPED = "SELECT G, count(*) AS N, sum(ID) AS S FROM T GROUP BY G"


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, G NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T SELECT id, id % 7, 'a' FROM range(100)")
    return session


def test_a_large_change_is_one_full_refresh_then_small_ones_are_incremental(base):
    """Declared ADAPTIVE (stateless, PACKED ids) and AUTO over a GROUP BY (the engine,
    DERIVED ids), each with a stream: 2,000 rows inserted into 100 go FULL with the reason
    and the measure in the history; one row updated next goes INCREMENTAL. The tables
    equal their queries after each refresh, and the streams see only real changes."""
    base.sql(f"CREATE DYNAMIC TABLE P TARGET_LAG = '1 minute' REFRESH_MODE = ADAPTIVE "
             f"AS {STATELESS}")  # fmt: skip
    base.sql(f"CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS {GROUPED}")
    assert modes(base) == {"P": ("ADAPTIVE", ""), "A": ("ADAPTIVE", "")}
    base.sql("CREATE STREAM PS ON TABLE P")  # followers: FULL is a difference by row id
    base.sql("CREATE STREAM AS_ ON TABLE A")
    base.sql("INSERT INTO T SELECT id, id % 7, 'b' FROM range(1000, 3000)")
    for name, query in (("P", STATELESS), ("A", GROUPED)):
        assert refresh(base, name).startswith(f"Dynamic table {name} refreshed: FULL")
        row = newest(base, name)
        assert (row.REFRESH_ACTION, row.STATE_CODE) == ("FULL", CHANGE_TOO_LARGE), row
        assert "changed 2,000 rows, 95.24% of the 2,100 rows" in row.STATE_MESSAGE, row
        assert "FULL above 15% and from 1,000 changed rows" in row.STATE_MESSAGE, row
        assert_same_as_query(base, name, query)
    # P's FULL refresh matched rows by id: its stream holds the 1,000 new rows only.
    assert base.sql("SELECT count(*) FROM PS").collect()[0][0] == 1000
    assert {r[0] for r in base.sql('SELECT "METADATA$ACTION" FROM PS').collect()} == {"INSERT"}
    base.sql("CREATE OR REPLACE STREAM PS ON TABLE P")
    base.sql("CREATE OR REPLACE STREAM AS_ ON TABLE A")
    base.sql("UPDATE T SET V = 'u', G = 8 WHERE ID = 2")  # one row: 0.05% of 2,100
    for name, query in (("P", STATELESS), ("A", GROUPED)):
        assert "refreshed: INCREMENTAL (" in refresh(base, name)
        row = newest(base, name)
        assert (row.REFRESH_ACTION, row.STATE_CODE) == ("INCREMENTAL", None), row
        assert row.STATE_MESSAGE.startswith(
            "ADAPTIVE chose INCREMENTAL: the sources' commits "
            "since the last refresh changed 1 row, 0.05%"
        )
        assert_same_as_query(base, name, query)
        assert_consistent(base, name)
    assert sorted(tuple(r) for r in base.sql('SELECT ID, V, "METADATA$ACTION" FROM PS')
                  .collect()) == [(2, "a", "DELETE"), (2, "u", "INSERT")]  # fmt: skip
    groups = sorted((g, a) for g, a in base.sql('SELECT G, "METADATA$ACTION" FROM AS_').collect())
    assert groups == [(2, "DELETE"), (2, "INSERT"), (8, "INSERT")]  # group 2 updated in place


def test_auto_resolves_to_adaptive_or_full_and_adaptive_needs_an_incremental_query(base):
    base.sql("CREATE DYNAMIC TABLE J TARGET_LAG = '1 minute' AS "
             "SELECT T.ID, U.V FROM T JOIN T AS U ON T.ID = U.ID + 1")  # fmt: skip
    base.sql("CREATE DYNAMIC TABLE W TARGET_LAG = '1 minute' AS "
             "SELECT ID, count(*) OVER () AS N FROM T")  # fmt: skip
    base.sql("CREATE DYNAMIC TABLE F TARGET_LAG = '1 minute' REFRESH_MODE = FULL AS "
             f"{STATELESS}")  # fmt: skip
    base.sql(f"CREATE DYNAMIC TABLE I TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL AS "
             f"{STATELESS}")  # fmt: skip
    assert modes(base) == {
        "J": ("ADAPTIVE", ""),
        "W": ("FULL", "WINDOW_WITHOUT_PARTITION_BY"),
        "F": ("FULL", ""),
        "I": ("INCREMENTAL", ""),
    }
    assert_refused(base, "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' REFRESH_MODE = "
                   "ADAPTIVE AS SELECT ID FROM T ORDER BY ID LIMIT 3",
                   "DYNAMIC_TABLE_NOT_INCREMENTAL", "LIMIT")  # fmt: skip
    # INCREMENTAL never goes FULL for the size of a change; ADAPTIVE's measure is not its.
    base.sql("INSERT INTO T SELECT id, 0, 'b' FROM range(1000, 3000)")
    assert "refreshed: INCREMENTAL (1000 inserted" in refresh(base, "I")
    row = newest(base, "I")
    assert (row.STATE_CODE, row.STATE_MESSAGE) == (None, None)
    assert_same_as_query(base, "I", STATELESS)
    # W (FULL for its reason) has no measure either.
    assert "refreshed: FULL" in refresh(base, "W")
    assert tuple(newest(base, "W")) == ("FULL", None, None)


def test_the_measure_counts_the_rows_each_kind_of_commit_changed(base):
    """Appends by their files' numRecords, merges (UPDATE, DELETE, MERGE) by their
    operation metrics, an overwrite by the rows it removed and added; the total is the
    rows the source holds at the version read."""
    info = base.require_table("T")

    def since(after: int, table: str = "T") -> Measure | None:
        source = base.require_table(table)
        return measure([PinnedSource(0, source, after, DeltaTable(source.uri).version())])

    start = DeltaTable(info.uri).version()
    base.sql("INSERT INTO T SELECT id, 1, 'c' FROM range(100, 130)")  # 30 appended
    base.sql("UPDATE T SET V = 'u' WHERE ID < 5")  # 5 updated
    base.sql("DELETE FROM T WHERE ID >= 120")  # 10 deleted
    base.sql("MERGE INTO T USING (SELECT 7 AS ID UNION ALL SELECT 500) AS S ON T.ID = S.ID "
             "WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT (ID, G, V) "
             "VALUES (S.ID, 0, 'm')")  # fmt: skip
    assert since(start) == Measure(30 + 5 + 10 + 2, 120)
    assert since(DeltaTable(info.uri).version()) == Measure(0, 120)
    # An overwrite: a FULL dynamic table nothing follows is rewritten whole.
    base.sql("CREATE DYNAMIC TABLE F TARGET_LAG = '1 minute' REFRESH_MODE = FULL AS "
             "SELECT ID FROM T WHERE ID < 50")  # fmt: skip
    before = DeltaTable(base.require_table("F").uri).version()
    base.sql("DELETE FROM T WHERE ID < 10")  # 9 rows (7 is gone): F goes from 49 to 40
    assert "FULL (40 inserted, 49 deleted" in refresh(base, "F")
    assert since(before, "F") == Measure(89, 40)


def test_the_rule_is_a_share_above_the_threshold_of_at_least_the_floor():
    share, floor = adaptive.FULL_ABOVE_SHARE, adaptive.FULL_FROM_ROWS
    assert (share, floor) == (0.15, 1000)
    assert not Measure(1500, 10_000).too_large  # exactly 15%: incremental
    assert Measure(1501, 10_000).too_large
    assert not Measure(999, 1000).too_large  # under the floor, whatever the share
    assert Measure(1000, 0).too_large and Measure(1000, 0).share == float("inf")
    assert not Measure(0, 0).too_large and Measure(0, 0).share == 0.0
    assert "more than all of the 0 rows" in Measure(1000, 0).text(True)


def test_adaptive_is_a_mode_of_the_create_statement_only(session):
    """A mode that is not one is refused with the list, ADAPTIVE among them."""
    session.sql("CREATE TABLE T (ID NUMBER)")
    with pytest.raises(SqlError, match="AUTO, INCREMENTAL, FULL, INCREMENTAL_STRICT, ADAPTIVE"):
        session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = ADAPT AS "
                    "SELECT ID FROM T")  # fmt: skip


def _took(session, name: str, action: str, seconds: float) -> None:
    """The ``action`` refreshes of ``name`` as if each had taken ``seconds``: the
    history's times are the rule's input, set here so the test does not depend on how
    fast this machine refreshes."""
    table_id = session.require_table(name).id
    for record in session.catalog.list_refreshes(table_id):
        if record.action == action:
            assert record.took_s is not None and record.took_s > 0  # it timed itself
            session.catalog.update_refresh(record.id, took_s=seconds)


def test_a_table_whose_incremental_refreshes_were_slower_goes_full_until_a_smaller_change(
    base, monkeypatch
):
    """With the history saying the last incremental refresh took 9 s and the last FULL 1 s,
    a change as large goes FULL (INCREMENTAL_SLOWER, both times in the message); a change
    under half as large goes incremental; after RETRY_AFTER such FULL refreshes, one goes
    incremental to measure again. The rows threshold is lowered to the fixture's 100 rows
    (its own edge is checked below); the table equals its query after every refresh."""
    monkeypatch.setattr(adaptive, "COST_FROM_ROWS", 100)
    monkeypatch.setattr(adaptive, "RETRY_AFTER", 2)
    base.sql(f"CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS {GROUPED}")
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")  # 10 rows
    assert "refreshed: INCREMENTAL" in refresh(base, "A")  # no incremental time yet
    _took(base, "A", "INCREMENTAL", 9.0)
    _took(base, "A", "FULL", 1.0)
    base.sql("UPDATE T SET V = 'y' WHERE ID < 5")  # 5 rows: half of 10, as large
    assert "refreshed: FULL" in refresh(base, "A")
    row = newest(base, "A")
    assert (row.REFRESH_ACTION, row.STATE_CODE) == ("FULL", "INCREMENTAL_SLOWER"), row
    assert row.STATE_MESSAGE.startswith("ADAPTIVE chose FULL: the sources' commits since the "
                                        "last refresh changed 5 rows, 5.00%"), row  # fmt: skip
    assert ("the table's newest incremental refresh took 9.00 s, for 10 changed rows, more "
            "than 1.25x the 1.00 s of the quicker of its two newest FULL refreshes "
            "(incremental again for a change under half as large, or after 2 such FULL "
            "refreshes)"
            ) in row.STATE_MESSAGE, row  # fmt: skip
    assert_same_as_query(base, "A", GROUPED)
    _took(base, "A", "FULL", 1.0)
    base.sql("UPDATE T SET V = 'z' WHERE ID < 4")  # 4 rows: under half of 10
    assert "refreshed: INCREMENTAL" in refresh(base, "A")
    assert newest(base, "A").STATE_MESSAGE.endswith("and this change is under half as large")
    assert_same_as_query(base, "A", GROUPED)
    _took(base, "A", "INCREMENTAL", 9.0)  # 4 rows in 9 s now
    for step in range(2):
        base.sql(f"UPDATE T SET G = {20 + step} WHERE ID < 4")
        assert "refreshed: FULL" in refresh(base, "A")
        assert newest(base, "A").STATE_CODE == "INCREMENTAL_SLOWER"
        _took(base, "A", "FULL", 1.0)
    base.sql("UPDATE T SET G = 30 WHERE ID < 4")
    assert "refreshed: INCREMENTAL" in refresh(base, "A")  # measured again
    assert newest(base, "A").STATE_MESSAGE.endswith("2 refreshes went FULL since: measured again")
    assert_same_as_query(base, "A", GROUPED)
    assert_consistent(base, "A")


def _record(action: str, seconds: float, reason: str = "", state: str = "SUCCEEDED"):
    from catalog import RefreshRecord

    return RefreshRecord(1, 1, "A", "u", "MANUAL", action, state, reason, "", 0, {"T": [1, 2]},
                         0, 0, 0, 3, 100.0, 100.0 + seconds, "", took_s=seconds)  # fmt: skip


def test_the_times_weigh_in_from_the_rows_threshold_and_only_when_incremental_was_slower():
    """``timing`` reads the newest incremental and FULL refreshes that succeeded and timed
    themselves (a failed or running one, or one recovery finished, is not a time), counts the INCREMENTAL_SLOWER refreshes since; ``weigh``
    needs COST_FROM_ROWS rows held, a change, and more than SLOWER_BY times FULL's time."""
    assert (adaptive.COST_FROM_ROWS, adaptive.SLOWER_BY, adaptive.RETRY_AFTER) == (100_000, 1.25, 8)
    recovered = replace(_record("INCREMENTAL", 3600.0), took_s=None)  # finished by recovery
    history = [_record("FULL", 1.0, adaptive.INCREMENTAL_SLOWER), _record("FAILED", 0.1, "",
               "FAILED"), recovered, _record("INCREMENTAL", 0.5), _record("INCREMENTAL", 9.0),
               _record("FULL", 3.0)]  # fmt: skip
    times = adaptive.timing(history, [])
    assert times == adaptive.Timing(0.5, None, 1.0, 1)  # T is not among today's sources
    assert adaptive.timing(history[:2], []) is None  # no incremental refresh
    # The newest incremental refresh's time (an older one's change was another); FULL's
    # the quicker of its two newest (one slow outlier does not decide).
    outlier = [_record("INCREMENTAL", 9.0), _record("FULL", 4.0), _record("INCREMENTAL", 3.0),
               _record("FULL", 1.0), _record("INCREMENTAL", 0.1), _record("FULL", 0.1)]  # fmt: skip
    assert adaptive.timing(outlier, []) == adaptive.Timing(9.0, None, 1.0, 0)
    slow = adaptive.Timing(1.26, 1000, 1.0, 0)
    assert slow.weigh(Measure(500, 100_000))[0]
    assert not slow.weigh(Measure(500, 99_999))[0]  # too few rows held: noise
    assert not slow.weigh(Measure(499, 100_000))[0]  # under half the change
    assert not slow.weigh(Measure(0, 100_000))[0]  # nothing changed
    assert not adaptive.Timing(1.25, 1000, 1.0, 0).weigh(Measure(500, 100_000))[0]
    assert not adaptive.Timing(1.26, 1000, 1.0, 8).weigh(Measure(500, 100_000))[0]
    assert adaptive.Timing(1.26, None, 1.0, 7).weigh(Measure(1, 100_000))[0]
    assert adaptive.Timing(0.5, 1000, 1.0, 0).weigh(Measure(500, 100_000)) == (False, "")
