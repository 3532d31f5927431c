"""Change stream statements through a real session: CREATE [OR REPLACE] [IF NOT EXISTS],
FOR tables / FOR ALL / nothing, OPTIONS, ALTER ... SET FOR / DROP FOR ALL / SET OPTIONS,
DROP, SHOW; bad statements refused with nothing created or changed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines import SqlError
from pipelines.change_streams.definition import MAX_RETENTION_S, MIN_RETENTION_S, retention_text
from pipelines.sql.statements import classify
from tests.pipelines.refusals import assert_refused


def shown(session, like=""):
    return [(r["name"], r["for"], r["value_capture_type"], r["retention_period"])
            for r in session.sql(f"SHOW CHANGE STREAMS{like}").collect()]  # fmt: skip


@pytest.fixture
def tables(session):
    session.sql("CREATE TABLE ACCOUNTS (ID NUMBER PRIMARY KEY, BALANCE NUMBER)")
    session.sql("CREATE TABLE ORDERS (ID NUMBER, QTY NUMBER)")
    return session


def test_create_show_alter_drop(tables):
    s = tables
    assert "successfully created" in s.sql("CREATE CHANGE STREAM CS FOR ACCOUNTS").collect()[0][0]
    s.sql("CREATE CHANGE STREAM EVERYTHING FOR ALL OPTIONS (value_capture_type = 'new_row', "
          "retention_period = '36h')")  # fmt: skip
    s.sql("CREATE CHANGE STREAM NOTHING")
    assert shown(s) == [
        ("CS", "DB.PUBLIC.ACCOUNTS", "OLD_AND_NEW_VALUES", "1d"),
        ("EVERYTHING", "ALL", "NEW_ROW", "36h"),
        ("NOTHING", "", "OLD_AND_NEW_VALUES", "1d"),
    ]
    assert shown(s, " LIKE 'every%'") == [("EVERYTHING", "ALL", "NEW_ROW", "36h")]
    s.sql("ALTER CHANGE STREAM CS SET FOR ACCOUNTS, public.orders")
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (retention_period = '90m')")
    s.sql("ALTER CHANGE STREAM EVERYTHING DROP FOR ALL")
    s.sql("ALTER CHANGE STREAM NOTHING SET FOR ALL")
    s.sql("ALTER CHANGE STREAM NOTHING SET OPTIONS (value_capture_type = 'NEW_VALUES')")
    assert shown(s) == [
        ("CS", "DB.PUBLIC.ACCOUNTS, DB.PUBLIC.ORDERS", "OLD_AND_NEW_VALUES", "90m"),
        ("EVERYTHING", "", "NEW_ROW", "36h"),
        ("NOTHING", "ALL", "NEW_VALUES", "1d"),
    ]
    # A dropped table drops out of the list; the stream stays.
    s.sql("DROP TABLE ORDERS")
    assert shown(s, " LIKE 'CS'") == [("CS", "DB.PUBLIC.ACCOUNTS", "OLD_AND_NEW_VALUES", "90m")]
    # OR REPLACE makes a new stream (new uid); IF NOT EXISTS keeps the old one.
    before = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    s.sql("CREATE OR REPLACE CHANGE STREAM CS FOR ALL")
    after = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    assert after.uid != before.uid and after.for_all and after.created_us >= before.created_us
    assert "already exists" in s.sql("CREATE CHANGE STREAM IF NOT EXISTS CS").collect()[0][0]
    assert s.catalog.get_change_stream("DB", "PUBLIC", "CS") == after
    # A change stream may share a table's name: it is read through READ_<name>(...).
    s.sql("CREATE CHANGE STREAM ACCOUNTS FOR ACCOUNTS")
    s.sql("DROP CHANGE STREAM CS")
    assert "did not exist" in s.sql("DROP CHANGE STREAM IF EXISTS CS").collect()[0][0]
    assert [name for name, *_ in shown(s)] == ["ACCOUNTS", "EVERYTHING", "NOTHING"]


@pytest.mark.parametrize(("statement", "code", "message"), [
    ("CREATE CHANGE STREAM X FOR NOPE", "OBJECT_NOT_FOUND", "does not exist"),
    ("CREATE CHANGE STREAM X FOR V", "OBJECT_NOT_FOUND", "a view"),
    ("CREATE CHANGE STREAM X FOR ACCOUNTS, accounts", "SQL_COMPILATION_ERROR", "twice"),
    ("CREATE CHANGE STREAM X OPTIONS (value_capture_type = 'ALL_VALUES')",
     "SQL_COMPILATION_ERROR", "is not one of"),
    ("CREATE CHANGE STREAM X OPTIONS (retention_period = '31d')", "SQL_COMPILATION_ERROR",
     "from 1 minute to 30 days"),
    ("CREATE CHANGE STREAM X OPTIONS (retention_period = '59s')", "SQL_COMPILATION_ERROR",
     "from 1 minute to 30 days"),
    ("CREATE CHANGE STREAM X OPTIONS (retention_period = 'forever')", "SQL_COMPILATION_ERROR",
     "from 1 minute to 30 days"),
    ("CREATE CHANGE STREAM X OPTIONS (colour = 'red')", "SQL_COMPILATION_ERROR", "unknown"),
    ("CREATE CHANGE STREAM X OPTIONS (retention_period = '1d', retention_period = '2d')",
     "SQL_COMPILATION_ERROR", "twice"),
    ("CREATE CHANGE STREAM X OPTIONS (retention_period '1d')", "SQL_COMPILATION_ERROR",
     "cannot read OPTIONS"),
    ("CREATE OR REPLACE CHANGE STREAM IF NOT EXISTS X", "SQL_COMPILATION_ERROR", "together"),
    ("CREATE CHANGE STREAM CS", "OBJECT_ALREADY_EXISTS", "already exists"),
    ('CREATE CHANGE STREAM "a\x01b"', "SQL_EXECUTION_ERROR", "control or invisible"),
    ("ALTER CHANGE STREAM MISSING SET FOR ALL", "OBJECT_NOT_FOUND", "does not exist"),
    ("ALTER CHANGE STREAM CS SET FOR NOPE", "OBJECT_NOT_FOUND", "does not exist"),
    ("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'x')", "SQL_COMPILATION_ERROR",
     "is not one of"),
    ("DROP CHANGE STREAM MISSING", "OBJECT_NOT_FOUND", "does not exist"),
])  # fmt: skip
def test_bad_statements_are_refused_and_change_nothing(tables, statement, code, message):
    tables.sql("CREATE VIEW V AS SELECT * FROM ACCOUNTS")
    tables.sql("CREATE CHANGE STREAM CS FOR ACCOUNTS")
    assert_refused(tables, statement, code, message, collect=False,
                   unchanged=lambda session: session.catalog.list_change_streams())  # fmt: skip


def test_a_statement_inside_a_transaction_is_refused(tables):
    tables.sql("BEGIN")
    with pytest.raises(SqlError, match="inside a transaction"):
        tables.sql("CREATE CHANGE STREAM X FOR ALL")
    tables.sql("ROLLBACK")
    assert tables.catalog.list_change_streams() == []


@given(st.integers(MIN_RETENTION_S, MAX_RETENTION_S))
def test_retention_reads_back_as_written(seconds):
    from pipelines.change_streams.definition import _retention

    assert _retention(retention_text(seconds)) == seconds


@pytest.mark.parametrize(
    "text", ["36h", "36 h", "36 hours", "36 HOUR", "36 hr", "1.5d", "1.5 days", "2160 minutes",
             "2160 min", "2160m", "129600 s", "129600 seconds", "129600sec"],
)  # fmt: skip
def test_retention_takes_every_spelling_of_the_one_duration_grammar(text):
    from pipelines.change_streams.definition import _retention

    assert _retention(text) == 36 * 3600


@pytest.mark.parametrize("text", ["7", "7 weeks", "90.5 s", "59 s", "31 days", "1e3 m"])
def test_a_bad_retention_names_the_option_and_the_accepted_forms(text):
    from pipelines.change_streams.definition import _retention

    with pytest.raises(SqlError) as refused:
        _retention(text)
    message = str(refused.value)
    assert f"retention_period {text!r}" in message and "from 1 minute to 30 days" in message
    assert "'5 seconds', '5 second', '5 sec', '5 s' or '5s'" in message


_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@given(
    names=st.lists(_IDENT, min_size=1, max_size=4),
    spaces=st.sampled_from([" ", "  ", "\n", "\t "]),
    options=st.sampled_from(["", " OPTIONS (retention_period = '7d')", " OPTIONS ()"]),
)
def test_headers_give_their_parts(names, spaces, options):
    target = f",{spaces}".join(names)
    statement = classify(f"CREATE CHANGE STREAM{spaces}cs{spaces}FOR{spaces}{target}{options}")
    assert statement.kind == "create_change_stream"
    assert statement.parts["name"] == "cs"
    assert statement.parts["target"] == target
    altered = classify(f"ALTER CHANGE STREAM cs SET FOR {target}")
    assert (altered.kind, altered.parts["target"]) == ("alter_change_stream", target)


def test_a_schema_holding_a_change_stream_is_not_empty(tables):
    tables.sql("CREATE SCHEMA CDC")
    tables.sql("CREATE CHANGE STREAM CDC.FEED FOR PUBLIC.ACCOUNTS")
    with pytest.raises(SqlError, match=r"change stream\(s\) DB.CDC.FEED"):
        tables.sql("DROP SCHEMA CDC RESTRICT")
    assert [r["name"] for r in tables.sql("SHOW CHANGE STREAMS").collect()] == ["FEED"]
    tables.sql("DROP SCHEMA CDC CASCADE")
    assert tables.catalog.list_change_streams() == []
    # A change stream implies its schema, as a table does.
    tables.catalog.create_change_stream("DB", "IMPLIED", "X", for_all=True, table_ids=(),
                                        value_capture_type="NEW_ROW", retention_s=60,
                                        created_us=1)  # fmt: skip
    assert "IMPLIED" in [r["name"] for r in tables.sql("SHOW SCHEMAS IN DATABASE DB").collect()]
