"""Column lists: ``FOR A(BALANCE, OWNER)`` watches those columns and the keys, ``FOR A()``
the keys only. What each value capture type's records hold under a list (Spanner's
table of them), updates of unwatched columns that make no record, ALTER ... SET FOR
between a list and the whole table, SHOW and INFORMATION_SCHEMA, and the lists the
door refuses (with nothing changed)."""

from __future__ import annotations

import time

import pytest

from flush.commit_clock import now_us
from pipelines import SqlError
from pipelines.change_streams.read import ReadArgs
from pipelines.change_streams.read import read as read_records
from pipelines.sql.statements import classify
from tests.pipelines.change_streams.test_read import changes
from tests.pipelines.refusals import assert_refused

TABLE = "CREATE TABLE A (ID NUMBER PRIMARY KEY, BALANCE NUMBER, OWNER VARCHAR, NOTE VARCHAR)"
CAPTURES = ("OLD_AND_NEW_VALUES", "NEW_VALUES", "NEW_ROW", "NEW_ROW_AND_OLD_VALUES")


def mods(session, cs):
    """Every (mod_type, keys, new_values, old_values, column names) the stream's one
    partition returns from its creation up to now, in commit order (read by the reader
    every face runs; the SQL face is the one of test_exclusions)."""
    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    (partition,) = session.catalog.list_partitions(stream.uid)
    args = ReadArgs(stream.created_us, None, partition.token, 1000)
    found = changes(read_records(session.catalog, stream, args, until_us=now_us()))
    return [(c["mod_type"], m["keys"], m["new_values"], m["old_values"],
             [t["name"] for t in c["column_types"]]) for c in found for m in c["mods"]]  # fmt: skip


def test_each_value_capture_type_with_a_column_list(session):
    s = session
    s.sql(TABLE)
    for capture in CAPTURES:
        s.sql(f"CREATE CHANGE STREAM {capture} FOR A(BALANCE, OWNER) "
              f"OPTIONS (value_capture_type = '{capture}')")  # fmt: skip
    s.sql("CREATE CHANGE STREAM KEYS_ONLY FOR A()")
    s.sql("CREATE CHANGE STREAM WHOLE FOR A")
    s.sql("INSERT INTO A VALUES (1, 10, 'ann', 'x')")
    s.sql("UPDATE A SET NOTE = 'y' WHERE ID = 1")  # unwatched by the lists: no record
    s.sql("UPDATE A SET BALANCE = 20, NOTE = 'z' WHERE ID = 1")
    s.sql("DELETE FROM A")
    key, both, watched = {"ID": 1}, {"BALANCE": 20, "OWNER": "ann"}, ["ID", "BALANCE", "OWNER"]
    insert = ("INSERT", key, {"BALANCE": 10, "OWNER": "ann"}, {}, watched)
    changed = ["ID", "BALANCE"]
    assert mods(s, "OLD_AND_NEW_VALUES") == [
        insert, ("UPDATE", key, {"BALANCE": 20}, {"BALANCE": 10}, changed),
        ("DELETE", key, {}, both, watched)]  # fmt: skip
    assert mods(s, "NEW_VALUES") == [
        insert,
        ("UPDATE", key, {"BALANCE": 20}, {}, changed),
        ("DELETE", key, {}, {}, watched),
    ]
    assert mods(s, "NEW_ROW") == [
        insert,
        ("UPDATE", key, both, {}, watched),
        ("DELETE", key, {}, {}, watched),
    ]
    assert mods(s, "NEW_ROW_AND_OLD_VALUES") == [
        insert, ("UPDATE", key, both, {"BALANCE": 10}, watched),
        ("DELETE", key, {}, both, watched)]  # fmt: skip
    # The keys only: inserts and deletes, no update.
    assert mods(s, "KEYS_ONLY") == [("INSERT", key, {}, {}, ["ID"]),
                                    ("DELETE", key, {}, {}, ["ID"])]  # fmt: skip
    # The whole table: both updates, every column.
    assert [(kind, new) for kind, _, new, _, _ in mods(s, "WHOLE")] == [
        ("INSERT", {"BALANCE": 10, "OWNER": "ann", "NOTE": "x"}), ("UPDATE", {"NOTE": "y"}),
        ("UPDATE", {"BALANCE": 20, "NOTE": "z"}), ("DELETE", {})]  # fmt: skip


def test_a_table_without_a_primary_key_keeps_its_row_id_key_under_a_list(session):
    s = session
    s.sql("CREATE TABLE N (K NUMBER, V VARCHAR, W VARCHAR)")
    s.sql("CREATE CHANGE STREAM CS FOR N(W) OPTIONS (value_capture_type = 'NEW_ROW')")
    s.sql("INSERT INTO N VALUES (1, 'a', 'b')")
    s.sql("UPDATE N SET K = 2, V = 'c'")  # neither is watched: no record
    s.sql("UPDATE N SET W = 'd'")
    (insert, update) = mods(s, "CS")
    assert insert[0] == "INSERT" and list(insert[1]) == ["METADATA$ROW_ID"]
    assert insert[2:] == ({"W": "b"}, {}, ["METADATA$ROW_ID", "W"])
    assert update == ("UPDATE", insert[1], {"W": "d"}, {}, ["METADATA$ROW_ID", "W"])


def test_alter_between_a_list_and_the_whole_table_shows_everywhere(session):
    s = session
    s.sql(TABLE)
    s.sql('CREATE TABLE "Orders" ("Id" NUMBER PRIMARY KEY, "Qty" NUMBER, "Note" VARCHAR)')
    s.sql('CREATE CHANGE STREAM CS FOR A(owner, "BALANCE"), "Orders"("Qty")')
    s.sql("INSERT INTO A VALUES (1, 10, 'ann', 'x')")
    s.sql("UPDATE A SET NOTE = 'y'")

    def state():
        shown = s.sql("SHOW CHANGE STREAMS LIKE 'CS'").collect()[0]["for"]
        tables = [tuple(r) for r in s.sql(
            "SELECT TABLE_NAME, ALL_COLUMNS FROM INFORMATION_SCHEMA.CHANGE_STREAM_TABLES "
            "ORDER BY TABLE_NAME").collect()]  # fmt: skip
        columns = [tuple(r) for r in s.sql(
            "SELECT CHANGE_STREAM_NAME, TABLE_NAME, COLUMN_NAME FROM "
            "INFORMATION_SCHEMA.CHANGE_STREAM_COLUMNS ORDER BY 2, 3").collect()]  # fmt: skip
        return shown, tables, columns

    assert state() == (
        'DB.PUBLIC.A(OWNER, BALANCE), DB.PUBLIC."Orders"("Qty")',
        [("A", False), ("Orders", False)],
        [("CS", "A", "BALANCE"), ("CS", "A", "OWNER"), ("CS", "Orders", "Qty")],
    )
    before = [("INSERT", {"BALANCE": 10, "OWNER": "ann"})]
    assert [(kind, new) for kind, _, new, _, _ in mods(s, "CS")] == before
    # The whole table for the changes from the ALTER on; earlier ones keep their list.
    s.sql('ALTER CHANGE STREAM CS SET FOR A, "Orders"()')
    assert state() == ('DB.PUBLIC.A, DB.PUBLIC."Orders"()', [("A", True), ("Orders", False)], [])
    assert [(kind, new) for kind, _, new, _, _ in mods(s, "CS")] == before
    s.sql("UPDATE A SET NOTE = 'z'")
    whole = [*before, ("UPDATE", {"NOTE": "z"})]
    assert [(kind, new) for kind, _, new, _, _ in mods(s, "CS")] == whole
    s.sql("ALTER CHANGE STREAM CS SET FOR A(NOTE)")
    s.sql("UPDATE A SET BALANCE = 11")  # unwatched from the ALTER on: no record
    s.sql("UPDATE A SET BALANCE = 12, NOTE = 'w'")
    assert [(kind, new) for kind, _, new, _, _ in mods(s, "CS")] == [
        *whole, ("UPDATE", {"NOTE": "w"})]  # fmt: skip
    s.sql("ALTER CHANGE STREAM CS DROP FOR ALL")
    assert state() == ("", [], [])
    assert s.catalog.get_change_stream("DB", "PUBLIC", "CS").column_lists == ()


_MANY = ", ".join(f"C{i}" for i in range(10_000))


@pytest.mark.parametrize(("statement", "code", "fragments"), [
    ("CREATE CHANGE STREAM X FOR A(BALANSE)", "SQL_COMPILATION_ERROR",
     ("column BALANSE in the column list of DB.PUBLIC.A does not exist (did you mean BALANCE?)",
      "its columns are ID, BALANCE, OWNER, NOTE")),
    ('CREATE CHANGE STREAM X FOR A("balance")', "SQL_COMPILATION_ERROR",
     ('"balance"', "does not exist (did you mean BALANCE?)")),
    ('CREATE CHANGE STREAM X FOR A(OWNER, "NO,PE")', "SQL_COMPILATION_ERROR",
     ('column "NO,PE" in the column list of DB.PUBLIC.A does not exist;',)),
    ('CREATE CHANGE STREAM X FOR A("NO)N") ', "SQL_COMPILATION_ERROR",
     ('column "NO)N" in the column list of DB.PUBLIC.A does not exist;',)),
    ("CREATE CHANGE STREAM X FOR A(ID)", "SQL_COMPILATION_ERROR",
     ("ID in the column list of DB.PUBLIC.A is a primary key column", "write DB.PUBLIC.A()")),
    ("CREATE CHANGE STREAM X FOR N(_INGEST_ROW_ID)", "SQL_COMPILATION_ERROR",
     ("is the hidden row id", "METADATA$ROW_ID")),
    ("CREATE CHANGE STREAM X FOR N(METADATA$ROW_ID)", "SQL_COMPILATION_ERROR",
     ("is the hidden row id",)),
    ("CREATE CHANGE STREAM X FOR A(OWNER, BALANCE, owner)", "SQL_COMPILATION_ERROR",
     ("the column OWNER is listed twice in the column list of DB.PUBLIC.A",)),
    ("CREATE CHANGE STREAM X FOR A(OWNER), a()", "SQL_COMPILATION_ERROR",
     ("the table DB.PUBLIC.A is listed twice",)),
    ("CREATE CHANGE STREAM X FOR A(BALANCE, OWNER", "SQL_COMPILATION_ERROR",
     ("the parenthesis opened at 'A(BALANCE, OWNER' is never closed; end it with ')'",)),
    ("ALTER CHANGE STREAM CS SET FOR A(BALANCE))", "SQL_COMPILATION_ERROR",
     ("closes no parenthesis",)),
    ("ALTER CHANGE STREAM CS SET FOR A(BALANCE)(OWNER)", "SQL_COMPILATION_ERROR",
     ("cannot read what the change stream watches from 'A(BALANCE)(OWNER)' on",
      "FOR <table>[(<column>, ...)]")),
    ("CREATE CHANGE STREAM X FOR A(A.BALANCE)", "SQL_COMPILATION_ERROR",
     ("cannot read what the change stream watches",)),
    (f"CREATE CHANGE STREAM X FOR A({_MANY})", "SQL_COMPILATION_ERROR",
     ("column C0 in the column list of DB.PUBLIC.A does not exist",)),
    (f"ALTER CHANGE STREAM CS SET FOR A({_MANY}", "SQL_COMPILATION_ERROR",
     ("is never closed",)),
    ("ALTER CHANGE STREAM CS SET FOR A(NOPE)", "SQL_COMPILATION_ERROR", ("does not exist",)),
    ("CREATE CHANGE STREAM X FOR ALL(BALANCE)", "SQL_COMPILATION_ERROR",
     ("FOR ALL watches every column of every table: it takes no column list",)),
    ("ALTER CHANGE STREAM CS SET FOR A, all", "SQL_COMPILATION_ERROR",
     ("and no other table",)),
    ("CREATE CHANGE STREAM X FOR MISSING(BALANCE)", "OBJECT_NOT_FOUND",
     ("table DB.PUBLIC.MISSING does not exist",)),
])  # fmt: skip
def test_bad_column_lists_are_refused_and_change_nothing(session, statement, code, fragments):
    session.sql(TABLE)
    session.sql("CREATE TABLE N (K NUMBER, V NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR A(OWNER)")
    error = assert_refused(session, statement, code, *fragments, collect=False,
                           unchanged=lambda s: s.catalog.list_change_streams())  # fmt: skip
    assert len(str(error)) < 1_000  # a 10,000-column list is not echoed back


HOSTILE = [
    "CREATE CHANGE STREAM S FOR " + "a(b), " * 20_000 + "(",
    "CREATE CHANGE STREAM S FOR a(" + "b, " * 50_000,
    "CREATE CHANGE STREAM S FOR a(" + "b " * 50_000 + ")",
    "ALTER CHANGE STREAM S SET FOR " + "a ( b ) " * 20_000,
    "CREATE CHANGE STREAM S FOR a(" + '"' * 100_001,
    "CREATE CHANGE STREAM S FOR " + "a." * 50_000 + "(",
    "CREATE CHANGE STREAM S FOR a(" + "b,)" * 30_000,
    "CREATE CHANGE STREAM S FOR a(" + ", ".join(f'"c{i}' for i in range(20_000)) + ")",
]


@pytest.mark.parametrize("text", HOSTILE, ids=lambda text: f"{text[:30]}...{len(text)}")
def test_hostile_for_clauses_are_refused_in_linear_time(text):
    started = time.process_time()
    with pytest.raises(SqlError) as refused:
        classify(text)
    assert refused.value.code == "SQL_COMPILATION_ERROR", refused.value
    assert len(str(refused.value)) < 600
    assert time.process_time() - started < 2.0
