"""Draw up the allowlist of Spark plan and expression classes (``pipelines/sql/plan_classes.py``).

``python tools/draw_plan_classes.py`` analyses (never runs) two sets of statements in a
local Spark and writes every class their analyzed plans hold:

1. the documented examples of every built-in SQL function and table function Spark
   registers, less those :data:`pipelines.sql.plan_guard.DENIED_FUNCTIONS` and
   :data:`~pipelines.sql.plan_guard.DENIED_TABLE_FUNCTIONS` refuse;
2. a corpus of query constructs (joins, set operations, subqueries, windows, CTEs,
   generators, PIVOT, sampling, hints, literals of every type, lambdas), below. It also
   holds what Spark's grammar spells without a registered function, whose classes no
   function's example shows: the unit forms ``dateadd(DAY, 1, d)`` and
   ``datediff(DAY, d, e)``, ``LIKE ALL`` / ``NOT LIKE ANY``, ``extract`` of each
   field, interval arithmetic, ``VALUES`` rows computed when the query runs (``now()``),
   ``UNNEST``, ``JSON_TABLE`` and ``NEAREST BY`` joins. A statement Spark answers that
   the guard refuses for a harmless class is closed by an example here.

From that set it removes the classes of the denied functions, relations (only the
binder's own views may be read, checked separately) and commands. Run it again after a
Spark upgrade and review the diff: a class the list does not hold is refused.
"""

from __future__ import annotations

import datetime
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flush.spark_tables import spark_session
from pipelines.sql.plan_guard import DENIED_FUNCTIONS, DENIED_TABLE_FUNCTIONS, plan_classes

OUT = Path(__file__).resolve().parents[1] / "pipelines" / "sql" / "plan_classes.py"
NEVER = re.compile(
    r"\.(LogicalRelation|LogicalRDD|DataSourceV2Relation|DataSourceV2ScanRelation|"
    r"HiveTableRelation|InMemoryRelation|View|StreamingRelation\w*|StreamingDataSourceV2\w*|"
    r"ScriptTransformation|\w*Command|InsertIntoDir|InsertIntoStatement|ScalaUDF|ScalaUDAF|"
    r"PythonUDF|PythonUDAF|PythonUDTF|\w*Python\w*)$"
)
CORPUS = """
SELECT a, b FROM t1 WHERE a > 1 ORDER BY a DESC NULLS LAST LIMIT 5 OFFSET 1
SELECT DISTINCT a FROM t1
SELECT a, count(*), sum(c), avg(c), min(b), max(d), count(DISTINCT b) FROM t1 GROUP BY a HAVING count(*) > 1
SELECT a, b, sum(c), grouping(a), grouping_id(a, b) FROM t1 GROUP BY ROLLUP(a, b)
SELECT a, b, sum(c) FROM t1 GROUP BY CUBE(a, b)
SELECT a, b, sum(c) FROM t1 GROUP BY GROUPING SETS ((a), (b), ())
SELECT a, sum(c) FILTER (WHERE c > 0) FROM t1 GROUP BY ALL ORDER BY ALL
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY c), percentile_disc(0.5) WITHIN GROUP (ORDER BY c) FROM t1
SELECT * FROM t1 JOIN t2 ON t1.a = t2.a
SELECT * FROM t1 LEFT JOIN t2 ON t1.a = t2.a AND t2.b IS NOT NULL
SELECT * FROM t1 RIGHT OUTER JOIN t2 USING (a)
SELECT * FROM t1 FULL OUTER JOIN t2 ON t1.a = t2.a
SELECT * FROM t1 LEFT SEMI JOIN t2 ON t1.a = t2.a
SELECT * FROM t1 LEFT ANTI JOIN t2 ON t1.a = t2.a
SELECT * FROM t1 CROSS JOIN t2
SELECT * FROM t1 NATURAL JOIN t2
SELECT * FROM t1, t2 WHERE t1.a = t2.a
SELECT a FROM t1 UNION SELECT a FROM t2
SELECT a FROM t1 UNION ALL SELECT a FROM t2
SELECT a FROM t1 UNION ALL BY NAME SELECT a FROM t2
SELECT a FROM t1 INTERSECT SELECT a FROM t2
SELECT a FROM t1 INTERSECT ALL SELECT a FROM t2
SELECT a FROM t1 EXCEPT SELECT a FROM t2
SELECT a FROM t1 EXCEPT ALL SELECT a FROM t2
SELECT a, (SELECT max(a) FROM t2) FROM t1
SELECT a FROM t1 WHERE a IN (SELECT a FROM t2)
SELECT a FROM t1 WHERE a NOT IN (SELECT a FROM t2)
SELECT a FROM t1 WHERE EXISTS (SELECT 1 FROM t2 WHERE t2.a = t1.a)
SELECT a FROM t1 WHERE NOT EXISTS (SELECT 1 FROM t2 WHERE t2.a = t1.a)
SELECT a, (SELECT count(*) FROM t2 WHERE t2.a = t1.a) FROM t1
SELECT a, a IN (SELECT a FROM t2) FROM t1
SELECT * FROM t1, LATERAL (SELECT t1.a + t2.a AS z FROM t2)
SELECT a, row_number() OVER (PARTITION BY b ORDER BY c), rank() OVER (ORDER BY a), dense_rank() OVER (ORDER BY a) FROM t1
SELECT a, lag(a) OVER (ORDER BY a), lead(a, 2, 0) OVER (ORDER BY a), ntile(2) OVER (ORDER BY a) FROM t1
SELECT a, sum(c) OVER (ORDER BY a ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) FROM t1
SELECT a, sum(c) OVER (ORDER BY a RANGE BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM t1
SELECT a, first_value(b) OVER w, last_value(b) OVER w, nth_value(b, 2) OVER w FROM t1 WINDOW w AS (PARTITION BY a ORDER BY c)
SELECT a, percent_rank() OVER (ORDER BY a), cume_dist() OVER (ORDER BY a) FROM t1
SELECT * FROM (SELECT a, row_number() OVER (PARTITION BY a ORDER BY c) AS r FROM t1) WHERE r = 1
WITH x AS (SELECT a FROM t1), y AS (SELECT a FROM x) SELECT * FROM y JOIN x USING (a)
WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT n FROM r
SELECT a, x FROM t1 LATERAL VIEW explode(arr) e AS x
SELECT a, p, x FROM t1 LATERAL VIEW OUTER posexplode(arr) e AS p, x
SELECT a, k, v FROM t1 LATERAL VIEW explode(m) e AS k, v
SELECT explode(arr), a FROM t1
SELECT inline(array(struct(1, 'a'), struct(2, 'b')))
SELECT * FROM range(10)
SELECT * FROM range(0, 10, 2, 2)
SELECT * FROM explode(array(1, 2))
SELECT * FROM stack(2, 1, 'a', 2, 'b')
SELECT * FROM json_tuple('{"a":1}', 'a')
SELECT * FROM VALUES (1, 'a'), (2, 'b') AS v(x, y)
VALUES (1), (2)
SELECT * FROM t1 PIVOT (sum(c) FOR b IN ('x', 'y'))
SELECT * FROM t2 UNPIVOT (v FOR k IN (a, c))
SELECT * FROM t1 TABLESAMPLE (10 PERCENT)
SELECT * FROM t1 TABLESAMPLE (5 ROWS)
SELECT * FROM t1 TABLESAMPLE (BUCKET 1 OUT OF 4)
SELECT * FROM t1 DISTRIBUTE BY a SORT BY b
SELECT * FROM t1 CLUSTER BY a
SELECT /*+ BROADCAST(t2) */ * FROM t1 JOIN t2 ON t1.a = t2.a
SELECT /*+ MERGE(t2) */ * FROM t1 JOIN t2 ON t1.a = t2.a
SELECT /*+ REPARTITION(2) */ * FROM t1
SELECT /*+ REPARTITION_BY_RANGE(2, a) */ * FROM t1
SELECT /*+ COALESCE(1) */ * FROM t1
SELECT /*+ REBALANCE */ * FROM t1
SELECT CASE WHEN a > 1 THEN 'x' WHEN a < 0 THEN 'y' ELSE 'z' END, CASE a WHEN 1 THEN 2 END, IF(a > 1, 1, 0) FROM t1
SELECT coalesce(a, 0), nullif(a, 1), nvl(b, 'x'), nvl2(b, 1, 2), ifnull(a, 2) FROM t1
SELECT a IN (1, 2, 3), a BETWEEN 1 AND 5, a NOT BETWEEN 1 AND 2, b LIKE 'x%', b ILIKE 'X%', b RLIKE '^x', b LIKE ANY ('a%', 'b%'), b NOT LIKE ALL ('a%') FROM t1
SELECT a IS DISTINCT FROM 1, a IS NOT DISTINCT FROM 2, a <=> 1, a IS NULL, b IS NOT NULL, NOT (a = 1) AND (a <> 2 OR a != 3) FROM t1
SELECT a IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22) FROM t1
SELECT cast(a AS STRING), cast(b AS INT), a::DOUBLE, try_cast(b AS DATE), cast(c AS DECIMAL(10, 2)), cast(e AS DATE), cast(d AS TIMESTAMP), cast(b AS BINARY), cast(a AS BOOLEAN), cast(e AS TIMESTAMP_NTZ) FROM t1
SELECT cast(a AS BIGINT), cast(a AS SMALLINT), cast(a AS TINYINT), cast(c AS FLOAT), cast(arr AS ARRAY<STRING>), cast(s AS STRUCT<x: STRING>), cast(m AS MAP<STRING, STRING>), cast(b AS VARCHAR(10)), cast(b AS CHAR(3)) FROM t1
SELECT DATE '2020-01-01', TIMESTAMP '2020-01-01 00:00:00', TIMESTAMP_NTZ '2020-01-01 00:00:00', INTERVAL '1' DAY, INTERVAL 2 HOURS, INTERVAL '1-2' YEAR TO MONTH, X'00FF', 1.5BD, 1L, 2S, 3Y, 1.5D, 2.5F, 1e10, 123456789012345678901234567890, TRUE, NULL, 'x', array(1, 2), map('a', 1), struct(1 AS x), named_struct('a', 1)
SELECT d + 1, d - 1, e - INTERVAL 1 HOUR, e + INTERVAL '1' DAY, e - e, d - d, d + INTERVAL 1 MONTH, date_add(d, 1), e - INTERVAL '1-1' YEAR TO MONTH FROM t1
SELECT a + 1, a - 1, a * 2, a / 2, a % 2, a DIV 2, -a, +a, ~a, a & 1, a | 1, a ^ 1, a << 1, a >> 1, a >>> 1, c * 1.5, cast(c AS DECIMAL(10,2)) * 2 FROM t1
SELECT s.x, arr[0], m['k'], element_at(arr, 1), element_at(m, 'k'), arr[a], s['x'] FROM t1
SELECT transform(arr, x -> x + 1), filter(arr, x -> x > 1), aggregate(arr, 0, (acc, x) -> acc + x), exists(arr, x -> x > 1), forall(arr, x -> x > 0), transform(arr, (x, i) -> x + i), map_filter(m, (k, v) -> v > 0), zip_with(arr, arr, (x, y) -> x + y) FROM t1
SELECT b || 'x', concat(b, 'y'), upper(b), lower(b), trim(b), substring(b, 1, 2), substr(b FROM 1 FOR 2), position('x' IN b), overlay(b PLACING 'z' FROM 1), trim(BOTH 'x' FROM b), trim(LEADING FROM b), extract(YEAR FROM d), date_part('month', e) FROM t1
SELECT count(*) FROM t1 WHERE a = (SELECT min(a) FROM t2 WHERE t2.b = t1.b)
SELECT a, b COLLATE UTF8_LCASE FROM t1
SELECT * FROM t1 ORDER BY a NULLS FIRST, b DESC
SELECT a FROM t1 GROUP BY a HAVING sum(c) > (SELECT avg(c) FROM t2)
SELECT * FROM (SELECT a FROM t1) AS q(z)
SELECT max_by(b, c), min_by(b, c), collect_list(a), collect_set(b), array_agg(a), any_value(b), count_if(a > 1), bool_and(a > 0), every(a > 0), some(a > 0), stddev(c), variance(c), corr(c, c), approx_count_distinct(a), percentile_approx(c, 0.5), median(c), mode(a), string_agg(b, ','), listagg(b, ',') FROM t1
SELECT a FROM t1 WHERE a = ANY (SELECT a FROM t2)
SELECT a, sum(c) OVER (PARTITION BY a) FROM t1 QUALIFY sum(c) OVER (PARTITION BY a) > 1
FROM t1 |> WHERE a > 1 |> SELECT a, b |> AGGREGATE count(*) GROUP BY a
SELECT * FROM t1 WHERE (a, b) IN (SELECT a, b FROM t2)
SELECT to_json(s), from_json('{"x":1}', 'x INT'), parse_json('{"a":1}'), try_variant_get(parse_json('{"a":1}'), '$.a', 'int'), get_json_object('{"a":1}', '$.a'), schema_of_json('{"a":1}') FROM t1
SELECT current_date(), current_timestamp(), now(), current_timezone(), localtimestamp(), current_database(), current_catalog(), current_schema(), version(), uuid(), rand(1), randn(1), monotonically_increasing_id(), spark_partition_id()
SELECT typeof(a), hash(a), xxhash64(a), md5(b), sha2(b, 256), crc32(b), base64(b), unbase64(b), hex(a), unhex('00') FROM t1
SELECT to_xml(named_struct('a', 1))
SELECT * FROM sql_keywords()
SELECT * FROM collations()
SELECT a FROM t1 WHERE b IN ('x', 'y') AND c > 1.0 AND d > DATE '2020-01-01' AND e < current_timestamp()
SELECT sum(a) OVER (), count(*) OVER (PARTITION BY b) FROM t1
SELECT a FROM t1 LIMIT ALL
SELECT * FROM t1 WHERE a > 1 ORDER BY a LIMIT 3
SELECT 1
SELECT a FROM (SELECT a FROM t1 UNION ALL SELECT a FROM t2) GROUP BY a
SELECT dateadd(MICROSECOND, 5, e), date_add(DAY, 1, d), timestampadd(HOUR, 2, e), dateadd(QUARTER, 1, cast(e AS TIMESTAMP_NTZ)) FROM t1
SELECT datediff(DAY, d, e), date_diff(MONTH, d, e), timestampdiff(SECOND, e, e), timestampdiff(YEAR, cast(e AS TIMESTAMP_NTZ), cast(e AS TIMESTAMP_NTZ)) FROM t1
SELECT b LIKE ALL ('a%', '%b'), b NOT LIKE ANY ('a%', 'b%'), b LIKE SOME ('a%'), b NOT LIKE SOME ('a%'), b ILIKE ALL ('A%'), b NOT ILIKE ANY ('A%'), b NOT ILIKE ALL ('A%'), b ILIKE ANY ('A%') FROM t1
SELECT extract(YEAR FROM e), extract(YEAROFWEEK FROM d), extract(QUARTER FROM e), extract(MONTH FROM d), extract(WEEK FROM e), extract(DAY FROM d), extract(DAYOFWEEK FROM e), extract(DAYOFWEEK_ISO FROM d), extract(DOY FROM e), extract(HOUR FROM e), extract(MINUTE FROM e), extract(SECOND FROM e) FROM t1
SELECT extract(DAY FROM INTERVAL '1 2:03:04' DAY TO SECOND), extract(HOUR FROM INTERVAL '1 2:03:04' DAY TO SECOND), extract(MINUTE FROM INTERVAL '1 2:03:04' DAY TO SECOND), extract(SECOND FROM INTERVAL '1 2:03:04.5' DAY TO SECOND), extract(YEAR FROM INTERVAL '1-2' YEAR TO MONTH), extract(MONTH FROM INTERVAL '1-2' YEAR TO MONTH)
SELECT extract(YEAR FROM make_interval(1, 2, 3, 4, 5, 6, 7.5)), extract(MONTH FROM make_interval(1, 2)), extract(DAY FROM make_interval(0, 0, 1, 2)), extract(HOUR FROM make_interval(0, 0, 0, 0, 5)), extract(MINUTE FROM make_interval(0, 0, 0, 0, 0, 6)), extract(SECOND FROM make_interval(0, 0, 0, 0, 0, 0, 7.5))
SELECT INTERVAL 1 DAY * 2, 2 * INTERVAL '1' HOUR, INTERVAL '1 2:03:04' DAY TO SECOND / 2, INTERVAL '1-2' YEAR TO MONTH * 2, INTERVAL '1' YEAR / 2, -INTERVAL 1 DAY, INTERVAL 1 DAY + INTERVAL 2 HOURS
SELECT make_interval(1, 2, 3, 4, 5, 6, 7) * 2, make_interval(1, 2, 3, 4, 5, 6, 7) / 2, d + make_interval(0, 1, 0, 1), d - make_interval(0, 0, 1), e + make_interval(0, 1, 0, 1, 2) FROM t1
SELECT array(named_struct('x', a, 'y', b)).x, array(s).x FROM t1
SELECT * FROM VALUES (current_date(), now(), 1 + 1, 'a' || 'b') AS v(w, x, y, z)
SELECT * FROM UNNEST(array(1, 2), array('a', 'b')) WITH ORDINALITY AS u(x, y, i)
SELECT * FROM t1, LATERAL UNNEST(t1.arr) AS u(x)
SELECT * FROM JSON_TABLE('{"a": [{"b": 1}, {"b": 2}]}', '$.a[*]' COLUMNS (n FOR ORDINALITY, b INT PATH '$.b', e BOOLEAN EXISTS PATH '$.b') NULL ON ERROR) AS j
SELECT * FROM t1 JOIN t2 EXACT NEAREST 1 BY DISTANCE abs(t1.c - t2.c)
SELECT * FROM t1 LEFT JOIN t2 APPROX NEAREST 2 BY SIMILARITY t1.c * t2.c
"""


def main() -> int:
    spark = spark_session(app_name="draw-plan-classes")
    spark.sparkContext.setLogLevel("ERROR")
    jspark = spark._jsparkSession
    state = jspark.sessionState()
    skip = spark._jvm.org.apache.spark.sql.execution.CommandExecutionMode.SKIP()
    t1 = spark.createDataFrame(
        [(1, "x", 1.5, datetime.date(2020, 1, 1), datetime.datetime(2020, 1, 1), [1, 2],
          {"k": 1}, (1,))],
        "a INT, b STRING, c DOUBLE, d DATE, e TIMESTAMP, arr ARRAY<INT>, m MAP<STRING, INT>, "
        "s STRUCT<x: INT>",
    )  # fmt: skip
    t1.createOrReplaceTempView("t1")
    spark.createDataFrame([(1, "x", 2.0)], "a INT, b STRING, c DOUBLE").createOrReplaceTempView("t2")
    views = {"t1", "t2"}

    statements = [line.strip() for line in CORPUS.strip().splitlines() if line.strip()]
    denied_classes: set[str] = set()
    for registry, denied in ((state.functionRegistry(), DENIED_FUNCTIONS),
                             (state.tableFunctionRegistry(), DENIED_TABLE_FUNCTIONS)):  # fmt: skip
        functions = registry.listFunction().iterator()
        while functions.hasNext():
            identifier = functions.next()
            info = registry.lookupFunction(identifier).get()
            if identifier.funcName() in denied:
                denied_classes.add(info.getClassName())
                continue
            for example in re.findall(r"> (SELECT .*?);\n", info.getExamples() or ""):
                statements.append(example)

    seen: set[str] = set()
    failed = 0
    for text in statements:
        if any(f"{name}(" in text.lower() for name in DENIED_TABLE_FUNCTIONS):
            continue
        try:
            plan = state.executePlan(state.sqlParser().parsePlan(text), skip)
            plan.assertAnalyzed()
            nodes = plan_classes(spark, plan.analyzed(), views)
        except Exception as exc:  # an example that needs a setting we do not use
            failed += 1
            print(f"skipped: {text[:100]} ({str(exc).splitlines()[0][:120]})", file=sys.stderr)
            continue
        seen.update(nodes)
    allowed = sorted(c for c in seen if c not in denied_classes and not NEVER.search(c))
    version = spark.version
    body = "\n".join(f'    "{name}",' for name in allowed)
    OUT.write_text(
        f'"""Spark plan and expression classes a statement may hold (Spark {version}).\n\n'
        "Generated by ``python tools/draw_plan_classes.py`` (see its docstring for how): do not\n"
        "edit by hand. A class not listed here is refused by :mod:`pipelines.sql.plan_guard`.\n"
        '"""\n\n'
        "ALLOWED_CLASSES: frozenset[str] = frozenset(\n    {\n"
        f"{body}\n    }}\n)\n"
    )
    print(f"{len(allowed)} classes from {len(statements) - failed} statements "
          f"({failed} skipped) written to {OUT}")  # fmt: skip
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
