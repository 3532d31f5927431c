"""Adversarial tests of ABANDON COMMIT, SHOW PENDING COMMITS, the read-past of a query
alone, and statement deadlines (pipelines/commit_admin.py, pipelines/commit.py,
pipelines/statement_deadline.py, pipelines/worker.py).

Transaction A (test_multi_table_commit.py) consumes stream S into T1 (an append) and
updates row 1 of T2 (a merge). Its commit is decided and left to recovery; "damage"
is T2's staged file removed by hand, so T2's change can never land while T1's can.

Written by the adversarial review of these statements. Six cases showed defects, now
fixed: an undecided commit reported as completed, a commit every table held reported
as half-applied, an unreadable table taken for "not landed" (abandoned whole, rows
delivered twice), a commit stuck past the app-transaction retention applied twice, a
decided commit past its timeout reported as "nothing changed", and non-ASCII digits
read as a commit id. The others confirm properties that held under attack.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import flush.change_commit as change_commit
import flush.failpoints as failpoints
import pipelines.transactions.commit as pipeline_commit
import pipelines.transactions.commit_admin as commit_admin
from flush import read_table
from flush.compaction import CompactionPolicy, compact_table
from pipelines import Session, SqlError
from pipelines.sql.statements import classify
from pipelines.transactions.statement_deadline import statement_deadline
from tests.pipelines.conftest import rows
from tests.pipelines.transactions.test_multi_table_commit import (
    SOURCE,
    at_failpoint,
    decided_and_left,
    held_by_live_owner,
    run_a,
    setup,
    t2,
    t2_in_delta,
    table,
)
from tests.pipelines.transactions.test_stuck_commit import pending_rows, staged_file
from tests.servers import ROOT


def damaged(session_factory, monkeypatch) -> tuple[Session, int, Path]:
    """A decided, T1 landed (a reader's recovery), T2's staged file gone for good.
    Returns B's session (opened before A's commit), the commit id and the removed
    file's place (moved aside to ``<file>.aside``, so that a test can mend it)."""
    a = session_factory()
    setup(a)
    b = session_factory()
    commit_id = decided_and_left(a, monkeypatch)
    staged = staged_file(a, commit_id, "T2")
    staged.rename(staged.with_name(staged.name + ".aside"))
    assert sorted(table(b, "t1")) == sorted(SOURCE)  # read past: T1 landed, T2 failed
    assert pending_rows(b)[0]["landed_in"] == "DB.PUBLIC.T1"
    return b, commit_id, staged


def mend(staged: Path) -> None:
    aside = staged.with_name(staged.name + ".aside")
    if aside.exists():
        aside.rename(staged)


def child(warehouse: Path, body: str) -> subprocess.Popen:
    """A Python child (no Spark) working on the warehouse's catalog."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from catalog import SqliteCatalog
        catalog = SqliteCatalog({str(warehouse / "catalog.sqlite")!r})
        """
    ) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


# 1. Defects: what ABANDON COMMIT says and does


def test_abandon_of_an_undecided_commit_of_a_dead_owner_says_nothing_was_written(
    session_factory, monkeypatch
):
    a = session_factory()
    setup(a)
    b = session_factory()  # opened before: its opening recovered nothing

    def owner_dies() -> None:  # A's process "dies" right after reserving (still preparing)
        (pending,) = a.catalog.pending_commits()
        assert a.catalog.take_over_commit(pending.id, pending.owner, "")
        raise RuntimeError("power cut")

    at_failpoint(monkeypatch, "pipeline_after_reserve", owner_dies)
    with pytest.raises(RuntimeError):
        run_a(a)
    monkeypatch.undo()
    (pending,) = b.catalog.pending_commits()
    assert not pending.decided
    (status,) = b.sql(f"ABANDON COMMIT {pending.id}").collect()
    # Nothing of A was applied: T1 empty, T2 as before, S still offers its rows.
    assert table(b, "t1") == [] and t2(b) == {1: "orig", 2: "orig"}
    assert table(b, "s") == SOURCE
    assert "every table has its change" not in status[0], status[0]


def test_abandon_of_a_commit_every_table_holds_finishes_it(session_factory, monkeypatch):
    a = session_factory()
    setup(a)
    b = session_factory()
    # Both tables land, the catalog's finish fails twice (A's try, ABANDON's retry).
    monkeypatch.setitem(failpoints._POINTS, "pipeline_before_finish", ["error", 2])
    with pytest.raises(SqlError) as failed:
        run_a(a)
    assert failed.value.code == "COMMIT_PENDING"
    (pending,) = b.catalog.pending_commits()
    assert t2_in_delta(b) == {1: "fromA", 2: "orig"}  # landed in both
    (status,) = b.sql(f"ABANDON COMMIT {pending.id}").collect()
    assert sorted(table(b, "t1")) == sorted(SOURCE) and table(b, "s") == []
    assert "HALF-APPLIED" not in status[0] and "never will" not in status[0], status[0]


def test_abandon_with_an_unreadable_table_decides_nothing(
    session_factory, monkeypatch
):
    b, commit_id, _staged = damaged(session_factory, monkeypatch)
    t1 = Path(b.require_table("t1").uri)
    away = t1.with_name(t1.name + ".unmounted")
    t1.rename(away)  # T1's storage is briefly unavailable
    try:
        outcome = b.sql(f"ABANDON COMMIT {commit_id}").collect()[0][0]
    except SqlError as refused:  # the right answer: cannot tell what landed
        outcome = f"refused: {refused}"
    finally:
        away.rename(t1)
    assert outcome.startswith("refused") and "COMMIT_STATE_UNKNOWN" not in outcome
    assert "cannot be read" in outcome and "DB.PUBLIC.T1" in outcome
    assert [p.id for p in b.catalog.pending_commits()] == [commit_id]  # nothing given up
    again = b.sql(f"ABANDON COMMIT {commit_id}").collect()[0][0]  # readable again
    assert "HALF-APPLIED" in again
    assert sorted(table(b, "t1")) == sorted(SOURCE)  # T1 does hold A's rows
    b.sql("INSERT INTO t3 SELECT id, v FROM s")
    delivered = table(b, "t1") + table(b, "t3")
    assert sorted(delivered) == sorted(SOURCE), (outcome, delivered)  # each row once


def test_a_commit_stuck_past_the_app_transaction_retention_lands_once(
    session_factory, monkeypatch, spark
):
    a = session_factory()
    setup(a)
    b = session_factory()
    commit_id = decided_and_left(a, monkeypatch)
    staged = staged_file(a, commit_id, "T2")
    staged.rename(staged.with_name(staged.name + ".aside"))
    eight_days_ago = time.time() - 8 * 86_400
    # T1 landed 8 days ago (its app transactions carry that time), T2 failed since.
    monkeypatch.setattr(change_commit, "time", SimpleNamespace(time=lambda: eight_days_ago))
    pipeline_commit.recover_pending(b.catalog, only={commit_id})
    monkeypatch.undo()
    uri = b.require_table("t1").uri
    policy = CompactionPolicy(clustering=("ID",))
    assert compact_table(spark, uri, policy).status == "SUCCEEDED"  # the service compacts
    assert read_table(uri).num_rows == len(SOURCE)  # once, before the next try (delta-rs)
    (status,) = b.sql(f"ABANDON COMMIT {commit_id}").collect()
    assert sorted(table(b, "t1")) == sorted(SOURCE), (status[0], table(b, "t1"))


def test_a_decided_commit_past_its_timeout_is_reported_pending(
    session_factory, monkeypatch
):
    from pipelines.worker import SessionPool, StatementClock, answer_statement

    s = session_factory()
    s.sql("CREATE TABLE t3 (id NUMBER, v VARCHAR)")
    real = pipeline_commit._roll_forward

    def slow_then_failing(catalog, pending):
        time.sleep(1.5)  # a slow disk, past the statement's 1 s
        raise OSError("I/O error")

    monkeypatch.setattr(pipeline_commit, "_roll_forward", slow_then_failing)
    pool = SessionPool(s.warehouse, s.spark, s.catalog)
    try:
        answer, _ = answer_statement(pool, StatementClock(s.spark), {
            "statement": "INSERT INTO t3 VALUES (5, 'x')", "session": "k", "timeout": 1.0})  # fmt: skip
    finally:
        pool.close_all()
    monkeypatch.setattr(pipeline_commit, "_roll_forward", real)
    assert table(session_factory(), "t3") == [(5, "x")]  # recovery applied the INSERT
    assert answer["error"]["code"] != "STATEMENT_TIMEOUT", answer


def test_abandon_commit_refuses_non_ascii_digits():
    with pytest.raises(SqlError):
        classify("ABANDON COMMIT 1\u0661")


# 2. Races, kills and the read-past: properties that held


@pytest.mark.parametrize("moment", ["mended_before_take_over", "mended_after_take_over"])
def test_abandon_racing_a_recovery_process_while_the_damage_is_mended(
    moment, session_factory, monkeypatch
):
    """Another process runs recovery of the commit in a loop; the damage is mended after
    ABANDON's retry failed, before or after its take-over. Whatever ABANDON answers, the
    outcome agrees with it: completed (T2 has A's update) or half-applied (T2 never gets it,
    even with the staged file back); T1 holds S's rows once; S offers nothing twice."""
    b, commit_id, staged = damaged(session_factory, monkeypatch)
    recovery = child(b.warehouse, f"""
        from pipelines.transactions.commit import recover_pending
        end = time.monotonic() + 60
        while time.monotonic() < end:
            recover_pending(catalog, only={{{commit_id}}})
            if not catalog.pending_commits():
                print("completed by the other process")
                break
            time.sleep(0.01)
        """)  # fmt: skip
    real_recover, real_landed = commit_admin.recover_pending, commit_admin._landed

    def retry_then_mend(catalog, only=None):
        done = real_recover(catalog, only=only)
        if moment == "mended_before_take_over":
            mend(staged)
            # The other process completes it meanwhile: waited for, not timed (on a
            # loaded machine that process starts late).
            end = time.monotonic() + 60
            while b.catalog.pending_commits() and time.monotonic() < end:
                time.sleep(0.05)
        return done

    def mend_then_check(pending):
        if moment == "mended_after_take_over":
            mend(staged)
            time.sleep(1.5)  # the other process must keep off: ABANDON holds it
        return real_landed(pending)

    monkeypatch.setattr(commit_admin, "recover_pending", retry_then_mend)
    monkeypatch.setattr(commit_admin, "_landed", mend_then_check)
    for _ in range(200):  # an operator retries while the other process holds it
        try:
            outcome = b.sql(f"ABANDON COMMIT {commit_id}").collect()[0][0]
            break
        except SqlError as error:
            outcome = f"{error.code}: {error}"
            if error.code != "COMMIT_IN_PROGRESS":
                break
            time.sleep(0.02)
    out, err = recovery.communicate(timeout=60)
    assert recovery.returncode == 0, err
    monkeypatch.undo()
    assert b.catalog.pending_commits() == []
    assert sorted(table(b, "t1")) == sorted(SOURCE)
    assert table(b, "s") == []
    if moment == "mended_before_take_over":
        assert "completed by the other process" in out
        # ABANDON sees it gone: "completed on this try" or OBJECT_NOT_FOUND, nothing given up
        assert "completed" in outcome or outcome.startswith("OBJECT_NOT_FOUND"), outcome
        assert t2(b) == {1: "fromA", 2: "orig"}
    else:
        assert "HALF-APPLIED" in outcome, outcome
        assert t2(b) == {1: "orig", 2: "orig"}
        assert t2(session_factory()) == {1: "orig", 2: "orig"}  # no late roll-forward


def test_sigkill_during_abandon_after_the_take_over(session_factory, monkeypatch):
    """A process killed between ABANDON's take-over and its end leaves the commit pending
    with a dead owner: recovery tries it again (T1 once), SHOW shows it, and ABANDON in
    another session ends it."""
    b, commit_id, staged = damaged(session_factory, monkeypatch)
    killed = child(b.warehouse, f"""
        import pipelines.transactions.commit_admin as admin
        def die(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        catalog.finish_commit = die
        catalog.abandon_commit = die
        print(admin.abandon_commit(catalog, {commit_id}))
        """)  # fmt: skip
    out, err = killed.communicate(timeout=60)
    assert killed.returncode == -9, (out, err)
    (shown,) = pending_rows(b)
    assert shown["id"] == commit_id and shown["owner_alive"] is False
    assert shown["landed_in"] == "DB.PUBLIC.T1"
    assert sorted(table(b, "t1")) == sorted(SOURCE)  # a reader retried it: T1 once
    (status,) = b.sql(f"ABANDON COMMIT {commit_id}").collect()
    assert "HALF-APPLIED" in status[0]
    mend(staged)
    fresh = session_factory()
    assert sorted(table(fresh, "t1")) == sorted(SOURCE) and table(fresh, "s") == []
    assert t2(fresh) == {1: "orig", 2: "orig"} and fresh.catalog.pending_commits() == []


def test_writers_never_read_past_a_commit_that_cannot_complete(session_factory, monkeypatch):
    """Only a query alone reads past: DML reading T2, a transaction's SELECT, CTAS, MERGE,
    TRUNCATE, EXPLAIN, an INSERT into T2 and a consumption of S are refused, changing
    nothing (so no decided change of A is lost, no row of S delivered twice)."""
    b, commit_id, _staged = damaged(session_factory, monkeypatch)
    assert t2(b) == {1: "orig", 2: "orig"}  # the query alone
    assert rows(b.sql("SELECT SYSTEM$STREAM_HAS_DATA('s') AS d")) == [(True,)]
    refused = {}
    for statement in (
        "INSERT INTO t3 SELECT id, v FROM t2",
        "INSERT INTO t2 VALUES (9, 'x')",
        "UPDATE t2 SET v = 'b' WHERE id = 2",
        "DELETE FROM t2 WHERE id = 2",
        "MERGE INTO t3 USING t2 ON t3.id = t2.id WHEN NOT MATCHED THEN INSERT (id, v) "
        "VALUES (t2.id, t2.v)",
        "TRUNCATE TABLE t2",
        "CREATE TABLE t4 AS SELECT * FROM t2",
        "CREATE OR REPLACE TABLE t2 AS SELECT 1 AS id",
        "EXPLAIN SELECT * FROM t2",
        "INSERT INTO t3 SELECT id, v FROM s",  # S is A's: consumed by A
    ):
        with pytest.raises(SqlError) as error:
            b.sql(statement)
        refused[statement] = error.value.code
    b.sql("BEGIN")
    with pytest.raises(SqlError) as in_txn:
        rows(b.sql("SELECT * FROM t2"))
    refused["BEGIN; SELECT"] = in_txn.value.code
    b.sql("ROLLBACK")
    assert set(refused.values()) <= {"TABLE_BUSY", "STREAM_CONSUMED_CONCURRENTLY"}, refused
    assert table(b, "t3") == [] and t2_in_delta(b) == {1: "orig", 2: "orig"}
    assert b.find_table("DB", "PUBLIC", "T4") is None
    assert [p.id for p in b.catalog.pending_commits()] == [commit_id]
    b.sql(f"ABANDON COMMIT {commit_id}")
    assert sorted(table(b, "t1")) == sorted(SOURCE) and table(b, "s") == []


def test_a_wait_past_the_deadline_in_a_transaction_leaves_it_usable(session_factory, monkeypatch):
    """STATEMENT_TIMEOUT of a read inside BEGIN keeps the transaction and what it staged;
    with the owner dead, the next read completes A within its deadline; COMMIT applies
    the staged insert once."""
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        b = held_by_live_owner(session_factory, monkeypatch, sleeper.pid)
        monkeypatch.setattr(pipeline_commit, "INTENT_WAIT_SECONDS", 3600.0)
        b.sql("BEGIN")
        b.sql("INSERT INTO t3 VALUES (7, 'z')")
        started = time.monotonic()
        with statement_deadline(0.7), pytest.raises(SqlError) as late:
            rows(b.sql("SELECT * FROM t2"))
        assert late.value.code == "STATEMENT_TIMEOUT" and time.monotonic() - started < 5
        assert b.in_transaction
    finally:
        sleeper.kill()
        sleeper.wait()
    with statement_deadline(20.0):
        assert dict((int(i), v) for i, v in rows(b.sql("SELECT id, v FROM t2"))) == {
            1: "fromA", 2: "orig"}  # fmt: skip
        assert table(b, "t3") == [(7, "z")]
        b.sql("COMMIT")
    assert table(b, "t3") == [(7, "z")] and sorted(table(b, "t1")) == sorted(SOURCE)


def test_hostile_abandon_and_show_statements_change_nothing(session_factory, monkeypatch):
    b, commit_id, _staged = damaged(session_factory, monkeypatch)
    n = commit_id
    answers = {}
    for statement in (
        f"ABANDON COMMIT {n}; DROP TABLE t1",
        f"ABANDON COMMIT {n}; ABANDON COMMIT {n}",
        f"ABANDON COMMIT {n}.0",
        f"ABANDON COMMIT +{n}",
        f"ABANDON COMMIT 0x{n:x}",
        f"ABANDON COMMIT '{n}'",
        f"ABANDON COMMIT ({n})",
        f"ABANDON COMMIT {n} {n}",
        "ABANDON COMMIT",
        "ABANDON COMMITS 1",
        "ABANDON COMMIT 0",
        "ABANDON COMMIT 000000000000000000",
        "ABANDON COMMIT 999999999999999999",
        "SHOW PENDING COMMITS LIKE '%'",
        "SHOW PENDING COMMIT",
        f"EXPLAIN ABANDON COMMIT {n}",
        f"SELECT * FROM (ABANDON COMMIT {n})",
        f"WITH x AS (SELECT 1) ABANDON COMMIT {n}",
    ):
        with pytest.raises(SqlError) as error:
            b.sql(statement)
        answers[statement] = error.value.code
    assert all(code in {"UNSUPPORTED_STATEMENT", "OBJECT_NOT_FOUND", "SQL_COMPILATION_ERROR",
                        "SQL_EXECUTION_ERROR"} for code in answers.values()), answers  # fmt: skip
    assert [p.id for p in b.catalog.pending_commits()] == [n]
    assert [r["id"] for r in pending_rows(b)] == [n]
    assert {t.name for t in b.catalog.list_tables()} == {"SRC", "T1", "T2", "T3"}
    # lowercase, spaced, with comments (they read as spaces)
    (status,) = b.sql(f"/* ops */  abandon   commit\n\t{n}  -- give up\n;  ").collect()
    assert "HALF-APPLIED" in status[0]
    with pytest.raises(SqlError) as again:
        b.sql(f"ABANDON COMMIT {n}")
    assert again.value.code == "OBJECT_NOT_FOUND"
    assert sorted(table(b, "t1")) == sorted(SOURCE) and table(b, "s") == []
