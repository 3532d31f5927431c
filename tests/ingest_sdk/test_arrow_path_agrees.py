"""The Arrow path (check_arrow_batch) stores what the row path (convert_rows) stores.

A producer may send the same values as dict rows or as an Arrow batch; both must give
the same table, or both must refuse. Found unequal before: integers into timestamps
(Arrow read every integer as microseconds, rows infer the unit from the magnitude),
booleans into NUMBER (accepted as 1 by Arrow), numbers into VARCHAR (Arrow wrote 1e+20
and 1.50 where rows write plain digits).
"""

from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_sdk import ConversionOptions, IngestError, OnErrorOption, TableSchema, convert_rows
from ingest_sdk.batch_check import check_arrow_batch

OPTIONS = ConversionOptions(default_timezone="Europe/Paris")


def both_paths(declaration: str, values: list, arrow_type: pa.DataType):
    schema = TableSchema.parse({"C": declaration})
    try:
        batch, _ = convert_rows(schema, [{"C": v} for v in values], OnErrorOption.ABORT, OPTIONS)
        by_rows = batch.to_pylist()
    except IngestError:
        by_rows = "refused"
    try:
        table = pa.table({"C": pa.array(values, arrow_type)})
        by_arrow = check_arrow_batch(schema, table, OPTIONS).to_pylist()
    except IngestError:
        by_arrow = "refused"
    return by_rows, by_arrow


EPOCHS = st.one_of(
    st.integers(-(10**10), 10**10),  # seconds
    st.integers(-(10**13), 10**13),  # milliseconds
    st.integers(-(10**16), 10**16),  # microseconds
    st.integers(-(2**63), 2**63 - 1),  # nanoseconds, and out of range
)


@settings(max_examples=150, deadline=None)
@given(
    declaration=st.sampled_from(
        ["TIMESTAMP_NTZ", "TIMESTAMP_NTZ(3)", "TIMESTAMP_LTZ", "TIMESTAMP_TZ(0)", "DATE"]
    ),
    values=st.lists(EPOCHS, min_size=1, max_size=5),
)
def test_integers_into_dates_and_timestamps(declaration, values):
    by_rows, by_arrow = both_paths(declaration, values, pa.int64())
    assert by_arrow == by_rows


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(10**30), 10**30)),
        min_size=1, max_size=5,
    )
)  # fmt: skip
def test_numbers_into_varchar(values):
    by_rows, by_arrow = both_paths("VARCHAR", [float(v) for v in values], pa.float64())
    assert by_arrow == by_rows
    decimals = [Decimal(int(v)) for v in values if abs(v) < 10**30] or [Decimal("1.50")]
    by_rows, by_arrow = both_paths("VARCHAR", decimals, pa.decimal128(38, 2))
    assert by_arrow == by_rows


@pytest.mark.parametrize("declaration", ["NUMBER(38,0)", "NUMBER(10,2)", "INT", "FLOAT"])
def test_booleans_into_numbers_are_refused_on_both_paths(declaration):
    assert both_paths(declaration, [True, False], pa.bool_()) == ("refused", "refused")


def test_the_examples_that_differed():
    by_rows, by_arrow = both_paths("TIMESTAMP_NTZ", [1700000000], pa.int64())
    assert str(by_arrow[0]["C"]) == "2023-11-14 22:13:20" and by_arrow == by_rows
    by_rows, by_arrow = both_paths("VARCHAR", [1e20, 1.5], pa.float64())
    assert [r["C"] for r in by_arrow] == ["100000000000000000000", "1.5"] and by_arrow == by_rows


TIME_TEXTS = st.one_of(
    st.sampled_from(["20:57", "20:57:01", "20:57:01.5", "20:57:01.123456789", "00:00",
                     "23:59:59.999999999", "24:00", "25:00", "7:05", "x", "", "20:57:01.1234567891",
                     "2024-01-01 20:57:01"]),
    st.from_regex(r"\A[0-2][0-9]:[0-5][0-9](:[0-5][0-9](\.[0-9]{1,9})?)?\Z"),
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    declaration=st.sampled_from(["TIME", "TIME(0)", "TIME(3)"]),
    values=st.lists(st.one_of(st.none(), TIME_TEXTS), min_size=1, max_size=5),
)
def test_time_texts(declaration, values):
    """'20:57' is 20:57:00 whichever way it comes (the Arrow path kept only texts
    already in the stored layout; a SQL INSERT of '12:34:56' into a TIME was refused)."""
    by_rows, by_arrow = both_paths(declaration, values, pa.string())
    assert by_arrow == by_rows
