"""Statement headers on hostile text: recognised in time linear in their length.

A header pattern that can backtrack turns a short text into minutes of CPU (a 114-character
``ALTER TABLE t SET A=A=,A=,...`` once took 10 s). The hang check runs long adversarial
texts, built from every header's own pieces, in a child process: a regression hangs
that process and the test fails at its limit instead of hanging the suite. A property
test checks that any text is either classified or refused with a SqlError.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import SqlError
from pipelines.sql.statements import MAX_NESTING, check_nesting, classify, spark_sql_text

PIECES = [
    "ALTER TABLE t SET ", "A=A=,", "A=", ",", "=", " ", "'", "''", '"', '""', "`", "(", ")",
    "CREATE ", "OR REPLACE ", "STREAM ", "TABLE ", "IF NOT EXISTS ", "ON TABLE ", "s.t.u",
    "APPEND_ONLY = TRUE ", "AT(", "VERSION =>", "TIMESTAMP => '", "COMMENT = '", "/*", "*/",
    "--", "\n", "\\", "SELECT ", "METADATA$ACTION", "USE SCHEMA ", "SHOW TABLES LIKE '", "a.",
    "DROP ", "DESCRIBE ", "CASE ", "END ", ";",
]  # fmt: skip

# Texts of 10,000 to 200,000 characters, each a header's pieces repeated.
ADVERSARIAL = textwrap.dedent(
    """
    from pipelines.sql.statements import classify, spark_sql_text, check_nesting
    from pipelines.errors import SqlError
    texts = []
    for n in (2_000, 20_000):
        texts += [
            "ALTER TABLE t SET " + "A=A=," * n,
            "ALTER TABLE t SET " + "A=A " * n + "=",
            "ALTER TABLE t SET " + "A=" * n,
            "CREATE TABLE t (" + "a INT," * n,
            "CREATE TABLE t (" + "(" * 50 + ")" * 50 + "x" * n,
            "CREATE STREAM s ON TABLE t " + "APPEND_ONLY = TRUE " * n,
            "CREATE STREAM s ON TABLE t AT(VERSION => " + " " * n + "x",
            "CREATE STREAM s ON TABLE t AT(TIMESTAMP => '" + "''" * n,
            "CREATE STREAM s ON TABLE t COMMENT = '" + "''" * n + "x",
            "SHOW TABLES LIKE '" + "''" * n,
            "USE SCHEMA " + '"a"".' * n,
            "USE " + "a." * n,
            "DROP TABLE " + '"' * n,
            "DESCRIBE " + '""' * n + "x",
            "/*" * n,
            "'" + "\\\\'" * n,
            "--" * n,
            "`" * n,
            '"' + '""' * n,
            "SELECT " + "METADATA$ACTION" * n,
            "SELECT " + "CASE " * n,
            "SELECT " + "'a' " * n,
            "x" * n + "(",
        ]
    for text in texts:
        for call in (classify, spark_sql_text, check_nesting):
            try:
                call(text)
            except SqlError:
                pass
    print(len(texts))
    """
)


def test_long_adversarial_headers_finish():
    """Every text is answered; a backtracking pattern would not finish within the limit
    (these texts would take years), so the child is stopped and the test fails."""
    done = subprocess.run([sys.executable, "-c", ADVERSARIAL], capture_output=True, text=True,
                          timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "46"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=60))
def test_any_text_is_classified_or_refused_with_a_sql_error(pieces):
    text = "".join(pieces)
    try:
        statement = classify(text)
    except SqlError as exc:
        assert exc.code and str(exc)
        return
    assert statement.kind and statement.text == text
    spark_sql_text(text)  # never raises: unterminated pieces run to the end of the text


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=3 * MAX_NESTING), st.sampled_from(["(", "[", "CASE "]))
def test_nesting_is_refused_past_the_limit_and_only_there(depth, opener):
    closer = {"(": ")", "[": "]", "CASE ": " END"}[opener]
    text = "SELECT " + opener * depth + "1" + closer * depth
    if depth > MAX_NESTING:
        try:
            check_nesting(text)
        except SqlError as exc:
            assert exc.code == "STATEMENT_TOO_COMPLEX" and str(depth) in str(exc)
        else:
            raise AssertionError(f"{depth} levels were not refused")
    else:
        check_nesting(text)
    # Brackets inside literals and comments do not count.
    check_nesting("SELECT '" + "(" * depth + "' /* " + "(" * depth + " */")
