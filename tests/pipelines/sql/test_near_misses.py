"""Statements that are nearly a dynamic table statement: the error names the clause and its
accepted form, never UNSUPPORTED_STATEMENT with the list of every statement; and the one
duration grammar in TARGET_LAG, through a session."""

from __future__ import annotations

import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipelines import SqlError, UnsupportedStatementError
from pipelines.sql.near_misses import LAG_FORM
from pipelines.sql.statements import SUPPORTED, classify
from tests.pipelines.refusals import assert_refused

QUERY = "AS SELECT ID FROM T"
FORMS = "'5 seconds', '5 second', '5 sec', '5 s' or '5s'"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (f"CREATE DYNAMIC TABLE D TARGET_LAG = 5 {QUERY}", [LAG_FORM, "got 5", FORMS]),
        (f"create or replace dynamic table d target_lag = 5 minutes {QUERY}",
         [LAG_FORM, "got 5;"]),
        (f"CREATE DYNAMIC TABLE IF NOT EXISTS D TARGET_LAG = -1 {QUERY}", [LAG_FORM, "got -1"]),
        (f"CREATE DYNAMIC TABLE D TARGET_LAG = 1.5 {QUERY}", [LAG_FORM, "got 1.5"]),
        (f"CREATE DYNAMIC TABLE D TARGET_LAG '5 minutes' {QUERY}",
         ["TARGET_LAG needs '='", "TARGET_LAG = '5 minutes'"]),
        (f"CREATE DYNAMIC TABLE D TARGET_LAG = '5 minutes {QUERY}",
         ["quoted value of TARGET_LAG is never closed", LAG_FORM]),
        (f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = 5 {QUERY}",
         ["REFRESH_MODE = 5 cannot be read", "REFRESH_MODE = FULL"]),
        (f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' COMMENT = 'x {QUERY}",
         ["quoted value of COMMENT is never closed"]),
        ("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' SELECT ID FROM T",
         ["needs AS before its query"]),
        ("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS", ["needs a query after AS"]),
        ("CREATE DYNAMIC TABLE", ["needs a table name"]),
        (f"CREATE DYNAMIC TABLE D (ID INT) TARGET_LAG = DOWNSTREAM {QUERY}",
         ["from '(ID' on", "AS <query>"]),
        ("ALTER DYNAMIC TABLE D SET TARGET_LAG = 5", [LAG_FORM, "got 5", FORMS]),
        ("ALTER DYNAMIC TABLE D SET TARGET_LAG = 5 minutes;", [LAG_FORM, "got 5"]),
        ("ALTER DYNAMIC TABLE D SET TARGET_LAG '5 minutes'", ["TARGET_LAG needs '='"]),
        ("ALTER DYNAMIC TABLE D SET TARGET_LAG =", [LAG_FORM, "got nothing"]),
        ("ALTER DYNAMIC TABLE D SET TARGET_LAG = '1 minute' NOW", ["from 'NOW' on"]),
        ("ALTER DYNAMIC TABLE D", ["ends too soon", "REFRESH | SUSPEND | RESUME"]),
    ],
)  # fmt: skip
def test_a_malformed_clause_is_named_with_its_accepted_form(text, fragments):
    with pytest.raises(SqlError) as refused:
        classify(text)
    error = refused.value
    assert type(error) is SqlError and error.code == "SQL_COMPILATION_ERROR", error
    for fragment in fragments:
        assert fragment in str(error)
    assert "supported:" not in str(error) and len(str(error)) < 600


def test_an_alter_action_we_do_not_run_is_unsupported_without_the_whole_list():
    with pytest.raises(UnsupportedStatementError) as refused:
        classify("ALTER DYNAMIC TABLE D RENAME TO E")
    message = str(refused.value)
    assert "ALTER DYNAMIC TABLE ... RENAME TO is not supported" in message
    assert "SET TARGET_LAG = '<duration>' | DOWNSTREAM" in message and SUPPORTED not in message
    assert "then DROP DYNAMIC TABLE the old one" in message  # what to do instead
    with pytest.raises(UnsupportedStatementError, match="set when the table is created"):
        classify("alter dynamic table D set refresh_mode = FULL")


@pytest.mark.parametrize(
    "text", ["CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT 1",
             "ALTER DYNAMIC TABLE D SET TARGET_LAG = DOWNSTREAM", "ALTER DYNAMIC TABLE D REFRESH",
             "CREATE DYNAMIC TABLE D TARGET_LAG = 'soon' AS SELECT 1"],
)  # fmt: skip
def test_well_formed_headers_are_not_near_misses(text):
    assert classify(text).kind.endswith("dynamic_table")


def test_other_statements_keep_their_answer():
    with pytest.raises(UnsupportedStatementError, match="supported: "):
        classify("CREATE DYNAMIC VIEW V AS SELECT 1")


HOSTILE = [
    "CREATE DYNAMIC TABLE D" + " K = 'v'" * 30_000,
    "CREATE DYNAMIC TABLE D" + " K = '" * 30_000,
    "CREATE DYNAMIC TABLE D TARGET_LAG = '" + "''" * 50_000,
    "CREATE DYNAMIC TABLE D" + " TARGET_LAG = DOWNSTREAM" * 10_000 + " = 5",
    "CREATE DYNAMIC TABLE " + "a." * 50_000,
    "ALTER DYNAMIC TABLE D SET TARGET_LAG = '" + "x" * 100_000,
    "ALTER DYNAMIC TABLE " + '"' * 100_001,
    "CREATE OR REPLACE DYNAMIC TABLE IF NOT EXISTS " * 5_000,
]


@pytest.mark.parametrize("text", HOSTILE, ids=lambda text: f"{text[:24]}...{len(text)}")
def test_hostile_near_misses_are_refused_in_linear_time(text):
    started = time.process_time()
    with pytest.raises(SqlError) as refused:
        classify(text)
    assert refused.value.code in ("SQL_COMPILATION_ERROR", "UNSUPPORTED_STATEMENT")
    assert time.process_time() - started < 2.0


def _dynamic(session):
    return {row["name"]: row["target_lag"] for row in session.sql("SHOW DYNAMIC TABLES").collect()}


def test_every_spelling_of_a_duration_sets_the_lag_through_a_session(session):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '90S' INITIALIZE = ON_SCHEDULE {QUERY}")
    assert _dynamic(session) == {"D": "90 seconds"}
    for spelling, shown in [("2 min", "2 minutes"), ("1.5h", "90 minutes"), ("1 d", "1 day"),
                            ("5 Sec", "5 seconds")]:  # fmt: skip
        session.sql(f"ALTER DYNAMIC TABLE D SET TARGET_LAG = '{spelling}'")
        assert _dynamic(session) == {"D": shown}
    assert_refused(session, "ALTER DYNAMIC TABLE D SET TARGET_LAG = 5", "SQL_COMPILATION_ERROR",
                   LAG_FORM, collect=False, unchanged=_dynamic)  # fmt: skip
    assert_refused(session, "ALTER DYNAMIC TABLE D SET TARGET_LAG = '8 days'",
                   "SQL_COMPILATION_ERROR", "TARGET_LAG '8 days' is out of range", FORMS,
                   collect=False, unchanged=_dynamic)  # fmt: skip
    assert_refused(session, f"CREATE DYNAMIC TABLE E TARGET_LAG = 5 {QUERY}",
                   "SQL_COMPILATION_ERROR", LAG_FORM, collect=False,
                   unchanged=_dynamic)  # fmt: skip


PIECES = ["TARGET_LAG", "REFRESH_MODE", "=", "'", "''", "5", "'5 minutes'", "DOWNSTREAM", "AS",
          "SELECT 1", " ", "\t", "(", ")", ";", "SET", "REFRESH", "\"", "x", "\u017f", "--"]  # fmt: skip


HEADS = ["CREATE DYNAMIC TABLE D ", "create or replace dynamic table ",
         "ALTER DYNAMIC TABLE D ", "ALTER DYNAMIC TABLE "]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(HEADS),
    st.one_of(st.text(max_size=30), st.lists(st.sampled_from(PIECES), max_size=8).map(" ".join)),
)
@example("ALTER DYNAMIC TABLE ", "A SET REFRESH_MODE")  # an action refused with its reason
@example("ALTER DYNAMIC TABLE D ", "RENAME TO E")
def test_any_dynamic_table_header_is_a_statement_or_an_error_without_the_whole_list(head, tail):
    try:
        statement = classify(head + tail)
    except SqlError as exc:
        assert exc.code in (
            "SQL_COMPILATION_ERROR",
            "UNSUPPORTED_STATEMENT",
            "STATEMENT_TOO_COMPLEX",
        )
        assert "supported: " not in str(exc), exc
    else:
        assert statement.kind in ("create_dynamic_table", "alter_dynamic_table")
