"""Hostile dynamic-table definitions and names: reads outside the warehouse, functions
that reach the JVM, streams, time travel, smuggled statements and options, cycles,
absurd lags and names, and the history function's arguments are refused with a short
clear error and leave every table, folder and commit as it was; odd names that are
allowed (quoted, dotted, holding ``$BUILDING$``) work end to end.

Written by the adversarial review of dynamic tables (issue 19; see
``test_refresh_exactly_once``): SQL reaches only the warehouse's own objects. Among
these are regression tests of defects the review found and commit 9f00a2c fixed
('$BUILDING$' names, SHOW_INITIAL_ROWS ignored, errors blaming a view).
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from pipelines import Session, SqlError
from tests.pipelines.dynamic_tables.checks import assert_same_as_query, bag, folders


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    return session


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, spark):
    """One warehouse for the refusals (each leaves it as it was): T, a stream S on it,
    D over T, E over D, views VD (over D), VE (over E) and VW (over T)."""
    session = Session(tmp_path_factory.mktemp("hostile") / "warehouse", spark=spark)
    for statement in (
        "CREATE TABLE T (ID NUMBER, V VARCHAR)",
        "INSERT INTO T VALUES (1, 'a'), (2, 'b')",
        "CREATE STREAM S ON TABLE T",
        "CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID, V FROM T",
        "CREATE DYNAMIC TABLE E TARGET_LAG = '1 minute' AS SELECT ID FROM D",
        "CREATE VIEW VD AS SELECT ID FROM D",
        "CREATE VIEW VE AS SELECT ID FROM E",
        "CREATE VIEW VW AS SELECT ID FROM T",
    ):
        session.sql(statement)
    yield session
    session.close()


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM parquet.`/etc`",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM json.`/etc/passwd`",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS "
        "SELECT reflect('java.lang.System', 'getenv', 'HOME') AS H FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS "
        "SELECT java_method('java.lang.System', 'exit', 0) AS H FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT input_file_name() AS F FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT id FROM range(5)",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM S",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM T AT(VERSION => 1)",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM T VERSION AS OF 1",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS "
        "SELECT * FROM T CHANGES(INFORMATION => DEFAULT) AT(VERSION => 1)",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID FROM T; DROP TABLE T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute'; DROP TABLE T; AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID FROM T /* ; */ ; "
        "SELECT 1",
        "CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM VD",
        "CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM D",
        "CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM VE",
        'CREATE DYNAMIC TABLE "' + "x" * 10_000 + "\" TARGET_LAG = '1 minute' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '0 seconds' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '604801 seconds' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1.01 minutes' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '-1 minutes' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '" + "9" * 5000 + " seconds' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' REFRESH_MODE = 'FULL; DROP' AS "
        "SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID AS _INGEST_ROW_ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID, ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID FROM DB.NOPE.T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID FROM D AT(OFFSET => -1)",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT ID FROM VW UNION ALL "
        "SELECT ID FROM S",
        "CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE VW TARGET_LAG = '1 minute' AS SELECT ID FROM T",
        "CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS "
        "SELECT ID FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY())",
    ],
)  # fmt: skip
def test_hostile_definitions_are_refused_and_leave_nothing(hostile, statement):
    tables = sorted((t.id, t.full_name) for t in hostile.catalog.list_tables())
    dynamic = hostile.catalog.list_dynamic_tables()
    before = folders(hostile)
    version = DeltaTable(hostile.require_table("T").uri).version()
    with pytest.raises(SqlError) as refused:
        hostile.sql(statement)
    assert len(str(refused.value)) < 3000
    assert sorted((t.id, t.full_name) for t in hostile.catalog.list_tables()) == tables
    assert hostile.catalog.list_dynamic_tables() == dynamic
    assert folders(hostile) == before
    assert DeltaTable(hostile.require_table("T").uri).version() == version
    assert hostile.catalog.pending_commits() == []


def test_a_column_named_like_a_hidden_one_makes_the_table_full(base):
    """A result column the incremental rewrite uses itself (``_INGEST_ACTION``) cannot be
    carried by it, nor by the engine: the table is FULL, the engine's reason named (AUTO
    tried it), its rows the query's."""
    base.sql("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS "
             "SELECT ID AS \"_ingest_action\" FROM T")  # fmt: skip
    shown = base.sql("SHOW DYNAMIC TABLES LIKE 'X'").collect()[0]
    assert shown.refresh_mode == "FULL"
    assert shown.refresh_mode_reason == "RESERVED_NAME"
    assert sorted(base.sql("SELECT * FROM X").collect()) == sorted(
        base.sql('SELECT ID AS "_ingest_action" FROM T').collect()
    )


def test_an_unknown_object_in_a_definition_is_not_blamed_on_a_view(base):
    with pytest.raises(SqlError) as refused:
        base.sql("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' AS SELECT * FROM NOPE")
    assert "view DB.PUBLIC.X reads it" not in str(refused.value)


def test_the_header_cannot_smuggle_options_or_statements(base):
    """A COMMENT holding ``AS SELECT ...; DROP TABLE T`` is a comment; option keys are
    checked; the query is one statement."""
    base.sql("CREATE DYNAMIC TABLE X TARGET_LAG = '1 minute' COMMENT = 'x'' AS SELECT 1; "
             "DROP TABLE T; --' AS SELECT ID FROM T")  # fmt: skip
    shown = base.sql("SHOW DYNAMIC TABLES").collect()[0]
    assert (shown.text, shown.comment) == ("SELECT ID FROM T", "x' AS SELECT 1; DROP TABLE T; --")
    assert base.find_table("DB", "PUBLIC", "T") is not None
    for bad in ("ALTER DYNAMIC TABLE X SET TARGET_LAG = '1 minute'; DROP TABLE T",
                "ALTER DYNAMIC TABLE X SET TARGET_LAG = '0 seconds'",
                "ALTER DYNAMIC TABLE X SET TARGET_LAG = '8 days'",
                "ALTER DYNAMIC TABLE X SET TARGET_LAG = soon",
                "ALTER DYNAMIC TABLE X REFRESH; DROP TABLE T",
                "DROP DYNAMIC TABLE T",
                "ALTER DYNAMIC TABLE T SUSPEND",
                "DESCRIBE DYNAMIC TABLE T"):  # fmt: skip
        with pytest.raises(SqlError):
            base.sql(bad)
    assert base.find_table("DB", "PUBLIC", "T") is not None
    assert base.sql("SHOW DYNAMIC TABLES").collect()[0].target_lag == "1 minute"


def test_a_name_holding_building_is_refused_or_shown(base):
    try:
        base.sql(
            "CREATE DYNAMIC TABLE \"A$BUILDING$x\" TARGET_LAG = '1 minute' AS SELECT ID FROM T"
        )
    except SqlError:
        assert base.catalog.list_dynamic_tables() == []
        return
    assert [r.name for r in base.sql("SHOW DYNAMIC TABLES").collect()] == ["A$BUILDING$x"]


def test_quoted_dotted_names_work_end_to_end(base):
    base.sql('CREATE DYNAMIC TABLE "my.dt ""q""" TARGET_LAG = \'1 minute\' AS '
             'SELECT ID AS "My Col", V AS "ü.v" FROM T')  # fmt: skip
    base.sql("INSERT INTO T VALUES (5, 'e')")
    base.sql('ALTER DYNAMIC TABLE "my.dt ""q""" REFRESH')
    assert_same_as_query(base, '"my.dt ""q"""', "SELECT ID, V FROM T")
    history = base.sql("SELECT NAME, STATE FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
                       "NAME => '\"my.dt \"\"q\"\"\"'))").collect()  # fmt: skip
    assert [tuple(r) for r in history] == [('my.dt "q"', "SUCCEEDED")] * 2
    assert [r.name for r in base.sql("SHOW DYNAMIC TABLES").collect()] == ['my.dt "q"']


@pytest.mark.parametrize(
    "arguments",
    [
        "RESULT_LIMIT => 10001", "RESULT_LIMIT => 99999999999999999999999", "RESULT_LIMIT => -1",
        "RESULT_LIMIT => 1.5", "RESULT_LIMIT => '5'", "RESULT_LIMIT => NULL",
        "NAME_PREFIX => 1", "NAME_PREFIX => NULL", "NAME => 'VW'", "NAME => 'S'", "NAME => 'VD'",
        "NAME => 'T'", "NAME => '" + "A" * 10_000 + "'", "NAME => 'D; DROP TABLE T'",
        "NAME => 'D', NAME => 'D'", "ERROR_ONLY => 1", "NAME => concat('D', '')",
    ],
)  # fmt: skip
def test_the_history_function_refuses_absurd_arguments(hostile, arguments):
    with pytest.raises(SqlError):
        hostile.sql(f"SELECT * FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY({arguments}))")
    assert hostile.find_table("DB", "PUBLIC", "T") is not None


def test_the_history_function_takes_any_prefix_safely(hostile):
    names = [r.QUALIFIED_NAME for r in hostile.sql(
        "SELECT QUALIFIED_NAME FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY())").collect()]  # fmt: skip
    assert names
    for prefix in (
        "DB.PUBLIC.D",
        "DB.PUBLIC.E",
        "",
        "%",
        "' OR 1=1 --",
        "DB.PUBLIC.D" + "x" * 5000,
    ):
        found = hostile.sql("SELECT * FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(NAME_PREFIX => "
                            f"'{prefix.replace(chr(39), chr(39) * 2)}'))").count()  # fmt: skip
        assert found == sum(n.startswith(prefix) for n in names), prefix


def test_show_initial_rows_on_a_dynamic_table_is_honoured_or_refused(hostile):
    try:
        hostile.sql("CREATE OR REPLACE STREAM SI ON TABLE D SHOW_INITIAL_ROWS = TRUE")
    except SqlError:
        return
    try:
        assert bag(hostile, "SELECT ID, V FROM SI") == bag(hostile, "SELECT ID, V FROM D")
    finally:
        hostile.sql("DROP STREAM SI")
