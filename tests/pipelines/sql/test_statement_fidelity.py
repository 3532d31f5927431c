"""Statement fidelity (issue 30): a statement means what the user wrote.

Every documented example of every built-in function Spark registers (corpus A) and a
corpus of literals, operators and constructs (corpus B) run through ``Session.sql`` and
through Spark itself, on the same text in the same JVM. Wherever Spark answers, the
session must give the same answer (the same rows, column types and column names up to
case), or refuse the statement at the SQL boundary (``STATEMENT_NOT_ALLOWED``, listed);
a statement Spark runs must never be refused as a syntax or compilation error. A sample
of corpus A runs again inside a view and a dynamic table's definition.

Outcomes (tests/pipelines/sql/fidelity_corpus.py): SAME; DIFFERENT (other rows or column
types), DIFFERENT_NAMES (the same values, columns named otherwise) and OTHER_ERROR (any
other error of the session) fail the test, all listed in one assertion message, each
with the statement, the session's answer and Spark's; REFUSED_BY_BOUNDARY is allowed
and listed; examples of the functions the boundary refuses by design (plan_guard's
DENIED_FUNCTIONS) must be refused with STATEMENT_NOT_ALLOWED (DENIED_REFUSED), else
DENIED_NOT_REFUSED fails. Skipped, and printed: what Spark itself does not answer
(SPARK_FAILS: its examples that need a catalog, a table or a setting), what may answer
differently on two runs (NONDETERMINISTIC: rand, uuid, the current time, ...), and what a
documented text rule of the product gives another meaning (PRODUCT_RULE: ``"x"`` is an
identifier, ``''`` inside a string is a quote; then Spark runs the text as the product
reads it, and only if Spark does not answer that is the case skipped).

Column names are compared without case: the product upper-cases unquoted output column
names (Snowflake's rule). Any other difference in a name is a failure: Spark names an
expression's column by the expression, so a different name means a different expression
ran (``ceiling(5)`` named ``ceil(5)`` was regenerated text). A dynamic table's rows are
compared by value only (a table stores integers as NUMBER; the test names its columns).

Spark's answers are computed in a second thread ahead of the session's (both halves of a
comparison are Spark queries; two run at once on two cores).

The summary (a count per outcome, then every case but SAME) is printed: ``pytest -s``
or the captured output of a failure shows it.
"""

from __future__ import annotations

import decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import Session
from tests.pipelines.sql import fidelity_corpus as corpus
from tests.pipelines.sql.fidelity_corpus import (
    BOUNDARY,
    DENIED_REFUSED,
    DIFFERENT,
    FAILURES,
    NONDETERMINISTIC,
    OTHER_ERROR,
    PRODUCT_RULE,
    REFUSED_BY_BOUNDARY,
    SAME,
    SPARK_FAILS,
    UNSUPPORTED_TYPE,
    Case,
)

#: Every outcome but SAME, in the printed summary.
LISTED = (REFUSED_BY_BOUNDARY, DENIED_REFUSED, UNSUPPORTED_TYPE, PRODUCT_RULE,
          NONDETERMINISTIC, SPARK_FAILS)  # fmt: skip

#: Settings of the shared Spark session while this file runs, for speed only (both sides
#: of every comparison run under them, and none changes an answer): ~3,000 tiny queries,
#: each of which would compile its own generated code (interpreted evaluation gives the
#: same answers; Spark's own tests run both ways), re-plan its aggregates adaptively
#: (twice the cost of a small aggregate), shuffle to four partitions, and describe its
#: plan in the formatted form for the UI.
FAST = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.ui.explainMode": "simple",
}

#: How many statements of corpus A run again inside a view and a dynamic table.
SAMPLE = 30


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory, spark):
    """The shared Spark session (with :data:`FAST`) and a session on a fresh warehouse."""
    before = {key: spark.conf.get(key, None) for key in FAST}
    for key, value in FAST.items():
        spark.conf.set(key, value)
    session = Session(tmp_path_factory.mktemp("fidelity") / "warehouse", spark=spark)
    yield spark, session
    session.close()
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


@pytest.fixture(scope="module")
def corpus_a(fidelity) -> list[Case]:
    """Corpus A, each statement run through Spark and the session (once for the file)."""
    spark, session = fidelity
    return corpus.run_cases(spark, session, corpus.builtin_examples(spark))


def check(title: str, cases: list[Case]) -> None:
    """Print the summary; fail listing every failed case (statement, ours, Spark's)."""
    summary = corpus.report(title, cases, LISTED)
    print(summary)
    failed = [case for case in cases if case.outcome in FAILURES]
    assert not failed, corpus.report(title, failed)


def test_every_documented_example_of_every_builtin_answers_as_spark(corpus_a):
    # The registry is Spark's whole list: a few hundred functions, over a thousand examples.
    assert len(corpus_a) > 1000
    assert sum(case.outcome == SAME for case in corpus_a) > 500
    # The refused functions' examples are refused by name at the boundary, not skipped.
    assert sum(case.outcome == DENIED_REFUSED for case in corpus_a) >= 10
    check("corpus A (built-in function examples)", corpus_a)


def test_literals_operators_and_constructs_answer_as_spark(fidelity):
    spark, session = fidelity
    cases = corpus.run_cases(spark, session, [("", statement) for statement in corpus.CORPUS_B])
    check("corpus B (literals, operators, constructs)", cases)


def test_the_issue_table_is_compared_not_skipped(fidelity):
    """The statements of the issue's table are answered by Spark: none may be skipped."""
    spark, _ = fidelity
    for statement in corpus.ISSUE_TABLE:
        expected, varies, error = corpus.spark_answer(spark, corpus.reference_text(statement))
        assert expected is not None and not varies, (statement, error)


def test_the_product_text_rules_are_read_as_documented():
    """The reference text of the two documented rules (the comparison rests on it)."""
    assert corpus.reference_text("SELECT 'it''s'") == r"SELECT 'it\'s'"
    assert corpus.reference_text("SELECT ''") == "SELECT ''"
    assert corpus.reference_text(r"SELECT 'a\'b', 'c''d'") == r"SELECT 'a\'b', 'c\'d'"
    assert corpus.reference_text('SELECT "Col" FROM t') == "SELECT `Col` FROM t"
    assert corpus.reference_text("SELECT '\"x\"'") == "SELECT '\"x\"'"
    assert corpus.example_statements(
        "    Examples:\n      > SELECT a(1,\n        2);\n       3\n"
        "      > SET x=y;\n      x\ty\n      > SELECT b();\n       NULL\n"
    ) == ["SELECT a(1,\n        2)", "SELECT b()"]  # fmt: skip


# Through a view and a dynamic table's definition


def sample(cases: list[Case]) -> list[Case]:
    """Every Nth statement of corpus A that Spark answers with one row (and that neither
    varies nor falls under a product rule or a refused function), :data:`SAMPLE` of them."""
    eligible = [case for case in cases
                if case.expected is not None and len(case.expected.rows) == 1
                and case.outcome not in (NONDETERMINISTIC, PRODUCT_RULE, DENIED_REFUSED,
                                         corpus.DENIED_NOT_REFUSED)]  # fmt: skip
    step = max(1, len(eligible) // SAMPLE)
    return eligible[::step][:SAMPLE]


def _through(session: Any, setup: list[str], query: str, case: Case,
             compare: Any) -> Case:  # fmt: skip
    """Run ``setup`` then ``query`` on the session; compare its answer with Spark's."""
    assert case.expected is not None
    expected = case.expected.show()
    try:
        for statement in setup:
            session.sql(statement).collect()
        ours = corpus.answer(session.sql(query))
    except Exception as exc:
        code, message = corpus.session_error(exc)
        outcome = {BOUNDARY: REFUSED_BY_BOUNDARY, "UNSUPPORTED_TYPE": UNSUPPORTED_TYPE}.get(
            code, OTHER_ERROR
        )
        return Case(case.statement, outcome, message, expected, case.function, code)
    outcome = compare(ours, case.expected)
    return Case(case.statement, outcome, ours.show(), expected, case.function)


def _loose(answer: corpus.Answer) -> list[Any]:
    """A table's rows compared by value: a table stores integers as NUMBER (decimal) and
    floats as doubles, so numbers are compared as exact decimals."""

    def value(v: Any) -> Any:
        if isinstance(v, bool) or v is None:
            return v
        if isinstance(v, (int, float)):
            return decimal.Decimal(v)
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "decimal":
            return decimal.Decimal(v[1])
        return v

    return sorted(([value(v) for v in row] for row in answer.rows), key=repr)


def _stored_values(ours: corpus.Answer, spark: corpus.Answer) -> str:
    """SAME when a table's rows hold Spark's values (:func:`_loose`), else DIFFERENT."""
    return SAME if _loose(ours) == _loose(spark) else DIFFERENT


def test_a_sample_answers_as_spark_through_a_view_and_a_dynamic_table(fidelity, corpus_a):
    _, session = fidelity
    chosen = sample(corpus_a)
    assert len(chosen) == SAMPLE
    session.sql("CREATE TABLE ONE_ROW (K NUMBER)")
    session.sql("INSERT INTO ONE_ROW VALUES (1)")
    views, tables = [], []
    for number, case in enumerate(chosen):
        views.append(_through(
            session, [f"CREATE VIEW FIDELITY_V{number} AS {case.statement}"],
            f"SELECT * FROM FIDELITY_V{number}", case, lambda ours, spark: ours.outcome(spark),
        ))  # fmt: skip
        assert case.expected is not None
        if not corpus.stored_types(case.expected.types):
            # Maps, structs, arrays, variants, intervals: a table stores none of them.
            tables.append(Case(case.statement, UNSUPPORTED_TYPE, "(not run)",
                               case.expected.show(), case.function))  # fmt: skip
            continue
        # A dynamic table reads at least one table: the statement, as written, under a
        # one-row table. Its columns are renamed (a table's names are plain identifiers).
        names = ", ".join(f"C{i}" for i in range(len(case.expected.types)))
        table = f"FIDELITY_D{number}"
        tables.append(_through(
            session,
            [f"CREATE DYNAMIC TABLE {table} TARGET_LAG = '1 minute' AS SELECT s.* "
             f"FROM ONE_ROW, ({case.statement}) AS s({names})",
             f"ALTER DYNAMIC TABLE {table} REFRESH"],
            f"SELECT * FROM {table}", case, _stored_values,
        ))  # fmt: skip
    print(corpus.report("sample through views", views, LISTED))
    print(corpus.report("sample through dynamic tables", tables, LISTED))
    failed = [case for case in views + tables if case.outcome in FAILURES]
    assert not failed, "\n".join([
        corpus.report("sample through views", [c for c in views if c.outcome in FAILURES]),
        corpus.report("sample through dynamic tables",
                      [c for c in tables if c.outcome in FAILURES]),
    ])  # fmt: skip


def _without_from(case: Case) -> bool:
    text = case.statement.strip().rstrip(";")
    return text[:7].upper() == "SELECT " and " FROM " not in text.upper() and ";" not in text


def test_expressions_answer_as_spark_through_an_incremental_refresh(fidelity, corpus_a):
    """An incremental refresh runs the definition with columns inserted, every character
    the user wrote kept: the issue's expressions (a regenerated text dropped to_char's
    format, retyped 1.50BD) and a sample of corpus A over a table's new rows give Spark's
    answer, once per row, refreshed INCREMENTAL."""
    spark, session = fidelity
    issue = corpus.run_cases(spark, session, [("", text) for text in corpus.ISSUE_TABLE])
    chosen = [case for case in [*issue, *sample(corpus_a)] if _without_from(case)
              and case.outcome == SAME and case.expected is not None
              and corpus.stored_types(case.expected.types)]  # fmt: skip
    assert len(chosen) >= 20 and sum(case in issue for case in chosen) >= 4
    session.sql("CREATE TABLE INC_SOURCE (K NUMBER)")
    session.sql("INSERT INTO INC_SOURCE VALUES (1)")
    made = []
    for number, case in enumerate(chosen):
        assert case.expected is not None
        names = ", ".join(f"C{i}" for i in range(len(case.expected.types)))
        made.append(f"FIDELITY_I{number}")
        session.sql(f"CREATE DYNAMIC TABLE FIDELITY_I{number} TARGET_LAG = '1 minute' "
                    f"AS SELECT s.* "
                    f"FROM ({case.statement.strip().rstrip(';')} FROM INC_SOURCE) AS s({names})")  # fmt: skip
    session.sql("INSERT INTO INC_SOURCE VALUES (2), (3)")
    outcomes = []
    for name, case in zip(made, chosen, strict=True):
        assert case.expected is not None
        twice = corpus.Answer(case.expected.names, case.expected.types, case.expected.rows * 3)
        outcomes.append(_through(session, [f"ALTER DYNAMIC TABLE {name} REFRESH"],
                                 f"SELECT * FROM {name}", case,
                                 lambda ours, _, spark=twice: _stored_values(ours, spark)))  # fmt: skip
    actions = session.sql("SELECT NAME, REFRESH_ACTION FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
                          "RESULT_LIMIT => 10000)) WHERE NAME LIKE 'FIDELITY_I%' "
                          "AND REFRESH_TRIGGER = 'MANUAL'").collect()  # fmt: skip
    # What the rewrite cannot carry as written (sqlglot cannot read 3 >>> 1) goes to the
    # engine (AUTO is ADAPTIVE), or is FULL by name; the issue's to_char, 1.50BD and
    # '\u0041' are incremental.
    shown = {r.name: r for r in session.sql("SHOW DYNAMIC TABLES LIKE 'FIDELITY_I%'").collect()}
    incremental = {name for name, r in shown.items() if r.refresh_mode == "ADAPTIVE"}
    for name, r in shown.items():
        full_for_a_reason = r.refresh_mode == "FULL" and bool(r.refresh_mode_reason)
        assert name in incremental or full_for_a_reason, (name, r.refresh_mode_reason)
    assert len(actions) == len(made) and len(incremental) >= 20
    assert {row[1] for row in actions if row[0] in incremental} == {"INCREMENTAL"}
    issue_made = {name for name, case in zip(made, chosen, strict=True) if case in issue}
    assert len(issue_made & incremental) >= 4
    print(corpus.report("through incremental refreshes", outcomes, LISTED))
    failed = [case for case in outcomes if case.outcome in FAILURES]
    assert not failed, corpus.report("through incremental refreshes", failed)


# Random expressions over literals


def _numbers() -> st.SearchStrategy[str]:
    leaves = st.one_of(
        st.integers(-1000, 1000).map(str),
        st.sampled_from(["0", "1.50", "-2.25", "0.1", "3.0", "1L", "2Y", "7S", "1.5D", "1E2",
                         "1.50BD", "NULL", "100000000000"]),
    )  # fmt: skip

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "div", "%"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            inner.map(lambda a: f"abs({a})"),
            inner.map(lambda a: f"-({a})"),
            st.tuples(inner, st.integers(-2, 3)).map(lambda t: f"round({t[0]}, {t[1]})"),
            st.tuples(inner, inner).map(lambda t: f"greatest({t[0]}, {t[1]})"),
            st.tuples(inner, inner).map(lambda t: f"coalesce({t[0]}, {t[1]})"),
            st.tuples(inner, inner).map(
                lambda t: f"CASE WHEN {t[0]} > {t[1]} THEN {t[0]} ELSE {t[1]} END"
            ),
        )

    return st.recursive(leaves, extend, max_leaves=6)


def _strings() -> st.SearchStrategy[str]:
    text = st.text(alphabet="ab Z'\\%_nt0é", max_size=6).map(
        lambda s: "'" + s.replace("\\", "\\\\").replace("'", "''") + "'"
    )
    leaves = st.one_of(text, st.sampled_from([r"'\n'", r"'\t'", r"'\u0041'", "''", "'it''s'"]))

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map(lambda t: f"({t[0]} || {t[1]})"),
            st.tuples(inner, inner).map(lambda t: f"concat({t[0]}, {t[1]})"),
            inner.map(lambda a: f"upper({a})"),
            inner.map(lambda a: f"reverse({a})"),
            st.tuples(inner, st.integers(-3, 4), st.integers(0, 4)).map(
                lambda t: f"substr({t[0]}, {t[1]}, {t[2]})"
            ),
            st.tuples(inner, st.integers(0, 8)).map(lambda t: f"lpad({t[0]}, {t[1]}, '*')"),
            st.tuples(inner, inner).map(lambda t: f"replace({t[0]}, {t[1]}, 'x')"),
            _numbers().map(lambda n: f"CAST({n} AS STRING)"),
        )

    return st.recursive(leaves, extend, max_leaves=4)


@settings(max_examples=25, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(number=_numbers(), text=_strings())
def test_random_expressions_over_literals_answer_as_spark(fidelity, number, text):
    spark, session = fidelity
    statement = f"SELECT {number}, {text}, length({text}), typeof({number})"
    case = corpus.run_case(spark, session, statement)
    assert case.outcome not in FAILURES, case.line()
