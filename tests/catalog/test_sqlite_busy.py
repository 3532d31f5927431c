"""Another process holding the SQLite catalog's write lock past the busy timeout makes
the catalog unavailable for now (as a PostgreSQL lock timeout does: 503 at the door), not
a failure of the call, and nothing of the call is committed."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from catalog import CatalogUnavailableError, SqliteCatalog
from ingest_sdk import TableSchema


@pytest.fixture
def catalog(tmp_path):
    made = SqliteCatalog(tmp_path / "catalog.sqlite", busy_timeout=0.2)
    yield made
    made.close()


@contextlib.contextmanager
def write_lock_held(path):
    """Another connection (as another process would) inside a write transaction."""
    other = sqlite3.connect(str(path), isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield
        other.execute("ROLLBACK")
    finally:
        other.close()


def test_a_write_behind_a_held_lock_is_unavailable_and_commits_nothing(catalog, tmp_path):
    schema = TableSchema.parse({"ID": "INT"})
    with write_lock_held(tmp_path / "catalog.sqlite"), pytest.raises(
        CatalogUnavailableError
    ) as refused:
        catalog.create_table("DB", "S", "T", str(tmp_path / "t"), schema, {})
    message = str(refused.value)
    assert "catalog.sqlite is busy: another process held its write lock for 0.2 s" in message
    assert "nothing of this call was committed, try it again" in message
    assert catalog.list_tables() == []
    catalog.create_table("DB", "S", "T", str(tmp_path / "t"), schema, {})  # free again
    assert [t.full_name for t in catalog.list_tables()] == ["DB.S.T"]


def test_reads_go_on_while_another_process_writes(catalog, tmp_path):
    with write_lock_held(tmp_path / "catalog.sqlite"):
        assert catalog.list_tables() == []  # WAL: readers never wait for the writer
