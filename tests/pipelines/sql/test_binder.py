"""Adversarial tests of 0fbf7f1 and 457ccc6, the binder that keeps every character of a
statement but the names it binds:

- the same-length stand-ins for ``>>>`` and ``v:path`` (source_text.readable) and the
  scanner of literals and comments every text check relies on (statements.LITERALS);
- where an alias goes after a table name (spark_reading._reference, binding.bind);
- result column names decided per column from Spark's expression ids (outputs());
- ``SET col = <whole expression>`` in UPDATE and MERGE;
- the WHEN / AND-OR / comma limits (STATEMENT_TOO_COMPLEX before any parser);
- a WATERMARK beside one of our clauses, refused by name;
- the plan guard after its JVM calls were batched.

The oracle is Spark's own answer to the same text over plain temporary views of the same
rows, or the documented behaviour (docs/pipelines.md, docs/security.md). Tests marked
``xfail(strict=True, reason="KNOWN GAP: ...")`` expose a documented gap; those marked
FIXED were defects of the round; the others are attacks that held, kept as regression
tests.
"""

from __future__ import annotations

import pytest

from pipelines.errors import SqlError

# ---------------------------------------------------------------------------------------
# Helpers


@pytest.fixture
def world(session):
    for statement in (
        "CREATE TABLE R (ID NUMBER, V VARCHAR)",  # version 0
        "INSERT INTO R VALUES (1, 'x'), (2, 'y'), (3, 'z')",  # version 1
        "CREATE TABLE AAA (ID NUMBER)",
        "INSERT INTO AAA VALUES (1), (2)",
    ):
        session.sql(statement)
    return session


def rows(frame):
    """A frame's rows as sorted tuples of text (a VARIANT as its JSON)."""
    return sorted(tuple(str(v) for v in row) for row in frame.collect())


def spark_answer(spark, session, query, tables):
    """Spark's own rows for ``query`` over plain temporary views of the tables' rows
    (a fresh Spark session: none of the product's views is in reach)."""
    other = spark.newSession()
    for table in tables:
        other.createDataFrame(session.sql(f"SELECT * FROM {table}").toArrow()) \
            .createOrReplaceTempView(table)  # fmt: skip
    return rows(other.sql(query))


# ---------------------------------------------------------------------------------------
# FIXED (was a defect): a raw string literal ending in a backslash (Spark: r'\' is the one character \)
# is read by statements.LITERALS as an escaped quote, so everything after it counts as
# part of a literal: the complexity limits, the search for our clauses, the stand-ins
# and the METADATA$/SYSTEM$ quoting all skip the rest of the statement.

MANY_WHENS = "CASE " + " ".join(f"WHEN ID = {i} THEN {i}" for i in range(1_001)) + " END"


def test_a_raw_string_does_not_hide_the_rest_of_the_statement_from_the_limits(world):
    with pytest.raises(SqlError) as error:
        world.sql(f"SELECT r'\\' AS a, {MANY_WHENS} AS c FROM NO_SUCH_TABLE")
    assert error.value.code == "STATEMENT_TOO_COMPLEX"


@pytest.mark.parametrize(("text", "same_as"), [
    ("SELECT r'\\' AS a, ID FROM R AT(VERSION => 1)", "SELECT '\\\\' AS a, ID FROM R"),
])  # fmt: skip
def test_a_raw_string_does_not_hide_our_clauses(world, spark, text, same_as):
    assert rows(world.sql(text)) == spark_answer(spark, world, same_as, ("R",))


def test_dml_with_a_raw_string_before_a_shift_runs_as_written(world):
    world.sql("UPDATE R SET V = r'\\' WHERE ID >>> 0 = 1")
    assert rows(world.sql("SELECT ID, V FROM R")) == [("1", "\\"), ("2", "y"), ("3", "z")]


# ---------------------------------------------------------------------------------------
# FIXED (was a defect): the limits counted WHEN, not the CASE branches Spark builds: decode(x, s1, r1, ...)
# is a CaseWhen of one branch per pair (two commas each).


def test_a_case_written_as_decode_is_held_to_the_case_limit(world):
    pairs = ", ".join(f"{i}, 'a{i}'" for i in range(5_000))
    with pytest.raises(SqlError) as error:
        world.sql(f"SELECT decode(ID, {pairs}) AS c FROM NO_SUCH_TABLE")
    assert error.value.code == "STATEMENT_TOO_COMPLEX"


def test_limits_count_outside_literals_and_comments_only(world):
    # Held: 2,000 WHEN in a string and a comment are not branches.
    words = "WHEN AND OR , " * 2_000
    text = f"SELECT length('{words}') AS n /* {words} */ FROM R -- {words}\nWHERE ID = 1"
    assert rows(world.sql(text)) == [(str(len(words)),)]


# ---------------------------------------------------------------------------------------
# Aliases added after a table name


def test_a_comment_ending_in_table_does_not_drop_the_alias(world, spark):
    text = "SELECT AAA.ID FROM R JOIN -- the lookup table\n AAA ON AAA.ID = R.ID"
    assert rows(world.sql(text)) == spark_answer(spark, world, text, ("R", "AAA"))


def test_a_table_options_clause_is_refused_by_name(world):
    # FIXED (was a defect): the alias went before WITH, a syntax error Spark does not make.
    for text in ("SELECT R.ID FROM R WITH ('k' = 'v')",
                 "SELECT x.ID FROM R WITH ('versionAsOf' = '0') AS x"):  # fmt: skip
        with pytest.raises(SqlError, match=r"options on a table read .*WITH") as error:
            world.sql(text)
        assert error.value.code == "SQL_COMPILATION_ERROR"


@pytest.mark.parametrize("text", [
    "SELECT R.ID FROM R TABLESAMPLE (100 PERCENT) REPEATABLE (3)",
    "SELECT R.ID FROM R /* a */ TABLESAMPLE /* b */ (BUCKET 1 OUT OF 1) -- c\nORDER BY 1",
    "SELECT t.a FROM R TABLESAMPLE (3 ROWS) t(a, b) WHERE t.a > 1",
    "SELECT R.ID FROM (R) TABLESAMPLE (100 PERCENT) JOIN AAA ON AAA.ID = R.ID",
    "SELECT * FROM R TABLESAMPLE (2 ROWS) UNION ALL SELECT * FROM R TABLESAMPLE (1 ROWS) LIMIT 1",
])  # fmt: skip
def test_an_alias_goes_where_spark_reads_one(world, spark, text):
    # Held: after samples (REPEATABLE, BUCKET, ROWS), comments and column lists.
    assert rows(world.sql(text)) == spark_answer(spark, world, text, ("R", "AAA"))


def test_a_watermark_beside_our_clause_is_refused_by_name_and_alone_runs(session, spark):
    session.sql("CREATE TABLE E (ID NUMBER, TS TIMESTAMP_NTZ)")
    session.sql("INSERT INTO E VALUES (1, '2024-01-01 00:00:00'), (2, '2024-01-01 00:01:00')")
    for text in (
        "SELECT E.ID FROM E AT(VERSION => 1) WATERMARK TS DELAY OF INTERVAL 1 MINUTE",
        "SELECT E.ID FROM E WATERMARK TS DELAY OF INTERVAL 1 MINUTE AT(VERSION => 1)",
    ):
        with pytest.raises(SqlError, match="WATERMARK clause cannot be read") as error:
            session.sql(text)
        assert error.value.code == "SQL_COMPILATION_ERROR"
    text = "SELECT x.ID FROM E TABLESAMPLE (100 PERCENT) WATERMARK TS DELAY OF INTERVAL 1 MINUTE x"
    assert rows(session.sql(text)) == spark_answer(spark, session, text, ("E",))


# ---------------------------------------------------------------------------------------
# Same-length stand-ins: Spark's spellings next to our clauses mean what Spark says


def test_stand_ins_keep_spark_meaning_beside_a_time_travel(world, spark):
    # Held: >>> and : inside backquoted names, strings with escapes, comments and nested
    # types are left alone; outside them each means what Spark says.
    tail = (
        "ID >>> 1 AS s, 8 | ID >>> 1 AS p, "
        "CAST(array(array(array(ID))) AS ARRAY<ARRAY<ARRAY<INT>>>)[0][0][0] AS n, "
        "CAST(map('k', array(ID)) AS MAP<STRING, ARRAY<INT>>)['k'][0] AS m, "
        "CAST(named_struct('a', ID) AS STRUCT<a: INT>).a AS t, "
        "parse_json('{\"a\":[1,{\"b c\":2}]}'):a[1]['b c']::int AS j, "
        "'it\\'s >>> a:b' AS q, `x>>>y:z`.V AS w, "
        "exists(array(ID), x -> x = 2) AS l "
        "FROM R @AT AS `x>>>y:z` WHERE V <> 'a>>>b:c' /* >>> :c */ -- >>> :d\n"
    )
    ours = rows(world.sql("SELECT " + tail.replace("@AT", "AT(VERSION => 1)")))
    assert ours == spark_answer(spark, world, "SELECT " + tail.replace("@AT", ""), ("R",))
    assert [row[:3] for row in ours] == [("0", "8", "1"), ("1", "9", "2"), ("1", "9", "3")]


# ---------------------------------------------------------------------------------------
# SET col = <whole expression>

N_ROWS = "(1, 1, 'a', NULL), (2, 2, 'b', NULL), (3, 3, 'c', NULL), (6, 6, 'd', NULL)"


@pytest.fixture
def n_table(session):
    session.sql("CREATE TABLE N (ID NUMBER, K NUMBER, V VARCHAR, B BOOLEAN)")
    session.sql(f"INSERT INTO N VALUES {N_ROWS}")
    return session


@pytest.mark.parametrize(("dml", "query"), [
    ("UPDATE N SET B = ID = 1 OR ID = 2 AND K = 2 OR NOT ID = 6, K = K + 1 "
     "WHERE V IN (SELECT V FROM N WHERE ID = 1 OR ID = 3) OR ID BETWEEN 5 AND 7",
     "SELECT ID, CASE WHEN ID IN (1, 3, 6) THEN K + 1 ELSE K END, V, "
     "CASE WHEN ID IN (1, 3, 6) THEN ID = 1 OR ID = 2 AND K = 2 OR NOT ID = 6 ELSE B END FROM N"),
    ("UPDATE N SET V = (SELECT max(V) FROM N WHERE ID = 1 OR ID = 6) /* , K = 0 */ "
     "WHERE ID = 2 -- , K = 1",
     "SELECT ID, K, CASE WHEN ID = 2 THEN 'd' ELSE V END, B FROM N"),
    ("MERGE INTO N USING (SELECT 2 AS ID UNION ALL SELECT 9) S ON N.ID = S.ID "
     "WHEN MATCHED AND N.K = 3 OR N.K = 2 THEN UPDATE SET B = N.K = 2 OR N.V = 'q', V = 'm' "
     "WHEN NOT MATCHED THEN INSERT (ID, K, V, B) VALUES (S.ID, 0, 'n', S.ID > 5 OR false)",
     "SELECT ID, K, CASE WHEN ID = 2 THEN 'm' ELSE V END, CASE WHEN ID = 2 THEN true "
     "ELSE B END FROM N UNION ALL SELECT 9, 0, 'n', true"),
])  # fmt: skip
def test_set_takes_the_whole_expression(n_table, spark, dml, query):
    # Held: OR, AND, =, NOT, BETWEEN, subqueries and comments inside SET and conditions.
    n_table.sql(dml)
    expected = rows(spark.sql(f"WITH N AS (SELECT * FROM VALUES {N_ROWS} AS N(ID, K, V, B)) "
                              f"{query}"))  # fmt: skip
    assert rows(n_table.sql("SELECT * FROM N")) == expected


@pytest.mark.parametrize("dml", [
    # FIXED (was a defect): the qualifier was dropped and the target's K written.
    "UPDATE N SET other.K = 99 WHERE ID = 3",
    "MERGE INTO N USING (SELECT 1 AS ID, 5 AS K) S ON N.ID = S.ID "
    "WHEN MATCHED THEN UPDATE SET S.K = 99",
    "UPDATE N AS m SET N.K = 99 WHERE ID = 3",
    "MERGE INTO N USING (SELECT 1 AS ID) S ON N.ID = S.ID WHEN NOT MATCHED THEN INSERT (S.ID) VALUES (1)",
])  # fmt: skip
def test_a_set_column_qualified_by_another_relation_is_refused(n_table, dml):
    before = rows(n_table.sql("SELECT * FROM N"))
    with pytest.raises(SqlError):
        n_table.sql(dml)
    assert rows(n_table.sql("SELECT * FROM N")) == before


def test_malformed_set_lists_are_sql_errors_never_raw(n_table):
    # Held: every user mistake in a SET list is a SqlError naming the place.
    for text in (
        "UPDATE N SET",
        "UPDATE N SET V",
        "UPDATE N SET V =",
        "UPDATE N SET V = 'a' OR",
        "UPDATE N SET V = 'a',",
        "UPDATE N SET = 'a'",
        "UPDATE N SET 1 = 'a'",
        "UPDATE N SET V := 'a'",
        "UPDATE N SET V = 'a' V = 'b'",
        "UPDATE N SET (V) = ('x')",
        "MERGE INTO N USING (SELECT 1 AS ID) S ON N.ID = S.ID",
        "MERGE INTO N USING (SELECT 1 AS ID) S ON N.ID = S.ID WHEN MATCHED THEN UPDATE SET *",
        "MERGE INTO N USING (SELECT 1 AS ID) S ON N.ID = S.ID WHEN NOT MATCHED THEN INSERT *",
        "DELETE FROM N WHERE ID = (SELECT ID FROM N) >>> ",
        "SELECT v:[ FROM N AT(VERSION => 1)",
    ):
        with pytest.raises(SqlError):
            n_table.sql(text)


# ---------------------------------------------------------------------------------------
# Result column names (docs/pipelines.md, "Result columns are named by Snowflake's rule")


@pytest.mark.parametrize(("text", "names"), [
    pytest.param(
        "WITH c AS (SELECT * FROM D) SELECT * FROM c x JOIN c y ON x.id = y.id",
        ["id", "Doc", "N", "id", "Doc", "N"],
        marks=pytest.mark.xfail(strict=True, reason=(
            "KNOWN GAP (docs/pipelines.md): a CTE read twice: Spark gives the second read new expression ids, "
            "outputs() traces them to no view column and rule 4 upper-cases them: "
            "['id', 'Doc', 'N', 'ID', 'DOC', 'N'] (the same columns, two spellings)"))),
    pytest.param(
        "WITH c AS (SELECT id AS foo FROM D) SELECT * FROM c x JOIN c y ON x.`foo` = y.foo",
        ["FOO", "FOO"],
        marks=pytest.mark.xfail(strict=True, reason=(
            "KNOWN GAP: same cause: the second read of an unquoted alias falls to rule 4, which "
            "reads any backquoted `foo` elsewhere in the text: ['FOO', 'foo']"))),
    pytest.param(
        "SELECT * FROM D FULL JOIN D2 USING (id)", ["id", "Doc", "N", "Doc"],
        marks=pytest.mark.xfail(strict=True, reason=(
            "KNOWN GAP: the USING column of a FULL join is Spark's coalesce(l.id, r.id) AS id "
            "with a new id: rule 4 gives ID, while the inner JOIN USING gives the table's "
            "own id"))),
    pytest.param(
        "SELECT doc FROM D GROUP BY ROLLUP(doc)", ["Doc"],
        marks=pytest.mark.xfail(strict=True, reason=(
            "KNOWN GAP: ROLLUP/CUBE/GROUPING SETS output the grouping column through Expand "
            "with a new id: 'doc' gives DOC, 'GROUP BY doc' gives the table's Doc"))),
    ("SELECT * FROM D JOIN D2 USING (id)", ["id", "Doc", "N", "Doc"]),
    ("SELECT y.doc FROM D x JOIN D y ON x.doc = y.doc", ["Doc"]),
    ("WITH c AS (SELECT * FROM D) SELECT * FROM c UNION ALL SELECT * FROM c", ["id", "Doc", "N"]),
    ("WITH c(`Lo`, hi) AS (SELECT 1, 2) SELECT * FROM c", ["Lo", "HI"]),
    ("SELECT 1 AS `a#1L`, doc AS `Doc`, 'x' AS foo FROM D", ["a#1L", "Doc", "FOO"]),
])  # fmt: skip
def test_result_names_follow_the_documented_rule(session, text, names):
    session.sql('CREATE TABLE D ("id" NUMBER, "Doc" VARCHAR, N NUMBER)')
    session.sql("INSERT INTO D VALUES (1, 'a', 2)")
    session.sql('CREATE TABLE D2 ("id" NUMBER, "Doc" VARCHAR)')
    session.sql("INSERT INTO D2 VALUES (1, 'b')")
    assert session.sql(text).columns == names


# ---------------------------------------------------------------------------------------
# The plan guard after its JVM calls were batched (pipelines/sql/plan_guard.py)

LITERALS_300 = ", ".join(map(str, range(300)))
REFLECT = "reflect('java.lang.System', 'getProperty', 'user.name')"


def test_the_batched_guard_still_refuses_inside_every_construct(world):
    # Held: a refused leaf or call deep inside an expression whose classes the walk has
    # already cached (300 literals first), in generators, filters, windows, lambdas,
    # subqueries of CASE, PIVOT, a recursive CTE, a keyword spelled without parentheses.
    world.sql(f"SELECT ID FROM R WHERE ID IN ({LITERALS_300})").collect()  # warm the cache
    for text in (
        f"SELECT ID FROM R WHERE ID IN ({LITERALS_300}, length(input_file_name()))",
        f"SELECT ID FROM R WHERE ID IN ({LITERALS_300}) OR input_file_block_start() > 0",
        "SELECT current_user",
        "SELECT named_struct('a', session_user).a",
        f"SELECT * FROM R LATERAL VIEW explode(array({REFLECT})) t AS x",
        f"SELECT max(ID) FILTER (WHERE {REFLECT} IS NOT NULL) FROM R",
        f"SELECT sum(ID) OVER (PARTITION BY {REFLECT}) FROM R",
        f"SELECT aggregate(array(1), '', (acc, x) -> acc || {REFLECT})",
        "SELECT (SELECT max(x) FROM (SELECT CASE WHEN true THEN (SELECT version()) END AS x))",
        "SELECT * FROM R PIVOT (max(ID) FOR V IN ('x' AS a)) WHERE a = length(input_file_name())",
        "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + length(version()) FROM c "
        "WHERE n < 2) SELECT * FROM c",
        "SELECT * FROM R AT(VERSION => 1) WHERE ID = length(current_user)",
        "SELECT * FROM R TABLESAMPLE (BUCKET 1 OUT OF 1) WATERMARK ID DELAY OF INTERVAL 1 "
        "MINUTE WHERE input_file_name() = ''",
        "SELECT * FROM R LATERAL VIEW OUTER inline(array(struct(version()))) t AS x",
    ):
        with pytest.raises(SqlError) as error:
            world.sql(text).collect()
        assert error.value.code == "STATEMENT_NOT_ALLOWED", (text, error.value)
