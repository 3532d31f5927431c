"""A dynamic table the engine maintains, written by a release whose group row ids hashed
the keys alone (rule 1: ``xxhash64`` skips NULLs, so groups ``(NULL, 1)`` and
``(1, NULL)`` shared an id), is renewed by one FULL refresh with the reason
GROUP_IDS_RENEWED, in every refresh mode; its followers see only the groups whose ids
changed (those with a NULL key), and later refreshes are INCREMENTAL and exact.

The older release is reproduced by its rule (the group id it computed, and its commits
carrying no rule), put in place for the tables' creation only. The renewal is one
refresh commit: SIGKILLed once decided, recovery completes it with the rule."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pipelines.dynamic_tables import refresh
from pipelines.dynamic_tables.refresh_change import GROUP_ID_APP, dt_app_id
from pipelines.incremental import delta
from tests.pipelines.dynamic_tables.checks import assert_same_as_query, history_rows
from tests.pipelines.transactions.test_consumption_crash import Child, pending_of

GROUPED = "SELECT A, B, count(*) AS N, sum(ID) AS S FROM U GROUP BY A, B"
JOINED = "SELECT u1.ID, u2.A FROM U u1 JOIN U u2 ON u1.ID = u2.ID"


def _rule_one_group_id(keys, reader, names=None):
    """Release 1's group id: the keys' values hashed alone."""
    from pyspark.sql import functions as F

    if not keys:
        return F.lit(0).cast("bigint")
    return F.xxhash64(*([F.col(n) for n in names] if names else map(reader.column, keys)))


def _rule_one_transactions(dt, pinned):
    """Release 1's commits: each source's version, no group id rule."""
    return {dt_app_id(dt, item.position): item.to for item in pinned}


@pytest.fixture
def upgraded(session, monkeypatch):
    """Tables made under release 1, then the current release in place."""
    return _made_under_rule_one(session, monkeypatch)


def _made_under_rule_one(session, monkeypatch):
    monkeypatch.setattr(delta, "group_id", _rule_one_group_id)
    monkeypatch.setattr(refresh, "app_transactions", _rule_one_transactions)
    session.sql("CREATE TABLE U (ID NUMBER, A NUMBER, B NUMBER)")
    session.sql("INSERT INTO U VALUES (1, NULL, 1), (2, 1, NULL), (3, 2, 2), (4, NULL, NULL)")
    for name, query, mode in (("DG", GROUPED, "INCREMENTAL_STRICT"), ("DJ", JOINED, "AUTO")):
        session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
                    f"REFRESH_MODE = {mode} AS {query}")  # fmt: skip
    session.sql("CREATE STREAM GS ON TABLE DG")
    monkeypatch.undo()
    return session


def _rule(session, name: str) -> int | None:
    return DeltaTable(session.require_table(name).uri).transaction_version(GROUP_ID_APP)


def _refresh(session, name: str) -> str:
    return session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status


def test_a_grouping_table_of_rule_one_is_renewed_once(upgraded):
    session = upgraded
    assert _rule(session, "DG") is None
    ids = session.sql("SELECT A, B FROM DG").collect()
    assert len(ids) == 4  # the table as release 1 left it: right values, shared ids
    session.sql("INSERT INTO U VALUES (5, 3, 3)")
    assert "FULL" in _refresh(session, "DG")  # INCREMENTAL_STRICT too: the only way right
    assert history_rows(session, "DG")[0][1:] == ("SUCCEEDED", "FULL", "GROUP_IDS_RENEWED")
    assert _rule(session, "DG") == delta.GROUP_ID_RULE
    assert_same_as_query(session, "DG", GROUPED)
    # Followers see the groups whose ids changed (a NULL key) and the new one, not (2, 2).
    seen = {(r.A, r.B, r["METADATA$ACTION"])
            for r in session.sql("SELECT * FROM GS").collect()}  # fmt: skip
    assert (2, 2, "INSERT") not in seen and (2, 2, "DELETE") not in seen
    assert (3, 3, "INSERT") in seen
    assert {(None, 1, "INSERT"), (1, None, "INSERT"), (None, None, "INSERT")} <= seen
    for step in ("DELETE FROM U WHERE ID = 1", "INSERT INTO U VALUES (6, 1, NULL)",
                 "UPDATE U SET A = NULL, B = 1 WHERE ID = 2"):  # fmt: skip
        session.sql(step)
        assert "INCREMENTAL" in _refresh(session, "DG")
        assert_same_as_query(session, "DG", GROUPED)


def test_a_table_that_groups_by_nothing_keeps_its_ids(upgraded):
    """A join's row ids hash its sources' ids, not group keys: nothing to renew."""
    session = upgraded
    session.sql("INSERT INTO U VALUES (5, 3, 3)")
    assert "INCREMENTAL" in _refresh(session, "DJ")
    assert_same_as_query(session, "DJ", JOINED)
    assert _rule(session, "DJ") == delta.GROUP_ID_RULE


def test_a_new_table_records_its_rule_at_creation(session):
    """Even an initial refresh of no rows carries the rule: no renewal follows."""
    session.sql("CREATE TABLE E (K NUMBER, V NUMBER)")
    session.sql("CREATE DYNAMIC TABLE DE TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL "
                "AS SELECT K, count(*) AS N FROM E GROUP BY K")  # fmt: skip
    assert _rule(session, "DE") == delta.GROUP_ID_RULE
    session.sql("INSERT INTO E VALUES (NULL, 1)")
    assert "INCREMENTAL" in _refresh(session, "DE")


def test_a_renewal_killed_once_decided_is_completed_with_its_rule(
    tmp_path, session_factory, monkeypatch
):
    warehouse = tmp_path / "renewed"
    first = session_factory(warehouse)
    _made_under_rule_one(first, monkeypatch)
    first.sql("INSERT INTO U VALUES (5, 3, 3)")
    first.close()
    child = Child.start(warehouse, 'session.sql("ALTER DYNAMIC TABLE DG REFRESH")\n',
                        "pipeline_after_decide=kill", name="renewal")  # fmt: skip
    try:
        child.wait()
        assert child.proc.returncode == -9, child.describe()
    finally:
        child.stop()
    assert len(pending_of(warehouse)) == 1
    session = session_factory(warehouse)  # opening it recovers
    assert pending_of(warehouse) == []
    assert _rule(session, "DG") == delta.GROUP_ID_RULE
    assert history_rows(session, "DG")[0][1:] == ("SUCCEEDED", "FULL", "GROUP_IDS_RENEWED")
    assert_same_as_query(session, "DG", GROUPED)
    session.sql("DELETE FROM U WHERE ID = 1")
    assert "INCREMENTAL" in _refresh(session, "DG")
    assert_same_as_query(session, "DG", GROUPED)
