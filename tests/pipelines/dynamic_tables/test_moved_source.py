"""A dynamic table whose source moved (renamed away, replaced, dropped; directly or under
a view it reads) fails every refresh with a reason, never reports stale rows as fresh,
and never stops the scheduler for the other tables: one FAILED row whose count grows,
its readers SKIPPED (UPSTREAM_FAILED), until ``CREATE OR REPLACE DYNAMIC TABLE``.

Through the embedded session with a controlled clock (``refresh_due(now_us)``, as in
``test_scheduler.py``), and through the service's own scheduler, where
the test waits for history rows and never for a time.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time

import pytest

from catalog import SqliteCatalog
from pipelines import SqlError
from pipelines.dynamic_tables import refresh as refresh_module
from pipelines.dynamic_tables import scheduler as scheduler_module
from tests.pipelines.conftest import rows

S = 1_000_000  # µs
ORIGIN = 0  # set for each test (see origin)


@pytest.fixture(autouse=True)
def origin():
    """A multiple of every period used, at least 10 minutes ahead: every tick a test
    names is in the future, so each refresh reads its sources' newest versions."""
    global ORIGIN
    ORIGIN = ((int(time.time()) + 600) // 3072 + 1) * 3072 * S


def at(minutes: int, seconds: int = 0) -> int:
    return ORIGIN + (minutes * 60 + seconds) * S


def ran(records):
    """{name: action, or the reason when skipped or failed} of one round's rows (SCHEDULE_
    OVERRUN rows left out)."""
    return {r.name.rsplit(".", 1)[-1]: r.action if r.state == "SUCCEEDED" else r.reason
            for r in records if r.reason != "SCHEDULE_OVERRUN"}  # fmt: skip


def history(session, name):
    """The table's history rows, newest first, as (trigger, state, reason, skipped_ticks)."""
    table = session.require_table(name)
    return [(r.trigger, r.state, r.reason, r.skipped_ticks)
            for r in session.catalog.list_refreshes(table.id)]  # fmt: skip


def stamp(session, name):
    return session.catalog.get_dynamic_table(session.require_table(name).id).data_timestamp_us


def run(session, *statements):
    for statement in statements:
        session.sql(statement)


@pytest.fixture(params=["table", "view"])
def graph(request, session):
    """AAA read by A_OK and Z_OK (healthy), R read by DR (directly, or through view RV),
    DR read by DR_DOWN; every table initialized at 0:00."""
    reads = "R"
    if request.param == "view":
        run(
            session,
            "CREATE TABLE R (ID NUMBER, V VARCHAR)",
            "CREATE VIEW RV AS SELECT ID, V FROM R",
        )
        reads = "RV"
    else:
        session.sql("CREATE TABLE R (ID NUMBER, V VARCHAR)")
    run(session, "CREATE TABLE AAA (ID NUMBER)", "INSERT INTO AAA VALUES (1)",
        "INSERT INTO R VALUES (1, 'x')")  # fmt: skip
    for name, query in (
        ("A_OK", "SELECT ID FROM AAA"),
        ("DR", f"SELECT ID, V FROM {reads}"),
        ("Z_OK", "SELECT ID * 10 AS X FROM AAA"),
        ("DR_DOWN", "SELECT ID FROM DR"),
    ):
        session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' "
                    f"INITIALIZE = ON_SCHEDULE AS {query}")  # fmt: skip
    assert set(ran(session.refresh_due(at(0))).values()) == {"FULL"}
    return session, reads


def test_a_source_renamed_away_then_replaced_fails_until_the_table_is_replaced(graph):
    session, reads = graph
    session.sql("ALTER TABLE R RENAME TO R_OLD")
    with pytest.raises(SqlError, match="SOURCE_RENAMED") as renamed:
        session.sql("ALTER DYNAMIC TABLE DR REFRESH")  # not NO_DATA: its query reads R
    assert "renamed to DB.PUBLIC.R_OLD" in str(renamed.value)
    assert stamp(session, "DR") == at(0)
    run(session, "CREATE TABLE R (ID NUMBER, V VARCHAR)", "INSERT INTO R VALUES (100, 'new')",
        "INSERT INTO R_OLD VALUES (2, 'y')")  # fmt: skip
    with pytest.raises(SqlError, match="SOURCE_REPLACED"):
        session.sql("ALTER DYNAMIC TABLE DR REFRESH")
    assert history(session, "DR")[:2] == [("MANUAL", "FAILED", "SOURCE_REPLACED", 0),
                                          ("MANUAL", "FAILED", "SOURCE_RENAMED", 0)]  # fmt: skip
    session.sql("INSERT INTO AAA VALUES (2)")
    broken = {"A_OK": "INCREMENTAL", "DR": "SOURCE_REPLACED",
              "DR_DOWN": "UPSTREAM_FAILED:DB.PUBLIC.DR", "Z_OK": "INCREMENTAL"}  # fmt: skip
    assert ran(session.refresh_due(at(0, 48))) == broken
    session.sql("INSERT INTO AAA VALUES (3)")
    assert ran(session.refresh_due(at(1, 36))) == broken
    assert ran(session.refresh_due(at(2, 24))) == {**broken, "A_OK": "NO_DATA", "Z_OK": "NO_DATA"}
    # One FAILED row counting the repeats; its reader's one SKIPPED row likewise.
    assert history(session, "DR")[0] == ("SCHEDULED", "FAILED", "SOURCE_REPLACED", 2)
    assert [h for h in history(session, "DR") if h[0] == "SCHEDULED"] == [
        ("SCHEDULED", "FAILED", "SOURCE_REPLACED", 2)
    ]
    assert history(session, "DR_DOWN")[0] == ("SCHEDULED", "SKIPPED",
                                              "UPSTREAM_FAILED:DB.PUBLIC.DR", 3)  # fmt: skip
    assert session.catalog.list_refreshes(executing=True) == []
    # Stale rows are never reported fresh: DR keeps its content and its data timestamp.
    assert rows(session.sql("SELECT ID, V FROM DR")) == [(1, "x")]
    assert stamp(session, "DR") == at(0)
    # The healthy tables were refreshed in the same rounds, at one data timestamp.
    assert stamp(session, "A_OK") == stamp(session, "Z_OK") == at(2, 24)
    assert rows(session.sql("SELECT X FROM Z_OK")) == [(10,), (20,), (30,)]
    _mend(session, reads)


def _mend(session, reads):
    """CREATE OR REPLACE DYNAMIC TABLE DR reads the R of now; DR_DOWN, which read the
    replaced DR, fails with SOURCE_REPLACED until it is replaced too."""
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE DR TARGET_LAG = '1 minute' AS "
                f"SELECT ID, V FROM {reads}")  # fmt: skip
    assert rows(session.sql("SELECT ID, V FROM DR")) == [(100, "new")]
    assert history(session, "DR") == [("INITIAL", "SUCCEEDED", "", 0)]
    session.sql("INSERT INTO R VALUES (101, 'more')")
    done = ran(session.refresh_due(at(3, 12)))
    assert (done["DR"], done["DR_DOWN"]) == ("INCREMENTAL", "SOURCE_REPLACED")
    assert rows(session.sql("SELECT ID, V FROM DR")) == [(100, "new"), (101, "more")]
    session.sql("CREATE OR REPLACE DYNAMIC TABLE DR_DOWN TARGET_LAG = '1 minute' AS "
                "SELECT ID FROM DR")  # fmt: skip
    assert rows(session.sql("SELECT ID FROM DR_DOWN")) == [(100,), (101,)]
    assert ran(session.refresh_due(at(4, 0))) == {
        "A_OK": "NO_DATA", "DR": "NO_DATA", "DR_DOWN": "NO_DATA", "Z_OK": "NO_DATA"
    }  # fmt: skip


def test_a_source_dropped_then_created_again(graph):
    session, reads = graph
    session.sql("DROP TABLE R")
    assert ran(session.refresh_due(at(0, 48)))["DR"] == "SOURCE_DROPPED"
    assert ran(session.refresh_due(at(1, 36)))["DR"] == "SOURCE_DROPPED"
    # Created again (even with the same columns): another table under the name.
    run(session, "CREATE TABLE R (ID NUMBER, V VARCHAR)", "INSERT INTO R VALUES (100, 'new')")
    assert ran(session.refresh_due(at(2, 24)))["DR"] == "SOURCE_REPLACED"
    assert ran(session.refresh_due(at(3, 12)))["DR"] == "SOURCE_REPLACED"
    scheduled = [h for h in history(session, "DR") if h[0] == "SCHEDULED"]
    assert scheduled == [("SCHEDULED", "FAILED", "SOURCE_REPLACED", 1),
                         ("SCHEDULED", "FAILED", "SOURCE_DROPPED", 1)]  # fmt: skip
    assert rows(session.sql("SELECT ID, V FROM DR")) == [(1, "x")]
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE DR TARGET_LAG = '1 minute' AS "
                f"SELECT ID, V FROM {reads}")  # fmt: skip
    assert rows(session.sql("SELECT ID, V FROM DR")) == [(100, "new")]


def test_a_source_renamed_back_refreshes_again(graph):
    """Renamed away and back: the same table under the same name, so nothing moved."""
    session, _ = graph
    session.sql("ALTER TABLE R RENAME TO R_OLD")
    assert ran(session.refresh_due(at(0, 48)))["DR"] == "SOURCE_RENAMED"
    run(session, "ALTER TABLE R_OLD RENAME TO R", "INSERT INTO R VALUES (2, 'y')")
    assert ran(session.refresh_due(at(1, 36)))["DR"] == "INCREMENTAL"
    assert rows(session.sql("SELECT ID, V FROM DR")) == [(1, "x"), (2, "y")]


@pytest.mark.parametrize(
    "change, reason",
    [
        ("DROP VIEW RV", "VIEW_DROPPED"),
        ("CREATE OR REPLACE VIEW RV AS SELECT ID, V FROM R", "VIEW_REPLACED"),
        ("DROP VIEW RV; CREATE TABLE RV (ID NUMBER, V VARCHAR)", "VIEW_REPLACED"),
    ],
)
def test_a_view_dropped_or_replaced(session, change, reason):
    run(session, "CREATE TABLE R (ID NUMBER, V VARCHAR)", "INSERT INTO R VALUES (1, 'x')",
        "CREATE VIEW RV AS SELECT ID, V FROM R",
        "CREATE DYNAMIC TABLE DR TARGET_LAG = '1 minute' INITIALIZE = ON_SCHEDULE AS "
        "SELECT ID, V FROM RV")  # fmt: skip
    assert ran(session.refresh_due(at(0))) == {"DR": "FULL"}
    run(session, *change.split("; "))
    assert ran(session.refresh_due(at(0, 48))) == {"DR": reason}
    assert ran(session.refresh_due(at(1, 36))) == {"DR": reason}
    assert history(session, "DR")[0] == ("SCHEDULED", "FAILED", reason, 1)


@pytest.fixture
def healthy(session):
    """A_OK, DR and Z_OK over AAA (DR's refreshes are made to fail), initialized."""
    run(session, "CREATE TABLE AAA (ID NUMBER)", "INSERT INTO AAA VALUES (1)")
    for name in ("A_OK", "DR", "Z_OK"):
        session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' "
                    "INITIALIZE = ON_SCHEDULE AS SELECT ID FROM AAA")  # fmt: skip
    session.refresh_due(at(0))
    session.sql("INSERT INTO AAA VALUES (2)")
    return session


def test_an_unexpected_error_in_a_refresh_is_its_failed_row(healthy, monkeypatch):
    session = healthy
    dr = session.require_table("DR").id
    real = refresh_module.compute

    def compute(session, dt, *args, **kwargs):
        if dt.table_id == dr:
            raise KeyError(6)
        return real(session, dt, *args, **kwargs)

    monkeypatch.setattr(refresh_module, "compute", compute)
    with pytest.raises(SqlError, match="INTERNAL_ERROR"):
        session.sql("ALTER DYNAMIC TABLE DR REFRESH")
    failed = {"A_OK": "INCREMENTAL", "DR": "INTERNAL_ERROR", "Z_OK": "INCREMENTAL"}
    assert ran(session.refresh_due(at(0, 48))) == failed
    assert ran(session.refresh_due(at(1, 36))) == {**failed, "A_OK": "NO_DATA", "Z_OK": "NO_DATA"}
    newest = session.catalog.list_refreshes(dr, limit=1)[0]
    assert (newest.trigger, newest.state, newest.reason, newest.skipped_ticks) == (
        "SCHEDULED", "FAILED", "INTERNAL_ERROR", 1)  # fmt: skip
    assert "unexpected error (6)" in newest.error
    assert session.catalog.list_refreshes(executing=True) == []
    monkeypatch.undo()
    assert ran(session.refresh_due(at(2, 24)))["DR"] == "INCREMENTAL"
    assert rows(session.sql("SELECT ID FROM DR")) == [(1,), (2,)]


def test_an_error_outside_the_refresh_fails_that_tick_only(healthy, monkeypatch):
    """Whatever raises in a table's tick (here the refresh call itself) is that tick's
    FAILED row; the round goes on, and the tick counts as handled."""
    session = healthy
    dr = session.require_table("DR").id
    real = scheduler_module.refresh

    def refresh(session, table_id, *args):
        if table_id == dr:
            raise RuntimeError("the catalog went away")
        return real(session, table_id, *args)

    monkeypatch.setattr(scheduler_module, "refresh", refresh)
    failed = {"A_OK": "INCREMENTAL", "DR": "INTERNAL_ERROR", "Z_OK": "INCREMENTAL"}
    assert ran(session.refresh_due(at(0, 48))) == failed
    assert ran(session.refresh_due(at(0, 50))) == {}  # handled: not again every round
    assert ran(session.refresh_due(at(1, 36)))["DR"] == "INTERNAL_ERROR"
    assert history(session, "DR")[0] == ("SCHEDULED", "FAILED", "INTERNAL_ERROR", 1)
    assert "the catalog went away" in session.catalog.list_refreshes(dr, limit=1)[0].error


# Through the service: its own scheduler, 5-second lags (every 3 s: the waits for ticks
# are half those of 10-second lags).

WAIT = 240.0  # a worker (JVM) start on a loaded 2-core machine takes up to a minute


def wait_until(check, what: str, timeout: float = WAIT, changed=None):
    """Until ``check()`` is true. With ``changed`` (see :func:`history_changed`), the
    check (SQL through the service, a Spark job or two) runs only when the refresh
    history moved, or 5 s after it last ran; not twice a second beside the refreshes."""
    deadline = time.monotonic() + timeout
    checked = -math.inf
    while True:
        if changed is None or changed() or time.monotonic() - checked >= 5:
            checked = time.monotonic()
            found = check()
            if found:
                return found
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.5)


def history_changed(catalog):
    """A call that says whether the refresh history (its newest rows, as stored) changed
    since the call before (the first call: True): what every check here waits for comes
    with a history row, a new one or one updated."""
    seen = []

    def changed() -> bool:
        rows = catalog.list_refreshes(limit=20)
        if rows == seen:
            return False
        seen[:] = rows
        return True

    return changed


def _ids(client, query):
    return sorted(int(next(iter(r.values()))) for r in client.sql(query))


def _failed_ticks(client, name):
    """The most SKIPPED_TICKS of the table's scheduled SOURCE_REPLACED rows (-1: none)."""
    found = client.sql(
        "SELECT max(SKIPPED_TICKS) AS N FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(NAME => "
        f"'{name}')) WHERE REFRESH_TRIGGER = 'SCHEDULED' AND STATE_CODE = 'SOURCE_REPLACED'"
    )
    return int(found[0]["N"]) if found and found[0]["N"] is not None else -1


def test_in_the_service_healthy_tables_keep_refreshing_while_one_source_moved(tmp_path):
    from channel_server import CompactionTrigger, ServerConfig
    from ingest_sdk import StreamingIngestClient
    from ingest_sdk.errors import SqlStatementError
    from tests.servers import ThreadServer

    warehouse = tmp_path / "warehouse"
    server = ThreadServer(ServerConfig(port=0, warehouse=warehouse,
                                       compaction=CompactionTrigger(enabled=False)))  # fmt: skip
    catalog = SqliteCatalog(warehouse / "catalog.sqlite")  # the history, read beside the service
    try:
        with StreamingIngestClient("dt-moved", server.url) as client:
            for statement in (
                "CREATE TABLE AAA (ID NUMBER)", "INSERT INTO AAA VALUES (1)",
                "CREATE TABLE R (ID NUMBER, V VARCHAR)", "INSERT INTO R VALUES (1, 'x')",
                "CREATE TABLE S (ID NUMBER, V VARCHAR)", "INSERT INTO S VALUES (1, 'x')",
                "CREATE VIEW SV AS SELECT ID, V FROM S",
            ):  # fmt: skip
                client.sql(statement)
            for name, query in (("A_OK", "SELECT ID FROM AAA"), ("DR", "SELECT ID, V FROM R"),
                                ("DV", "SELECT ID, V FROM SV"),
                                ("Z_OK", "SELECT ID * 10 AS X FROM AAA")):  # fmt: skip
                client.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '5 seconds' AS {query}")
            for source in ("R", "S"):  # DR reads R, DV reads S through SV
                client.sql(f"ALTER TABLE {source} RENAME TO {source}_OLD")
            for name in ("DR", "DV"):
                with pytest.raises(SqlStatementError, match="SOURCE_RENAMED"):
                    client.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
            for source in ("R", "S"):
                client.sql(f"CREATE TABLE {source} (ID NUMBER, V VARCHAR)")
                client.sql(f"INSERT INTO {source} VALUES (100, 'new')")
                client.sql(f"INSERT INTO {source}_OLD VALUES (2, 'y')")
            for name in ("DR", "DV"):
                with pytest.raises(SqlStatementError, match="SOURCE_REPLACED"):
                    client.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
            client.sql("INSERT INTO AAA VALUES (2)")
            changed = history_changed(catalog)
            # DR and DV fail tick after tick (one row each, its count growing) while the
            # healthy tables go on refreshing.
            wait_until(lambda: _failed_ticks(client, "DR") >= 2 and _failed_ticks(client, "DV")
                       >= 2, "DR and DV failing on three ticks", changed=changed)  # fmt: skip
            wait_until(lambda: _ids(client, "SELECT X FROM Z_OK") == [10, 20], "Z_OK refreshed",
                       changed=changed)  # fmt: skip
            client.sql("INSERT INTO AAA VALUES (3)")
            wait_until(
                lambda: (
                    _ids(client, "SELECT ID FROM A_OK") == [1, 2, 3]
                    and _ids(client, "SELECT X FROM Z_OK") == [10, 20, 30]
                ),
                "A_OK and Z_OK refreshed again",
                changed=changed,
            )
            assert _ids(client, "SELECT ID FROM DR") == [1]  # never stale rows as fresh
            # CREATE OR REPLACE mends DR; the scheduler refreshes it from then on.
            client.sql("CREATE OR REPLACE DYNAMIC TABLE DR TARGET_LAG = '5 seconds' AS "
                       "SELECT ID, V FROM R")  # fmt: skip
            client.sql("INSERT INTO R VALUES (101, 'more')")
            wait_until(lambda: _ids(client, "SELECT ID FROM DR") == [100, 101], "DR mended",
                       changed=changed)  # fmt: skip
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        catalog.close()
    _check_service_history(SqliteCatalog(warehouse / "catalog.sqlite"))


def _check_service_history(catalog):
    """With the service stopped (no round running): after the manual refreshes, DV's
    scheduled failures are one FAILED row per run of ticks failing for one reason (a
    SCHEDULE_OVERRUN row or a manual refresh between ticks starts a new one); A_OK and Z_OK refreshed
    in the round of DV's last failure, and never failed."""
    ids = {t.name: t.id for t in catalog.list_tables()}
    assert catalog.list_refreshes(executing=True) == []
    dv = catalog.list_refreshes(ids["DV"])
    manual = min(r.id for r in dv if r.trigger == "MANUAL")
    scheduled = [r for r in dv if r.trigger == "SCHEDULED" and r.id > manual]
    assert {r.reason for r in scheduled} <= {
        "SOURCE_RENAMED",
        "SOURCE_REPLACED",
        "SCHEDULE_OVERRUN",
    }
    assert all(r.state == "FAILED" or r.reason == "SCHEDULE_OVERRUN" for r in scheduled)
    # Adjacent in the whole history: a manual refresh between two ticks (the scheduler's
    # tick may come before or after ALTER ... REFRESH) starts a new row, by design.
    after = sorted((r for r in dv if r.id > manual), key=lambda r: r.id)
    assert not any(a.state == b.state == "FAILED" and a.reason == b.reason
                   and a.trigger == b.trigger == "SCHEDULED"
                   for a, b in itertools.pairwise(after))  # fmt: skip
    last = scheduled[0]
    assert (last.state, last.reason) == ("FAILED", "SOURCE_REPLACED") and last.skipped_ticks >= 2
    ticks = {}
    for name in ("A_OK", "Z_OK"):
        history = catalog.list_refreshes(ids[name])
        assert [r for r in history if r.state == "FAILED"] == []
        ticks[name] = {r.data_timestamp_us for r in history
                       if r.trigger == "SCHEDULED" and r.state == "SUCCEEDED"}  # fmt: skip
    assert last.data_timestamp_us in ticks["A_OK"] & ticks["Z_OK"]
