"""Row batches: dict rows -> one Arrow RecordBatch plus a per-row error report.

This is the single conversion step of the system: the SDK runs it before a batch
leaves the producer, and the server runs it on JSON rows from plain HTTP clients.
Work is done column by column (so each column converts in one vectorised step
when its values have their natural Python type), and the per-row report is
assembled afterwards.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import pyarrow as pa
import pyarrow.compute as pc

from ingest_sdk.column_types import ColumnType, TypeKind
from ingest_sdk.errors import (
    ConfigurationError,
    InsertValidationError,
    InvalidTypeError,
    InvalidValueError,
)
from ingest_sdk.schema import Column, TableSchema, normalize_identifier
from ingest_sdk.semi_structured import SemiStructuredConverter
from ingest_sdk.temporal_values import DateConverter, TimeConverter, TimestampConverter
from ingest_sdk.validation import InsertError, InsertValidationResponse, OnErrorOption
from ingest_sdk.values import (
    BinaryConverter,
    BooleanConverter,
    FloatConverter,
    NumberConverter,
    TextConverter,
    ValueConverter,
    convert_column,
)

__all__ = ["ConversionOptions", "convert_rows", "convert_value", "converter_for"]

DEFAULT_TIMEZONE = "America/Los_Angeles"
DEFAULT_MAX_ROW_BYTES = 64 * 1024 * 1024


@functools.lru_cache(maxsize=64)
def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"unknown time zone {name!r}; use an IANA name such as 'UTC' or 'America/Los_Angeles'"
        ) from exc


@dataclass(frozen=True, slots=True)
class ConversionOptions:
    """Per-channel conversion settings.

    Attributes:
        default_timezone: IANA zone for TIMESTAMP_LTZ/TZ inputs without an offset.
        max_row_bytes: largest accepted row, counted as the converted size.
    """

    default_timezone: str = DEFAULT_TIMEZONE
    max_row_bytes: int = DEFAULT_MAX_ROW_BYTES

    def __post_init__(self) -> None:
        _zone(self.default_timezone)  # fail at construction, not on the first row
        if self.max_row_bytes <= 0:
            raise ConfigurationError(f"max_row_bytes must be positive, got {self.max_row_bytes}")


DEFAULT_OPTIONS = ConversionOptions()


@functools.lru_cache(maxsize=1024)
def converter_for(
    column_type: ColumnType, default_timezone: str = DEFAULT_TIMEZONE
) -> ValueConverter:
    """The (cached, stateless) converter of a column type."""
    kind = column_type.kind
    if kind is TypeKind.NUMBER:
        return NumberConverter(column_type)
    if kind is TypeKind.FLOAT:
        return FloatConverter(column_type)
    if kind is TypeKind.VARCHAR:
        return TextConverter(column_type)
    if kind is TypeKind.BINARY:
        return BinaryConverter(column_type)
    if kind is TypeKind.BOOLEAN:
        return BooleanConverter(column_type)
    if kind is TypeKind.DATE:
        return DateConverter(column_type)
    if kind is TypeKind.TIME:
        return TimeConverter(column_type)
    if kind in (TypeKind.TIMESTAMP_NTZ, TypeKind.TIMESTAMP_LTZ, TypeKind.TIMESTAMP_TZ):
        return TimestampConverter(column_type, _zone(default_timezone))
    return SemiStructuredConverter(column_type)


def convert_value(
    column_type: ColumnType | str, value: Any, options: ConversionOptions = DEFAULT_OPTIONS
) -> Any:
    """Convert one value to its Python storage value (for tests and tools).

    Raises:
        InvalidTypeError, InvalidValueError: as :func:`convert_rows` reports them.
    """
    if isinstance(column_type, str):
        column_type = ColumnType.parse(column_type)
    converter = converter_for(column_type, options.default_timezone)
    array, errors = convert_column(converter, [value])
    if errors:
        raise errors[0].locate(
            row_index=0,
            column=None,
            column_type=column_type.declared,
            value=value,
            accepted=converter.accepted,
        )
    return array[0].as_py()


@dataclass(slots=True)
class _KeyPlan:
    """How the keys of rows with one key order map to columns (cached per key tuple)."""

    keys_by_column: dict[int, str]
    extra: list[str]
    duplicates: dict[int, list[str]]


def _plan_keys(schema: TableSchema, index: dict[str, int], keys: tuple[Any, ...]) -> _KeyPlan:
    keys_by_column: dict[int, str] = {}
    extra: list[str] = []
    duplicates: dict[int, list[str]] = {}
    for key in keys:
        position = index.get(normalize_identifier(key)) if isinstance(key, str) and key else None
        if position is None:
            extra.append(key if isinstance(key, str) else repr(key))
        elif position in keys_by_column:
            duplicates.setdefault(position, [keys_by_column[position]]).append(key)
        else:
            keys_by_column[position] = key
    return _KeyPlan(keys_by_column, extra, duplicates)


class _RowProblems:
    """Collects the problems of one row before they become an InsertError."""

    __slots__ = ("exceptions", "extra", "messages", "missing", "nulls")

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.exceptions: list[Exception] = []
        self.extra: list[str] = []
        self.missing: list[str] = []
        self.nulls: list[str] = []

    def to_error(self, row_index: int) -> InsertError:
        return InsertError(
            row_index=row_index,
            message="; ".join(self.messages),
            extra_col_names=self.extra,
            missing_not_null_col_names=self.missing,
            null_value_for_not_null_col_names=self.nulls,
            exception=self.exceptions[0] if self.exceptions else None,
        )


def _names(names: list[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


class _BatchConverter:
    """One call of :func:`convert_rows`; holds the per-row problems while it runs."""

    def __init__(self, schema: TableSchema, rows: Sequence[Any], options: ConversionOptions):
        self.schema = schema
        self.rows = rows
        self.options = options
        self.problems: dict[int, _RowProblems] = {}
        self.not_rows: set[int] = set()  # indices of "rows" that are not dicts

    def problem(self, row_index: int) -> _RowProblems:
        found = self.problems.get(row_index)
        if found is None:
            found = self.problems[row_index] = _RowProblems()
        return found

    def column_values(self) -> tuple[list[list[Any]], list[list[bool] | bool]]:
        """Values per column, and per column whether each row mentioned it."""
        schema, rows, count = self.schema, self.rows, len(self.rows)
        index = {column.name: i for i, column in enumerate(schema.columns)}
        plans: dict[tuple[Any, ...], _KeyPlan] = {}
        row_plans: list[_KeyPlan | None] = []
        for row_index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                problems = self.problem(row_index)
                error = InvalidTypeError("a row must be a dict of column name to value")
                problems.exceptions.append(
                    error.locate(
                        row_index=row_index,
                        column=None,
                        column_type=None,
                        value=row,
                        accepted="each row as a dict such as {'ID': 1}",
                    )
                )
                problems.messages.append(str(error))
                self.not_rows.add(row_index)
                row_plans.append(None)
                continue
            keys = tuple(row)
            plan = plans.get(keys)
            if plan is None:
                plan = plans[keys] = _plan_keys(schema, index, keys)
            row_plans.append(plan)
            if plan.extra or plan.duplicates:
                self._report_keys(row_index, plan)

        width = len(schema.columns)
        if len(plans) == 1 and all(p is not None for p in row_plans):
            # Every row has the same keys: pull each column out in one C-level pass.
            plan = next(iter(plans.values()))
            values: list[list[Any]] = []
            present: list[list[bool] | bool] = []
            for position in range(width):
                key = plan.keys_by_column.get(position)
                values.append(
                    list(map(itemgetter(key), rows)) if key is not None else [None] * count
                )
                present.append(key is not None)
            return values, present
        values = [[None] * count for _ in range(width)]
        present = [[False] * count for _ in range(width)]
        for row_index, (row, row_plan) in enumerate(zip(rows, row_plans, strict=True)):
            if row_plan is None:
                continue
            for position, key in row_plan.keys_by_column.items():
                values[position][row_index] = row[key]
                present[position][row_index] = True  # type: ignore[index]
        return values, present

    def _report_keys(self, row_index: int, plan: _KeyPlan) -> None:
        problems = self.problem(row_index)
        if plan.extra:
            problems.extra.extend(plan.extra)
            known = ", ".join(c.name for c in self.schema.columns)
            message = (
                f"Row {row_index}: unknown column(s) {_names(plan.extra)}. Fix: remove them or "
                f"add them to the table (columns: {known}); unquoted names match case-"
                'insensitively, "quoted" names exactly'
            )
            problems.messages.append(message)
            problems.exceptions.append(InvalidValueError(message))
        for position, keys in plan.duplicates.items():
            column = self.schema.columns[position].name
            message = (
                f'Row {row_index}: column "{column}" is given more than once (as '
                f"{_names(keys)}). Fix: send each column once"
            )
            problems.messages.append(message)
            problems.exceptions.append(InvalidValueError(message))

    def convert_column(self, column: Column, values: list[Any]) -> tuple[pa.Array, set[int]]:
        """The column's array, and the rows whose value failed (reported already)."""
        converter = converter_for(column.type, self.options.default_timezone)
        array, errors = convert_column(converter, values)
        for row_index, error in errors.items():
            error.locate(
                row_index=row_index,
                column=column.name,
                column_type=column.type.declared,
                value=values[row_index],
                accepted=converter.accepted,
            )
            problems = self.problem(row_index)
            problems.messages.append(str(error))
            problems.exceptions.append(error)
        return array, set(errors)

    def check_not_null(
        self, column: Column, array: pa.Array, present: list[bool] | bool, skip: set[int]
    ) -> None:
        if column.nullable or not array.null_count:
            return
        for row_index in pc.indices_nonzero(array.is_null()).to_pylist():
            if row_index in skip:
                continue  # already reported: a bad value here, or the row is not a dict
            given = present if isinstance(present, bool) else present[row_index]
            problems = self.problem(row_index)
            if given:
                problems.nulls.append(column.name)
                message = (
                    f'Row {row_index}: NULL given for NOT NULL column "{column.name}". '
                    "Fix: send a value"
                )
            else:
                problems.missing.append(column.name)
                message = (
                    f'Row {row_index}: NOT NULL column "{column.name}" is missing. '
                    "Fix: add it to the row"
                )
            problems.messages.append(message)
            problems.exceptions.append(InvalidValueError(message))

    def check_row_sizes(self, arrays: list[pa.Array]) -> None:
        limit = self.options.max_row_bytes
        if sum(array.nbytes for array in arrays) <= limit:
            return  # no single row can be larger than the whole batch
        sizes = pa.array([0] * len(self.rows), pa.int64())
        for array in arrays:
            if pa.types.is_string(array.type) or pa.types.is_binary(array.type):
                widths = pc.fill_null(pc.binary_length(array), 0).cast(pa.int64())
            else:
                widths = pa.array([max(1, array.type.bit_width // 8)] * len(array), pa.int64())
            sizes = pc.add(sizes, widths)
        for row_index in pc.indices_nonzero(pc.greater(sizes, limit)).to_pylist():
            size = sizes[row_index].as_py()
            message = (
                f"Row {row_index}: the row is {size} bytes, larger than the {limit}-byte "
                "limit. Fix: split the value or raise max_row_bytes"
            )
            problems = self.problem(row_index)
            problems.messages.append(message)
            problems.exceptions.append(InvalidValueError(message))


def convert_rows(
    schema: TableSchema,
    rows: Sequence[Mapping[str, Any]],
    on_error: OnErrorOption | str = OnErrorOption.ABORT,
    options: ConversionOptions = DEFAULT_OPTIONS,
) -> tuple[pa.RecordBatch | None, InsertValidationResponse]:
    """Validate and convert rows for one table.

    Args:
        schema: the table's columns, e.g. ``TableSchema.parse({"ID": "NUMBER NOT NULL"})``.
        rows: dicts of column name (identifier rules, see :mod:`ingest_sdk.schema`) to value.
        on_error: CONTINUE, SKIP_BATCH or ABORT (see :class:`OnErrorOption`).
        options: the channel's time zone and row size limit.

    Returns:
        The batch of rows that go in (``None`` when no row does) and the report of
        every bad row.

    Raises:
        InsertValidationError: under ABORT, for the first bad row; nothing goes in.
    """
    mode = OnErrorOption.parse(on_error)
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes, Mapping)):
        rows = list(rows)  # an iterator or generator of rows
    count = len(rows)
    batch = _BatchConverter(schema, rows, options)
    values, present = batch.column_values()
    arrays = []
    for position, column in enumerate(schema.columns):
        array, bad_rows = batch.convert_column(column, values[position])
        batch.check_not_null(column, array, present[position], bad_rows | batch.not_rows)
        arrays.append(array)
    batch.check_row_sizes(arrays)

    errors = [batch.problems[i].to_error(i) for i in sorted(batch.problems)]
    response = InsertValidationResponse(errors, row_count=count)
    if errors and mode is OnErrorOption.ABORT:
        raise InsertValidationError(errors[0])
    if errors and mode is OnErrorOption.SKIP_BATCH:
        return None, response
    record_batch = pa.RecordBatch.from_arrays(arrays, schema=schema.to_arrow())
    if errors:
        keep = [True] * count
        for error in errors:
            keep[error.row_index] = False
        record_batch = record_batch.filter(pa.array(keep))
    response.inserted_row_count = record_batch.num_rows
    if record_batch.num_rows == 0:
        return None, response
    return record_batch, response
