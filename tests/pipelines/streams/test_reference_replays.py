"""Replays of the reference's worked examples (Databend, Snowflake), statement by
statement, comparing every intermediate stream result, plus the stream behaviours the
reference lists (offsets, noise, points, staleness, renames)."""


import pytest

from pipelines import SqlError, StreamConflictError, StreamStaleError
from tests.pipelines.conftest import rows

INSERT, DELETE = "INSERT", "DELETE"


def changes(session, source, column="a"):
    """``(value, action, is_update)`` of every change row of a stream (or CHANGES query)."""
    return rows(session.sql(f"SELECT {column}, METADATA$ACTION, METADATA$ISUPDATE FROM {source}"))


def with_ids(session, source, column="a"):
    """``(value, action, is_update, row_id)`` of every change row."""
    return rows(
        session.sql(
            f"SELECT {column}, METADATA$ACTION, METADATA$ISUPDATE, METADATA$ROW_ID FROM {source}"
        )
    )


def values(session, table, column="a"):
    return [row[0] for row in rows(session.sql(f"SELECT {column} FROM {table}"))]


def show_stream(session, name):
    """The SHOW STREAMS row of one stream, as a dict."""
    found = [r.asDict() for r in session.sql("SHOW STREAMS").collect() if r["name"] == name]
    assert len(found) == 1, found
    return found[0]


def both(session, statement):
    """Run ``statement`` (with ``{t}``) on both tables of the Databend example."""
    for table in ("t_standard", "t_append_only"):
        session.sql(statement.format(t=table))


# 1. Databend: a standard stream against a final-state append-only stream.
def test_databend_standard_against_append_only(session):
    for table in ("t_standard", "t_append_only", "t_consume_standard", "t_consume_append_only"):
        session.sql(f"CREATE TABLE {table}(a INT)")
    session.sql("CREATE STREAM s_standard ON TABLE t_standard APPEND_ONLY=false")
    session.sql("CREATE STREAM s_append_only ON TABLE t_append_only APPEND_ONLY=FINAL")
    assert show_stream(session, "S_STANDARD")["mode"] == "DEFAULT"
    assert show_stream(session, "S_APPEND_ONLY")["mode"] == "APPEND_ONLY_FINAL"

    both(session, "INSERT INTO {t} VALUES (2), (3)")
    expected = [(2, INSERT, False), (3, INSERT, False)]
    assert changes(session, "s_standard") == expected
    assert changes(session, "s_append_only") == expected

    both(session, "UPDATE {t} SET a = 4 WHERE a = 2")
    expected = [(3, INSERT, False), (4, INSERT, False)]
    assert changes(session, "s_standard") == expected
    assert changes(session, "s_append_only") == expected

    both(session, "DELETE FROM {t} WHERE a = 4")
    assert changes(session, "s_standard") == [(3, INSERT, False)]
    assert changes(session, "s_append_only") == [(3, INSERT, False)]

    inserted = session.sql("INSERT INTO t_consume_standard SELECT a FROM s_standard").collect()
    assert inserted[0]["number of rows inserted"] == 1
    session.sql("INSERT INTO t_consume_append_only SELECT a FROM s_append_only")
    assert values(session, "t_consume_standard") == [3]
    assert values(session, "t_consume_append_only") == [3]
    assert changes(session, "s_standard") == []
    assert changes(session, "s_append_only") == []

    both(session, "UPDATE {t} SET a = 4 WHERE a = 3")
    pair = with_ids(session, "s_standard")
    assert [r[:3] for r in pair] == [(3, DELETE, True), (4, INSERT, True)]
    assert pair[0][3] == pair[1][3]  # the same row
    assert changes(session, "s_append_only") == []

    both(session, "DELETE FROM {t} WHERE a = 4")
    assert changes(session, "s_standard") == [(3, DELETE, False)]
    assert changes(session, "s_append_only") == []
    # Reading never consumed anything: the targets still hold the one consumed row.
    assert values(session, "t_consume_standard") == [3]
    assert values(session, "t_consume_append_only") == [3]


# 2. Snowflake: append-only streams keep every inserted row, as inserted.
def test_snowflake_append_only_keeps_deleted_inserts(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("CREATE STREAM s_append ON TABLE t APPEND_ONLY = TRUE")
    session.sql("CREATE STREAM s_standard ON TABLE t")
    session.sql("CREATE STREAM s_final ON TABLE t APPEND_ONLY = FINAL")
    assert show_stream(session, "S_APPEND")["mode"] == "APPEND_ONLY"
    session.sql("INSERT INTO t VALUES " + ", ".join(f"({i})" for i in range(1, 11)))
    session.sql("DELETE FROM t WHERE a > 5")

    assert changes(session, "s_append") == [(i, INSERT, False) for i in range(1, 11)]
    assert changes(session, "s_standard") == [(i, INSERT, False) for i in range(1, 6)]
    assert changes(session, "s_final") == [(i, INSERT, False) for i in range(1, 6)]


def test_snowflake_append_only_shows_a_row_as_inserted(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("CREATE STREAM s_append ON TABLE t APPEND_ONLY = TRUE")
    session.sql("CREATE STREAM s_final ON TABLE t APPEND_ONLY = FINAL")
    session.sql("CREATE STREAM s_standard ON TABLE t")
    session.sql("INSERT INTO t VALUES (1)")
    session.sql("UPDATE t SET a = 2 WHERE a = 1")

    assert changes(session, "s_append") == [(1, INSERT, False)]
    assert changes(session, "s_final") == [(2, INSERT, False)]
    assert changes(session, "s_standard") == [(2, INSERT, False)]


# 3. Repeatable read: a transaction sees and consumes the changes as of its first read.
def test_repeatable_read_then_consume(session_factory):
    a = session_factory()
    b = session_factory()  # the same warehouse: another client
    a.sql("CREATE TABLE t1(a INT)")
    a.sql("CREATE TABLE target(a INT)")
    a.sql("CREATE TABLE target_b(a INT)")
    a.sql("CREATE STREAM s1 ON TABLE t1")
    a.sql("INSERT INTO t1 VALUES (1), (2)")
    first_seen = [(1, INSERT, False), (2, INSERT, False)]

    a.sql("BEGIN")
    assert changes(a, "s1") == first_seen
    # SHOW cannot run inside a transaction: ask the other session.
    t1_view = show_stream(b, "S1")["offset_version"] + 1  # the insert's version
    b.sql("UPDATE t1 SET a = 20 WHERE a = 2")  # T2: autocommit
    assert changes(a, "s1") == first_seen  # repeatable read
    assert changes(b, "s1") == [(1, INSERT, False), (20, INSERT, False)]
    a.sql("INSERT INTO target SELECT a FROM s1")
    assert changes(a, "s1") == first_seen  # still the transaction's view
    a.sql("COMMIT")

    assert values(a, "target") == [1, 2]
    assert show_stream(a, "S1")["offset_version"] == t1_view
    assert show_stream(b, "S1")["offset_version"] == t1_view
    after = with_ids(a, "s1")  # exactly T2's change, as an update pair
    assert [r[:3] for r in after] == [(2, DELETE, True), (20, INSERT, True)]
    assert after[0][3] == after[1][3]
    assert with_ids(b, "s1") == after

    # Two consumers of T2's change: the first to commit wins, the other changes nothing.
    a.sql("BEGIN")
    a.sql("INSERT INTO target SELECT a FROM s1")
    b.sql("INSERT INTO target_b SELECT a FROM s1")  # autocommit: consumes first
    with pytest.raises(StreamConflictError):
        a.sql("COMMIT")
    assert values(a, "target") == [1, 2]
    assert values(a, "target_b") == [2, 20]
    assert changes(a, "s1") == []


def test_a_stale_transaction_never_moves_an_offset_backwards(session_factory):
    a = session_factory()
    b = session_factory()
    for table in ("t1", "tgt", "tgt2"):
        a.sql(f"CREATE TABLE {table}(a INT)")
    a.sql("CREATE STREAM s1 ON TABLE t1")
    a.sql("INSERT INTO t1 VALUES (1)")

    a.sql("BEGIN")
    a.sql("SELECT * FROM t1").collect()  # pins t1 at the version holding 1
    b.sql("INSERT INTO t1 VALUES (2)")
    b.sql("INSERT INTO tgt SELECT a FROM s1")  # consumes 1 and 2
    consumed = show_stream(b, "S1")["offset_version"]
    # The stream moved past A's snapshot of t1: A may not use it (refused at the read).
    with pytest.raises(StreamConflictError):
        a.sql("INSERT INTO tgt2 SELECT a FROM s1")
    a.sql("COMMIT")
    assert values(b, "tgt2") == []

    assert values(b, "tgt") == [1, 2]
    assert show_stream(b, "S1")["offset_version"] >= consumed
    assert changes(b, "s1") == []  # 2 was consumed already: never delivered again


def test_rollback_leaves_the_stream_where_it_was(session):
    session.sql("CREATE TABLE t1(a INT)")
    session.sql("CREATE TABLE target(a INT)")
    session.sql("CREATE STREAM s1 ON TABLE t1")
    session.sql("INSERT INTO t1 VALUES (1), (2)")
    offset = show_stream(session, "S1")["offset_version"]
    pending = [(1, INSERT, False), (2, INSERT, False)]

    session.sql("BEGIN")
    session.sql("INSERT INTO target SELECT a FROM s1")
    assert values(session, "target") == [1, 2]  # the transaction sees its own write
    session.sql("ROLLBACK")
    assert changes(session, "s1") == pending
    assert values(session, "target") == []
    assert show_stream(session, "S1")["offset_version"] == offset

    class Abort(Exception):
        pass

    with pytest.raises(Abort), session.transaction():
        session.sql("INSERT INTO target SELECT a FROM s1")
        raise Abort
    assert changes(session, "s1") == pending
    assert values(session, "target") == []

    with session.transaction():
        session.sql("INSERT INTO target SELECT a FROM s1")
    assert values(session, "target") == [1, 2]
    assert changes(session, "s1") == []


# 4. More behaviours.
def test_reading_never_moves_a_stream_and_an_empty_consumption_does(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("CREATE TABLE tgt(a INT)")
    session.sql("CREATE STREAM s ON TABLE t")
    session.sql("INSERT INTO t VALUES (1), (2)")
    offset = show_stream(session, "S")["offset_version"]
    expected = [(1, INSERT, False), (2, INSERT, False)]
    assert changes(session, "s") == expected
    assert changes(session, "s") == expected
    assert session.sql("SELECT COUNT(*) AS n FROM s").collect()[0]["N"] == 2
    assert show_stream(session, "S")["offset_version"] == offset

    result = session.sql("INSERT INTO tgt SELECT a FROM s WHERE 1 = 0").collect()
    assert result[0]["number of rows inserted"] == 0
    assert changes(session, "s") == []
    assert values(session, "tgt") == []
    assert show_stream(session, "S")["offset_version"] == offset + 1  # the insert's version


def test_noise_and_net_changes_in_a_standard_stream(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("INSERT INTO t VALUES (3), (5), (5)")
    session.sql("CREATE STREAM s ON TABLE t")

    session.sql("UPDATE t SET a = a")  # copy-on-write rewrites, no value changes
    assert changes(session, "s") == []
    session.sql("UPDATE t SET a = 4 WHERE a = 3")
    session.sql("UPDATE t SET a = 3 WHERE a = 4")  # and back
    assert changes(session, "s") == []

    session.sql("UPDATE t SET a = 6 WHERE a = 5")  # both rows holding 5
    session.sql("UPDATE t SET a = 5 WHERE a = 6")
    assert changes(session, "s") == []
    session.sql("UPDATE t SET a = 4 WHERE a = 3")  # a real change at last
    assert changes(session, "s") == [(3, DELETE, True), (4, INSERT, True)]


def test_duplicate_values_delete_one(session):
    session.sql("CREATE TABLE t(a INT, b INT)")
    session.sql("INSERT INTO t VALUES (5, 1), (5, 2)")
    session.sql("CREATE STREAM s ON TABLE t")
    session.sql("DELETE FROM t WHERE b = 2")
    assert rows(session.sql("SELECT a, b, METADATA$ACTION, METADATA$ISUPDATE FROM s")) == [
        (5, 2, DELETE, False)
    ]
    assert rows(session.sql("SELECT a, b FROM t")) == [(5, 1)]


def test_insert_then_update_is_one_insert_with_the_new_value(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("CREATE STREAM s ON TABLE t")
    session.sql("CREATE STREAM s_other ON TABLE t")
    session.sql("INSERT INTO t VALUES (1), (2)")
    session.sql("UPDATE t SET a = 10 WHERE a = 1")
    assert changes(session, "s") == [(2, INSERT, False), (10, INSERT, False)]
    # The same row has the same id in every stream on the table.
    assert with_ids(session, "s") == with_ids(session, "s_other")
    assert len({r[3] for r in with_ids(session, "s")}) == 2


def test_stream_points_and_changes_clause(session):
    session.sql("CREATE TABLE t(a INT)")
    version = lambda: show_stream(session, "PROBE")["offset_version"]  # noqa: E731
    session.sql("CREATE STREAM probe ON TABLE t")
    v0 = version()
    session.sql("INSERT INTO t VALUES (1)")  # v0 + 1
    session.sql("INSERT INTO t VALUES (2)")  # v0 + 2
    session.sql("UPDATE t SET a = 20 WHERE a = 2")  # v0 + 3
    session.sql("DELETE FROM t WHERE a = 1")  # v0 + 4
    session.sql("CREATE OR REPLACE STREAM probe ON TABLE t")
    assert version() == v0 + 4

    session.sql(f"CREATE STREAM s_at ON TABLE t AT (VERSION => {v0 + 1})")
    assert show_stream(session, "S_AT")["offset_version"] == v0 + 1
    # After version v0+1: the insert of 2, its update, the delete of 1.
    assert changes(session, "s_at") == [(1, DELETE, False), (20, INSERT, False)]

    session.sql(f"CREATE STREAM s_before ON TABLE t BEFORE (VERSION => {v0 + 1})")
    assert show_stream(session, "S_BEFORE")["offset_version"] == v0
    assert changes(session, "s_before") == [(20, INSERT, False)]  # 1 came and went

    session.sql(f"CREATE STREAM s_mid ON TABLE t AT (VERSION => {v0 + 2})")
    assert changes(session, "s_mid") == [(1, DELETE, False), (2, DELETE, True), (20, INSERT, True)]
    session.sql("CREATE STREAM s_copy ON TABLE t AT (STREAM => s_mid)")
    assert show_stream(session, "S_COPY")["offset_version"] == v0 + 2
    assert with_ids(session, "s_copy") == with_ids(session, "s_mid")

    # CHANGES between two versions: the net change of that range, moving nothing.
    between = (
        f"t CHANGES (INFORMATION => DEFAULT) AT (VERSION => {v0 + 1}) END (VERSION => {v0 + 3})"
    )
    assert changes(session, between) == [(20, INSERT, False)]
    between = (
        f"t CHANGES (INFORMATION => DEFAULT) AT (VERSION => {v0 + 2}) END (VERSION => {v0 + 3})"
    )
    assert changes(session, between) == [(2, DELETE, True), (20, INSERT, True)]
    upto_now = f"t CHANGES (INFORMATION => DEFAULT) AT (VERSION => {v0})"
    assert changes(session, upto_now) == [(20, INSERT, False)]
    append = f"t CHANGES (INFORMATION => APPEND_ONLY) AT (VERSION => {v0})"
    assert changes(session, append) == [(1, INSERT, False), (2, INSERT, False)]
    final = f"t CHANGES (INFORMATION => APPEND_ONLY_FINAL) AT (VERSION => {v0})"
    assert changes(session, final) == [(20, INSERT, False)]
    assert show_stream(session, "S_AT")["offset_version"] == v0 + 1
    assert show_stream(session, "S_MID")["offset_version"] == v0 + 2
    assert show_stream(session, "PROBE")["offset_version"] == v0 + 4
    assert changes(session, "probe") == []


def test_merge_and_delete_all(session):
    session.sql("CREATE TABLE t(a INT, b INT)")
    session.sql("CREATE TABLE src(a INT, b INT, op INT)")
    session.sql("INSERT INTO t VALUES (1, 10), (2, 20), (3, 30)")
    session.sql("INSERT INTO src VALUES (1, 11, 0), (2, 0, 1), (4, 40, 0)")
    session.sql("CREATE STREAM s ON TABLE t")
    merged = session.sql(
        "MERGE INTO t USING src ON t.a = src.a"
        " WHEN MATCHED AND src.op = 1 THEN DELETE"
        " WHEN MATCHED THEN UPDATE SET b = src.b"
        " WHEN NOT MATCHED THEN INSERT (a, b) VALUES (src.a, src.b)"
    ).collect()[0]
    assert merged["number of rows inserted"] == 1
    assert merged["number of rows updated"] == 1
    assert merged["number of rows deleted"] == 1
    change = lambda: rows(  # noqa: E731
        session.sql("SELECT a, b, METADATA$ACTION, METADATA$ISUPDATE FROM s")
    )
    assert change() == [
        (1, 10, DELETE, True),
        (1, 11, INSERT, True),
        (2, 20, DELETE, False),
        (4, 40, INSERT, False),
    ]
    assert rows(session.sql("SELECT a, b FROM t")) == [(1, 11), (3, 30), (4, 40)]

    session.sql("CREATE OR REPLACE STREAM s ON TABLE t")
    deleted = session.sql("DELETE FROM t").collect()[0]
    assert deleted["number of rows deleted"] == 3
    assert change() == [(1, 11, DELETE, False), (3, 30, DELETE, False), (4, 40, DELETE, False)]


def test_recreated_table_makes_the_stream_stale_and_rename_does_not(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("CREATE STREAM s ON TABLE t")
    session.sql("INSERT INTO t VALUES (1)")
    session.sql("ALTER TABLE t RENAME TO u")
    assert changes(session, "s") == [(1, INSERT, False)]
    session.sql("INSERT INTO u VALUES (2)")
    assert changes(session, "s") == [(1, INSERT, False), (2, INSERT, False)]
    assert show_stream(session, "S")["stale"] is False
    assert show_stream(session, "S")["table_name"].endswith(".U")

    session.sql("DROP TABLE u")
    session.sql("CREATE TABLE u(a INT)")
    assert show_stream(session, "S")["stale"] is True
    with pytest.raises(StreamStaleError):
        session.sql("SELECT * FROM s").collect()
    session.sql("CREATE OR REPLACE STREAM s ON TABLE u")
    assert show_stream(session, "S")["stale"] is False
    assert changes(session, "s") == []
    session.sql("INSERT INTO u VALUES (3)")
    assert changes(session, "s") == [(3, INSERT, False)]


def test_a_table_cannot_take_a_streams_name(session):
    session.sql("CREATE TABLE t(a INT)")
    session.sql("CREATE STREAM s ON TABLE t")
    session.sql("INSERT INTO t VALUES (1)")
    with pytest.raises(SqlError):
        session.sql("CREATE TABLE s(a INT)")
    assert changes(session, "s") == [(1, INSERT, False)]


# 4. Snowflake (000): a stream on a join view, statement by statement.
def _view_rows(session, source):
    """Rows (sorted) and columns of the orders/customers view or of its stream, as the
    reference prints them (``SELECT * EXCLUDE METADATA$ROW_ID`` there, ``EXCEPT`` in Spark)."""
    stream = source.lower().endswith("stream")
    found = session.sql(f"SELECT * {'EXCEPT (METADATA$ROW_ID) ' if stream else ''}FROM {source}")
    return sorted((int(r[0]), *r[1:]) for r in found.collect()), found.columns


def test_snowflake_stream_on_a_join_view(session):
    for statement in (
        "create or replace table orders (id int, order_name varchar)",
        "create or replace table customers (id int, customer_name varchar)",
        "create or replace view ordersByCustomer as select * from orders natural join customers",
        "insert into orders values (1, 'order1')",
        "insert into customers values (1, 'customer1')",
        "create or replace stream ordersByCustomerStream on view ordersBycustomer",
    ):
        session.sql(statement)
    stream_columns = ["ID", "ORDER_NAME", "CUSTOMER_NAME", "METADATA$ACTION", "METADATA$ISUPDATE"]
    assert _view_rows(session, "ordersByCustomer") == (
        [(1, "order1", "customer1")], ["ID", "ORDER_NAME", "CUSTOMER_NAME"])  # fmt: skip
    assert _view_rows(session, "ordersByCustomerStream") == ([], stream_columns)

    session.sql("insert into orders values (1, 'order2')")
    assert _view_rows(session, "ordersByCustomer")[0] == [
        (1, "order1", "customer1"), (1, "order2", "customer1")]  # fmt: skip
    assert _view_rows(session, "ordersByCustomerStream")[0] == [
        (1, "order2", "customer1", INSERT, False)]  # fmt: skip

    session.sql("insert into customers values (1, 'customer2')")
    assert _view_rows(session, "ordersByCustomer")[0] == [
        (1, "order1", "customer1"), (1, "order1", "customer2"),
        (1, "order2", "customer1"), (1, "order2", "customer2")]  # fmt: skip
    assert _view_rows(session, "ordersByCustomerStream")[0] == [
        (1, "order1", "customer2", INSERT, False),
        (1, "order2", "customer1", INSERT, False),
        (1, "order2", "customer2", INSERT, False),
    ]
    row = show_stream(session, "ORDERSBYCUSTOMERSTREAM")
    assert (row["source_type"], row["table_name"], row["base_tables"]) == (
        "VIEW", "DB.PUBLIC.ORDERSBYCUSTOMER", "DB.PUBLIC.ORDERS, DB.PUBLIC.CUSTOMERS")  # fmt: skip


def test_snowflake_append_only_stream_on_a_join_view(session):
    """For append-only streams the deltas hold inserts only, the tables at the offset
    their whole content (updates before the offset included)."""
    session.sql("create table orders (id int, order_name varchar)")
    session.sql("create table customers (id int, customer_name varchar)")
    session.sql("create view v as select * from orders natural join customers")
    session.sql("insert into orders values (1, 'order1'), (2, 'order9')")
    session.sql("insert into customers values (1, 'customer1'), (2, 'customer9')")
    session.sql("create stream s on view v append_only = true")
    session.sql("delete from customers where id = 2")  # not in an append-only stream
    session.sql("insert into orders values (1, 'order2')")
    session.sql("insert into customers values (1, 'customer2')")
    found = rows(session.sql("SELECT ID, ORDER_NAME, CUSTOMER_NAME, METADATA$ACTION FROM s"))
    assert [(int(r[0]), *r[1:]) for r in found] == [
        (1, "order1", "customer2", INSERT),
        (1, "order2", "customer1", INSERT),
        (1, "order2", "customer2", INSERT),
    ]
