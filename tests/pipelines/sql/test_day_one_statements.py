"""Statements users reach for on day one (issue 17), each through ``Session.sql``:
CREATE TABLE ... AS SELECT, TRUNCATE TABLE, CREATE/DROP/SHOW DATABASE|SCHEMA, SHOW
COLUMNS, EXPLAIN, SYSTEM$STREAM_HAS_DATA, DESCRIBE HISTORY and AT (VERSION => n).

Each has its success path with the exact answer and its error paths (unknown object,
bad name, conflicting options), where an error must change nothing: the catalog, every
table's rows (read back with delta-rs, a second engine), the table folders and the
session's defaults are compared before and after. Hostile headers for the new patterns
must be classified (or refused) in time linear in their length: a hang is the failure.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import flush.failpoints as failpoints
from flush import ChannelProgress, TableWriter
from flush.compaction import compact_table
from flush.tables import ROW_ID_COLUMN
from ingest_sdk import convert_rows
from pipelines import ObjectNotFoundError, SqlError, StreamStaleError, UnsupportedStatementError
from pipelines.sql.statements import classify
from pipelines.transactions.commit import recover_pending
from tests.pipelines.refusals import assert_refused


# Helpers
def answer(session, text):
    """The rows of a statement as tuples, in the order given."""
    return [tuple(row) for row in session.sql(text).collect()]


def column(session, text, name):
    return [row[name] for row in session.sql(text).collect()]


def delta_rows(uri):
    """A table's rows as delta-rs reads them (the second engine), by row id."""
    table = DeltaTable(uri).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda row: row[ROW_ID_COLUMN])


def table_uri(session, name):
    return session.require_table(name).uri


def state(session):
    """What an error must leave alone: catalog, rows, versions, folders, defaults."""
    catalog = session.catalog
    tables = {
        t.full_name: (t.id, t.uri, t.next_row_id, DeltaTable(t.uri).version(), delta_rows(t.uri))
        for t in catalog.list_tables()
    }
    folders = sorted(str(p.relative_to(session.warehouse)) for p in session.warehouse.glob("*/*/*"))
    streams = [(s.full_name, s.id, s.offset_version) for s in catalog.list_streams()]
    return (tables, streams, catalog.list_databases(), catalog.list_schemas(), folders,
            session.database, session.schema)  # fmt: skip


@pytest.fixture
def src(session):
    session.sql("CREATE TABLE src (id INT NOT NULL, name VARCHAR(10), price NUMBER(10,2))")
    session.sql("INSERT INTO src VALUES (1, 'a', 1.50), (2, 'b', NULL), (3, NULL, 7)")
    return session


# CREATE TABLE ... AS SELECT
def test_ctas_creates_the_table_from_the_query(src):
    session = src
    text = (
        "CREATE TABLE copy AS SELECT id, name, price, id * 2 AS twice, CAST(price AS DOUBLE) AS f,"
        " name IS NULL AS no_name, DATE'2024-01-02' AS d, TIMESTAMP'2024-01-02 03:04:05' AS ts,"
        " TIMESTAMP_NTZ'2024-01-02 03:04:05' AS ntz, CAST(NULL AS BINARY) AS bin, NULL AS nothing,"
        " 'x' AS lit FROM src"
    )
    assert answer(session, text) == [("Table COPY successfully created.",)]
    assert answer(session, "DESCRIBE TABLE copy") == [
        ("ID", "NUMBER(38,0)", "COLUMN", "Y", "N"),  # a table column reads back nullable
        ("NAME", "VARCHAR(16777216)", "COLUMN", "Y", "N"),
        ("PRICE", "NUMBER(10,2)", "COLUMN", "Y", "N"),
        ("TWICE", "NUMBER(38,0)", "COLUMN", "Y", "N"),
        ("F", "FLOAT", "COLUMN", "Y", "N"),
        ("NO_NAME", "BOOLEAN NOT NULL", "COLUMN", "N", "N"),
        # Typed literals are never null: Spark says so of the text as written.
        ("D", "DATE NOT NULL", "COLUMN", "N", "N"),
        ("TS", "TIMESTAMP_LTZ(9) NOT NULL", "COLUMN", "N", "N"),
        ("NTZ", "TIMESTAMP_NTZ(9) NOT NULL", "COLUMN", "N", "N"),
        ("BIN", "BINARY(8388608)", "COLUMN", "Y", "N"),
        ("NOTHING", "VARCHAR(16777216)", "COLUMN", "Y", "N"),
        ("LIT", "VARCHAR(16777216) NOT NULL", "COLUMN", "N", "N"),
    ]
    # The second engine: delta-rs reads the rows Spark computed, with fresh row ids.
    rows = delta_rows(table_uri(session, "copy"))
    assert [(r["ID"], r["NAME"], r["PRICE"], r["TWICE"], r["F"], r["NO_NAME"]) for r in rows] == [
        (1, "a", pytest.approx(1.5), 2, 1.5, False),
        (2, "b", None, 4, None, False),
        (3, None, 7, 6, 7.0, True),
    ]
    assert [r[ROW_ID_COLUMN] for r in rows] == [0, 1, 2]
    assert {(str(r["D"]), r["NTZ"].isoformat(), r["LIT"]) for r in rows} == {
        ("2024-01-02", "2024-01-02T03:04:05", "x")
    }
    assert DeltaTable(table_uri(session, "copy")).version() == 1  # created, then one insert
    # Rows inserted later continue the sequence.
    session.sql("INSERT INTO copy (id, no_name, d, ts, ntz, lit) SELECT 9, true, d, ts, ntz, lit"
                " FROM copy WHERE id = 1")  # fmt: skip
    assert delta_rows(table_uri(session, "copy"))[-1][ROW_ID_COLUMN] == 3


def test_ctas_column_list_names_and_types_the_columns(src):
    session = src
    text = "CREATE TABLE c (k, label VARCHAR(3) NOT NULL, amount NUMBER(12,4)) AS SELECT id, name, price FROM src WHERE name IS NOT NULL"
    assert answer(session, text) == [("Table C successfully created.",)]
    assert answer(session, "DESCRIBE TABLE c") == [
        ("K", "NUMBER(38,0)", "COLUMN", "Y", "N"),
        ("LABEL", "VARCHAR(3) NOT NULL", "COLUMN", "N", "N"),
        ("AMOUNT", "NUMBER(12,4)", "COLUMN", "Y", "N"),
    ]
    rows = delta_rows(table_uri(session, "c"))
    assert [(r["K"], r["LABEL"], r["AMOUNT"]) for r in rows] == [
        (1, "a", pytest.approx(1.5)),
        (2, "b", None),
    ]
    # A quoted name keeps its case; a JSON text fills a VARIANT column.
    session.sql("""CREATE TABLE v ("Doc" VARIANT) AS SELECT to_json(named_struct('a', 1))""")
    assert answer(session, 'SELECT "Doc" FROM v') == [('{"a":1}',)]


def test_ctas_consumes_the_streams_it_reads(src):
    session = src
    session.sql("CREATE STREAM s ON TABLE src")
    session.sql("INSERT INTO src VALUES (4, 'd', 1)")
    session.sql("CREATE TABLE from_s AS SELECT id, METADATA$ACTION AS action FROM s")
    assert answer(session, "SELECT id, action FROM from_s") == [(4, "INSERT")]
    assert answer(session, "SELECT count(*) FROM s") == [(0,)]  # consumed, as INSERT does


def test_ctas_with_no_rows_makes_an_empty_table(src):
    session = src
    session.sql("CREATE TABLE empty AS SELECT * FROM src WHERE id < 0")
    assert answer(session, "SELECT count(*) FROM empty") == [(0,)]
    assert DeltaTable(table_uri(session, "empty")).version() == 0


def test_ctas_if_not_exists_and_or_replace(src):
    session = src
    session.sql("CREATE TABLE t AS SELECT id FROM src")
    old = session.require_table("t")
    before = state(session)
    # IF NOT EXISTS on an existing table runs nothing (the query names a missing table).
    assert answer(session, "CREATE TABLE IF NOT EXISTS t AS SELECT * FROM missing") == [
        ("T already exists, statement succeeded.",)
    ]
    assert state(session) == before
    # OR REPLACE may read the table it replaces: the rows are computed first.
    assert answer(
        session, "CREATE OR REPLACE TABLE t AS SELECT id * 10 AS id FROM t WHERE id > 1"
    ) == [("Table T successfully created.",)]
    new = session.require_table("t")
    assert new.id != old.id and not Path(old.uri).exists()
    assert [r["ID"] for r in delta_rows(new.uri)] == [20, 30]
    assert [t.name for t in session.catalog.list_tables()] == ["SRC", "T"]


def test_ctas_or_replace_that_fails_keeps_the_old_table(src, monkeypatch):
    """A failure after the old table was moved aside (here the commit's staging step)
    puts it back, whole, and leaves no new table or folder behind."""
    session = src
    session.sql("CREATE TABLE t AS SELECT id FROM src")
    before = state(session)
    monkeypatch.setitem(failpoints._POINTS, "pipeline_after_stage", ["error", None])
    with pytest.raises(failpoints.InjectedFailure):
        session.sql("CREATE OR REPLACE TABLE t AS SELECT 1 AS one")
    with pytest.raises(failpoints.InjectedFailure):
        session.sql("CREATE TABLE t2 AS SELECT 1 AS one")
    assert state(session) == before


def test_ctas_whose_commit_is_decided_keeps_the_new_table(src, monkeypatch):
    """Once the commit is decided (recorded in the catalog) it is completed, by recovery
    if not now: the new table stays for it, and OR REPLACE's old table is gone."""
    session = src
    session.sql("CREATE TABLE t AS SELECT id FROM src")
    old = session.require_table("t")
    monkeypatch.setitem(failpoints._POINTS, "pipeline_after_decide", ["error", 1])
    with pytest.raises(SqlError) as pending:
        session.sql("CREATE OR REPLACE TABLE t AS SELECT name FROM src WHERE id < 3")
    assert pending.value.code == "COMMIT_PENDING"
    new = session.require_table("t")
    assert new.id != old.id and not Path(old.uri).exists()
    assert delta_rows(new.uri) == []  # decided, not yet applied
    assert recover_pending(session.catalog) == 1
    assert [r["NAME"] for r in delta_rows(new.uri)] == ["a", "b"]
    assert session.catalog.pending_commits() == []


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ("CREATE TABLE src AS SELECT 1 AS a", "TABLE_EXISTS", "CREATE OR REPLACE TABLE"),
        (
            "CREATE OR REPLACE TABLE IF NOT EXISTS n AS SELECT 1 AS a",
            "SQL_COMPILATION_ERROR",
            "cannot be used together",
        ),
        ("CREATE TABLE n AS SELECT * FROM missing", "OBJECT_NOT_FOUND", "DB.PUBLIC.MISSING"),
        ("CREATE TABLE n AS SELECT array(1, 2) AS arr", "UNSUPPORTED_TYPE", "to_json(ARR)"),
        (
            "CREATE TABLE n AS SELECT map('a', 1) AS m, 1 AS x",
            "UNSUPPORTED_TYPE",
            "map<string,int>",
        ),
        ("CREATE TABLE n AS SELECT INTERVAL '1' DAY AS i", "UNSUPPORTED_TYPE", "interval day"),
        (
            "CREATE TABLE n AS SELECT id, id FROM src",
            "SQL_COMPILATION_ERROR",
            "two columns named ID",
        ),
        (
            "CREATE TABLE n AS SELECT id, name AS Id FROM src",
            "SQL_COMPILATION_ERROR",
            "two columns named ID",
        ),
        (
            'CREATE TABLE n AS SELECT id AS "Id", name AS "ID" FROM src',
            "SQL_EXECUTION_ERROR",
            "differ only in case",
        ),
        ("CREATE TABLE n AS SELECT 1 AS _ingest_row_id", "SQL_EXECUTION_ERROR", "reserved"),
        (
            "CREATE TABLE n (a, b) AS SELECT 1 AS x",
            "SQL_COMPILATION_ERROR",
            "names 2 column(s) but the query gives 1",
        ),
        (
            "CREATE TABLE n (a WIDGET) AS SELECT 1 AS x",
            "SQL_EXECUTION_ERROR",
            "unknown column type",
        ),
        (
            "CREATE TABLE n (a VARCHAR(2)) AS SELECT name || 'xyz' FROM src",
            "SQL_EXECUTION_ERROR",
            "longer than 2",
        ),
        (
            "CREATE TABLE n (a INT NOT NULL) AS SELECT price FROM src",
            "SQL_EXECUTION_ERROR",
            "NOT NULL",
        ),
        ("CREATE TABLE n AS SELECT 1 / 0 AS x", "SQL_EXECUTION_ERROR", "DIVIDE_BY_ZERO"),
        (
            "CREATE TABLE n AS INSERT INTO src VALUES (1, 'a', 1)",
            "SQL_COMPILATION_ERROR",
            "needs a query",
        ),
        ("CREATE TABLE n AS SELEC 1", "SQL_COMPILATION_ERROR", "needs a query"),
        (
            "CREATE TABLE n AS SELECT reflect('java.lang.System', 'getenv', 'HOME')",
            "STATEMENT_NOT_ALLOWED",
            "reflect",
        ),
        ('CREATE TABLE " " AS SELECT 1 AS a', "SQL_EXECUTION_ERROR", "must not be empty or blank"),
        (
            "CREATE TABLE s AS SELECT 1 AS a",
            "OBJECT_ALREADY_EXISTS",
            "a stream named DB.PUBLIC.S exists",
        ),
    ],
)
def test_ctas_errors_change_nothing(src, text, code, fragment):
    src.sql("CREATE STREAM s ON TABLE src")
    assert_refused(src, text, code, fragment, unchanged=state)


# TRUNCATE TABLE
def test_truncate_deletes_every_row_as_a_change_streams_see(src):
    session = src
    session.sql("CREATE STREAM s ON TABLE src")
    session.sql("CREATE TABLE audit (id INT, action VARCHAR(10), row_id INT)")
    ids = [r[ROW_ID_COLUMN] for r in delta_rows(table_uri(session, "src"))]
    before = DeltaTable(table_uri(session, "src")).version()

    assert answer(session, "TRUNCATE TABLE src") == [("Statement executed successfully.",)]
    assert answer(session, "SELECT count(*) FROM src") == [(0,)]
    assert delta_rows(table_uri(session, "src")) == []  # the second engine agrees
    assert DeltaTable(table_uri(session, "src")).version() == before + 1  # one commit
    assert sorted(answer(session, "SELECT id, METADATA$ACTION, METADATA$ISUPDATE, METADATA$ROW_ID FROM s")) == [
        (1, "DELETE", False, ids[0]), (2, "DELETE", False, ids[1]), (3, "DELETE", False, ids[2])
    ]  # fmt: skip
    # The deletes can be consumed like any others.
    session.sql("INSERT INTO audit SELECT id, METADATA$ACTION, METADATA$ROW_ID FROM s")
    assert sorted(answer(session, "SELECT id, action FROM audit")) == [
        (1, "DELETE"), (2, "DELETE"), (3, "DELETE")
    ]  # fmt: skip
    # Empty now: truncating again commits an empty change; new rows get new ids.
    assert answer(session, "TRUNCATE src") == [("Statement executed successfully.",)]
    session.sql("INSERT INTO src VALUES (5, 'e', 1)")
    assert [r[ROW_ID_COLUMN] for r in delta_rows(table_uri(session, "src"))] == [3]
    assert answer(session, "TRUNCATE TABLE IF EXISTS missing") == [
        ("Statement executed successfully (table did not exist).",)
    ]


def test_truncate_errors_change_nothing(src):
    session = src
    session.sql("CREATE STREAM s ON TABLE src")
    assert_refused(session, "TRUNCATE TABLE missing", "OBJECT_NOT_FOUND", "DB.PUBLIC.MISSING",
                   kind=ObjectNotFoundError, unchanged=state)  # fmt: skip
    assert_refused(session, "TRUNCATE TABLE s", "OBJECT_NOT_FOUND", "DB.PUBLIC.S",  # a stream
                   unchanged=state)  # fmt: skip
    assert_refused(session, "TRUNCATE TABLE a.b.c.d", "UNSUPPORTED_STATEMENT", "supported:",
                   kind=UnsupportedStatementError, unchanged=state)  # fmt: skip
    session.sql("BEGIN")
    assert_refused(session, "TRUNCATE TABLE src", "SQL_COMPILATION_ERROR",
                   "COMMIT or ROLLBACK first", unchanged=state)  # fmt: skip
    session.sql("ROLLBACK")


# Databases and schemas
def databases(session):
    return [
        (r["name"], r["is_current"], r["kind"]) for r in session.sql("SHOW DATABASES").collect()
    ]


def schemas(session, text="SHOW SCHEMAS"):
    return [(r["database_name"], r["name"], r["is_current"]) for r in session.sql(text).collect()]


def test_create_show_and_use_databases_and_schemas(session):
    assert databases(session) == []
    assert answer(session, "CREATE DATABASE shop") == [("Database SHOP successfully created.",)]
    # As in the reference system: the new database has PUBLIC, and the session uses it.
    assert (session.database, session.schema) == ("SHOP", "PUBLIC")
    assert databases(session) == [("SHOP", "Y", "STANDARD")]
    assert answer(session, "CREATE SCHEMA raw") == [("Schema RAW successfully created.",)]
    assert (session.database, session.schema) == ("SHOP", "RAW")
    assert schemas(session) == [("SHOP", "PUBLIC", "N"), ("SHOP", "RAW", "Y")]
    assert answer(session, "CREATE SCHEMA IF NOT EXISTS shop.raw") == [
        ("RAW already exists, statement succeeded.",)
    ]
    assert answer(session, 'CREATE SCHEMA other."Mixed Case"') == [
        ('Schema "Mixed Case" successfully created.',)
    ]
    # A table in a schema nobody created creates it, as before (its database too).
    session.sql("CREATE TABLE legacy.s1.t (a INT)")
    assert databases(session) == [("LEGACY", "N", "STANDARD"), ("OTHER", "Y", "STANDARD"),
                                  ("SHOP", "N", "STANDARD")]  # fmt: skip
    assert schemas(session, "SHOW SCHEMAS IN DATABASE legacy") == [("LEGACY", "S1", "N")]
    assert schemas(session, "SHOW SCHEMAS LIKE '%a%' IN ACCOUNT") == [
        ("OTHER", "Mixed Case", "Y"), ("SHOP", "RAW", "N")
    ]  # fmt: skip
    assert [r["name"] for r in session.sql("SHOW DATABASES LIKE 's%'").collect()] == ["SHOP"]
    assert session.sql("SHOW DATABASES").columns == ["created_on", "name", "is_current", "kind"]
    assert session.sql("SHOW SCHEMAS").columns == [
        "created_on", "name", "is_current", "database_name"
    ]  # fmt: skip
    # USE of a database nobody created: accepted, as before (nothing exists until made).
    assert answer(session, "USE DATABASE nowhere") == [("Statement executed successfully.",)]
    assert session.database == "NOWHERE"
    assert schemas(session) == []


def test_drop_refuses_what_holds_objects_unless_cascade(session):
    session.sql("CREATE TABLE shop.raw.orders (id INT)")
    session.sql("INSERT INTO shop.raw.orders VALUES (1)")
    session.sql("CREATE STREAM shop.raw.orders_s ON TABLE shop.raw.orders")
    session.sql("CREATE TABLE shop.mart.totals (n INT)")
    session.sql("CREATE STREAM db.public.watch ON TABLE shop.raw.orders")  # elsewhere
    orders = session.require_table("shop.raw.orders")
    for text in ("DROP SCHEMA shop.raw", "DROP SCHEMA shop.raw RESTRICT"):
        assert_refused(session, text, "OBJECT_NOT_EMPTY", "SHOP.RAW.ORDERS", "SHOP.RAW.ORDERS_S",
                       "drop them first", "DROP SCHEMA SHOP.RAW CASCADE",
                       unchanged=state)  # fmt: skip
    assert_refused(session, "DROP DATABASE shop", "OBJECT_NOT_EMPTY", "SHOP.MART.TOTALS",
                   "SHOP.RAW.ORDERS", "DROP DATABASE SHOP CASCADE", unchanged=state)  # fmt: skip

    assert answer(session, "DROP SCHEMA shop.raw CASCADE") == [("RAW successfully dropped.",)]
    assert not Path(orders.uri).exists()
    assert session.catalog.get_stream("SHOP", "RAW", "ORDERS_S") is None
    assert schemas(session, "SHOW SCHEMAS IN DATABASE shop") == [("SHOP", "MART", "N")]
    with pytest.raises(StreamStaleError):  # its table is gone
        session.sql("SELECT * FROM db.public.watch")
    assert answer(session, "DROP DATABASE shop CASCADE") == [("SHOP successfully dropped.",)]
    assert [d[0] for d in databases(session)] == ["DB"]
    assert answer(session, "DROP DATABASE IF EXISTS shop") == [
        ("Drop statement executed successfully (database did not exist).",)
    ]
    session.sql("CREATE SCHEMA db.empty")
    assert answer(session, "DROP SCHEMA db.empty") == [("EMPTY successfully dropped.",)]
    assert answer(session, "DROP SCHEMA IF EXISTS db.empty") == [
        ("Drop statement executed successfully (schema did not exist).",)
    ]


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ("CREATE DATABASE db", "OBJECT_ALREADY_EXISTS", "IF NOT EXISTS"),
        ("CREATE SCHEMA db.public", "OBJECT_ALREADY_EXISTS", "schema DB.PUBLIC already exists"),
        ("CREATE SCHEMA public", "OBJECT_ALREADY_EXISTS", "schema DB.PUBLIC already exists"),
        ("CREATE DATABASE a.b", "SQL_COMPILATION_ERROR", "invalid database name"),
        ("CREATE SCHEMA a.b.c", "SQL_COMPILATION_ERROR", "invalid schema name"),
        ('CREATE DATABASE "  "', "SQL_EXECUTION_ERROR", "must not be empty or blank"),
        ("CREATE OR REPLACE DATABASE db", "SQL_COMPILATION_ERROR", "DROP DATABASE ... CASCADE"),
        ("DROP DATABASE nope", "OBJECT_NOT_FOUND", "database NOPE does not exist"),
        ("DROP SCHEMA db.nope", "OBJECT_NOT_FOUND", "schema DB.NOPE does not exist"),
        ("DROP DATABASE db", "OBJECT_NOT_EMPTY", "DB.PUBLIC.T"),
        ("DROP DATABASE db CASCADE RESTRICT", "UNSUPPORTED_STATEMENT", "supported:"),
        ("SHOW SCHEMAS IN DATABASE nope", "OBJECT_NOT_FOUND", "database NOPE does not exist"),
        ("SHOW COLUMNS IN TABLE nope", "OBJECT_NOT_FOUND", "DB.PUBLIC.NOPE"),
        ("SHOW COLUMNS IN TABLE s", "OBJECT_NOT_FOUND", "DB.PUBLIC.S"),
    ],
)
def test_database_and_schema_errors_change_nothing(session, text, code, fragment):
    session.sql("CREATE TABLE t (a INT)")
    session.sql("CREATE STREAM s ON TABLE t")
    assert_refused(session, text, code, fragment, unchanged=state)


def test_database_statements_do_not_run_in_a_transaction(session):
    session.sql("BEGIN")
    assert_refused(session, "CREATE DATABASE x", "SQL_COMPILATION_ERROR",
                   "COMMIT or ROLLBACK first", unchanged=state)  # fmt: skip
    session.sql("ROLLBACK")


def test_show_columns(session):
    session.sql(
        'CREATE TABLE t (id NUMBER(38,0) NOT NULL, "Name" VARCHAR(10), f FLOAT, b BINARY(4),'
        " ok BOOLEAN, d DATE, tm TIME(3), ts TIMESTAMP_LTZ(6), v VARIANT)"
    )
    frame = session.sql("SHOW COLUMNS IN TABLE t")
    assert frame.columns == [
        "table_name", "schema_name", "column_name", "data_type", "null?", "default", "kind",
        "expression", "comment", "database_name", "autoincrement",
    ]  # fmt: skip
    rows = [tuple(r) for r in frame.collect()]
    assert all(r[:2] == ("T", "PUBLIC") and r[5:] == ("", "COLUMN", "", "", "DB", "") for r in rows)
    assert [(r[2], json.loads(r[3]), r[4]) for r in rows] == [
        ("ID", {"type": "FIXED", "precision": 38, "scale": 0, "nullable": False}, "false"),
        (
            "Name",
            {"type": "TEXT", "length": 10, "byteLength": 40, "nullable": True, "fixed": False},
            "true",
        ),
        ("F", {"type": "REAL", "nullable": True}, "true"),
        (
            "B",
            {"type": "BINARY", "length": 4, "byteLength": 4, "nullable": True, "fixed": False},
            "true",
        ),
        ("OK", {"type": "BOOLEAN", "nullable": True}, "true"),
        ("D", {"type": "DATE", "nullable": True}, "true"),
        ("TM", {"type": "TIME", "precision": 0, "scale": 3, "nullable": True}, "true"),
        ("TS", {"type": "TIMESTAMP_LTZ", "precision": 0, "scale": 6, "nullable": True}, "true"),
        ("V", {"type": "VARIANT", "nullable": True}, "true"),
    ]
    assert rows[0][3] == '{"type":"FIXED","precision":38,"scale":0,"nullable":false}'
    assert column(session, "SHOW COLUMNS LIKE 't%' IN t", "column_name") == ["TM", "TS"]
    assert column(session, "SHOW COLUMNS IN db.public.t", "column_name")[:2] == ["ID", "Name"]


# EXPLAIN
def test_explain_shows_the_plan_without_paths(src):
    session = src
    warehouse = str(session.warehouse.resolve())
    simple = column(
        session, "EXPLAIN SELECT name, count(*) FROM src WHERE id > 1 GROUP BY name", "plan"
    )
    assert simple[0] == "== Physical Plan =="
    assert any("HashAggregate" in line for line in simple)
    assert any("Location: <warehouse>" in line for line in simple)
    for mode in ("", "EXTENDED ", "FORMATTED ", "COST "):
        lines = column(
            session, f"EXPLAIN {mode}SELECT * FROM src s JOIN src t ON s.id = t.id", "plan"
        )
        text = "\n".join(lines)
        assert warehouse not in text and "file:" not in text and ".parquet" not in text, text
    extended = column(session, "EXPLAIN EXTENDED SELECT * FROM src", "plan")
    assert [line for line in extended if line.startswith("== ")] == [
        "== Parsed Logical Plan ==", "== Analyzed Logical Plan ==",
        "== Optimized Logical Plan ==", "== Physical Plan ==",
    ]  # fmt: skip
    # Streams, time travel and CHANGES are bound as in a query.
    session.sql("CREATE STREAM s ON TABLE src")
    for query in ("SELECT * FROM s", "SELECT * FROM src AT (VERSION => 1)",
                  "SELECT * FROM src CHANGES (INFORMATION => DEFAULT) AT (VERSION => 0)"):  # fmt: skip
        assert column(session, f"EXPLAIN {query}", "plan")[0] == "== Physical Plan =="


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ("EXPLAIN SELECT * FROM missing", "OBJECT_NOT_FOUND", "DB.PUBLIC.MISSING"),
        (
            "EXPLAIN INSERT INTO src VALUES (1, 'a', 1)",
            "SQL_COMPILATION_ERROR",
            "EXPLAIN needs a query",
        ),
        ("EXPLAIN DELETE FROM src", "SQL_COMPILATION_ERROR", "EXPLAIN needs a query"),
        (
            "EXPLAIN SELECT reflect('java.lang.System', 'getenv', 'HOME')",
            "STATEMENT_NOT_ALLOWED",
            "reflect",
        ),
        ("EXPLAIN SELECT * FROM parquet.`/etc`", "OBJECT_NOT_FOUND", "does not exist"),
        (
            "EXPLAIN SELECT * FROM IDENTIFIER('parquet.`/etc`')",
            "STATEMENT_NOT_ALLOWED",
            "IDENTIFIER(...) is not supported",
        ),
        ("EXPLAIN SELECT 1 +", "SQL_COMPILATION_ERROR", "PARSE_SYNTAX_ERROR"),
    ],
)
def test_explain_errors(src, text, code, fragment):
    assert_refused(src, text, code, fragment, unchanged=state)


# SYSTEM$STREAM_HAS_DATA
def has_data(session, name="s"):
    return answer(session, f"SELECT SYSTEM$STREAM_HAS_DATA('{name}')")[0][0]


def test_stream_has_data(src, spark):
    session = src
    session.sql("CREATE STREAM s ON TABLE src")
    frame = session.sql("SELECT SYSTEM$STREAM_HAS_DATA('s')")
    assert frame.columns == ["SYSTEM$STREAM_HAS_DATA('s')"]
    assert frame.collect()[0][0] is False
    session.sql("INSERT INTO src VALUES (4, 'd', 1)")
    assert has_data(session) is True
    assert has_data(session, "DB.PUBLIC.S") is True and has_data(session, '"S"') is True
    assert answer(session, "SELECT system$stream_has_data('s') AS h, 1 AS one") == [(True, 1)]
    # The reference system's pattern: consume only when there is something.
    session.sql("CREATE TABLE sink (id INT)")
    text = "INSERT INTO sink SELECT id FROM s WHERE SYSTEM$STREAM_HAS_DATA('S')"
    assert answer(session, text) == [(1,)]
    assert has_data(session) is False
    # A commit that changes no data (an empty consumption, compaction) is no data ...
    session.sql("CREATE STREAM other ON TABLE sink")
    session.sql("INSERT INTO sink VALUES (7)")
    session.sql("INSERT INTO src SELECT id, 'x', 0 FROM other WHERE 1 = 0")  # an empty commit
    assert has_data(session) is False
    assert compact_table(spark, table_uri(session, "src")).status == "SUCCEEDED"
    assert has_data(session) is False
    # ... but rows inserted and deleted again are (an empty net change may answer true).
    session.sql("INSERT INTO src VALUES (5, 'e', 1)")
    session.sql("DELETE FROM src WHERE id = 5")
    assert answer(session, "SELECT count(*) FROM s") == [(0,)]
    assert has_data(session) is True


def test_stream_has_data_is_repeatable_in_a_transaction(src, session_factory):
    session = src
    session.sql("CREATE STREAM s ON TABLE src")
    other = session_factory()
    session.sql("BEGIN")
    assert has_data(session) is False
    other.sql("INSERT INTO src VALUES (4, 'd', 1)")
    assert has_data(session) is False  # pinned at the transaction's first read
    session.sql("COMMIT")
    assert has_data(session) is True


def test_stream_has_data_errors(src):
    session = src
    session.sql("CREATE STREAM s ON TABLE src")
    assert_refused(session, "SELECT SYSTEM$STREAM_HAS_DATA('nope')", "OBJECT_NOT_FOUND",
                   "stream DB.PUBLIC.NOPE does not exist", kind=ObjectNotFoundError,
                   unchanged=state)  # fmt: skip
    assert_refused(session, "SELECT SYSTEM$STREAM_HAS_DATA('src')", "OBJECT_NOT_FOUND",
                   "DB.PUBLIC.SRC", unchanged=state)  # fmt: skip
    assert_refused(session, "SELECT 1 FROM src WHERE SYSTEM$STREAM_HAS_DATA('x.y.nope')",
                   "OBJECT_NOT_FOUND", "X.Y.NOPE", unchanged=state)  # fmt: skip
    assert_refused(session, "SELECT SYSTEM$STREAM_HAS_DATA(s)", "SQL_COMPILATION_ERROR",
                   "as a string", unchanged=state)  # fmt: skip
    assert_refused(session, "SELECT SYSTEM$STREAM_HAS_DATA('s', 's')", "SQL_COMPILATION_ERROR",
                   "one argument", unchanged=state)  # fmt: skip
    assert_refused(
        session,
        "SELECT SYSTEM$STREAM_HAS_DATA('a b')",
        "SQL_COMPILATION_ERROR",
        "not a stream name",
        unchanged=state,
    )
    session.sql("DROP TABLE src")
    assert_refused(session, "SELECT SYSTEM$STREAM_HAS_DATA('s')", "STREAM_STALE", "stale",
                   kind=StreamStaleError, unchanged=state)  # fmt: skip


# DESCRIBE HISTORY
def test_describe_history(src, spark):
    session = src
    info = session.require_table("src")
    # A flush of a channel, as the service writes it.
    batch, _ = convert_rows(info.schema, [{"ID": 8, "NAME": "f"}])
    first = session.catalog.reserve_row_ids(info.id, 1)
    TableWriter(info.uri, info.schema).commit_flush(
        [pa.Table.from_batches([batch])], [ChannelProgress("orders-p0", 1, 3, "42", 1)], first
    )
    session.sql("UPDATE src SET price = 2 WHERE id = 8")
    assert compact_table(spark, info.uri).status == "SUCCEEDED"

    frame = session.sql("DESCRIBE HISTORY src")
    assert frame.columns == [
        "version", "timestamp", "operation", "source", "statement", "metadata", "operation_metrics"
    ]  # fmt: skip
    rows = frame.collect()
    assert [(r["version"], r["operation"], r["source"], r["statement"]) for r in rows] == [
        (4, "WRITE", "COMPACTION", None),
        (3, "MERGE", "SQL", "UPDATE src SET price = 2 WHERE id = 8"),
        (2, "WRITE", "INGEST", None),
        (1, "WRITE", "SQL", "INSERT INTO src VALUES (1, 'a', 1.50), (2, 'b', NULL), (3, NULL, 7)"),
        (0, "CREATE TABLE", None, None),
    ]
    assert rows[0]["timestamp"] >= rows[-1]["timestamp"]
    flushed = json.loads(rows[2]["metadata"])
    assert flushed["channels"] == [{"channel": "orders-p0", "generation": 1, "batch_seq": 3,
                                    "offset_token": "42", "rows": 1}]  # fmt: skip
    assert flushed["rows"] == 1
    assert json.loads(rows[1]["metadata"])["statement"] == "UPDATE src SET price = 2 WHERE id = 8"
    assert json.loads(rows[1]["operation_metrics"])["num_target_rows_updated"] == 1
    assert set(json.loads(rows[0]["metadata"])) == {"run"}
    everything = json.dumps([r.asDict() for r in rows], default=str)
    assert str(session.warehouse.resolve()) not in everything  # CREATE TABLE's location is left out
    assert_refused(session, "DESCRIBE HISTORY missing", "OBJECT_NOT_FOUND", "DB.PUBLIC.MISSING",
                   unchanged=state)  # fmt: skip
    session.sql("CREATE STREAM s ON TABLE src")
    assert_refused(session, "DESCRIBE HISTORY s", "OBJECT_NOT_FOUND", "DB.PUBLIC.S",
                   unchanged=state)  # fmt: skip


# AT (VERSION => n)
def test_time_travel_by_version(src):
    session = src
    session.sql("UPDATE src SET name = 'z' WHERE id = 1")
    session.sql("DELETE FROM src WHERE id = 2")
    assert sorted(answer(session, "SELECT id, name FROM src AT (VERSION => 1)")) == [
        (1, "a"), (2, "b"), (3, None)
    ]  # fmt: skip
    assert sorted(answer(session, "SELECT id, name FROM src AT (VERSION => 2)")) == [
        (1, "z"), (2, "b"), (3, None)
    ]  # fmt: skip
    assert sorted(answer(session, "SELECT id FROM src BEFORE (VERSION => 3)")) == [(1,), (2,), (3,)]
    assert answer(session, "SELECT count(*) FROM src AT (VERSION => 0)") == [(0,)]
    assert sorted(answer(session, "SELECT id FROM src")) == [(1,), (3,)]
    assert_refused(session, "SELECT * FROM src AT (VERSION => 9)", "SQL_COMPILATION_ERROR",
                   "version 9 of DB.PUBLIC.SRC does not exist (versions 0 to 3)",
                   unchanged=state)  # fmt: skip


# Hostile headers: classified or refused in linear time (a hang is the failure).
HOSTILE = [
    "CREATE TABLE " + "a." * 50_000 + " AS SELECT 1",
    "CREATE TABLE t (" + "(a)" * 30_000 + " AS",
    "CREATE TABLE t (" + ") AS " * 30_000,
    "CREATE TABLE t (" + "NUMBER(1,2)" * 20_000 + ")AS" + "x",
    "CREATE TABLE t " + "AS " * 50_000,
    "CREATE OR REPLACE TABLE IF NOT EXISTS " * 5_000 + "t AS SELECT 1",
    "TRUNCATE TABLE IF EXISTS " * 10_000,
    "TRUNCATE " + '"' * 100_001,
    "SHOW DATABASES LIKE '" + "''" * 50_000,
    "SHOW SCHEMAS LIKE '" + "''" * 50_000 + "' IN DATABASE",
    "SHOW SCHEMAS IN DATABASE " + "a.b " * 30_000,
    "SHOW COLUMNS LIKE '" + "''" * 50_000 + "' IN",
    "SHOW COLUMNS IN TABLE " + "x ." * 30_000,
    "CREATE DATABASE IF NOT EXISTS " * 10_000,
    "CREATE SCHEMA " + '"a""' * 30_000,
    "DROP DATABASE " + '"' * 100_001,
    "DROP SCHEMA a" + " CASCADE" * 30_000,
    "DROP SCHEMA IF EXISTS IF EXISTS " * 10_000,
    "EXPLAIN " + " " * 100_000,
    "EXPLAIN " + "EXTENDED " * 20_000,
    "DESCRIBE HISTORY " + "x ." * 30_000,
    "DESC HISTORY HISTORY " * 20_000,
    "SELECT " + "SYSTEM$STREAM_HAS_DATA(" * 50 + "'s'" + ")" * 50,
    "SELECT SYSTEM$STREAM_HAS_DATA('" + "a." * 50_000 + "')",
]


@pytest.mark.parametrize("text", HOSTILE, ids=lambda text: f"{text[:24]}...{len(text)}")
def test_hostile_headers_are_read_in_linear_time(text):
    try:
        classify(text)
    except SqlError as exc:
        assert exc.code in ("UNSUPPORTED_STATEMENT", "STATEMENT_TOO_COMPLEX"), exc


def test_hostile_statements_through_the_session(session):
    session.sql("CREATE TABLE t (a INT)")
    session.sql("CREATE STREAM s ON TABLE t")
    for text in ("CREATE TABLE " + "a." * 5_000 + " AS SELECT 1",
                 "SELECT SYSTEM$STREAM_HAS_DATA('" + "a." * 5_000 + "')",
                 "SELECT " + "SYSTEM$STREAM_HAS_DATA(" * 20 + "'s'" + ")" * 20,
                 "EXPLAIN " + "(" * 50 + "SELECT 1" + ")" * 50):  # fmt: skip
        before = state(session)
        with contextlib.suppress(SqlError):
            session.sql(text).collect()
        assert state(session) == before


def test_dml_writes_columns_with_quoted_mixed_case_names(session):
    """The conversion check reads names by identifier rules: a quoted "Doc" column must be
    handed to it quoted (it was read as DOC and refused)."""
    session.sql('CREATE TABLE qn ("Doc" INT, "a b" VARCHAR(5), plain INT)')
    session.sql("INSERT INTO qn VALUES (1, 'x', 10), (2, 'y', 20)")
    session.sql('UPDATE qn SET "Doc" = "Doc" + 10 WHERE plain = 10')
    session.sql('MERGE INTO qn USING (SELECT 3 AS d) s ON qn."Doc" = s.d '
                "WHEN NOT MATCHED THEN INSERT VALUES (s.d, 'z', 30)")
    rows = sorted(tuple(r) for r in session.sql('SELECT "Doc", "a b", plain FROM qn').collect())
    assert rows == [(2, "y", 20), (3, "z", 30), (11, "x", 10)]
