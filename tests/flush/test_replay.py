"""Start-up replay of the commits the catalog has not recorded, with several writers
on one table: a commit at or below the catalog's applied version is found by its
channels' positions in the log."""

import pyarrow as pa
import pytest

from catalog import SqliteCatalog
from flush import ChannelProgress, TableWriter, create_table, replay_commits
from ingest_sdk import TableSchema, convert_rows

SCHEMA = TableSchema.parse({"ID": "INT NOT NULL"})


def rows(*ids):
    batch, _ = convert_rows(SCHEMA, [{"ID": i} for i in ids])
    return pa.Table.from_batches([batch])


@pytest.fixture
def table(tmp_path):
    """A Delta table, its catalog entry and channels a and b opened in the catalog."""
    uri = str(tmp_path / "t")
    create_table(uri, SCHEMA)
    catalog = SqliteCatalog(tmp_path / "catalog.sqlite")
    info = catalog.create_table("D", "S", "T", uri, SCHEMA)
    for name in ("a", "b"):
        catalog.open_channel(info.id, name)
    yield catalog, info, TableWriter(uri, SCHEMA)
    catalog.close()


def test_a_commit_below_the_applied_version_is_recorded_once(table):
    catalog, info, writer = table
    late = writer.commit_flush([rows(1, 2)], [ChannelProgress("a", 1, 1, "a1", 2)], 0)
    newer = writer.commit_flush([rows(3)], [ChannelProgress("b", 1, 1, "b1", 1)], 2)
    catalog.apply_commit(info.id, newer)  # the other writer recorded first; a's was lost
    assert catalog.get_table_by_id(info.id).applied_version == newer.version
    assert replay_commits(catalog, info.id) == [late]
    a = catalog.get_channel(info.id, "a")
    assert (a.offset_token, a.rows_committed) == ("a1", 2)
    assert replay_commits(catalog, info.id) == []  # nothing twice
    b = catalog.get_channel(info.id, "b")
    assert (b.offset_token, b.rows_committed, catalog.get_channel(info.id, "a").rows_committed
            ) == ("b1", 1, 2)  # fmt: skip


def test_only_each_channels_newest_commit_is_looked_for(table):
    catalog, info, writer = table
    first = writer.commit_flush([rows(1)], [ChannelProgress("a", 1, 1, "a1", 1)], 0)
    catalog.apply_commit(info.id, first)
    second = writer.commit_flush([rows(2)], [ChannelProgress("a", 1, 2, "a2", 1)], 1)
    newer = writer.commit_flush([rows(3)], [ChannelProgress("b", 1, 1, "b1", 1)], 2)
    catalog.apply_commit(info.id, newer)
    assert replay_commits(catalog, info.id) == [second]
    a = catalog.get_channel(info.id, "a")
    assert (a.offset_token, a.rows_committed) == ("a2", 2)
