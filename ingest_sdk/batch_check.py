"""Checking whole Arrow batches against a table schema, without going row by row.

Two users: ``insert_batch`` in the SDK (a producer's RecordBatch, Table or
DataFrame, whose columns may need a cast to the storage types), and the server,
which receives Arrow from clients and never trusts it: every constraint the
row converter enforces (NOT NULL, lengths, ranges, TIME layout, JSON shape) is
checked again here with vectorised compute.

Columns whose Arrow type cannot be cast safely fall back to the per-value rules
of :mod:`ingest_sdk.values`. Semi-structured text is checked for size and shape
(an OBJECT starts with ``{``, an ARRAY with ``[``), not parsed again.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest_sdk.column_types import MAX_INT64_PRECISION, TypeKind
from ingest_sdk.errors import InvalidTypeError, InvalidValueError, ValueConversionError
from ingest_sdk.rows import DEFAULT_OPTIONS, ConversionOptions, converter_for
from ingest_sdk.schema import Column, TableSchema
from ingest_sdk.semi_structured import MAX_SEMI_STRUCTURED_BYTES
from ingest_sdk.temporal import NANOS_PER_DAY, days_from_civil
from ingest_sdk.values import NumberConverter, convert_column

__all__ = ["check_arrow_batch"]

_MIN_TS_US = days_from_civil(1, 1, 1) * NANOS_PER_DAY // 1000
_MAX_TS_US = days_from_civil(10000, 1, 1) * NANOS_PER_DAY // 1000 - 1
_MIN_DATE, _MAX_DATE = days_from_civil(-9999, 1, 1), days_from_civil(9999, 12, 31)


def _first(mask: pa.Array) -> int | None:
    """Index of the first true value of a boolean mask, or None."""
    indices = pc.indices_nonzero(pc.fill_null(mask, False))
    return indices[0].as_py() if len(indices) else None


def _fail(error: ValueConversionError, column: Column, row: int, value: Any, accepted: str) -> None:
    raise error.locate(
        row_index=row,
        column=column.name,
        column_type=column.type.declared,
        value=value,
        accepted=accepted,
    )


_NUMERIC_KINDS = frozenset({TypeKind.NUMBER, TypeKind.FLOAT})
_EPOCH_KINDS = frozenset(
    {TypeKind.DATE, TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ, TypeKind.TIMESTAMP_TZ}
)


def _time_pattern(column: Column) -> str:
    """The stored layout of a TIME(p) value: HH:MM:SS and exactly p fraction digits."""
    precision = column.type.precision or 0
    fraction = rf"\.\d{{{precision}}}" if precision else ""
    return rf"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d{fraction}$"


def _canonical_time(column: Column, array: pa.Array) -> bool:
    """Whether every TIME text is already in the stored layout (else the row rules
    normalise it value by value: '20:57' is 20:57:00 as it is for dict rows)."""
    matches = pc.match_substring_regex(array, _time_pattern(column))
    return bool(pc.all(pc.or_(matches, pc.is_null(array))).as_py() is not False)


def _cast_column(column: Column, array: pa.Array, options: ConversionOptions) -> pa.Array:
    target = column.type.arrow_type
    if array.type == target and (
        column.type.kind is not TypeKind.TIME or _canonical_time(column, array)
    ):
        return array
    converter = converter_for(column.type, options.default_timezone)
    if pa.types.is_timestamp(array.type) and pa.types.is_timestamp(target):
        if target.tz is not None and array.type.tz is None:
            # A naive timestamp means wall-clock time in the channel's zone, as for dict rows.
            array = pc.assume_timezone(
                array, options.default_timezone, ambiguous="earliest", nonexistent="earliest"
            )
        elif target.tz is None and array.type.tz is not None:
            array = pc.local_timestamp(array)  # keep the wall clock, as for aware datetimes
    castable = not (
        column.type.kind
        in (TypeKind.TIME, TypeKind.VARIANT, TypeKind.OBJECT, TypeKind.ARRAY, TypeKind.BOOLEAN)
        or pa.types.is_string(array.type)
        or pa.types.is_large_string(array.type)
        # Arrow rounds a double's binary value half-to-even (9.995 -> 9.99); the row rules
        # round its shortest text HALF_UP (9.995 -> 10.00), so doubles go value by value.
        or (column.type.kind is TypeKind.NUMBER and pa.types.is_floating(array.type))
        # An integer means seconds, millis, micros or nanos since the epoch by its
        # magnitude (the row rule); Arrow's cast would read every integer as micros.
        or (column.type.kind in _EPOCH_KINDS and pa.types.is_integer(array.type))
        # The row rules refuse booleans as numbers, and write numbers as text in plain
        # digits (1e+20 -> 100000000000000000000, 1.50 -> 1.5); Arrow's casts do neither.
        or (column.type.kind in _NUMERIC_KINDS and pa.types.is_boolean(array.type))
        or (
            column.type.kind is TypeKind.VARCHAR
            and (pa.types.is_floating(array.type) or pa.types.is_decimal(array.type))
        )
    )
    if castable:
        if pa.types.is_decimal128(array.type) and pa.types.is_decimal(target):
            # Arrow rescales decimal128 in 128 bits and wraps around unchecked, even when
            # safe: 35 as decimal128(2,0) cast to decimal128(37,37) gave 0.97176... From
            # decimal256 the result is checked. Widening first is exact.
            array = pc.cast(array, pa.decimal256(76, array.type.scale))
        try:
            return pc.cast(array, target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            pass  # the per-value rules below find and name the bad value
    values = array.to_pylist()
    converted, errors = convert_column(converter, values)
    if errors:
        row = min(errors)
        _fail(errors[row], column, row, values[row], converter.accepted)
    return converted


def _check_constraints(column: Column, array: pa.Array) -> None:
    """Every rule the row converter enforces, checked on a storage-typed array."""
    column_type, kind = column.type, column.type.kind
    accepted = converter_for(column_type).accepted

    def check(mask: pa.Array, reason: str) -> None:
        row = _first(mask)
        if row is not None:
            _fail(InvalidValueError(reason), column, row, array[row].as_py(), accepted)

    if not column.nullable and array.null_count:
        row = _first(array.is_null())
        message = f'NULL given for NOT NULL column "{column.name}"'
        _fail(InvalidValueError(message), column, row or 0, None, "a value")
    if kind is TypeKind.VARCHAR:
        check(
            pc.greater(pc.utf8_length(array), column_type.length),
            f"the text is longer than {column_type.length} characters",
        )
    elif kind is TypeKind.BINARY:
        check(
            pc.greater(pc.binary_length(array), column_type.length),
            f"the value is longer than {column_type.length} bytes",
        )
    elif kind is TypeKind.NUMBER:
        assert column_type.precision is not None and column_type.scale is not None
        digits = column_type.precision - column_type.scale
        converter = converter_for(column_type)
        assert isinstance(converter, NumberConverter)
        reason = converter.out_of_range().reason
        if pa.types.is_integer(array.type) and digits <= MAX_INT64_PRECISION:
            # Not abs(): it wraps around for the smallest int64, which would pass.
            bound = 10**digits
            check(pc.or_(pc.greater_equal(array, bound), pc.less_equal(array, -bound)), reason)
        elif pa.types.is_decimal(array.type):
            # Arrow does not enforce precision on data it receives: compare unscaled values.
            unscaled = array.view(pa.decimal128(38, 0)).cast(pa.decimal256(76, 0))
            bound = pa.scalar(10**column_type.precision, pa.decimal256(76, 0))
            check(pc.greater_equal(pc.abs(unscaled), bound), reason)
    elif kind is TypeKind.TIME:
        assert column_type.precision is not None
        check(
            pc.invert(pc.match_substring_regex(array, _time_pattern(column))),
            f"the text is not a {column_type.declared} value HH:MM:SS"
            + (f".{'f' * column_type.precision}" if column_type.precision else ""),
        )
    elif kind in (TypeKind.VARIANT, TypeKind.OBJECT, TypeKind.ARRAY):
        check(
            pc.greater(pc.binary_length(array), MAX_SEMI_STRUCTURED_BYTES),
            f"the serialized value is larger than {MAX_SEMI_STRUCTURED_BYTES} bytes",
        )
        if kind is not TypeKind.VARIANT:
            opener = "{" if kind is TypeKind.OBJECT else "["
            check(
                pc.invert(pc.starts_with(array, opener)),
                f"the text is not a JSON {'object' if opener == '{' else 'array'}",
            )
    elif kind in (TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ, TypeKind.TIMESTAMP_TZ):
        micros = array.cast(pa.int64())
        check(
            pc.or_(pc.less(micros, _MIN_TS_US), pc.greater(micros, _MAX_TS_US)),
            "the timestamp is outside years 1..9999",
        )
    elif kind is TypeKind.DATE:
        days = array.cast(pa.int32())
        check(
            pc.or_(pc.less(days, _MIN_DATE), pc.greater(days, _MAX_DATE)),
            "the date is outside years -9999..9999",
        )


def check_arrow_batch(
    schema: TableSchema,
    data: pa.RecordBatch | pa.Table,
    options: ConversionOptions = DEFAULT_OPTIONS,
) -> pa.Table:
    """Check (and cast where safe) Arrow data for a table; all or nothing.

    Columns are matched by identifier rules; missing nullable columns become NULL.

    Returns:
        A table with exactly the table's Arrow schema.

    Raises:
        InvalidTypeError, InvalidValueError: naming the first bad row, column, value and fix.
    """
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    by_column: dict[str, pa.ChunkedArray] = {}
    for index, name in enumerate(data.column_names):
        column = schema.find(name)
        if column is None:
            known = ", ".join(c.name for c in schema.columns)
            raise InvalidValueError(
                f'unknown column "{name}"; the table has {known}. Fix: rename or drop it'
            )
        if column.name in by_column:
            raise InvalidValueError(f'column "{column.name}" is given more than once')
        by_column[column.name] = data.column(index)
    arrays = []
    for column in schema.columns:
        found = by_column.get(column.name)
        if found is None:
            if not column.nullable and data.num_rows:
                raise InvalidValueError(
                    f'NOT NULL column "{column.name}" is missing from the batch. Fix: add it'
                )
            array: pa.Array = pa.nulls(data.num_rows, column.type.arrow_type)
        else:
            array = found.combine_chunks() if found.num_chunks != 1 else found.chunk(0)
            if isinstance(array, pa.ExtensionArray):
                raise InvalidTypeError(f'column "{column.name}" has an extension type')
            array = _cast_column(column, array, options)
        _check_constraints(column, array)
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=schema.to_arrow())
