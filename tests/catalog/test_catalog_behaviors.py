"""The contract every catalog implementation must pass (SQLite today)."""

import time

import pytest

from catalog import SqliteCatalog
from flush import ChannelProgress, CommitRecord
from ingest_sdk import TableAlreadyExistsError, TableNotFoundError, TableSchema

SCHEMA = TableSchema.parse({"ID": "INT NOT NULL", "S": "VARCHAR(3)"})


@pytest.fixture(params=["sqlite"])
def catalog(request, tmp_path):
    implementation = {"sqlite": lambda: SqliteCatalog(tmp_path / "catalog.sqlite")}[request.param]
    made = implementation()
    yield made
    made.close()


def record(version, *channels, next_row_id=10):
    return CommitRecord(version, tuple(ChannelProgress(*c) for c in channels), next_row_id, 5)


def test_tables(catalog):
    info = catalog.create_table("DB", "S", "T", "/w/DB/S/T", SCHEMA)
    assert (info.full_name, info.schema, info.applied_version) == ("DB.S.T", SCHEMA, 0)
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("DB", "S", "T", "/w/DB/S/T", SCHEMA)
    assert catalog.get_table("DB", "S", "T") == info
    assert catalog.get_table_by_id(info.id) == info
    assert [t.name for t in catalog.list_tables()] == ["T"]
    catalog.drop_table(info.id)
    with pytest.raises(TableNotFoundError):
        catalog.get_table("DB", "S", "T")
    recreated = catalog.create_table("DB", "S", "T", "/w/DB/S/T", SCHEMA)
    assert recreated.id != info.id  # ids are never reused


def test_open_bumps_the_generation_durably(catalog, tmp_path):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert catalog.open_channel(table.id, "c").generation == 1
    assert catalog.open_channel(table.id, "c").generation == 2
    assert catalog.get_channel(table.id, "c").offset_token is None
    if isinstance(catalog, SqliteCatalog):
        again = SqliteCatalog(tmp_path / "catalog.sqlite")
        assert again.open_channel(table.id, "c").generation == 3
        again.close()


def test_open_starts_above_a_generation_the_log_holds(catalog):
    """A dropped channel's row is gone but its Delta app transaction is not: reopened, it
    must start above the generation the log holds."""
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    assert catalog.open_channel(table.id, "c", min_generation=4).generation == 4
    assert catalog.open_channel(table.id, "c", min_generation=2).generation == 5
    assert catalog.open_channel(table.id, "c", min_generation=9).generation == 9
    catalog.drop_channel(table.id, "c")
    assert catalog.open_channel(table.id, "c", min_generation=10).generation == 10


def test_apply_commit_is_idempotent_and_ordered(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    catalog.open_channel(table.id, "a")
    catalog.open_channel(table.id, "b")
    catalog.apply_commit(table.id, record(3, ("a", 1, 1, "t1", 5), ("b", 1, 1, None, 2)))
    catalog.apply_commit(table.id, record(3, ("a", 1, 1, "t1", 5)))  # replayed: ignored
    catalog.apply_commit(table.id, record(2, ("a", 1, 1, "old", 5)))  # older: ignored
    a, b = catalog.get_channel(table.id, "a"), catalog.get_channel(table.id, "b")
    assert (a.offset_token, a.rows_committed) == ("t1", 5)
    assert (b.offset_token, b.rows_committed) == (None, 2)
    info = catalog.get_table_by_id(table.id)
    assert (info.applied_version, info.next_row_id) == (3, 10)
    catalog.apply_commit(table.id, record(4, ("gone", 1, 1, "x", 1)))  # unknown channel: skipped
    assert catalog.get_channel(table.id, "gone") is None


def test_drop_and_retention(catalog):
    table = catalog.create_table("DB", "S", "T", "/w", SCHEMA)
    for name in ("a", "b", "c"):
        catalog.open_channel(table.id, name)
    assert catalog.drop_channel(table.id, "a") is True
    assert catalog.drop_channel(table.id, "a") is False
    removed = catalog.remove_inactive_channels(time.time() + 1, keep={(table.id, "c")})
    assert removed == 1
    assert [c.name for c in catalog.list_channels(table.id)] == ["c"]
    assert catalog.remove_inactive_channels(time.time() - 3600, keep=set()) == 0
