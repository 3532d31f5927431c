"""Adversarial tests of the query-delta engine (pipelines/incremental/): odd values,
query shapes and operations; after DML and ``ALTER DYNAMIC TABLE X REFRESH`` each
engine table must equal its query run fresh (as a multiset, -0.0 told from 0.0), or the
table must be refused / FULL with a reason."""

from __future__ import annotations

import threading

import pytest

from pipelines import Session, SqlError
from tests.pipelines.dynamic_tables.batched import bags


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    session = Session(tmp_path_factory.mktemp("engine_attack") / "warehouse", spark=spark)
    yield session
    session.close()


def make(session, name, query, mode="INCREMENTAL"):
    session.sql(f"CREATE OR REPLACE DYNAMIC TABLE {name} TARGET_LAG = '1 minute' "
                f"REFRESH_MODE = {mode} AS {query}")  # fmt: skip
    shown = session.sql(f"SHOW DYNAMIC TABLES LIKE '{name}'").collect()
    assert [r["refresh_mode"] for r in shown if r["name"] == name] == ["INCREMENTAL"], shown


def check(session, name, query, actions=("INCREMENTAL", "NO_DATA")):
    session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
    got, want = bags(session, {name: query})[name]  # one Spark job
    assert got == want, f"{name}: table {sorted(got.items(), key=str)} != query {sorted(want.items(), key=str)}"
    last = session.sql("SELECT NAME, REFRESH_ACTION FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY("
                       f"NAME => '{name}', RESULT_LIMIT => 1))").collect()  # fmt: skip
    assert last[0].REFRESH_ACTION in actions, last


def check_all(session, made: dict[str, str], step, failures: list[str]) -> None:
    """:func:`check` of every table of ``made`` (name -> query): each refreshed, then all
    compared with their queries in one Spark job and their actions read from one history
    query. A table that fails is recorded in ``failures`` and dropped from ``made``."""
    for name in list(made):
        try:
            session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH")
        except SqlError as exc:
            failures.append(f"{name} after {step}: {str(exc)[:600]}")
            del made[name]
    found = bags(session, made)
    newest: dict[str, str] = {}  # each table's newest refresh (the history is newest first)
    for row in session.sql("SELECT NAME, REFRESH_ACTION FROM TABLE(DYNAMIC_TABLE_REFRESH_"
                           "HISTORY(RESULT_LIMIT => 10000))").collect():  # fmt: skip
        newest.setdefault(row.NAME, row.REFRESH_ACTION)
    for name in list(made):
        got, want = found[name]
        if got != want:
            failures.append(f"{name} after {step}: table {sorted(got.items(), key=str)} != "
                            f"query {sorted(want.items(), key=str)}")  # fmt: skip
        elif newest.get(name) not in ("INCREMENTAL", "NO_DATA"):
            failures.append(f"{name} after {step}: refreshed {newest.get(name)}")
        else:
            continue
        del made[name]


def run(session, *statements):
    for s in statements:
        session.sql(s)


# 1. Values


def test_negative_zero_and_nan_through_a_join(wh):
    run(wh, "CREATE TABLE Z1 (ID NUMBER, V DOUBLE)", "CREATE TABLE Z2 (ID NUMBER, W NUMBER)",
        "INSERT INTO Z2 VALUES (1, 1), (2, 2), (3, 3)")
    q = "SELECT Z1.ID, Z1.V, Z2.W FROM Z1 JOIN Z2 ON Z1.ID = Z2.ID"
    make(wh, "Z_J", q)
    wh.sql("INSERT INTO Z1 SELECT 1, CAST('-0.0' AS DOUBLE) UNION ALL SELECT 2, CAST('NaN' AS DOUBLE) "
           "UNION ALL SELECT 3, CAST('0.0' AS DOUBLE)")
    check(wh, "Z_J", q)
    wh.sql("UPDATE Z1 SET V = CAST('0.0' AS DOUBLE) WHERE ID = 1")  # -0.0 -> 0.0
    wh.sql("UPDATE Z1 SET V = CAST('-0.0' AS DOUBLE) WHERE ID = 3")  # 0.0 -> -0.0
    check(wh, "Z_J", q)


def test_group_by_double_with_negative_zero_nan_and_null(wh):
    run(wh, "CREATE TABLE ZG (ID NUMBER, K DOUBLE, V NUMBER)")
    q = "SELECT K, count(*) AS N, sum(V) AS S FROM ZG GROUP BY K"
    make(wh, "ZG_A", q)
    wh.sql("INSERT INTO ZG SELECT 1, CAST('-0.0' AS DOUBLE), 1 UNION ALL SELECT 2, CAST('NaN' AS DOUBLE), 2 "
           "UNION ALL SELECT 3, NULL, 3 UNION ALL SELECT 4, CAST('0.0' AS DOUBLE), 4 "
           "UNION ALL SELECT 5, -CAST('NaN' AS DOUBLE), 5")
    check(wh, "ZG_A", q)
    wh.sql("DELETE FROM ZG WHERE ID IN (1, 2)")
    check(wh, "ZG_A", q)


def test_typed_group_keys_timestamp_decimal_unicode(wh):
    run(wh, "CREATE TABLE TK (ID NUMBER, TS TIMESTAMP_NTZ, TL TIMESTAMP_LTZ, D NUMBER(38,10), "
            "S VARCHAR, DT DATE)")
    q = "SELECT TS, TL, D, S, DT, count(*) AS N FROM TK GROUP BY TS, TL, D, S, DT"
    make(wh, "TK_A", q)
    row = ("SELECT {i}, CAST('2024-03-31 02:30:00.123456' AS TIMESTAMP_NTZ), "
           "CAST('2024-03-31 02:30:00.654321' AS TIMESTAMP_LTZ), "
           "CAST('12345678901234567890.0123456789' AS DECIMAL(38,10)), 'İı ß 🎉', "
           "CAST('1900-01-01' AS DATE)")  # fmt: skip
    wh.sql("INSERT INTO TK " + " UNION ALL ".join(row.format(i=i) for i in (1, 2)))
    check(wh, "TK_A", q)
    wh.sql("DELETE FROM TK WHERE ID = 1")
    check(wh, "TK_A", q)  # the group must now count 1, not 2 (touched group found again)
    wh.sql("DELETE FROM TK WHERE ID = 2")
    check(wh, "TK_A", q)


def test_group_vanishes_comes_back_empty_source_and_nothing_changed(wh):
    run(wh, "CREATE TABLE GV (ID NUMBER, K NUMBER, V NUMBER)",
        "INSERT INTO GV VALUES (1, 1, 1), (1, 1, 1), (2, NULL, 2)")
    qs = {"GV_A": "SELECT K, count(*) AS N, sum(V) AS S, max(V) AS M FROM GV GROUP BY K",
          "GV_S": "SELECT count(*) AS N, sum(V) AS S FROM GV",
          "GV_F": "SELECT K, count(*) AS N FROM GV WHERE V > 5 GROUP BY K"}
    for n, q in qs.items():
        make(wh, n, q)
    steps = ["DELETE FROM GV WHERE K = 1", "INSERT INTO GV VALUES (3, 1, 7)", "DELETE FROM GV",
             None, "INSERT INTO GV VALUES (4, NULL, NULL)"]
    failures: list[str] = []
    for step in steps:
        if step:
            wh.sql(step)
        check_all(wh, qs, step, failures)
    assert not failures, "\n".join(failures)


# 2. Query shapes


def _two_tables(session, prefix):
    run(session, f"CREATE TABLE {prefix}T (ID NUMBER, K NUMBER, V NUMBER)",
        f"CREATE TABLE {prefix}U (ID NUMBER, K NUMBER, W NUMBER)",
        f"INSERT INTO {prefix}T VALUES (1, 1, 1), (2, 2, 2), (3, NULL, 5), (4, 1, 1), (4, 1, 1)",
        f"INSERT INTO {prefix}U VALUES (1, 1, 2), (2, 2, NULL), (5, 1, 5), (6, NULL, 3)")


def _dml_rounds(session, t, u):
    """Two rounds of both tables' changes (inserts and updates of other rows share one)."""
    return [
        [f"INSERT INTO {t} VALUES (7, 3, 3), (8, NULL, NULL)", f"INSERT INTO {u} VALUES (7, 3, 1)",
         f"UPDATE {t} SET K = 2 WHERE ID = 1", f"UPDATE {u} SET K = NULL WHERE ID = 5"],
        [f"DELETE FROM {u} WHERE K IS NULL", f"INSERT INTO {u} VALUES (9, NULL, 9)",
         f"DELETE FROM {t} WHERE ID = 4"],
    ]


SHAPES = {
    "SELF": "SELECT a.ID, b.ID AS BID FROM {t} a JOIN {t} b ON a.K = b.K",
    "NONEQ": "SELECT a.ID, b.ID AS BID FROM {t} a JOIN {u} b ON a.V < b.W",
    "GEXPR": "SELECT K % 2 AS P, sum(V) FILTER (WHERE V > 1) AS S, count(DISTINCT V) AS D "
             "FROM {t} GROUP BY K % 2",
    "WIN_AGG": "SELECT K, N, rank() OVER (PARTITION BY N ORDER BY K) AS R "
               "FROM (SELECT K, count(*) AS N FROM {t} GROUP BY K)",
    "QUALIFY": "SELECT ID, K, V FROM {t} QUALIFY rank() OVER (PARTITION BY K ORDER BY V) = 1",
    "NOTIN": "SELECT ID FROM {t} WHERE V NOT IN (SELECT W FROM {u})",
    "EXISTS_NONEQ": "SELECT ID FROM {t} WHERE EXISTS (SELECT 1 FROM {u} WHERE {u}.K = {t}.K AND {u}.W > {t}.V)",
    "SCALAR_CNT": "SELECT ID, (SELECT count(*) FROM {u} WHERE {u}.K = {t}.K AND {u}.W > 1) AS C FROM {t}",
    "EXCEPT": "SELECT K FROM {t} EXCEPT SELECT K FROM {u}",
    "CTE2": "WITH c AS (SELECT K, sum(V) AS S FROM {t} GROUP BY K) "
            "SELECT x.K, x.S, y.S AS S2 FROM c x LEFT JOIN c y ON x.K = y.K + 1",
}


def test_query_shapes_after_dml_rounds(wh):
    _two_tables(wh, "QS")
    t, u = "QST", "QSU"
    wh.sql(f"CREATE VIEW QSV AS SELECT ID, K, V FROM {t} WHERE V IS NOT NULL OR K IS NULL")
    shapes = dict(SHAPES)
    shapes["VIEW"] = "SELECT QSV.K, count(*) AS N FROM QSV JOIN {u} ON QSV.K = {u}.K GROUP BY QSV.K"
    queries = {f"QS_{n}": q.format(t=t, u=u) for n, q in shapes.items()}
    failures = []
    for n, q in queries.items():
        try:
            wh.sql(f"CREATE DYNAMIC TABLE {n} TARGET_LAG = '1 minute' "
                   f"REFRESH_MODE = INCREMENTAL AS {q}")  # fmt: skip
        except SqlError as exc:
            failures.append(f"{n}: not engine-maintained: {exc}")
    made = {n: q for n, q in queries.items() if not any(f.startswith(n + ":") for f in failures)}
    modes = {r["name"]: r["refresh_mode"] for r in wh.sql("SHOW DYNAMIC TABLES").collect()}
    for n in [n for n in made if modes.get(n) != "INCREMENTAL"]:  # one SHOW for all
        failures.append(f"{n}: not engine-maintained: {modes.get(n)}")
        del made[n]
    for step in _dml_rounds(wh, t, u):
        run(wh, *step)
        check_all(wh, made, step, failures)
    assert not failures, "\n".join(failures)


def test_chain_of_engine_tables(wh):
    _two_tables(wh, "CH")
    q1 = "SELECT CHT.K, count(*) AS N, sum(CHU.W) AS S FROM CHT JOIN CHU ON CHT.K = CHU.K GROUP BY CHT.K"
    q2 = "SELECT N, count(*) AS C FROM CH_1 GROUP BY N"
    make(wh, "CH_1", q1)
    make(wh, "CH_2", q2)
    for step in _dml_rounds(wh, "CHT", "CHU"):
        run(wh, *step)
        failures: list[str] = []
        check_all(wh, {"CH_1": q1, "CH_2": q2}, step, failures)
        assert not failures, failures


def test_user_columns_named_like_engine_internals(wh):
    run(wh, 'CREATE TABLE RN1 (ID NUMBER, "_INGEST_SIGN" NUMBER, "_ingest_l" NUMBER)',
        "CREATE TABLE RN2 (ID NUMBER, W NUMBER)",
        "INSERT INTO RN1 VALUES (1, 10, 100), (2, 20, 200)", "INSERT INTO RN2 VALUES (1, 5), (2, 6)")
    with pytest.raises(SqlError):  # the hidden row id's name, even spelled with a Turkish İ
        wh.sql('CREATE TABLE RN3 (ID NUMBER, "_İNGEST_ROW_ID" NUMBER)')
    q = ('SELECT RN1.ID, RN1."_INGEST_SIGN" AS X, RN1."_ingest_l" AS Y, sum(RN2.W) AS S '
         'FROM RN1 JOIN RN2 ON RN1.ID = RN2.ID GROUP BY RN1.ID, RN1."_INGEST_SIGN", RN1."_ingest_l"')
    try:
        wh.sql(f"CREATE DYNAMIC TABLE RN_A TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL AS {q}")
    except SqlError as exc:  # a clear refusal naming the reserved name is acceptable
        assert "RESERVED_NAME" in str(exc) or "REWRITE_UNSUPPORTED" in str(exc), (exc.code, str(exc))
        return
    wh.sql("INSERT INTO RN2 VALUES (1, 7)")
    wh.sql('UPDATE RN1 SET "_ingest_l" = 101 WHERE ID = 1')
    check(wh, "RN_A", q)


def test_query_alias_named_ingest_sign(wh):
    run(wh, "CREATE TABLE RS1 (ID NUMBER, K NUMBER)", "INSERT INTO RS1 VALUES (1, 1), (2, 1)")
    q = "SELECT K AS _INGEST_SIGN, count(*) AS _INGEST_L FROM RS1 GROUP BY K"
    try:
        wh.sql(f"CREATE DYNAMIC TABLE RS_A TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL AS {q}")
    except SqlError as exc:
        assert "RESERVED_NAME" in str(exc) or "REWRITE_UNSUPPORTED" in str(exc), (exc.code, str(exc))
        return
    wh.sql("INSERT INTO RS1 VALUES (3, 2)")
    check(wh, "RS_A", q)


# 3. Operations


def test_stream_on_engine_table_sees_update_pair(wh):
    run(wh, "CREATE TABLE SO (ID NUMBER, K NUMBER, V NUMBER)",
        "INSERT INTO SO VALUES (1, 1, 1), (2, 2, 2)")
    q = "SELECT K, sum(V) AS S FROM SO GROUP BY K"
    make(wh, "SO_A", q)
    wh.sql("CREATE STREAM SO_S ON TABLE SO_A")
    wh.sql("INSERT INTO SO VALUES (3, 1, 10)")
    check(wh, "SO_A", q, actions=("INCREMENTAL",))
    rows = wh.sql('SELECT K, S, METADATA$ACTION AS A, METADATA$ISUPDATE AS U, '
                  'METADATA$ROW_ID AS R FROM SO_S').collect()
    assert sorted((r.K, r.S, r.A, r.U) for r in rows) == [(1, 1, "DELETE", True), (1, 11, "INSERT", True)], rows
    assert len({r.R for r in rows}) == 1, rows


def test_source_dropped_and_recreated(wh):
    run(wh, "CREATE TABLE DR (ID NUMBER, K NUMBER)", "CREATE TABLE DR2 (ID NUMBER, K NUMBER)",
        "INSERT INTO DR VALUES (1, 1)", "INSERT INTO DR2 VALUES (1, 1)")
    make(wh, "DR_J", "SELECT DR.ID, DR2.K FROM DR JOIN DR2 ON DR.K = DR2.K")
    wh.sql("DROP TABLE DR2")
    with pytest.raises(SqlError) as info:
        wh.sql("ALTER DYNAMIC TABLE DR_J REFRESH").collect()
    assert "SOURCE_DROPPED" in str(info.value), str(info.value)
    wh.sql("CREATE TABLE DR2 (ID NUMBER, K NUMBER)")
    with pytest.raises(SqlError) as info:
        wh.sql("ALTER DYNAMIC TABLE DR_J REFRESH").collect()
    assert "SOURCE_REPLACED" in str(info.value), str(info.value)


def test_variant_column_through_a_join(wh):
    run(wh, "CREATE TABLE VA (ID NUMBER, V VARIANT)",
        "CREATE TABLE VB (ID NUMBER, W NUMBER)",
        "INSERT INTO VA SELECT 1, PARSE_JSON('{\"a\": 1}')",
        "INSERT INTO VB VALUES (1, 1), (2, 2)")
    q = "SELECT VA.ID, VA.V, VB.W FROM VA JOIN VB ON VA.ID = VB.ID"
    make(wh, "VA_J", q)
    wh.sql("INSERT INTO VA SELECT 2, PARSE_JSON('[1, 2]')")
    wh.sql("ALTER DYNAMIC TABLE VA_J REFRESH")
    got = sorted((r.ID, str(r.V), r.W) for r in wh.sql("SELECT * FROM VA_J").collect())
    want = sorted((r.ID, str(r.V), r.W) for r in wh.sql(q).collect())
    assert got == want


def test_two_sessions_refresh_concurrently(wh, spark):
    run(wh, "CREATE TABLE CC (ID NUMBER, K NUMBER, V NUMBER)",
        "INSERT INTO CC VALUES (1, 1, 1), (2, 2, 2)")
    q = "SELECT K, count(*) AS N, sum(V) AS S FROM CC GROUP BY K"
    make(wh, "CC_A", q)
    wh.sql("INSERT INTO CC VALUES (3, 1, 5), (4, 3, 1)")
    other = Session(wh.warehouse, spark=spark)
    errors = []

    def go(session):
        try:
            session.sql("ALTER DYNAMIC TABLE CC_A REFRESH").collect()
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(s,)) for s in (wh, other)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    other.close()
    for exc in errors:
        assert isinstance(exc, SqlError) and exc.code != "INTERNAL", repr(exc)
    check(wh, "CC_A", q)


# 4. Refusals


REFUSED = {
    "WIN_NOPART": ("SELECT ID, row_number() OVER (ORDER BY ID) AS R FROM RF", "WINDOW_WITHOUT_PARTITION_BY"),
    "LIMIT": ("SELECT K, count(*) AS N FROM RF GROUP BY K LIMIT 1", "LIMIT"),
    "ORDER": ("SELECT K, count(*) AS N FROM RF GROUP BY K ORDER BY K", "ORDER_BY"),
    "TABLE_FUNCTION": ("SELECT RF.ID, w.keyword FROM RF CROSS JOIN sql_keywords() w",
                       "GENERATOR:sql_keywords"),
    "UNCORR_GLOBAL": ("SELECT sum(V) * (SELECT avg(V) FROM RF) AS X FROM RF", "SUBQUERY_EXPRESSION"),
    "RAND": ("SELECT K, count(*) AS N FROM RF WHERE rand() > 0.5 GROUP BY K", "NON_DETERMINISTIC"),
}


def test_refusals_name_the_reason(wh):
    run(wh, "CREATE TABLE RF (ID NUMBER, K NUMBER, V NUMBER)", "INSERT INTO RF VALUES (1, 1, 1)")
    problems = []
    for name, (q, code) in REFUSED.items():
        try:
            wh.sql(f"CREATE DYNAMIC TABLE RF_{name} TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL AS {q}")
        except SqlError as exc:
            if exc.code != "DYNAMIC_TABLE_NOT_INCREMENTAL" or code not in str(exc):
                problems.append(f"{name}: {exc.code}: {str(exc)[:300]}")
        else:
            problems.append(f"{name}: accepted under INCREMENTAL")
    assert not problems, "\n".join(problems)


def test_incremental_strict_and_many_refreshes(wh):
    _two_tables(wh, "ST")
    q = "SELECT STT.ID, STU.W FROM STT LEFT JOIN STU ON STT.K = STU.K"
    make(wh, "ST_L", q, mode="INCREMENTAL_STRICT")
    for i in range(3):
        wh.sql(f"INSERT INTO STU VALUES ({10 + i}, {i % 3}, {i})")
        if i % 2:
            wh.sql(f"DELETE FROM STU WHERE ID = {9 + i}")
        check(wh, "ST_L", q, actions=("INCREMENTAL",))
    check(wh, "ST_L", q, actions=("NO_DATA",))
