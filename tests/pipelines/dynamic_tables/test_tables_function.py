"""``TABLE([db.]INFORMATION_SCHEMA.DYNAMIC_TABLES(...))``: one row per dynamic table with
its lag measured from the refresh history; and the argument reading it shares with
``DYNAMIC_TABLE_REFRESH_HISTORY`` and ``DYNAMIC_TABLE_GRAPH_HISTORY``
(:mod:`pipelines.dynamic_tables.arguments`).

The lag measure is checked exactly on history rows made here (no Spark); the function
itself on one module session holding a pipeline D -> E -> F, a lone table G that failed
its last refresh, a quoted name, a suspended table and a table in another database.
"""

from __future__ import annotations

import pytest

from catalog import RefreshRecord
from pipelines import Session, SqlError
from pipelines.dynamic_tables.tables_function import Lag, lag_measure
from pipelines.errors import ObjectNotFoundError
from tests.pipelines.refusals import assert_refused

# The lag measure (no Spark) ------------------------------------------------------------


def refresh(ended: float | None, data: float, state: str = "SUCCEEDED") -> RefreshRecord:
    return RefreshRecord(
        id=1, dt_table_id=1, name="DB.PUBLIC.D", refresh_uid="u", trigger="SCHEDULED",
        action="FULL", state=state, reason="", error="", data_timestamp_us=int(data * 1e6),
        source_versions={}, rows_inserted=0, rows_deleted=0, rows_updated=0, table_version=1,
        started_at=data, ended_at=ended, owner="",
    )  # fmt: skip


def test_the_lag_is_the_sawtooth_between_refreshes():
    # Refreshed at 10 (data of 0) and at 70 (data of 60); measured until 100. The lag
    # climbs 10 -> 70, drops to 10 at 70, climbs to 40 at 100.
    history = [refresh(70, 60), refresh(10, 0)]  # newest first, as the catalog keeps them
    measured = lag_measure(history, 60.0, now=100)
    # Area: (10 + 70) / 2 * 60 + (10 + 40) / 2 * 30 = 2400 + 750 over 90 s.
    assert measured == Lag(mean=round(3150 / 90, 3), maximum=70.0, above=10.0,
                           within=round(1 - 10 / 90, 6))  # fmt: skip
    # DOWNSTREAM: no time target, so no time above it.
    assert lag_measure(history, None, now=100) == Lag(round(3150 / 90, 3), 70.0, None, None)


def test_the_lag_ignores_what_did_not_complete_and_what_is_before_the_start():
    history = [refresh(None, 90, "EXECUTING"), refresh(80, 75, "FAILED"), refresh(70, 60),
               refresh(10, 0)]  # fmt: skip
    assert lag_measure(history, 60.0, now=100) == lag_measure(history[2:], 60.0, now=100)
    # REFRESH_DATA_TIMESTAMP_START at 60: only the refresh of data 60 counts (70 -> 100).
    assert lag_measure(history, 60.0, now=100, start_us=60_000_000) == Lag(25.0, 40.0, 0.0, 1.0)
    assert lag_measure(history, 60.0, now=100, start_us=61_000_000) is None
    assert lag_measure([], 60.0, now=100) is None


def test_a_data_timestamp_ahead_of_the_clock_is_no_negative_lag():
    assert lag_measure([refresh(10, 20)], 5.0, now=30) == Lag(round(50 / 20, 3), 10.0, 5.0, 0.75)
    assert lag_measure([refresh(30, 20)], 5.0, now=30) == Lag(10.0, 10.0, 0.0, 0.0)


# The function on one session -----------------------------------------------------------


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    made = Session(tmp_path_factory.mktemp("dynamic_tables_function") / "warehouse", spark=spark)
    made.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    made.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    made.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID, V FROM T")
    made.sql("CREATE DYNAMIC TABLE E TARGET_LAG = DOWNSTREAM AS SELECT ID FROM D WHERE ID > 0")
    made.sql("CREATE DYNAMIC TABLE F TARGET_LAG = '2 minutes' REFRESH_MODE = FULL AS "
             "SELECT ID, count(*) OVER (PARTITION BY ID) AS N FROM E")  # fmt: skip
    made.sql("CREATE DYNAMIC TABLE G TARGET_LAG = '1 minute' AS SELECT 10 / ID AS Q FROM T")
    made.sql("CREATE DYNAMIC TABLE \"quiet dt\" TARGET_LAG = '1 hour' AS SELECT ID FROM T")
    made.sql('ALTER DYNAMIC TABLE "quiet dt" SUSPEND')
    made.sql("INSERT INTO T VALUES (0, 'zero')")
    with pytest.raises(SqlError):
        made.sql("ALTER DYNAMIC TABLE G REFRESH")  # 10 / 0: G's last refresh FAILED
    made.sql("CREATE DATABASE OTHER")  # and uses it
    made.sql("CREATE DYNAMIC TABLE OD TARGET_LAG = '1 minute' AS SELECT ID FROM DB.PUBLIC.T")
    made.sql("USE SCHEMA DB.PUBLIC")
    yield made
    made.close()


def names(session, call: str) -> list[str]:
    """The QUALIFIED_NAMEs ``TABLE(<call>)`` answers, in its order."""
    return [r.QUALIFIED_NAME for r in session.sql(f"SELECT * FROM TABLE({call})").collect()]


def test_a_row_says_what_show_dynamic_tables_says(session):
    row = session.sql("SELECT * FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLES(NAME => 'F'))").first()
    shown = session.sql("SHOW DYNAMIC TABLES LIKE 'F'").first()
    said = (shown.name, shown.schema_name, shown.database_name, "DB.PUBLIC.F")
    assert said == (row.NAME, row.SCHEMA_NAME, row.DATABASE_NAME, row.QUALIFIED_NAME)
    assert (row.TARGET_LAG_SEC, row.TARGET_LAG_TYPE, shown.target_lag) == (
        120, "USER_DEFINED", "2 minutes")  # fmt: skip
    said = (shown.refresh_mode, shown.refresh_mode_reason or None)
    assert said == (row.REFRESH_MODE, row.REFRESH_MODE_REASON)
    assert row.REFRESH_MODE == "FULL"
    assert row.SCHEDULING_STATE.state == shown.scheduling_state == "ACTIVE"
    assert row.LATEST_DATA_TIMESTAMP == shown.data_timestamp is not None
    assert (row.LAST_COMPLETED_REFRESH_STATE, row.LAST_COMPLETED_REFRESH_STATE_CODE) == (
        "SUCCEEDED", None)  # fmt: skip
    # Refreshed and active: measured, the peak at least the mean, within its 2 minutes.
    assert 0 <= row.MEAN_LAG_SEC <= row.MAXIMUM_LAG_SEC
    assert row.TIME_ABOVE_TARGET_LAG_SEC == 0.0 and row.TIME_WITHIN_TARGET_LAG_RATIO == 1.0


def test_the_rows_come_failed_first_then_by_name(session):
    every = names(session, "DYNAMIC_TABLES()")
    # (A quote sorts before letters.)
    assert every == ["DB.PUBLIC.G", 'DB.PUBLIC."quiet dt"', "DB.PUBLIC.D", "DB.PUBLIC.E",
                     "DB.PUBLIC.F", "OTHER.PUBLIC.OD"]  # fmt: skip
    failed = session.sql("SELECT * FROM TABLE(DYNAMIC_TABLES(RESULT_LIMIT => 1))").collect()
    assert [(r.NAME, r.LAST_COMPLETED_REFRESH_STATE, r.LAST_COMPLETED_REFRESH_STATE_CODE)
            for r in failed] == [("G", "FAILED", "SQL_EXECUTION_ERROR")]  # fmt: skip
    assert "DIVIDE_BY_ZERO" in failed[0].LAST_COMPLETED_REFRESH_STATE_MESSAGE
    # Its data timestamp is its last successful refresh's, as SHOW says.
    shown = session.sql("SHOW DYNAMIC TABLES LIKE 'G'").first()
    assert shown.data_timestamp == failed[0].LATEST_DATA_TIMESTAMP


def test_downstream_and_suspended_tables_have_no_target_or_no_measure(session):
    e, quiet = session.sql("SELECT * FROM TABLE(DYNAMIC_TABLES()) WHERE NAME IN ('E', 'quiet dt') "
                           "ORDER BY NAME").collect()  # fmt: skip
    assert (e.TARGET_LAG_SEC, e.TARGET_LAG_TYPE) == (None, "DOWNSTREAM")
    assert e.MEAN_LAG_SEC is not None and e.TIME_ABOVE_TARGET_LAG_SEC is None
    assert e.TIME_WITHIN_TARGET_LAG_RATIO is None
    assert tuple(quiet.SCHEDULING_STATE)[:2] == ("SUSPENDED", "USER_SUSPENDED")
    assert (quiet.MEAN_LAG_SEC, quiet.MAXIMUM_LAG_SEC, quiet.TIME_WITHIN_TARGET_LAG_RATIO) == (
        None, None, None)  # fmt: skip
    assert quiet.TARGET_LAG_SEC == 3600 and quiet.LATEST_DATA_TIMESTAMP is not None


def test_a_quoted_name_keeps_its_case(session):
    assert names(session, "DYNAMIC_TABLES(NAME => '\"quiet dt\"')") == ['DB.PUBLIC."quiet dt"']
    assert names(session, "DYNAMIC_TABLES(NAME => 'db.public.\"quiet dt\"')") == [
        'DB.PUBLIC."quiet dt"']  # fmt: skip
    with pytest.raises(ObjectNotFoundError, match="QUIET_DT does not exist"):
        session.sql("SELECT * FROM TABLE(DYNAMIC_TABLES(NAME => 'quiet_dt'))")


def test_include_connected_lists_the_whole_pipeline(session):
    expected = ["DB.PUBLIC.D", "DB.PUBLIC.E", "DB.PUBLIC.F"]
    for name in ("D", "E", "F"):  # upstream, downstream, both ways: the same pipeline
        found = names(session, f"DYNAMIC_TABLES(NAME => '{name}', INCLUDE_CONNECTED => TRUE)")
        assert found == expected, name
    assert names(session, "DYNAMIC_TABLES(NAME => 'G', INCLUDE_CONNECTED => TRUE)") == [
        "DB.PUBLIC.G"]  # fmt: skip
    assert names(session, "DYNAMIC_TABLES(NAME => 'E', INCLUDE_CONNECTED => FALSE)") == [
        "DB.PUBLIC.E"]  # fmt: skip


def test_the_database_qualifier_keeps_to_its_database(session):
    assert names(session, "OTHER.INFORMATION_SCHEMA.DYNAMIC_TABLES()") == ["OTHER.PUBLIC.OD"]
    assert names(session, "other.information_schema.dynamic_tables(NAME => 'OD')") == [
        "OTHER.PUBLIC.OD"]  # NAME is read in that database  # fmt: skip
    assert len(names(session, "DB.INFORMATION_SCHEMA.DYNAMIC_TABLES()")) == 5
    with pytest.raises(ObjectNotFoundError, match="NOPE"):
        session.sql("SELECT * FROM TABLE(NOPE.INFORMATION_SCHEMA.DYNAMIC_TABLES())").collect()


def test_the_measure_starts_at_refresh_data_timestamp_start(session):
    def lag(start: str) -> tuple:
        row = session.sql("SELECT MEAN_LAG_SEC, MAXIMUM_LAG_SEC FROM TABLE(DYNAMIC_TABLES("
                          f"NAME => 'D', REFRESH_DATA_TIMESTAMP_START => '{start}'))").first()
        return tuple(row)

    assert lag("2999-01-01 00:00:00") == (None, None)  # no refresh that recent
    assert None not in lag("2000-01-01T00:00:00+02:00")


@pytest.mark.parametrize(("arguments", "fragments"), [
    ("'D'", ["takes named arguments"]),
    ("FOO => 1", ["unknown argument FOO", "INCLUDE_CONNECTED"]),
    ("NAME => 'D', NAME => 'E'", ["repeated argument NAME"]),
    ("NAME => 1", ["NAME takes a string"]),
    ("NAME => 'a b c'", ["is not a name"]),
    ("NAME_PREFIX => TRUE", ["NAME_PREFIX takes a string"]),
    ("RESULT_LIMIT => 0", ["RESULT_LIMIT", "1 to 10,000"]),
    ("RESULT_LIMIT => 10001", ["RESULT_LIMIT", "1 to 10,000"]),
    ("RESULT_LIMIT => 1" + "0" * 5000, ["RESULT_LIMIT", "1 to 10,000"]),
    ("RESULT_LIMIT => -1", ["RESULT_LIMIT"]),
    ("RESULT_LIMIT => 2.5", ["RESULT_LIMIT"]),
    ("RESULT_LIMIT => '5'", ["RESULT_LIMIT"]),
    ("INCLUDE_CONNECTED => 'yes'", ["INCLUDE_CONNECTED takes TRUE or FALSE"]),
    ("INCLUDE_CONNECTED => TRUE", ["needs NAME"]),
    ("NAME => 'D', INCLUDE_CONNECTED => TRUE, RESULT_LIMIT => 5", ["leave RESULT_LIMIT out"]),
    ("REFRESH_DATA_TIMESTAMP_START => CURRENT_TIMESTAMP()", ["takes a timestamp as a string"]),
    ("REFRESH_DATA_TIMESTAMP_START => 'yesterday'", ["takes a timestamp as a string"]),
])  # fmt: skip
def test_hostile_arguments_are_refused_by_name(session, arguments, fragments):
    assert_refused(session, f"SELECT * FROM TABLE(DYNAMIC_TABLES({arguments}))",
                   "SQL_COMPILATION_ERROR", "DYNAMIC_TABLES", *fragments)  # fmt: skip


def test_a_missing_table_is_not_found_with_a_near_miss(session):
    assert_refused(session, "SELECT * FROM TABLE(DYNAMIC_TABLES(NAME => 'T'))", "OBJECT_NOT_FOUND",
                   "dynamic table DB.PUBLIC.T does not exist", kind=ObjectNotFoundError)


def test_the_plain_name_is_a_function_not_a_view(session):
    """As in Snowflake, INFORMATION_SCHEMA has no view DYNAMIC_TABLES: the answer names the
    function's form (and the history functions' likewise)."""
    for name in ("DYNAMIC_TABLES", "DYNAMIC_TABLE_REFRESH_HISTORY"):
        assert_refused(session, f"SELECT * FROM INFORMATION_SCHEMA.{name}", "SQL_COMPILATION_ERROR",
                       f"TABLE(INFORMATION_SCHEMA.{name}())")
    assert_refused(session, "SELECT * FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLES)",
                   "SQL_COMPILATION_ERROR", "without calling it")


def test_what_follows_table_versions_cannot_read_it(session):
    assert_refused(session, "CREATE DYNAMIC TABLE DX TARGET_LAG = '1 minute' AS SELECT T.ID, d.NAME "
                   "FROM T, TABLE(DYNAMIC_TABLES()) d", "SQL_COMPILATION_ERROR",
                   "cannot read DYNAMIC_TABLES")  # fmt: skip
    assert session.sql("SHOW DYNAMIC TABLES LIKE 'DX'").collect() == []
    session.sql("CREATE VIEW VX AS SELECT NAME, MEAN_LAG_SEC FROM TABLE(DYNAMIC_TABLES())")
    try:
        assert_refused(session, "CREATE STREAM SX ON VIEW VX", "SQL_COMPILATION_ERROR",
                       "DYNAMIC_TABLES")
        assert session.sql("SHOW STREAMS LIKE 'SX'").collect() == []
        # A view of it is read like the function (in a query, not in what follows versions).
        assert len(session.sql("SELECT * FROM VX").collect()) == 6
    finally:
        session.sql("DROP VIEW VX")


# The shared argument reading, in the history functions ---------------------------------


def test_the_refresh_history_reads_its_data_timestamp_range(session):
    def count(arguments: str) -> int:
        return session.sql("SELECT count(*) FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
                           f"NAME => 'D', {arguments}))").first()[0]  # fmt: skip

    every = count("RESULT_LIMIT => 10000")
    assert every >= 1
    assert count("DATA_TIMESTAMP_START => '2000-01-01 00:00:00'") == every
    assert count("DATA_TIMESTAMP_END => '2000-01-01 00:00:00'") == 0
    assert count("DATA_TIMESTAMP_START => '2999-01-01'") == 0
    assert_refused(session, "SELECT * FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
                   "DATA_TIMESTAMP_START => DATEADD('day', -1, CURRENT_TIMESTAMP())))",
                   "SQL_COMPILATION_ERROR", "DATA_TIMESTAMP_START takes a timestamp as a string")
    assert_refused(session, "SELECT * FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(RESULT_LIMIT => 9"
                   + "9" * 5000 + "))", "SQL_COMPILATION_ERROR", "1 to 10,000")


@pytest.mark.parametrize(("arguments", "fragment"), [
    ("AS_OF => CURRENT_TIMESTAMP()", "AS_OF is not supported"),
    ("NAME_PREFIX => 'DB', NAME_PREFIX => 'DB'", "repeated argument NAME_PREFIX"),
    ("NAME_PREFIX => 5", "NAME_PREFIX takes a string"),
    ("NAME => 'D'", "unknown argument NAME"),
])  # fmt: skip
def test_the_graph_history_reads_arguments_the_same_way(session, arguments, fragment):
    assert_refused(session, f"SELECT * FROM TABLE(DYNAMIC_TABLE_GRAPH_HISTORY({arguments}))",
                   "SQL_COMPILATION_ERROR", "DYNAMIC_TABLE_GRAPH_HISTORY", fragment)
