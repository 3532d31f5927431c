"""Views: named queries kept in the catalog and expanded where they are read, in
queries, DML sources and other views; refused where they would be written, time-
travelled or made to read a stream; every refusal changes nothing."""

from __future__ import annotations

import pytest

from pipelines import ObjectNotFoundError, Session, SqlError
from tests.pipelines.conftest import rows
from tests.pipelines.refusals import assert_refused


@pytest.fixture
def s(session: Session) -> Session:
    for statement in (
        "CREATE TABLE t (id NUMBER, v VARCHAR)",
        "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')",
        "CREATE TABLE t2 (id NUMBER, v VARCHAR)",
        "CREATE VIEW big AS SELECT id, upper(v) AS v FROM t WHERE id > 1",
    ):
        session.sql(statement)
    return session


def ids(session: Session, query: str) -> list[int]:
    return [int(r[0]) for r in rows(session.sql(query))]


def test_a_view_is_its_query_read_now(s):
    assert rows(s.sql("SELECT id, v FROM big")) == [(2, "B"), (3, "C")]
    s.sql("INSERT INTO t VALUES (4, 'd')")
    s.sql("DELETE FROM t WHERE id = 2")
    assert rows(s.sql("SELECT id, v FROM big")) == [(3, "C"), (4, "D")]
    # aliases, joins with tables, CTEs and views of views
    assert ids(s, "SELECT b.id FROM big AS b JOIN t ON b.id = t.id WHERE t.v = 'c'") == [3]
    s.sql("CREATE VIEW bigger AS WITH x AS (SELECT id FROM big) SELECT id * 10 AS id FROM x")
    assert ids(s, "SELECT id FROM bigger") == [30, 40]
    assert ids(s, "SELECT id FROM db.public.bigger WHERE id > 30") == [40]


def test_views_are_dml_sources(s):
    s.sql("INSERT INTO t2 SELECT id, v FROM big")
    assert rows(s.sql("SELECT id, v FROM t2")) == [(2, "B"), (3, "C")]
    s.sql("UPDATE t2 SET v = 'x' FROM big WHERE t2.id = big.id AND big.id = 3")
    s.sql("MERGE INTO t2 USING big ON t2.id = big.id WHEN MATCHED AND big.id = 2 THEN DELETE")
    assert rows(s.sql("SELECT id, v FROM t2")) == [(3, "x")]
    s.sql("DELETE FROM t2 USING big WHERE t2.id = big.id")
    assert rows(s.sql("SELECT * FROM t2")) == []


def test_names_in_a_view_mean_what_they_meant_to_its_creator(s, session_factory):
    s.sql("CREATE SCHEMA other")
    s.sql("CREATE TABLE other.t (id NUMBER, v VARCHAR)")
    s.sql("INSERT INTO other.t VALUES (99, 'z')")
    reader = session_factory(schema="OTHER")  # its own t is OTHER.T
    assert ids(reader, "SELECT id FROM public.big") == [2, 3]  # the view still reads PUBLIC.T
    assert ids(reader, "SELECT id FROM t") == [99]


def test_create_or_replace_if_not_exists_show_describe_drop(s):
    with pytest.raises(SqlError) as exists:
        s.sql("CREATE VIEW big AS SELECT 1 AS one")
    assert exists.value.code == "OBJECT_ALREADY_EXISTS" and "OR REPLACE" in str(exists.value)
    (status,) = s.sql("CREATE VIEW IF NOT EXISTS big AS SELECT 1 AS one").collect()
    assert "already exists" in status[0]
    assert ids(s, "SELECT id FROM big") == [2, 3]  # kept
    s.sql("CREATE OR REPLACE VIEW big COMMENT = 'the ''big'' ones' AS SELECT id FROM t WHERE id > 2")
    assert ids(s, "SELECT id FROM big") == [3]
    shown = [r.asDict() for r in s.sql("SHOW VIEWS LIKE 'BI%'").collect()]
    assert [(r["name"], r["schema_name"], r["comment"]) for r in shown] == [
        ("BIG", "PUBLIC", "the 'big' ones")]  # fmt: skip
    assert shown[0]["text"] == "SELECT id FROM t WHERE id > 2"
    assert s.sql("SHOW VIEWS LIKE 'nothing%'").collect() == []
    described = [tuple(r) for r in s.sql("DESCRIBE VIEW big").collect()]
    assert described == [("ID", "DECIMAL(38,0)", "COLUMN", "Y")]
    s.sql("DROP VIEW big")
    with pytest.raises(ObjectNotFoundError):
        s.sql("SELECT * FROM big")
    with pytest.raises(ObjectNotFoundError):
        s.sql("DROP VIEW big")
    (status,) = s.sql("DROP VIEW IF EXISTS big").collect()
    assert "did not exist" in status[0]


def views_and_tables(session):
    return (
        [v.full_name for v in session.catalog.list_views()],
        [t.full_name for t in session.catalog.list_tables()],
    )


@pytest.mark.parametrize(
    ("statement", "code", "fragment"),
    [
        ("INSERT INTO big VALUES (9, 'x')", "SQL_COMPILATION_ERROR", "is a view"),
        ("UPDATE big SET v = 'x'", "SQL_COMPILATION_ERROR", "is a view"),
        ("DELETE FROM big", "SQL_COMPILATION_ERROR", "is a view"),
        ("TRUNCATE TABLE big", "SQL_COMPILATION_ERROR", "is a view"),
        ("SELECT * FROM big AT (VERSION => 0)", "SQL_COMPILATION_ERROR", "time travel"),
        ("SELECT * FROM big CHANGES (INFORMATION => DEFAULT) AT (VERSION => 0)",
         "SQL_COMPILATION_ERROR", "is a view"),
        ("CREATE STREAM sv ON TABLE big", "SQL_COMPILATION_ERROR", "is a view"),
        ("CREATE TABLE big (a NUMBER)", "OBJECT_ALREADY_EXISTS", "a view named DB.PUBLIC.BIG"),
        ("ALTER TABLE t2 RENAME TO big", "OBJECT_ALREADY_EXISTS", "a view named DB.PUBLIC.BIG"),
        ("CREATE STREAM big ON TABLE t", "OBJECT_ALREADY_EXISTS", "a view named DB.PUBLIC.BIG"),
        ("CREATE VIEW t AS SELECT 1 AS one", "OBJECT_ALREADY_EXISTS", "a table named DB.PUBLIC.T"),
        ("CREATE VIEW w AS DELETE FROM t", "SQL_COMPILATION_ERROR", "needs a query"),
        ("CREATE VIEW w AS SELECT * FROM nowhere", "OBJECT_NOT_FOUND", "DB.PUBLIC.NOWHERE"),
        ("CREATE VIEW w AS SELECT * FROM parquet.`/etc`", "OBJECT_NOT_FOUND", "DB.PARQUET./etc"),
        ("CREATE VIEW w AS SELECT reflect('java.lang.System', 'exit', 0)",
         "STATEMENT_NOT_ALLOWED", ""),
        ("CREATE VIEW w AS SELECT * FROM w", "OBJECT_NOT_FOUND", "DB.PUBLIC.W"),
        ("CREATE OR REPLACE VIEW w IF NOT EXISTS AS SELECT 1", "UNSUPPORTED_STATEMENT", ""),
        ('CREATE VIEW "  " AS SELECT 1 AS one', "SQL_EXECUTION_ERROR", "empty or blank"),
    ],
)
def test_refusals_change_nothing(s, statement, code, fragment):
    assert_refused(s, statement, code, fragment, collect=False, unchanged=views_and_tables)
    assert rows(s.sql("SELECT id, v FROM t")) == [(1, "a"), (2, "b"), (3, "c")]


def test_a_view_never_reads_a_stream(s):
    s.sql("CREATE STREAM st ON TABLE t")
    with pytest.raises(SqlError) as refused:
        s.sql("CREATE VIEW reads_stream AS SELECT id FROM st")
    assert "cannot read a stream" in str(refused.value)
    assert s.catalog.get_view("DB", "PUBLIC", "READS_STREAM") is None
    # A view whose table was replaced by a stream of that name is refused when read.
    s.sql("CREATE TABLE gone (id NUMBER)")
    s.sql("CREATE VIEW over_gone AS SELECT id FROM gone")
    s.sql("DROP TABLE gone")
    with pytest.raises(ObjectNotFoundError) as missing:
        s.sql("SELECT * FROM over_gone")
    assert "DB.PUBLIC.GONE" in str(missing.value) and "view DB.PUBLIC.OVER_GONE" in str(missing.value)
    s.sql("CREATE STREAM gone ON TABLE t")
    with pytest.raises(SqlError) as stream_read:
        s.sql("SELECT * FROM over_gone")
    assert "cannot read a stream" in str(stream_read.value)
    assert s.catalog.get_stream("DB", "PUBLIC", "GONE").offset_version >= 0  # not consumed


def test_a_cycle_made_by_replacing_a_view_is_refused(s):
    s.sql("CREATE VIEW a AS SELECT id FROM t")
    s.sql("CREATE VIEW b AS SELECT id FROM a")
    with pytest.raises(SqlError) as cycle:
        s.sql("CREATE OR REPLACE VIEW a AS SELECT id FROM b")
    assert "cycle" in str(cycle.value) and "DB.PUBLIC.A -> DB.PUBLIC.B -> DB.PUBLIC.A" in str(
        cycle.value)  # fmt: skip
    assert ids(s, "SELECT id FROM b") == [1, 2, 3]  # the old A stays


def test_views_in_schemas_drop_with_them(s):
    s.sql("CREATE SCHEMA sc")
    s.sql("CREATE VIEW sc.v AS SELECT 1 AS one")
    with pytest.raises(SqlError) as held:
        s.sql("DROP SCHEMA sc")
    assert "DB.SC.V" in str(held.value)
    s.sql("DROP SCHEMA sc CASCADE")
    assert s.catalog.get_view("DB", "SC", "V") is None


def test_tablesample_is_kept_when_a_table_is_bound(s):
    """The binder replaces a table by its view; the sample belongs to the reference
    (it was dropped, so TABLESAMPLE (0 ROWS) read every row)."""
    assert rows(s.sql("SELECT id FROM t TABLESAMPLE (0 ROWS)")) == []
    assert len(rows(s.sql("SELECT id FROM t TABLESAMPLE (100 PERCENT)"))) == 3
