"""``flush.spark_tables.arrow_frame``: Arrow rows handed to Spark over their batches.

The frame must hold exactly the rows and types it was given, leave the session's
settings as they were, and still be broadcast in a join when it is small (Spark knows
no size for a frame over batches; the hint stands in for it).
"""

import datetime
import decimal

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flush.spark_tables import arrow_frame, byte_size

THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
BROADCAST = "spark.sql.autoBroadcastJoinThreshold"


def _plan(frame) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


def _broadcast_subtrees(plan: str) -> list[str]:
    """The text of each BroadcastExchange's subtree in an executed plan."""
    lines = plan.splitlines()
    found = []
    for index, line in enumerate(lines):
        if "BroadcastExchange" in line:
            depth = len(line) - len(line.lstrip(" :+-"))
            subtree = [line]
            for below in lines[index + 1 :]:
                if len(below) - len(below.lstrip(" :+-")) <= depth:
                    break
                subtree.append(below)
            found.append("\n".join(subtree))
    return found


@pytest.fixture
def settings(spark):
    """Restores the two settings these tests change."""
    saved = {key: spark.conf.get(key, None) for key in (THRESHOLD, BROADCAST)}
    yield
    for key, value in saved.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def test_rows_and_types_come_back_as_given(spark):
    table = pa.table({
        "ID": pa.array([1, 2, None], pa.int64()),
        "AMOUNT": pa.array([decimal.Decimal("1.50"), None, decimal.Decimal("-2.25")],
                           pa.decimal128(10, 2)),
        "NAME": pa.array(["a", "é", None]),
        "AT": pa.array([datetime.datetime(2026, 1, 2, 3, 4, 5), None,
                        datetime.datetime(1900, 1, 1)], pa.timestamp("us", tz="UTC")),
        "FLAG": pa.array([True, None, False]),
    })  # fmt: skip
    frame = arrow_frame(spark, table)
    back = frame.toArrow()
    assert back.column_names == table.column_names
    assert back.sort_by("ID").to_pylist() == table.sort_by("ID").to_pylist()
    assert frame.count() == 3


def test_empty_table(spark):
    table = pa.table({"ID": pa.array([], pa.int32()), "V": pa.array([], pa.string())})
    frame = arrow_frame(spark, table)
    assert frame.count() == 0
    assert frame.columns == ["ID", "V"]


def test_the_local_relation_setting_is_left_as_it_was(spark, settings):
    table = pa.table({"ID": pa.array(range(10))})
    spark.conf.set(THRESHOLD, "12345")
    arrow_frame(spark, table)
    assert spark.conf.get(THRESHOLD) == "12345"
    spark.conf.unset(THRESHOLD)
    default = spark.conf.get(THRESHOLD, None)
    arrow_frame(spark, table)
    assert spark.conf.get(THRESHOLD, None) == default


def test_a_failed_conversion_still_restores_the_setting(spark, settings):
    spark.conf.set(THRESHOLD, "777")
    with pytest.raises(Exception):  # noqa: B017 - Spark's own error for a non-table
        arrow_frame(spark, "not an Arrow table")
    assert spark.conf.get(THRESHOLD) == "777"


def test_a_small_frame_is_the_broadcast_side_of_a_join(spark, settings, tmp_path):
    spark.range(200_000).withColumnRenamed("id", "ID").write.parquet(str(tmp_path / "big"))
    big = spark.read.parquet(str(tmp_path / "big"))
    small = arrow_frame(spark, pa.table({"ID": pa.array(range(0, 2000, 2), pa.int64())}))
    joined = big.join(small, "ID")
    subtrees = _broadcast_subtrees(_plan(joined))
    assert subtrees, _plan(joined)
    assert all("ExistingRDD" in tree and "parquet" not in tree.lower() for tree in subtrees)
    assert joined.count() == 1000


def _hinted(frame) -> bool:
    return "broadcast" in frame._jdf.queryExecution().analyzed().toString().lower()


def test_only_a_frame_within_the_broadcast_limit_is_hinted(spark, settings):
    spark.conf.set(BROADCAST, "1k")
    large = arrow_frame(spark, pa.table({"ID": pa.array(range(5000), pa.int64())}))  # 40 kB
    small = arrow_frame(spark, pa.table({"ID": pa.array(range(3), pa.int64())}))
    assert not _hinted(large)
    assert _hinted(small)
    assert large.join(small, "ID").count() == 3


def test_broadcast_disabled_means_no_hint(spark, settings):
    spark.conf.set(BROADCAST, "-1")
    left = arrow_frame(spark, pa.table({"ID": pa.array(range(100), pa.int64())}))
    right = arrow_frame(spark, pa.table({"ID": pa.array(range(50), pa.int64())}))
    joined = left.join(right, "ID")
    assert "BroadcastHashJoin" not in _plan(joined)
    assert joined.count() == 50


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10485760", 10485760), ("10485760b", 10485760), ("10MB", 10 * 1024**2),
     ("10m", 10 * 1024**2), (" 1g ", 1024**3), ("2kb", 2048), ("3t", 3 * 1024**4),
     ("-1", -1), ("0", 0), ("ten", -1), ("", -1), ("1.5g", -1), ("5x", -1)],
)  # fmt: skip
def test_byte_size(text, expected):
    assert byte_size(text) == expected


@given(st.integers(0, 10**9), st.sampled_from(["", "b", "k", "kb", "m", "mb", "g", "gb"]),
       st.booleans())  # fmt: skip
def test_byte_size_units(number, unit, upper):
    written = f"{number}{unit.upper() if upper else unit}"
    scale = 1024 ** "bkmg".index(unit[:1] or "b")
    assert byte_size(written) == number * scale
