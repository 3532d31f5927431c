"""Adversarial checks of today's names: INFORMATION_SCHEMA's change stream views, the
qualified dynamic table functions, SHOW's scope, the change stream listing routes,
durations and near misses. Each test is a defect an adversarial round found; those still
open are marked xfail(strict=True) with what is observed: the test states what should
happen and fails until it does."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest

from ingest_sdk.durations import parse_max_client_lag, read_duration
from ingest_sdk.errors import ConfigurationError
from pipelines import Session, SqlError
from pipelines.errors import ObjectNotFoundError
from pipelines.sql.statements import classify

# Pure checks (no Spark) --------------------------------------------------------------


def test_a_duration_with_trailing_zeros_is_read():
    assert read_duration("1.0000000000000000000 s", "X") == 1


def test_a_huge_integer_lag_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="max_client_lag"):
        parse_max_client_lag(10**400)


def test_set_refresh_mode_without_spaces_gets_the_same_hint():
    with pytest.raises(SqlError) as spaced:
        classify("ALTER DYNAMIC TABLE D SET REFRESH_MODE = FULL")
    assert "CREATE OR REPLACE" in str(spaced.value)  # holds
    with pytest.raises(SqlError) as tight:
        classify("ALTER DYNAMIC TABLE D SET REFRESH_MODE=FULL")
    assert "CREATE OR REPLACE" in str(tight.value)


def test_alter_if_exists_is_read_as_snowflake_reads_it():
    """Found: 'ALTER DYNAMIC TABLE ... EXISTS D is not supported' (IF read as the name)."""
    statement = classify("ALTER DYNAMIC TABLE IF EXISTS D REFRESH")
    assert statement.parts["if_exists"] and statement.parts["name"] == "D"
    with pytest.raises(SqlError) as refused:
        classify("ALTER DYNAMIC TABLE IF EXISTS D SET REFRESH_MODE = FULL")
    assert "EXISTS D" not in str(refused.value) and "CREATE OR REPLACE" in str(refused.value)


def test_alter_if_exists_of_a_missing_table_changes_nothing(session):
    assert session.sql("ALTER DYNAMIC TABLE IF EXISTS NOPE REFRESH").collect()[0][0] == (
        "Statement executed successfully.")  # fmt: skip
    with pytest.raises(ObjectNotFoundError, match="NOPE does not exist"):
        session.sql("ALTER DYNAMIC TABLE NOPE REFRESH")
    assert session.sql("ALTER DYNAMIC TABLE IF EXISTS D SUSPEND").collect()
    assert session.sql("ALTER DYNAMIC TABLE IF EXISTS D RESUME").collect()


def test_a_closed_quote_is_not_called_unclosed():
    """A lexer ends a string at its quote: the next word needs no space before it."""
    statement = classify("CREATE DYNAMIC TABLE D TARGET_LAG='1 minute'AS SELECT 1")
    assert statement.kind == "create_dynamic_table"
    assert statement.parts["query"] == "SELECT 1"
    assert "REFRESH_MODE=FULL" in classify(
        "CREATE DYNAMIC TABLE D TARGET_LAG='1 minute'REFRESH_MODE=FULL AS SELECT 1"
    ).parts["options"]
    with pytest.raises(SqlError, match="never closed"):
        classify("CREATE DYNAMIC TABLE D TARGET_LAG='1 minute AS SELECT 1")


@pytest.mark.parametrize("text", ["SHOW TABLES IN PUBLIC", "SHOW DYNAMIC TABLES IN DB.PUBLIC"])
def test_show_in_a_schema_without_the_keyword(text):
    try:
        statement = classify(text)
    except SqlError as exc:
        assert "IN SCHEMA" in str(exc) and "supported: SELECT" not in str(exc)
    else:  # read as a scope: IN SCHEMA <name>, its keyword left out
        assert statement.parts["scope"] is not None or statement.parts["schema_name"]


def test_show_with_in_before_like_names_the_order():
    with pytest.raises(SqlError) as refused:
        classify("SHOW TABLES IN SCHEMA PUBLIC LIKE 'T'")
    assert "LIKE" in str(refused.value) and "supported: SELECT" not in str(refused.value)


# Over HTTP (no Spark) -------------------------------------------------------------------


def call(server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else orjson.dumps(body)
    request = urllib.request.Request(server.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_http_refuses_a_table_in_the_reserved_schema(server_factory):
    server = server_factory()
    status, body = call(server, "POST", "/v1/tables",
                        {"name": "DB.INFORMATION_SCHEMA.T", "columns": {"ID": "INT"}})
    assert status == 400, body
    assert "INFORMATION_SCHEMA" in body["error"]["message"]


def test_an_empty_change_stream_name_is_named(server_factory):
    """Found: a bare 404 'Not Found' (what describe_change_stream('') sends)."""
    server = server_factory()
    status, body = call(server, "GET", "/v1/change-streams/")
    assert status == 400
    assert "GET /v1/change-streams lists them" in body["error"]["message"]


# SQL on one module session -----------------------------------------------------------


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    made = Session(tmp_path_factory.mktemp("attack_names") / "warehouse", spark=spark)
    made.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    made.sql("INSERT INTO T VALUES (1, 'a')")
    made.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID, V FROM T")
    made.sql("CREATE DATABASE OTHER")  # and uses it
    made.sql("CREATE TABLE OT (ID NUMBER)")
    made.sql("CREATE DYNAMIC TABLE OD TARGET_LAG = '1 minute' AS SELECT ID FROM OT")
    made.sql("USE SCHEMA DB.PUBLIC")
    yield made
    made.close()


def rows(session, query):
    return sorted(tuple(r) for r in session.sql(query).collect())


def test_a_table_in_the_reserved_schema_is_refused(session):
    session.sql("USE SCHEMA DB.PUBLIC")
    with pytest.raises(SqlError, match="reserved"):
        session.sql("CREATE TABLE OTHER.INFORMATION_SCHEMA.CHANGE_STREAMS (ID NUMBER)")


@pytest.mark.parametrize("statement", [
    "INSERT INTO INFORMATION_SCHEMA.CHANGE_STREAMS VALUES ('a', 'b', 'c', TRUE)",
    "DELETE FROM INFORMATION_SCHEMA.CHANGE_STREAMS"])  # fmt: skip
def test_writing_an_information_schema_view_is_refused_as_read_only(session, statement):
    with pytest.raises(SqlError) as refused:
        session.sql(statement)
    assert "create it" not in str(refused.value)
    assert "read-only" in str(refused.value) or "read only" in str(refused.value)


def test_the_views_of_a_missing_database_are_not_found(session):
    with pytest.raises(ObjectNotFoundError, match="NOPE"):
        session.sql("SELECT * FROM NOPE.INFORMATION_SCHEMA.CHANGE_STREAMS").collect()


def test_the_refresh_history_of_a_missing_database_is_not_found(session):
    with pytest.raises(ObjectNotFoundError, match="NOPE"):
        session.sql("SELECT * FROM TABLE(NOPE.INFORMATION_SCHEMA."
                    "DYNAMIC_TABLE_REFRESH_HISTORY())").collect()  # fmt: skip


def test_the_graph_history_keeps_to_its_database(session):
    assert rows(session, "SELECT NAME FROM TABLE(OTHER.INFORMATION_SCHEMA."
                         "DYNAMIC_TABLE_REFRESH_HISTORY())") == [("OD",)]  # holds
    assert rows(session, "SELECT NAME FROM TABLE(OTHER.INFORMATION_SCHEMA."
                         "DYNAMIC_TABLE_GRAPH_HISTORY())") == [("OD",)]
    assert rows(session, "SELECT NAME FROM TABLE(OTHER.INFORMATION_SCHEMA."
                         "DYNAMIC_TABLES())") == [("OD",)]


def test_a_quoted_information_schema_qualifies_the_functions(session):
    assert rows(session, 'SELECT * FROM "INFORMATION_SCHEMA".CHANGE_STREAMS') == []  # holds
    assert rows(session, 'SELECT NAME FROM TABLE("INFORMATION_SCHEMA".'
                         "DYNAMIC_TABLE_REFRESH_HISTORY())") == rows(
        session, "SELECT NAME FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY())")


@pytest.mark.parametrize("query", [
    "SELECT * FROM TABLE(DYNAMIC_TABLE_GRAPH_HISTORY)",
    "SELECT * FROM TABLE(INFORMATION_SCHEMA.CHANGE_STREAMS)",
    "SELECT * FROM TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLES)",
    "SELECT * FROM INFORMATION_SCHEMA.DYNAMIC_TABLES"])  # fmt: skip
def test_a_misused_table_call_is_not_a_raw_spark_error(session, query):
    with pytest.raises(SqlError) as refused:
        session.sql(query).collect()
    assert "UNRESOLVED" not in str(refused.value) and "SQLSTATE" not in str(refused.value)


@pytest.mark.parametrize(("query", "read"), [
    ("SELECT T.ID, c.CHANGE_STREAM_NAME FROM T JOIN INFORMATION_SCHEMA.CHANGE_STREAM_TABLES c "
     "ON c.TABLE_NAME = 'T'", "INFORMATION_SCHEMA.CHANGE_STREAM_TABLES"),
    ("SELECT T.ID, g.NAME FROM T, TABLE(DYNAMIC_TABLE_GRAPH_HISTORY()) g",
     "DYNAMIC_TABLE_GRAPH_HISTORY"),
    ("SELECT T.ID, h.NAME FROM T, TABLE(INFORMATION_SCHEMA.DYNAMIC_TABLE_REFRESH_HISTORY()) h",
     "DYNAMIC_TABLE_REFRESH_HISTORY"),
    ("SELECT T.ID, d.NAME FROM T, TABLE(DB.INFORMATION_SCHEMA.DYNAMIC_TABLES()) d",
     "DYNAMIC_TABLES"),
    ("SELECT T.ID, s.STREAM_NAME FROM T JOIN INFORMATION_SCHEMA.STREAMS s ON s.TABLE_NAME = 'T'",
     "INFORMATION_SCHEMA.STREAMS"),
])  # fmt: skip
def test_a_dynamic_table_over_the_warehouse_description_is_refused(session, query, read):
    """Found: such a table was accepted and its refreshes followed only T (NO_DATA while
    its query's answer moved), a table silently stale."""
    session.sql("USE SCHEMA DB.PUBLIC")
    with pytest.raises(SqlError, match=f"cannot read {read}"):
        session.sql(f"CREATE DYNAMIC TABLE DJ TARGET_LAG = '1 minute' AS {query}")
    assert rows(session, "SHOW DYNAMIC TABLES LIKE 'DJ'") == []


def test_a_stream_on_a_view_of_the_information_schema_names_it(session):
    """Found: 'UNSUPPORTED:LogicalRDD' (an internal plan node) and advice about LIMIT."""
    session.sql("USE SCHEMA DB.PUBLIC")
    session.sql("CREATE OR REPLACE VIEW VIS AS SELECT * FROM INFORMATION_SCHEMA.CHANGE_STREAMS")
    try:
        with pytest.raises(SqlError) as refused:
            session.sql("CREATE STREAM SIS ON VIEW VIS")
        assert "LogicalRDD" not in str(refused.value)
        assert "INFORMATION_SCHEMA" in str(refused.value)
    finally:
        session.sql("DROP VIEW IF EXISTS VIS")


def test_a_dropped_dynamic_source_keeps_its_kind(session):
    session.sql("USE SCHEMA DB.PUBLIC")
    session.sql("CREATE DYNAMIC TABLE D1 TARGET_LAG = DOWNSTREAM AS SELECT ID FROM T")
    session.sql("CREATE DYNAMIC TABLE D2 TARGET_LAG = '1 minute' AS SELECT ID FROM D1")
    try:
        inputs = "SELECT INPUTS FROM TABLE(DYNAMIC_TABLE_GRAPH_HISTORY()) WHERE NAME = 'D2'"
        assert [tuple(i) for i in session.sql(inputs).first()[0]] == [
            ("DB.PUBLIC.D1", "DYNAMIC_TABLE")]  # holds while D1 exists
        session.sql("DROP DYNAMIC TABLE D1")
        assert [tuple(i) for i in session.sql(inputs).first()[0]] == [
            ("DB.PUBLIC.D1", "DYNAMIC_TABLE")]
    finally:
        session.sql("DROP DYNAMIC TABLE IF EXISTS D2")
        session.sql("DROP DYNAMIC TABLE IF EXISTS D1")
