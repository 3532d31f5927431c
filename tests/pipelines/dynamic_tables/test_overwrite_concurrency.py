"""An overwrite refresh against whatever happens while it is computed and committed: a
follower appearing, compaction, another session's overwrite, a write from outside the
protocol; and what readers of its changes and versions see afterwards.

Adversarial tests of d59ed71: a FULL refresh of a dynamic table nothing follows is one
Delta overwrite commit (``ChangeSet.replaces`` -> staged ``overwrite``) instead of a
MERGE of the difference.

Real Spark, real Delta, real sessions on one warehouse; interleavings are forced with
hooks on the project's own functions (``has_followers``, the commit's failpoints).
Two defects this round found are fixed and their tests pass: an APPEND_ONLY stream
created while an overwrite was computed got every unchanged row again (the refresh now
checks its followers again under the table's lock, which CREATE STREAM on a dynamic
table takes), and a decided overwrite was wedged for good by a data change from outside
the protocol (a decided overwrite now replaces whatever is there).
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import pipelines.dynamic_tables.refresh_change as refresh_change
import pipelines.transactions.commit as pipeline_commit
from flush.compaction import CompactionPolicy, compact_table
from flush.tables import ROW_ID_COLUMN
from pipelines import Session, SqlError
from tests.pipelines.conftest import FULL_TABLE, WINDOW
from tests.pipelines.dynamic_tables.checks import (
    assert_consistent,
    assert_same_as_query,
    bag,
    canon,
)


def refresh(session: Session, name: str):
    return session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0][0]


def last_operation(session: Session, name: str) -> str:
    """MERGE, WRITE:Overwrite (an overwrite refresh) or WRITE:Append."""
    entry = DeltaTable(session.require_table(name).uri).history(1)[0]
    mode = (entry.get("operationParameters") or {}).get("mode")
    return f"{entry['operation']}:{mode}" if entry["operation"] == "WRITE" else entry["operation"]


def by_id(session: Session, name: str, version: int | None = None) -> dict[int, tuple]:
    """The table's rows keyed by row id (values as ``canon``), at ``version``."""
    table = DeltaTable(session.require_table(name).uri, version=version).to_pyarrow_table()
    names = [n for n in table.column_names if n != ROW_ID_COLUMN]
    found = {}
    for row in table.to_pylist():
        assert row[ROW_ID_COLUMN] not in found, "duplicate row id"
        found[row[ROW_ID_COLUMN]] = tuple(canon(row[n]) for n in names)
    return found


def apply_stream(old: dict[int, tuple], changes: list) -> dict[int, tuple]:
    """Apply a DEFAULT stream's rows (values..., action, row id) to ``old`` by row id;
    a delete of a row not there or an insert of a row there is an error."""
    new = dict(old)
    for row in sorted(changes, key=lambda r: r[-2] != "DELETE"):  # deletes first
        *values, action, rid = row
        if action == "DELETE":
            assert rid in new, f"the stream deletes row {rid}, which is not there"
            del new[rid]
        else:
            assert rid not in new, f"the stream inserts row {rid}, which is there"
            new[rid] = tuple(canon(v) for v in values)
    return new


def after_follower_check(monkeypatch, action):
    """Run ``action`` once, right after a refresh decided whether the table has followers
    (the window between that decision and its commit)."""
    original = refresh_change.has_followers
    fired = []

    def hooked(catalog, table_id):
        result = original(catalog, table_id)
        if not fired:
            fired.append(result)
            action()
        return result

    monkeypatch.setattr(refresh_change, "has_followers", hooked)
    return fired


def at_failpoint(monkeypatch, point, action):
    real = pipeline_commit.failpoint
    fired = []

    def failpoint(name):
        real(name)
        if name == point and not fired:
            fired.append(name)
            action()

    monkeypatch.setattr(pipeline_commit, "failpoint", failpoint)
    return fired


def left_pending(session: Session, monkeypatch) -> None:
    """A FULL refresh of D (after an update of T) decided, its roll-forward failed: the
    commit is left to recovery (COMMIT_PENDING)."""

    def fail() -> None:
        raise OSError("injected: the roll-forward fails")

    session.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    at_failpoint(monkeypatch, "pipeline_after_decide", fail)
    refresh(session, "D")
    monkeypatch.undo()


def guarded(loop, crashes: list[str]):
    """``loop`` for a thread: what it raises is recorded in ``crashes``, for the test."""

    def run():
        try:
            loop()
        except BaseException as exc:
            crashes.append(repr(exc))

    return run


def append_outside_the_protocol(uri: str) -> None:
    """A writer outside the protocol appends one row to the table's folder."""
    schema = pa.schema(DeltaTable(uri).schema().to_arrow())
    row = pa.table({f.name: pa.array([None if f.nullable else 0], f.type) for f in schema},
                   schema=schema)  # fmt: skip
    row = row.set_column(row.schema.get_field_index(ROW_ID_COLUMN), ROW_ID_COLUMN,
                         pa.array([10**12], pa.int64()))  # fmt: skip
    write_deltalake(uri, row, mode="append")


def many_files(session: Session) -> None:
    """D made of several small files (MERGE refreshes while a stream followed it), then
    nothing follows it any more."""
    session.sql("CREATE STREAM S0 ON TABLE D")
    for step in range(3):
        session.sql(f"INSERT INTO T VALUES ({10 + step}, 'm{step}')")
        assert "FULL" in refresh(session, "D")
        assert last_operation(session, "D") in ("MERGE", "WRITE:Append")
    session.sql("DROP STREAM S0")
    assert len(DeltaTable(session.require_table("D").uri).file_uris()) >= 2


# 1. A follower appearing between the follower check and the commit


def test_a_stream_created_during_an_overwrite_refresh_reads_a_correct_change_set(
    windowed, session_factory, monkeypatch
):
    other = session_factory()
    old = by_id(windowed, "D")
    fired = after_follower_check(monkeypatch, lambda: other.sql("CREATE STREAM S ON TABLE D"))
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    refresh(windowed, "D")
    assert fired == [False]
    # S came before the commit: the refresh checked again and applied the difference.
    assert last_operation(windowed, "D") == "MERGE"
    assert_same_as_query(windowed, "D", WINDOW)
    changes = [tuple(r) for r in windowed.sql(
        'SELECT ID, V, K, "METADATA$ACTION", "METADATA$ROW_ID" FROM S').collect()]  # fmt: skip
    assert apply_stream(old, changes) == by_id(windowed, "D")
    # S follows D now: the next FULL refresh is a difference, S shows only it.
    windowed.sql("CREATE TABLE SINK (ID NUMBER, V VARCHAR, K NUMBER, A VARCHAR, R NUMBER)")
    windowed.sql('INSERT INTO SINK SELECT ID, V, K, "METADATA$ACTION", "METADATA$ROW_ID" FROM S')
    windowed.sql("UPDATE T SET V = 'y' WHERE ID = 1")
    mid = by_id(windowed, "D")
    assert "FULL (" in refresh(windowed, "D")
    assert last_operation(windowed, "D") == "MERGE"
    changes = [tuple(r) for r in windowed.sql(
        'SELECT ID, V, K, "METADATA$ACTION", "METADATA$ROW_ID" FROM S').collect()]  # fmt: skip
    assert apply_stream(mid, changes) == by_id(windowed, "D")
    assert_consistent(windowed, "D")


def test_an_append_only_stream_created_during_an_overwrite_gets_only_real_inserts(
    windowed, session_factory, monkeypatch
):
    other = session_factory()
    after_follower_check(
        monkeypatch, lambda: other.sql("CREATE STREAM S ON TABLE D APPEND_ONLY = TRUE")
    )
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    refresh(windowed, "D")
    inserted = sorted((int(i), v) for i, v in windowed.sql("SELECT ID, V FROM S").collect())
    assert inserted == [(4, "z")], inserted


def test_a_downstream_table_created_during_an_overwrite_refresh_stays_its_query(
    windowed, session_factory, monkeypatch
):
    other = session_factory()
    downstream = "SELECT ID, V, K FROM D WHERE ID <> 2"
    after_follower_check(monkeypatch, lambda: other.sql(
        f"CREATE DYNAMIC TABLE E TARGET_LAG = DOWNSTREAM AS {downstream}"))  # fmt: skip
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    refresh(windowed, "D")
    assert_same_as_query(windowed, "D", WINDOW)
    refresh(windowed, "E")
    assert_same_as_query(windowed, "E", downstream)
    for step in range(2):
        windowed.sql(f"UPDATE T SET V = 'q{step}' WHERE ID = {step + 1}")
        refresh(windowed, "E")  # D first, then E, for one data timestamp
        assert last_operation(windowed, "D") in ("MERGE", "WRITE:Overwrite")
        assert_same_as_query(windowed, "D", WINDOW)
        assert_same_as_query(windowed, "E", downstream)
    assert_consistent(windowed, "D")
    assert_consistent(windowed, "E")


def test_a_table_read_through_a_view_is_followed(windowed):
    windowed.sql("CREATE VIEW W AS SELECT ID, K FROM D WHERE K > 0")
    windowed.sql("CREATE DYNAMIC TABLE E TARGET_LAG = '1 minute' AS SELECT ID, K FROM W")
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    assert "FULL (1 inserted, 1 deleted" in refresh(windowed, "D")
    assert last_operation(windowed, "D") == "MERGE"
    refresh(windowed, "E")
    assert_same_as_query(windowed, "E", "SELECT ID, K FROM W")


# 2. The overwrite against other writers of the table


def test_compaction_during_the_overwrites_computation_does_not_refuse_it(windowed, monkeypatch):
    many_files(windowed)
    uri = windowed.require_table("D").uri
    results = []
    after_follower_check(monkeypatch, lambda: results.append(
        compact_table(windowed.spark, uri, CompactionPolicy())))  # fmt: skip
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    status = refresh(windowed, "D")
    assert results[0].status == "SUCCEEDED", results
    assert "FULL" in status and "FAILED" not in status, status
    assert last_operation(windowed, "D") == "WRITE:Overwrite"
    assert_same_as_query(windowed, "D", WINDOW)
    assert len(DeltaTable(uri).file_uris()) == 1
    assert_consistent(windowed, "D")


def test_a_decided_overwrite_rolls_forward_over_a_compaction(
    windowed, session_factory, monkeypatch
):
    """The refresh's roll-forward fails after the decision (COMMIT_PENDING); a compaction
    lands; a new session's recovery rolls the overwrite forward on the compacted table:
    every compacted row goes, the result is in once."""
    many_files(windowed)
    uri = windowed.require_table("D").uri

    left_pending(windowed, monkeypatch)
    assert len(windowed.catalog.pending_commits()) == 1
    result = compact_table(windowed.spark, uri, CompactionPolicy())
    assert result.status == "SUCCEEDED", result
    fresh = session_factory()  # opening it recovers
    assert fresh.catalog.pending_commits() == []
    assert last_operation(fresh, "D") == "WRITE:Overwrite"
    assert_same_as_query(fresh, "D", WINDOW)
    assert_consistent(fresh, "D")


def test_two_sessions_computing_overwrites_at_once_apply_one(
    windowed, session_factory, monkeypatch
):
    other = session_factory()
    seen = []
    after_follower_check(monkeypatch, lambda: seen.append(refresh(other, "D")))
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    mine = refresh(windowed, "D")
    assert "FULL" in seen[0], seen
    assert "SKIPPED" in mine or "CONCURRENT" in mine, mine
    info = windowed.require_table("D")
    history = windowed.catalog.list_refreshes(info.id)
    assert sorted((r.state, r.reason) for r in history[:2]) == [
        ("SKIPPED", "CONCURRENT_REFRESH"),
        ("SUCCEEDED", ""),
    ]
    assert_same_as_query(windowed, "D", WINDOW)
    assert_consistent(windowed, "D")


def test_a_decided_overwrite_is_not_wedged_by_an_outside_write(
    windowed, session_factory, monkeypatch
):
    uri = windowed.require_table("D").uri

    left_pending(windowed, monkeypatch)
    append_outside_the_protocol(uri)
    fresh = session_factory()
    fresh.sql("UPDATE T SET V = 'y' WHERE ID = 3")
    refresh(fresh, "D")  # the next refresh: recovers the decided commit first
    assert fresh.catalog.pending_commits() == []
    assert_same_as_query(fresh, "D", WINDOW)


def test_a_decided_merge_rolls_forward_over_an_outside_write(
    windowed, session_factory, monkeypatch
):
    """The counterpart of the test above with a follower (a MERGE refresh): it rolls
    forward, and the next refresh repairs the table."""
    windowed.sql("CREATE STREAM S ON TABLE D")
    uri = windowed.require_table("D").uri
    left_pending(windowed, monkeypatch)
    append_outside_the_protocol(uri)
    fresh = session_factory()
    assert fresh.catalog.pending_commits() == []
    assert last_operation(fresh, "D") == "MERGE"


# 3. What readers see across an overwrite


def test_changes_and_time_travel_across_an_overwrite_of_compacted_files(windowed):
    many_files(windowed)
    uri = windowed.require_table("D").uri
    assert compact_table(windowed.spark, uri, CompactionPolicy()).status == "SUCCEEDED"
    old, version = by_id(windowed, "D"), DeltaTable(uri).version()
    old_bag = bag(windowed, "SELECT * FROM D")
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    windowed.sql("DELETE FROM T WHERE ID = 11")
    status = refresh(windowed, "D")
    assert f"{len(old)} deleted" in status, status
    assert last_operation(windowed, "D") == "WRITE:Overwrite"
    assert bag(windowed, f"SELECT * FROM D AT(VERSION => {version})") == old_bag
    changes = [tuple(r) for r in windowed.sql(
        'SELECT ID, V, K, "METADATA$ACTION", "METADATA$ROW_ID" FROM D '
        f"CHANGES(INFORMATION => DEFAULT) AT(VERSION => {version})").collect()]  # fmt: skip
    assert apply_stream(old, changes) == by_id(windowed, "D")
    assert_same_as_query(windowed, "D", WINDOW)
    assert_consistent(windowed, "D")


def test_many_rows_nulls_and_an_empty_result_overwrite(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR, F FLOAT)")
    session.sql("INSERT INTO T SELECT id, CASE WHEN id % 3 = 0 THEN NULL ELSE 'v' END, "
                "CASE WHEN id % 5 = 0 THEN NULL ELSE id / 7.0 END FROM range(50000)")  # fmt: skip
    query = "SELECT V, F, count(*) OVER (PARTITION BY V) AS K FROM T"
    session.sql(f"CREATE DYNAMIC TABLE D {FULL_TABLE} AS {query}")
    session.sql("UPDATE T SET V = NULL, F = NULL WHERE ID % 2 = 0")
    status = refresh(session, "D")
    assert "FULL (50000 inserted, 50000 deleted" in status, status
    assert last_operation(session, "D") == "WRITE:Overwrite"
    assert_same_as_query(session, "D", query)
    ids = DeltaTable(session.require_table("D").uri).to_pyarrow_table(
        columns=[ROW_ID_COLUMN]).column(0)  # fmt: skip
    assert len(set(ids.to_pylist())) == 50000
    session.sql("DELETE FROM T WHERE ID > 0")
    session.sql("UPDATE T SET V = NULL, F = NULL")  # one row, all NULL
    assert "FULL (1 inserted, 50000 deleted" in refresh(session, "D")
    assert_same_as_query(session, "D", query)
    session.sql("DELETE FROM T")
    assert "FULL (0 inserted, 1 deleted" in refresh(session, "D")
    assert bag(session, "SELECT * FROM D") == Counter()
    assert_consistent(session, "D")


def test_a_stateless_table_falling_back_to_full_with_nulls_keeps_its_ids(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, NULL), (2, NULL), (NULL, NULL)")
    query = "SELECT ID, V FROM T UNION ALL SELECT ID, V FROM T WHERE V IS NULL"
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {query}")
    session.sql("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' REFRESH_MODE = "
                f"INCREMENTAL_STRICT AS {query}")  # fmt: skip
    before_d, before_x = by_id(session, "D"), by_id(session, "X")
    x_version = DeltaTable(session.require_table("X").uri).version()
    session.sql("UPDATE T SET V = 'x' WHERE ID = 2")
    for path in Path(session.require_table("T").uri).rglob("_change_data/*.parquet"):
        path.unlink()
    assert "FULL" in refresh(session, "D")
    assert last_operation(session, "D") == "WRITE:Overwrite"
    assert_same_as_query(session, "D", query)
    after = by_id(session, "D")
    assert set(after) < set(before_d)  # the ids derived from T's rows, kept
    assert [after[k] for k in after if after[k] != before_d[k]] == [("#2", "x")]
    with pytest.raises(SqlError, match="INCREMENTAL_STRICT"):
        refresh(session, "X")
    assert DeltaTable(session.require_table("X").uri).version() == x_version
    assert by_id(session, "X") == before_x
    assert_consistent(session, "D")


# 4. Everything at once


def test_followers_coming_and_going_while_refreshes_and_compactions_race(session_factory):
    """Two sessions refresh D in loops (MERGE or overwrite, as followers come and go), a
    thread compacts it, another creates a stream on D, consumes it once and drops it,
    and creates and drops a dynamic table reading D, while DML changes T. Every
    consumption, applied to D at the stream's old offset, gives D at its new offset; D
    ends equal to its query, each refresh in its log once."""
    main, r1, r2, toggler = (session_factory() for _ in range(4))
    main.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    main.sql("INSERT INTO T VALUES (1, 'a'), (2, 'a'), (3, 'b'), (4, 'c')")
    main.sql(f"CREATE DYNAMIC TABLE D {FULL_TABLE} AS {WINDOW}")
    main.sql("CREATE TABLE SINK (ID NUMBER, V VARCHAR, K NUMBER, A VARCHAR, R NUMBER, B NUMBER)")
    uri = main.require_table("D").uri
    stop, crashes, checked, operations = threading.Event(), [], [], set()

    def refresher(session):
        while not stop.is_set():
            try:
                session.sql("ALTER DYNAMIC TABLE D REFRESH")
            except SqlError as exc:
                if exc.code not in ("OBJECT_NOT_FOUND", "DYNAMIC_TABLE_REFRESH_FAILED"):
                    raise

    def compactor():
        while not stop.is_set():
            compact_table(main.spark, uri, CompactionPolicy())
            stop.wait(0.2)

    def toggle():
        batch = 0
        while not stop.is_set():
            batch += 1
            toggler.sql("CREATE OR REPLACE STREAM S ON TABLE D")
            stream = toggler.catalog.get_stream("DB", "PUBLIC", "S")
            offset = stream.offset_version
            stop.wait(0.5)
            toggler.sql('INSERT INTO SINK SELECT ID, V, K, "METADATA$ACTION", '
                        f'"METADATA$ROW_ID", {batch} FROM S')  # fmt: skip
            moved = toggler.catalog.get_stream("DB", "PUBLIC", "S").offset_version
            changes = [tuple(r) for r in toggler.sql(
                f"SELECT ID, V, K, A, R FROM SINK WHERE B = {batch}").collect()]  # fmt: skip
            assert apply_stream(by_id(toggler, "D", offset), changes) == by_id(
                toggler, "D", moved), (offset, moved)  # fmt: skip
            checked.append((offset, moved, len(changes)))
            toggler.sql("DROP STREAM S")
            stop.wait(1.0)  # nothing follows D for a while: its FULL refreshes overwrite
            if batch % 2:
                try:
                    toggler.sql("CREATE DYNAMIC TABLE E TARGET_LAG = DOWNSTREAM AS "
                                "SELECT ID, K FROM D WHERE ID > 1")  # fmt: skip
                except SqlError as exc:  # D's refresh for E's moment lost a race
                    assert "UPSTREAM_NOT_REFRESHED" in str(exc), exc
                else:
                    toggler.sql("DROP DYNAMIC TABLE E")

    threads = [
        threading.Thread(target=guarded(lambda s=s: refresher(s), crashes)) for s in (r1, r2)
    ]
    threads += [
        threading.Thread(target=guarded(compactor, crashes)),
        threading.Thread(target=guarded(toggle, crashes)),
    ]
    for thread in threads:
        thread.start()
    try:
        for step in range(6):
            if step % 3 == 0:
                main.sql(f"INSERT INTO T VALUES ({10 + step}, 'n{step % 2}'), ({20 + step}, NULL)")
            elif step % 3 == 1:
                main.sql(f"UPDATE T SET V = 'u{step}' WHERE ID % 3 = {step % 3}")
            else:
                main.sql(f"DELETE FROM T WHERE ID % 5 = {step % 5}")
            stop.wait(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert crashes == []
    for entry in DeltaTable(uri).history():
        mode = (entry.get("operationParameters") or {}).get("mode")
        operations.add(f"{entry['operation']}:{mode}")
    assert checked, "no consumption was checked"
    # Which refreshes overwrote depends on the timing; one more without followers does.
    main.sql("DROP STREAM IF EXISTS S")
    main.sql("DROP DYNAMIC TABLE IF EXISTS E")
    main.sql("UPDATE T SET V = 'last' WHERE ID = 1")
    main.sql("ALTER DYNAMIC TABLE D REFRESH")
    entry = DeltaTable(uri).history(1)[0]
    assert (entry["operation"], entry["operationParameters"].get("mode")) == (
        "WRITE", "Overwrite"), operations  # fmt: skip
    assert_same_as_query(main, "D", WINDOW)
    assert_consistent(main, "D")


@pytest.mark.parametrize("what", ["CREATE OR REPLACE", "DROP", "SUSPEND"])
def test_ddl_on_the_table_while_its_overwrite_is_computed(
    windowed, session_factory, monkeypatch, what
):
    other = session_factory()
    replaced = "SELECT ID, V, ID * 10 AS K FROM T"
    statement = {
        "CREATE OR REPLACE": f"CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' "
                             f"AS {replaced}",
        "DROP": "DROP DYNAMIC TABLE D",
        "SUSPEND": "ALTER DYNAMIC TABLE D SUSPEND",
    }[what]  # fmt: skip
    after_follower_check(monkeypatch, lambda: other.sql(statement))
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    old = windowed.require_table("D")
    try:
        refresh(windowed, "D")
    except SqlError as exc:
        assert what != "SUSPEND" and exc.code == "OBJECT_NOT_FOUND", exc
    assert windowed.catalog.pending_commits() == []
    if what == "DROP":
        assert windowed.find_table("DB", "PUBLIC", "D") is None
        assert not Path(old.uri).exists()
        return
    assert_same_as_query(windowed, "D", replaced if what == "CREATE OR REPLACE" else WINDOW)
    if what == "CREATE OR REPLACE":
        assert not Path(old.uri).exists()
    assert_consistent(windowed, "D")
