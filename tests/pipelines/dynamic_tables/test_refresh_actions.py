"""How each kind of refresh is recorded and goes live: NO_DATA in one catalog write, FULL
by value in Arrow, CREATE OR REPLACE at its swap, DROP ... CASCADE against a running
refresh, ``refresh_due``'s horizon; and the Spark worker that runs the refreshes.

Adversarial tests of five recent changes (second round):

1. e716632: NO_DATA refreshes in one catalog write (``add_no_data_refresh``, ``_no_data``).
2. 464867a: FULL refresh by value diffs in Arrow on the driver (``arrow_value_diff``).
3. f101a2d: CREATE OR REPLACE goes live at its swap; DROP ... CASCADE takes the
   dynamic tables' locks; ``refresh_due`` refuses a tick > 2 h past the commit clock.
4. the service's Spark worker runs ``local[cores+1]`` when no master is configured.

Two defects this round found are fixed and their tests pass: the worker's branch never
ran (``parse_args`` fills in ``local[*]``), and the Arrow diff told NaNs apart by their
sign bit. Tests marked ``xfail(strict=True)`` would show a defect (the reason names it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import pipelines.dynamic_tables.refresh as refresh_module
from flush.commit_clock import clock
from flush.tables import ROW_ID_COLUMN
from pipelines import Session, SqlError
from pipelines.dynamic_tables.diff import arrow_value_diff
from tests.pipelines.dynamic_tables.checks import (
    assert_consistent,
    assert_same_as_query,
    canon,
    row_ids,
)
from tests.servers import ROOT

S = 1_000_000


# Shared warehouse


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("refresh_actions") / "warehouse", spark=spark)
    yield session
    session.close()


def hist(session: Session, name: str) -> list:
    info = session.require_table(name)
    return session.catalog.list_refreshes(info.id)


def dt_of(session: Session, name: str):
    return session.catalog.get_dynamic_table(session.require_table(name).id)


def ids_by_value(session: Session, name: str) -> dict[tuple, list[int]]:
    """Row ids of each distinct row value of the dynamic table (values as ``canon``)."""
    info = session.require_table(name)
    table = DeltaTable(info.uri).to_pyarrow_table()
    names = [n for n in table.column_names if n != ROW_ID_COLUMN]
    found: dict[tuple, list[int]] = {}
    for row in table.to_pylist():
        key = tuple(canon(row[n]) for n in names)
        found.setdefault(key, []).append(row[ROW_ID_COLUMN])
    return {k: sorted(v) for k, v in found.items()}


def assert_ids_kept(before: dict, after: dict) -> None:
    """Unchanged rows keep their ids; surplus copies lose their highest ids; new copies
    only add ids; ids are unique."""
    flat = [i for ids in after.values() for i in ids]
    assert len(flat) == len(set(flat)), "duplicate row ids"
    for key in set(before) | set(after):
        old, new = before.get(key, []), after.get(key, [])
        if len(new) <= len(old):
            assert new == old[: len(new)], (key, old, new)
        else:
            assert set(old) <= set(new), (key, old, new)


# 1. NO_DATA in one catalog write


@pytest.fixture(scope="module")
def nd(wh):
    wh.sql("CREATE TABLE ND_T (ID NUMBER, V VARCHAR)")
    wh.sql("INSERT INTO ND_T VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    wh.sql("CREATE DYNAMIC TABLE ND_D TARGET_LAG = '1 minute' AS SELECT ID, V FROM ND_T")
    wh.sql("CREATE DYNAMIC TABLE ND_E TARGET_LAG = '1 minute' REFRESH_MODE = FULL AS "
           "SELECT V, count(*) AS C FROM ND_D GROUP BY V")  # fmt: skip
    return wh


def test_no_data_is_one_row_and_moves_the_data_timestamp(nd):
    before = dt_of(nd, "ND_D")
    rows_before = len(hist(nd, "ND_D"))
    status = nd.sql("ALTER DYNAMIC TABLE ND_D REFRESH").collect()[0][0]
    assert "NO_DATA" in status
    after = dt_of(nd, "ND_D")
    rows = hist(nd, "ND_D")
    assert len(rows) == rows_before + 1
    top = rows[0]
    assert (top.trigger, top.state, top.action) == ("MANUAL", "SUCCEEDED", "NO_DATA")
    assert top.data_timestamp_us == after.data_timestamp_us > before.data_timestamp_us
    assert after.refresh_seq == before.refresh_seq + 1
    assert top.table_version == after.data_version == before.data_version
    assert top.ended_at is not None and top.rows_inserted == 0
    assert_consistent(nd, "ND_D")


def test_no_data_race_two_sessions_one_wins_the_other_skips(nd, monkeypatch):
    """Session A finds the sources unchanged; before its single write, session B records
    its own NO_DATA. A must be SKIPPED CONCURRENT_REFRESH (one row), never two NO_DATA
    rows with one of them not moving the table."""
    other = Session(nd.warehouse, spark=nd.spark)
    try:
        seq0 = dt_of(nd, "ND_D").refresh_seq
        n0 = len(hist(nd, "ND_D"))
        fired = []
        original = refresh_module._unchanged

        def hooked(pinned):
            result = original(pinned)
            if not fired:
                fired.append(True)
                other.sql("ALTER DYNAMIC TABLE ND_D REFRESH")
            return result

        monkeypatch.setattr(refresh_module, "_unchanged", hooked)
        nd.sql("ALTER DYNAMIC TABLE ND_D REFRESH")
        monkeypatch.undo()
        rows = hist(nd, "ND_D")
        assert len(rows) == n0 + 2, [(r.state, r.action, r.reason) for r in rows[:4]]
        states = sorted((r.state, r.action, r.reason) for r in rows[:2])
        assert states == [("SKIPPED", "SKIPPED", "CONCURRENT_REFRESH"),
                          ("SUCCEEDED", "NO_DATA", "")]  # fmt: skip
        assert dt_of(nd, "ND_D").refresh_seq == seq0 + 1
        assert_consistent(nd, "ND_D")
    finally:
        other.close()


def test_no_data_threads_racing_keep_history_and_timestamp_monotonic(nd):
    sessions = [Session(nd.warehouse, spark=nd.spark) for _ in range(3)]
    try:
        n0 = len(hist(nd, "ND_D"))
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(sessions))

        def run(session):
            try:
                barrier.wait()
                for _ in range(4):
                    session.sql("ALTER DYNAMIC TABLE ND_D REFRESH")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(s,)) for s in sessions]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        rows = hist(nd, "ND_D")[:12]
        assert len(hist(nd, "ND_D")) == n0 + 12
        assert all(r.state in ("SUCCEEDED", "SKIPPED") for r in rows)
        good = [r for r in reversed(rows) if r.state == "SUCCEEDED"]
        assert all(r.action == "NO_DATA" for r in good)
        stamps = [r.data_timestamp_us for r in good]  # in id order
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), stamps
        assert dt_of(nd, "ND_D").data_timestamp_us == max(stamps)
        assert_consistent(nd, "ND_D")
    finally:
        for s in sessions:
            s.close()


def test_no_data_while_another_refresh_is_claimed_is_skipped(nd, monkeypatch):
    """A refresh with a claim pending (inside its commit): a NO_DATA attempt of another
    session for an earlier tick must not move the table under it."""
    import pipelines.transactions.commit as pipeline_commit

    nd.sql("INSERT INTO ND_T VALUES (4, 'd')")
    other = Session(nd.warehouse, spark=nd.spark)
    seen = []
    try:
        roll = pipeline_commit._roll_forward
        base_dt = dt_of(nd, "ND_D")
        tick = base_dt.data_timestamp_us + 1  # before the insert's commit stamp
        info = nd.require_table("ND_D")

        def during_commit(catalog, pending):
            if not seen:
                dt = nd.catalog.get_dynamic_table(info.id)
                seen.append(dt.claimed_by)
                # The other session refreshes for a tick just after the last data
                # timestamp (sources unchanged at that tick: the NO_DATA shortcut).
                seen.append(refresh_module.refresh(other, info.id, "MANUAL", tick))
            return roll(catalog, pending)

        monkeypatch.setattr(pipeline_commit, "_roll_forward", during_commit)
        nd.sql("ALTER DYNAMIC TABLE ND_D REFRESH")
        monkeypatch.undo()
        assert seen[0] is not None, "no claim was held during the commit"
        quick = seen[1]
        assert (quick.state, quick.reason) == ("SKIPPED", "CONCURRENT_REFRESH"), quick
        rows = hist(nd, "ND_D")
        assert rows[0].id == quick.id
        top = rows[1]
        assert (top.state, top.action) == ("SUCCEEDED", "INCREMENTAL"), top
        assert dt_of(nd, "ND_D").data_timestamp_us == top.data_timestamp_us
        assert_same_as_query(nd, "ND_D", "SELECT ID, V FROM ND_T")
        assert_consistent(nd, "ND_D")
    finally:
        other.close()


def test_refresh_right_after_dml_sees_it(nd):
    for i in range(1):
        nd.sql(f"INSERT INTO ND_T VALUES ({10 + i}, 'x{i}')")
        record = nd.sql("ALTER DYNAMIC TABLE ND_D REFRESH").collect()[0][0]
        assert "INCREMENTAL" in record, record
        assert_same_as_query(nd, "ND_D", "SELECT ID, V FROM ND_T")
        nd.sql(f"DELETE FROM ND_T WHERE ID = {10 + i}")
        record = nd.sql("ALTER DYNAMIC TABLE ND_D REFRESH").collect()[0][0]
        assert "INCREMENTAL" in record, record
        assert_same_as_query(nd, "ND_D", "SELECT ID, V FROM ND_T")
    assert_consistent(nd, "ND_D")


def test_upstream_no_data_lets_downstream_no_data_at_one_timestamp(nd):
    nd.sql("ALTER DYNAMIC TABLE ND_E REFRESH")  # catch up
    n_d, n_e = len(hist(nd, "ND_D")), len(hist(nd, "ND_E"))
    nd.sql("ALTER DYNAMIC TABLE ND_E REFRESH")
    d, e = hist(nd, "ND_D"), hist(nd, "ND_E")
    assert len(d) == n_d + 1 and len(e) == n_e + 1
    assert (d[0].action, e[0].action) == ("NO_DATA", "NO_DATA"), (d[0], e[0])
    assert d[0].data_timestamp_us == e[0].data_timestamp_us
    assert_same_as_query(nd, "ND_E", "SELECT V, count(*) AS C FROM ND_D GROUP BY V")


def test_scheduled_no_data_rows_are_scheduled_and_ticks_advance(nd):
    now = clock()
    n0 = len(hist(nd, "ND_D"))
    done = nd.refresh_due(now + 60 * S)
    mine = [r for r in done if r.name.endswith("ND_D")]
    assert mine and all(r.trigger == "SCHEDULED" for r in mine)
    assert mine[-1].action == "NO_DATA" and mine[-1].state == "SUCCEEDED"
    assert len(hist(nd, "ND_D")) == n0 + len(mine)
    again = [r for r in nd.refresh_due(now + 60 * S) if r.name.endswith("ND_D")]
    assert again == [], "the same tick ran twice"
    # A tick before the data timestamp never moves it back.
    ts = dt_of(nd, "ND_D").data_timestamp_us
    nd.refresh_due(now - 3600 * S)
    assert dt_of(nd, "ND_D").data_timestamp_us == ts


def test_suspended_upstream_downstream_scheduled_is_skipped(nd):
    nd.sql("ALTER DYNAMIC TABLE ND_D SUSPEND")
    try:
        ts_d = dt_of(nd, "ND_D").data_timestamp_us
        done = nd.refresh_due(clock() + 300 * S)
        d_rows = [r for r in done if r.name.endswith("ND_D")]
        e_rows = [r for r in done if r.name.endswith("ND_E")]
        assert d_rows == []
        assert dt_of(nd, "ND_D").data_timestamp_us == ts_d
        assert e_rows and e_rows[-1].state == "SKIPPED"
        assert e_rows[-1].reason.startswith("UPSTREAM_SUSPENDED"), e_rows[-1]
    finally:
        nd.sql("ALTER DYNAMIC TABLE ND_D RESUME")


def test_dropped_source_fails_with_one_row(wh):
    wh.sql("CREATE TABLE DS_T (ID NUMBER)")
    wh.sql("INSERT INTO DS_T VALUES (1)")
    wh.sql("CREATE DYNAMIC TABLE DS_D TARGET_LAG = '1 minute' AS SELECT ID FROM DS_T")
    n0 = len(hist(wh, "DS_D"))
    seq = dt_of(wh, "DS_D").refresh_seq
    wh.sql("DROP TABLE DS_T")
    with pytest.raises(SqlError) as failed:
        wh.sql("ALTER DYNAMIC TABLE DS_D REFRESH")
    assert "SOURCE_DROPPED" in str(failed.value) or failed.value.code == "SOURCE_DROPPED"
    rows = hist(wh, "DS_D")
    assert len(rows) == n0 + 1
    assert (rows[0].state, rows[0].action, rows[0].reason) == ("FAILED", "FAILED", "SOURCE_DROPPED")
    assert dt_of(wh, "DS_D").refresh_seq == seq


def test_source_recreated_same_name_same_columns_is_not_no_data(wh):
    """A source dropped and recreated with the same name and columns (and no rows): the
    NO_DATA shortcut must not treat it as the table it read."""
    wh.sql("CREATE TABLE RC_T (ID NUMBER)")
    wh.sql("INSERT INTO RC_T VALUES (1), (2)")
    wh.sql("CREATE DYNAMIC TABLE RC_D TARGET_LAG = '1 minute' AS SELECT ID FROM RC_T")
    wh.sql("DROP TABLE RC_T")
    wh.sql("CREATE TABLE RC_T (ID NUMBER)")
    with pytest.raises(SqlError):
        wh.sql("ALTER DYNAMIC TABLE RC_D REFRESH")
    assert hist(wh, "RC_D")[0].reason == "SOURCE_REPLACED"


# 2. FULL by value in Arrow


NASTY_COLUMNS = ('K NUMBER, F FLOAT, D NUMBER(12,4), TS TIMESTAMP_NTZ, B BINARY, '
                 '"wé ird ""q""" VARCHAR, V VARIANT, A ARRAY')  # fmt: skip


@pytest.fixture(scope="module")
def nasty(wh):
    wh.sql(f"CREATE TABLE NA ({NASTY_COLUMNS})")
    return wh


NASTY_QUERIES = {
    "NA_FULL": "SELECT * FROM NA",
    "NA_AGG": "SELECT F, count(*) AS C, sum(D) AS S, max(TS) AS M FROM NA GROUP BY F",
}


def _insert_nasty(session: Session, rows: list[str]) -> None:
    session.sql("INSERT INTO NA " + " UNION ALL ".join(f"SELECT {row}" for row in rows))


ROW = ("{k} AS K, CAST('{f}' AS DOUBLE) AS F, CAST({d} AS DECIMAL(12,4)) AS D, "
       "CAST('{ts}' AS TIMESTAMP_NTZ) AS TS, {b} AS B, '{s}' AS S, "
       "PARSE_JSON('{v}') AS V, array({a}) AS A")  # fmt: skip


def nasty_row(
    k, f, d="1.5", ts="2024-01-01 00:00:00.123456", b="X'00FF'", s="ü", v='{"a":1}', a="1, 2"
):
    return ROW.format(k=k, f=f, d=d, ts=ts, b=b, s=s, v=v, a=a)


def check_all(session: Session, before: dict | None = None) -> dict:
    after = {}
    for name, query in NASTY_QUERIES.items():
        assert_same_as_query(session, name, query)
        ids = row_ids(session.require_table(name).uri)
        assert len(ids) == len(set(ids)), f"{name}: duplicate row ids"
        after[name] = ids_by_value(session, name)
        if before is not None and name != "NA_FULL_X":
            assert_ids_kept(before[name], after[name])
    return after


def refresh_all(session: Session) -> list[str]:
    out = []
    for name in NASTY_QUERIES:
        out.append(session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0][0])
    return out


def test_full_by_value_nasty_values_round_trip(nasty):
    s = nasty
    _insert_nasty(s, [
        nasty_row(1, "NaN"), nasty_row(1, "NaN"), nasty_row(2, "-0.0"), nasty_row(3, "0.0"),
        nasty_row(4, "0.0", d="NULL", ts="1970-01-01 00:00:00", b="CAST(NULL AS BINARY)",
                  s="", v="null", a="CAST(NULL AS INT)"),
        nasty_row(5, "1e308", d="-99999999.9999", b="X''", s="it''s \"quoted\" 😀"),
        nasty_row(5, "1e308", d="-99999999.9999", b="X''", s="it''s \"quoted\" 😀"),
    ])  # fmt: skip
    s.sql("INSERT INTO NA (K) VALUES (NULL), (NULL)")
    for name, query in NASTY_QUERIES.items():
        s.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' REFRESH_MODE = FULL "
              f"AS {query}")  # fmt: skip
        s.sql(f"CREATE STREAM {name}_S ON TABLE {name}")  # a follower: refreshes diff
    shown = {r["name"]: r["refresh_mode"] for r in
             s.sql("SHOW DYNAMIC TABLES LIKE 'NA_%'").collect()}  # fmt: skip
    assert set(shown.values()) == {"FULL"}, shown
    state = check_all(s)

    # A no-op DML: nothing changes, every row keeps its id.
    s.sql("UPDATE NA SET K = K WHERE K = 1")
    refresh_all(s)
    again = check_all(s, state)
    assert again == state

    # 0.0 -> -0.0 and -0.0 -> 0.0 are changes.
    s.sql("UPDATE NA SET F = CAST('-0.0' AS DOUBLE) WHERE K = 3")
    s.sql("UPDATE NA SET F = CAST('0.0' AS DOUBLE) WHERE K = 2")
    status = s.sql("ALTER DYNAMIC TABLE NA_FULL REFRESH").collect()[0][0]
    assert "2 inserted, 2 deleted" in status, status

    # And: delete one copy of duplicates; add a copy of another.
    s.sql("DELETE FROM NA WHERE K = 5")
    _insert_nasty(s, [nasty_row(5, "1e308", d="-99999999.9999", b="X''",
                                s="it''s \"quoted\" 😀"), nasty_row(1, "NaN")])  # fmt: skip
    refresh_all(s)
    state = check_all(s, state)

    # Empty, then full again.
    s.sql("DELETE FROM NA")
    refresh_all(s)
    empty = check_all(s, state)
    assert all(v == {} for v in empty.values())
    _insert_nasty(s, [nasty_row(7, "NaN"), nasty_row(7, "NaN"), nasty_row(8, "-0.0")])
    refresh_all(s)
    check_all(s, empty)
    for name in NASTY_QUERIES:
        assert_consistent(s, name)


def test_full_by_value_nan_sign_flip_is_not_a_change(wh):
    """docs/dynamic-tables.md: FULL by value matches rows with "NaN equals NaN". A source
    NaN negated (Java's negation flips the NaN's sign bit) is still NaN: the refresh
    should change nothing and the row keep its id."""
    wh.sql("CREATE TABLE NP (K NUMBER, X DOUBLE)")
    wh.sql("INSERT INTO NP SELECT 1 AS K, CAST('NaN' AS DOUBLE) AS X")
    wh.sql("INSERT INTO NP VALUES (2, 1.0)")
    q = "SELECT K, X FROM NP"
    wh.sql(f"CREATE DYNAMIC TABLE NP_D TARGET_LAG = '1 minute' REFRESH_MODE = FULL AS {q}")
    wh.sql("CREATE STREAM NP_S ON TABLE NP_D")  # a follower: the refresh is a difference
    before = ids_by_value(wh, "NP_D")
    wh.sql("UPDATE NP SET X = -X WHERE K = 1")
    status = wh.sql("ALTER DYNAMIC TABLE NP_D REFRESH").collect()[0][0]
    assert_same_as_query(wh, "NP_D", q)
    assert_consistent(wh, "NP_D")
    assert_ids_kept(before, ids_by_value(wh, "NP_D"))
    assert "FULL (0 inserted, 0 deleted" in status, status


def test_full_by_value_other_types_keep_ids_on_no_op_update(wh):
    wh.sql("CREATE TABLE OT (K NUMBER(38,0), BO BOOLEAN, DA DATE, TI TIME, "
           "LT TIMESTAMP_LTZ, TZ TIMESTAMP_TZ, R REAL, N NUMBER(38,10))")  # fmt: skip
    wh.sql("INSERT INTO OT VALUES "
           "(99999999999999999999999999999999999999, TRUE, '0001-01-01', '23:59:59.999999', "
           "'2024-03-10 02:30:00.000001', '2024-01-01 10:00:00 +05:30', 1.1, "
           "-0.0000000001), "
           "(-1, NULL, '9999-12-31', '00:00:00', NULL, '1970-01-01 00:00:00 -08:00', NULL, "
           "NULL), "
           "(-1, NULL, '9999-12-31', '00:00:00', NULL, '1970-01-01 00:00:00 -08:00', NULL, "
           "NULL)")  # fmt: skip
    q = "SELECT * FROM OT"
    wh.sql(f"CREATE DYNAMIC TABLE OT_D TARGET_LAG = '1 minute' REFRESH_MODE = FULL AS {q}")
    wh.sql("CREATE STREAM OT_S ON TABLE OT_D")  # a follower: the refresh is a difference
    before = ids_by_value(wh, "OT_D")
    wh.sql("UPDATE OT SET K = K")
    status = wh.sql("ALTER DYNAMIC TABLE OT_D REFRESH").collect()[0][0]
    assert "FULL (0 inserted, 0 deleted" in status, status
    assert ids_by_value(wh, "OT_D") == before
    wh.sql("DELETE FROM OT WHERE K = -1")
    wh.sql("INSERT INTO OT (K) VALUES (-1)")
    wh.sql("ALTER DYNAMIC TABLE OT_D REFRESH")
    assert_same_as_query(wh, "OT_D", q)
    assert_ids_kept(before, ids_by_value(wh, "OT_D"))
    assert_consistent(wh, "OT_D")
    # Spark's compaction rewrites the files FULL by value then reads with pyarrow.
    from flush.compaction import CompactionPolicy, compact_table

    for k in (1000, 1001):
        wh.sql(f"INSERT INTO OT (K, DA) VALUES ({k}, '2000-02-29')")
        wh.sql("ALTER DYNAMIC TABLE OT_D REFRESH")
    kept = ids_by_value(wh, "OT_D")
    uri = wh.require_table("OT_D").uri
    compacted = compact_table(wh.spark, uri, CompactionPolicy())
    assert compacted.status == "SUCCEEDED", compacted
    wh.sql("UPDATE OT SET K = K")
    status = wh.sql("ALTER DYNAMIC TABLE OT_D REFRESH").collect()[0][0]
    assert "FULL (0 inserted, 0 deleted" in status, (status, compacted.status)
    assert ids_by_value(wh, "OT_D") == kept
    assert_same_as_query(wh, "OT_D", q)


def test_arrow_diff_keeps_lowest_ids_and_handles_empty():
    old = pa.table({"A": pa.array([1, 1, 1, None, None], pa.int64()),
                    "B": pa.array(["x", "x", "x", None, None]),
                    ROW_ID_COLUMN: pa.array([30, 10, 20, 5, 6], pa.int64())})  # fmt: skip
    new = pa.table({"A": pa.array([1, None, 2], pa.int64()), "B": pa.array(["x", None, "y"])})
    diff = arrow_value_diff(old, new)
    assert sorted(diff.deleted.to_pylist()) == [6, 20, 30]
    assert diff.inserted.to_pylist() == [{"A": 2, "B": "y"}]
    empty_new = new.slice(0, 0)
    diff = arrow_value_diff(old, empty_new)
    assert sorted(diff.deleted.to_pylist()) == [5, 6, 10, 20, 30]
    assert diff.inserted.num_rows == 0
    diff = arrow_value_diff(old.slice(0, 0), new)
    assert len(diff.deleted) == 0 and diff.inserted.num_rows == 3
    diff = arrow_value_diff(old.slice(0, 0), empty_new)
    assert len(diff.deleted) == 0 and diff.inserted.num_rows == 0


def test_row_number_window_full(wh):
    wh.sql("CREATE TABLE RN (G VARCHAR, X NUMBER)")
    wh.sql("INSERT INTO RN VALUES ('a', 1), ('a', 2), ('b', 3), (NULL, 4)")
    q = "SELECT G, X, ROW_NUMBER() OVER (PARTITION BY G ORDER BY X) AS R FROM RN"
    wh.sql(f"CREATE DYNAMIC TABLE RN_D TARGET_LAG = '1 minute' REFRESH_MODE = FULL AS {q}")
    wh.sql("CREATE STREAM RN_S ON TABLE RN_D")  # a follower: the refresh is a difference
    before = ids_by_value(wh, "RN_D")
    wh.sql("INSERT INTO RN VALUES ('a', 0)")
    wh.sql("ALTER DYNAMIC TABLE RN_D REFRESH")
    assert_same_as_query(wh, "RN_D", q)
    after = ids_by_value(wh, "RN_D")
    assert_ids_kept(before, after)
    # ('b', 3, 1) and (NULL, 4, 1) did not change: same ids
    for key in before:
        if key[0] in ("b", None):
            assert before[key] == after[key]
    assert_consistent(wh, "RN_D")


# 3. CREATE OR REPLACE, DROP ... CASCADE, refresh_due's horizon


def test_refresh_due_refuses_far_ticks_and_accepts_near(wh):
    wh.sql("CREATE TABLE RD_T (ID NUMBER)")
    wh.sql("CREATE DYNAMIC TABLE RD_D TARGET_LAG = '1 minute' AS SELECT ID FROM RD_T")
    before = dt_of(wh, "RD_D")
    with pytest.raises(SqlError) as refused:
        wh.refresh_due(clock() + 3 * 3600 * S)
    assert refused.value.code == "SQL_COMPILATION_ERROR"
    after = dt_of(wh, "RD_D")  # refused before anything moved
    assert (after.data_timestamp_us, after.last_tick_us, after.refresh_seq) == (
        before.data_timestamp_us,
        before.last_tick_us,
        before.refresh_seq,
    )
    ts = after.data_timestamp_us
    wh.refresh_due(clock() + 3600 * S)  # inside the 2 hours: runs
    assert dt_of(wh, "RD_D").data_timestamp_us > ts
    # Manual refreshes still work after a tick an hour ahead (data timestamp never back).
    wh.sql("INSERT INTO RD_T VALUES (1)")
    status = wh.sql("ALTER DYNAMIC TABLE RD_D REFRESH").collect()[0][0]
    assert "INCREMENTAL" in status or "FULL" in status, status
    assert_same_as_query(wh, "RD_D", "SELECT ID FROM RD_T")
    wh.sql("DROP DYNAMIC TABLE RD_D")


def test_create_or_replace_building_table_not_active_before_swap(wh, monkeypatch):
    import pipelines.dynamic_tables.definition as definition

    wh.sql("CREATE TABLE CR_T (ID NUMBER)")
    wh.sql("INSERT INTO CR_T VALUES (1), (2)")
    wh.sql("CREATE DYNAMIC TABLE CR_D TARGET_LAG = '1 minute' AS SELECT ID FROM CR_T")
    seen = []
    original = definition.refresh_with_upstreams

    def spy(session, table_id, trigger, moment=None):
        record = original(session, table_id, trigger, moment)
        info = session.catalog.get_table_by_id(table_id)
        dt = session.catalog.get_dynamic_table(table_id)
        seen.append((info.name, dt.state))
        # A scheduler tick meanwhile must not refresh the building table.
        due = session.refresh_due(clock() + 7000 * S)
        seen.append([r.name for r in due])
        return record

    monkeypatch.setattr(definition, "refresh_with_upstreams", spy)
    wh.sql("CREATE OR REPLACE DYNAMIC TABLE CR_D TARGET_LAG = '1 minute' AS "
           "SELECT ID * 10 AS ID FROM CR_T")  # fmt: skip
    monkeypatch.undo()
    assert seen, "the initial refresh never ran"
    name, state = seen[0]
    assert "$BUILDING$" in name and state == "INITIALIZING", seen
    assert seen[1] and not any("$BUILDING$" in n for n in seen[1]), seen
    shown = wh.sql("SHOW DYNAMIC TABLES LIKE 'CR_D'").collect()
    assert len(shown) == 1 and shown[0]["scheduling_state"] == "ACTIVE"
    assert_same_as_query(wh, "CR_D", "SELECT ID * 10 AS ID FROM CR_T")
    assert not [t for t in wh.catalog.list_tables() if "$BUILDING$" in t.name]


def test_create_or_replace_on_schedule_goes_active_at_swap(wh):
    wh.sql("CREATE TABLE OS_T (ID NUMBER)")
    wh.sql("CREATE DYNAMIC TABLE OS_D TARGET_LAG = '1 minute' AS SELECT ID FROM OS_T")
    wh.sql("CREATE OR REPLACE DYNAMIC TABLE OS_D TARGET_LAG = '1 minute' "
           "INITIALIZE = ON_SCHEDULE AS SELECT ID + 1 AS ID FROM OS_T")  # fmt: skip
    dt = dt_of(wh, "OS_D")
    assert dt.state == "ACTIVE", dt.state
    assert not [t for t in wh.catalog.list_tables() if "$BUILDING$" in t.name]
    wh.refresh_due(clock() + 100 * S)
    assert dt_of(wh, "OS_D").data_timestamp_us is not None


def test_drop_schema_cascade_during_refresh_waits_and_leaves_nothing(wh, monkeypatch):
    import pipelines.transactions.commit as pipeline_commit

    wh.sql("CREATE DATABASE DC")
    wh.sql("CREATE SCHEMA DC.S1")
    wh.sql("CREATE TABLE DC.S1.T (ID NUMBER)")
    wh.sql("INSERT INTO DC.S1.T VALUES (1)")
    wh.sql("CREATE DYNAMIC TABLE DC.S1.D TARGET_LAG = '1 minute' AS SELECT ID FROM DC.S1.T")
    wh.sql("INSERT INTO DC.S1.T VALUES (2)")
    uri = wh.require_table("DC.S1.D").uri
    other = Session(wh.warehouse, spark=wh.spark)
    dropped: list = []

    def drop():
        try:
            dropped.append(other.sql("DROP SCHEMA DC.S1 CASCADE").collect())
        except BaseException as exc:
            dropped.append(exc)

    dropper = threading.Thread(target=drop)
    staged = pipeline_commit.stage_change_set

    def during(table_uri, change):
        if not dropper.is_alive() and not dropped:
            dropper.start()
            dropper.join(1.0)
            assert not dropped, "the cascade did not wait for the refresh's table lock"
        return staged(table_uri, change)

    monkeypatch.setattr(pipeline_commit, "stage_change_set", during)
    with contextlib.suppress(SqlError):  # a clear error is fine too
        wh.sql("ALTER DYNAMIC TABLE DC.S1.D REFRESH")
    monkeypatch.undo()
    dropper.join(60)
    other.close()
    assert len(dropped) == 1 and not isinstance(dropped[0], BaseException), dropped
    assert wh.catalog.pending_commits() == []
    assert not Path(uri).exists()
    assert all(t.database != "DC" or t.schema_name != "S1" for t in wh.catalog.list_tables())


# 4. The Spark worker's default master


def _worker_master(env: dict, prefix: list[str], tmp: Path) -> dict:
    script = (
        "import json, os, sys\n"
        "import flush.spark_tables as st\n"
        "def fake(master=None, app_name=None, **config):\n"
        "    sys.stderr.write('CAPTURE ' + json.dumps({'master': master, 'config': config}) + '\\n')\n"
        "    sys.stderr.flush(); os._exit(0)\n"
        "st.spark_session = fake\n"
        "from pipelines import worker\n"
        "worker.main(['--warehouse', sys.argv[1]])\n"
    )
    (tmp / "wh").mkdir(exist_ok=True)
    done = subprocess.run([*prefix, sys.executable, "-c", script, str(tmp / "wh")], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    for line in done.stderr.splitlines():
        if line.startswith("CAPTURE "):
            return json.loads(line[len("CAPTURE ") :])
    raise AssertionError(done.stderr[-2000:])


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_MASTER"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_worker_without_master_runs_cores_plus_one(tmp_path):
    captured = _worker_master(_env(), [], tmp_path)
    cores = len(os.sched_getaffinity(0))
    assert captured["master"] == f"local[{cores + 1}]", captured
    assert captured["config"].get("spark.default.parallelism") == str(cores)


def test_worker_with_master_configured_keeps_it(tmp_path):
    env = _env()
    env["SPARK_MASTER"] = "local[1]"
    captured = _worker_master(env, [], tmp_path)
    assert captured["master"] == "local[1]"
    assert "spark.default.parallelism" not in captured["config"]
