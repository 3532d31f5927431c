"""Spanner's change stream views, ``<db>.INFORMATION_SCHEMA.CHANGE_STREAMS``,
``CHANGE_STREAM_TABLES`` and ``CHANGE_STREAM_OPTIONS``, read like tables."""

from __future__ import annotations

import pytest

from pipelines import Session, SqlError


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    made = Session(tmp_path_factory.mktemp("information_schema") / "warehouse", spark=spark)
    made.sql("CREATE TABLE ACCOUNTS (ID NUMBER, BALANCE NUMBER)")
    made.sql("CREATE TABLE ORDERS (ID NUMBER)")
    made.sql("CREATE CHANGE STREAM BALANCES FOR ACCOUNTS "
             "OPTIONS (value_capture_type = 'NEW_ROW', retention_period = '36h')")
    made.sql("CREATE CHANGE STREAM EVERYTHING FOR ALL")
    made.sql("CREATE DATABASE OTHER")  # and uses it
    made.sql("CREATE TABLE T (ID NUMBER)")
    made.sql("CREATE CHANGE STREAM ELSEWHERE FOR T")
    made.sql("USE DATABASE DB")
    yield made
    made.close()


def rows(session, query):
    return sorted(tuple(r) for r in session.sql(query).collect())


def test_the_views_list_the_streams_of_their_database(session):
    assert rows(session, "SELECT * FROM INFORMATION_SCHEMA.CHANGE_STREAMS") == [
        ("DB", "PUBLIC", "BALANCES", False), ("DB", "PUBLIC", "EVERYTHING", True)]  # fmt: skip
    assert rows(session, "SELECT CHANGE_STREAM_NAME, `ALL` FROM "
                         "other.information_schema.change_streams") == [("ELSEWHERE", False)]
    tables = rows(session, "SELECT CHANGE_STREAM_NAME, TABLE_CATALOG, TABLE_NAME, ALL_COLUMNS "
                           "FROM INFORMATION_SCHEMA.CHANGE_STREAM_TABLES")  # fmt: skip
    # A stream FOR ALL watches every table, those of other databases too.
    assert tables == [("BALANCES", "DB", "ACCOUNTS", True), ("EVERYTHING", "DB", "ACCOUNTS", True),
                      ("EVERYTHING", "DB", "ORDERS", True), ("EVERYTHING", "OTHER", "T", True)]
    assert rows(session, "SELECT CHANGE_STREAM_NAME, OPTION_NAME, OPTION_VALUE FROM "
                         "INFORMATION_SCHEMA.CHANGE_STREAM_OPTIONS WHERE "
                         "CHANGE_STREAM_NAME = 'BALANCES'") == [
        ("BALANCES", "retention_period", "36h"), ("BALANCES", "value_capture_type", "NEW_ROW")]
    # They join like tables: the streams watching ACCOUNTS, with their capture type.
    joined = rows(session, """
        SELECT t.CHANGE_STREAM_NAME, o.OPTION_VALUE
        FROM INFORMATION_SCHEMA.CHANGE_STREAM_TABLES t
        JOIN INFORMATION_SCHEMA.CHANGE_STREAM_OPTIONS o
          ON o.CHANGE_STREAM_NAME = t.CHANGE_STREAM_NAME AND o.OPTION_NAME = 'value_capture_type'
        WHERE t.TABLE_NAME = 'ACCOUNTS'""")
    assert joined == [("BALANCES", "NEW_ROW"), ("EVERYTHING", "OLD_AND_NEW_VALUES")]


def test_a_dropped_table_leaves_its_streams_tables(session):
    session.sql("CREATE TABLE GONE (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM ON_GONE FOR GONE, ORDERS")
    session.sql("DROP TABLE GONE")
    assert rows(session, "SELECT TABLE_NAME FROM INFORMATION_SCHEMA.CHANGE_STREAM_TABLES "
                         "WHERE CHANGE_STREAM_NAME = 'ON_GONE'") == [("ORDERS",)]
    session.sql("DROP CHANGE STREAM ON_GONE")


def test_an_unknown_view_names_those_there_are_and_the_schema_is_reserved(session):
    with pytest.raises(SqlError, match="INFORMATION_SCHEMA holds CHANGE_STREAMS, "
                                       "CHANGE_STREAM_COLUMNS, CHANGE_STREAM_OPTIONS, "
                                       "CHANGE_STREAM_TABLES"):
        session.sql("SELECT * FROM INFORMATION_SCHEMA.NOPE")
    with pytest.raises(SqlError, match="reserved"):
        session.sql("CREATE SCHEMA INFORMATION_SCHEMA")
    with pytest.raises(SqlError, match="reserved"):
        session.sql("CREATE SCHEMA OTHER.information_schema")
