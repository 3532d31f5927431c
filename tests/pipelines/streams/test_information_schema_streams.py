"""``<db>.INFORMATION_SCHEMA.STREAMS``: our view of the streams (Snowflake's
INFORMATION_SCHEMA has none; its columns are those of SHOW STREAMS, the stream's own
three named as the ACCOUNT_USAGE view names them), read like a table."""

from __future__ import annotations

import pytest

from pipelines import Session
from pipelines.errors import ObjectNotFoundError
from tests.pipelines.refusals import assert_refused


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    made = Session(tmp_path_factory.mktemp("information_schema_streams") / "warehouse",
                   spark=spark)  # fmt: skip
    made.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    made.sql("CREATE TABLE GONE (ID NUMBER)")
    made.sql("CREATE STREAM S ON TABLE T APPEND_ONLY = TRUE COMMENT = 'new rows'")
    made.sql("CREATE VIEW W AS SELECT ID FROM T WHERE ID > 0")
    made.sql("CREATE STREAM SV ON VIEW W")
    made.sql('CREATE STREAM "on gone" ON TABLE GONE')
    made.sql("DROP TABLE GONE")
    made.sql("CREATE DATABASE OTHER")  # and uses it
    made.sql("CREATE STREAM OS ON TABLE DB.PUBLIC.T")
    made.sql("USE SCHEMA DB.PUBLIC")
    yield made
    made.close()


def rows(session, query):
    return [tuple(r) for r in session.sql(query).collect()]


def test_each_stream_of_the_database_is_a_row_as_show_streams_says(session):
    found = session.sql("SELECT * FROM INFORMATION_SCHEMA.STREAMS").collect()
    assert [r.STREAM_NAME for r in found] == ["S", "SV", "on gone"]
    shown = {r.name: r for r in session.sql("SHOW STREAMS IN DATABASE DB").collect()}
    for row in found:
        said = shown[row.STREAM_NAME]
        assert (said.database_name, said.schema_name) == (row.STREAM_CATALOG, row.STREAM_SCHEMA)
        assert (said.table_name, said.source_type, said.base_tables, said.type, said.mode) == (
            row.TABLE_NAME, row.SOURCE_TYPE, row.BASE_TABLES, row.TYPE, row.MODE)
        assert (said.stale, said.stale_after, said.created_on) == (
            row.STALE, row.STALE_AFTER, row.CREATED)  # fmt: skip
        assert (said.comment or None) == row.COMMENT
    s, sv, gone = found
    assert (s.TABLE_NAME, s.SOURCE_TYPE, s.MODE, s.COMMENT, s.STALE) == (
        "DB.PUBLIC.T", "TABLE", "APPEND_ONLY", "new rows", False)  # fmt: skip
    assert (sv.TABLE_NAME, sv.SOURCE_TYPE, sv.BASE_TABLES, sv.MODE) == (
        "DB.PUBLIC.W", "VIEW", "DB.PUBLIC.T", "DEFAULT")  # fmt: skip
    assert (gone.TABLE_NAME, gone.STALE) == (None, True)  # its table was dropped


def test_the_database_qualifier_keeps_to_its_streams(session):
    assert rows(session, "SELECT STREAM_CATALOG, STREAM_NAME, TABLE_NAME FROM "
                         "other.information_schema.streams") == [
        ("OTHER", "OS", "DB.PUBLIC.T")]  # a stream of OTHER on a table of DB  # fmt: skip
    assert rows(session, "SELECT STREAM_NAME FROM INFORMATION_SCHEMA.STREAMS WHERE MODE = "
                         "'APPEND_ONLY'") == [("S",)]  # fmt: skip
    assert_refused(session, "SELECT * FROM NOPE.INFORMATION_SCHEMA.STREAMS", "OBJECT_NOT_FOUND",
                   "NOPE", kind=ObjectNotFoundError)


def test_reading_the_view_consumes_nothing(session):
    session.sql("INSERT INTO T VALUES (1, 'a')")
    before = rows(session, "SHOW STREAMS LIKE 'S'")
    joined = rows(session, "SELECT s.STREAM_NAME, count(t.ID) AS N FROM INFORMATION_SCHEMA.STREAMS s "
                           "JOIN T t ON s.TABLE_NAME = 'DB.PUBLIC.T' GROUP BY s.STREAM_NAME")
    assert joined == [("S", 1)]
    assert rows(session, "SHOW STREAMS LIKE 'S'") == before
    assert session.sql("SELECT SYSTEM$STREAM_HAS_DATA('S')").first()[0] is True


@pytest.mark.parametrize("statement", [
    "INSERT INTO INFORMATION_SCHEMA.STREAMS (STREAM_NAME) VALUES ('X')",
    "DELETE FROM INFORMATION_SCHEMA.STREAMS",
])  # fmt: skip
def test_the_view_is_read_only(session, statement):
    error = assert_refused(session, statement, "SQL_COMPILATION_ERROR", "read-only")
    assert "INFORMATION_SCHEMA" in str(error)


def test_what_follows_table_versions_cannot_read_it(session):
    assert_refused(session, "CREATE DYNAMIC TABLE DS TARGET_LAG = '1 minute' AS SELECT T.ID, "
                   "s.STREAM_NAME FROM T, INFORMATION_SCHEMA.STREAMS s", "SQL_COMPILATION_ERROR",
                   "cannot read INFORMATION_SCHEMA.STREAMS")  # fmt: skip
    assert rows(session, "SHOW DYNAMIC TABLES LIKE 'DS'") == []
    session.sql("CREATE VIEW VS AS SELECT * FROM INFORMATION_SCHEMA.STREAMS")
    try:
        assert_refused(session, "CREATE STREAM SVS ON VIEW VS", "SQL_COMPILATION_ERROR",
                       "INFORMATION_SCHEMA.STREAMS")
    finally:
        session.sql("DROP VIEW VS")
