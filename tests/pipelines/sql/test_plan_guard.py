"""The SQL boundary (pipelines.sql.plan_guard): statements reach the warehouse's objects only.

Each hostile statement is refused with a SqlError whose message names the construct,
and nothing outside the warehouse is read, created or changed (a secret file and a
marker folder beside the warehouse are checked after every case). Every built-in SQL
function that is not refused passes the guard with its documented example, so the
allowlist does not refuse what it should allow.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import Session, SqlError
from pipelines.sql.plan_guard import (
    DENIED_FUNCTIONS,
    RefusedStatementError,
    check_analyzed,
    check_parsed,
)
from pipelines.sql.spark_reading import parse_plan

SECRET = "s3cr3t-do-not-read"
REFUSED_CODES = {"STATEMENT_NOT_ALLOWED", "OBJECT_NOT_FOUND", "SQL_COMPILATION_ERROR",
                 "UNSUPPORTED_STATEMENT"}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory, spark):
    """A warehouse with table T and stream S, beside a secret file and a marker folder."""
    root = tmp_path_factory.mktemp("guard")
    secret = root / "secret.txt"
    secret.write_text(f"{SECRET}\n")
    secret.chmod(0o600)
    (root / "marker").mkdir()
    session = Session(root / "warehouse", spark=spark)
    session.sql("CREATE TABLE t (id INT, v VARCHAR(10))")
    session.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    session.sql("CREATE STREAM s ON TABLE t")
    session.sql("CREATE TABLE u (id INT, v VARCHAR(10))")
    yield session, root
    session.close()


def outside(root):
    """What lies outside the warehouse: paths, sizes, modes and the secret's content."""
    seen = {}
    for path in sorted(root.rglob("*")):
        if "warehouse" in path.relative_to(root).parts:
            continue
        stat = path.lstat()
        seen[str(path)] = (stat.st_size, stat.st_mode, path.is_symlink())
    return seen, (root / "secret.txt").read_text()


HOSTILE = [
    # files and folders by path, in every spelling
    "SELECT * FROM parquet.`{root}/warehouse`",
    "SELECT * FROM text.`{root}/secret.txt`",
    "SELECT * FROM csv.`{root}/secret.txt`",
    "SELECT * FROM binaryFile.`{root}/secret.txt`",
    "SELECT * FROM json.`{root}/secret.txt`",
    "SELECT * FROM IDENTIFIER('text.`{root}/secret.txt`')",
    "SELECT * FROM identifier('csv.`{root}/secret.txt`')",
    "SELECT * FROM IDENTIFIER(concat('text.`', '{root}', '/secret.txt`'))",
    "SELECT * FROM /* c */ IDENTIFIER ( 'text.`{root}/secret.txt`' )",
    "WITH x AS (SELECT * FROM text.`{root}/secret.txt`) SELECT * FROM x",
    "SELECT * FROM t WHERE v IN (SELECT value FROM text.`{root}/secret.txt`)",
    "SELECT (SELECT max(value) FROM IDENTIFIER('text.`{root}/secret.txt`')) FROM t",
    "SELECT * FROM spark_catalog.default.x",
    "SELECT * FROM global_temp.x",
    "INSERT INTO u SELECT 1, value FROM text.`{root}/secret.txt`",
    "INSERT INTO u SELECT 1, value FROM IDENTIFIER('text.`{root}/secret.txt`')",
    "UPDATE t SET v = (SELECT max(value) FROM IDENTIFIER('text.`{root}/secret.txt`'))",
    "MERGE INTO u USING (SELECT 1 AS id, value FROM IDENTIFIER('text.`{root}/secret.txt`')) src ON u.id = src.id WHEN NOT MATCHED THEN INSERT VALUES (src.id, src.value)",
    "DELETE FROM t WHERE v IN (SELECT value FROM IDENTIFIER('text.`{root}/secret.txt`'))",
    # the JVM
    "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT REFLECT('java.lang.System', 'getProperty', 'user.home')",
    "SELECT java_method('java.lang.System', 'exit', 0)",
    "SELECT try_reflect('org.apache.spark.util.Utils', 'getPropertiesFromFile', '{root}/secret.txt')",
    "SELECT `reflect`('java.lang.System', 'getenv', 'HOME')",
    "SELECT builtin.reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT system.builtin.reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT IDENTIFIER('reflect')('java.lang.System', 'getenv', 'HOME')",
    "SELECT IDENTIFIER('refl' || 'ect')('java.lang.System', 'getenv', 'HOME')",
    "SELECT id FROM t WHERE reflect('java.lang.System', 'getenv', 'HOME') IS NOT NULL",
    "WITH x AS (SELECT java_method('java.io.File', 'createTempFile', 'a', 'b') AS f) SELECT * FROM x",
    "SELECT id FROM t ORDER BY reflect('java.lang.Math', 'random')",
    "SELECT transform(array(1), x -> reflect('java.lang.System', 'getenv', 'HOME'))",
    "INSERT INTO u SELECT 1, reflect('java.lang.System', 'getenv', 'HOME')",
    "UPDATE t SET v = java_method('java.lang.System', 'getenv', 'HOME')",
    "DELETE FROM t WHERE reflect('java.lang.System', 'getenv', 'HOME') = 'x'",
    "MERGE INTO u USING t ON u.id = t.id WHEN NOT MATCHED THEN INSERT VALUES (t.id, reflect('java.lang.System', 'getenv', 'HOME'))",
    "SELECT * FROM t, LATERAL (SELECT reflect('java.lang.System', 'getenv', 'HOME'))",
    # the process
    "SELECT TRANSFORM(id) USING 'id' FROM t",
    "SELECT TRANSFORM(id) USING 'touch {root}/marker/pwned' AS (x) FROM t",
    "WITH x AS (SELECT TRANSFORM(id) USING 'cat {root}/secret.txt' FROM t) SELECT * FROM x",
    "SELECT input_file_name() FROM t",
    "SELECT current_user()",
    "SELECT * FROM python_worker_logs()",
    "SELECT xpath('<a/>', '/a')",
    "SELECT from_protobuf(x'00', 'M', '{root}/secret.txt')",
    # Spark commands and settings
    "SET spark.sql.runSQLOnFiles=true",
    "RESET",
    "CACHE TABLE t",
    "ADD JAR {root}/secret.txt",
    "ADD FILE {root}/secret.txt",
    "INSERT OVERWRITE DIRECTORY '{root}/marker' SELECT 1",
    "INSERT OVERWRITE LOCAL DIRECTORY '{root}/marker' USING csv SELECT 1",
    "CREATE TEMPORARY FUNCTION f AS 'java.lang.System'",
    "CREATE TEMPORARY VIEW x AS SELECT 1",
    "CREATE TABLE x USING parquet LOCATION '{root}/marker' AS SELECT 1",
    "EXECUTE IMMEDIATE 'SELECT reflect(''java.lang.System'', ''getenv'', ''HOME'')'",
    "DECLARE VARIABLE x INT",
    "LOAD DATA LOCAL INPATH '{root}/secret.txt' INTO TABLE t",
]


@pytest.mark.parametrize("template", HOSTILE)
def test_a_hostile_statement_is_refused_and_reaches_nothing(world, template):
    session, root = world
    before = outside(root)
    table_before = session.sql("SELECT id, v FROM t ORDER BY id").collect()
    statement = template.format(root=root)
    with pytest.raises(SqlError) as caught:
        session.sql(statement).collect()
    assert caught.value.code in REFUSED_CODES, caught.value
    message = str(caught.value)
    assert SECRET not in message and "Traceback" not in message
    assert not re.search(r"org\.apache\.|java\.lang\.[A-Z]", message.split("'")[0]), message
    assert outside(root) == before
    assert session.sql("SELECT id, v FROM t ORDER BY id").collect() == table_before
    assert session.sql("SELECT count(*) FROM u").collect()[0][0] == 0


@pytest.mark.parametrize(
    ("statement", "named"),
    [
        ("SELECT reflect('java.lang.System', 'getenv', 'HOME')", "reflect"),
        ("SELECT java_method('java.lang.System', 'getenv', 'HOME')", "java_method"),
        ("SELECT TRANSFORM(id) USING 'id' FROM t", "TRANSFORM"),
        ("SELECT input_file_name() FROM t", "input_file_name"),
        ("SELECT * FROM IDENTIFIER(concat('a', 'b'))", "IDENTIFIER"),
        ("SET spark.sql.runSQLOnFiles=true", "SET"),
    ],
)
def test_the_refusal_names_the_construct(world, statement, named):
    session, _ = world
    with pytest.raises(SqlError) as caught:
        session.sql(statement)
    assert named.lower() in str(caught.value).lower()


def _registry(spark):
    """Each built-in function's name and the first example statement of its docs."""
    registry = spark._jsparkSession.sessionState().functionRegistry()
    functions = registry.listFunction().iterator()
    found = {}
    while functions.hasNext():
        identifier = functions.next()
        examples = registry.lookupFunction(identifier).get().getExamples() or ""
        first = re.search(r"> (SELECT .*?);\n", examples)
        if first and "TIME'" not in first.group(1).upper().replace(" ", ""):
            found[identifier.funcName()] = first.group(1)
    return found


def test_every_allowed_builtin_passes_with_its_documented_example(world, spark):
    """The allowlist is complete for this Spark: no built-in is refused by accident."""
    from pipelines.sql.plan_guard import guarded_frame

    refused = {}
    for name, example in _registry(spark).items():
        if name in DENIED_FUNCTIONS:
            continue
        try:
            guarded_frame(spark, example, ())
        except RefusedStatementError as exc:
            refused[name] = str(exc)[:200]
        except SqlError:
            pass  # an example that needs a setting this session does not use
    assert refused == {}


def test_every_denied_builtin_is_refused(world, spark):
    from pipelines.sql.plan_guard import guarded_frame

    examples = _registry(spark)
    checked = 0
    for name in DENIED_FUNCTIONS:
        if name not in examples:
            continue
        # Both walls refuse it: the first one (Spark's parse, nothing analysed) by its
        # name...
        with pytest.raises(RefusedStatementError, match=name):
            check_parsed(spark, parse_plan(spark, examples[name]))
        # ...and the guard on Spark's plans alone, had the first one missed it (functions
        # that read a file during analysis are refused on Spark's parse, before it).
        with pytest.raises(RefusedStatementError):
            guarded_frame(spark, examples[name], ())
        checked += 1
    assert checked >= 10


def test_a_class_the_allowlist_does_not_know_is_refused(world, spark, monkeypatch):
    """Fail closed: a class off the list is refused wherever the walk meets it: a plan
    node, an expression, an expression inside a lambda, a subquery's plan."""
    from pipelines.sql import plan_guard

    with pytest.raises(RefusedStatementError, match="SomethingNew"):
        check_analyzed(iter(["org.apache.spark.sql.catalyst.plans.logical.Project",
                             "org.apache.spark.sql.catalyst.plans.logical.SomethingNew"]))  # fmt: skip
    session, _ = world
    cases = {
        "Upper": "SELECT upper(v) FROM t",
        "Sort": "SELECT id FROM t ORDER BY id",
        "Max": "SELECT id FROM t WHERE id = (SELECT max(id) FROM t)",
        "Abs": "SELECT transform(array(1, -2), x -> abs(x))",
        "Exists": "SELECT id FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.id)",
    }
    for short, statement in cases.items():
        session.sql(statement).collect()  # allowed as drawn up
        fewer = frozenset(c for c in plan_guard.ALLOWED_CLASSES if not c.endswith(f".{short}"))
        monkeypatch.setattr(plan_guard, "ALLOWED_CLASSES", fewer)
        with pytest.raises(RefusedStatementError, match=short):
            session.sql(statement)
        monkeypatch.undo()


def test_only_this_statements_own_views_are_readable(world, spark):
    from pipelines.sql.plan_guard import guarded_frame

    spark.range(3).createOrReplaceTempView("ingest_v999999")
    spark.range(3).createOrReplaceGlobalTempView("ingest_v999998")
    try:
        assert guarded_frame(spark, "SELECT * FROM ingest_v999999", ["ingest_v999999"]).count() == 3
        for text, views in (
            ("SELECT * FROM ingest_v999999", []),  # another statement's view
            ("SELECT * FROM ingest_v999999", ["ingest_v1"]),
            ("SELECT * FROM global_temp.ingest_v999998", ["ingest_v999998"]),  # not a temp view
        ):
            with pytest.raises(RefusedStatementError):
                guarded_frame(spark, text, views)
        # Beside an own view, another one is still refused.
        with pytest.raises(RefusedStatementError):
            guarded_frame(spark, "SELECT * FROM ingest_v999999 JOIN global_temp.ingest_v999998",
                          ["ingest_v999999", "ingest_v999998"])  # fmt: skip
    finally:
        spark.catalog.dropTempView("ingest_v999999")
        spark.catalog.dropGlobalTempView("ingest_v999998")


def test_the_walk_stops_at_our_views_and_sees_everything_else(world, spark):
    from pipelines.sql.plan_guard import plan_classes

    session, _ = world
    frame = session.sql("SELECT id, upper(v) FROM t WHERE id IN (SELECT id FROM u)")
    analyzed = frame._jdf.queryExecution().analyzed()
    names = {name.rsplit(".", 1)[-1] for name in plan_classes(spark, analyzed, session.views)}
    assert {"Project", "Filter", "InSubquery", "ListQuery", "Upper"} <= names
    assert not names & {"View", "LogicalRelation", "LogicalRDD", "LocalRelation"}


def test_nested_case_is_checked_in_linear_work(world):
    """Spark's JSON form of a plan repeats the subtree under each CASE (a 20-deep CASE
    exhausted the JVM's heap); the walk visits each node once."""
    session, _ = world
    depth = 30
    text = "SELECT " + "CASE WHEN id > 0 THEN " * depth + "1" + " END" * depth + " AS c FROM t"
    assert sorted(r[0] for r in session.sql(text).collect()) == [1, 1]
    trims = "SELECT " + "trim(BOTH 'x' FROM " * 25 + "v" + ")" * 25 + " FROM t ORDER BY 1"
    assert [r[0] for r in session.sql(trims).collect()] == ["a", "b"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from(list("ab'\\ \"`%_;-*/\n")), max_size=12))
def test_a_doubled_quote_is_one_quote(world, text):
    """``''`` inside a literal is one quote (never Spark's concatenation of two literals),
    and a backslash escape keeps Spark's meaning."""
    session, _ = world
    literal = "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
    assert session.sql(f"SELECT {literal} AS x").collect()[0][0] == text


def test_an_inserted_doubled_quote_is_stored_as_one_quote(world):
    session, _ = world
    session.sql("CREATE TABLE names (n VARCHAR(20))")
    session.sql("INSERT INTO names VALUES ('O''Brien'), ('it''s')")
    session.sql("UPDATE names SET n = n || '''' WHERE n = 'it''s'")
    assert sorted(r[0] for r in session.sql("SELECT n FROM names").collect()) == ["O'Brien", "it's'"]


# Spark's syntax that spells no registered function, and table functions: their classes
# are drawn up from tools/draw_plan_classes.py's corpus and the table functions' examples.

#: Harmless statements the guard once refused (STATEMENT_NOT_ALLOWED) for a class the
#: allowlist lacked, with the class (the last one, LIKE ANY / NOT LIKE ALL, always ran:
#: it stands beside its siblings). Each reads no table, so Spark answers the same text.
CLOSED_GAPS = {
    "SELECT dateadd(MICROSECOND, 5, TIMESTAMP'2022-02-28 00:00:00')": "TimestampAdd",
    "SELECT timestampadd(HOUR, 2, TIMESTAMP '2024-01-01 00:00:00'), "
    "date_add(DAY, 1, DATE '2024-01-31'), dateadd(QUARTER, 1, TIMESTAMP_NTZ '2024-01-31 00:00:00')": "TimestampAdd",
    "SELECT timestampdiff(MONTH, TIMESTAMP'2022-02-28 00:00:00', TIMESTAMP'2022-01-01 00:00:00')": "TimestampDiff",
    "SELECT date_diff(DAY, DATE '2024-02-01', DATE '2024-03-01'), "
    "datediff(HOUR, TIMESTAMP '2024-01-01 00:00:00', TIMESTAMP '2024-01-01 05:00:00')": "TimestampDiff",
    "SELECT 'foo' LIKE ALL ('%foo%', '%bar%'), 'foo' LIKE ALL ('f%', '%o')": "LikeAll",
    "SELECT 'FOO' ILIKE ALL ('%foo%', 'f%'), 'foo' NOT ILIKE ALL ('x%')": "LikeAll",
    "SELECT 'foo' NOT LIKE ANY ('%foo%', '%bar%'), 'foo' NOT LIKE SOME ('%foo%')": "NotLikeAny",
    "SELECT 'foo' NOT ILIKE ANY ('%FOO%', '%bar%')": "NotLikeAny",
    "SELECT extract(YEAROFWEEK FROM DATE '2021-01-01'), date_part('YEAROFWEEK', DATE '2021-01-04')": "YearOfWeek",
    "SELECT extract(HOUR FROM INTERVAL '1 2:03:04' DAY TO SECOND)": "ExtractANSIIntervalHours",
    "SELECT extract(YEAR FROM INTERVAL '1-2' YEAR TO MONTH)": "ExtractANSIIntervalYears",
    "SELECT extract(YEAR FROM make_interval(1, 2)), extract(MONTH FROM make_interval(1, 2))": "ExtractIntervalYears",
    "SELECT extract(DAY FROM make_interval(0, 0, 1, 2)), extract(HOUR FROM make_interval(0, 0, 0, 0, 5)), "
    "extract(MINUTE FROM make_interval(0, 0, 0, 0, 0, 6)), "
    "extract(SECOND FROM make_interval(0, 0, 0, 0, 0, 0, 7.5))": "ExtractIntervalDays",
    "SELECT INTERVAL 1 DAY * 2, 2 * INTERVAL '90' MINUTE": "MultiplyDTInterval",
    "SELECT INTERVAL '1 2:03:04' DAY TO SECOND / 2": "DivideDTInterval",
    "SELECT cast(make_interval(1, 2, 3, 4, 5, 6, 7) * 2 AS STRING)": "MultiplyInterval",
    "SELECT cast(make_interval(1, 2, 3, 4, 5, 6, 7) / 2 AS STRING)": "DivideInterval",
    "SELECT DATE '2024-01-31' + make_interval(0, 1, 0, 1)": "DateAddInterval",
    "SELECT array(named_struct('x', 1, 'y', 'a'), named_struct('x', 2, 'y', 'b')).x": "GetArrayStructFields",
    "SELECT * FROM VALUES (typeof(now()), year(current_date()) > 2000, 1 + 1) AS v(x, y, z)": "ResolvedInlineTable",
    "SELECT pos, key, cast(value AS STRING) FROM variant_explode(parse_json('{\"a\": 1, \"b\": [2]}'))": "VariantExplode",
    "SELECT pos, cast(value AS STRING) FROM variant_explode_outer(parse_json('[1, \"x\"]'))": "VariantExplode",
    "SELECT * FROM UNNEST(array(1, 2), array('a', 'b', 'c')) WITH ORDINALITY AS u(x, y, i)": "Unnest",
    "SELECT * FROM JSON_TABLE('{\"a\": [{\"b\": 1}, {\"b\": 2}, {}]}', '$.a[*]' COLUMNS "
    "(n FOR ORDINALITY, b INT PATH '$.b', e BOOLEAN EXISTS PATH '$.b') NULL ON ERROR) AS j": "JsonTable",
    "SELECT * FROM VALUES (1.0), (5.0) AS l(x) JOIN VALUES (1.2), (4.0), (9.0) AS r(y) "
    "EXACT NEAREST 1 BY DISTANCE abs(l.x - r.y)": "NearestByJoin",
    "SELECT * FROM VALUES (1.0), (5.0) AS l(x) LEFT JOIN VALUES (1.2), (4.0) AS r(y) "
    "APPROX NEAREST 2 BY SIMILARITY l.x * r.y": "NearestByJoin",
    "SELECT 'foo' LIKE ANY ('%foo%', '%bar%'), 'foo' NOT LIKE ALL ('%foo%', '%bar%')": "LikeAny",
}


def _answer(frame):
    """A frame's rows (sorted: some statements have no order) and column types."""
    return sorted((tuple(row) for row in frame.collect()), key=repr), [t for _, t in frame.dtypes]


@pytest.mark.parametrize("statement", list(CLOSED_GAPS))
def test_harmless_syntax_runs_with_sparks_answer(world, spark, statement):
    """What Spark's grammar spells without a registered function (the unit forms of
    dateadd/datediff, LIKE ALL, NOT LIKE ANY, extract of each field, interval
    arithmetic, UNNEST, JSON_TABLE, NEAREST BY, VALUES computed when the query runs) and
    the table functions run through the session with Spark's own answer."""
    from pipelines.sql.plan_classes import ALLOWED_CLASSES

    session, _ = world
    assert any(c.endswith(f".{CLOSED_GAPS[statement]}") for c in ALLOWED_CLASSES)
    assert _answer(session.sql(statement)) == _answer(spark.sql(statement))


def test_harmless_syntax_runs_on_the_warehouse_tables(world):
    session, _ = world
    session.sql("CREATE TABLE stamped (id INT, at TIMESTAMP, note VARCHAR(20))")
    # VALUES computed when the statement runs (a ResolvedInlineTable, not literal rows)
    session.sql("INSERT INTO stamped VALUES (1, now(), 'a'), "
                "(2, dateadd(DAY, -1, current_timestamp()), typeof(current_date()))")  # fmt: skip
    assert [tuple(r) for r in session.sql(
        "SELECT id, note, timestampdiff(HOUR, at, now()) >= 0, at <= now() FROM stamped ORDER BY id"
    ).collect()] == [(1, "a", True, True), (2, "date", True, True)]  # fmt: skip
    session.sql("UPDATE stamped SET at = timestampadd(HOUR, 1, TIMESTAMP '2024-01-01 00:00:00') "
                "WHERE note NOT LIKE ANY ('a%', 'x%')")  # fmt: skip
    assert [tuple(r) for r in session.sql(
        "SELECT id, date_diff(MINUTE, TIMESTAMP '2024-01-01 00:00:00', at) FROM stamped "
        "WHERE note LIKE ALL ('d%', '%e') ORDER BY id"
    ).collect()] == [(2, 60)]  # fmt: skip
    session.sql("CREATE VIEW unlike AS SELECT id, v FROM t WHERE v NOT LIKE ANY ('b%', '%b')")
    assert [tuple(r) for r in session.sql("SELECT * FROM unlike").collect()] == [(1, "a")]
    nearest = session.sql(
        "SELECT l.id, r.id FROM t AS l JOIN t AS r EXACT NEAREST 1 BY DISTANCE abs(l.id - r.id - 1)"
    )  # fmt: skip
    assert sorted(tuple(r) for r in nearest.collect()) == [(1, 1), (2, 1)]
    assert sorted(tuple(r) for r in session.sql(
        "SELECT t.id, u.x FROM t, LATERAL UNNEST(array(t.id, t.id * 10)) AS u(x)"
    ).collect()) == [(1, 1), (1, 10), (2, 2), (2, 20)]  # fmt: skip
    session.sql("DROP VIEW unlike")
    session.sql("DROP TABLE stamped")


def _table_registry(spark):
    """Each built-in table function's name and its documented example statements."""
    registry = spark._jsparkSession.sessionState().tableFunctionRegistry()
    functions = registry.listFunction().iterator()
    found = {}
    while functions.hasNext():
        identifier = functions.next()
        examples = registry.lookupFunction(identifier).get().getExamples() or ""
        found[identifier.funcName()] = re.findall(r"> (SELECT .*?);\n", examples)
    return found


def test_every_allowed_table_function_passes_with_its_documented_examples(world, spark):
    from pipelines.sql.plan_guard import DENIED_TABLE_FUNCTIONS, guarded_frame

    examples = _table_registry(spark)
    assert {"range", "explode", "inline", "variant_explode", "variant_explode_outer"} <= set(examples)
    refused = {}
    for name, statements in examples.items():
        if name in DENIED_TABLE_FUNCTIONS:
            continue
        for example in statements:
            try:
                guarded_frame(spark, example, ())
            except RefusedStatementError as exc:
                refused[example] = str(exc)[:200]
    assert refused == {}


#: What stays refused (STATEMENT_NOT_ALLOWED) through the session, and why: the refused
#: functions and table function (plan_guard's DENIED_*), also inside the constructs the
#: allowlist now holds, and what Spark answers only outside the warehouse.
STILL_REFUSED = [
    # call into the JVM
    "SELECT reflect('java.lang.System', 'getenv', 'HOME')",
    "SELECT java_method('java.lang.System', 'getenv', 'HOME')",
    "SELECT try_reflect('java.lang.System', 'getenv', 'HOME')",
    # the warehouse's file paths
    "SELECT input_file_name() FROM t",
    "SELECT input_file_block_start() FROM t",
    "SELECT input_file_block_length() FROM t",
    # the service's account and build
    "SELECT current_user()",
    "SELECT user()",
    "SELECT session_user()",
    "SELECT version()",
    # read a file or URL named by the statement, or parse XML entities
    "SELECT schema_of_avro('{\"type\": \"int\"}', map())",
    "SELECT to_avro(1)",
    "SELECT from_avro(X'00', '{\"type\": \"int\"}', map())",
    "SELECT to_protobuf(named_struct('a', 1), 'M', '/etc/passwd')",
    "SELECT from_xml('<a>1</a>', 'a INT')",
    "SELECT schema_of_xml('<a>1</a>')",
    "SELECT xpath_string('<a>b</a>', 'a')",
    "SELECT xpath_int('<a>1</a>', 'a')",
    "SELECT * FROM python_worker_logs()",
    # the same inside the syntax now allowed: the walk sees into each
    "SELECT dateadd(DAY, 1, TIMESTAMP '2024-01-01 00:00:00') FROM t WHERE input_file_name() LIKE ALL ('%')",
    "SELECT timestampdiff(DAY, current_timestamp(), to_timestamp(version()))",
    "SELECT current_user() NOT LIKE ANY ('root', 'spark')",
    "SELECT * FROM VALUES (now(), reflect('java.lang.System', 'getenv', 'HOME')) AS v(x, y)",
    "INSERT INTO u VALUES (3, java_method('java.lang.System', 'getenv', 'HOME'))",
    "SELECT * FROM UNNEST(array(reflect('java.lang.System', 'getenv', 'HOME')))",
    "SELECT * FROM JSON_TABLE(to_json(named_struct('a', version())), '$' COLUMNS (a STRING PATH '$.a'))",
    "SELECT * FROM t AS l JOIN t AS r EXACT NEAREST 1 BY DISTANCE length(input_file_name())",
    "SELECT * FROM variant_explode(parse_json(to_json(named_struct('u', current_user()))))",
    "SELECT extract(YEAROFWEEK FROM to_date(xpath_string('<a>2024-01-01</a>', 'a')))",
    # metric views are Spark's objects, not the warehouse's (and Spark answers measure()
    # on nothing else)
    "SELECT measure(id) FROM t",
]


@pytest.mark.parametrize("statement", STILL_REFUSED)
def test_deliberate_refusals_still_refuse(world, statement):
    session, root = world
    before = outside(root)
    with pytest.raises(SqlError) as caught:
        session.sql(statement).collect()
    assert caught.value.code == "STATEMENT_NOT_ALLOWED", caught.value
    assert outside(root) == before
    assert session.sql("SELECT count(*) FROM u").collect()[0][0] == 0


@pytest.mark.parametrize(
    ("short", "statement"),
    [
        ("Upper", "SELECT * FROM VALUES (now(), upper('x')) AS v(x, y)"),
        ("Upper", "SELECT * FROM UNNEST(array(upper('x')))"),
        ("Upper", "SELECT * FROM JSON_TABLE(upper('{}'), '$' COLUMNS (a INT PATH '$.a'))"),
        ("Upper", "SELECT * FROM t AS l JOIN t AS r EXACT NEAREST 1 BY DISTANCE length(upper(l.v))"),
        ("Upper", "SELECT 'a' LIKE ALL (upper('a'), 'a'), 'a' NOT LIKE ANY (upper('b'))"),
        ("Upper", "SELECT dateadd(DAY, length(upper('x')), DATE '2024-01-01')"),
        ("Upper", "SELECT * FROM variant_explode(parse_json(upper('[1]')))"),
        ("ResolvedInlineTable", "SELECT * FROM VALUES (now()) AS v(x)"),
        ("NearestByJoin", "SELECT * FROM t AS l JOIN t AS r EXACT NEAREST 1 BY DISTANCE abs(l.id - r.id)"),
    ],
)
def test_the_walk_sees_inside_the_new_constructs(world, monkeypatch, short, statement):
    """Fail closed inside the constructs added to the allowlist: their rows, arguments,
    join conditions and patterns are walked like any other expression."""
    from pipelines.sql import plan_guard

    session, _ = world
    session.sql(statement).collect()  # allowed as drawn up
    fewer = frozenset(c for c in plan_guard.ALLOWED_CLASSES if not c.endswith(f".{short}"))
    monkeypatch.setattr(plan_guard, "ALLOWED_CLASSES", fewer)
    with pytest.raises(RefusedStatementError, match=short):
        session.sql(statement)


@pytest.mark.parametrize(
    "text",
    ["${env:HOME}", "${system:user.home}", "${spark.sql.warehouse.dir}", "${hivevar:x}",
     "${spark.app.name}"],
)  # fmt: skip
def test_no_text_substitution_reads_the_environment_or_settings(tmp_path, spark, text):
    """Spark replaces ``${...}`` in SQL text before any plan exists (the guard sees only
    the result): off, also on a Spark session the caller configured otherwise."""
    spark.conf.set("spark.sql.variable.substitute", "true")
    session = Session(tmp_path / "warehouse", spark=spark)
    try:
        assert session.sql(f"SELECT '{text}' AS x").collect()[0][0] == text
        session.sql("CREATE TABLE sub (v VARCHAR)")
        session.sql(f"INSERT INTO sub VALUES ('{text}')")
        assert session.sql("SELECT v FROM sub").collect()[0][0] == text
    finally:
        session.close()
