"""rows_frame: driver-made rows as a DataFrame equal to Spark's own createDataFrame of
them (schema and values), collected without a job."""

from datetime import UTC, date, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flush.spark_tables import rows_frame

SCHEMA = ("name STRING, n BIGINT, i INT, ok BOOLEAN, x DOUBLE, d DECIMAL(10,2), day DATE, "
          "at TIMESTAMP, tags ARRAY<STRING>, "
          "state STRUCT<state: STRING, reason_code: STRING>, "
          "inputs ARRAY<STRUCT<name: STRING, kind: STRING>>")  # fmt: skip

_naive_utc = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1))
_text = st.text(max_size=8)
_cents = st.decimals(min_value=-(10**7), max_value=10**7, places=2, allow_nan=False,
                     allow_infinity=False)  # fmt: skip
_row = st.tuples(
    st.none() | _text,
    st.none() | st.integers(-(2**63), 2**63 - 1),
    st.none() | st.integers(-(2**31), 2**31 - 1),
    st.none() | st.booleans(),
    st.none() | st.floats(allow_nan=False),
    st.none() | _cents,
    st.none() | st.dates(min_value=date(1900, 1, 1)),
    st.none() | _naive_utc,
    st.none() | st.lists(st.none() | _text, max_size=3),
    st.none() | st.tuples(_text, st.none() | _text),
    st.none() | st.lists(st.tuples(_text, _text), max_size=2),
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, max_size=4))
def test_rows_frame_equals_spark_rows(spark, rows):
    """Same schema (nullability included) and same values as Spark's row path: naive
    timestamps are UTC (this process runs in UTC, where the row path reads them so too)."""
    ours, theirs = rows_frame(spark, rows, SCHEMA), spark.createDataFrame(rows, SCHEMA)
    assert ours.schema == theirs.schema
    assert ours.collect() == theirs.collect()


def test_aware_and_naive_timestamps_are_the_same_instant(spark):
    naive = datetime(2026, 12, 3, 14, 0, 0)
    aware = naive.replace(tzinfo=UTC)
    frame = rows_frame(spark, [(naive,), (aware,)], "at TIMESTAMP")
    first, second = (r.at for r in frame.collect())
    assert first == second == naive  # the session zone is UTC: shown as written


def test_a_status_is_collected_without_a_spark_job(spark):
    tracker = spark.sparkContext.statusTracker()
    jobs_before = set(tracker.getJobIdsForGroup(None))
    frame = rows_frame(spark, [("Table T successfully created.",)], "status STRING")
    assert frame.collect()[0].status == "Table T successfully created."
    assert set(tracker.getJobIdsForGroup(None)) == jobs_before


def test_empty_rows_keep_the_schema(spark):
    frame = rows_frame(spark, [], "name STRING, n BIGINT")
    assert frame.collect() == []
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema] == [
        ("name", "string"), ("n", "bigint")]


def test_rows_from_a_generator(spark):
    frame = rows_frame(spark, ((f"n{i}", i) for i in range(3)), "name STRING, n BIGINT")
    assert [tuple(r) for r in frame.collect()] == [("n0", 0), ("n1", 1), ("n2", 2)]


def test_rows_of_another_width_are_refused(spark):
    with pytest.raises(ValueError, match="2 values"):
        rows_frame(spark, [("a",)], "name STRING, n BIGINT")


def test_a_value_of_another_type_is_refused(spark):
    with pytest.raises((TypeError, ValueError)):
        rows_frame(spark, [("not a number",)], "n BIGINT")
