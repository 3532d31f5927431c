"""convert_rows: row-level errors, ON_ERROR modes, batches and the fast path."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from ingest_sdk import (
    ColumnType,
    ConversionOptions,
    InsertValidationError,
    InvalidTypeError,
    InvalidValueError,
    OnErrorOption,
    TableSchema,
    convert_rows,
)
from ingest_sdk.rows import converter_for
from ingest_sdk.values import convert_column

SCHEMA = TableSchema.parse(
    {"ID": "NUMBER(38,0) NOT NULL", "NAME": "VARCHAR(5)", "AMOUNT": "NUMBER(10,2)"}
)
GOOD = {"id": 1, "name": "ann", "amount": "1.005"}
BAD_VALUE = {"id": 2, "name": "toolong", "amount": 1}
BAD_TYPE = {"id": 3, "name": "bob", "amount": True}


def test_good_rows_become_one_batch_with_the_table_schema():
    batch, response = convert_rows(SCHEMA, [GOOD, {"ID": 2}], OnErrorOption.CONTINUE)
    assert batch.schema == SCHEMA.to_arrow()
    assert batch.to_pylist() == [
        {"ID": Decimal(1), "NAME": "ann", "AMOUNT": Decimal("1.01")},
        {"ID": Decimal(2), "NAME": None, "AMOUNT": None},
    ]
    assert not response.has_errors()
    assert (response.row_count, response.inserted_row_count) == (2, 2)


def test_continue_keeps_good_rows_in_order_and_reports_every_bad_one():
    rows = [GOOD, BAD_VALUE, {"id": 4}, BAD_TYPE]
    batch, response = convert_rows(SCHEMA, rows, OnErrorOption.CONTINUE)
    assert batch.column("ID").to_pylist() == [Decimal(1), Decimal(4)]
    assert [e.row_index for e in response.insert_errors] == [1, 3]
    assert response.error_row_count == 2 and response.inserted_row_count == 2
    value_error, type_error = response.insert_errors
    assert isinstance(value_error.exception, InvalidValueError)
    assert (
        'Row 1, column "NAME" (VARCHAR(5)): value error: the text is too long'
        in value_error.message
    )
    assert "'toolong'" in value_error.message and "Fix:" in value_error.message
    assert isinstance(type_error.exception, InvalidTypeError)
    assert type_error.exception.row_index == 3 and type_error.exception.column == "AMOUNT"
    assert type_error.exception.value is True


def test_skip_batch_inserts_nothing_and_reports_every_bad_row():
    batch, response = convert_rows(SCHEMA, [GOOD, BAD_VALUE, BAD_TYPE], "skip_batch")
    assert batch is None
    assert [e.row_index for e in response.insert_errors] == [1, 2]
    assert response.inserted_row_count == 0


def test_abort_raises_on_the_first_bad_row():
    with pytest.raises(InsertValidationError) as info:
        convert_rows(SCHEMA, [GOOD, BAD_TYPE, BAD_VALUE], OnErrorOption.ABORT)
    assert info.value.row_index == 1
    assert info.value.insert_error.exception.column == "AMOUNT"
    assert "no row inserted" in str(info.value) and "Row 1" in str(info.value)


def test_abort_is_the_default():
    with pytest.raises(InsertValidationError):
        convert_rows(SCHEMA, [BAD_VALUE])
    batch, _ = convert_rows(SCHEMA, [GOOD])
    assert batch.num_rows == 1


def test_unknown_on_error_option_is_refused():
    with pytest.raises(ValueError, match="unknown ON_ERROR option 'LATER'"):
        convert_rows(SCHEMA, [GOOD], "LATER")


def test_row_level_error_kinds_are_separate():
    rows = [
        {"id": 1, "extra": 5, "Other": 6},
        {"name": "x"},
        {"id": None, "name": "y"},
        {"id": 4, "ID": 5},
    ]
    _, response = convert_rows(SCHEMA, rows, OnErrorOption.CONTINUE)
    extra, missing, null, duplicate = response.insert_errors
    assert extra.extra_col_names == ["extra", "Other"]
    assert 'unknown column(s) "extra", "Other"' in extra.message
    assert (
        missing.missing_not_null_col_names == ["ID"]
        and not missing.null_value_for_not_null_col_names
    )
    assert 'NOT NULL column "ID" is missing' in missing.message
    assert null.null_value_for_not_null_col_names == ["ID"] and not null.missing_not_null_col_names
    assert 'NULL given for NOT NULL column "ID"' in null.message
    assert 'column "ID" is given more than once' in duplicate.message


def test_a_bad_value_in_a_not_null_column_is_reported_once():
    _, response = convert_rows(SCHEMA, [{"id": "x"}], OnErrorOption.CONTINUE)
    (error,) = response.insert_errors
    assert error.null_value_for_not_null_col_names == []
    assert error.message.count("Row 0") == 1


def test_several_problems_of_one_row_are_all_named():
    _, response = convert_rows(
        SCHEMA, [{"name": "toolong", "amount": "abc", "zz": 1}], OnErrorOption.CONTINUE
    )
    (error,) = response.insert_errors
    for fragment in ('unknown column(s) "zz"', '"NAME"', '"AMOUNT"', 'column "ID" is missing'):
        assert fragment in error.message


def test_rows_that_are_not_dicts_are_errors_not_crashes():
    _, response = convert_rows(SCHEMA, [GOOD, ["id", 1], None], OnErrorOption.CONTINUE)
    assert [e.row_index for e in response.insert_errors] == [1, 2]
    assert "a row must be a dict" in response.insert_errors[0].message
    assert response.insert_errors[0].missing_not_null_col_names == []


def test_quoted_and_mixed_case_keys():
    schema = TableSchema.parse({'"Exact"': "INT", "LOOSE": "INT"})
    batch, response = convert_rows(
        schema, [{'"Exact"': 1, "loose": 2}, {"exact": 3}], OnErrorOption.CONTINUE
    )
    assert batch.to_pylist() == [{"Exact": Decimal(1), "LOOSE": Decimal(2)}]
    assert response.insert_errors[0].extra_col_names == ["exact"]


def test_rows_with_different_key_orders_and_subsets():
    rows = [{"id": 1, "name": "a"}, {"name": "b", "ID": 2}, {"amount": 3, "id": 3}]
    batch, _ = convert_rows(SCHEMA, rows)
    assert batch.to_pylist() == [
        {"ID": Decimal(1), "NAME": "a", "AMOUNT": None},
        {"ID": Decimal(2), "NAME": "b", "AMOUNT": None},
        {"ID": Decimal(3), "NAME": None, "AMOUNT": Decimal("3.00")},
    ]


def test_empty_input_and_generators():
    batch, response = convert_rows(SCHEMA, [])
    assert batch is None and response.row_count == 0
    batch, _ = convert_rows(SCHEMA, (dict(GOOD, id=i) for i in range(3)))
    assert batch.num_rows == 3


def test_row_size_limit_rejects_only_the_large_row():
    schema = TableSchema.parse({"ID": "INT", "BODY": "VARCHAR"})
    rows = [{"id": 1, "body": "x" * 100}, {"id": 2, "body": "y" * 2000}, {"id": 3, "body": "z"}]
    batch, response = convert_rows(
        schema, rows, OnErrorOption.CONTINUE, ConversionOptions(max_row_bytes=1000)
    )
    assert batch.column("ID").to_pylist() == [Decimal(1), Decimal(3)]
    (error,) = response.insert_errors
    assert error.row_index == 1 and "larger than the 1000-byte limit" in error.message


FAST_PATH_COLUMNS = [
    ("NUMBER(38,0)", [1, None, -(2**63), 2**63 - 1]),
    ("NUMBER(18,0)", [0, 10**18 - 1, None]),
    ("NUMBER(10,2)", [5, None, -99_999_999]),
    ("NUMBER(38,4)", [2**62, -3]),
    ("FLOAT", [1.5, 2, None, -0.0]),
    ("VARCHAR(4)", ["abcd", "", None, "ééé"]),
    ("BINARY(3)", [b"abc", None, b""]),
    ("BOOLEAN", [True, None, False]),
    ("DATE", [date(2013, 4, 28), None, date(1, 1, 1)]),
    ("TIMESTAMP_NTZ", [datetime(2013, 4, 28, 1, 2, 3, 4), None]),
    ("TIMESTAMP_NTZ(0)", [datetime(2013, 4, 28, 1, 2, 3, 999999)]),
    ("TIMESTAMP_LTZ", [datetime(2013, 4, 28, 1, 2, 3, tzinfo=UTC), None]),
]


@pytest.mark.parametrize(("declared", "values"), FAST_PATH_COLUMNS)
def test_fast_path_gives_the_same_array_as_the_per_value_rules(declared, values):
    converter = converter_for(ColumnType.parse(declared))
    fast = converter.fast_array(values)
    assert fast is not None, "the natural Python type must take the fast path"
    slow = converter.build([None if v is None else converter.convert(v) for v in values])
    assert fast.equals(slow), (fast, slow)
    array, errors = convert_column(converter, values)
    assert array.equals(slow) and not errors


@pytest.mark.parametrize(
    ("declared", "values", "bad_row"),
    [
        ("NUMBER(3,0)", [1, 1000], 1),
        ("NUMBER(38,0)", [1, 10**38], 1),
        ("VARCHAR(2)", ["ab", "abc"], 1),
        ("VARCHAR(9)", ["ok", "bad\ud800"], 1),
        ("BINARY(1)", [b"a", b"ab"], 1),
        ("TIMESTAMP_NTZ", [datetime(2020, 1, 1), datetime(2020, 1, 1, tzinfo=UTC)], None),
    ],
)
def test_fast_path_declines_values_that_need_the_rules(declared, values, bad_row):
    converter = converter_for(ColumnType.parse(declared))
    assert converter.fast_array(values) is None
    _, errors = convert_column(converter, values)
    assert list(errors) == ([] if bad_row is None else [bad_row])


def test_every_type_lands_in_one_batch():
    schema = TableSchema.parse(
        {
            "N": "NUMBER(10,2)",
            "I": "INT",
            "F": "FLOAT",
            "S": "STRING",
            "B": "BINARY",
            "L": "BOOLEAN",
            "D": "DATE",
            "T": "TIME(3)",
            "NTZ": "TIMESTAMP_NTZ",
            "LTZ": "TIMESTAMP_LTZ",
            "TZ": "TIMESTAMP_TZ",
            "V": "VARIANT",
            "O": "OBJECT",
            "A": "ARRAY",
        }
    )
    row = {
        "N": "1.5",
        "I": 7,
        "F": "2.5",
        "S": 3,
        "B": "ff",
        "L": "yes",
        "D": "2013-04-28",
        "T": "20:57:01.1234",
        "NTZ": "2013-04-28 20:57:01",
        "LTZ": "2013-04-28T20:57:01Z",
        "TZ": "2013-04-28T20:57:01+01:00",
        "V": {"a": 1},
        "O": "{}",
        "A": 1,
    }
    batch, _ = convert_rows(schema, [row])
    assert batch.schema == schema.to_arrow()
    assert batch.to_pylist()[0] == {
        "N": Decimal("1.50"),
        "I": Decimal(7),
        "F": 2.5,
        "S": "3",
        "B": b"\xff",
        "L": True,
        "D": date(2013, 4, 28),
        "T": "20:57:01.123",
        "NTZ": datetime(2013, 4, 28, 20, 57, 1),
        "LTZ": datetime(2013, 4, 28, 20, 57, 1, tzinfo=UTC),
        "TZ": datetime(2013, 4, 28, 19, 57, 1, tzinfo=UTC),
        "V": '{"a":1}',
        "O": "{}",
        "A": "[1]",
    }
    assert isinstance(batch, pa.RecordBatch)
