"""Attacks on ADAPTIVE's times rule (INCREMENTAL_SLOWER, ``adaptive.timing``/``weigh``):
the history's times and changed rows as the rule reads them, across a refresh
recovered after its process died, odd history rows, a stream and a downstream table,
two refreshes at once, a commit cut before the catalog recorded it, and
INCREMENTAL_STRICT, which the rule must not touch. Times are set in the history
(``catalog.update_refresh``) and the rows threshold lowered, as in ``test_adaptive``."""

from __future__ import annotations

import time
from collections import Counter
from types import SimpleNamespace

import pytest

import catalog.sqlite_dynamic as sqlite_dynamic
from flush import failpoints
from pipelines.dynamic_tables import adaptive
from pipelines.transactions.commit import recover_pending
from tests.pipelines.dynamic_tables.checks import assert_consistent, assert_same_as_query, canon
from tests.pipelines.dynamic_tables.checks import newest_refresh as newest
from tests.pipelines.dynamic_tables.checks import refresh_status as refresh

GROUPED = "SELECT G, count(*) AS N, sum(ID) AS S FROM T GROUP BY G"
STATELESS = "SELECT ID, V FROM T WHERE ID % 2 = 0"


@pytest.fixture
def base(session, monkeypatch):
    monkeypatch.setattr(adaptive, "COST_FROM_ROWS", 100)
    session.sql("CREATE TABLE T (ID NUMBER, G NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T SELECT id, id % 7, 'a' FROM range(100)")
    return session


def _took(session, name: str, action: str, seconds: float) -> int:
    """The newest SUCCEEDED ``action`` refresh of ``name`` as if it took ``seconds``."""
    table_id = session.require_table(name).id
    record = next(r for r in session.catalog.list_refreshes(table_id)
                  if r.action == action and r.state == "SUCCEEDED")  # fmt: skip
    session.catalog.update_refresh(record.id, took_s=seconds)
    return record.id


def _slow_history(session, name: str) -> None:
    _took(session, name, "INCREMENTAL", 9.0)
    _took(session, name, "FULL", 1.0)


def test_a_refresh_recovered_later_is_not_an_incremental_refresh_that_took_that_long(
    base, monkeypatch
):
    """An incremental refresh whose process died after its commit was decided is
    completed by recovery, which stamps ``ended_at`` when it runs (here an hour later).
    That hour is no refresh time: the row keeps no ``took_s``, and the next change, as
    large as that refresh's, does not go FULL for INCREMENTAL_SLOWER."""
    base.sql(f"CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS {GROUPED}")
    _took(base, "A", "FULL", 1.0)
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")
    monkeypatch.setitem(failpoints._POINTS, "pipeline_after_decide", ["error", 1])
    refresh(base, "A")  # the commit is decided, its process "dies": left to recovery
    table_id = base.require_table("A").id
    (executing,) = base.catalog.list_refreshes(table_id, executing=True)
    later = time.time() + 3600
    with monkeypatch.context() as clock:
        clock.setattr(sqlite_dynamic, "time", SimpleNamespace(time=lambda: later))
        recover_pending(base.catalog)  # the next process, an hour later
    recovered = base.catalog.get_refresh(executing.id)
    assert (recovered.state, recovered.action) == ("SUCCEEDED", "INCREMENTAL")
    assert recovered.ended_at >= later and recovered.took_s is None
    assert_same_as_query(base, "A", GROUPED)
    base.sql("UPDATE T SET V = 'y' WHERE ID < 10")  # as large as the recovered one's
    status = refresh(base, "A")
    row = newest(base, "A")
    assert "refreshed: INCREMENTAL" in status, (status, row.STATE_CODE, row.STATE_MESSAGE)
    assert_same_as_query(base, "A", GROUPED)
    assert_consistent(base, "A")


def _signed(session, stream: str, columns: str) -> Counter:
    total: Counter = Counter()
    for row in session.sql(f'SELECT {columns}, "METADATA$ACTION" FROM {stream}').collect():
        total[tuple(canon(v) for v in row[:-1])] += 1 if row[-1] == "INSERT" else -1
    return Counter({k: n for k, n in total.items() if n})


def test_a_stream_and_a_downstream_table_across_an_incremental_slower_full_refresh(base):
    """P (ADAPTIVE, a stream on it) goes FULL for INCREMENTAL_SLOWER; its stream holds
    only the rows that changed (3 updated: a delete and an insert each), the downstream
    table D (AUTO: ADAPTIVE), refreshed with it, stays incremental and equals its query."""
    downstream = "SELECT V, count(*) AS N FROM P GROUP BY V"
    base.sql(f"CREATE DYNAMIC TABLE P TARGET_LAG = '1 minute' REFRESH_MODE = ADAPTIVE AS "
             f"{STATELESS}")  # fmt: skip
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {downstream}")
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")
    assert "refreshed: INCREMENTAL" in refresh(base, "D")
    assert newest(base, "P").REFRESH_ACTION == "INCREMENTAL"
    _slow_history(base, "P")
    _took(base, "D", "INCREMENTAL", 0.5)  # D itself is fast
    base.sql("CREATE STREAM PS ON TABLE P")
    base.sql("UPDATE T SET V = 'y' WHERE ID < 6")  # 6 rows: more than half of 10
    assert "refreshed: INCREMENTAL" in refresh(base, "D")
    row = newest(base, "P")
    assert (row.REFRESH_ACTION, row.STATE_CODE) == ("FULL", adaptive.INCREMENTAL_SLOWER), row
    assert _signed(base, "PS", "ID, V") == Counter({
        ("#0", "x"): -1, ("#2", "x"): -1, ("#4", "x"): -1,
        ("#0", "y"): 1, ("#2", "y"): 1, ("#4", "y"): 1})  # fmt: skip
    assert base.sql("SELECT count(*) FROM PS").collect()[0][0] == 6
    assert newest(base, "D").REFRESH_ACTION == "INCREMENTAL"
    for name, query in (("P", STATELESS), ("D", downstream)):
        assert_same_as_query(base, name, query)
        assert_consistent(base, name)


def test_incremental_strict_never_goes_full_or_fails_for_its_times(base):
    """With a history that would send an ADAPTIVE table FULL, INCREMENTAL_STRICT (which
    would fail on any reason to go FULL) stays incremental with no ADAPTIVE message;
    INCREMENTAL and FULL take the same ``is_adaptive`` test (and FULL never asks)."""
    base.sql(f"CREATE DYNAMIC TABLE S TARGET_LAG = '1 minute' REFRESH_MODE = "
             f"INCREMENTAL_STRICT AS {GROUPED}")  # fmt: skip
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")
    assert "refreshed: INCREMENTAL" in refresh(base, "S")
    _slow_history(base, "S")
    base.sql("UPDATE T SET V = 'y' WHERE ID < 10")
    assert "refreshed: INCREMENTAL" in refresh(base, "S")
    assert tuple(newest(base, "S")) == ("INCREMENTAL", None, None)
    assert_same_as_query(base, "S", GROUPED)


def test_two_refreshes_at_once_of_a_table_going_full_for_its_times(
    base, session_factory, monkeypatch
):
    """A second client refreshes the table while the first has computed its
    INCREMENTAL_SLOWER FULL refresh: one applies (FULL, INCREMENTAL_SLOWER), the other
    is SKIPPED (CONCURRENT_REFRESH) without ADAPTIVE's message of what it would have
    done; the table equals its query, applied once."""
    import pipelines.dynamic_tables.refresh as refresh_module
    from tests.pipelines.dynamic_tables.checks import history_rows, once

    other = session_factory()
    base.sql(f"CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS {GROUPED}")
    base.sql("CREATE STREAM S ON TABLE A")
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")
    assert "refreshed: INCREMENTAL" in refresh(base, "A")
    _slow_history(base, "A")
    base.sql("UPDATE T SET G = 40 WHERE ID < 10")
    hook = once(lambda: other.sql("ALTER DYNAMIC TABLE A REFRESH"))
    monkeypatch.setattr(refresh_module, "compute", hook(refresh_module.compute))
    base.sql("ALTER DYNAMIC TABLE A REFRESH")
    assert [h[1:] for h in history_rows(base, "A")][:2] == [
        ("SUCCEEDED", "FULL", adaptive.INCREMENTAL_SLOWER),
        ("SKIPPED", "SKIPPED", "CONCURRENT_REFRESH")]  # fmt: skip
    table_id = base.require_table("A").id
    applied, skipped = base.catalog.list_refreshes(table_id, limit=2)
    assert applied.error.startswith("ADAPTIVE chose FULL") and skipped.error == "", skipped
    assert_same_as_query(base, "A", GROUPED)
    assert_consistent(base, "A")


def test_odd_source_versions_in_the_history_never_fail_a_refresh(base):
    """The incremental refresh's ``source_versions`` as no refresh writes them: a name
    not among the sources, versions backwards, negative, past the log, of the wrong
    shape or type. The times still weigh in where the change then cannot be counted
    (no "under half"), or drop out (a shape it cannot read); the refresh never fails."""
    base.sql(f"CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS {GROUPED}")
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")
    assert "refreshed: INCREMENTAL" in refresh(base, "A")
    incremental = _took(base, "A", "INCREMENTAL", 9.0)
    name = base.require_table("T").full_name
    odd = [{"NOPE.PUBLIC.X": [1, 2]}, {name: [-3, 10**12]}, {name: [1.5, "2"]}]
    for step, versions in enumerate(odd):
        base.catalog.update_refresh(incremental, source_versions=versions)
        _took(base, "A", "FULL", 1.0)
        base.sql(f"UPDATE T SET G = {20 + step} WHERE ID = {step}")
        status = refresh(base, "A")
        row = newest(base, "A")
        assert "refreshed:" in status, (versions, status, row)
        assert row.STATE_CODE in (None, adaptive.INCREMENTAL_SLOWER), (versions, row)
    assert_same_as_query(base, "A", GROUPED)
    assert_consistent(base, "A")


def test_an_incremental_slower_full_refresh_cut_after_its_delta_commit_is_applied_once(
    base, monkeypatch
):
    """The FULL refresh chosen for INCREMENTAL_SLOWER fails after its Delta commit and
    before the catalog records it: recovery applies it once, its history row keeps the
    reason and the message, the table equals its query."""
    base.sql(f"CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS {GROUPED}")
    base.sql("CREATE STREAM S ON TABLE A")  # a follower: FULL as a difference
    base.sql("UPDATE T SET V = 'x' WHERE ID < 10")
    assert "refreshed: INCREMENTAL" in refresh(base, "A")
    _slow_history(base, "A")
    base.sql("UPDATE T SET G = 30 WHERE ID < 10")
    monkeypatch.setitem(failpoints._POINTS, "pipeline_before_finish", ["error", 1])
    refresh(base, "A")
    recover_pending(base.catalog)
    table_id = base.require_table("A").id
    row = base.catalog.list_refreshes(table_id, limit=1)[0]
    expected = ("SUCCEEDED", "FULL", adaptive.INCREMENTAL_SLOWER)
    assert (row.state, row.action, row.reason) == expected, row
    assert "refresh took 9.00 s, for 10 changed rows, more than 1.25x" in row.error, row
    assert_same_as_query(base, "A", GROUPED)
    assert_consistent(base, "A")
