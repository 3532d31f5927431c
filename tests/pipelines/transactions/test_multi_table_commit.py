"""A multi-table transaction against every other writer of its tables: all or nothing,
the first committer wins, and a decided commit is never stuck.

Transaction A consumes stream S into T1 (an append) and updates row 1 of T2 (a merge).
Another writer B touches T2 before A starts, between A's statements, right before
A's COMMIT, or during A's commit at each of its steps (a failpoint runs B there): B is
an auto-commit UPDATE in another session, a channel flush, a compaction, or another
multi-table transaction. After each: T1 holds S's rows once or not at all, together
with A's update of T2; the stream is consumable; nothing stays pending. The killed
variants (SIGKILL at each step, then another writer) are in test_multi_table_kill.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import flush.failpoints as failpoints
import pipelines.transactions.commit as pipeline_commit
from catalog import ChannelProgress, IntentConflict
from flush import TableWriter, read_table
from flush.change_commit import landed_version
from flush.compaction import compact_table
from flush.maintenance import vacuum_data_folders
from flush.tables import TXN_RETENTION
from ingest_sdk import convert_rows
from pipelines import Session, SqlError, TransactionConflictError
from pipelines.transactions.commit_owner import process_identity
from tests.pipelines.conftest import rows

SOURCE = [(10, "a"), (11, "b"), (12, "c")]
A_STATEMENTS = [
    "INSERT INTO t1 SELECT id, v FROM s",
    "UPDATE t2 SET v = 'fromA' WHERE id = 1",
]


def setup(session: Session) -> None:
    for statement in (
        "CREATE TABLE src (id NUMBER, v VARCHAR)",
        "CREATE TABLE t1 (id NUMBER, v VARCHAR)",
        "CREATE TABLE t2 (id NUMBER, v VARCHAR)",
        "CREATE TABLE t3 (id NUMBER, v VARCHAR)",
        "CREATE STREAM s ON TABLE src",
        "INSERT INTO t2 VALUES (1, 'orig'), (2, 'orig')",
        "INSERT INTO src VALUES " + ", ".join(f"({i}, '{v}')" for i, v in SOURCE),
    ):
        session.sql(statement)


def table(session: Session, name: str) -> list[tuple]:
    return [(int(i), v) for i, v in rows(session.sql(f"SELECT id, v FROM {name}"))]


def t2(session: Session) -> dict[int, str]:
    return dict(table(session, "t2"))


def t2_in_delta(session: Session) -> dict[int, str]:
    """T2 as its Delta log has it now (delta-rs; no session, so no waiting)."""
    data = read_table(session.require_table("t2").uri)
    ids, values = data.column("ID").to_pylist(), data.column("V").to_pylist()
    return {int(i): v for i, v in zip(ids, values, strict=True)}


def check_settled(session: Session, a_committed: bool) -> None:
    """All or nothing for A, no commit pending, the stream free and usable."""
    assert table(session, "t1") == (SOURCE if a_committed else [])
    assert table(session, "s") == ([] if a_committed else SOURCE)
    assert session.catalog.pending_commits() == []
    assert session.catalog.get_stream("DB", "PUBLIC", "S").claimed_by is None
    session.sql("INSERT INTO src VALUES (13, 'd')")
    session.sql("INSERT INTO t1 SELECT id, v FROM s")
    assert table(session, "t1") == sorted([*SOURCE, (13, "d")])
    assert table(session, "s") == []


def run_a(session: Session) -> None:
    with session.transaction():
        for statement in A_STATEMENTS:
            session.sql(statement)


def at_failpoint(monkeypatch, point: str, action) -> list[str]:
    """Run ``action`` the first time the commit path passes ``point``; returns the
    points passed, in order."""
    passed: list[str] = []
    real = pipeline_commit.failpoint

    def failpoint(name: str) -> None:
        real(name)
        passed.append(name)
        if name == point and passed.count(name) == 1:
            action()

    monkeypatch.setattr(pipeline_commit, "failpoint", failpoint)
    return passed


# 1. B's write before A, between A's statements, right before A's COMMIT


@pytest.mark.parametrize("moment", ["before_begin", "between_statements", "before_commit"])
def test_the_first_committer_wins_whatever_the_moment(moment, session_factory):
    """A pins T2 when its UPDATE first reads it: B's update before that is what A
    overwrites; B's update after it (the issue's reproduction) makes A's COMMIT fail
    with a conflict that changed nothing, not a half-applied commit."""
    a = session_factory()
    setup(a)
    b = session_factory()

    def b_writes() -> None:
        b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")

    if moment == "before_begin":
        b_writes()
    a.sql("BEGIN")
    a.sql(A_STATEMENTS[0])
    if moment == "between_statements":
        b_writes()
    a.sql(A_STATEMENTS[1])
    if moment == "before_commit":
        b_writes()
        with pytest.raises(TransactionConflictError, match="changed nothing") as conflict:
            a.sql("COMMIT")
        assert conflict.value.code == "TRANSACTION_CONFLICT"
        assert "DB.PUBLIC.T2" in str(conflict.value)
        assert t2(a) == {1: "fromB", 2: "orig"}  # B's update stands, A's T1 rows never landed
        check_settled(b, a_committed=False)
        return
    a.sql("COMMIT")
    assert t2(a) == {1: "fromA", 2: "orig"}
    check_settled(b, a_committed=True)


def test_the_loser_runs_again_and_consumes_once(session_factory):
    a = session_factory()
    setup(a)
    b = session_factory()
    a.sql("BEGIN")
    for statement in A_STATEMENTS:
        a.sql(statement)
    b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")
    with pytest.raises(TransactionConflictError):
        a.sql("COMMIT")
    run_a(a)  # again, on fresh data
    assert t2(a) == {1: "fromA", 2: "orig"}
    check_settled(b, a_committed=True)


# 2. B during A's commit, at each step


def _wait_for_intents(session: Session) -> threading.Event:
    """An event set when ``session`` finds its tables held by another commit: its
    reservation by a conflicting intent, or its first read by a decided commit."""
    blocked = threading.Event()
    real = session.catalog.reserve_commit

    real_pending = session.catalog.pending_commits

    def reserve_commit(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except IntentConflict:
            blocked.set()
            raise

    def pending_commits():  # a decided one holds the session's first read of the table
        found = real_pending()
        if any(p.decided for p in found):
            blocked.set()
        return found

    session.catalog.reserve_commit = reserve_commit  # type: ignore[method-assign]
    session.catalog.pending_commits = pending_commits  # type: ignore[method-assign]
    return blocked


STEPS = ["pipeline_after_reserve", "pipeline_after_validate", "pipeline_after_decide",
         "pipeline_between_tables"]  # fmt: skip


@pytest.mark.parametrize("point", STEPS)
def test_an_update_during_the_commit_waits_for_it_then_goes_after_it(
    point, session_factory, monkeypatch
):
    a = session_factory()
    setup(a)
    b = session_factory()
    blocked = _wait_for_intents(b)
    outcome: dict[str, object] = {}

    def b_updates() -> None:
        try:
            b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")
            outcome["b"] = "ok"
        except BaseException as exc:
            outcome["b"] = exc

    thread = threading.Thread(target=b_updates)

    def start_b() -> None:
        thread.start()
        assert blocked.wait(120), "B was not held by A's intents"

    passed = at_failpoint(monkeypatch, point, start_b)
    run_a(a)
    thread.join(300)
    assert point in passed
    assert outcome["b"] == "ok", outcome  # B retried on A's result: no lost update
    assert t2(a) == {1: "fromB", 2: "orig"}
    check_settled(a, a_committed=True)


_FLUSHES = itertools.count(1)


def _flush_into_t2(session: Session) -> None:
    info = session.require_table("t2")
    batch, _ = convert_rows(info.schema, [{"ID": 50, "V": "flushed"}])
    first = session.catalog.reserve_row_ids(info.id, 1)
    offset = next(_FLUSHES)  # a new offset token each time: a repeated one is skipped
    TableWriter(info.uri, info.schema).commit_flush(
        [pa.Table.from_batches([batch])],
        [ChannelProgress("c1", 1, offset, f"t{offset}", 1)],
        first,
    )


@pytest.mark.parametrize("point", STEPS)
@pytest.mark.parametrize("writer", ["flush", "compaction"])
def test_a_flush_or_compaction_during_the_commit_never_blocks_it(
    writer, point, session_factory, monkeypatch, spark
):
    """Appends and compaction (dataChange=false) need no intent: A's merge of T2 lands
    over them (delta-rs' spurious conflict is retried), and they never wait for A."""
    a = session_factory()
    setup(a)
    a.sql("INSERT INTO t2 VALUES (3, 'orig')")  # a second file, for compaction to merge
    uri = a.require_table("t2").uri
    done: list[str] = []

    def write() -> None:
        if writer == "flush":
            _flush_into_t2(a)
        else:
            assert compact_table(spark, uri).status == "SUCCEEDED"
        done.append(writer)

    at_failpoint(monkeypatch, point, write)
    run_a(a)
    assert done == [writer]
    expected = {1: "fromA", 2: "orig", 3: "orig"} | ({50: "flushed"} if writer == "flush" else {})
    assert t2(a) == expected
    check_settled(a, a_committed=True)


def test_two_multi_table_transactions_on_one_row_one_wins(session_factory, monkeypatch):
    """A and C both update row 1 of T2 and write another table; both stage, then race
    to reserve. Exactly one commits; the other changes nothing (no T1/T3 rows)."""
    a = session_factory()
    setup(a)
    c = session_factory()
    barrier = threading.Barrier(2, timeout=120)
    real = pipeline_commit.failpoint

    def failpoint(name: str) -> None:
        real(name)
        if name == "pipeline_after_stage":  # in each thread: both staged, then reserve
            barrier.wait()

    monkeypatch.setattr(pipeline_commit, "failpoint", failpoint)
    outcome: dict[str, object] = {}

    def run(name: str, session: Session, statements: list[str]) -> None:
        try:
            with session.transaction():
                for statement in statements:
                    session.sql(statement)
            outcome[name] = "ok"
        except BaseException as exc:
            outcome[name] = exc

    threads = [
        threading.Thread(target=run, args=("a", a, A_STATEMENTS)),
        threading.Thread(target=run, args=("c", c, [
            "INSERT INTO t3 VALUES (7, 'fromC')", "UPDATE t2 SET v = 'fromC' WHERE id = 1"
        ])),
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    monkeypatch.undo()  # the barrier is for the race only
    winners = [name for name, result in outcome.items() if result == "ok"]
    assert len(winners) == 1, outcome
    loser = ({"a", "c"} - set(winners)).pop()
    assert isinstance(outcome[loser], TransactionConflictError), outcome
    assert t2(a) == {1: f"from{winners[0].upper()}", 2: "orig"}
    assert table(a, "t3") == ([(7, "fromC")] if winners == ["c"] else [])
    check_settled(c, a_committed=winners == ["a"])


# 3. Owners: given up, dead, pid reused, alive


def decided_and_left(session: Session, monkeypatch) -> int:
    """A's commit decided, then A gave up (a failure right after the decision)."""
    monkeypatch.setitem(failpoints._POINTS, "pipeline_after_decide", ["error", 1])
    with pytest.raises(SqlError) as failed:
        run_a(session)
    assert failed.value.code == "COMMIT_PENDING"
    (pending,) = session.catalog.pending_commits()
    assert pending.decided and pending.owner == ""  # handed to recovery, not held
    return pending.id


@pytest.fixture
def sleeper():
    process = subprocess.Popen(["sleep", "600"])
    yield process
    process.kill()
    process.wait()


@pytest.mark.parametrize("owner_kind", ["released", "pid_reused", "legacy_pid_only"])
def test_a_writer_completes_a_commit_whose_owner_is_gone(
    owner_kind, session_factory, monkeypatch, sleeper
):
    """The next writer of T2 rolls A forward first (A's update, then B's), whether A's
    owner gave up, or its pid now belongs to another process (another start time), or
    was written by an older version as ``pid:token``."""
    a = session_factory()
    setup(a)
    b = session_factory()  # opened before: its opening recovered nothing
    commit_id = decided_and_left(a, monkeypatch)
    start = process_identity(sleeper.pid).split(":")[1]
    fake = {
        "released": "",
        "pid_reused": f"{sleeper.pid}:{int(start) + 1}:{process_identity(os.getpid()).split(':')[2]}:x",
        "legacy_pid_only": f"{sleeper.pid}:abc123",
    }[owner_kind]
    if fake:
        assert a.catalog.take_over_commit(commit_id, "", fake)
    b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")
    assert t2(b) == {1: "fromB", 2: "orig"}
    check_settled(b, a_committed=True)


def held_by_live_owner(session_factory, monkeypatch, pid: int) -> Session:
    """A's commit decided and owned by the live process ``pid`` (which never finishes
    it); writers wait 1 s. Returns B's session, opened before."""
    a = session_factory()
    setup(a)
    b = session_factory()
    commit_id = decided_and_left(a, monkeypatch)
    alive = f"{process_identity(pid)}:x"  # the very process: alive for sure
    assert a.catalog.take_over_commit(commit_id, "", alive)
    monkeypatch.setattr(pipeline_commit, "INTENT_WAIT_SECONDS", 1.0)
    return b


def test_a_live_owner_holds_its_tables_and_writers_are_told(session_factory, monkeypatch, sleeper):
    b = held_by_live_owner(session_factory, monkeypatch, sleeper.pid)
    with pytest.raises(SqlError) as busy:
        b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")
    assert busy.value.code == "TABLE_BUSY"
    assert "changed nothing" in str(busy.value) and "UPDATE t2" in str(busy.value)
    # A not rolled forward by B, B not applied (read from the log: a session's read of
    # T2 would wait for A too)
    assert t2_in_delta(b) == {1: "orig", 2: "orig"}
    with pytest.raises(SqlError) as drop:
        b.sql("DROP TABLE t2")
    assert drop.value.code == "TABLE_BUSY" and "DB.PUBLIC.T2" in str(drop.value)
    with pytest.raises(SqlError) as cascade:
        b.sql("DROP SCHEMA public CASCADE")
    assert cascade.value.code == "TABLE_BUSY"
    with pytest.raises(SqlError) as replace:
        b.sql("CREATE OR REPLACE TABLE t2 AS SELECT 1 AS id")
    assert replace.value.code == "TABLE_BUSY"
    assert sorted(t.name for t in b.catalog.list_tables()) == ["SRC", "T1", "T2", "T3"]
    assert t2_in_delta(b) == {1: "orig", 2: "orig"}  # nothing replaced, nothing set aside
    sleeper.kill()
    sleeper.wait()
    b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")  # the owner is dead: B completes A first
    assert t2(b) == {1: "fromB", 2: "orig"}
    check_settled(b, a_committed=True)
    b.sql("DROP TABLE t3")  # no commit names it any more


def test_a_drop_completes_a_dead_owners_commit_first(session_factory, monkeypatch):
    """DROP TABLE of a table a released commit writes: the drop rolls A forward (T1
    gets its rows, the stream moves), then drops."""
    a = session_factory()
    setup(a)
    b = session_factory()
    decided_and_left(a, monkeypatch)
    b.sql("DROP TABLE t2")
    assert b.catalog.pending_commits() == []
    assert sorted(table(b, "t1")) == sorted(SOURCE)
    assert rows(b.sql("SELECT * FROM s")) == []


# 4. A catalog restored from a backup older than the tables


def test_a_restored_catalog_never_skips_a_commit_nor_redelivers_a_change(tmp_path, session_factory):
    warehouse = tmp_path / "warehouse"
    first = session_factory(warehouse)
    setup(first)
    catalog_file = warehouse / "catalog.sqlite"
    backup = tmp_path / "backup.sqlite"
    with sqlite3.connect(catalog_file) as live, sqlite3.connect(backup) as copy:
        live.backup(copy)
    run_a(first)  # pending commit n, stream moved past SOURCE: the backup knows neither
    first.sql("UPDATE t2 SET v = 'second' WHERE id = 2")
    first.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{catalog_file}{suffix}").unlink(missing_ok=True)
    shutil.copy(backup, catalog_file)

    restored = session_factory(warehouse)
    # The next commits reuse the pending commit ids of the lost ones: each still lands.
    restored.sql("UPDATE t2 SET v = 'restored' WHERE id = 1")
    restored.sql("UPDATE t3 SET v = 'x' WHERE id = 0")  # no row: an empty commit
    assert t2(restored) == {1: "restored", 2: "second"}
    # The stream's offset in the catalog is behind T1's log: consuming it again would
    # deliver SOURCE twice. It is caught up instead, and the next run consumes the rest.
    restored.sql("INSERT INTO src VALUES (14, 'e')")
    with pytest.raises(pipeline_commit.StreamConflictError, match="restored from an older"):
        restored.sql("INSERT INTO t1 SELECT id, v FROM s")
    assert table(restored, "t1") == SOURCE
    restored.sql("INSERT INTO t1 SELECT id, v FROM s")
    assert table(restored, "t1") == sorted([*SOURCE, (14, "e")])
    assert table(restored, "s") == []


# 5. Bookkeeping and the small defects


def test_pipeline_app_transactions_expire_and_merge_files_are_vacuumed(session):
    setup(session)
    uri = session.require_table("t2").uri
    assert (
        DeltaTable(uri).metadata().configuration["delta.setTransactionRetentionDuration"]
        == TXN_RETENTION
    )
    DeltaTable(uri).alter.set_table_properties(
        {"delta.setTransactionRetentionDuration": "interval 1 seconds"}
    )
    run_a(session)
    stream = session.catalog.get_stream("DB", "PUBLIC", "S")
    app = pipeline_commit.stream_app_id(stream)
    t1_uri = session.require_table("t1").uri
    assert DeltaTable(t1_uri).transaction_version(app) is not None  # 7 days there
    time.sleep(1.5)
    assert DeltaTable(uri).transaction_version(app) is None  # it carried its time
    # The merge's data and change-data files are within the vacuum's reach.
    before = {p.relative_to(uri).as_posix() for p in Path(uri).rglob("*.parquet")}
    assert any("/" not in p for p in before) and any(p.startswith("_change_data/") for p in before)
    session.sql("UPDATE t2 SET v = 'again' WHERE id = 1")
    deleted = vacuum_data_folders(uri, retention_hours=0, allow_short_retention=True)
    assert any("/" not in p for p in deleted) and any(
        p.startswith("_change_data/") for p in deleted
    )
    assert t2(session) == {1: "again", 2: "orig"}


def test_landed_version_is_the_commits_own(session):
    setup(session)
    info = session.require_table("t2")
    base = DeltaTable(info.uri).version()
    session.sql("UPDATE t2 SET v = 'x' WHERE id = 1")
    mine = DeltaTable(info.uri).version()
    _flush_into_t2(session)
    _flush_into_t2(session)
    history = DeltaTable(info.uri).history()
    app = next(
        __import__("orjson").loads(e["ingest.pipelines"])["app_id"]
        for e in history if "ingest.pipelines" in e
    )  # fmt: skip
    assert DeltaTable(info.uri).version() == mine + 2
    assert landed_version(DeltaTable(info.uri), app, base) == mine
    assert landed_version(DeltaTable(info.uri), app + "x", base) is None  # never landed


def test_update_from_counts_multi_joined_rows(session):
    setup(session)
    session.sql("INSERT INTO t3 VALUES (1, 'p'), (1, 'q'), (2, 'r')")
    result = session.sql("UPDATE t2 SET v = t3.v FROM t3 WHERE t2.id = t3.id").collect()[0]
    assert result.asDict() == {
        "number of rows updated": 2, "number of multi-joined rows updated": 1
    }  # fmt: skip
    assert t2(session)[1] in ("p", "q") and t2(session)[2] == "r"


def test_a_delete_only_merge_with_duplicate_matches_is_deterministic(session):
    setup(session)
    session.sql("INSERT INTO t3 VALUES (1, 'p'), (1, 'q')")
    result = session.sql(
        "MERGE INTO t2 USING t3 ON t2.id = t3.id WHEN MATCHED THEN DELETE"
    ).collect()[0]
    assert result["number of rows deleted"] == 1
    assert t2(session) == {2: "orig"}
    session.sql("INSERT INTO t2 VALUES (1, 'orig')")
    for clauses in (
        "WHEN MATCHED THEN UPDATE SET v = t3.v",
        "WHEN MATCHED AND t3.v = 'p' THEN DELETE WHEN MATCHED THEN UPDATE SET v = t3.v",
    ):
        with pytest.raises(SqlError) as refused:
            session.sql(f"MERGE INTO t2 USING t3 ON t2.id = t3.id {clauses}")
        assert refused.value.code == "NONDETERMINISTIC_MERGE"
    assert t2(session) == {1: "orig", 2: "orig"}
