"""A refresh's result is its query's on nasty data and at the edges of its state: NaN,
-0.0, NULLs, duplicates, long strings, unicode, quoted and dotted names and every type
through UNION ALL branches, a CTE and a view (INCREMENTAL); columns named like the
diff's working columns; row ids near the end of their space (a clean failure with its
reason, never a wrapped id); changes no longer retained (FULL, or a failure when
INCREMENTAL_STRICT); and a catalog restored from a backup.

Written by the adversarial review of dynamic tables (issue 19; see
``test_refresh_exactly_once``). Each test asserts the product's rules (no row lost or
duplicated; a mistake gets a clear error and changes nothing). The tests marked
``xfail(strict=True)`` show a known gap (the reason names it, as docs/dynamic-tables.md
and docs/pipelines.md list it); the rest held, among them regression tests of defects
the review found and commit 9f00a2c fixed (the diff's working columns, ROW_ID_SPACE).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pipelines import Session, SqlError
from tests.pipelines.dynamic_tables.checks import (
    assert_consistent,
    assert_same_as_query,
    history_rows,
    row_ids,
)


@pytest.fixture
def base(session):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    return session


# Incremental correctness on nasty data

NASTY_COLUMNS = 'ID, "My Col", "ünï çødé", "_ingest_x", D, TS, B, VA, AR, "a.b", "x""y"'
NASTY_QUERY = (
    f'WITH C AS (SELECT {NASTY_COLUMNS} FROM V1 WHERE "a.b" <> 3) '
    f"SELECT {NASTY_COLUMNS} FROM T UNION ALL SELECT {NASTY_COLUMNS} FROM C "
    f"UNION ALL SELECT {NASTY_COLUMNS} FROM V1 WHERE ID % 2 = 0 "
    'UNION ALL SELECT * FROM T WHERE "ünï çødé" IS NULL OR isnan("ünï çødé")'
)


@pytest.fixture
def nasty(session):
    session.sql('CREATE TABLE T (ID NUMBER, "My Col" VARCHAR, "ünï çødé" FLOAT, '
                '"_ingest_x" NUMBER(38,10), D DATE, TS TIMESTAMP_NTZ, B BINARY, VA VARIANT, '
                'AR ARRAY, "a.b" INT, "x""y" STRING)')  # fmt: skip
    long_text = "'" + "é" * 100_000 + "'"
    for key, number, text in [
        (1, "CAST('NaN' AS DOUBLE)", "'s1'"), (2, "CAST('-0.0' AS DOUBLE)", "'s2'"),
        (3, "NULL", "NULL"), (3, "NULL", "NULL"), (4, "1e308", long_text),
    ]:  # fmt: skip
        session.sql(f"INSERT INTO T SELECT {key}, {text}, {number}, {key}.0000000001, "
                    f"DATE'2020-01-01' + {key}, TIMESTAMP'2020-01-01 00:00:00.123456', "
                    f"X'00ff', '{{\"k\":{key}}}', '[{key},null]', {key}, 'q'")  # fmt: skip
    session.sql("CREATE VIEW V1 AS SELECT * FROM T WHERE ID > 1")
    session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM REFRESH_MODE = "
                f"INCREMENTAL_STRICT AS {NASTY_QUERY}")  # fmt: skip
    return session


def test_incremental_refresh_of_nasty_values_names_and_types_matches_the_query(nasty):
    """NaN, NULLs, duplicates, a 100,000-character string, unicode, quoted and dotted
    names, a column named like a hidden one, dates, timestamps, decimals, binary,
    variant and array, through four UNION ALL branches with a CTE and a view; every
    refresh INCREMENTAL and equal to the query."""
    assert_same_as_query(nasty, "D", NASTY_QUERY)
    for statements in (
        ['UPDATE T SET "ünï çødé" = CAST(\'NaN\' AS DOUBLE) WHERE ID = 3',
         "DELETE FROM T WHERE ID = 1", 'UPDATE T SET "My Col" = NULL WHERE ID = 4'],
        ['UPDATE T SET "a.b" = 3 WHERE ID = 2',
         "MERGE INTO T USING (SELECT 3 AS K) M ON T.ID = M.K WHEN MATCHED THEN UPDATE "
         "SET \"x\"\"y\" = 'merged'"],
        ["UPDATE T SET B = X'', VA = 'null', AR = '[]' WHERE ID = 4",
         "INSERT INTO T SELECT * FROM T WHERE ID = 4"],
    ):  # fmt: skip
        for statement in statements:
            nasty.sql(statement)
        nasty.sql("ALTER DYNAMIC TABLE D REFRESH")
        assert_same_as_query(nasty, "D", NASTY_QUERY)
    assert {h[2] for h in history_rows(nasty, "D")[:-1]} == {"INCREMENTAL"}
    assert_consistent(nasty, "D")


def test_a_signed_zero_update_reaches_the_dynamic_table(nasty):
    nasty.sql("UPDATE T SET \"ünï çødé\" = CAST('0.0' AS DOUBLE) WHERE ID = 2")
    nasty.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(nasty, "D", NASTY_QUERY)


def test_a_signed_zero_update_reaches_a_table_refreshed_full_by_id(session):
    """A FULL refresh of a followed stateless table applies the diff by id. It compared
    floats as Spark's ``<=>`` does, which takes -0.0 for 0.0, and kept the stale zero;
    it follows ``pipelines.change_sets``' one equality now, as the incremental refresh
    does."""
    session.sql("CREATE TABLE Z (ID NUMBER, F FLOAT)")
    session.sql("INSERT INTO Z SELECT 1, CAST('0.0' AS DOUBLE) UNION ALL SELECT 2, "
                "CAST('-0.0' AS DOUBLE) UNION ALL SELECT 3, CAST('NaN' AS DOUBLE)")  # fmt: skip
    session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS SELECT ID, F FROM Z")
    session.sql("CREATE STREAM S ON TABLE D")  # a follower: FULL applies a diff
    session.sql("UPDATE Z SET F = -F")  # 0.0 -> -0.0, -0.0 -> 0.0, NaN -> NaN
    for path in Path(session.require_table("Z").uri).rglob("_change_data/*.parquet"):
        path.unlink()  # what a vacuum past the retention does: FULL, by id
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert history_rows(session, "D")[0][1:] == ("SUCCEEDED", "FULL", "CHANGES_NOT_RETAINED")
    assert_same_as_query(session, "D", "SELECT ID, F FROM Z")
    changes = session.sql("SELECT ID, METADATA$ACTION AS A FROM S").collect()
    assert sorted((r.ID, r.A) for r in changes) == [(1, "DELETE"), (1, "INSERT"),
                                                    (2, "DELETE"), (2, "INSERT")]  # fmt: skip
    assert_consistent(session, "D")


@pytest.mark.parametrize(("options", "query", "vacuum"), [
    # stateless, FULL for a reason (changes not retained): the diff by id
    ("", 'SELECT ID AS "__DIFF_NEW", V AS "__DIFF_KIND" FROM T', True),
    # REFRESH_MODE = FULL and a window: the diff by value
    ("REFRESH_MODE = FULL", 'SELECT ID AS "__DIFF_IDS", V AS "__DIFF_NEW" FROM T', False),
    ("", 'SELECT ID AS "__DIFF_IDS", count(*) OVER () AS "__DIFF_COPIES" FROM T', False),
])  # fmt: skip
def test_columns_named_like_the_diffs_working_columns_refresh(base, options, query, vacuum):
    base.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM {options} AS {query}")
    base.sql("UPDATE T SET ID = 20 WHERE ID = 2")
    base.sql("INSERT INTO T VALUES (5, 'e')")
    if vacuum:
        for path in Path(base.require_table("T").uri).rglob("_change_data/*.parquet"):
            path.unlink()
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert history_rows(base, "D")[0][1:3] == ("SUCCEEDED", "FULL")
    assert_same_as_query(base, "D", query)
    assert_consistent(base, "D")


def set_next_row_id(session: Session, table: str, value: int) -> None:
    """Move a table's row-id sequence (what a long-lived table reaches in time)."""
    db = sqlite3.connect(Path(session.warehouse) / "catalog.sqlite")
    try:
        db.execute("UPDATE tables SET next_row_id=? WHERE id=?",
                   (value, session.require_table(table).id))  # fmt: skip
        db.commit()
    finally:
        db.close()


def test_row_ids_near_2_to_the_62_fail_the_refresh_cleanly_never_wrap(base):
    """A UNION ALL doubles a source's row id: past 2**62 the packed id cannot exist.
    The refresh fails (the table unchanged, no commit), CREATE refuses, and nothing
    wraps into a negative or colliding id."""
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS "
             "SELECT ID FROM T UNION ALL SELECT ID FROM T UNION ALL SELECT ID FROM T")  # fmt: skip
    uri = base.require_table("D").uri
    version, before = DeltaTable(uri).version(), row_ids(uri)
    set_next_row_id(base, "T", 2**62 - 1)
    base.sql("INSERT INTO T VALUES (5, 'e'), (6, 'f')")
    with pytest.raises(SqlError, match="ROW_ID_SPACE"):
        base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert DeltaTable(uri).version() == version and row_ids(uri) == before
    assert all(i >= 0 for i in row_ids(uri))
    with pytest.raises(SqlError):
        base.sql("CREATE DYNAMIC TABLE E TARGET_LAG = DOWNSTREAM AS "
                 "SELECT ID FROM T UNION ALL SELECT ID FROM T")  # fmt: skip
    assert sorted(t.name for t in base.catalog.list_tables()) == ["D", "T"]
    assert_consistent(base, "D")


def test_row_id_overflow_has_its_own_reason_code(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS "
             "SELECT ID FROM T UNION ALL SELECT ID FROM T")  # fmt: skip
    set_next_row_id(base, "T", 2**62 + 5)
    base.sql("INSERT INTO T VALUES (5, 'e')")
    with pytest.raises(SqlError) as failed:
        base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert "ansi" not in str(failed.value).lower()
    assert history_rows(base, "D")[0][3] == "ROW_ID_SPACE"


def test_changes_not_retained_fall_back_to_full_or_fail_strict(base):
    base.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS SELECT ID, V FROM T")
    base.sql("CREATE DYNAMIC TABLE STRICT TARGET_LAG = DOWNSTREAM REFRESH_MODE = "
             "INCREMENTAL_STRICT AS SELECT ID, V FROM T")  # fmt: skip
    strict_version = DeltaTable(base.require_table("STRICT").uri).version()
    base.sql("UPDATE T SET V = 'z' WHERE ID = 1")
    base.sql("INSERT INTO T VALUES (5, 'e')")
    cdc = list(Path(base.require_table("T").uri).rglob("_change_data/*.parquet"))
    assert cdc, "no change data to remove: the test would prove nothing"
    for path in cdc:
        path.unlink()  # what a vacuum past the retention does
    base.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert history_rows(base, "D")[0][1:] == ("SUCCEEDED", "FULL", "CHANGES_NOT_RETAINED")
    assert_same_as_query(base, "D", "SELECT ID, V FROM T")
    with pytest.raises(SqlError, match="CHANGES_NOT_RETAINED"):
        base.sql("ALTER DYNAMIC TABLE STRICT REFRESH")
    assert DeltaTable(base.require_table("STRICT").uri).version() == strict_version
    assert history_rows(base, "STRICT")[0][1:] == ("FAILED", "FAILED", "CHANGES_NOT_RETAINED")
    assert_consistent(base, "D")
    assert_consistent(base, "STRICT")


def backup(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite catalog (WAL included), either way."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


@pytest.fixture
def restored(tmp_path, spark):
    """A warehouse whose catalog is put back to a copy taken before some refreshes:
    T, D (stateless, PACKED ids) and W (a window: FULL, SEQUENCE ids) were created and
    copied; then T got a row and both were refreshed; then the copy came back.
    Returns a session on it (opened after the restore)."""
    warehouse = tmp_path / "warehouse"
    with Session(warehouse, spark=spark) as session:
        session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
        session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
        session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = DOWNSTREAM AS SELECT ID, V FROM T")
        session.sql("CREATE DYNAMIC TABLE W TARGET_LAG = DOWNSTREAM AS "
                    "SELECT ID, V, count(*) OVER () AS K FROM T")  # fmt: skip
    backup(warehouse / "catalog.sqlite", tmp_path / "old.sqlite")
    with Session(warehouse, spark=spark) as session:
        session.sql("INSERT INTO T VALUES (3, 'c')")
        session.sql("ALTER DYNAMIC TABLE D REFRESH")
        session.sql("ALTER DYNAMIC TABLE W REFRESH")
    backup(tmp_path / "old.sqlite", warehouse / "catalog.sqlite")
    session = Session(warehouse, spark=spark)
    yield session
    session.close()


def test_a_restored_catalog_refreshes_a_stateless_table_full_without_duplicates(restored):
    restored.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert history_rows(restored, "D")[0][1:] == ("SUCCEEDED", "FULL", "CATALOG_BEHIND")
    assert_same_as_query(restored, "D", "SELECT ID, V FROM T")
    ids = row_ids(restored.require_table("D").uri)
    assert len(ids) == len(set(ids)) == 3


@pytest.mark.xfail(strict=True, reason="known gap (docs/dynamic-tables.md): after a catalog "
                   "restore, a FULL-by-value refresh "
                   "reserves row ids the table already holds (tables.next_row_id is never "
                   "reconciled with the log): the commit is decided, its MERGE can never land "
                   "('matched a target row with multiple source rows'), ALTER ... REFRESH "
                   "reports 'SKIPPED (CONCURRENT_REFRESH)', and every later refresh fails TABLE_BUSY")  # fmt: skip
def test_a_restored_catalog_does_not_wedge_a_full_only_table(restored):
    restored.sql("ALTER DYNAMIC TABLE W REFRESH")
    assert restored.catalog.pending_commits() == []
    query = "SELECT ID, V, count(*) OVER () AS K FROM T"
    assert_same_as_query(restored, "W", query)
    restored.sql("INSERT INTO T VALUES (4, 'd')")
    restored.sql("ALTER DYNAMIC TABLE W REFRESH")
    assert_same_as_query(restored, "W", query)
    assert_consistent(restored, "W")


@pytest.mark.xfail(strict=True, reason="known gap (docs/pipelines.md): after a catalog restore, "
                   "INSERT INTO a source reserves "
                   "row ids its Delta table already holds (next_row_id not reconciled), so two "
                   "source rows share an id and the dynamic table's refresh by id loses a row")  # fmt: skip
def test_a_restored_catalog_keeps_source_row_ids_unique(restored):
    restored.sql("INSERT INTO T VALUES (4, 'd')")
    ids = row_ids(restored.require_table("T").uri)
    assert len(ids) == len(set(ids)), f"duplicate row ids in the source: {sorted(ids)}"
    restored.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(restored, "D", "SELECT ID, V FROM T")
