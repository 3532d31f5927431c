"""The service's SQL sessions (channel_server.sql_sessions), without a worker: states,
bounds, expiry and ownership, driven as the SQL service drives them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channel_server.sql_sessions import (
    SqlBusyError,
    SqlLimits,
    SqlSessionError,
    SqlSessions,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def answer(transaction=False, database="DB", schema="PUBLIC", error=None):
    """A worker answer's header as the service receives it."""
    header = {"session": {"database": database, "schema": schema, "transaction": transaction}}
    if error:
        header["error"] = {"code": error, "message": "x"}
    return header


def run(sessions, owner, name, kind, worker_answer):
    session = sessions.begin(owner, name, kind)
    sessions.finish(session, kind, worker_answer)
    return session


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def sessions(clock):
    return SqlSessions(SqlLimits(max_sessions=3, max_transactions=2, idle_seconds=100,
                                 remembered_endings=4), clock=clock)  # fmt: skip


def test_a_session_keeps_what_the_worker_reports(sessions):
    run(sessions, "a", "s", "use", answer(database="D1", schema="S1"))
    session = run(sessions, "a", "s", "begin", answer(True, "D1", "S1"))
    assert (session.database, session.schema, session.state) == ("D1", "S1", "open")
    assert sessions.open_sessions == 1 and sessions.open_transactions == 1
    run(sessions, "a", "s", "commit", answer(False, "D1", "S1"))
    assert session.state == "none" and sessions.open_transactions == 0


def test_a_lost_transaction_is_refused_until_the_client_ends_it(sessions):
    run(sessions, "a", "s", "begin", answer(True))
    # The worker restarted: it answers the next statement TRANSACTION_ABORTED.
    session = run(sessions, "a", "s", "insert", answer(False, error="TRANSACTION_ABORTED"))
    assert session.state == "aborted"
    for kind in ("insert", "query", "other", "begin"):
        with pytest.raises(SqlSessionError) as caught:
            sessions.begin("a", "s", kind)
        assert caught.value.sql_code == "TRANSACTION_ABORTED" and caught.value.status == 409
    # COMMIT never succeeds: it answers TRANSACTION_ABORTED and ends the block.
    with pytest.raises(SqlSessionError, match="none of its statements were committed"):
        sessions.begin("a", "s", "commit")
    assert session.state == "none"
    run(sessions, "a", "s", "insert", answer(False))  # auto-commit again


def test_rollback_ends_an_aborted_transaction(sessions):
    run(sessions, "a", "s", "begin", answer(True))
    run(sessions, "a", "s", "query", answer(False, error="TRANSACTION_ABORTED"))
    session = run(sessions, "a", "s", "rollback", answer(False))
    assert session.state == "none"


def test_a_commit_the_worker_finds_lost_ends_the_block(sessions):
    run(sessions, "a", "s", "begin", answer(True))
    session = run(sessions, "a", "s", "commit", answer(False, error="TRANSACTION_ABORTED"))
    assert session.state == "none"


def test_no_answer_keeps_the_state_for_the_worker_to_judge(sessions):
    run(sessions, "a", "s", "begin", answer(True))
    session = run(sessions, "a", "s", "insert", None)  # the worker died mid-statement
    assert session.state == "open" and session.busy == 0


def test_the_same_name_under_two_tokens_is_two_sessions(sessions):
    run(sessions, "a", "s", "begin", answer(True, "DA"))
    other = run(sessions, "b", "s", "use", answer(False, "DB2"))
    assert other.state == "none" and other.database == "DB2"
    assert sessions.begin("a", "s", "query").database == "DA"


def test_sessions_are_bounded_and_never_evicted(sessions):
    for name in ("s1", "s2", "s3"):
        run(sessions, "a", name, "begin" if name != "s3" else "query",
            answer(name != "s3"))  # fmt: skip
    with pytest.raises(SqlBusyError) as caught:
        sessions.begin("a", "s4", "query")
    assert caught.value.sql_code == "TOO_MANY_SESSIONS" and caught.value.status == 429
    assert sessions.open_sessions == 3 and sessions.open_transactions == 2
    assert sessions.close("a", "s3") is not None
    run(sessions, "a", "s4", "query", answer())


def test_open_transactions_are_bounded(sessions):
    run(sessions, "a", "s1", "begin", answer(True))
    run(sessions, "a", "s2", "begin", answer(True))
    with pytest.raises(SqlBusyError) as caught:
        sessions.begin("a", "s3", "begin")
    assert caught.value.sql_code == "TOO_MANY_TRANSACTIONS"
    sessions.begin("a", "s1", "begin")  # inside its own open transaction: the worker answers


def test_idle_sessions_end_and_their_next_statement_is_told(clock):
    sessions = SqlSessions(SqlLimits(idle_seconds=100), clock=clock)
    run(sessions, "a", "plain", "query", answer())
    run(sessions, "a", "used", "use", answer(database="D9"))
    run(sessions, "a", "txn", "begin", answer(True))
    busy = sessions.begin("a", "busy", "query")  # a statement still running
    clock.now = 101
    ended = sorted(s.name for s in sessions.expire())
    assert ended == ["plain", "txn", "used"]
    sessions.finish(busy, "query", answer())
    # Default settings, no transaction: nothing was lost, it just starts over.
    assert run(sessions, "a", "plain", "query", answer()).state == "none"
    # Its USE defaults were reset: told once, then it starts over with the defaults.
    with pytest.raises(SqlSessionError) as caught:
        sessions.begin("a", "used", "query")
    assert caught.value.sql_code == "SESSION_EXPIRED" and "D9" in str(caught.value)
    assert run(sessions, "a", "used", "query", answer()).database == "DB"
    # Its transaction was rolled back: TRANSACTION_ABORTED until ROLLBACK.
    with pytest.raises(SqlSessionError) as caught:
        sessions.begin("a", "txn", "insert")
    assert caught.value.sql_code == "TRANSACTION_ABORTED" and "100 s" in str(caught.value)


def test_endings_remembered_are_bounded(sessions, clock):
    for round_ in range(3):
        for n in range(3):
            run(sessions, "a", f"r{round_}-{n}", "use", answer(database="X"))
        clock.now += 200
        sessions.expire()
    assert len(sessions._endings) == 4


KINDS = ["begin", "commit", "rollback", "insert", "query", "use", "other"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["s1", "s2", "s3"]),
                          st.sampled_from(KINDS), st.sampled_from(["ok", "lost", "died"]),
                          st.booleans()), max_size=40))  # fmt: skip
def test_a_commit_never_succeeds_after_a_lost_transaction(steps):
    """Whatever the order of statements, worker losses and expiries: once a session's
    transaction is lost, no statement reaches the worker until ROLLBACK or COMMIT, that
    COMMIT is refused, and the bounds hold."""
    clock = Clock()
    sessions = SqlSessions(SqlLimits(max_sessions=4, max_transactions=2, idle_seconds=10),
                           clock=clock)  # fmt: skip
    model: dict[tuple[str, str], str] = {}  # what the worker really holds: "open" or absent
    lost: set[tuple[str, str]] = set()
    for owner, name, kind, outcome, expire in steps:
        key = (owner, name)
        try:
            session = sessions.begin(owner, name, kind)
        except (SqlSessionError, SqlBusyError):
            if key in lost and kind in ("commit", "rollback"):
                lost.discard(key)
            continue
        # Reaching the worker: a lost transaction never gets here unless ending it.
        assert key not in lost or kind == "rollback"
        if outcome == "died":
            model.pop(key, None)
            sessions.finish(session, kind, None)
        elif session.state == "open" and key not in model:
            error = "TRANSACTION_ABORTED" if kind != "rollback" else None
            sessions.finish(session, kind, answer(False, error=error))
            if kind not in ("commit", "rollback"):
                lost.add(key)
        else:
            if kind == "begin":
                model[key] = "open"
            elif kind in ("commit", "rollback"):
                model.pop(key, None)
            sessions.finish(session, kind, answer(key in model))
        if kind == "rollback":
            lost.discard(key)
        assert sessions.open_transactions <= 2 and sessions.open_sessions <= 4
        if expire:
            clock.now += 11
            for ended in sessions.expire():
                if ended.state == "open":
                    model.pop((ended.owner, ended.name), None)
                    lost.add((ended.owner, ended.name))


def test_sessions_holding_a_transaction_are_told_after_a_service_restart(sessions, clock):
    run(sessions, "a", "open", "begin", answer(True))
    run(sessions, "a", "plain", "query", answer())
    run(sessions, "b", "lost", "begin", answer(True))
    run(sessions, "b", "lost", "query", answer(False, error="TRANSACTION_ABORTED"))
    held = sessions.transaction_keys()
    assert held == ["a/open", "b/lost"]
    # A new service reads them back: every one answers TRANSACTION_ABORTED until ended.
    restarted = SqlSessions(SqlLimits(), clock=clock)
    restarted.restore([*held, "malformed", "/x"], "the service restarted")
    for owner, name in (("a", "open"), ("b", "lost")):
        with pytest.raises(SqlSessionError, match="the service restarted") as caught:
            restarted.begin(owner, name, "insert")
        assert caught.value.sql_code == "TRANSACTION_ABORTED"
    assert restarted.transaction_keys() == ["a/open", "b/lost"]
    run(restarted, "a", "open", "rollback", answer())
    with pytest.raises(SqlSessionError):
        restarted.begin("b", "lost", "commit")
    assert restarted.transaction_keys() == []
    run(restarted, "a", "plain", "query", answer())  # never had one: runs
