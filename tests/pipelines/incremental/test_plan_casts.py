"""Casts written as SQL text (pipelines.incremental.plan.cast_sql, cast_select) give what
the Column casts they replace give: the same types and the same values, or the Column
cast itself for a type the text does not name."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.incremental.plan import cast_select, cast_sql, typed_as

#: A column of each kind the engine's state and tables hold, with awkward values, and the
#: types each is cast to.
_SOURCE = [
    ("i", T.LongType(), [0, -1, 2**63 - 1, None], [T.IntegerType(), T.DecimalType(38, 2),
                                                  T.DoubleType(), T.StringType()]),
    ("d", T.DecimalType(38, 10), [Decimal("-1.5000000001"), Decimal(0), None],
     [T.DecimalType(20, 2), T.LongType(), T.FloatType(), T.DecimalType(38, 10)]),
    ("f", T.DoubleType(), [float("nan"), -0.0, 1e300, None],
     [T.FloatType(), T.DecimalType(10, 0), T.StringType()]),
    ("s", T.StringType(), ["1", " x", "", None], [T.StringType(), T.BinaryType(),
                                                  T.IntegerType(), T.StringType("UTF8_LCASE")]),
    ("t", T.TimestampType(), [datetime.datetime(2026, 1, 1, 12), None],
     [T.TimestampNTZType(), T.DateType(), T.StringType()]),
    ("n", T.TimestampNTZType(), [datetime.datetime(1, 1, 1), None], [T.TimestampType()]),
    ("b", T.BooleanType(), [True, False, None], [T.IntegerType(), T.StringType()]),
    ("a", T.ArrayType(T.LongType()), [[1, None], None], [T.ArrayType(T.StringType())]),
    ("c", T.StringType("UTF8_LCASE"), ["A", None], [T.StringType()]),
    ("v", T.NullType(), [None, None], [T.NullType()]),
]  # fmt: skip


@pytest.fixture(scope="module")
def frames(spark):
    """One frame per source column (its values in a column named like the kind)."""
    made = {}
    for name, kind, values, _ in _SOURCE:
        schema = T.StructType([T.StructField("row", T.IntegerType()),
                               T.StructField(name, kind)])  # fmt: skip
        made[name] = spark.createDataFrame(list(enumerate(values)), schema)
    return made


def _outcome(frame, column):
    """The frame's rows by ``row`` with the type of ``column``, or the error's condition
    (a cast ANSI refuses, e.g. an overflow, fails both ways alike)."""
    try:
        rows = sorted(tuple(r) for r in frame.collect())
        return frame.schema[column].dataType, repr(rows)  # (NaN by its text: nan == nan)
    except Exception as exc:  # compared, not swallowed
        condition = exc.getCondition() if hasattr(exc, "getCondition") else type(exc).__name__
        return "error", condition


@pytest.mark.parametrize("name, kind, target", [
    (name, kind, target) for name, kind, _, targets in _SOURCE for target in targets])  # fmt: skip
def test_a_cast_as_text_is_the_column_cast(frames, name, kind, target):
    frame = frames[name]
    by_column = _outcome(frame.select("row", typed_as(name, target).alias(name)), name)
    selected = _outcome(cast_select(frame, [(name, target)], ["row"]).select("row", name), name)
    assert selected == by_column
    text = cast_sql(name, target)
    if text is None:  # a type the text does not name: cast_select used the Column cast
        assert isinstance(target, T.ArrayType) or target == T.StringType("UTF8_LCASE")
        return
    assert _outcome(frame.selectExpr("row", text), name) == by_column


def test_names_that_need_quoting_are_read_and_written_as_they_are(spark):
    odd = "a `b`.c d"
    frame = spark.range(2).select(F.col("id").alias(odd), F.lit("x").alias("k`"))
    cast = cast_select(frame, [(odd, T.DecimalType(10, 1))], ["k`"])
    assert cast.columns == [odd, "k`"]
    assert [tuple(r) for r in cast.collect()] == [(Decimal("0.0"), "x"), (Decimal("1.0"), "x")]
