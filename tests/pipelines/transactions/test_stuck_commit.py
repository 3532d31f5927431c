"""A decided multi-table commit that cannot complete (outside damage: a staged file
removed by hand, a broken disk), and a wait for another commit that outlives the
statement's timeout.

Transaction A (test_multi_table_commit.py) consumes stream S into T1 (an append) and
updates row 1 of T2 (a merge); it is decided, then its roll-forward fails. Readers
keep reading the last committed versions; writers are told at once (TABLE_BUSY, naming
the way out); SHOW PENDING COMMITS shows what landed; ABANDON COMMIT ends it, whole
when no table holds its change, half-applied (said so) when one does; afterwards the
tables and the stream are usable and S's rows were delivered exactly once.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import pipelines.transactions.commit as pipeline_commit
from pipelines import Session, SqlError
from pipelines.transactions.statement_deadline import statement_deadline
from tests.pipelines.conftest import rows
from tests.pipelines.refusals import assert_refused
from tests.pipelines.transactions.test_multi_table_commit import (
    SOURCE,
    decided_and_left,
    held_by_live_owner,
    setup,
    t2,
    table,
)


def staged_file(session: Session, commit_id: int, table_name: str) -> Path:
    (pending,) = [p for p in session.catalog.pending_commits() if p.id == commit_id]
    (entry,) = [t for t in pending.plan["tables"] if t["name"].endswith(f".{table_name}")]
    return Path(entry["uri"]) / entry["staged"]["path"]


def pending_rows(session: Session) -> list[dict]:
    return [row.asDict() for row in session.sql("SHOW PENDING COMMITS").collect()]


def stream_usable(session: Session) -> None:
    """The stream is free and consumable, and T2 writable and droppable."""
    assert session.catalog.pending_commits() == []
    assert session.catalog.get_stream("DB", "PUBLIC", "S").claimed_by is None
    session.sql("INSERT INTO src VALUES (13, 'd')")
    session.sql("INSERT INTO t3 SELECT id, v FROM s")
    assert table(session, "t3") == [(13, "d")]
    session.sql("UPDATE t2 SET v = 'later' WHERE id = 2")
    assert t2(session)[2] == "later"


def test_a_commit_half_applied_by_damage_is_shown_read_past_and_abandoned(
    session_factory, monkeypatch
):
    a = session_factory()
    setup(a)
    b = session_factory()  # opened before: its opening recovered nothing
    commit_id = decided_and_left(a, monkeypatch)
    staged_file(a, commit_id, "T2").unlink()  # the damage: T2's change can never land

    # A reader of T2 tries to complete A (T1 lands, T2 fails), then reads the last
    # committed version of T2 instead of being refused.
    assert t2(b) == {1: "orig", 2: "orig"}
    assert sorted(table(b, "t1")) == sorted(SOURCE)
    with pytest.raises(SqlError) as busy:
        b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")
    assert busy.value.code == "TABLE_BUSY"
    assert "ABANDON COMMIT" in str(busy.value) and "changed nothing" in str(busy.value)
    assert t2(b) == {1: "orig", 2: "orig"}

    (shown,) = pending_rows(b)
    assert shown["id"] == commit_id and shown["state"] == "decided"
    assert shown["owner_alive"] is False
    assert shown["tables"] == "DB.PUBLIC.T1, DB.PUBLIC.T2"
    assert shown["landed_in"] == "DB.PUBLIC.T1"
    assert shown["streams"] == "DB.PUBLIC.S" and "UPDATE t2" in shown["statement"]

    (status,) = b.sql(f"ABANDON COMMIT {commit_id}").collect()
    assert "HALF-APPLIED" in status[0]
    assert "DB.PUBLIC.T1 hold" in status[0] and "DB.PUBLIC.T2 never will" in status[0]
    assert pending_rows(b) == []
    # S's rows are in T1 once, and S does not offer them again; T2 keeps B's reads.
    assert sorted(table(b, "t1")) == sorted(SOURCE)
    assert table(b, "s") == []
    assert t2(b) == {1: "orig", 2: "orig"}
    stream_usable(b)
    assert sorted(table(session_factory(), "t1")) == sorted(SOURCE)  # no late roll-forward


def test_a_commit_no_table_holds_is_abandoned_whole(session_factory, monkeypatch):
    """The roll-forward fails before any table: ABANDON gives the whole commit up, the
    stream keeps its offset, and consuming it again delivers S's rows once."""
    a = session_factory()
    setup(a)
    b = session_factory()
    commit_id = decided_and_left(a, monkeypatch)

    def failing_roll_forward(catalog, pending):
        raise OSError("disk full")

    monkeypatch.setattr(pipeline_commit, "_roll_forward", failing_roll_forward)
    assert table(b, "t1") == []  # read past it
    (shown,) = pending_rows(b)
    assert shown["landed_in"] == ""
    (status,) = b.sql(f"ABANDON COMMIT {commit_id}").collect()
    assert "no table had its change" in status[0] and "keep their offsets" in status[0]
    monkeypatch.undo()
    assert table(b, "t1") == [] and t2(b) == {1: "orig", 2: "orig"}
    assert table(b, "s") == SOURCE
    b.sql("INSERT INTO t1 SELECT id, v FROM s")
    assert table(b, "t1") == SOURCE and table(b, "s") == []
    stream_usable(b)


def test_abandon_of_a_commit_that_can_complete_completes_it(session_factory, monkeypatch):
    a = session_factory()
    setup(a)
    b = session_factory()
    commit_id = decided_and_left(a, monkeypatch)
    (status,) = b.sql(f"ABANDON COMMIT {commit_id}").collect()
    assert "completed" in status[0] and "nothing was given up" in status[0]
    assert sorted(table(b, "t1")) == sorted(SOURCE) and t2(b) == {1: "fromA", 2: "orig"}
    stream_usable(b)


def test_abandon_refuses_a_commit_whose_owner_is_alive(session_factory, monkeypatch):
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        b = held_by_live_owner(session_factory, monkeypatch, sleeper.pid)
        (pending,) = b.catalog.pending_commits()
        with pytest.raises(SqlError) as refused:
            b.sql(f"ABANDON COMMIT {pending.id}")
        assert refused.value.code == "COMMIT_IN_PROGRESS"
        assert [p.id for p in b.catalog.pending_commits()] == [pending.id]
        assert pending_rows(b)[0]["owner_alive"] is True
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize(
    ("statement", "code"),
    [
        ("ABANDON COMMIT 987654", "OBJECT_NOT_FOUND"),
        ("ABANDON COMMIT abc", "UNSUPPORTED_STATEMENT"),
        ("ABANDON COMMIT -1", "UNSUPPORTED_STATEMENT"),
        ("ABANDON COMMIT 1234567890123456789012", "UNSUPPORTED_STATEMENT"),
    ],
)
def test_abandon_bad_input(statement, code, session):
    assert_refused(session, statement, code, collect=False)


def test_abandon_is_refused_inside_a_transaction(session):
    session.sql("BEGIN")
    with pytest.raises(SqlError) as refused:
        session.sql("ABANDON COMMIT 1")
    assert "inside a transaction" in str(refused.value)
    session.sql("ROLLBACK")


def test_a_wait_for_a_live_commit_ends_at_the_statements_deadline(
    session_factory, monkeypatch
):
    """A writer waiting for another live transaction's commit stops at its statement's
    deadline (the service's timeout), not INTENT_WAIT_SECONDS later, having changed
    nothing; a pure read in an explicit transaction waits the same way."""
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        b = held_by_live_owner(session_factory, monkeypatch, sleeper.pid)
        monkeypatch.setattr(pipeline_commit, "INTENT_WAIT_SECONDS", 3600.0)
        with statement_deadline(1.0), pytest.raises(SqlError) as late:
            b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")
        assert late.value.code == "STATEMENT_TIMEOUT" and "changed nothing" in str(late.value)
        b.sql("BEGIN")
        with statement_deadline(0.5), pytest.raises(SqlError) as read:
            rows(b.sql("SELECT * FROM t2"))
        assert read.value.code == "STATEMENT_TIMEOUT"
        b.sql("ROLLBACK")
    finally:
        sleeper.kill()
        sleeper.wait()
    b.sql("UPDATE t2 SET v = 'fromB' WHERE id = 1")  # the owner is dead: A, then B
    assert t2(b) == {1: "fromB", 2: "orig"}
    assert sorted(table(b, "t1")) == sorted(SOURCE)
