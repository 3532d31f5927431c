"""A statement means what the user wrote: Spark runs the user's own characters, with only
the names bound to our objects and our clauses replaced (pipelines/sql/source_text.py,
spark_reading.py, binding.py). Each case compares the session with Spark itself on the
same text, or with the text's meaning written out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.errors import SqlError
from pipelines.sql.source_text import (
    Splice,
    check_one_statement,
    extent,
    has_extensions,
    parse_with_spans,
    quoted_names,
)
from pipelines.sql.spark_reading import name_parts, references
from pipelines.sql.statements import spark_sql_text

# Spark's answers differ from what sqlglot's regeneration of the text gave (issue 30).
REGENERATION_CHANGED = [
    "SELECT to_char(date'2016-04-08', 'y')",
    "SELECT to_char(12454, '99G999')",
    "SELECT '\\u0041'",
    "SELECT 1.50BD",
    "SELECT string_agg(col) FROM VALUES ('a'), ('b') AS t(col)",
    "SELECT max_by(x, y, 2) FROM VALUES ('a', 10), ('b', 50), ('c', 20) AS t(x, y)",
    "SELECT instr('abcabc', 'b', 1, 2)",
    "SELECT percentile_cont(0.25) WITHIN GROUP (ORDER BY col) FROM VALUES (0), (10) AS t(col)",
    "SELECT variant_get(parse_json('{\"a\":1}'), '$.a', 'int')",
    "SELECT 3 >>> 1",
    "SELECT unix_date(DATE('1970-01-02'))",
    "SELECT to_json(named_struct('a', 1)), to_json(struct(1 AS a))",
    "SELECT parse_json('{\"a\":{\"B\":2}}'):a.B",
]


def values(frame):
    """The rows as Python values (a VARIANT as its JSON: VariantVal has no equality)."""
    return [tuple(str(v) if type(v).__name__ == "VariantVal" else v for v in row)
            for row in frame.collect()]


@pytest.fixture
def world(session):
    for statement in (
        "CREATE TABLE R (ID NUMBER, V VARCHAR)",
        "INSERT INTO R VALUES (1, 'x'), (2, 'y'), (3, 'z')",
        "CREATE TABLE AAA (ID NUMBER)",
        "INSERT INTO AAA VALUES (1), (2)",
    ):
        session.sql(statement)
    return session


@pytest.mark.parametrize("text", REGENERATION_CHANGED)
def test_the_session_answers_what_spark_answers(session, spark, text):
    ours = session.sql(text)
    theirs = spark.sql(text)
    assert values(ours) == values(theirs)
    assert [f.dataType for f in ours.schema] == [f.dataType for f in theirs.schema]


@pytest.mark.parametrize("text", REGENERATION_CHANGED[:8])
def test_a_view_and_a_dynamic_table_answer_what_spark_answers(world, spark, text):
    world.sql(f"CREATE VIEW V1 AS {text}")
    assert values(world.sql("SELECT * FROM V1")) == values(spark.sql(text))
    try:
        world.sql("CREATE DYNAMIC TABLE D1 TARGET_LAG = '1 minute' AS SELECT * FROM V1, AAA "
                  "WHERE AAA.ID = 1")
    except SqlError as exc:
        assert exc.code == "UNSUPPORTED_TYPE", exc  # a list column: no table stores it
        return
    # A table stores Spark's types as its own (an int as NUMBER(38,0)): compared as text.
    expected = [tuple(map(str, (*row, 1))) for row in values(spark.sql(text))]
    assert [tuple(map(str, row)) for row in values(world.sql("SELECT * FROM D1"))] == expected


def test_a_cte_does_not_see_itself(world):
    text = "WITH R AS (SELECT ID, V FROM R WHERE ID > 1) SELECT ID, V FROM R ORDER BY ID"
    assert values(world.sql(text)) == [(2, "y"), (3, "z")]
    world.sql(f"CREATE DYNAMIC TABLE DR TARGET_LAG = '1 minute' AS {text.removesuffix(' ORDER BY ID')}")
    assert sorted(values(world.sql("SELECT * FROM DR"))) == [(2, "y"), (3, "z")]
    world.sql("INSERT INTO R VALUES (4, 'w')")
    world.sql("ALTER DYNAMIC TABLE DR REFRESH")
    assert sorted(values(world.sql("SELECT * FROM DR"))) == [(2, "y"), (3, "z"), (4, "w")]


def test_cte_scopes_follow_spark(world):
    # A later CTE sees an earlier one; an inner WITH hides an outer name; a subquery
    # sees the CTEs around it.
    text = ("WITH A AS (SELECT ID FROM R WHERE ID < 3), B AS (SELECT ID + 10 AS ID FROM A) "
            "SELECT (SELECT COUNT(*) FROM B), (WITH R AS (SELECT 7 AS ID) SELECT MAX(ID) FROM R), "
            "(SELECT MAX(ID) FROM R)")
    assert values(world.sql(text)) == [(2, 7, 3)]
    recursive = ("WITH RECURSIVE N AS (SELECT 1 AS I UNION ALL SELECT I + 1 FROM N WHERE I < 4) "
                 "SELECT SUM(I) FROM N")
    assert values(world.sql(recursive)) == [(10,)]


def test_dml_carries_each_expression_as_written(world):
    world.sql("UPDATE R SET V = to_char(date'2016-04-08', 'y') WHERE ID = instr('abcabc', 'b', 1, 2) - 4")
    world.sql("DELETE FROM R USING AAA AS A WHERE R.ID = A.ID * instr('abcabc', 'b', 1, 2) - 8")
    world.sql("MERGE INTO R USING (SELECT 3 AS ID, '\\u0041' AS V UNION ALL SELECT 9, 'n') AS S "
              "ON R.ID = S.ID WHEN MATCHED THEN UPDATE SET V = S.V || to_char(12454, '99G999') "
              "WHEN NOT MATCHED THEN INSERT (ID, V) VALUES (S.ID, string(1.50BD))")
    world.sql("INSERT INTO R SELECT max_by(x, y), 'm' FROM VALUES (5, 10), (6, 50) AS t(x, y)")
    assert sorted(values(world.sql("SELECT ID, V FROM R"))) == [
        (1, "2016"), (3, "A12,454"), (6, "m"), (9, "1.50")
    ]


@pytest.mark.parametrize("text", [
    "INSERT OVERWRITE INTO R VALUES (1, 'a')",
    "DELETE FROM R WHERE ID = 1 RETURNING ID",
])
def test_dml_it_cannot_carry_is_refused(world, text):
    with pytest.raises(SqlError) as error:
        world.sql(text)
    assert error.value.code == "SQL_COMPILATION_ERROR"
    assert values(world.sql("SELECT COUNT(*) FROM R")) == [(3,)]


def test_result_names_follow_snowflake_and_keep_quoted_case(world):
    world.sql('CREATE TABLE DOCS ("Doc" VARCHAR, N NUMBER)')
    frame = world.sql("SELECT id, v AS foo, `v` AS `Bar`, 1 AS x FROM R")
    assert frame.columns == ["ID", "FOO", "Bar", "X"]
    assert world.sql("SELECT * FROM DOCS").columns == ["Doc", "N"]
    assert world.sql('SELECT "Doc" AS "lower", doc FROM DOCS').columns == ["lower", "DOC"]


def test_table_names_keep_their_place_among_samples_and_aliases(world):
    assert values(world.sql("SELECT R.ID FROM R TABLESAMPLE (100 PERCENT) ORDER BY 1")) == [
        (1,), (2,), (3,)
    ]
    assert values(world.sql("SELECT q.a FROM R AS q(a, b) WHERE q.b = 'y'")) == [(2,)]
    assert values(world.sql("SELECT x.ID FROM R VERSION AS OF 1 x ORDER BY 1")) == [
        (1,), (2,), (3,)
    ]
    assert values(world.sql("SELECT COUNT(*) FROM db . public . r -- a comment\n")) == [(3,)]


def test_one_statement_at_a_time(world):
    with pytest.raises(SqlError, match="expected one statement, got 2"):
        world.sql("SELECT 1; SELECT 2")
    assert values(world.sql("SELECT 1;")) == [(1,)]


# The text tools, without Spark
def test_splice_replaces_only_its_ranges():
    splice = Splice("SELECT a FROM t JOIN u")
    splice.replace(14, 15, "v1 AS `T`")
    splice.replace(21, 22, "v2")
    assert splice.render() == "SELECT a FROM v1 AS `T` JOIN v2"
    assert splice.render(7, 15) == "a FROM v1 AS `T`"
    with pytest.raises(SqlError):
        splice.replace(13, 16, "x")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.data())
def test_splice_keeps_every_character_outside_its_edits(text, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=6, unique=True)))
    pairs = list(zip(cuts[::2], cuts[1::2], strict=False))
    splice = Splice(text)
    expected, position = [], 0
    for number, (start, end) in enumerate(pairs):
        splice.replace(start, end, f"<{number}>")
        expected += [text[position:start], f"<{number}>"]
        position = end
    assert splice.render() == "".join([*expected, text[position:]])


def test_spans_are_the_characters_as_written():
    text = "UPDATE t AS a SET x = CASE WHEN a.y > 1 THEN to_char(d, 'y') END, z = 1.50BD FROM s WHERE a.id = s.id"
    tree = parse_with_spans(text)
    first, second = tree.expressions
    assert text[slice(*extent(first.expression))] == "CASE WHEN a.y > 1 THEN to_char(d, 'y') END"
    assert text[slice(*extent(second.expression))] == "1.50BD"
    assert text[slice(*extent(tree.args["where"]))] == "WHERE a.id = s.id"


@pytest.mark.parametrize(("text", "expected"), [
    ("SELECT * FROM t AT(VERSION => 1)", True),
    ("SELECT * FROM t VERSION AS OF 1", True),
    ("SELECT SYSTEM$STREAM_HAS_DATA('s')", True),
    ("SELECT * FROM READ_cs(start_timestamp => 'x')", True),
    ("SELECT 'at(VERSION => 1)', `at` FROM t -- CHANGES(", False),
    ("SELECT at, before FROM t", False),
])
def test_our_clauses_are_found_outside_strings_and_comments(text, expected):
    assert has_extensions(spark_sql_text(text)) is expected


def test_quoted_names_and_statement_count():
    assert quoted_names("SELECT `a`, b, 'c' FROM `T x`") == {"a", "T x"}
    check_one_statement("SELECT ';' -- ;\n;")
    with pytest.raises(SqlError):
        check_one_statement("SELECT 1; DROP TABLE t")


@pytest.mark.parametrize(("written", "parts"), [
    ("t", [("t", False)]),
    ("db . `My T`", [("db", False), ("My T", True)]),
    ("`a``b`.c.d", [("a`b", True), ("c", False), ("d", False)]),
])
def test_name_parts(written, parts):
    assert name_parts(written) == parts


def test_spark_reports_table_names_with_their_positions(spark):
    text = ("WITH R AS (SELECT * FROM R), Q AS (SELECT * FROM R) "
            "SELECT * FROM Q JOIN db.`s`.u TABLESAMPLE (5 ROWS) WHERE x IN (SELECT y FROM w AS k)")
    found = [(r.parts, text[r.start:r.end], r.aliased, text[r.alias_at - 1]) for r in references(spark, text)]
    assert found == [
        (("R",), "R", False, "R"),  # the CTE's own body reads the table
        (("db", "s", "u"), "db.`s`.u", False, ")"),  # an alias goes after the sample
        (("w",), "w", True, "w"),
    ]


def test_table_queries_and_spark_time_travel(world):
    assert len(values(world.sql("TABLE R UNION ALL TABLE R"))) == 6
    assert values(world.sql("SELECT COUNT(*) FROM (TABLE R)")) == [(3,)]
    assert len(values(world.sql("TABLE R"))) == 3
    with pytest.raises(SqlError, match="AT\\(VERSION => n\\)"):
        world.sql("SELECT * FROM R@v1")  # Spark's own spelling reaches no Spark catalog


def test_a_view_made_for_an_earlier_statement_cannot_be_named(world):
    world.sql("SELECT * FROM R").collect()  # leaves ingest_v<N> in an embedded session
    made = [v for v in world.views if v.startswith("ingest_v")]
    assert made
    with pytest.raises(SqlError) as error:
        world.sql(f"SELECT * FROM {made[-1]}")
    assert error.value.code == "OBJECT_NOT_FOUND"
