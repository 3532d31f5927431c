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


def test_the_logs_schema_reads_as_spark_infers_it_from_the_files(spark, tmp_path):
    """read_delta gives Spark the log's schema instead of letting it read a footer: for
    every column type a table holds (and a dynamic table's DECIMAL(38, s) state), the
    columns and the rows are what Spark's own inference from the files gives."""
    from flush.tables import live_paths
    from pipelines import Session

    session = Session(tmp_path / "warehouse", spark=spark)
    session.sql("CREATE TABLE A (N NUMBER(38, 10), I NUMBER, F FLOAT, K VARCHAR, B BINARY, "
                "BO BOOLEAN, D DATE, TI TIME, T TIMESTAMP_NTZ, TL TIMESTAMP_LTZ, "
                "TZ TIMESTAMP_TZ, VA VARIANT, O OBJECT, AR ARRAY)")  # fmt: skip
    session.sql("INSERT INTO A SELECT 1.5, 2, -0.0, 'x', X'00', true, DATE'1500-01-01', "
                "'12:00:00', TIMESTAMP_NTZ'2020-01-01 00:00:00.123456', "
                "TIMESTAMP_LTZ'1900-01-01 00:00:00', TIMESTAMP_LTZ'2020-01-01 00:00:00', "
                "PARSE_JSON('{\"a\": 1}'), PARSE_JSON('{\"a\": 1}'), PARSE_JSON('[1]')")  # fmt: skip
    session.sql("INSERT INTO A (N) VALUES (NULL)")
    session.sql("CREATE DYNAMIC TABLE G TARGET_LAG = '1 hour' AS "
                "SELECT K, sum(N) AS S, count(*) AS C FROM A GROUP BY K")  # fmt: skip
    try:
        for name in ("A", "G"):
            uri = session.require_table(name).uri
            given = read_delta(spark, uri, state=True)
            inferred = spark.read.parquet(*live_paths(uri, DeltaTable(uri)))
            assert given.schema == inferred.schema
            assert sorted(map(str, given.collect())) == sorted(map(str, inferred.collect()))
    finally:
        session.close()


@pytest.mark.parametrize("condition", ["V > 5", "V >= CAST('NaN' AS DOUBLE)", "V != 1",
                                       "V = CAST('NaN' AS DOUBLE)", "NOT (V < 6)"])
def test_nan_rows_are_filtered_by_sparks_rule_not_by_file_statistics(spark, tmp_path, condition):
    """Arrow's writers leave NaN out of a Parquet file's min/max; a reader that skipped
    row groups by those statistics lost the NaN rows a filter keeps (NaN is above every
    number in Spark and equal to itself): the file's rows agree with the same rows in
    memory."""
    uri = str(tmp_path / "nan")
    values = pa.table({"ID": pa.array([1, 2, 3], pa.int64()),
                       "V": pa.array([1.0, float("nan"), 0.5], pa.float64())})  # fmt: skip
    write_deltalake(uri, values)
    in_memory = spark.createDataFrame([tuple(r.values()) for r in values.to_pylist()],
                                      "ID bigint, V double")  # (pandas makes NaN a NULL)
    assert _ids(read_delta(spark, uri).where(condition)) == _ids(in_memory.where(condition))
    assert 2 in _ids(in_memory.where(condition))  # the NaN row is kept by every condition
