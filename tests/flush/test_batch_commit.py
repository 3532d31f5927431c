"""``flush.batch_commit``: a micro-batch lands once, its files survive the vacuum, and a
writer never lands in a table that does not hold its earlier batches.

(Crashes around the commit are covered end to end, with Spark, by
tests/pipelines/spark_sources/test_sink_crash.py; these are the edges of the function itself.)
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flush import read_table
from flush.batch_commit import SinkTargetError, commit_batch, stage_batch_file
from flush.maintenance import vacuum_data_folders
from flush.tables import ROW_ID_COLUMN, create_table, delta_schema, live_files
from ingest_sdk import TableSchema

SCHEMA = TableSchema.parse({"A": "NUMBER(10,0)"})
WRITER = "query:test"


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t")
    create_table(uri, SCHEMA)
    return uri


def rows(first: int, count: int) -> pa.Table:
    ids = pa.array(range(first, first + count), pa.int64())
    return pa.table({"A": ids, ROW_ID_COLUMN: ids}).cast(delta_schema(SCHEMA))


def values(uri: str) -> list[int]:
    return sorted(read_table(uri).column("A").to_pylist())


def test_a_batch_lands_once_and_a_replay_adds_nothing(table):
    assert commit_batch(table, WRITER, 0, [stage_batch_file(table, WRITER, rows(0, 3))])
    version = DeltaTable(table).version()
    # The same batch again (Spark replays it after a crash): nothing added, files gone.
    again = stage_batch_file(table, WRITER, rows(0, 3))
    assert not commit_batch(table, WRITER, 0, [again])
    assert DeltaTable(table).version() == version
    assert not Path(table, again.path).exists()
    assert values(table) == [0, 1, 2]
    assert DeltaTable(table).transaction_version(WRITER) == 0


def test_a_batch_with_no_rows_still_moves_the_writer(table):
    assert commit_batch(table, WRITER, 0, [])
    assert DeltaTable(table).transaction_version(WRITER) == 0
    assert values(table) == []


def test_files_staged_long_ago_are_young_once_committed(table):
    """A task staged early, the batch waited longer than the vacuum retention: the
    committed file must not look old to a vacuum (it would delete a live file)."""
    staged = stage_batch_file(table, WRITER, rows(0, 2))
    two_hours_ago = time.time() - 7200
    os.utime(Path(table, staged.path), (two_hours_ago, two_hours_ago))
    commit_batch(table, WRITER, 0, [staged])
    (live,) = [f["path"] for f in live_files(DeltaTable(table))]
    assert Path(table, live).stat().st_mtime > two_hours_ago + 3600
    assert vacuum_data_folders(table, retention_hours=1) == []
    assert values(table) == [0, 1]


def test_leftovers_of_an_earlier_attempt_go_and_committed_files_stay(table):
    commit_batch(table, WRITER, 0, [stage_batch_file(table, WRITER, rows(0, 2))])
    # Attempt 1 of batch 1 renamed its files and died before its Delta commit.
    first = stage_batch_file(table, WRITER, rows(10, 2))
    folder = Path(table, first.path).parent.parent
    leftover = folder / "1-deadbeef0000-0.parquet"
    os.replace(Path(table, first.path), leftover)
    commit_batch(table, WRITER, 1, [stage_batch_file(table, WRITER, rows(20, 2))])
    assert not leftover.exists()
    assert values(table) == [0, 1, 20, 21]
    on_disk = {str(p.relative_to(table)) for p in Path(table, "_ingest").rglob("*.parquet")}
    assert on_disk == {f["path"] for f in live_files(DeltaTable(table))}


def test_a_later_batch_never_lands_in_a_table_without_the_earlier_ones(table, tmp_path):
    """The table was replaced (or renamed away and another made under its name) while
    the query ran: batch 3 of a writer whose batches 0..2 are elsewhere is refused."""
    staged = stage_batch_file(table, WRITER, rows(0, 2))
    version = DeltaTable(table).version()
    with pytest.raises(SinkTargetError, match="start a new query"):
        commit_batch(table, WRITER, 3, [staged])
    assert DeltaTable(table).version() == version
    assert values(table) == []


def test_staging_into_a_dropped_table_does_not_recreate_its_folder(table):
    shutil.rmtree(table)
    with pytest.raises(SinkTargetError, match="dropped"):
        stage_batch_file(table, WRITER, rows(0, 1))
    assert not Path(table).exists()
