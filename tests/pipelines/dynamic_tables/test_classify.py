"""The refresh class of a query, from Spark's analyzed plan: stateless constructs are
incremental; every other construct is named by its reason code (fails closed)."""

from __future__ import annotations

import pytest

from pipelines import Session
from pipelines.dynamic_tables.classify import REASONS, classify
from pipelines.sql.ddl_queries import query_frame
from pipelines.transactions.transaction import Transaction


@pytest.fixture(scope="module")
def shop(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("classify") / "warehouse", spark=spark)
    for statement in (
        "CREATE TABLE t (a NUMBER, b VARCHAR, c DOUBLE)",
        "CREATE TABLE u (a NUMBER, b VARCHAR, c DOUBLE)",
        "CREATE VIEW tv AS SELECT a, b FROM t WHERE a > 0",
        "CREATE VIEW grouped AS SELECT a, count(*) AS n FROM t GROUP BY a",
        "CREATE VIEW nowv AS SELECT a, TIMESTAMP_NTZ'now' AS n FROM t",
    ):
        session.sql(statement)
    yield session
    session.close()


def verdict(session: Session, query: str) -> tuple[str, ...]:
    txn = Transaction(session.catalog, session.spark, read_only=True)
    try:
        binder, frame = query_frame(session, txn, query, "a dynamic table")
        return classify(session.spark, frame, session.views, binder.time_literals).reasons
    finally:
        session.release_views()


@pytest.mark.parametrize(
    "query",
    [
        "SELECT a, b FROM t",
        "SELECT * FROM t",
        "SELECT a + 1 AS a1, upper(b) AS b, CASE WHEN c > 1 THEN 'x' ELSE 'y' END AS k FROM t",
        "SELECT a, b FROM t WHERE a > 1 AND b LIKE 'x%' AND c IS NOT NULL",
        "SELECT a, b FROM t WHERE a > 1 UNION ALL SELECT a, b FROM u",
        "SELECT a FROM t UNION ALL SELECT a FROM u UNION ALL SELECT a FROM t WHERE a > 5",
        "SELECT x.a FROM (SELECT a, b FROM t WHERE a > 1) AS x WHERE x.b = 'y'",
        "WITH c AS (SELECT a, b FROM t WHERE a > 1) SELECT a FROM c UNION ALL SELECT a FROM c",
        "SELECT a, b FROM tv",
        "SELECT /*+ REPARTITION(4) */ a FROM t",
        "SELECT a FROM t DISTRIBUTE BY a",
        "SELECT cast(a AS STRING) AS s, coalesce(b, 'none') AS b, sha2(b, 256) AS h FROM t",
        # Strings that are not a special datetime value where Spark would read one
        "SELECT a, TIMESTAMP'epoch' AS e, 'now' AS s, DATE'2020-01-01' AS d FROM t "
        "WHERE b = 'today' AND CAST(b AS DATE) IS NULL",
    ],
)
def test_stateless_queries_are_incremental(shop, query):
    assert verdict(shop, query) == ()


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("SELECT a, count(*) AS n FROM t GROUP BY a", "AGGREGATE"),
        ("SELECT sum(a) AS s FROM t", "AGGREGATE"),
        ("SELECT a, n FROM grouped", "AGGREGATE"),  # through a view
        ("SELECT a, b FROM t GROUP BY GROUPING SETS ((a), (b))", "AGGREGATE"),
        ("SELECT t.a FROM t JOIN u ON t.a = u.a", "JOIN"),
        ("SELECT t.a FROM t, u", "JOIN"),
        ("SELECT t.a FROM t LEFT JOIN u ON t.a = u.a", "JOIN"),
        ("SELECT a, row_number() OVER (PARTITION BY b ORDER BY a) AS r FROM t", "WINDOW"),
        ("SELECT DISTINCT a FROM t", "DISTINCT"),
        ("SELECT a FROM t UNION SELECT a FROM u", "DISTINCT"),
        ("SELECT a FROM t INTERSECT SELECT a FROM u", "SET_OPERATION"),
        ("SELECT a FROM t EXCEPT ALL SELECT a FROM u", "SET_OPERATION"),
        ("SELECT a FROM t LIMIT 5", "LIMIT"),
        ("SELECT a FROM t ORDER BY a", "ORDER_BY"),
        ("SELECT explode(array(a, a)) AS e FROM t", "GENERATOR"),
        ("SELECT a FROM t TABLESAMPLE (10 PERCENT)", "SAMPLE"),
        ("SELECT 1 AS one", "CONSTANT_RELATION"),
        ("SELECT x FROM VALUES (1), (2) AS v(x)", "CONSTANT_RELATION"),
        ("SELECT a FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.a = t.a)", "SUBQUERY_OUTSIDE_FROM"),
        ("SELECT a FROM t WHERE a IN (SELECT a FROM u)", "SUBQUERY_OUTSIDE_FROM"),
        ("SELECT a, (SELECT max(a) FROM u) AS m FROM t", "SUBQUERY_OUTSIDE_FROM"),
        ("SELECT a, rand() AS r FROM t", "NON_DETERMINISTIC:rand"),
        ("SELECT a, uuid() AS id FROM t", "NON_DETERMINISTIC:uuid"),
        ("SELECT a, current_timestamp() AS now FROM t", "TIME_DEPENDENT:current_timestamp"),
        ("SELECT a FROM t WHERE c < unix_timestamp()", "TIME_DEPENDENT:current_timestamp"),
        ("SELECT a, current_date() AS d FROM t", "TIME_DEPENDENT:current_date"),
        # Spark's special datetime values, fixed when the text is parsed or analysed
        ("SELECT a, TIMESTAMP'now' AS n FROM t", "TIME_DEPENDENT:TIMESTAMP 'now'"),
        ("SELECT a FROM t WHERE DATE /* c */ 'Today' > DATE'2020-01-01'",
         "TIME_DEPENDENT:DATE 'Today'"),
        ("SELECT a, timestamp_ntz' tomorrow UTC' AS n FROM t", "TIME_DEPENDENT"),
        ("SELECT a, CAST('now' AS TIMESTAMP) AS n FROM t", "TIME_DEPENDENT:CAST('now' AS TIMESTAMP)"),
        ("SELECT a, CAST(concat('yester', 'day') AS DATE) AS d FROM t", "TIME_DEPENDENT"),
        ("SELECT a FROM t WHERE DATE'2020-01-01' < 'tomorrow'", "TIME_DEPENDENT"),  # implied
        ("SELECT a, n FROM nowv", "TIME_DEPENDENT:TIMESTAMP_NTZ 'now'"),  # in a view's body
    ],
)
def test_other_constructs_are_full_with_their_reason(shop, query, reason):
    reasons = verdict(shop, query)
    assert any(r == reason or r.startswith(reason + ":") for r in reasons), reasons
    assert all(r.split(":")[0] in REASONS for r in reasons)


def test_every_reason_is_named_once_and_sorted(shop):
    reasons = verdict(
        shop, "SELECT DISTINCT a, rand() AS r FROM t JOIN u USING (a) ORDER BY a LIMIT 3"
    )
    assert list(reasons) == sorted(set(reasons))
    codes = {r.split(":")[0] for r in reasons}
    assert {"DISTINCT", "NON_DETERMINISTIC", "JOIN", "ORDER_BY", "LIMIT"} <= codes
