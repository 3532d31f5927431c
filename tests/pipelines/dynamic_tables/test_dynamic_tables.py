"""Dynamic tables through the session: definition, the initial and later refreshes
(NO_DATA, FULL as a difference), the history, refusals, and what reads them.

The refresh internals have their own files (classify, schedule, diff, rewrite); the
SIGKILL tests are in ``test_kill.py``.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pipelines import SqlError
from tests.pipelines.conftest import rows
from tests.pipelines.refusals import assert_refused


def ints(session, query):
    return sorted(tuple(int(v) if v is not None and not isinstance(v, str) else v for v in r)
                  for r in rows(session.sql(query)))  # fmt: skip


def history(session, name):
    return session.sql(
        "SELECT REFRESH_TRIGGER, REFRESH_ACTION, STATE, STATE_CODE, ROWS_INSERTED, ROWS_DELETED"
        f" FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(NAME => '{name}'))"
    ).collect()


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    return session


def test_create_runs_the_initial_refresh_and_reads_like_a_table(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS "
             "SELECT ID, upper(V) AS U FROM T WHERE ID > 1")  # fmt: skip
    assert ints(base, "SELECT * FROM D") == [(2, "B"), (3, "C")]
    assert [tuple(r) for r in history(base, "D")] == [("INITIAL", "FULL", "SUCCEEDED", None, 2, 0)]
    shown = base.sql("SHOW DYNAMIC TABLES").collect()
    assert [(r.name, r.target_lag, r.scheduling_state, r.refresh_mode) for r in shown] == [
        ("D", "1 minute", "ACTIVE", "ADAPTIVE")
    ]
    assert shown[0].data_timestamp is not None
    described = base.sql("DESCRIBE DYNAMIC TABLE D").collect()
    assert [(r.name, r.type) for r in described] == [
        ("ID", "NUMBER(38,0)"),
        ("U", "VARCHAR(16777216)"),
    ]
    kinds = {r.name: r.kind for r in base.sql("SHOW TABLES").collect()}
    assert kinds == {"T": "TABLE", "D": "DYNAMIC TABLE"}
    # A stream on it, a view over it, a DML source: read like a table.
    base.sql("CREATE STREAM S ON TABLE D")
    base.sql("CREATE VIEW VD AS SELECT ID FROM D")
    base.sql("CREATE TABLE COPY AS SELECT * FROM VD")
    assert ints(base, "SELECT * FROM COPY") == [(2,), (3,)]


def test_a_refresh_without_source_changes_is_no_data_and_writes_no_commit(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    uri = base.require_table("D").uri
    before = DeltaTable(uri).version()
    stamp = base.catalog.get_dynamic_table(base.require_table("D").id).data_timestamp_us
    assert "NO_DATA" in base.sql("ALTER DYNAMIC TABLE D REFRESH").collect()[0].status
    assert DeltaTable(uri).version() == before
    dt = base.catalog.get_dynamic_table(base.require_table("D").id)
    assert dt.data_timestamp_us > stamp  # the data timestamp moves on
    assert [r.REFRESH_ACTION for r in history(base, "D")] == ["NO_DATA", "FULL"]


@pytest.mark.parametrize("mode", ["AUTO", "FULL"])
def test_a_refresh_writes_only_the_difference(base, mode):
    """INCREMENTAL (AUTO on a stateless query: ADAPTIVE, and the change is small) and FULL
    (the difference by value) write only what changed: a stream on the table sees only
    real changes."""
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = {mode} AS "
             "SELECT ID, V FROM T")  # fmt: skip
    base.sql("CREATE STREAM S ON TABLE D")
    base.sql("UPDATE T SET V = 'z' WHERE ID = 3")
    base.sql("DELETE FROM T WHERE ID = 1")
    base.sql("INSERT INTO T VALUES (4, 'd')")
    message = base.sql("ALTER DYNAMIC TABLE D REFRESH").collect()[0].status
    # FULL matches rows by value (its row ids come from its own sequence): an update is a
    # delete and an insert; INCREMENTAL keeps the row's id.
    action = "INCREMENTAL" if mode == "AUTO" else "FULL"
    counts = (
        "1 inserted, 1 deleted, 1 updated" if mode == "AUTO" else "2 inserted, 2 deleted, 0 updated"
    )
    assert f"{action} ({counts})" in message, message
    shown = base.sql("SHOW DYNAMIC TABLES").collect()[0]
    shown_mode = "ADAPTIVE" if mode == "AUTO" else "FULL"
    assert (shown.refresh_mode, shown.refresh_mode_reason) == (shown_mode, "")
    assert ints(base, "SELECT * FROM D") == [(2, "b"), (3, "z"), (4, "d")]
    # The stream shows the real changes only: row 2 is untouched.
    changes = ints(base, 'SELECT ID, V, "METADATA$ACTION" FROM S')
    assert changes == [
        (1, "a", "DELETE"),
        (3, "c", "DELETE"),
        (3, "z", "INSERT"),
        (4, "d", "INSERT"),
    ]


def test_a_full_only_query_is_diffed_by_value_counting_duplicates_and_nulls(base):
    base.sql("INSERT INTO T VALUES (NULL, NULL), (NULL, NULL), (2, 'b')")
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM REFRESH_MODE = FULL AS "
             "SELECT ID, V, count(*) OVER (PARTITION BY ID) AS K FROM T")  # fmt: skip
    base.sql("CREATE STREAM S ON TABLE D")  # a follower: the refresh is a difference
    shown = base.sql("SHOW DYNAMIC TABLES").collect()[0]
    assert (shown.refresh_mode, shown.refresh_mode_reason) == ("FULL", "WINDOW")
    assert len(base.sql("SELECT * FROM D").collect()) == 6
    base.sql("DELETE FROM T WHERE ID = 2")  # both copies of (2, 'b')
    base.sql("INSERT INTO T VALUES (NULL, NULL)")
    # The NULL rows' count goes from 2 to 3: those rows out and in again; (2, 'b') x2 out.
    status = base.sql("ALTER DYNAMIC TABLE D REFRESH").collect()[0].status
    assert "FULL (3 inserted, 4 deleted, 0 updated)" in status, status
    assert ints(base, "SELECT count(*) FROM D WHERE ID IS NULL") == [(3,)]
    assert ints(base, "SELECT count(*) FROM D") == [(5,)]


def test_a_star_the_rewrite_cannot_carry_is_refreshed_by_the_engine(base):
    """``struct(*)`` over the changes would take the hidden columns too, so the text
    rewrite cannot carry it; the query-delta engine reads Spark's plan, where the star
    is the source's columns, and refreshes it INCREMENTALly, equal to the query."""
    query = "SELECT ID, to_json(struct(*)) AS J FROM T WHERE ID > 1"
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL "
             f"AS {query}")  # fmt: skip
    shown = base.sql("SHOW DYNAMIC TABLES").collect()[0]
    assert (shown.refresh_mode, shown.refresh_mode_reason) == ("INCREMENTAL", "")
    base.sql("UPDATE T SET V = 'z' WHERE ID = 3")
    base.sql("INSERT INTO T VALUES (4, 'd')")
    assert "INCREMENTAL" in base.sql("ALTER DYNAMIC TABLE D REFRESH").collect()[0].status
    assert sorted(map(tuple, base.sql("SELECT * FROM D").collect())) == sorted(
        map(tuple, base.sql(query).collect()))


def test_dml_and_ddl_that_would_write_a_dynamic_table_are_refused(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    version = DeltaTable(base.require_table("D").uri).version()
    for statement in (
        "INSERT INTO D VALUES (9)", "UPDATE D SET ID = 0", "DELETE FROM D",
        "MERGE INTO D USING T ON D.ID = T.ID WHEN MATCHED THEN DELETE", "TRUNCATE TABLE D",
        "DROP TABLE D", "CREATE OR REPLACE TABLE D (X INT)",
        "CREATE OR REPLACE TABLE D AS SELECT 1 AS X", "ALTER TABLE D RENAME TO E",
    ):  # fmt: skip
        with pytest.raises(SqlError) as refused:
            base.sql(statement)
        assert refused.value.code == "DYNAMIC_TABLE_READ_ONLY", statement
        assert "only its refreshes write it" in str(refused.value)
    assert DeltaTable(base.require_table("D").uri).version() == version
    assert ints(base, "SELECT * FROM D") == [(1,), (2,), (3,)]


def tables_and_folders(session):
    return (
        {t.full_name for t in session.catalog.list_tables()},
        set(session.warehouse.rglob("_delta_log")),
    )


@pytest.mark.parametrize(
    ("statement", "code", "words"),
    [
        ("CREATE DYNAMIC TABLE X AS SELECT * FROM T", "SQL_COMPILATION_ERROR", "TARGET_LAG"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '0 seconds' AS SELECT * FROM T",
         "SQL_COMPILATION_ERROR", "out of range"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = 'soon' AS SELECT * FROM T",
         "SQL_COMPILATION_ERROR", "not valid"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' REFRESH_MODE = FAST AS SELECT * FROM T",
         "SQL_COMPILATION_ERROR", "REFRESH_MODE must be one of"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' COLOR = red AS SELECT * FROM T",
         "SQL_COMPILATION_ERROR", "unknown dynamic table option"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' TARGET_LAG = '2 minutes' AS SELECT 1",
         "SQL_COMPILATION_ERROR", "given twice"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM NOPE",
         "OBJECT_NOT_FOUND", "NOPE"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT 1 AS A",
         "SQL_COMPILATION_ERROR", "at least one table"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM S",
         "SQL_COMPILATION_ERROR", "cannot read a stream"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM T AT(VERSION => 1)",
         "SQL_COMPILATION_ERROR", "time travel"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL AS "
         "SELECT ID, count(*) OVER () AS N FROM T", "DYNAMIC_TABLE_NOT_INCREMENTAL",
         "WINDOW_WITHOUT_PARTITION_BY"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL_STRICT AS "
         "SELECT ID FROM T ORDER BY ID", "DYNAMIC_TABLE_NOT_INCREMENTAL", "ORDER_BY"),
        ("CREATE DYNAMIC TABLE T TARGET_LAG = '1 minute' AS SELECT 1 AS A FROM T",
         "OBJECT_ALREADY_EXISTS", "is a table"),
        ("CREATE DYNAMIC TABLE S TARGET_LAG = '1 minute' AS SELECT 1 AS A FROM T",
         "OBJECT_ALREADY_EXISTS", "stream"),
        ("CREATE OR REPLACE DYNAMIC TABLE IF NOT EXISTS X TARGET_LAG = '1 minute' AS "
         "SELECT * FROM T", "SQL_COMPILATION_ERROR", "cannot be used together"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT 1 / (ID - 1) AS Q FROM T",
         "DYNAMIC_TABLE_REFRESH_FAILED", "DIVIDE_BY_ZERO"),
        ("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT map(ID, V) AS M FROM T",
         "UNSUPPORTED_TYPE", "no table column stores"),
    ],
)  # fmt: skip
def test_bad_definitions_are_refused_and_leave_nothing(base, statement, code, words):
    base.sql("CREATE STREAM S ON TABLE T")
    assert_refused(base, statement, code, words, collect=False, unchanged=tables_and_folders)
    assert base.catalog.list_dynamic_tables() == []


def test_graph_rules_lag_and_cycles(base):
    base.sql("CREATE DYNAMIC TABLE B TARGET_LAG = '5 minutes' AS SELECT ID, V FROM T")
    base.sql("CREATE DYNAMIC TABLE C TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    with pytest.raises(SqlError, match="set TARGET_LAG to at least 5 minutes") as refused:
        base.sql("CREATE DYNAMIC TABLE A TARGET_LAG = '4 minutes' REFRESH_MODE = FULL AS "
                 "SELECT B.ID FROM B JOIN C ON B.ID = C.ID")  # fmt: skip
    assert refused.value.code == "DYNAMIC_TABLE_GRAPH"
    base.sql("CREATE DYNAMIC TABLE A TARGET_LAG = '5 minutes' REFRESH_MODE = FULL AS "
             "SELECT B.ID FROM B JOIN C ON B.ID = C.ID")  # fmt: skip
    assert ints(base, "SELECT * FROM A") == [(1,), (2,), (3,)]
    with pytest.raises(SqlError, match="at least 5 minutes"):
        base.sql("ALTER DYNAMIC TABLE A SET TARGET_LAG = '1 minute'")
    with pytest.raises(SqlError, match="A's target lag 5 minutes is shorter than 10 minutes"):
        base.sql("ALTER DYNAMIC TABLE B SET TARGET_LAG = '10 minutes'")  # slower than A
    base.sql("ALTER DYNAMIC TABLE A SET TARGET_LAG = DOWNSTREAM")
    shown = {r.name: r.target_lag for r in base.sql("SHOW DYNAMIC TABLES").collect()}
    assert shown == {"A": "DOWNSTREAM", "B": "5 minutes", "C": "1 minute"}
    with pytest.raises(SqlError, match="read itself") as cycle:
        base.sql("CREATE OR REPLACE DYNAMIC TABLE B TARGET_LAG = '5 minutes' AS "
                 "SELECT ID, V FROM B")  # fmt: skip
    assert cycle.value.code == "DYNAMIC_TABLE_GRAPH"


def test_a_manual_refresh_refreshes_upstream_for_the_same_data_timestamp(base):
    base.sql("CREATE DYNAMIC TABLE B TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T WHERE ID > 1")
    base.sql("CREATE DYNAMIC TABLE A TARGET_LAG = '1 minute' AS SELECT ID * 10 AS X FROM B")
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.sql("ALTER DYNAMIC TABLE A REFRESH")
    assert ints(base, "SELECT * FROM A") == [(20,), (30,), (50,)]
    stamps = {dt.table_id: dt.data_timestamp_us for dt in base.catalog.list_dynamic_tables()}
    assert len(set(stamps.values())) == 1  # one snapshot
    assert next(tuple(r)[:3] for r in history(base, "B")) == ("MANUAL", "INCREMENTAL", "SUCCEEDED")


def test_on_schedule_tables_are_unreadable_until_their_first_refresh(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' INITIALIZE = ON_SCHEDULE AS "
             "SELECT ID FROM T")  # fmt: skip
    with pytest.raises(SqlError, match="not initialized") as refused:
        base.sql("SELECT * FROM D")
    assert refused.value.code == "DYNAMIC_TABLE_NOT_INITIALIZED"
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert ints(base, "SELECT * FROM D") == [(1,), (2,), (3,)]
    assert [r.REFRESH_TRIGGER for r in history(base, "D")] == ["INITIAL"]


def test_a_changed_source_fails_the_refresh_until_replaced(base):
    base.sql("CREATE VIEW V1 AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM V1")
    base.sql("CREATE OR REPLACE VIEW V1 AS SELECT ID + 1 AS ID FROM T")
    with pytest.raises(SqlError, match="VIEW_REPLACED"):
        base.sql("ALTER DYNAMIC TABLE D REFRESH")
    base.sql("CREATE OR REPLACE TABLE T (ID NUMBER)")
    base.sql("CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    assert ints(base, "SELECT * FROM D") == []
    base.sql("CREATE OR REPLACE VIEW V1 AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE E TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    base.sql("DROP TABLE T")
    with pytest.raises(SqlError, match="SOURCE_DROPPED") as failed:
        base.sql("ALTER DYNAMIC TABLE E REFRESH")
    assert "CREATE OR REPLACE DYNAMIC TABLE" in str(failed.value)
    codes = [r.STATE_CODE for r in history(base, "E")]
    assert codes[0] == "SOURCE_DROPPED"


def test_create_or_replace_keeps_the_old_table_when_the_new_one_fails(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    old = base.require_table("D")
    with pytest.raises(SqlError, match="DIVIDE_BY_ZERO"):
        base.sql("CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS "
                 "SELECT 1 / (ID - 1) AS Q FROM T")  # fmt: skip
    assert base.require_table("D").id == old.id
    assert ints(base, "SELECT * FROM D") == [(1,), (2,), (3,)]
    assert [t.name for t in base.catalog.list_tables()].count("D") == 1
    assert not any("$" in t.name for t in base.catalog.list_tables())
    base.sql(
        "CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '2 minutes' AS SELECT ID * 2 AS Y FROM T"
    )
    assert ints(base, "SELECT * FROM D") == [(2,), (4,), (6,)]
    assert not DeltaTable.is_deltatable(old.uri)


def test_suspend_resume_drop_and_if_exists(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    base.sql("ALTER DYNAMIC TABLE D SUSPEND")
    assert base.sql("SHOW DYNAMIC TABLES").collect()[0].scheduling_state == "SUSPENDED"
    base.sql("ALTER DYNAMIC TABLE D RESUME")
    assert base.sql("SHOW DYNAMIC TABLES LIKE 'D'").collect()[0].scheduling_state == "ACTIVE"
    with pytest.raises(SqlError, match="a table, not a dynamic table"):
        base.sql("DROP DYNAMIC TABLE T")
    with pytest.raises(SqlError, match="does not exist"):
        base.sql("ALTER DYNAMIC TABLE NOPE REFRESH")
    uri = base.require_table("D").uri
    assert "successfully dropped" in base.sql("DROP DYNAMIC TABLE D").collect()[0].status
    assert not DeltaTable.is_deltatable(uri)
    assert base.catalog.list_dynamic_tables() == []
    assert base.catalog.list_refreshes() == []
    assert "did not exist" in base.sql("DROP DYNAMIC TABLE IF EXISTS D").collect()[0].status


def test_the_history_function_filters_and_refuses_bad_arguments(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE E TARGET_LAG = '1 minute' AS SELECT 10 / ID AS Q FROM T")
    base.sql("INSERT INTO T VALUES (0, 'zero')")
    with pytest.raises(SqlError):
        base.sql("ALTER DYNAMIC TABLE E REFRESH")
    every = base.sql("SELECT QUALIFIED_NAME, STATE FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY())")
    assert sorted(tuple(r) for r in every.collect()) == [
        ("DB.PUBLIC.D", "SUCCEEDED"),
        ("DB.PUBLIC.E", "FAILED"),
        ("DB.PUBLIC.E", "SUCCEEDED"),
    ]
    failed = base.sql("SELECT NAME, STATE_CODE, STATE_MESSAGE FROM "
                      "TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(ERROR_ONLY => TRUE))").collect()  # fmt: skip
    assert [(r.NAME, r.STATE_CODE) for r in failed] == [("E", "SQL_EXECUTION_ERROR")]
    assert "DIVIDE_BY_ZERO" in failed[0].STATE_MESSAGE
    limited = base.sql("SELECT * FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(RESULT_LIMIT => 1))")
    assert limited.count() == 1
    for bad in ("NAME => 'NOPE'", "NAME => 'T'", "FOO => 1", "'D'", "RESULT_LIMIT => 0",
                "ERROR_ONLY => 'yes'", "NAME => 1", "NAME => 'a b c'"):  # fmt: skip
        with pytest.raises(SqlError):
            base.sql(f"SELECT * FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY({bad}))")


def test_the_history_function_answers_as_snowflake_qualifies_it(base):
    """``INFORMATION_SCHEMA.`` before the function, as Snowflake writes it; a database
    before that keeps the rows to that database's tables (NAME is read in it)."""
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    base.sql("CREATE DATABASE OTHER")  # and uses it, as Snowflake's does
    base.sql("USE DATABASE DB")
    base.sql("CREATE DYNAMIC TABLE OTHER.PUBLIC.D TARGET_LAG = '1 minute' AS SELECT ID FROM "
             "DB.PUBLIC.T")  # fmt: skip

    def names(call: str) -> list[str]:
        found = base.sql(f"SELECT QUALIFIED_NAME FROM TABLE({call})").collect()
        return sorted(r.QUALIFIED_NAME for r in found)

    every = ["DB.PUBLIC.D", "OTHER.PUBLIC.D"]
    assert names("DYNAMIC_TABLE_REFRESH_HISTORY()") == every
    assert names("information_schema.dynamic_table_refresh_history()") == every
    assert names("INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY(NAME => 'D')") == [
        "DB.PUBLIC.D"]  # fmt: skip
    assert names("OTHER.INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY()") == [
        "OTHER.PUBLIC.D"]  # fmt: skip
    assert names("other.INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY(NAME => 'D')") == [
        "OTHER.PUBLIC.D"]  # fmt: skip
    assert names("DB.INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY("
                 "NAME_PREFIX => 'OTHER')") == ["OTHER.PUBLIC.D"]  # fmt: skip
    # Any other qualifier is not ours: Spark's refusal of a qualified function stands.
    for other in ("PUBLIC.DYNAMIC_TABLE_REFRESH_HISTORY()",
                  '"information_schema".DYNAMIC_TABLE_REFRESH_HISTORY()',
                  "A.B.INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY()"):  # fmt: skip
        with pytest.raises(SqlError):
            base.sql(f"SELECT * FROM TABLE({other})")


def test_the_graph_function_describes_each_table_and_its_inputs(base):
    base.sql("CREATE VIEW W AS SELECT ID, V FROM T WHERE ID > 1")
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    base.sql("CREATE DYNAMIC TABLE E TARGET_LAG = DOWNSTREAM REFRESH_MODE = FULL "
             "AS SELECT D.ID, W.V FROM D JOIN W ON D.ID = W.ID")  # fmt: skip
    base.sql("ALTER DYNAMIC TABLE D SUSPEND")
    found = base.sql("SELECT * FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLE_GRAPH_HISTORY()) "
                     "ORDER BY QUALIFIED_NAME").collect()  # fmt: skip
    d, e = found
    assert (d.NAME, d.SCHEMA_NAME, d.DATABASE_NAME, d.QUALIFIED_NAME) == (
        "D", "PUBLIC", "DB", "DB.PUBLIC.D")  # fmt: skip
    assert [tuple(i) for i in d.INPUTS] == [("DB.PUBLIC.T", "TABLE")]
    # Everything its refreshes read: the view, and the table the view reads.
    assert sorted(tuple(i) for i in e.INPUTS) == [
        ("DB.PUBLIC.D", "DYNAMIC_TABLE"), ("DB.PUBLIC.T", "TABLE"), ("DB.PUBLIC.W", "VIEW")]
    assert (d.TARGET_LAG_TYPE, d.TARGET_LAG_SEC, e.TARGET_LAG_TYPE, e.TARGET_LAG_SEC) == (
        "USER_DEFINED", 60, "DOWNSTREAM", None)  # fmt: skip
    assert d.QUERY_TEXT == "SELECT ID FROM T" and d.VALID_TO is None
    assert d.SCHEDULING_STATE.state == "SUSPENDED" and e.SCHEDULING_STATE.state == "ACTIVE"
    assert (d.REFRESH_MODE, e.REFRESH_MODE) == ("ADAPTIVE", "FULL")
    # The refresh history joins on QUALIFIED_NAME, as in Snowflake.
    joined = base.sql(
        "SELECT g.QUALIFIED_NAME, count(*) AS N FROM TABLE(DYNAMIC_TABLE_GRAPH_HISTORY()) g "
        "JOIN TABLE(DYNAMIC_TABLE_REFRESH_HISTORY()) h ON g.QUALIFIED_NAME = h.QUALIFIED_NAME "
        "GROUP BY g.QUALIFIED_NAME").collect()
    counted = base.sql("SELECT QUALIFIED_NAME, count(*) AS N FROM "
                       "TABLE(DYNAMIC_TABLE_REFRESH_HISTORY()) GROUP BY QUALIFIED_NAME").collect()
    assert sorted(tuple(r) for r in joined) == sorted(tuple(r) for r in counted)
    assert {r[0] for r in joined} == {"DB.PUBLIC.D", "DB.PUBLIC.E"}
    for argument in ("AS_OF => CURRENT_TIMESTAMP()", "HISTORY_START => '2026-01-01'", "1"):
        with pytest.raises(SqlError, match="DYNAMIC_TABLE_GRAPH_HISTORY"):
            base.sql(f"SELECT * FROM TABLE(DYNAMIC_TABLE_GRAPH_HISTORY({argument}))")


def test_a_refresh_of_a_dropped_definition_changes_nothing(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    base.sql("INSERT INTO T VALUES (7, 'g')")
    # Another session replaced the table in between: this refresh's claim is stale.
    from pipelines.dynamic_tables.refresh import MANUAL, refresh

    dt_id = base.require_table("D").id
    base.sql("CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    with pytest.raises(SqlError):
        refresh(base, dt_id, MANUAL)
    assert ints(base, "SELECT * FROM D") == [(1,), (2,), (3,), (7,)]


def test_no_data_runs_no_spark_job_and_history_names_the_refresh(base):
    from pipelines.dynamic_tables.refresh import MANUAL, refresh

    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T WHERE ID > 1")
    table_id = base.require_table("D").id
    tracker = base.spark.sparkContext.statusTracker()
    base.spark.sparkContext.setJobGroup("dt-no-data", "NO_DATA refreshes")
    try:
        for _ in range(3):
            assert refresh(base, table_id, MANUAL).action == "NO_DATA"
        base.spark.sparkContext.setJobGroup("dt-control", "a job, to show one would be seen")
        base.spark.range(3).count()
    finally:
        base.spark.sparkContext.setJobGroup("other", "after")
    assert tracker.getJobIdsForGroup("dt-no-data") == []
    assert tracker.getJobIdsForGroup("dt-control") != []
    base.sql("INSERT INTO T VALUES (9, 'i')")
    assert refresh(base, table_id, MANUAL).action == "INCREMENTAL"
    sources = [r.source for r in base.sql("DESCRIBE HISTORY D").collect()]
    assert sources.count("DYNAMIC_TABLE") == 2  # the initial refresh and this one
