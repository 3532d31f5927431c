"""The PostgreSQL catalog's layout: keys that hold every valid name (a btree entry holds
about 2.7 kB, SQLite's keys any length), and a catalog laid out by the version before
them, which the next open brings up to date and which that version still runs on."""

from __future__ import annotations

import random

import pytest

from catalog import open_catalog
from catalog.postgres import NAMED_TABLES
from ingest_sdk import TableSchema
from ingest_sdk.errors import TableAlreadyExistsError
from ingest_sdk.schema import MAX_NAME_LENGTH, check_object_name
from tests.catalog.older_code import older_code

SCHEMA = TableSchema.parse({"ID": "INT"})
#: The last commit whose PostgreSQL layout keeps three-part names unique by a btree
#: constraint over the names themselves (``<table>_database_schema_name_name_key``).
BEFORE_NAME_KEYS = "8b1893a"
MAX_CHANNEL_NAME = 512  # channel_server.channels.MAX_CHANNEL_NAME


def long_name(seed: int, length: int = MAX_NAME_LENGTH) -> str:
    """A valid name of ``length`` random 4-byte characters (CJK ext. B): incompressible."""
    rng = random.Random(seed)
    name = "".join(chr(rng.randrange(0x20000, 0x2A6DF)) for _ in range(length))
    return check_object_name(name, max_length=length)


@pytest.fixture(params=["sqlite", "postgres"])
def catalog(request, tmp_path):
    location = tmp_path / "catalog.sqlite"
    if request.param == "postgres":
        location = request.getfixturevalue("postgres_dsn")
    made = open_catalog(location)
    yield made
    made.close()


def test_the_longest_valid_names_are_keys_on_both(catalog):
    """Every key holding names takes the longest valid ones: three-part names (a table, a
    view, a stream), a schema's two parts, a channel's 512 characters."""
    names = tuple(long_name(seed) for seed in range(3))
    view, stream = (*names[:2], long_name(3)), (*names[:2], long_name(4))
    table = catalog.create_table(*names, "/w", SCHEMA)
    catalog.create_view(*view, "SELECT 1", names[:2])
    catalog.create_stream(*stream, table.id, "DEFAULT", 0)
    assert catalog.get_schema(*names[:2]) is not None
    channel = long_name(5, MAX_CHANNEL_NAME)
    assert catalog.open_channel(table.id, channel).generation == 1
    assert catalog.get_table(*names).id == table.id
    assert catalog.get_view(*view) is not None and catalog.get_stream(*stream) is not None
    assert catalog.get_channel(table.id, channel) is not None
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table(*names, "/w2", SCHEMA)


def test_names_that_differ_in_one_part_or_one_character_are_apart(catalog):
    """The parts are keyed one by one, never joined: ("a.b", "c") and ("a", "b.c") are two
    schemas' tables; listed in byte order."""
    catalog.create_table("D", "a.b", "c", "/w1", SCHEMA)
    catalog.create_table("D", "a", "b.c", "/w2", SCHEMA)
    catalog.create_table("D", "a", "b.C", "/w3", SCHEMA)
    assert [t.uri for t in catalog.list_tables()] == ["/w3", "/w2", "/w1"]


_OLD_CHILD = """
import sys
from catalog import open_catalog
from ingest_sdk import TableSchema
from ingest_sdk.errors import TableAlreadyExistsError

catalog = open_catalog(sys.argv[1])
if sys.argv[2] == "make":
    table = catalog.create_table("D", "S", "T", "/w", TableSchema.parse({"ID": "INT"}))
    catalog.create_view("D", "S", "V", "SELECT 1", ("D", "S"))
    catalog.create_stream("D", "S", "ST", table.id, "DEFAULT", 0)
else:  # "use": what an older service does with the catalog the newer code brought up to date
    try:
        catalog.create_table("D", "S", "T", "/w2", TableSchema.parse({"ID": "INT"}))
        print("created twice")
    except TableAlreadyExistsError:
        print("refused")
    catalog.create_table("D", "S", "U", "/w3", TableSchema.parse({"ID": "INT"}))
    print(*(t.name for t in catalog.list_tables()))
catalog.close()
"""


@pytest.fixture
def old_code(tmp_path):
    """Run the catalog code of :data:`BEFORE_NAME_KEYS` in a child: ``old_code(dsn, what)``."""
    run = older_code(BEFORE_NAME_KEYS, tmp_path / "old-code")
    return lambda dsn, what: run(_OLD_CHILD, dsn, what)


def _name_indexes(dsn: str) -> set[str]:
    import psycopg

    with psycopg.connect(dsn) as connection:
        rows = connection.execute(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"
        ).fetchall()
    return {name for (name,) in rows if "name" in name}


def test_a_catalog_laid_out_before_the_name_keys_is_brought_up_to_date(postgres_dsn, old_code):
    old_code(postgres_dsn, "make")
    before = _name_indexes(postgres_dsn)
    assert "tables_database_schema_name_name_key" in before  # the old layout indeed
    catalog = open_catalog(postgres_dsn)
    try:
        names = tuple(long_name(seed) for seed in range(3))
        catalog.create_table(*names, "/w2", SCHEMA)  # past what the old key held
        with pytest.raises(TableAlreadyExistsError):
            catalog.create_table("D", "S", "T", "/w3", SCHEMA)  # still unique
        assert [t.name for t in catalog.list_tables()] == ["T", names[2]]
        assert catalog.get_view("D", "S", "V") is not None
        assert catalog.get_stream("D", "S", "ST") is not None
    finally:
        catalog.close()
    after = _name_indexes(postgres_dsn)
    assert after == {f"{table}_{key}" for table in NAMED_TABLES for key in ("name_key", "by_name")}
    open_catalog(postgres_dsn).close()  # a second open finds it up to date
    assert _name_indexes(postgres_dsn) == after


def test_the_version_before_the_name_keys_still_runs_on_a_catalog_laid_out_with_them(
    postgres_dsn, old_code
):
    """The layouts differ only in their indexes, which no statement names: an older
    service sharing the catalog with a newer one keeps working, names still unique."""
    catalog = open_catalog(postgres_dsn)
    catalog.create_table("D", "S", "T", "/w", SCHEMA)
    catalog.close()
    assert old_code(postgres_dsn, "use").split("\n")[:2] == ["refused", "T U"]
