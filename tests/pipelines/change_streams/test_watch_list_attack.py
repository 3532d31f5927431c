"""Attack of column lists and exclusions (watch_list.py, records.py): quoted and
hostile column names, a transaction that writes a row twice, the numbering of a
transaction's records when a list drops some of its updates, and the errors' hints.

Strict xfails are defects found; the plain tests guard what holds.
"""

from __future__ import annotations

import pytest

from pipelines import SqlError
from tests.pipelines.change_streams.test_exclusions import (
    assert_numbered,
    by_transaction,
    read_partitions,
)
from tests.pipelines.change_streams.test_read import changes


@pytest.fixture(scope="module")
def session(tmp_path_factory, spark):
    from pipelines import Session

    made = Session(tmp_path_factory.mktemp("watch_list_attack") / "warehouse", spark=spark)
    yield made
    made.close()


def mods(session, cs):
    """(mod_type, keys, new_values, old_values) of every record of every partition."""
    tree = read_partitions(session, cs)
    return [(c["mod_type"], m["keys"], m["new_values"], m["old_values"])
            for records in tree.values() for c in changes(records) for m in c["mods"]]  # fmt: skip


def test_quoted_column_names_holding_a_comma_or_a_parenthesis(session):
    s = session
    s.sql('CREATE TABLE "Acc" (ID NUMBER PRIMARY KEY, "bal" NUMBER, B2 NUMBER, "a,b" VARCHAR, '
          '"x)y" VARCHAR)')  # fmt: skip
    s.sql('CREATE CHANGE STREAM Q1 FOR "Acc"("bal", "a,b")')
    s.sql('CREATE CHANGE STREAM Q2 FOR "Acc" ( "x)y" ,b2 )')
    shown = {r.name: r["for"] for r in s.sql("SHOW CHANGE STREAMS LIKE 'Q%'").collect()}
    assert shown == {"Q1": 'DB.PUBLIC."Acc"("bal", "a,b")', "Q2": 'DB.PUBLIC."Acc"("x)y", B2)'}
    # An unquoted name is upper-cased: bal is BAL, which the table does not have.
    with pytest.raises(SqlError, match='did you mean "bal"'):
        s.sql('CREATE CHANGE STREAM Q3 FOR "Acc"(bal)')
    s.sql("INSERT INTO \"Acc\" VALUES (1, 1, 10, 'p', 'q')")
    s.sql('UPDATE "Acc" SET "x)y" = \'r\' WHERE ID = 1')  # Q1 does not watch it
    assert mods(s, "Q1") == [("INSERT", {"ID": 1}, {"bal": 1, "a,b": "p"}, {})]
    assert mods(s, "Q2") == [("INSERT", {"ID": 1}, {"B2": 10, "x)y": "q"}, {}),
                             ("UPDATE", {"ID": 1}, {"x)y": "r"}, {"x)y": "q"})]  # fmt: skip


def test_a_transaction_writing_a_row_twice_under_a_list_and_exclusions(session):
    s = session
    s.sql("CREATE TABLE TX (ID NUMBER PRIMARY KEY, W NUMBER, U NUMBER)")
    s.sql("CREATE CHANGE STREAM NODEL FOR TX(W) OPTIONS (exclude_delete = TRUE)")
    s.sql("INSERT INTO TX VALUES (1, 1, 1)")
    s.sql("BEGIN")
    s.sql("UPDATE TX SET W = 2 WHERE ID = 1")
    s.sql("DELETE FROM TX WHERE ID = 1")
    s.sql("COMMIT")
    s.sql("BEGIN")
    s.sql("INSERT INTO TX VALUES (2, 5, 5)")
    s.sql("UPDATE TX SET U = 6, W = 7 WHERE ID = 2")
    s.sql("COMMIT")
    # The update then delete is one DELETE, excluded; the insert then update one INSERT
    # of the row as committed.
    assert mods(s, "NODEL") == [("INSERT", {"ID": 1}, {"W": 1}, {}),
                                ("INSERT", {"ID": 2}, {"W": 7}, {})]  # fmt: skip


def test_a_list_dropping_updates_keeps_the_transactions_counts_true(session):
    """An UPDATE statement that changes a listed column of one row and only unlisted
    columns of the others: one record, in one partition, counted as such (a reader that
    buffers a transaction until it has number_of_records_in_transaction records must
    not wait for records that never come)."""
    s = session
    s.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, W NUMBER, U NUMBER)")
    s.sql("CREATE CHANGE STREAM L FOR K(W) OPTIONS (partitions = 2)")
    s.sql("INSERT INTO K SELECT id, 0, 0 FROM range(30)")
    s.sql("UPDATE K SET U = 1, W = CASE WHEN ID = 3 THEN 9 ELSE W END")
    tree = read_partitions(s, "L")
    assert_numbered(tree)
    updates = [c for found in by_transaction(tree).values() for _, c in found
               if c["mod_type"] == "UPDATE"]  # fmt: skip
    assert [(len(c["mods"]), c["number_of_partitions_in_transaction"]) for c in updates] == [
        (1, 1)]  # fmt: skip


def test_the_primary_key_hint_names_the_table_as_it_must_be_written(session):
    s = session
    s.sql("CREATE SCHEMA IF NOT EXISTS DB.S2")
    s.sql("USE SCHEMA DB.PUBLIC")  # CREATE SCHEMA made S2 current, as in Snowflake
    s.sql('CREATE TABLE DB.S2."Ord" (K NUMBER PRIMARY KEY, Q NUMBER)')
    with pytest.raises(SqlError) as caught:
        s.sql('CREATE CHANGE STREAM DB.PUBLIC.X1 FOR DB.S2."Ord"(K)')
    assert '"Ord"()' in str(caught.value), str(caught.value)


def test_records_under_lists_parse_as_the_sdk_reader_parses_them(session):
    """What a reader gets under a column list (keys only, a row-id key at ordinal 0, the
    NEW_ROW types' listed columns) is well formed for the SDK: nothing missing from a
    list makes ``record_from_json`` refuse it, and ``to_json`` gives it back."""
    from ingest_sdk.change_records import DataChangeRecord, record_from_json

    s = session
    s.sql("USE SCHEMA DB.PUBLIC")
    s.sql("CREATE TABLE NK (K NUMBER, V VARCHAR, W VARCHAR)")
    s.sql("CREATE CHANGE STREAM NK_KEYS FOR NK()")
    s.sql("CREATE CHANGE STREAM NK_ROW FOR NK(W) "
          "OPTIONS (value_capture_type = 'NEW_ROW_AND_OLD_VALUES')")  # fmt: skip
    s.sql("INSERT INTO NK VALUES (1, 'a', 'b')")
    s.sql("UPDATE NK SET V = 'c', W = 'd'")
    s.sql("DELETE FROM NK")
    seen = []
    for cs in ("NK_KEYS", "NK_ROW"):
        for records in read_partitions(s, cs).values():
            for raw in records:
                parsed = record_from_json(raw)
                assert parsed.to_json() == {k: v for k, v in raw.items() if k == parsed.KEY}
                if isinstance(parsed, DataChangeRecord):
                    seen.append((cs, parsed.mod_type, parsed.mods[0]["new_values"]))
    assert seen == [("NK_KEYS", "INSERT", {}), ("NK_KEYS", "DELETE", {}),
                    ("NK_ROW", "INSERT", {"W": "b"}), ("NK_ROW", "UPDATE", {"W": "d"}),
                    ("NK_ROW", "DELETE", {})]  # fmt: skip


def test_records_committed_before_a_replace_stay_readable_within_retention(session):
    """The stream stops watching the replaced table (docs), but what it recorded of that
    table before stays readable for the retention period, as Spanner keeps every record
    of its retention period (a reader resuming from before the replace must not lose a
    committed change)."""
    s = session
    s.sql("USE SCHEMA DB.PUBLIC")
    s.sql("CREATE TABLE RP (ID NUMBER PRIMARY KEY, V NUMBER)")
    s.sql("CREATE CHANGE STREAM RPS FOR RP(V)")
    s.sql("INSERT INTO RP VALUES (1, 10)")
    before = mods(s, "RPS")
    assert before == [("INSERT", {"ID": 1}, {"V": 10}, {})]
    s.sql("CREATE OR REPLACE TABLE RP (ID NUMBER PRIMARY KEY, V NUMBER)")
    assert mods(s, "RPS") == before
