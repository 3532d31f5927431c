"""Dynamic-table refreshes are applied exactly once, whatever races or kills them.

Another client acts at one point of a refresh: refreshes the same table, writes the
source (INSERT, UPDATE, DELETE, MERGE), compacts, suspends, replaces the source, drops
the table or its schema, or wins over a CREATE OR REPLACE; threads and compaction race
refreshes in loops, and a second process refreshes while this one writes. Afterwards
the table equals its query, no refresh is applied twice, the history and the log agree,
nothing is pending and no folder is left behind. (The review's SIGKILL tests, inside
an INCREMENTAL refresh and inside CREATE OR REPLACE, are in ``test_kill``: they die
with its children killed at the same points.)

Written by the adversarial review of ``pipelines/dynamic_tables/``,
``catalog/sqlite_dynamic.py``, ``pipelines/transactions/commit.py`` and
``pipelines/transactions/snapshot_pins.py`` (issue 19), with ``test_refresh_correctness``,
``test_hostile_definitions`` and ``test_scheduler_edge_cases``; among these are
regression tests of defects it found and commit 9f00a2c fixed (a lost race reported as
a conflict, DROP during a refresh, a CREATE OR REPLACE losing its swap).

Races are made deterministic where possible: a hook runs another session's statement
at one point of a refresh (after its change is computed, or inside its commit before
the change is staged; there on a thread, since a DROP waits for the table lock the
refresh holds), so the interleaving the test names is the one that runs. Two tests also race real
threads and a second process (a child with its own JVM, started when the module starts
so that it overlaps the in-process tests, with helpers from ``test_consumption_crash``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable

import flush.failpoints as failpoints
import pipelines.dynamic_tables.refresh as refresh_module
import pipelines.transactions.commit as pipeline_commit
from flush.compaction import CompactionPolicy, compact_table
from pipelines import Session, SqlError
from tests.pipelines.dynamic_tables.checks import (
    assert_consistent,
    assert_same_as_query,
    bag,
    canon,
    history_rows,
    once,
    orphan_folders,
)
from tests.pipelines.transactions.test_consumption_crash import Child


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    return session


UNION = ("WITH C AS (SELECT ID, V FROM T WHERE ID % 2 = 0) SELECT ID, V FROM T WHERE ID > 2 "
         "UNION ALL SELECT ID, V FROM C UNION ALL SELECT ID + 100 AS ID, V FROM T")  # fmt: skip


# Another client at one point of a refresh; threads racing refreshes


def test_two_sessions_refreshing_at_once_one_applies_the_other_skips(
    base, session_factory, monkeypatch
):
    other = session_factory()
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {UNION}")
    base.sql("UPDATE T SET V = 'u' WHERE ID < 3")
    hook = once(lambda: other.sql("ALTER DYNAMIC TABLE D REFRESH"))
    monkeypatch.setattr(refresh_module, "compute", hook(refresh_module.compute))
    base.sql("ALTER DYNAMIC TABLE D REFRESH")  # another client's refresh must not break it
    assert_same_as_query(base, "D", UNION)
    assert_consistent(base, "D")
    states = [h[1:] for h in history_rows(base, "D")]  # newest first: the other's, then ours
    assert states[:2] == [("SUCCEEDED", "INCREMENTAL", ""),
                          ("SKIPPED", "SKIPPED", "CONCURRENT_REFRESH")]  # fmt: skip


INTERLOPERS = {
    "compaction": ["compact D", "compact T"],
    "writes": [
        "INSERT INTO T VALUES (9, 'i'), (10, 'j')", "UPDATE T SET V = 'x' WHERE ID = 2",
        "DELETE FROM T WHERE ID = 3",
        "MERGE INTO T USING (SELECT 4 AS K) M ON T.ID = M.K WHEN MATCHED THEN UPDATE SET V = 'm'",
        "ALTER DYNAMIC TABLE D SUSPEND",
    ],
}  # fmt: skip


@pytest.mark.parametrize("interlopers", list(INTERLOPERS))
def test_a_refresh_racing_dml_compaction_or_suspend_applies_once(
    base, session_factory, monkeypatch, interlopers
):
    """Between the refresh's computation and its commit, another client compacts the
    dynamic table and its source, or writes the source (INSERT, UPDATE, DELETE, MERGE)
    and suspends the table: the refresh lands once, the next one catches up, and the
    table equals its query."""
    other = session_factory()
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {UNION}")
    base.sql("INSERT INTO T VALUES (20, 'f')")  # a second file in each, for compaction
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    base.sql("UPDATE T SET V = 'u' WHERE ID IN (1, 2)")  # rewrites T's first file only
    base.sql("INSERT INTO T VALUES (21, 'g')")

    def interfere():
        for interloper in INTERLOPERS[interlopers]:
            if interloper.startswith("compact"):
                uri = other.require_table(interloper.split()[1]).uri
                assert compact_table(other.spark, uri, CompactionPolicy()).status == "SUCCEEDED"
            else:
                other.sql(interloper)

    monkeypatch.setattr(refresh_module, "compute", once(interfere)(refresh_module.compute))
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    monkeypatch.undo()
    assert history_rows(base, "D")[0][:3] == ("MANUAL", "SUCCEEDED", "INCREMENTAL")
    if interlopers == "writes":
        assert base.sql("SHOW DYNAMIC TABLES").collect()[0].scheduling_state == "SUSPENDED"
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(base, "D", UNION)
    assert_consistent(base, "D")


def test_a_source_replaced_during_a_refresh_fails_the_next_one_clearly(
    base, session_factory, monkeypatch
):
    """CREATE OR REPLACE TABLE of the source while a refresh runs: that refresh lands
    (its data timestamp is before the replace) or fails clearly; the next one fails with
    SOURCE_REPLACED, writing nothing; CREATE OR REPLACE DYNAMIC TABLE mends it."""
    other = session_factory()
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {UNION}")
    base.sql("UPDATE T SET V = 'u' WHERE ID = 4")
    replace = "CREATE OR REPLACE TABLE T (ID NUMBER, V VARCHAR)"
    monkeypatch.setattr(
        refresh_module, "compute", once(lambda: other.sql(replace))(refresh_module.compute)
    )
    with contextlib.suppress(SqlError):
        base.sql("ALTER DYNAMIC TABLE D REFRESH")
    monkeypatch.undo()
    assert_consistent(base, "D")
    version = DeltaTable(base.require_table("D").uri).version()
    base.sql("INSERT INTO T VALUES (7, 'g')")
    with pytest.raises(SqlError, match="SOURCE_REPLACED"):
        base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert DeltaTable(base.require_table("D").uri).version() == version
    base.sql(f"CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {UNION}")
    assert_same_as_query(base, "D", UNION)
    assert orphan_folders(base) == set() and base.catalog.pending_commits() == []


@pytest.mark.parametrize("where", ["after_compute", "before_stage"])
def test_drop_during_a_refresh_is_a_clear_error_and_leaves_nothing(
    base, session_factory, monkeypatch, where
):
    """Another client drops the table while a refresh runs: after its change is computed
    (the refresh must fail clearly and write nothing), or once it holds the table lock
    inside its commit (the drop waits for the commit, on a thread of its own, so the
    refresh lands and the drop then removes everything). Either way the table, its
    rows and its folder are gone at the end, and nothing is pending."""
    other = session_factory()
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {UNION}")
    base.sql("UPDATE T SET V = 'u' WHERE ID = 4")
    uri = base.require_table("D").uri
    dropped: list[object] = []

    def drop() -> None:
        try:
            dropped.append(other.sql("DROP DYNAMIC TABLE D").collect())
        except BaseException as exc:  # checked below
            dropped.append(exc)

    dropper = threading.Thread(target=drop)
    if where == "after_compute":
        monkeypatch.setattr(refresh_module, "compute", once(drop)(refresh_module.compute))
        with pytest.raises(SqlError) as failed:
            base.sql("ALTER DYNAMIC TABLE D REFRESH")
        assert "dropped" in str(failed.value)
    else:  # inside the commit, under the table lock, before the change is staged

        def dropping_meanwhile(table_uri, change, _staged=pipeline_commit.stage_change_set):
            if not dropper.is_alive() and not dropped:
                dropper.start()
                dropper.join(1.0)  # the drop waits for the lock this refresh holds
            return _staged(table_uri, change)

        monkeypatch.setattr(pipeline_commit, "stage_change_set", dropping_meanwhile)
        with contextlib.suppress(SqlError):  # a clear error is fine too
            base.sql("ALTER DYNAMIC TABLE D REFRESH")
        dropper.join(120)
        assert not dropper.is_alive(), "the drop never ended"
    monkeypatch.undo()
    assert len(dropped) == 1 and not isinstance(dropped[0], BaseException), dropped
    assert base.find_table("DB", "PUBLIC", "D") is None
    assert base.catalog.list_dynamic_tables() == []
    assert base.catalog.list_refreshes() == []
    assert base.catalog.pending_commits() == []
    assert not Path(uri).exists(), "the dropped table's folder came back"


@pytest.mark.parametrize("interloper", [
    "DROP DYNAMIC TABLE D",
    "CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T",
])  # fmt: skip
def test_a_create_or_replace_that_loses_its_swap_leaves_no_building_table(
    base, session_factory, monkeypatch, interloper
):
    other = session_factory()
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS SELECT ID, V FROM T")
    # The new table is built (its initial refresh computed) when the other client acts.
    monkeypatch.setattr(refresh_module, "compute",
                        once(lambda: other.sql(interloper))(refresh_module.compute))  # fmt: skip
    with contextlib.suppress(SqlError):  # refusing is fine; leaving a half-made table is not
        base.sql("CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS "
                 "SELECT ID * 10 AS X FROM T")  # fmt: skip
    monkeypatch.undo()
    names = [t.name for t in base.catalog.list_tables()]
    assert not [n for n in names if "$BUILDING$" in n], names
    assert len(base.catalog.list_dynamic_tables()) == names.count("D")
    assert orphan_folders(base) == set()


def test_a_refresh_left_to_recovery_is_not_reported_as_skipped(base, monkeypatch, tmp_path, spark):
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {UNION}")
    base.sql("UPDATE T SET V = 'u' WHERE ID = 4")
    # The Delta commit lands, the catalog's end of the commit fails once (a full disk).
    monkeypatch.setitem(failpoints._POINTS, "pipeline_before_finish", ["error", 1])
    try:
        status = base.sql("ALTER DYNAMIC TABLE D REFRESH").collect()[0].status
    except SqlError as exc:
        status = f"{exc.code}: {exc}"
    assert "CONCURRENT_REFRESH" not in status, status
    newest = base.catalog.list_refreshes(base.require_table("D").id)[0]
    assert newest.state != "SKIPPED", "a refresh whose commit is in the log is called skipped"
    with Session(base.warehouse, spark=spark) as recovered:  # opening it completes the commit
        assert history_rows(recovered, "D")[0][1:] == ("SUCCEEDED", "INCREMENTAL", "")
        assert_same_as_query(recovered, "D", UNION)
        assert_consistent(recovered, "D")


def test_drop_schema_cascade_during_a_refresh_leaves_no_folder(base, session_factory, monkeypatch):
    other = session_factory()
    base.sql("CREATE SCHEMA S2")
    base.sql(
        f"CREATE DYNAMIC TABLE DB.S2.E TARGET_LAG = DOWNSTREAM AS {UNION.replace(' T', ' DB.PUBLIC.T')}"
    )
    base.sql("UPDATE DB.PUBLIC.T SET V = 'u' WHERE ID = 4")
    uri = base.require_table("DB.S2.E").uri
    dropper = threading.Thread(target=lambda: other.sql("DROP SCHEMA DB.S2 CASCADE"))

    def dropping_meanwhile(table_uri, change, _staged=pipeline_commit.stage_change_set):
        if not dropper.is_alive():
            dropper.start()
            dropper.join(2.0)  # a drop that waits for the refresh's lock is fine
        return _staged(table_uri, change)

    monkeypatch.setattr(pipeline_commit, "stage_change_set", dropping_meanwhile)
    with contextlib.suppress(SqlError):  # a clear error is fine
        base.sql("ALTER DYNAMIC TABLE DB.S2.E REFRESH")
    dropper.join(120)
    monkeypatch.undo()
    assert base.catalog.list_dynamic_tables() == [] and base.catalog.pending_commits() == []
    assert not Path(uri).exists(), f"a folder no table owns: {sorted(Path(uri).rglob('*'))[:5]}"


def test_threads_and_compaction_racing_refreshes_keep_every_row_once(session_factory):
    """Two sessions refresh in loops, a third runs DML (INSERT, UPDATE, DELETE, MERGE)
    and consumes a stream on the dynamic table, a fourth compacts both tables: the
    table ends equal to its query, no refresh is applied twice, the history and the
    log agree, and replaying the stream's consumptions gives the table's content."""
    sessions = [session_factory() for _ in range(4)]
    main = sessions[0]
    main.sql("CREATE TABLE T (ID NUMBER, V VARCHAR, F FLOAT)")
    main.sql("INSERT INTO T VALUES (1, 'a', 1.5), (2, 'b', NULL), (3, NULL, 2.5)")
    main.sql("CREATE TABLE SINK (ID NUMBER, V VARCHAR, F FLOAT, A VARCHAR, RID NUMBER, B NUMBER)")
    query = UNION.replace("ID, V", "ID, V, F")
    main.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS {query}")
    main.sql("CREATE STREAM S ON TABLE D AT(VERSION => 0)")  # every row, as INSERTs
    stop, crashes = threading.Event(), []

    def guarded(loop):
        def run():
            try:
                loop()
            except BaseException as exc:  # reported by the test
                crashes.append(repr(exc))

        return run

    def refresher(session):
        while not stop.is_set():
            session.sql("ALTER DYNAMIC TABLE D REFRESH")  # a lost race is SKIPPED, no error

    def compactor():
        while not stop.is_set():
            for name in ("D", "T"):
                compact_table(main.spark, sessions[3].require_table(name).uri, CompactionPolicy())
            time.sleep(0.3)

    threads = [threading.Thread(target=guarded(lambda s=s: refresher(s))) for s in sessions[:2]]
    threads.append(threading.Thread(target=guarded(compactor)))
    for thread in threads:
        thread.start()
    writer, batch = sessions[2], 0
    try:
        for step in range(10):
            kind = step % 5
            if kind == 0:
                writer.sql(f"INSERT INTO T VALUES ({10 + step}, 'n', CAST('NaN' AS DOUBLE)), "
                           f"({11 + step}, NULL, -0.0)")  # fmt: skip
            elif kind == 1:
                writer.sql(
                    f"UPDATE T SET V = concat(coalesce(V, ''), 'x') WHERE ID % 3 = {step % 3}"
                )
            elif kind == 2:
                writer.sql(f"DELETE FROM T WHERE ID % 7 = {step % 7}")
            elif kind == 3:
                writer.sql("MERGE INTO T USING (SELECT ID FROM T WHERE ID % 4 = 1) M "
                           "ON T.ID = M.ID WHEN MATCHED THEN UPDATE SET F = 9.5")  # fmt: skip
            else:
                batch += 1
                writer.sql(f'INSERT INTO SINK SELECT ID, V, F, "METADATA$ACTION", '
                           f'"METADATA$ROW_ID", {batch} FROM S')  # fmt: skip
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert crashes == []
    main.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(main, "D", query)
    assert_consistent(main, "D")
    writer.sql(f'INSERT INTO SINK SELECT ID, V, F, "METADATA$ACTION", "METADATA$ROW_ID", '
               f"{batch + 1} FROM S")  # fmt: skip
    replay: dict[int, tuple] = {}
    consumed = main.sql("SELECT ID, V, F, A, RID, B FROM SINK").collect()
    for number in sorted({int(r.B) for r in consumed}):
        for action in ("DELETE", "INSERT"):
            for r in (r for r in consumed if int(r.B) == number and action == r.A):
                rid = int(r.RID)
                if action == "DELETE":
                    assert rid in replay, f"the stream deleted row {rid} it never inserted"
                    del replay[rid]
                else:
                    assert rid not in replay, f"the stream inserted row {rid} twice"
                    replay[rid] = tuple(canon(v) for v in (r.ID, r.V, r.F))
    assert Counter(replay.values()) == bag(main, "SELECT ID, V, F FROM D")


# Two processes: a child refreshes in a loop while this process writes and refreshes.

RACER = """
from pathlib import Path
touch(Path(os.environ["DT_READY"]))
done, errors = 0, {}
while not Path(os.environ["DT_STOP"]).exists():
    try:
        session.sql("ALTER DYNAMIC TABLE D REFRESH")
        done += 1
    except SqlError as exc:
        errors[exc.code] = errors.get(exc.code, 0) + 1
report(refreshes=done, errors=errors)
"""


@dataclass
class Racer:
    warehouse: Path
    child: Child
    ready: Path
    stop: Path


@pytest.fixture(scope="module", autouse=True)
def children(request, tmp_path_factory, spark):
    """Start the racing child when the module starts (if its test is selected), so its
    JVM starts while the in-process tests run; stop it at the end."""
    selected = {item.name for item in request.session.items if item.module is request.module}
    started: dict[str, Racer] = {}
    try:
        if "test_two_processes_refreshing_one_table_apply_each_change_once" in selected:
            warehouse = tmp_path_factory.mktemp("racer") / "warehouse"
            with Session(warehouse, spark=spark) as session:
                session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
                session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c')")
                session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {UNION}")
                session.sql("CREATE STREAM S ON TABLE D AT(VERSION => 0)")
            ready, stop = warehouse.parent / "ready", warehouse.parent / "stop"
            os.environ["DT_READY"], os.environ["DT_STOP"] = str(ready), str(stop)
            try:
                child = Child.start(warehouse, RACER, name="racer")
            finally:
                del os.environ["DT_READY"], os.environ["DT_STOP"]
            started["racer"] = Racer(warehouse, child, ready, stop)
        yield started
    finally:
        for racer in started.values():
            racer.stop.touch()
            racer.child.stop()


def test_two_processes_refreshing_one_table_apply_each_change_once(children, session_factory):
    racer = children["racer"]
    deadline = time.monotonic() + 600
    while not racer.ready.exists():
        assert racer.child.proc.poll() is None, racer.child.describe()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    session = session_factory(racer.warehouse)
    try:
        for step in range(8):
            session.sql(f"INSERT INTO T VALUES ({10 + step}, 'n{step}')")
            session.sql(f"UPDATE T SET V = concat(V, 'u') WHERE ID % 3 = {step % 3}")
            if step % 3 == 2:
                session.sql(f"DELETE FROM T WHERE ID % 5 = {step % 5}")
            session.sql("ALTER DYNAMIC TABLE D REFRESH")  # another process's race: no error
    finally:
        racer.stop.touch()
    assert racer.child.wait() == 0, racer.child.describe()
    (result,) = racer.child.results()
    assert result["refreshes"] > 0 and result["errors"] == {}, result
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(session, "D", UNION)
    assert_consistent(session, "D")
    stream = bag(session, 'SELECT ID, V, "METADATA$ACTION" FROM S')
    assert stream == Counter(
        {(*row, "INSERT"): n for row, n in bag(session, "SELECT * FROM D").items()}
    )
