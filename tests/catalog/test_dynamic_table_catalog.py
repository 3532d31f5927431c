"""The dynamic-table half of the catalog contract: definitions, the refresh claim that
pending commits carry, NO_DATA refreshes, CREATE OR REPLACE's swap, drops and the
refresh history. Every catalog implementation must pass it (SQLite today)."""

import dataclasses
import json
import sqlite3
import time

import pytest

from catalog import (
    APPEND_INTENT,
    REFRESH_PLAN_KEY,
    ROWS_INTENT,
    CommitIntent,
    DynamicSource,
    RefreshClaimConflict,
    SqliteCatalog,
    StreamClaim,
    StreamClaimConflict,
    TableBusyError,
    open_catalog,
    sqlite_dynamic,
)
from ingest_sdk import TableNotFoundError, TableSchema
from ingest_sdk.errors import TableAlreadyExistsError
from tests.catalog.test_catalog_behaviors import run_children

SCHEMA = TableSchema.parse({"A": "NUMBER"})
SOURCE_SCHEMA = TableSchema.parse({"ID": "INT NOT NULL", "S": "VARCHAR(3)"})
#: A data timestamp (microseconds); refreshes in these tests move on from it.
T0 = 1_700_000_000_000_000
MINUTE_US = 60_000_000


# --- Helpers ------------------------------------------------------------------------------


def definition(**overrides):
    """A dynamic table's definition as CREATE DYNAMIC TABLE records it."""
    return {
        "query": "SELECT ID AS A FROM SRC",
        "default_database": "DB",
        "default_schema": "S",
        "target_lag_us": MINUTE_US,
        "refresh_mode": "AUTO",
        "mode_reason": "",
        "row_ids": "SEQUENCE",
        "initialize": "ON_CREATE",
        "owner": "100:builder",
        "comment": "",
        **overrides,
    }


def make_sources(catalog, database="DB", schema_name="S"):
    """Two tables and a view for a dynamic table to read, in definition order."""
    first = catalog.create_table(database, schema_name, "SRC", "/w/src", SOURCE_SCHEMA)
    second = catalog.create_table(database, schema_name, "SRC2", "/w/src2", SOURCE_SCHEMA)
    view = catalog.create_view(database, schema_name, "V", "SELECT 1 AS A", (database, "S"))
    marker = json.dumps(SOURCE_SCHEMA.declarations())
    return [
        DynamicSource(first.id, "table", first.full_name, marker),
        DynamicSource(second.id, "table", second.full_name, marker),
        DynamicSource(view.id, "view", view.full_name, view.uid),
    ]


def make_dt(catalog, name="DT", sources=(), database="DB", schema_name="S", **overrides):
    """A new dynamic table (INITIALIZING); returns its table row and its record."""
    uri = f"/w/{database}/{schema_name}/{name}"
    return catalog.create_dynamic_table(
        (database, schema_name, name), uri, SCHEMA, definition(**overrides), list(sources)
    )


def start_refresh(catalog, table_id, moment=T0, owner="1:a"):
    """A refresh's history row as a refresh opens it (EXECUTING); returns its id."""
    info = catalog.get_table_by_id(table_id)
    return catalog.add_refresh({
        "dt_table_id": table_id, "name": info.full_name, "refresh_uid": f"r{time.time_ns()}",
        "trigger": "MANUAL", "state": "EXECUTING", "data_timestamp_us": moment,
        "started_at": time.time(), "owner": owner,
    })  # fmt: skip


def refresh_plan(
    dt, history, *, seq=None, uid=None, moment=T0, sources=None, counts=(5, 1, 2), activate=True
):
    """A pending commit's plan applying the refresh of ``dt`` after ``seq`` (default: the
    one ``dt`` read)."""
    return {
        "tables": [{"table_id": dt.table_id}],
        REFRESH_PLAN_KEY: {
            "dt": dt.table_id,
            "uid": dt.uid if uid is None else uid,
            "seq": dt.refresh_seq if seq is None else seq,
            "history": history,
            "data_timestamp_us": moment,
            "sources": {"0": 7, "1": 3} if sources is None else sources,
            "counts": list(counts),
            "action": "FULL",
            "activate": activate,
        },
    }


def begin_refresh(catalog, dt, history, owner="1:a", claims=(), kind=APPEND_INTENT, **plan):
    """Reserve and decide a refresh's commit (what the commit function does)."""
    intents = [CommitIntent(dt.table_id, kind)]
    return catalog.begin_commit(owner, refresh_plan(dt, history, **plan), claims, intents)


def refresh_of(catalog, table_id, refresh_id):
    (found,) = [r for r in catalog.list_refreshes(table_id) if r.id == refresh_id]
    return found


def snapshot(catalog):
    """Everything a dynamic-table operation could change, to check it changed nothing."""
    return (
        catalog.list_tables(),
        sorted(catalog.list_dynamic_tables(), key=lambda dt: dt.table_id),
        catalog.list_refreshes(),
        catalog.pending_commits(),
        catalog.list_streams(),
    )


def assert_forgotten(catalog, path, table_id):
    """Nothing of a dropped dynamic table is left: no table, definition, sources or
    history (in a SQLite file, not even rows nobody reads)."""
    assert catalog.get_table_by_id(table_id) is None
    assert catalog.get_dynamic_table(table_id) is None
    assert table_id not in [dt.table_id for dt in catalog.list_dynamic_tables()]
    assert catalog.list_refreshes(table_id) == []
    assert table_id not in [r.dt_table_id for r in catalog.list_refreshes()]
    if isinstance(catalog, SqliteCatalog):
        assert raw_rows(path, table_id) == {
            "dynamic_tables": 0, "dynamic_table_sources": 0, "dynamic_table_refreshes": 0,
        }  # fmt: skip


def raw_rows(path, table_id):
    """How many rows of the SQLite file hang off ``table_id``'s definition."""
    db = sqlite3.connect(path)
    try:
        return {
            what: db.execute(f"SELECT COUNT(*) FROM {what} WHERE {column}=?",
                             (table_id,)).fetchone()[0]
            for what, column in (("dynamic_tables", "table_id"),
                                 ("dynamic_table_sources", "dt_table_id"),
                                 ("dynamic_table_refreshes", "dt_table_id"))
        }  # fmt: skip
    finally:
        db.close()


def sqlite_only(catalog):
    if not isinstance(catalog, SqliteCatalog):
        pytest.skip("shares or patches the SQLite catalog file")


# --- Create, get, list -------------------------------------------------------------------


def test_create_records_a_table_and_its_definition(catalog, catalog_location, tmp_path):
    sources = make_sources(catalog)
    before = time.time()
    info, dt = make_dt(
        catalog, sources=sources, target_lag_us=None, refresh_mode="FULL",
        mode_reason="uses a window function", row_ids="PACKED", initialize="ON_SCHEDULE",
        comment="daily totals", default_database="OTHER", default_schema="PUBLIC",
    )  # fmt: skip
    after = time.time()

    # A row of ``tables`` like any other table.
    assert (info.full_name, info.uri, info.schema, info.applied_version) == (
        "DB.S.DT", "/w/DB/S/DT", SCHEMA, 0)  # fmt: skip
    assert catalog.get_table("DB", "S", "DT") == info
    assert catalog.get_table_by_id(info.id) == info
    assert info in catalog.list_tables()
    assert catalog.get_schema("DB", "S") is not None

    # The definition, as given.
    assert dt.table_id == info.id and dt.uid
    assert (dt.query, dt.default_database, dt.default_schema) == (
        "SELECT ID AS A FROM SRC", "OTHER", "PUBLIC")  # fmt: skip
    assert dt.target_lag_us is None  # DOWNSTREAM
    assert (dt.refresh_mode, dt.mode_reason, dt.row_ids, dt.initialize) == (
        "FULL", "uses a window function", "PACKED", "ON_SCHEDULE")  # fmt: skip
    assert (dt.comment, dt.owner, dt.state_reason) == ("daily totals", "100:builder", "")
    assert dt.incremental is False
    # The sources in definition order, none read yet.
    assert dt.sources == tuple(sources)
    assert [(s.kind, s.name) for s in dt.sources] == [
        ("table", "DB.S.SRC"), ("table", "DB.S.SRC2"), ("view", "DB.S.V")]  # fmt: skip
    assert all(s.version is None for s in dt.sources)
    # No refresh yet.
    assert (dt.state, dt.refresh_seq, dt.claimed_by) == ("INITIALIZING", 0, None)
    assert (dt.data_timestamp_us, dt.data_version, dt.last_tick_us) == (None, None, None)
    assert before <= dt.created_at <= after

    assert catalog.get_dynamic_table(info.id) == dt
    assert catalog.list_dynamic_tables() == [dt]
    assert catalog.get_dynamic_table(sources[0].source_id) is None  # a plain table
    assert catalog.get_dynamic_table(info.id + 1000) is None

    # A lag, another mode; each definition its own uid.
    other_info, other = make_dt(catalog, "DT2", sources[:1], target_lag_us=5 * MINUTE_US)
    assert (other.target_lag_us, other.refresh_mode, other.incremental) == (
        5 * MINUTE_US, "AUTO", True)  # fmt: skip
    assert other.sources == (sources[0],)
    assert other.uid != dt.uid and other_info.id != info.id
    assert sorted(catalog.list_dynamic_tables(), key=lambda d: d.table_id) == [dt, other]
    assert make_dt(catalog, "DT3", comment="")[1].sources == ()

    again = open_catalog(catalog_location)  # durable
    try:
        assert again.get_dynamic_table(info.id) == dt
    finally:
        again.close()


def test_create_on_a_taken_name_records_nothing(catalog, tmp_path):
    sources = make_sources(catalog)
    plain = catalog.create_table("DB", "S", "T", "/w/t", SCHEMA)
    _, existing = make_dt(catalog, "DT", sources)
    before = snapshot(catalog)
    for taken in ("T", "DT", "SRC"):
        with pytest.raises(TableAlreadyExistsError):
            make_dt(catalog, taken, sources)
        assert snapshot(catalog) == before
    assert catalog.get_table("DB", "S", "T") == plain
    assert catalog.get_dynamic_table(plain.id) is None
    assert catalog.get_dynamic_table(existing.table_id) == existing
    if isinstance(catalog, SqliteCatalog):  # not even orphaned definition or source rows
        db = sqlite3.connect(tmp_path / "catalog.sqlite")
        try:
            assert db.execute("SELECT COUNT(*) FROM dynamic_tables").fetchone()[0] == 1
            assert db.execute("SELECT COUNT(DISTINCT dt_table_id), COUNT(*)"
                              " FROM dynamic_table_sources").fetchone() == (1, 3)  # fmt: skip
        finally:
            db.close()
    # The next one gets a new id, and only its own sources.
    info, fresh = make_dt(catalog, "DT_NEW", sources[:1])
    assert fresh.sources == (sources[0],) and info.id > existing.table_id


# --- set_dynamic_table ---------------------------------------------------------------------


def test_a_refresh_row_is_found_by_id_however_many_came_after_it(catalog):
    info, _ = make_dt(catalog)
    first = start_refresh(catalog, info.id)
    for _ in range(60):
        start_refresh(catalog, info.id)
    found = catalog.get_refresh(first)
    assert found is not None and found.id == first and found.dt_table_id == info.id
    assert found.state == "EXECUTING"
    assert catalog.get_refresh(10_000_000) is None


def test_set_changes_the_settable_fields_only(catalog):
    info, dt = make_dt(catalog)
    _, other = make_dt(catalog, "OTHER")
    assert catalog.set_dynamic_table(info.id, target_lag_us=None, state="SUSPENDED",
                                     state_reason="USER_SUSPENDED") is True  # fmt: skip
    assert catalog.set_dynamic_table(info.id, last_tick_us=T0, owner="7:x") is True
    changed = dataclasses.replace(
        dt,
        target_lag_us=None,
        state="SUSPENDED",
        state_reason="USER_SUSPENDED",
        last_tick_us=T0,
        owner="7:x",
    )
    assert catalog.get_dynamic_table(info.id) == changed
    assert catalog.set_dynamic_table(info.id, target_lag_us=2 * MINUTE_US, state="ACTIVE")
    changed = dataclasses.replace(changed, target_lag_us=2 * MINUTE_US, state="ACTIVE")
    assert catalog.get_dynamic_table(info.id) == changed
    assert catalog.get_dynamic_table(other.table_id) == other  # one table only

    # What the refresh claim and the definition own is not settable: nothing changes.
    for values in ({"refresh_seq": 5}, {"claimed_by": 1}, {"data_version": 3},
                   {"data_timestamp_us": T0}, {"query": "SELECT 2"}, {"uid": "x"},
                   {"state": "ACTIVE", "refresh_seq": 9}):  # fmt: skip
        with pytest.raises(ValueError):
            catalog.set_dynamic_table(info.id, **values)
        assert catalog.get_dynamic_table(info.id) == changed

    # Unknown, dropped, or not dynamic: False.
    assert catalog.set_dynamic_table(info.id + 1000, state="ACTIVE") is False
    plain = catalog.create_table("DB", "S", "PLAIN", "/w/p", SCHEMA)
    assert catalog.set_dynamic_table(plain.id, state="ACTIVE") is False
    catalog.drop_table(info.id)
    assert catalog.set_dynamic_table(info.id, owner="") is False
    assert catalog.get_dynamic_table(info.id) is None


# --- The refresh claim ---------------------------------------------------------------------


def test_a_refresh_commit_claims_the_next_refresh(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    history = start_refresh(catalog, info.id)
    pending = begin_refresh(catalog, dt, history)
    assert pending.decided and pending.plan == refresh_plan(dt, history)
    claimed = catalog.get_dynamic_table(info.id)
    assert claimed == dataclasses.replace(dt, claimed_by=pending.id)  # nothing else moved
    assert claimed.state == "INITIALIZING"
    assert catalog.pending_commits() == [pending]


def test_a_second_refresh_of_the_same_seq_loses_and_changes_nothing(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    stream = catalog.create_stream("DB", "S", "ST", info.id, "default", 0)
    history = start_refresh(catalog, info.id)
    held = begin_refresh(catalog, dt, history)
    before = snapshot(catalog)

    # With begin_commit: nothing recorded, and a stream it would claim stays free.
    with pytest.raises(RefreshClaimConflict) as lost:
        begin_refresh(catalog, dt, history, owner="2:b", claims=[StreamClaim(stream.id, 0, 1)])
    assert lost.value.table_id == info.id
    assert snapshot(catalog) == before
    assert catalog.get_stream_by_id(stream.id).claimed_by is None

    # Reserved then decided: the decision fails, the reservation stays undecided.
    reserved = catalog.reserve_commit(
        "2:b", refresh_plan(dt, history), [CommitIntent(info.id, APPEND_INTENT)]
    )
    with pytest.raises(RefreshClaimConflict):
        catalog.decide_commit(reserved.id, [StreamClaim(stream.id, 0, 1)])
    assert [p.state for p in catalog.pending_commits()] == ["decided", "preparing"]
    assert catalog.get_dynamic_table(info.id).claimed_by == held.id
    assert catalog.get_stream_by_id(stream.id).claimed_by is None
    catalog.abandon_commit(reserved.id)  # abandoning the loser releases nothing of the winner
    assert snapshot(catalog) == before


def test_a_claim_for_another_definition_or_seq_loses(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    history = start_refresh(catalog, info.id)
    before = snapshot(catalog)
    for plan in ({"uid": "not-this-definition"}, {"seq": 1}):
        with pytest.raises(RefreshClaimConflict):
            begin_refresh(catalog, dt, history, **plan)
        assert snapshot(catalog) == before
    gone = dataclasses.replace(dt, table_id=info.id + 1000)
    with pytest.raises(RefreshClaimConflict) as lost:
        catalog.begin_commit("1:a", refresh_plan(gone, history), [])
    assert lost.value.table_id == info.id + 1000
    assert snapshot(catalog) == before
    assert begin_refresh(catalog, dt, history).decided  # the right one still wins


def test_finish_records_the_refresh_exactly_once(catalog):
    sources = make_sources(catalog)
    info, dt = make_dt(catalog, sources=sources)
    _, bystander = make_dt(catalog, "OTHER", sources)
    history = start_refresh(catalog, info.id)
    opened = refresh_of(catalog, info.id, history)
    pending = begin_refresh(catalog, dt, history, moment=T0 + 5)
    time.sleep(0.01)
    before = time.time()
    catalog.finish_commit(pending.id, {info.id: 4, sources[0].source_id: 99})
    after = time.time()

    done = catalog.get_dynamic_table(info.id)
    expected = dataclasses.replace(
        dt, refresh_seq=1, claimed_by=None, data_timestamp_us=T0 + 5, data_version=4,
        state="ACTIVE", owner="",
        sources=(dataclasses.replace(sources[0], version=7),
                 dataclasses.replace(sources[1], version=3), sources[2]),
    )  # fmt: skip
    assert done == expected
    row = refresh_of(catalog, info.id, history)
    assert row == dataclasses.replace(
        opened, state="SUCCEEDED", action="FULL", rows_inserted=5, rows_deleted=1,
        rows_updated=2, table_version=4, ended_at=row.ended_at,
    )  # fmt: skip
    assert before <= row.ended_at <= after
    assert catalog.pending_commits() == []
    assert catalog.get_dynamic_table(bystander.table_id) == bystander

    # Finished again (the owner and recovery both try): no-op.
    catalog.finish_commit(pending.id, {info.id: 8})
    assert catalog.get_dynamic_table(info.id) == expected
    assert refresh_of(catalog, info.id, history) == row

    # The old seq is no longer claimable; the next one is, and a stale finish of the
    # first commit does not touch it.
    second_history = start_refresh(catalog, info.id, T0 + 10)
    with pytest.raises(RefreshClaimConflict):
        begin_refresh(catalog, dt, second_history, owner="2:b")
    following = begin_refresh(catalog, done, second_history, owner="2:b", moment=T0 + 10,
                              sources={"0": 9}, counts=(0, 0, 3))  # fmt: skip
    catalog.finish_commit(pending.id, {info.id: 8})
    assert catalog.get_dynamic_table(info.id) == dataclasses.replace(
        expected, claimed_by=following.id)  # fmt: skip
    assert refresh_of(catalog, info.id, second_history).state == "EXECUTING"
    catalog.finish_commit(following.id, {info.id: 5})
    latest = catalog.get_dynamic_table(info.id)
    assert (latest.refresh_seq, latest.data_timestamp_us, latest.data_version, latest.state) == (
        2, T0 + 10, 5, "ACTIVE")  # fmt: skip
    assert [s.version for s in latest.sources] == [9, 3, None]  # only the sources it read
    assert refresh_of(catalog, info.id, second_history).rows_updated == 3
    assert refresh_of(catalog, info.id, history) == row


def test_abandon_releases_the_claim(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    _, other = make_dt(catalog, "OTHER")
    history = start_refresh(catalog, info.id)
    other_history = start_refresh(catalog, other.table_id)
    keep = begin_refresh(catalog, other, other_history, owner="1:keep")
    pending = begin_refresh(catalog, dt, history)
    catalog.abandon_commit(pending.id)
    assert catalog.get_dynamic_table(info.id) == dt  # unclaimed, nothing recorded
    assert refresh_of(catalog, info.id, history).state == "EXECUTING"  # the caller closes it
    assert catalog.get_dynamic_table(other.table_id).claimed_by == keep.id  # others keep theirs
    assert catalog.pending_commits() == [keep]

    catalog.finish_commit(pending.id, {info.id: 4})  # finishing an abandoned commit: no-op
    catalog.abandon_commit(pending.id)  # twice: no-op
    assert catalog.get_dynamic_table(info.id) == dt
    again = begin_refresh(catalog, dt, history, owner="2:b")  # the same seq is free again
    assert catalog.get_dynamic_table(info.id).claimed_by == again.id
    catalog.finish_commit(again.id, {info.id: 1})
    assert catalog.get_dynamic_table(info.id).refresh_seq == 1


def test_only_a_finished_refresh_makes_an_initializing_table_active(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    history = start_refresh(catalog, info.id)
    pending = begin_refresh(catalog, dt, history)
    catalog.abandon_commit(pending.id)
    assert catalog.get_dynamic_table(info.id).state == "INITIALIZING"
    assert catalog.record_no_data(info.id, 0, T0, {}, history) is True
    dt = catalog.get_dynamic_table(info.id)
    assert (dt.state, dt.refresh_seq) == ("INITIALIZING", 1)
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id, T0 + 1), moment=T0 + 1)
    assert catalog.get_dynamic_table(info.id).state == "INITIALIZING"
    catalog.finish_commit(pending.id, {info.id: 1})
    assert catalog.get_dynamic_table(info.id).state == "ACTIVE"

    # A suspended (or active) table stays as it is: finishing a refresh resumes nothing.
    catalog.set_dynamic_table(info.id, state="SUSPENDED", state_reason="USER_SUSPENDED")
    dt = catalog.get_dynamic_table(info.id)
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id, T0 + 2), moment=T0 + 2)
    catalog.finish_commit(pending.id, {info.id: 2})
    done = catalog.get_dynamic_table(info.id)
    assert (done.state, done.state_reason, done.refresh_seq) == (
        "SUSPENDED", "USER_SUSPENDED", 3)  # fmt: skip


def test_a_commit_without_a_refresh_leaves_dynamic_tables_alone(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    history = start_refresh(catalog, info.id)
    before = sorted(catalog.list_dynamic_tables(), key=lambda d: d.table_id)
    refreshes = catalog.list_refreshes()
    plan = {"tables": [{"table_id": info.id}], "statement": "INSERT INTO DT ..."}
    pending = catalog.begin_commit("1:a", plan, [], [CommitIntent(info.id, ROWS_INTENT)])
    assert catalog.get_dynamic_table(info.id) == dt
    catalog.finish_commit(pending.id, {info.id: 3})
    pending = catalog.begin_commit("1:a", plan, [], [CommitIntent(info.id, ROWS_INTENT)])
    catalog.abandon_commit(pending.id)
    assert sorted(catalog.list_dynamic_tables(), key=lambda d: d.table_id) == before
    assert catalog.list_refreshes() == refreshes
    assert refresh_of(catalog, info.id, history).state == "EXECUTING"


# --- NO_DATA -------------------------------------------------------------------------------


def test_record_no_data_is_a_compare_and_swap(catalog):
    sources = make_sources(catalog)
    info, dt = make_dt(catalog, sources=sources)
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id))
    catalog.finish_commit(pending.id, {info.id: 4})
    refreshed = catalog.get_dynamic_table(info.id)  # seq 1, version 4, sources 7 and 3
    history = start_refresh(catalog, info.id, T0 + 60)
    opened = refresh_of(catalog, info.id, history)
    before = snapshot(catalog)

    # A stale expected seq (another refresh came first): nothing changes.
    assert catalog.record_no_data(info.id, 0, T0 + 60, {0: 8}, history) is False
    assert catalog.record_no_data(info.id, 2, T0 + 60, {0: 8}, history) is False
    assert catalog.record_no_data(info.id + 1000, 1, T0 + 60, {0: 8}, history) is False
    assert snapshot(catalog) == before

    started = time.time()
    assert catalog.record_no_data(info.id, 1, T0 + 60, {0: 8, 1: 3}, history) is True
    assert catalog.get_dynamic_table(info.id) == dataclasses.replace(
        refreshed, refresh_seq=2, data_timestamp_us=T0 + 60,
        sources=(dataclasses.replace(sources[0], version=8),
                 dataclasses.replace(sources[1], version=3), sources[2]),
    )  # fmt: skip
    row = refresh_of(catalog, info.id, history)
    assert row == dataclasses.replace(
        opened, state="SUCCEEDED", action="NO_DATA", rows_inserted=0, rows_deleted=0,
        rows_updated=0, table_version=4, ended_at=row.ended_at,
    )  # fmt: skip
    assert started <= row.ended_at <= time.time()
    # Applied once: the same call again is stale.
    assert catalog.record_no_data(info.id, 1, T0 + 120, {0: 9}, history) is False
    assert catalog.get_dynamic_table(info.id).data_timestamp_us == T0 + 60


def test_record_no_data_loses_to_a_claimed_refresh(catalog):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id))
    history = start_refresh(catalog, info.id, T0 + 60)
    before = snapshot(catalog)
    assert catalog.record_no_data(info.id, 0, T0 + 60, {0: 8}, history) is False
    assert snapshot(catalog) == before
    catalog.abandon_commit(pending.id)
    assert catalog.record_no_data(info.id, 0, T0 + 60, {0: 8}, history) is True
    # And a claim made against the seq before the NO_DATA loses.
    with pytest.raises(RefreshClaimConflict):
        begin_refresh(catalog, dt, history)


def test_list_refreshes_of_executing_ones_only(catalog):
    info, _ = make_dt(catalog, sources=make_sources(catalog))
    other, _ = make_dt(catalog, "DT2")
    done = start_refresh(catalog, info.id)
    catalog.update_refresh(done, state="FAILED", action="FAILED", reason="X")
    running = [start_refresh(catalog, info.id, T0 + 1), start_refresh(catalog, other.id)]
    assert [r.id for r in catalog.list_refreshes(executing=True)] == running[::-1]
    assert [r.id for r in catalog.list_refreshes(info.id, executing=True)] == running[:1]
    assert len(catalog.list_refreshes()) == 3


def test_add_no_data_refresh_writes_its_row_and_the_move_together(catalog):
    """The one-write NO_DATA: the row is added only if the compare-and-swap wins, and
    the table moves exactly as record_no_data moves it."""
    sources = make_sources(catalog)
    info, dt = make_dt(catalog, sources=sources)
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id))
    catalog.finish_commit(pending.id, {info.id: 4})
    refreshed = catalog.get_dynamic_table(info.id)
    record = {
        "dt_table_id": info.id, "name": info.full_name, "refresh_uid": "nd1",
        "trigger": "SCHEDULED", "data_timestamp_us": T0 + 60, "started_at": time.time(),
        "owner": "", "source_versions": {"DB.S.SRC": [7, 8]},
    }  # fmt: skip
    before = snapshot(catalog)
    assert catalog.add_no_data_refresh(record, 0, {0: 8}) is None  # stale seq
    assert snapshot(catalog) == before
    added = catalog.add_no_data_refresh(record, 1, {0: 8})
    assert added is not None
    row = refresh_of(catalog, info.id, added)
    shown = (row.state, row.action, row.trigger, row.table_version, row.data_timestamp_us)
    assert shown == ("SUCCEEDED", "NO_DATA", "SCHEDULED", 4, T0 + 60)
    assert (row.rows_inserted, row.rows_deleted, row.rows_updated) == (0, 0, 0)
    assert row.source_versions == {"DB.S.SRC": [7, 8]} and row.ended_at is not None
    assert catalog.get_dynamic_table(info.id) == dataclasses.replace(
        refreshed, refresh_seq=2, data_timestamp_us=T0 + 60,
        sources=(dataclasses.replace(sources[0], version=8), *refreshed.sources[1:]),
    )  # fmt: skip
    # A claim holds the table: nothing written.
    claim = begin_refresh(catalog, catalog.get_dynamic_table(info.id), added)
    before = snapshot(catalog)
    assert catalog.add_no_data_refresh({**record, "refresh_uid": "nd2"}, 2, {0: 9}) is None
    assert snapshot(catalog) == before
    catalog.abandon_commit(claim.id)


# --- CREATE OR REPLACE: the swap -----------------------------------------------------------


def test_swap_replaces_the_old_table_under_its_name(catalog, tmp_path):
    sources = make_sources(catalog)
    old_info, old = make_dt(catalog, "DT", sources)
    pending = begin_refresh(catalog, old, start_refresh(catalog, old_info.id))
    catalog.finish_commit(pending.id, {old_info.id: 1})
    start_refresh(catalog, old_info.id, T0 + 1)
    catalog.open_channel(old_info.id, "c")
    building = "DT$BUILDING$0123456789AB"
    new_info, new = make_dt(catalog, building, sources[1:], query="SELECT 2 AS A")
    first_new = start_refresh(catalog, new_info.id)
    assert refresh_of(catalog, new_info.id, first_new).name == new_info.full_name

    # Refused while a pending commit writes the old table: nothing changes.
    writing = [CommitIntent(old_info.id, APPEND_INTENT)]
    writer = catalog.begin_commit("1:w", {"tables": []}, [], writing)
    before = snapshot(catalog)
    with pytest.raises(TableBusyError) as busy:
        catalog.swap_dynamic_table(old_info.id, new_info.id)
    assert (busy.value.table_ids, busy.value.commit_ids) == ([old_info.id], [writer.id])
    assert snapshot(catalog) == before
    catalog.abandon_commit(writer.id)

    catalog.swap_dynamic_table(old_info.id, new_info.id)
    renamed = catalog.get_table("DB", "S", "DT")
    assert renamed == dataclasses.replace(new_info, name="DT")
    with pytest.raises(TableNotFoundError):
        catalog.get_table("DB", "S", building)
    assert_forgotten(catalog, tmp_path / "catalog.sqlite", old_info.id)
    assert catalog.list_channels(old_info.id) == []
    # Its definition, uid and sources; active now.
    assert catalog.get_dynamic_table(new_info.id) == dataclasses.replace(
        new, state="ACTIVE", owner=""
    )
    assert [dt.table_id for dt in catalog.list_dynamic_tables()] == [new_info.id]
    assert sorted(t.name for t in catalog.list_tables()) == ["DT", "SRC", "SRC2"]
    # The new table's history carries the name it has now.
    assert [r.name for r in catalog.list_refreshes(new_info.id)] == ["DB.S.DT"]
    assert catalog.list_refreshes() == catalog.list_refreshes(new_info.id)

    # A refresh of the replaced definition loses; the new one refreshes.
    with pytest.raises(RefreshClaimConflict):  # (no intent: it would find the table gone)
        catalog.begin_commit("1:a", refresh_plan(old, first_new, seq=1), [])
    with pytest.raises(RefreshClaimConflict):  # the old uid on the new table
        begin_refresh(catalog, new, first_new, uid=old.uid)
    pending = begin_refresh(catalog, new, first_new, sources={"0": 3})
    catalog.finish_commit(pending.id, {new_info.id: 1})
    assert catalog.get_dynamic_table(new_info.id).state == "ACTIVE"


def test_a_replacement_goes_live_at_its_swap_not_at_its_refresh(catalog):
    """A table CREATE OR REPLACE builds stays INITIALIZING and its creator's after its
    initial refresh (``"activate": False``), so recovery drops it if the creator dies
    before the swap; the swap makes it ACTIVE."""
    old_info, _ = make_dt(catalog, "DT")
    new_info, new = make_dt(catalog, "DT$BUILDING$0123456789AB", owner="9:creator")
    pending = begin_refresh(catalog, new, start_refresh(catalog, new_info.id), activate=False)
    catalog.finish_commit(pending.id, {new_info.id: 1})
    built = catalog.get_dynamic_table(new_info.id)
    assert (built.state, built.owner, built.refresh_seq) == ("INITIALIZING", "9:creator", 1)
    catalog.swap_dynamic_table(old_info.id, new_info.id)
    live = catalog.get_dynamic_table(new_info.id)
    assert (live.state, live.owner, live.data_timestamp_us) == ("ACTIVE", "", T0)


def test_swap_names_the_history_as_the_table_is_named(catalog):
    old_info, _ = make_dt(catalog, "my dt")
    new_info, _ = make_dt(catalog, "my dt$BUILDING$0123456789ab")
    start_refresh(catalog, new_info.id)
    catalog.swap_dynamic_table(old_info.id, new_info.id)
    start_refresh(catalog, new_info.id, T0 + 1)  # named as the refresh code names it
    renamed = catalog.get_table_by_id(new_info.id)
    assert renamed.full_name == 'DB.S."my dt"'
    assert [r.name for r in catalog.list_refreshes(new_info.id)] == [renamed.full_name] * 2


def test_swap_onto_a_dropped_table_changes_nothing(catalog):
    old_info, _ = make_dt(catalog, "DT")
    new_info, _ = make_dt(catalog, "DT$BUILDING$0123456789AB")
    catalog.drop_table(new_info.id)
    before = snapshot(catalog)
    with pytest.raises((TableNotFoundError, TableAlreadyExistsError)):  # either: refused
        catalog.swap_dynamic_table(old_info.id, new_info.id)
    assert snapshot(catalog) == before
    assert catalog.get_table("DB", "S", "DT") == old_info


# --- Drops ---------------------------------------------------------------------------------


def dt_with_history(catalog, name, database="DB", schema_name="S"):
    """A refreshed dynamic table with a history row and a running refresh."""
    sources = make_sources(catalog, database, schema_name)
    info, dt = make_dt(catalog, name, sources, database, schema_name)
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id))
    catalog.finish_commit(pending.id, {info.id: 1})
    start_refresh(catalog, info.id, T0 + 1)
    return info


def test_drop_table_forgets_a_dynamic_table(catalog, tmp_path):
    info = dt_with_history(catalog, "DT")
    kept, kept_dt = make_dt(catalog, "KEPT", catalog.get_dynamic_table(info.id).sources)
    kept_history = start_refresh(catalog, kept.id)
    dt = catalog.get_dynamic_table(info.id)

    # Busy while a refresh commit writes it: the claim and the history stay.
    pending = begin_refresh(catalog, dt, start_refresh(catalog, info.id, T0 + 2))
    before = snapshot(catalog)
    with pytest.raises(TableBusyError):
        catalog.drop_table(info.id)
    assert snapshot(catalog) == before
    catalog.abandon_commit(pending.id)

    catalog.drop_table(info.id)
    assert_forgotten(catalog, tmp_path / "catalog.sqlite", info.id)
    assert catalog.get_dynamic_table(kept.id) == kept_dt
    assert [r.id for r in catalog.list_refreshes(kept.id)] == [kept_history]
    # A source table dropped: the definitions reading it stay (their refresh tells).
    catalog.drop_table(kept_dt.sources[0].source_id)
    assert catalog.get_dynamic_table(kept.id) == kept_dt


@pytest.mark.parametrize("what", ["schema", "database"])
def test_drop_cascade_forgets_the_dynamic_tables_inside(catalog, tmp_path, what):
    inside = dt_with_history(catalog, "DT", "DB", "S")
    inside_too = dt_with_history(catalog, "DT2", "DB", "S2") if what == "database" else inside
    outside = dt_with_history(catalog, "DT", "ELSE", "S")
    outside_dt = catalog.get_dynamic_table(outside.id)
    outside_history = catalog.list_refreshes(outside.id)

    if what == "schema":
        dropped = catalog.drop_schema("DB", "S", cascade=True)
    else:
        dropped = catalog.drop_database("DB", cascade=True)
    assert {inside.id, inside_too.id} <= {t.id for t in dropped}
    for info in (inside, inside_too):
        assert_forgotten(catalog, tmp_path / "catalog.sqlite", info.id)
    assert catalog.get_dynamic_table(outside.id) == outside_dt
    assert catalog.list_refreshes(outside.id) == outside_history
    assert len(outside_history) == 2


# --- The refresh history -------------------------------------------------------------------


def test_refresh_rows_round_trip_and_update(catalog):
    info, _ = make_dt(catalog)
    started = time.time()
    refresh_id = catalog.add_refresh({
        "dt_table_id": info.id, "name": info.full_name, "refresh_uid": "u1",
        "trigger": "SCHEDULED", "state": "EXECUTING", "data_timestamp_us": T0,
        "started_at": started, "owner": "1:a",
        "source_versions": {"DB.S.SRC": [None, 3]},
    })  # fmt: skip
    (row,) = catalog.list_refreshes(info.id)
    assert (row.id, row.dt_table_id, row.name, row.refresh_uid, row.trigger, row.state) == (
        refresh_id, info.id, "DB.S.DT", "u1", "SCHEDULED", "EXECUTING")  # fmt: skip
    assert (row.action, row.reason, row.error, row.ended_at) == (None, "", "", None)
    assert (row.rows_inserted, row.rows_deleted, row.rows_updated, row.table_version) == (
        None, None, None, None)  # fmt: skip
    assert (row.data_timestamp_us, row.started_at, row.owner, row.skipped_ticks) == (
        T0, started, "1:a", 0)  # fmt: skip
    assert row.source_versions == {"DB.S.SRC": [None, 3]}

    catalog.update_refresh(refresh_id, state="FAILED", action="FAILED", reason="SOURCE_DROPPED",
                           error="gone", ended_at=started + 1, skipped_ticks=2,
                           source_versions={"DB.S.SRC": [3, 4]})  # fmt: skip
    updated = dataclasses.replace(row, state="FAILED", action="FAILED", reason="SOURCE_DROPPED",
                                  error="gone", ended_at=started + 1, skipped_ticks=2,
                                  source_versions={"DB.S.SRC": [3, 4]})  # fmt: skip
    assert catalog.list_refreshes(info.id) == [updated]
    for values in ({"dt_table_id": 9}, {"name": "X"}, {"owner": "2:b"}, {"started_at": 0.0}):
        with pytest.raises(ValueError):
            catalog.update_refresh(refresh_id, **values)
    assert catalog.list_refreshes(info.id) == [updated]


def test_fold_refresh_merges_a_row_into_an_earlier_one_of_its_table(catalog):
    first, _ = make_dt(catalog, "A")
    second, _ = make_dt(catalog, "B")
    kept, folded, other = (start_refresh(catalog, t.id, T0 + n)
                           for n, t in enumerate([first, first, second]))  # fmt: skip
    assert catalog.fold_refresh(other, kept, skipped_ticks=1) is False  # another table's
    assert catalog.fold_refresh(kept, kept, skipped_ticks=1) is False
    assert catalog.fold_refresh(folded + 1000, kept, skipped_ticks=1) is False
    with pytest.raises(ValueError):
        catalog.fold_refresh(folded, kept, name="X")
    assert [r.id for r in catalog.list_refreshes()] == [other, folded, kept]
    assert catalog.fold_refresh(folded, kept, skipped_ticks=3, error="again",
                                data_timestamp_us=T0 + 9) is True  # fmt: skip
    (row,) = catalog.list_refreshes(first.id)
    assert (row.id, row.skipped_ticks, row.error, row.data_timestamp_us) == (
        kept, 3, "again", T0 + 9)  # fmt: skip
    assert catalog.get_refresh(folded) is None
    assert [r.id for r in catalog.list_refreshes(second.id)] == [other]


def test_list_refreshes_is_newest_first(catalog):
    first, _ = make_dt(catalog, "A")
    second, _ = make_dt(catalog, "B")
    ids = [start_refresh(catalog, table.id, T0 + n) for n, table in
           enumerate([first, second, first, first, second])]  # fmt: skip
    assert [r.id for r in catalog.list_refreshes(first.id)] == [ids[3], ids[2], ids[0]]
    assert [r.id for r in catalog.list_refreshes(second.id)] == [ids[4], ids[1]]
    assert [r.id for r in catalog.list_refreshes()] == ids[::-1]
    assert [r.id for r in catalog.list_refreshes(limit=2)] == [ids[4], ids[3]]
    assert [r.id for r in catalog.list_refreshes(first.id, limit=1)] == [ids[3]]
    assert catalog.list_refreshes(first.id + 1000) == []


def test_history_keeps_at_most_max_rows_per_table(catalog, monkeypatch):
    monkeypatch.setattr(sqlite_dynamic, "HISTORY_MAX_ROWS", 3)
    first, _ = make_dt(catalog, "A")
    second, _ = make_dt(catalog, "B")
    others = [start_refresh(catalog, second.id, T0 + n) for n in range(2)]
    mine = [start_refresh(catalog, first.id, T0 + n) for n in range(5)]
    assert [r.id for r in catalog.list_refreshes(first.id)] == mine[:1:-1]  # newest 3
    assert [r.id for r in catalog.list_refreshes(second.id)] == others[::-1]  # untouched
    more = [start_refresh(catalog, second.id, T0 + n) for n in range(3)]
    assert [r.id for r in catalog.list_refreshes(second.id)] == more[::-1]
    assert [r.id for r in catalog.list_refreshes(first.id)] == mine[:1:-1]


def test_history_drops_rows_past_retention(catalog, monkeypatch):
    first, _ = make_dt(catalog, "A")
    second, _ = make_dt(catalog, "B")

    def add(table, age):
        return catalog.add_refresh({
            "dt_table_id": table.id, "name": table.full_name, "refresh_uid": f"{age}",
            "trigger": "SCHEDULED", "state": "SUCCEEDED", "data_timestamp_us": T0,
            "started_at": time.time() - age,
        })  # fmt: skip

    old = add(first, 3600)
    recent = add(first, 60)
    old_elsewhere = add(second, 3600)
    assert len(catalog.list_refreshes()) == 3  # within the default 7 days
    monkeypatch.setattr(sqlite_dynamic, "HISTORY_RETENTION_SECONDS", 1800.0)
    new = add(first, 0)
    assert [r.id for r in catalog.list_refreshes(first.id)] == [new, recent]
    assert old not in [r.id for r in catalog.list_refreshes()]
    # Another table's old rows go only when that table records a refresh.
    assert [r.id for r in catalog.list_refreshes(second.id)] == [old_elsewhere]
    newer = add(second, 0)
    assert [r.id for r in catalog.list_refreshes(second.id)] == [newer]


# --- Racing for one refresh ----------------------------------------------------------------


def test_two_connections_claim_one_refresh_once(catalog, catalog_location):
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    history = start_refresh(catalog, info.id)
    other = open_catalog(catalog_location)
    try:
        intents = [CommitIntent(info.id, APPEND_INTENT)]
        mine = catalog.reserve_commit("1:a", refresh_plan(dt, history), intents)
        theirs = other.reserve_commit("2:b", refresh_plan(dt, history, moment=T0 + 1), intents)
        other.decide_commit(theirs.id, [])
        with pytest.raises(RefreshClaimConflict):
            catalog.decide_commit(mine.id, [])
        catalog.abandon_commit(mine.id)
        assert catalog.get_dynamic_table(info.id).claimed_by == theirs.id
        other.finish_commit(theirs.id, {info.id: 1})
        done = catalog.get_dynamic_table(info.id)
        assert (done.refresh_seq, done.data_timestamp_us, done.claimed_by) == (1, T0 + 1, None)
    finally:
        other.close()


_REFRESH_CLAIM_CHILD = """
from catalog import APPEND_INTENT, REFRESH_PLAN_KEY, CommitIntent, RefreshClaimConflict
tables = json.loads(args[0])
wait()
result = []
for table_id, uid, history in tables:
    plan = {REFRESH_PLAN_KEY: {
        "dt": table_id, "uid": uid, "seq": 0, "history": history,
        "data_timestamp_us": 1000 + index, "sources": {"0": index}, "counts": [index, 0, 0],
        "action": "FULL"}}
    try:
        intents = [CommitIntent(table_id, APPEND_INTENT)]
        pending = catalog.begin_commit(f"{index}:r", plan, [], intents)
        result.append((table_id, pending.id))
    except RefreshClaimConflict as exc:
        assert exc.table_id == table_id, exc.table_id
        result.append((table_id, None))
catalog.close()
print(json.dumps(result))
"""


def test_racing_processes_claim_a_refresh_once(catalog, catalog_location, tmp_path):
    sources = make_sources(catalog)
    tables = []
    for n in range(10):
        info, dt = make_dt(catalog, f"DT{n}", sources)
        tables.append((info.id, dt.uid, start_refresh(catalog, info.id)))
    outputs = run_children(_REFRESH_CLAIM_CHILD, catalog_location,
                           tmp_path / "barrier", 2, json.dumps(tables))  # fmt: skip
    winners = {}  # table id -> (child, commit id)
    for child, output in enumerate(outputs):
        assert [table_id for table_id, _ in output] == [t[0] for t in tables]
        for table_id, commit_id in output:
            if commit_id is not None:
                assert table_id not in winners, f"refresh of {table_id} claimed twice"
                winners[table_id] = (child, commit_id)
    assert sorted(winners) == sorted(t[0] for t in tables)  # exactly one winner each
    assert sorted(p.id for p in catalog.pending_commits()) == sorted(
        commit_id for _, commit_id in winners.values())  # fmt: skip
    for table_id, (child, commit_id) in winners.items():
        assert catalog.get_dynamic_table(table_id).claimed_by == commit_id
        catalog.finish_commit(commit_id, {table_id: 1})
        done = catalog.get_dynamic_table(table_id)
        assert (done.refresh_seq, done.data_timestamp_us, done.sources[0].version) == (
            1, 1000 + child, child)  # fmt: skip
        (row,) = catalog.list_refreshes(table_id)
        assert (row.state, row.rows_inserted) == ("SUCCEEDED", child)
    assert catalog.pending_commits() == []


def test_a_refresh_and_a_stream_claim_decide_together(catalog):
    """A refresh that also consumes a stream: both are claimed, or neither."""
    info, dt = make_dt(catalog, sources=make_sources(catalog))
    source_id = dt.sources[0].source_id
    stream = catalog.create_stream("DB", "S", "ST", source_id, "default", 0)
    history = start_refresh(catalog, info.id)
    # The stream moved meanwhile: the refresh is not claimed either.
    taken = catalog.begin_commit("9:z", {}, [StreamClaim(stream.id, 0, 1)])
    before = snapshot(catalog)
    with pytest.raises(StreamClaimConflict):
        begin_refresh(catalog, dt, history, claims=[StreamClaim(stream.id, 0, 2)])
    assert snapshot(catalog) == before
    catalog.abandon_commit(taken.id)
    pending = begin_refresh(catalog, dt, history, claims=[StreamClaim(stream.id, 0, 2)])
    catalog.finish_commit(pending.id, {info.id: 1})
    assert catalog.get_stream_by_id(stream.id).offset_version == 2
    assert catalog.get_dynamic_table(info.id).refresh_seq == 1
