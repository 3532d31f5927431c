"""``flush.spark_tables.read_delta``: a table version in Spark, with or without a handle
the caller already loaded (used only when it is at the version asked for)."""

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from flush.spark_tables import read_delta


@pytest.fixture
def table_uri(tmp_path):
    uri = str(tmp_path / "t with space")
    write_deltalake(uri, pa.table({"ID": pa.array([1, 2], pa.int64())}))
    write_deltalake(uri, pa.table({"ID": pa.array([3], pa.int64())}), mode="append")
    return uri


def _ids(frame) -> list[int]:
    return sorted(row.ID for row in frame.collect())


def test_versions(spark, table_uri):
    assert _ids(read_delta(spark, table_uri)) == [1, 2, 3]
    assert _ids(read_delta(spark, table_uri, 0)) == [1, 2]


def test_a_handle_at_the_version_asked_for_is_used(spark, table_uri):
    at_zero = DeltaTable(table_uri, version=0)
    assert _ids(read_delta(spark, table_uri, 0, loaded=at_zero)) == [1, 2]


def test_a_handle_at_another_version_is_not_used(spark, table_uri):
    at_zero = DeltaTable(table_uri, version=0)
    newest = DeltaTable(table_uri)
    assert _ids(read_delta(spark, table_uri, 0, loaded=newest)) == [1, 2]
    assert _ids(read_delta(spark, table_uri, 1, loaded=at_zero)) == [1, 2, 3]
    # No version means the newest, whatever version the handle holds.
    assert _ids(read_delta(spark, table_uri, None, loaded=at_zero)) == [1, 2, 3]
