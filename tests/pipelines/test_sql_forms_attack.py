"""Attack of the SQL forms Snowflake users type: VARCHAR without a length, the TABLE(...)
forms of our functions and views, DYNAMIC_TABLES(), the STREAMS view and the dynamic table header
whose closing quote ends a word.

Strict xfails are defects found (each says what is observed and what should happen);
the plain tests guard forms that hold and that a change could plausibly break.
"""

from __future__ import annotations

import pytest

from pipelines import SqlError
from pipelines.sql.type_names import parse_plan_text


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    from pipelines import Session

    made = Session(tmp_path_factory.mktemp("attack_today") / "warehouse", spark=spark)
    made.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    made.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    yield made
    made.close()


# --- VARCHAR without a length ------------------------------------------------------


class _CountingParser:
    """Stands for the JVM session in ``parse_plan_text``: counts Spark's parses."""

    def __init__(self, jspark):
        self.real = jspark.sessionState().sqlParser()
        self.calls = 0

    def sessionState(self):  # (the JVM object's names)
        return self

    def sqlParser(self):
        return self

    def parsePlan(self, text):
        self.calls += 1
        return self.real.parsePlan(text)


def test_varchar_types_are_found_in_a_bounded_number_of_parses(spark):
    """Every VARCHAR without a length should be made STRING in a few parses (the parser
    names one position per error, but the text can be scanned for the others), not one
    parse of the whole statement per occurrence."""
    text = "SELECT " + ", ".join(f"CAST({i} AS VARCHAR) AS C{i}" for i in range(25))
    counting = _CountingParser(spark._jsparkSession)
    _, parsed = parse_plan_text(counting, text)
    assert "VARCHAR" not in parsed.upper()
    assert counting.calls <= 3, counting.calls


def test_varchar_in_nested_types_comments_and_names(session):
    row = session.sql(
        "WITH varchar AS (SELECT 1 AS X) /* CAST(x AS VARCHAR) */ "
        "SELECT CAST(named_struct('a', X) AS STRUCT<a: VARCHAR>) AS S, "
        "CAST(array(X, 2) AS ARRAY<VARCHAR>) AS A, "
        "CAST(map(X, 2) AS MAP<VARCHAR, VARCHAR>) AS M, "
        "CAST(X AS /* c */ VARCHAR) AS C, X::VARCHAR::VARCHAR AS D, "
        "'🙂 VARCHAR' || CAST(X AS VARCHAR) AS `varchar` FROM varchar -- VARCHAR"
    ).collect()[0]
    assert row.S.a == "1" and row.A == ["1", "2"] and row.M == {"1": "2"}
    assert (row.C, row.D, row.varchar) == ("1", "1", "🙂 VARCHAR1")


def test_varchar_in_a_view_its_stream_and_its_stored_text(session):
    session.sql("CREATE TABLE TV (ID NUMBER, V VARCHAR)")
    session.sql("CREATE VIEW VV AS SELECT ID, CAST(ID * 2 AS VARCHAR) AS S FROM TV")
    session.sql("CREATE STREAM SV ON VIEW VV")
    session.sql("INSERT INTO TV VALUES (7, 'x')")
    assert [(r.S, r["METADATA$ACTION"]) for r in session.sql("SELECT * FROM SV").collect()] == [
        ("14", "INSERT")
    ]
    # The view's text is kept as written: the STRING made for Spark is not shown back.
    (view,) = [r for r in session.sql("SHOW VIEWS").collect() if r.name == "VV"]
    assert view.text == "SELECT ID, CAST(ID * 2 AS VARCHAR) AS S FROM TV"


def test_varchar_in_dml_and_a_create_table_as_select(session):
    session.sql("CREATE TABLE TD AS SELECT ID, CAST(ID AS VARCHAR) AS S FROM T")
    kinds = {r.name: r.type for r in session.sql("DESCRIBE TABLE TD").collect()}
    assert kinds["S"] == "VARCHAR(16777216)"
    session.sql("UPDATE TD SET S = (ID * 10)::VARCHAR WHERE ID = 1")
    session.sql("MERGE INTO TD USING (SELECT 2 AS ID) X ON TD.ID = X.ID "
                "WHEN MATCHED THEN UPDATE SET S = CAST(X.ID + 5 AS VARCHAR)")  # fmt: skip
    assert sorted(tuple(r) for r in session.sql("SELECT ID, S FROM TD").collect()) == [
        (1, "10"), (2, "7")]  # fmt: skip


# --- TABLE(...) forms ----------------------------------------------------------------


def test_table_function_with_comments_and_case_between_its_tokens(session):
    session.sql("CREATE DYNAMIC TABLE DT1 TARGET_LAG='1 minute'AS SELECT ID FROM T")
    for text in (
        "SELECT QUALIFIED_NAME FROM TABLE( information_schema . dynamic_tables ( ) )",
        "SELECT QUALIFIED_NAME FROM TABLE(/*x*/INFORMATION_SCHEMA/*y*/./*z*/DYNAMIC_TABLES(/*w*/))",
        'SELECT QUALIFIED_NAME FROM TABLE(DB."INFORMATION_SCHEMA"."DYNAMIC_TABLES"())',
    ):
        assert [r[0] for r in session.sql(text).collect()] == ["DB.PUBLIC.DT1"], text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("SELECT * FROM TABLE( dynamic_tables )", "write TABLE(dynamic_tables())"),
        ("SELECT * FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLE_GRAPH_HISTORY)",
         "write TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLE_GRAPH_HISTORY())"),
        ("SELECT * FROM TABLE(DB.INFORMATION_SCHEMA.STREAMS)", "is not a table function"),
    ],
)  # fmt: skip
def test_uncalled_table_forms_name_the_form_to_write(session, text, fragment):
    with pytest.raises(SqlError) as caught:
        session.sql(text)
    assert fragment in str(caught.value)


def test_the_uncalled_hint_does_not_carry_a_comment_into_the_call(session):
    with pytest.raises(SqlError) as caught:
        session.sql("SELECT * FROM TABLE(DYNAMIC_TABLES -- note\n)")
    assert "write TABLE(DYNAMIC_TABLES())" in str(caught.value)


def test_the_uncalled_hint_is_a_form_that_runs(session):
    with pytest.raises(SqlError) as caught:
        session.sql("SELECT * FROM TABLE(DB.PUBLIC.DYNAMIC_TABLES)")
    hinted = str(caught.value).split("write ", 1)[1].strip()
    session.sql(f"SELECT NAME FROM {hinted}").collect()


def test_an_unknown_information_schema_name_is_not_called_a_view(session):
    with pytest.raises(SqlError) as caught:
        session.sql("SELECT * FROM TABLE(INFORMATION_SCHEMA.NOPE)")
    assert "is a view" not in str(caught.value)


def test_a_quoted_view_name_of_information_schema_is_exact(session):
    with pytest.raises(SqlError, match="does not exist"):
        session.sql('SELECT * FROM INFORMATION_SCHEMA."streams"').collect()


# --- INFORMATION_SCHEMA views on a new warehouse ---------------------------------------


def test_streams_view_of_a_new_warehouse_is_empty(tmp_path, spark):
    """A monitoring query (docs/pipelines.md: ``... FROM INFORMATION_SCHEMA.STREAMS WHERE
    NOT STALE``) run before the first table should answer no rows, as SHOW STREAMS does,
    not fail: the default database is DB.PUBLIC."""
    from pipelines import Session

    fresh = Session(tmp_path / "warehouse", spark=spark)
    try:
        assert fresh.sql("SHOW STREAMS").collect() == []
        assert fresh.sql("SELECT * FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLES())").collect() == []
        assert fresh.sql("SELECT STREAM_NAME FROM INFORMATION_SCHEMA.STREAMS").collect() == []
    finally:
        fresh.close()


def test_refresh_data_timestamp_start_reads_snowflakes_printed_form(session):
    session.sql("SELECT NAME FROM TABLE(DYNAMIC_TABLES("
                "REFRESH_DATA_TIMESTAMP_START => '2026-12-01 10:00:00 -0800'))").collect()  # fmt: skip
    session.sql("SELECT NAME FROM TABLE(DYNAMIC_TABLES("
                "REFRESH_DATA_TIMESTAMP_START => '2026-12-01 10:00:00.000 -0800'))").collect()  # fmt: skip


# --- The dynamic table header ----------------------------------------------------------


def test_a_closing_quote_ends_the_lag_before_as_or_an_option(session):
    session.sql("CREATE DYNAMIC TABLE DQ1 TARGET_LAG='1 minute'REFRESH_MODE=FULL"
                " AS SELECT ID FROM T")  # fmt: skip
    session.sql("CREATE DYNAMIC TABLE DQ2 TARGET_LAG='1 minute'as(SELECT ID FROM T)")
    shown = {r.name: r.refresh_mode for r in session.sql("SHOW DYNAMIC TABLES").collect()}
    assert shown["DQ1"] == "FULL" and "DQ2" in shown
    with pytest.raises(SqlError, match="ASSELECT"):
        session.sql("CREATE DYNAMIC TABLE DQ3 TARGET_LAG='1 minute'ASSELECT ID FROM T")


def test_a_comment_between_the_lag_and_as_is_a_space(session):
    session.sql("CREATE DYNAMIC TABLE DC1 TARGET_LAG = '1 minute' /* hourly later */ "
                "AS SELECT ID FROM T")  # fmt: skip
    assert "DC1" in {r.name for r in session.sql("SHOW DYNAMIC TABLES").collect()}


def test_a_comment_right_after_as_is_a_space(session):
    session.sql("CREATE DYNAMIC TABLE DC2 TARGET_LAG = '1 minute' AS/* c */SELECT ID FROM T")
    assert "DC2" in {r.name for r in session.sql("SHOW DYNAMIC TABLES").collect()}


def test_a_closing_double_quote_ends_the_name(session):
    session.sql("CREATE DYNAMIC TABLE \"DQ4\"TARGET_LAG = '1 minute' AS SELECT ID FROM T")
    assert "DQ4" in {r.name for r in session.sql("SHOW DYNAMIC TABLES").collect()}
