"""A FULL refresh of a dynamic table that nothing follows is one overwrite commit.

The difference a FULL refresh applies (unchanged rows keep their row ids) is worth its
cost only to whoever reads the table's changes by row id: a stream on it or a dynamic
table reading it. Without them the refresh writes the result as the table's whole new
content (``ChangeSet.replaces``, a staged ``overwrite``). These tests pin down when each
is chosen, what the history and streams show, and the overwrite's conflict check; the
SIGKILL scenarios are in ``test_kill.py`` (``overwrite_*``).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flush.change_commit import (
    ChangeSet,
    ConcurrentChangeError,
    check_unchanged,
    commit_staged,
    stage_change_set,
)
from flush.tables import ROW_ID_COLUMN
from tests.pipelines.conftest import WINDOW, rows


def content(session, name):
    return sorted((int(i), v, int(k)) for i, v, k in rows(session.sql(f"SELECT * FROM {name}")))


def ids(session, name):
    """Row id of each row of ``name``, by its ID."""
    table = pa.table(DeltaTable(session.require_table(name).uri).to_pyarrow_dataset().to_table())
    return dict(zip(table.column("ID").to_pylist(), table.column(ROW_ID_COLUMN).to_pylist(),
                    strict=True))  # fmt: skip


def last_operation(session, name):
    entry = DeltaTable(session.require_table(name).uri).history(1)[0]
    return entry["operation"], entry.get("operationParameters", {}).get("mode")


def refresh(session, name):
    return session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status


def test_without_followers_a_full_refresh_overwrites_the_table(windowed):
    before = ids(windowed, "D")
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    status = refresh(windowed, "D")
    # Every row of the old content out, every row of the result in, in one commit.
    assert "FULL (4 inserted, 4 deleted, 0 updated)" in status, status
    assert content(windowed, "D") == sorted(
        (int(i), v, int(k)) for i, v, k in rows(windowed.sql(WINDOW))
    )
    assert last_operation(windowed, "D") == ("WRITE", "Overwrite")
    after = ids(windowed, "D")
    assert not set(after.values()) & set(before.values()), "the new content has new ids"
    assert len(set(after.values())) == 4
    # An empty result empties it.
    windowed.sql("DELETE FROM T")
    assert "FULL (0 inserted, 4 deleted, 0 updated)" in refresh(windowed, "D")
    assert content(windowed, "D") == []
    assert DeltaTable(windowed.require_table("D").uri).file_uris() == []


@pytest.mark.parametrize("follower", ["stream", "dynamic table"])
def test_a_follower_gets_the_difference_and_only_real_changes(windowed, follower):
    if follower == "stream":
        windowed.sql("CREATE STREAM S ON TABLE D")
    else:  # a stateless follower, and one the engine maintains
        windowed.sql("CREATE DYNAMIC TABLE E TARGET_LAG = '1 minute' AS SELECT ID, K FROM D")
        windowed.sql("CREATE DYNAMIC TABLE E2 TARGET_LAG = '1 minute' AS "
                     "SELECT K, count(*) AS N FROM D GROUP BY K")  # fmt: skip
    before = ids(windowed, "D")
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    status = refresh(windowed, "D")
    assert "FULL (1 inserted, 1 deleted, 0 updated)" in status, status
    assert last_operation(windowed, "D")[0] == "MERGE"
    after = ids(windowed, "D")
    assert {i: after[i] for i in (1, 2, 3)} == {i: before[i] for i in (1, 2, 3)}
    if follower == "stream":
        changes = sorted(rows(windowed.sql('SELECT ID, V, "METADATA$ACTION" FROM S')))
        assert [(int(i), v, a) for i, v, a in changes] == [(4, "c", "DELETE"), (4, "z", "INSERT")]
    else:  # downstream of a FULL refresh, both stay incremental
        assert "INCREMENTAL" in refresh(windowed, "E")
        assert sorted(rows(windowed.sql("SELECT ID FROM E"))) == [(1,), (2,), (3,), (4,)]
        assert "INCREMENTAL" in refresh(windowed, "E2")
        fresh = rows(windowed.sql("SELECT int(K), int(count(*)) FROM D GROUP BY K"))
        assert sorted(rows(windowed.sql("SELECT int(K), int(N) FROM E2"))) == sorted(fresh)
        windowed.sql("DROP DYNAMIC TABLE E2")
    # Without its follower, the next FULL refresh overwrites again.
    windowed.sql("DROP STREAM S" if follower == "stream" else "DROP DYNAMIC TABLE E")
    windowed.sql("UPDATE T SET V = 'y' WHERE ID = 4")
    assert "FULL (4 inserted, 4 deleted, 0 updated)" in refresh(windowed, "D")


def test_a_packed_table_falling_back_to_full_keeps_its_sources_ids(session):
    """An incremental table whose source's changes are gone refreshes FULL
    (CHANGES_NOT_RETAINED); overwritten, its rows keep the ids derived from the source
    rows, so a reader across the overwrite nets it to the real change."""
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS "
                "SELECT ID, V FROM T WHERE ID > 1")  # fmt: skip
    before = ids(session, "D")
    version = DeltaTable(session.require_table("D").uri).version()
    session.sql("UPDATE T SET V = 'x' WHERE ID = 3")
    cdc = list(Path(session.require_table("T").uri).rglob("_change_data/*.parquet"))
    assert cdc, "no change data to remove: the test would prove nothing"
    for path in cdc:
        path.unlink()  # what a vacuum past the retention does
    assert "FULL (2 inserted, 2 deleted" in refresh(session, "D")
    assert last_operation(session, "D") == ("WRITE", "Overwrite")
    assert ids(session, "D") == before  # the query's own ids, derived from T's rows
    changes = sorted(rows(session.sql(
        'SELECT ID, V, "METADATA$ACTION" FROM D CHANGES(INFORMATION => DEFAULT) '
        f"AT(VERSION => {version})")))  # fmt: skip
    assert [(int(i), v, a) for i, v, a in changes] == [(3, "c", "DELETE"), (3, "x", "INSERT")]


def test_changes_read_across_an_overwrite(windowed):
    """A reader that started before an overwrite (a stream created while the refresh was
    computed, when it was no follower yet) reads that commit as every row deleted and
    inserted: SEQUENCE ids are new, so all rows are replaced (PACKED ids: see above)."""
    version = DeltaTable(windowed.require_table("D").uri).version()
    windowed.sql("UPDATE T SET V = 'z' WHERE ID = 4")
    assert "FULL (4 inserted, 4 deleted" in refresh(windowed, "D")
    changes = [(int(i), a) for i, a in rows(windowed.sql(
        'SELECT ID, "METADATA$ACTION" FROM D CHANGES(INFORMATION => DEFAULT) '
        f"AT(VERSION => {version})"))]  # fmt: skip
    assert sorted(changes) == sorted([(i, a) for i in (1, 2, 3, 4) for a in ("DELETE", "INSERT")])


def test_an_overwrite_is_refused_before_its_decision_if_rows_changed(session):
    session.sql("CREATE TABLE P (ID NUMBER)")
    session.sql("INSERT INTO P VALUES (1), (2)")
    info = session.require_table("P")
    base_version = DeltaTable(info.uri).version()
    table = DeltaTable(info.uri).to_pyarrow_dataset().to_table()
    staged = stage_change_set(info.uri, ChangeSet(table.slice(0, 1), replaces=True))
    assert staged.kind == "overwrite" and staged.changes_rows
    check_unchanged(info.uri, staged, base_version)  # nothing landed since: fine
    session.sql("INSERT INTO P VALUES (3)")  # another writer adds a row
    with pytest.raises(ConcurrentChangeError, match="replaces"):
        check_unchanged(info.uri, staged, base_version)
    # Once decided it rolls forward whatever landed since, once.
    newest = DeltaTable(info.uri).version()
    version = commit_staged(info.uri, staged, commit_app="test-overwrite",
                            base_version=base_version, app_transactions={}, metadata={})  # fmt: skip
    again = commit_staged(info.uri, staged, commit_app="test-overwrite",
                          base_version=base_version, app_transactions={}, metadata={})  # fmt: skip
    assert version == again == newest + 1
    assert DeltaTable(info.uri).to_pyarrow_dataset().to_table().column("ID").to_pylist() == [1]
