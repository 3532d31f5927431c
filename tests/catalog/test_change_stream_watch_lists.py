"""A change stream's column lists and ``exclude_*`` options in the catalog: stored,
replaced with the tables by ALTER ... SET FOR, merged by ALTER ... SET OPTIONS, durable;
and a catalog file made before they existed opens, its streams watching whole tables
with nothing excluded."""

from __future__ import annotations

import sqlite3

from catalog import SqliteCatalog, open_catalog
from ingest_sdk import TableSchema

SCHEMA = TableSchema.parse({"ID": "NUMBER", "V": "VARCHAR", "W": "VARCHAR"})


def test_column_lists_and_exclusions_are_kept_replaced_and_merged(
    catalog, catalog_location, tmp_path
):
    t = catalog.create_table("DB", "S", "T", str(tmp_path / "t"), SCHEMA)
    u = catalog.create_table("DB", "S", "U", str(tmp_path / "u"), SCHEMA)
    made = catalog.create_change_stream(
        "DB", "S", "CS", for_all=False, table_ids=(t.id, u.id), value_capture_type="NEW_ROW",
        retention_s=60, created_us=1, column_lists=((t.id, ("W", "V")),),
        exclusions={"exclude_delete": True, "exclude_insert": False},
    )  # fmt: skip
    assert made.column_lists == ((t.id, ("W", "V")),)
    assert made.watched_columns(t.id) == ("W", "V") and made.watched_columns(u.id) is None
    # In the options' own order, as given (false too: it was given).
    assert made.exclusions == (("exclude_insert", False), ("exclude_delete", True))
    assert made.excluded_mod_types == frozenset({"DELETE"})
    # SET OPTIONS merges; the column lists stay.
    assert catalog.alter_change_stream(
        made.id, exclusions={"exclude_update": True, "exclude_ttl_deletes": True}
    )
    merged = catalog.get_change_stream("DB", "S", "CS")
    assert merged.exclusions == (
        ("exclude_insert", False),
        ("exclude_update", True),
        ("exclude_delete", True),
        ("exclude_ttl_deletes", True),
    )
    assert merged.excluded_mod_types == frozenset({"UPDATE", "DELETE"})
    assert merged.column_lists == made.column_lists
    # SET FOR replaces the tables and their lists together; the options stay.
    assert catalog.alter_change_stream(made.id, for_all=False, table_ids=(u.id,),
                                       column_lists=((u.id, ()),))  # fmt: skip
    altered = catalog.get_change_stream("DB", "S", "CS")
    assert altered.column_lists == ((u.id, ()),) and altered.watched_columns(u.id) == ()
    assert altered.exclusions == merged.exclusions
    assert catalog.alter_change_stream(made.id, for_all=True, table_ids=())
    assert catalog.get_change_stream("DB", "S", "CS").column_lists == ()
    reopened = open_catalog(catalog_location)
    try:
        assert reopened.get_change_stream("DB", "S", "CS") == catalog.get_change_stream(
            "DB", "S", "CS")  # fmt: skip
    finally:
        reopened.close()


#: ``change_streams`` as the release before column lists and exclusions made it.
_OLD_CHANGE_STREAMS = """
CREATE TABLE change_streams (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    database TEXT NOT NULL, schema_name TEXT NOT NULL, name TEXT NOT NULL,
    for_all INTEGER NOT NULL, table_ids TEXT NOT NULL, value_capture_type TEXT NOT NULL,
    retention_s INTEGER NOT NULL, created_at REAL NOT NULL, created_us INTEGER NOT NULL,
    uid TEXT NOT NULL, UNIQUE (database, schema_name, name));
"""


def test_a_catalog_made_before_column_lists_opens_and_takes_them(tmp_path):
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(_OLD_CHANGE_STREAMS)
    old.execute(
        "INSERT INTO change_streams (database, schema_name, name, for_all, table_ids,"
        " value_capture_type, retention_s, created_at, created_us, uid)"
        " VALUES ('DB', 'S', 'CS', 0, '[7]', 'NEW_VALUES', 3600, 1.5, 15, 'abc')"
    )
    old.commit()
    old.close()
    catalog = SqliteCatalog(path)
    try:
        (stream,) = catalog.list_change_streams()
        assert (stream.full_name, stream.table_ids, stream.value_capture_type, stream.uid) == (
            "DB.S.CS", (7,), "NEW_VALUES", "abc")  # fmt: skip
        assert stream.column_lists == () and stream.exclusions == ()
        assert stream.watched_columns(7) is None and stream.excluded_mod_types == frozenset()
        assert catalog.alter_change_stream(stream.id, for_all=False, table_ids=(7,),
                                           column_lists=((7, ("V",)),),
                                           exclusions={"exclude_insert": True})  # fmt: skip
    finally:
        catalog.close()
    again = SqliteCatalog(path)  # the upgraded file opens again
    try:
        stream = again.get_change_stream("DB", "S", "CS")
        assert stream.column_lists == ((7, ("V",)),)
        assert stream.exclusions == (("exclude_insert", True),)
    finally:
        again.close()
