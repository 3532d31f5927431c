"""Statements and the comparison behind tests/pipelines/sql/test_statement_fidelity.py.

A statement run through ``Session.sql`` must answer what Spark answers on the same text
(issue 30): the product may change only what it must (names bound to our objects, our
own clauses) and refuse only at the SQL boundary, by name. This module holds

- :func:`builtin_examples`: every ``> SELECT ...;`` statement of the documented examples
  of every built-in function Spark registers (corpus A);
- :data:`LITERALS`: literals, operators and constructs a regenerating rewrite gets wrong
  (corpus B, with the table of the issue);
- :func:`reference_text`: the text Spark must run to answer as the product defines the
  statement (its two documented text rules);
- :func:`run_case`: one statement through Spark and through the session, classified.
"""

from __future__ import annotations

import decimal
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipelines import SqlError
from pipelines.sql.plan_guard import DENIED_FUNCTIONS, DENIED_TABLE_FUNCTIONS

__all__ = [
    "BOUNDARY", "CORPUS_B", "DENIED_NOT_REFUSED", "DENIED_REFUSED", "DIFFERENT",
    "DIFFERENT_NAMES", "FAILURES", "ISSUE_TABLE", "LITERALS", "NONDETERMINISTIC", "OTHER_ERROR",
    "PRODUCT_RULE", "REFUSED_BY_BOUNDARY", "SAME", "SPARK_FAILS", "TO_CHAR", "UNSUPPORTED_TYPE",
    "Answer", "Case", "answer", "builtin_examples", "denied_function", "example_statements",
    "reference_text", "report", "run_case", "run_cases", "session_error", "spark_answer",
    "spark_side", "stored_types",
]  # fmt: skip

# Outcomes of one statement.
SAME = "SAME"
DIFFERENT = "DIFFERENT"  # a failure: the session answers something else than Spark
DIFFERENT_NAMES = "DIFFERENT_NAMES"  # a failure: the same values, columns named otherwise
OTHER_ERROR = "OTHER_ERROR"  # a failure: Spark answers, the session raises (not the boundary)
REFUSED_BY_BOUNDARY = "REFUSED_BY_BOUNDARY"  # allowed: SqlError STATEMENT_NOT_ALLOWED
DENIED_REFUSED = "DENIED_REFUSED"  # a refused function, refused by the boundary: as designed
DENIED_NOT_REFUSED = "DENIED_NOT_REFUSED"  # a failure: a refused function was not refused so
SPARK_FAILS = "SPARK_FAILS"  # skipped: Spark itself does not answer the text
NONDETERMINISTIC = "NONDETERMINISTIC"  # skipped: two answers of Spark may differ
PRODUCT_RULE = "PRODUCT_RULE"  # skipped: a documented text rule gives it another meaning
UNSUPPORTED_TYPE = "UNSUPPORTED_TYPE"  # allowed (tables only): a type a table cannot store
FAILURES = (DIFFERENT, DIFFERENT_NAMES, OTHER_ERROR, DENIED_NOT_REFUSED)

#: The only error code by which the session may refuse a statement Spark answers.
BOUNDARY = "STATEMENT_NOT_ALLOWED"

#: Functions of the moment: Spark's analyzed plan calls them deterministic (they become
#: literals when the query starts), but two runs answer differently. Spark's own
#: nondeterministic functions (rand, uuid, shuffle, ...) are found on the analyzed plan.
_MOMENT = re.compile(
    r"\b(?:current_timestamp|now|localtimestamp|localtime|current_time|current_date|curdate)\b"
    r"|\bunix_timestamp\s*\(\s*\)",
    re.I,
)
_DENIED = re.compile(
    r"\b(" + "|".join(sorted({*DENIED_FUNCTIONS, *DENIED_TABLE_FUNCTIONS}, key=len, reverse=True))
    + r")\s*\(",
    re.I,
)  # fmt: skip


# Corpus A: Spark's documented examples


def example_statements(examples: str) -> list[str]:
    """The ``> SELECT ...;`` statements of one function's ``Examples:`` text, without the
    ``;``. A statement starts on a ``>`` line and goes on over the following lines (which
    start with spaces and no ``>``) up to the line that ends with ``;``; the lines after it
    up to the next ``>`` are its expected output. ``SET`` statements are left out (a
    session does not run them): the examples after one run on the default settings."""
    found: list[str] = []
    current: list[str] | None = None
    for line in examples.splitlines():
        start = re.match(r"\s*> ?(.*)$", line)
        if current is None:
            if start is None:
                continue
            current = [start.group(1).strip()]
        else:
            current.append(line.rstrip())
        if current[-1].endswith(";"):
            text = "\n".join(current)[:-1].rstrip()
            current = None
            if re.match(r"(?:SELECT|WITH|VALUES|FROM)\b", text, re.I):
                found.append(text)
    return found


def builtin_examples(spark: Any) -> list[tuple[str, str]]:
    """``(function, statement)`` for every documented example statement of every built-in
    function Spark registers, in the registry's order of names (sorted), each statement
    once (the first function that documents it)."""
    registry = spark._jsparkSession.sessionState().functionRegistry()
    functions = registry.listFunction().iterator()
    documented: dict[str, str] = {}
    while functions.hasNext():
        identifier = functions.next()
        info = registry.lookupFunction(identifier)
        if info.isDefined():
            documented[identifier.funcName()] = info.get().getExamples() or ""
    seen: set[str] = set()
    cases = []
    for name in sorted(documented):
        for statement in example_statements(documented[name]):
            if statement not in seen:
                seen.add(statement)
                cases.append((name, statement))
    return cases


# Corpus B: literals, operators and constructs

#: The table of issue 30: statements whose regenerated text changed Spark's answer.
ISSUE_TABLE = [
    "SELECT to_char(date'2016-04-08', 'y')",
    "SELECT to_char(12454, '99G999')",
    r"SELECT '\u0041'",
    "SELECT 1.50BD",
    "SELECT string_agg(col) FROM VALUES ('a'), ('b') AS t(col)",
    "SELECT max_by(x, y, 2) FROM VALUES ('a', 10), ('b', 50), ('c', 20) AS t(x, y)",
    "SELECT instr('abcabc', 'b', 1, 2)",
    "SELECT percentile_cont(0.25) WITHIN GROUP (ORDER BY col) FROM VALUES (0), (10) AS t(col)",
    """SELECT parse_json('{"a":1}')""",
    "SELECT 3 >>> 1",
    "SELECT unix_date(DATE('1970-01-02'))",
    """SELECT variant_get(parse_json('{"a": 1}'), '$.a', 'int')""",
]

LITERALS = [
    *ISSUE_TABLE,
    # string escapes (Spark's backslash escapes are kept; '' inside a string is one quote)
    r"SELECT '\u0041\u0042'",
    r"SELECT '\U0001F600'",
    r"SELECT 'a\nb'",
    r"SELECT 'a\tb'",
    r"SELECT 'a\\b'",
    r"SELECT 'it\'s'",
    r"SELECT 'a\%b', 'a\_b'",
    r"SELECT '\101'",
    r"SELECT 'a\zb'",
    r"SELECT length('\n'), length('\\n')",
    "SELECT 'it''s'",
    "SELECT 'a''''b'",
    "SELECT ''",
    "SELECT '', length('')",
    "SELECT concat('', 'x', '')",
    "SELECT 'don''t', length('don''t')",
    "SELECT r'\\n', length(r'\\n')",
    "SELECT R'a\\tb'",
    "SELECT 'a' 'b'",
    "SELECT 'semi;colon', '--not a comment', '/* nor this */'",
    "SELECT 'x' -- a comment\n",
    "SELECT /* a comment */ 'x'",
    "SELECT upper('ß'), lower('İ'), length('😀')",
    # typed literals
    "SELECT DATE '2024-02-29'",
    "SELECT date'2016-04-08' + 1",
    "SELECT TIMESTAMP '2024-02-29 12:34:56.123456'",
    "SELECT TIMESTAMP '2024-02-29 12:34:56+02:00'",
    "SELECT TIMESTAMP_NTZ '2024-02-29 12:34:56.5'",
    "SELECT TIMESTAMP_LTZ '2024-02-29 12:34:56'",
    "SELECT TIME '12:34:56.789'",
    "SELECT TIME '23:59:59.999999' > TIME '00:00'",
    "SELECT X'0A1B', hex(X'0A1B'), length(X'')",
    "SELECT x'537061726b'",
    "SELECT 1.50BD, 0.0BD, -12345678901234567890.123BD",
    "SELECT 1.50bd + 1",
    "SELECT 1Y, 1S, 1L, 127Y",
    "SELECT typeof(1Y), typeof(1S), typeof(1L), typeof(1.5D), typeof(1.5F), typeof(1E10)",
    "SELECT 1.5D, 1.5F, 1E10, 1e-3, 1.5e2D, .5, 5.",
    "SELECT 9223372036854775807, 9223372036854775808, -2147483648",
    "SELECT 1.0, 1.00, 123.456, 0.000001",
    "SELECT typeof(1.0), typeof(123.456), typeof(0.1 + 0.2)",
    "SELECT 0.1 + 0.2, 1/3, 1.0/3, 10 div 3, -7 div 2, 7 % 3, -7 % 3, mod(-7, 3), pmod(-7, 3)",
    "SELECT TRUE, FALSE, NULL, typeof(NULL)",
    "SELECT CAST('1.50' AS DECIMAL(5, 2)), CAST(1.555 AS DECIMAL(4, 2))",
    "SELECT CAST('2024-01-01' AS TIMESTAMP), CAST(1 AS BOOLEAN), CAST('abc' AS BINARY)",
    "SELECT '12'::int + 1, 1.5::string, '2024-01-01'::date",
    "SELECT try_cast('x' AS INT), try_cast('12' AS INT)",
    "SELECT CAST(1e20 AS DECIMAL(38, 0))",
    "SELECT double('NaN'), float('Infinity'), double('-inf'), double('NaN') = double('NaN')",
    "SELECT CAST('NaN' AS DOUBLE), CAST('NaN' AS DOUBLE) IN (CAST('NaN' AS DOUBLE))",
    # intervals
    "SELECT INTERVAL '1' DAY",
    "SELECT INTERVAL '1-2' YEAR TO MONTH",
    "SELECT INTERVAL 3 HOURS",
    "SELECT INTERVAL '1 2:03:04.5' DAY TO SECOND",
    "SELECT INTERVAL 1 YEAR 2 MONTHS",
    "SELECT INTERVAL '10' MINUTE, INTERVAL -1 DAY",
    "SELECT DATE '2024-01-31' + INTERVAL '1' MONTH",
    "SELECT TIMESTAMP '2024-01-01 00:00:00' + INTERVAL 90 MINUTES",
    "SELECT TIMESTAMP '2024-01-02 00:00:00' - TIMESTAMP '2024-01-01 12:00:00'",
    "SELECT DATE '2024-03-01' - DATE '2024-02-01'",
    "SELECT make_interval(1, 2, 3, 4, 5, 6, 7.5)",
    # operators
    "SELECT 3 >>> 1, -8 >>> 1, -8 >> 1, 1 << 2, 5 & 3, 5 | 3, 5 ^ 3, ~5",
    "SELECT shiftrightunsigned(-8, 1), shiftleft(1, 2)",
    "SELECT 'a' || 'b' || 1, concat('a', NULL), 'a' || NULL",
    "SELECT NULL <=> NULL, 1 <=> NULL, NULL = NULL, 1 != 2, 1 <> 2, NOT 1 = 2, ! true",
    "SELECT 5 div 2, 5 / 2, 5 % 2, -5 % 2, 2 * 3 + 4, 2 * (3 + 4), - (1 + 2)",
    "SELECT 1 IN (1, 2), 3 NOT IN (1, 2), 2 BETWEEN 1 AND 3, 'ab' LIKE 'a%', 'ab' RLIKE '^a'",
    "SELECT 'a_c' LIKE 'a\\_c', 'abc' ILIKE 'A%', 'a%' LIKE 'a!%' ESCAPE '!'",
    "SELECT 'abc' LIKE ANY ('a%', 'x%'), 'abc' LIKE ALL ('a%', '%c')",
    "SELECT 1 IS DISTINCT FROM NULL, NULL IS NOT DISTINCT FROM NULL, 1 IS NULL, TRUE IS TRUE",
    "SELECT CASE WHEN 1 > 0 THEN 'yes' ELSE 'no' END, CASE 2 WHEN 1 THEN 'a' WHEN 2 THEN 'b' END",
    "SELECT IF(1 > 0, 'a', 'b'), nvl(NULL, 1), coalesce(NULL, NULL, 3), nullif(1, 1)",
    "SELECT array(1, 2, 3)[0], map('a', 1)['a'], named_struct('a', 1).a, struct(1 AS a).a",
    "SELECT element_at(array(1, 2), -1), try_element_at(array(1), 5)",
    # VALUES, tables of literals, set operations, subqueries
    "SELECT x FROM VALUES (1), (2), (3) AS t(x)",
    "SELECT x, y FROM VALUES (1, 'a'), (2, 'b') AS t(x, y) ORDER BY x DESC",
    "SELECT * FROM VALUES (1, 2) AS t(a, b)",
    "SELECT col1, col2 FROM VALUES (1, 'x')",
    "VALUES (1, 'a'), (2, 'b')",
    "SELECT * FROM (VALUES (1), (2)) AS t(x) WHERE x > 1",
    "SELECT sum(x), count(*), avg(x) FROM VALUES (1), (2), (NULL) AS t(x)",
    "SELECT x, count(*) FROM VALUES (1), (1), (2) AS t(x) GROUP BY x HAVING count(*) > 1",
    "SELECT x FROM VALUES (3), (1), (2) AS t(x) ORDER BY x NULLS LAST LIMIT 2 OFFSET 1",
    "SELECT 1 UNION ALL SELECT 2 UNION SELECT 2",
    "SELECT 1 INTERSECT SELECT 1",
    "SELECT 1 EXCEPT SELECT 2",
    "SELECT (SELECT max(x) FROM VALUES (1), (5) AS t(x)) + 1",
    "WITH a AS (SELECT 1 AS x), b AS (SELECT x + 1 AS y FROM a) SELECT * FROM a, b",
    "SELECT * FROM range(3)",
    "SELECT id FROM range(1, 10, 3)",
    "SELECT explode(array(1, 2)) AS x",
    "SELECT posexplode(array('a', 'b'))",
    "SELECT * FROM VALUES (array(1, 2)) AS t(a) LATERAL VIEW explode(a) e AS v",
    "SELECT x, row_number() OVER (ORDER BY x DESC) FROM VALUES (1), (2), (3) AS t(x)",
    "SELECT x, sum(x) OVER (ORDER BY x ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) "
    "FROM VALUES (1), (2), (3) AS t(x)",
    "SELECT x, lag(x, 1, 0) OVER (ORDER BY x), lead(x) OVER (ORDER BY x) "
    "FROM VALUES (1), (2), (3) AS t(x)",
    "SELECT x FROM VALUES (1), (2), (3) AS t(x) QUALIFY row_number() OVER (ORDER BY x) = 1",
    "SELECT max(x) FILTER (WHERE x < 3) FROM VALUES (1), (2), (3) AS t(x)",
    "SELECT count(DISTINCT x) FROM VALUES (1), (1), (2) AS t(x)",
    "SELECT x, count(*) FROM VALUES (1), (2) AS t(x) GROUP BY ALL",
    "SELECT a, b, sum(c) FROM VALUES (1, 2, 3), (1, 3, 4) AS t(a, b, c) GROUP BY ROLLUP(a, b)",
    "SELECT a, sum(c) FROM VALUES (1, 2, 3), (1, 3, 4) AS t(a, b, c) GROUP BY CUBE(a)",
    "SELECT * FROM VALUES (1, 'a'), (1, 'b') AS t(k, v) PIVOT (count(*) FOR v IN ('a', 'b'))",
    # lambdas
    "SELECT transform(array(1, 2, 3), x -> x * 10)",
    "SELECT transform(array(1, 2, 3), (x, i) -> x + i)",
    "SELECT filter(array(1, 2, 3, 4), x -> x % 2 = 0)",
    "SELECT aggregate(array(1, 2, 3), 0, (acc, x) -> acc + x, acc -> acc * 10)",
    "SELECT exists(array(1, 2), x -> x > 1), forall(array(1, 2), x -> x > 0)",
    "SELECT zip_with(array(1, 2), array(3, 4), (a, b) -> a * b)",
    "SELECT map_filter(map(1, 'a', 2, 'b'), (k, v) -> k > 1)",
    "SELECT array_sort(array(3, 1, 2), (l, r) -> r - l)",
    "SELECT reduce(array(1, 2, 3), 0, (s, x) -> s + x)",
    # struct field names
    "SELECT to_json(named_struct('a', 1))",
    "SELECT struct(1 AS a)",
    "SELECT struct(1 AS a, 'x' AS Bb)",
    "SELECT to_json(struct(1 AS a, 'x' AS Bb))",
    "SELECT named_struct('Mixed', 1, 'lower', 2)",
    "SELECT to_json(named_struct('a', named_struct('B', 2)))",
    "SELECT struct(x, y) FROM VALUES (1, 'a') AS t(x, y)",
    "SELECT to_json(struct(x, y)) FROM VALUES (1, 'a') AS t(x, y)",
    "SELECT to_json(map('k', array(1, 2)))",
    "SELECT from_json('{\"a\": 1, \"B\": 2}', 'a INT, B INT')",
    "SELECT schema_of_json('[{\"col\":0}]')",
    "SELECT inline(array(struct(1 AS a, 'x' AS b)))",
    # variants
    'SELECT parse_json(\'{"a": {"b": [1, 2]}}\')',
    "SELECT typeof(parse_json('1'))",
    "SELECT variant_get(parse_json('{\"a\": {\"b\": [1, 2]}}'), '$.a.b[1]', 'int')",
    "SELECT parse_json('{\"a\": 1}'):a",
    'SELECT to_json(parse_json(\'{"b": 1, "a": 2}\'))',
    "SELECT try_variant_get(parse_json('{\"a\": \"x\"}'), '$.a', 'int')",
    "SELECT schema_of_variant(parse_json('{\"a\": 1.5}'))",
    "SELECT is_variant_null(parse_json('null'))",
    # aggregates and functions a dialect rewrite renames or reorders
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY col DESC) "
    "FROM VALUES (0), (10), (30) AS t(col)",
    "SELECT percentile_disc(0.25) WITHIN GROUP (ORDER BY col) FROM VALUES (0), (10) AS t(col)",
    "SELECT percentile(col, 0.25), median(col) FROM VALUES (0), (10) AS t(col)",
    "SELECT string_agg(col, '-') FROM VALUES ('a'), ('b') AS t(col)",
    "SELECT listagg(col) WITHIN GROUP (ORDER BY col DESC) FROM VALUES ('a'), ('b') AS t(col)",
    "SELECT array_agg(col) FROM VALUES (1), (2) AS t(col)",
    "SELECT collect_set(col) FROM VALUES (1), (1) AS t(col)",
    "SELECT min_by(x, y, 2) FROM VALUES ('a', 10), ('b', 50), ('c', 20) AS t(x, y)",
    "SELECT max_by(x, y) FROM VALUES ('a', 10), ('b', 50), ('c', 20) AS t(x, y)",
    "SELECT count_if(x > 1), bool_and(x > 0), bool_or(x > 2), any_value(x) "
    "FROM VALUES (1), (2) AS t(x)",
    "SELECT approx_count_distinct(x), stddev(x), variance(x), corr(x, x) "
    "FROM VALUES (1), (2), (4) AS t(x)",
    "SELECT instr('abcabc', 'b'), instr('abcabc', 'b', 1, 2), instr('abcabc', 'b', -1, 1)",
    "SELECT locate('b', 'abcabc', 3), position('b' IN 'abcabc')",
    "SELECT substr('abcdef', 2, 3), substring('abcdef' FROM 2 FOR 3), left('abc', 2), right('abc', 2)",
    "SELECT trim(BOTH 'x' FROM 'xxaxx'), trim(LEADING FROM '  a'), ltrim('xxa', 'x'), rtrim('a  ')",
    "SELECT split('a,b,c', ','), split_part('a,b,c', ',', 2), regexp_extract('a1b22', '(\\\\d+)', 1)",
    "SELECT regexp_replace('a1b22', '\\\\d+', '#'), replace('aaa', 'a', 'b'), translate('abc', 'ab', 'xy')",
    "SELECT lpad('7', 3, '0'), rpad('7', 3, '*'), repeat('ab', 3), reverse('abc'), initcap('hello world')",
    "SELECT concat_ws('-', 'a', NULL, 'b'), format_number(12345.678, 2), printf('%05d', 42)",
    "SELECT date_format(DATE '2016-04-08', 'y'), date_format(TIMESTAMP '2016-04-08 13:05:00', 'HH:mm')",
    "SELECT to_date('2016-12-31', 'yyyy-MM-dd'), to_timestamp('2016-12-31 00:12:00')",
    "SELECT date_add(DATE '2024-01-31', 1), dateadd(DAY, 1, DATE '2024-01-31'), "
    "add_months(DATE '2024-01-31', 1)",
    "SELECT datediff(DATE '2024-03-01', DATE '2024-02-01'), "
    "date_diff(DAY, DATE '2024-02-01', DATE '2024-03-01')",
    "SELECT timestampadd(HOUR, 2, TIMESTAMP '2024-01-01 00:00:00'), "
    "timestampdiff(MINUTE, TIMESTAMP '2024-01-01 00:00:00', TIMESTAMP '2024-01-01 02:00:00')",
    "SELECT date_trunc('MONTH', TIMESTAMP '2024-02-29 12:00:00'), trunc(DATE '2024-02-29', 'YEAR')",
    "SELECT extract(YEAR FROM DATE '2024-02-29'), date_part('doy', DATE '2024-02-29'), "
    "dayofweek(DATE '2024-02-29')",
    "SELECT last_day(DATE '2024-02-10'), next_day(DATE '2024-02-10', 'MO'), "
    "months_between(DATE '2024-03-31', DATE '2024-02-29')",
    "SELECT unix_date(DATE '1970-01-02'), unix_seconds(TIMESTAMP '1970-01-01 00:00:01Z'), "
    "date_from_unix_date(1), timestamp_seconds(1)",
    "SELECT from_unixtime(0), from_unixtime(0, 'yyyy'), from_utc_timestamp(TIMESTAMP '2024-01-01 00:00:00', 'Asia/Tokyo')",
    "SELECT make_date(2024, 2, 29), make_timestamp(2024, 2, 29, 1, 2, 3.5)",
    "SELECT round(2.5), round(-2.5), bround(2.5), round(1.2345, 2), ceil(1.2), floor(-1.2), ceil(1.234, 1)",
    "SELECT sign(-3), abs(-3), power(2, 10), sqrt(2), ln(1), log(10, 100), log10(100)",
    "SELECT greatest(1, 3, 2), least(1, 3, 2), width_bucket(5.3, 0.2, 10.6, 5)",
    "SELECT hash('a'), xxhash64('a'), md5('a'), sha1('a'), sha2('a', 256), crc32('a')",
    "SELECT base64('Spark'), unbase64('U3Bhcms='), hex(17), unhex('11'), conv('100', 2, 10)",
    "SELECT encode('abc', 'utf-8'), decode(encode('abc', 'utf-8'), 'utf-8'), decode(2, 1, 'a', 2, 'b', 'c')",
    "SELECT array_contains(array(1, 2), 2), array_distinct(array(1, 1, 2)), array_join(array('a', 'b'), '/')",
    "SELECT sequence(1, 5, 2), slice(array(1, 2, 3, 4), 2, 2), flatten(array(array(1), array(2, 3)))",
    "SELECT map_keys(map('a', 1)), map_values(map('a', 1)), map_from_arrays(array('a'), array(1))",
    "SELECT size(array(1, 2)), cardinality(map('a', 1)), size(NULL)",
    "SELECT equal_null(NULL, NULL), ifnull(NULL, 2), nvl2(NULL, 1, 2), zeroifnull(NULL), nullifzero(0)",
    "SELECT typeof(1 + 1L), typeof(1 + 1.5), typeof(1 / 2), typeof(5 div 2)",
]

# to_char formats: numbers, dates and binary
TO_CHAR = [
    "SELECT to_char(454, '999')",
    "SELECT to_char(454.00, '000D00')",
    "SELECT to_char(12454, '99G999')",
    "SELECT to_char(78.12, '$99.99')",
    "SELECT to_char(-12454.8, '99G999D9S')",
    "SELECT to_char(12454.8, 'S99G999D9')",
    "SELECT to_char(-12454.8, '99G999D9MI')",
    "SELECT to_char(-12454.8, '99G999D9PR')",
    "SELECT to_char(12, '0999')",
    "SELECT to_varchar(12454, '99,999')",
    "SELECT to_char(date'2016-04-08', 'y')",
    "SELECT to_char(DATE '2016-04-08', 'yyyy-MM-dd')",
    "SELECT to_char(DATE '2016-04-08', 'dd/MM/yy')",
    "SELECT to_char(TIMESTAMP '2016-04-08 13:05:09', 'yyyy-MM-dd HH:mm:ss')",
    "SELECT to_char(TIMESTAMP '2016-04-08 13:05:09', 'EEEE MMM d, h a')",
    "SELECT to_char(x'537061726b2053514c', 'base64')",
    "SELECT to_char(x'537061726b2053514c', 'hex')",
    "SELECT to_char(encode('abc', 'utf-8'), 'utf-8')",
    "SELECT to_number('$78.12', '$99.99'), to_number('12,454', '99G999'), try_to_number('x', '9')",
]

CORPUS_B = list(dict.fromkeys([*LITERALS, *TO_CHAR]))


# The product's text rules


_LITERAL = re.compile(r"'(?:\\.|''|[^'\\])*'?|\"(?:[^\"]|\"\")*\"?|`(?:[^`]|``)*`?", re.S)


def reference_text(text: str) -> str:
    """The text Spark must run to give the statement the meaning the product defines
    (docs: the SQL reference; pipelines.sql.statements.spark_sql_text): ``''`` inside a
    string literal is one quote (Snowflake's rule, where Spark would end the literal and
    concatenate the next), and ``"double quoted"`` is an identifier (where Spark reads a
    string). Written here independently of the code under test."""
    out: list[str] = []
    position = 0
    for literal in _LITERAL.finditer(text):
        out.append(text[position : literal.start()])
        token = literal.group(0)
        if token.startswith('"') and len(token) > 1 and token.endswith('"'):
            token = "`" + token[1:-1].replace('""', '"').replace("`", "``") + "`"
        elif token.startswith("'") and len(token) > 1 and token.endswith("'"):
            token = "'" + re.sub(r"\\.|''", lambda m: "\\'" if m.group(0) == "''" else m.group(0),
                                 token[1:-1], flags=re.S) + "'"  # fmt: skip
        out.append(token)
        position = literal.end()
    out.append(text[position:])
    return "".join(out)


def denied_function(text: str) -> str | None:
    """The refused function (plan_guard's lists) a statement calls, if any."""
    found = _DENIED.search(_LITERAL.sub("''", text))
    return found.group(1).lower() if found else None


# Answers and their comparison


def _value(value: Any) -> Any:
    """A value of a collected row in a form ``==`` and ``repr`` compare exactly: NaN
    equals NaN, a decimal keeps its scale, a map's entries are sorted, a variant is its
    JSON text."""
    from pyspark.sql import Row
    from pyspark.sql.types import VariantVal

    if isinstance(value, Row):
        return tuple(_value(v) for v in value)
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value
    if isinstance(value, decimal.Decimal):
        return ("decimal", str(value))
    if isinstance(value, (list, tuple)):
        return [_value(v) for v in value]
    if isinstance(value, dict):
        return ("map", sorted(((_value(k), _value(v)) for k, v in value.items()), key=repr))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, VariantVal):
        return ("variant", value.toJson())
    return value


@dataclass
class Answer:
    """A statement's answer: its columns' names (case-folded), types (``simpleString``)
    and rows (sorted: a query without ORDER BY has no order).

    Names are compared without case (Unicode case folding: ``UPPER('ß')`` upper-cased is
    ``UPPER('SS')``): the product upper-cases the names of unquoted output columns
    (Snowflake's rule), which is not a different answer; any other difference in a name
    (Spark names an expression's column by the expression it ran) is."""

    names: list[str]
    types: list[str]
    rows: list[Any]

    def show(self, limit: int = 300) -> str:
        text = f"{self.rows!r} {self.types} named {self.names}"
        return text if len(text) <= limit else text[: limit - 3] + "..."

    def outcome(self, spark: Answer) -> str:
        """SAME, DIFFERENT or DIFFERENT_NAMES: this answer (the session's) against Spark's."""
        if (self.rows, self.types) != (spark.rows, spark.types):
            return DIFFERENT
        return SAME if self.names == spark.names else DIFFERENT_NAMES


def answer(frame: Any) -> Answer:
    """The :class:`Answer` of a DataFrame. Values PySpark cannot convert (year-month and
    calendar intervals, time) are compared as Spark's JSON text of each row."""
    from pyspark.errors import PySparkNotImplementedError

    fields = frame.schema.fields
    try:
        rows = [tuple(_value(v) for v in row) for row in frame.collect()]
    except PySparkNotImplementedError:
        # Spark's JSON of each row, read back as the list of its values (its keys are the
        # column names, compared apart).
        lines = frame._jdf.toJSON().collectAsList()
        rows = [("json", *json.loads(line, object_pairs_hook=lambda pairs: [v for _, v in pairs]))
                for line in lines]  # fmt: skip
    return Answer([field.name.casefold() for field in fields],
                  [field.dataType.simpleString() for field in fields],
                  sorted(rows, key=repr))  # fmt: skip


def spark_answer(spark: Any, text: str) -> tuple[Answer | None, bool, str]:
    """Spark's answer to the text, whether it may change from run to run (a
    nondeterministic expression in the analyzed plan, or a function of the moment), and
    Spark's error when it does not answer (then the answer is None)."""
    try:
        frame = spark.sql(text)
        deterministic = bool(frame._jdf.queryExecution().analyzed().deterministic())
        moment = _MOMENT.search(_LITERAL.sub("''", text))
        return answer(frame), not deterministic or moment is not None, ""
    except Exception as exc:
        return None, False, _first_line(exc)


def _first_line(exc: BaseException) -> str:
    """The error's class and first line (a Java error's own, under py4j's)."""
    lines = [line.lstrip(": ") for line in str(exc).strip().splitlines()]
    if len(lines) > 1 and lines[0].startswith("An error occurred while calling"):
        lines = lines[1:]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


@dataclass
class Case:
    """One statement's outcome."""

    statement: str
    outcome: str
    ours: str = ""
    spark: str = ""
    function: str = ""
    code: str = ""  # the session's error code, when it raised
    expected: Answer | None = None  # Spark's answer, when it answered

    def line(self) -> str:
        where = f"[{self.function}] " if self.function else ""
        return (f"{self.outcome} {where}{self.statement!r}\n"
                f"    ours:  {self.ours}\n    spark: {self.spark}")  # fmt: skip


def session_error(exc: BaseException) -> tuple[str, str]:
    """The error code and message of the session's error (a non-SqlError is a crash:
    its class name stands for the code)."""
    code = exc.code if isinstance(exc, SqlError) else type(exc).__name__
    return code, f"{code}: {str(exc).strip()[:250]}"


SparkSide = tuple["Answer | None", bool, str]


def spark_side(spark: Any, statement: str) -> SparkSide | None:
    """Spark's part of :func:`run_case` (it may run ahead, in another thread): Spark's
    answer to the statement as the product reads it; None for a refused function's
    statement, which Spark is not asked (it would read files, call into the JVM, ...)."""
    if denied_function(statement) is not None:
        return None
    return spark_answer(spark, reference_text(statement))


def run_cases(spark: Any, session: Any, statements: list[tuple[str, str]]) -> list[Case]:
    """:func:`run_case` of each ``(function, statement)``, Spark's answers computed in a
    second thread ahead of the session's (Spark runs queries of two threads at once)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="spark-answers") as pool:
        ahead = [pool.submit(spark_side, spark, statement) for _, statement in statements]
        return [run_case(spark, session, statement, function, future.result())
                for (function, statement), future in zip(statements, ahead, strict=True)]  # fmt: skip


def run_case(
    spark: Any, session: Any, statement: str, function: str = "",
    computed: SparkSide | None = None,
) -> Case:  # fmt: skip
    """Run one statement through Spark (unless ``computed`` gives :func:`spark_side`) and
    through the session, and classify it."""
    denied = denied_function(statement)
    if denied is not None:
        # Spark is not asked: the session must refuse the statement at its boundary.
        try:
            ours = answer(session.sql(statement)).show()
        except Exception as exc:
            code, message = session_error(exc)
            outcome = DENIED_REFUSED if code == BOUNDARY else DENIED_NOT_REFUSED
            return Case(statement, outcome, message, f"(not run: {denied} is refused)",
                        function, code)  # fmt: skip
        return Case(statement, DENIED_NOT_REFUSED, ours, f"(not run: {denied} is refused)",
                    function)  # fmt: skip
    reference = reference_text(statement)
    expected, varies, spark_error = computed or spark_answer(spark, reference)
    if expected is None:
        outcome = PRODUCT_RULE if reference != statement else SPARK_FAILS
        return Case(statement, outcome, "", spark_error, function)
    if varies:
        return Case(statement, NONDETERMINISTIC, "", expected.show(), function, expected=expected)
    try:
        ours = answer(session.sql(statement))
    except Exception as exc:
        code, message = session_error(exc)
        outcome = REFUSED_BY_BOUNDARY if code == BOUNDARY else OTHER_ERROR
        return Case(statement, outcome, message, expected.show(), function, code, expected)
    outcome = ours.outcome(expected)
    if outcome == DIFFERENT:
        # Spark asked again: an answer that changes between two of its own runs is not
        # ours to match (an aggregate's order of a collected list, a seed-less function).
        again, _, _ = spark_answer(spark, reference)
        if again != expected:
            outcome = NONDETERMINISTIC
    return Case(statement, outcome, ours.show(), expected.show(), function, expected=expected)


def report(title: str, cases: list[Case], listed: tuple[str, ...] = ()) -> str:
    """A summary of the outcomes, every failure, and the cases of ``listed`` outcomes."""
    counts = Counter(case.outcome for case in cases)
    lines = [f"{title}: {len(cases)} statements: "
             + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]  # fmt: skip
    for outcome in (*FAILURES, *listed):
        chosen = [case for case in cases if case.outcome == outcome]
        if chosen:
            lines.append(f"--- {outcome} ({len(chosen)})")
            lines.extend(case.line() for case in chosen)
    return "\n".join(lines)


def stored_types(types: list[str]) -> bool:
    """Whether a table can store columns of these types (no maps, structs, variants,
    intervals, ...): the only results a dynamic table is asked to hold in the sample."""
    plain = re.compile(
        r"(?:boolean|tinyint|smallint|int|bigint|float|double|string|binary|date|"
        r"timestamp|timestamp_ntz|decimal\(\d+,\d+\)|void)$"
    )
    return all(plain.match(kind) for kind in types)
