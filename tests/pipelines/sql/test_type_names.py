"""``VARCHAR`` without a length, as Snowflake users write it, is Spark's STRING; only
where Spark reads a type (its parser says where), never a name or a string."""

from __future__ import annotations

import pytest

from pipelines import SqlError


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    from pipelines import Session

    made = Session(tmp_path_factory.mktemp("type_names") / "warehouse", spark=spark)
    made.sql('CREATE TABLE T (ID NUMBER, "varchar" VARCHAR(5))')
    made.sql("INSERT INTO T VALUES (1, 'a'), (22, 'bb')")
    yield made
    made.close()


def test_a_cast_to_varchar_without_a_length_is_a_string(session):
    row = session.sql("SELECT CAST(12 AS VARCHAR) AS S, 3::varchar AS T, "
                      "TRY_CAST(4.5 AS VarChar) AS U").collect()[0]  # fmt: skip
    assert tuple(row) == ("12", "3", "4.5")
    assert [f.dataType.simpleString() for f in session.sql(
        "SELECT CAST(12 AS VARCHAR) AS S").schema.fields] == ["string"]  # fmt: skip


def test_names_and_strings_that_say_varchar_are_left_alone(session):
    """The same statement holds the type, a column and an alias named varchar, and the
    word in a string, after a character outside the BMP (which UTF-16 counts twice)."""
    row = session.sql("SELECT '🙂 VARCHAR' AS varchar, \"varchar\", "
                      "CAST(ID AS VARCHAR) AS S FROM T WHERE ID = 22").collect()[0]  # fmt: skip
    assert tuple(row) == ("🙂 VARCHAR", "bb", "22")
    assert session.sql("SELECT 1 AS varchar").columns == ["VARCHAR"]


def test_a_dynamic_table_and_dml_read_it_too(session):
    session.sql("CREATE TABLE S (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO S SELECT ID, ID::VARCHAR FROM T")
    session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS "
                "SELECT ID, CAST(ID * 2 AS VARCHAR) AS V2 FROM S")  # fmt: skip
    session.sql("INSERT INTO S VALUES (3, '3')")
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert sorted(tuple(r) for r in session.sql("SELECT * FROM D").collect()) == [
        (1, "2"), (3, "6"), (22, "44")]


def test_char_without_a_length_and_other_parse_errors_stay_spark_errors(session):
    with pytest.raises(SqlError, match="CHAR"):
        session.sql("SELECT CAST(1 AS CHAR) AS C")
    with pytest.raises(SqlError, match="PARSE_SYNTAX_ERROR"):
        session.sql("SELECT CAST(1 AS VARCHAR FROM T")


def test_past_the_reparse_limit_spark_error_stands(session):
    """VARCHARs the scan cannot place (here after an expression with a call) cost a parse
    each: past MAX_REPARSES the statement gets Spark's error, which names the fix."""
    from pipelines.sql.type_names import MAX_REPARSES

    casts = ", ".join(f"CAST(abs({i}) AS VARCHAR) AS C{i}" for i in range(MAX_REPARSES + 1))
    with pytest.raises(SqlError, match="DATATYPE_MISSING_SIZE"):
        session.sql(f"SELECT {casts}")
    fewer = ", ".join(f"CAST(abs({i}) AS VARCHAR) AS C{i}" for i in range(MAX_REPARSES - 1))
    assert session.sql(f"SELECT {fewer}").collect()[0][0] == "0"
