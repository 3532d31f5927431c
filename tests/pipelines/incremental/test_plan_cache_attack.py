"""Adversarial tests of the plans kept between refreshes (pipelines.incremental.plan_cache):
a refresh through a kept plan must give the answer of its query run fresh, or fail as
the refresh would without the cache.

The first tests hold what that attack found: Spark folds a special datetime value
(``TIMESTAMP'now'``, ``CAST('now' AS TIMESTAMP)``) into a literal when it parses or
analyses the text, so a plan kept with it would keep its time. Such a query is
TIME_DEPENDENT (:mod:`pipelines.sql.time_literals`): refused by REFRESH_MODE =
INCREMENTAL, refreshed FULL otherwise, never through a kept plan.

The rest attack what the key holds (stand-ins by position, table ids, schemas, views
bound into the text, literals spelling made view names, concurrency on one Spark
session) and pass."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from pipelines import SqlError
from pipelines.incremental import plan_cache
from pipelines.sql import binding
from tests.pipelines.dynamic_tables.checks import assert_consistent, assert_same_as_query

OPTIONS = "TARGET_LAG = '1 hour' REFRESH_MODE = INCREMENTAL"
NOW = ["TIMESTAMP'now'", "CAST('now' AS TIMESTAMP)", "TIMESTAMP_NTZ'now'",
       "CAST(concat('n', 'ow') AS TIMESTAMP_NTZ)"]  # fmt: skip


def refresh(session, name):
    return session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status


def stamp():
    """The current time as a TIMESTAMP literal (UTC, the session's time zone)."""
    return "TIMESTAMP'" + dt.datetime.now(dt.UTC).replace(tzinfo=None).isoformat(sep=" ") + "'"


def hits(session):
    cache = plan_cache._CACHES.get(session.spark)
    return cache.hits if cache is not None else 0


@pytest.mark.parametrize("now", NOW)
def test_the_current_time_a_text_spells_is_time_dependent(session, now):
    """Refused as INCREMENTAL (named), refreshed FULL otherwise: a row stamped after the
    creation and before the refresh is in the table, as in the query run then."""
    query = f"SELECT ID, count(*) AS N FROM T WHERE TS <= {now} GROUP BY ID"
    session.sql("CREATE TABLE T (ID NUMBER, TS TIMESTAMP_NTZ)")
    session.sql("INSERT INTO T VALUES (1, TIMESTAMP'2020-01-01 00:00:00')")
    with pytest.raises(SqlError, match="TIME_DEPENDENT") as refused:
        session.sql(f"CREATE DYNAMIC TABLE D {OPTIONS} AS {query}")
    assert refused.value.code == "DYNAMIC_TABLE_NOT_INCREMENTAL"
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 hour' AS {query}")
    session.sql(f"INSERT INTO T VALUES (2, {stamp()})")
    assert "FULL" in refresh(session, "D")
    assert_same_as_query(session, "D", query)


# --- What the key does hold: each must keep the query's answer --------------------


def _rounds(session, made: dict[str, str], statements: list[str]) -> None:
    """Each of ``statements`` (';'-separated rounds), then every table of ``made``
    refreshed and compared with its query."""
    for round_ in statements:
        for statement in filter(None, round_.split("; ")):
            session.sql(statement)
        for name, query in made.items():
            refresh(session, name)
            assert_same_as_query(session, name, query)


def test_two_warehouses_on_one_spark_refreshed_at_once(session_factory, tmp_path):
    """Two sessions of two warehouses (the same table ids) on the shared Spark session,
    the same text over different rows, refreshed at once from two threads: each table
    keeps its own query's answer."""
    query = ("SELECT C.REGION, count(*) AS N, sum(T.AMOUNT) AS S, min(T.AMOUNT) AS LO, "
             "max(T.AMOUNT) AS HI, avg(T.AMOUNT) AS A FROM T JOIN C ON T.CID = C.ID "
             "GROUP BY C.REGION")  # fmt: skip
    sessions = [session_factory(tmp_path / f"w{i}") for i in range(2)]
    for i, s in enumerate(sessions):
        s.sql("CREATE TABLE T (ID NUMBER, CID NUMBER, AMOUNT NUMBER(10, 2))")
        s.sql("CREATE TABLE C (ID NUMBER, REGION VARCHAR)")
        s.sql(f"INSERT INTO T VALUES (1, 1, {1 + i}.5), (2, 2, 2.5), (3, 1, NULL)")
        s.sql(f"INSERT INTO C VALUES (1, 'a{i}'), (2, 'b')")
        s.sql(f"CREATE DYNAMIC TABLE D {OPTIONS} AS {query}")
    assert [s.require_table("T").id for s in sessions] == [sessions[0].require_table("T").id] * 2
    rounds = ["UPDATE T SET AMOUNT = AMOUNT + {i} WHERE ID = 1; "
              "INSERT INTO C VALUES (3, 'a{i}'); INSERT INTO T VALUES (4, 3, {i})",
              "DELETE FROM C WHERE ID = {i} + 1; DELETE FROM T WHERE CID = 1"]  # fmt: skip
    before = hits(sessions[0])
    for round_ in rounds:
        barrier, errors = threading.Barrier(2), []

        def run(i, round_=round_, barrier=barrier, errors=errors):
            s = sessions[i]
            try:
                for statement in round_.format(i=i).split("; "):
                    s.sql(statement)
                barrier.wait(timeout=120)
                assert "INCREMENTAL" in refresh(s, "D")
            except BaseException as exc:  # reported below
                errors.append(repr(exc))
                barrier.abort()

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        for s in sessions:
            assert_same_as_query(s, "D", query)
            assert_consistent(s, "D")
    assert hits(sessions[0]) > before


def test_twins_of_one_warehouse_refreshed_at_once_from_two_sessions(session_factory):
    """Two sessions of one warehouse on the shared Spark session, each refreshing one of
    two tables of the same text at the same time (one kept plan, its memos filled by
    both): each keeps the query's answer."""
    query = ("SELECT A.K, count(*) AS N, min(B.V) AS LO, avg(B.V) AS AV FROM S A JOIN S B "
             "ON A.K = B.K WHERE EXISTS (SELECT 1 FROM S C WHERE C.K = A.K AND C.V > 1) "
             "GROUP BY A.K")  # fmt: skip
    first = session_factory()
    first.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    first.sql("INSERT INTO S VALUES (1, 5), (1, 7), (2, 1), (3, 2)")
    for name in ("D", "D2"):
        first.sql(f"CREATE DYNAMIC TABLE {name} {OPTIONS} AS {query}")
    second = session_factory()
    first.sql("INSERT INTO S VALUES (2, 9), (3, 1)")
    first.sql("UPDATE S SET V = 0 WHERE K = 1")
    barrier, errors = threading.Barrier(2), []

    def run(s, name):
        try:
            barrier.wait(timeout=120)
            assert "INCREMENTAL" in refresh(s, name)
        except BaseException as exc:  # reported below
            errors.append(repr(exc))
            barrier.abort()

    threads = [threading.Thread(target=run, args=pair) for pair in ((first, "D"), (second, "D2"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for name in ("D", "D2"):
        assert_same_as_query(first, name, query)
        assert_consistent(first, name)


def test_a_source_created_again_with_the_same_schema(session):
    """Dropped and created again under its name with the same columns (a new id): the
    refresh is refused (other tables) with the cache as without; created again as a
    dynamic table of the same text, the answer is the query's."""
    query = "SELECT K, min(V) AS LO, max(V) AS HI, avg(V) AS A FROM S GROUP BY K"
    session.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    session.sql("INSERT INTO S VALUES (1, 5), (1, 7), (2, 1)")
    session.sql(f"CREATE DYNAMIC TABLE D {OPTIONS} AS {query}")
    _rounds(session, {"D": query}, ["DELETE FROM S WHERE V = 1; INSERT INTO S VALUES (2, 9)"])
    session.sql("CREATE OR REPLACE TABLE S (K NUMBER, V NUMBER)")
    session.sql("INSERT INTO S VALUES (1, 3)")
    with pytest.raises(SqlError) as refused:
        refresh(session, "D")
    assert "SOURCE" in str(refused.value) or "other tables" in str(refused.value), refused.value
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE D {OPTIONS} AS {query}")
    assert_same_as_query(session, "D", query)
    _rounds(
        session, {"D": query}, ["INSERT INTO S VALUES (1, 10), (3, 4); DELETE FROM S WHERE V = 3"]
    )


def test_a_renamed_source_and_a_table_taking_its_name(session):
    query = "SELECT A.K, count(*) AS N, max(B.V) AS M FROM S A JOIN S B ON A.K = B.K GROUP BY A.K"
    session.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    session.sql("INSERT INTO S VALUES (1, 5), (1, 7), (2, 1)")
    session.sql(f"CREATE DYNAMIC TABLE D {OPTIONS} AS {query}")
    session.sql("ALTER TABLE S RENAME TO S_OLD")
    session.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    session.sql("INSERT INTO S VALUES (9, 9)")
    with pytest.raises(SqlError):
        refresh(session, "D")
    session.sql("DROP TABLE S")
    session.sql("ALTER TABLE S_OLD RENAME TO S")
    _rounds(session, {"D": query}, ["INSERT INTO S VALUES (2, 8); DELETE FROM S WHERE V = 7"])


def test_literals_that_spell_made_view_names(session):
    """Literals and quoted names spelling ``ingest_v<N>`` (the next ones too)."""
    first = int(repr(binding._VIEW_NUMBERS)[len("count(") : -1])  # the next view's number
    upcoming = [f"ingest_v{n}" for n in range(first, first + 40)]
    session.sql('CREATE TABLE "ingest_v1" (K NUMBER, V VARCHAR)')
    session.sql("CREATE TABLE S (K NUMBER, V VARCHAR)")
    session.sql("""INSERT INTO "ingest_v1" VALUES (1, 'ingest_v1'), (2, 'x')""")
    session.sql(f"INSERT INTO S VALUES (1, '{upcoming[5]}'), (2, 'ingest_v2')")
    spelled = " OR ".join(f"S.V = '{name}'" for name in upcoming)
    made = {
        "D1": """SELECT A.K, count(*) AS N FROM "ingest_v1" A JOIN S ON A.K = S.K """
        """WHERE A.V = 'ingest_v1' OR S.V = 'ingest_v2' GROUP BY A.K""",
        "D2": f"SELECT S.K, count(*) AS N FROM S WHERE {spelled} OR S.V <> '{upcoming[-1]}' "
        "GROUP BY S.K",
    }
    for name, query in made.items():
        session.sql(f"CREATE DYNAMIC TABLE {name} {OPTIONS} AS {query}")
    _rounds(session, made, [
        f"INSERT INTO S VALUES (1, '{upcoming[10]}'), (1, '{upcoming[20]}'), (2, 'ingest_v1'); "
        """INSERT INTO "ingest_v1" VALUES (2, 'ingest_v1'); """
        f"DELETE FROM S WHERE V = '{upcoming[5]}'",
    ])  # fmt: skip


def test_self_joins_and_subqueries_over_one_table(session):
    session.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    session.sql("CREATE TABLE R (K NUMBER, W NUMBER)")
    session.sql("INSERT INTO S VALUES (1, 5), (1, 7), (2, 1), (3, NULL)")
    session.sql("INSERT INTO R VALUES (1, 5), (2, 2)")
    made = {
        "SJ": "SELECT A.K, count(*) AS N, sum(B.V) AS SV FROM S A JOIN S B ON A.K = B.K "
        "GROUP BY A.K",
        "EX": "SELECT K, V FROM S A WHERE EXISTS (SELECT 1 FROM S B WHERE B.K = A.K AND B.V > 5) "
        "AND K NOT IN (SELECT W FROM R)",
    }  # (the engine's own tests cover these constructs; here: one table read twice)
    for name, query in made.items():
        session.sql(f"CREATE DYNAMIC TABLE {name} {OPTIONS} AS {query}")
    _rounds(session, made, [
        "INSERT INTO S VALUES (2, 9), (4, 4); UPDATE S SET V = V + 1 WHERE K = 1; "
        "INSERT INTO R VALUES (NULL, NULL)",
        "DELETE FROM R WHERE K IS NULL; DELETE FROM S WHERE K = 2; "
        "UPDATE S SET K = 3 WHERE V IS NULL OR V > 6",
    ])  # fmt: skip


def test_dynamic_tables_over_dynamic_tables_and_replaced_with_the_same_text(session):
    session.sql("CREATE TABLE S (K NUMBER, V NUMBER)")
    session.sql("INSERT INTO S VALUES (1, 5), (1, 7), (2, 1)")
    inner = "SELECT K, sum(V) AS SV, count(*) AS N FROM S GROUP BY K"
    outer = "SELECT SV, count(*) AS N, max(K) AS MK FROM INNER_D GROUP BY SV"
    session.sql(f"CREATE DYNAMIC TABLE INNER_D {OPTIONS} AS {inner}")
    session.sql(f"CREATE DYNAMIC TABLE OUTER_D {OPTIONS} AS {outer}")
    made = {"INNER_D": inner, "OUTER_D": outer}
    _rounds(session, made, ["INSERT INTO S VALUES (2, 11)"])
    # The inner table again, same text (a new id): the outer is refused, as before.
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE INNER_D {OPTIONS} AS {inner}")
    with pytest.raises(SqlError):
        refresh(session, "OUTER_D")
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE OUTER_D {OPTIONS} AS {outer}")
    assert_same_as_query(session, "OUTER_D", outer)
    _rounds(session, made, ["INSERT INTO S VALUES (3, 12), (1, -12)", "DELETE FROM S WHERE K = 1"])


def test_quoted_names_of_odd_characters(session):
    low, up = '"we`ird ""t"""', '"WE`IRD ""T"""'
    session.sql(f'CREATE TABLE {low} ("k ey" NUMBER, "v`" NUMBER, "ingest_v3" VARCHAR)')
    session.sql(f'CREATE TABLE {up} ("k ey" NUMBER, "V`" NUMBER, "ingest_v3" VARCHAR)')
    session.sql(f"INSERT INTO {low} VALUES (1, 2, 'a'), (1, 3, 'b')")
    session.sql(f"INSERT INTO {up} VALUES (1, 20, 'a'), (2, 30, 'b')")
    made = {
        "Q1": f'SELECT a."k ey", sum(a."v`") AS s, max(b."V`") AS m FROM {low} a '
        f'JOIN {up} b ON a."k ey" = b."k ey" GROUP BY a."k ey"',
        "Q3": f'SELECT "ingest_v3", count(*) AS n FROM {low} GROUP BY "ingest_v3"',
    }
    for name, query in made.items():
        session.sql(f"CREATE DYNAMIC TABLE {name} {OPTIONS} AS {query}")
    _rounds(
        session,
        made,
        [f"INSERT INTO {low} VALUES (2, 5, 'c'); DELETE FROM {up} WHERE \"k ey\" = 1"],
    )


def test_views_read_by_twins_under_other_defaults(session):
    """The same text under other default schemas names other tables (and a view in one,
    a table in the other): each table keeps its own query's answer."""
    session.sql("CREATE SCHEMA S2")  # (and uses it)
    session.sql("USE SCHEMA PUBLIC")
    session.sql("CREATE TABLE PUBLIC.T (K NUMBER, V NUMBER)")
    session.sql("CREATE TABLE S2.U (K NUMBER, V NUMBER)")
    session.sql("CREATE VIEW S2.T AS SELECT K, V * 10 AS V FROM S2.U WHERE K > 0")
    session.sql("INSERT INTO PUBLIC.T VALUES (1, 1), (2, 2)")
    session.sql("INSERT INTO S2.U VALUES (1, 1), (-1, 5)")
    query = "SELECT K, sum(V) AS SV FROM T GROUP BY K"
    session.sql(f"CREATE DYNAMIC TABLE PUBLIC.D {OPTIONS} AS {query}")
    session.sql("USE SCHEMA S2")
    session.sql(f"CREATE DYNAMIC TABLE S2.D {OPTIONS} AS {query}")
    for statement in ["INSERT INTO PUBLIC.T VALUES (1, 4)", "INSERT INTO S2.U VALUES (1, 3)"]:
        session.sql(statement)
        for schema in ("PUBLIC", "S2"):
            session.sql(f"USE SCHEMA {schema}")
            refresh(session, "D")
            assert_same_as_query(session, "D", query)
