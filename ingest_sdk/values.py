"""Value converters: one Python value -> the storage value of one column type.

Each converter has two paths. ``convert`` handles one value with every rule of
the seed system and raises a precise error; it is the reference behaviour.
``fast_array`` turns a whole column into Arrow in one vectorised step when every
value already has the column's natural Python type (ints for NUMBER, str for
VARCHAR, ...) and declines (returns ``None``) otherwise, so the per-value path
runs and produces the exact errors. Both paths must give the same result; the
tests check that.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from decimal import ROUND_HALF_UP, Context, Decimal
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from ingest_sdk.column_types import MAX_INT64_PRECISION, MAX_VARCHAR_LENGTH, ColumnType
from ingest_sdk.errors import InvalidTypeError, InvalidValueError, ValueConversionError

__all__ = [
    "BinaryConverter",
    "BooleanConverter",
    "FloatConverter",
    "NumberConverter",
    "TextConverter",
    "ValueConverter",
    "convert_column",
]

NoneType = type(None)
# Decimal arithmetic rounds to its context: the default one keeps 28 digits, fewer than
# NUMBER's 38. Every operation here that could round passes this context, or is exact
# (copy_abs, comparisons).
_DECIMAL_CONTEXT = Context(prec=100, Emax=10_000, Emin=-10_000)
NUMERIC_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEX_RE = re.compile(r"(?:[0-9a-fA-F]{2})*")


class ValueConverter:
    """Converts values for one column type; see the module docstring for the two paths."""

    #: Human description of accepted inputs, used in every error message ("Fix: send ...").
    accepted: ClassVar[str] = ""
    #: Python types (with NoneType) that ``fast_array`` may take without looking at values.
    fast_types: ClassVar[frozenset[type]] = frozenset()

    def __init__(self, column_type: ColumnType) -> None:
        self.column_type = column_type
        self.arrow_type = column_type.arrow_type

    def convert(self, value: Any) -> Any:
        """The storage value of one non-null input, or raise a conversion error."""
        raise NotImplementedError

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        """The whole column at once, or ``None`` to fall back to ``convert`` per value."""
        return None

    def build(self, storage_values: list[Any]) -> pa.Array:
        """An Arrow array from the outputs of ``convert`` (with ``None`` for nulls)."""
        return pa.array(storage_values, self.arrow_type)

    def type_error(self, value: Any) -> InvalidTypeError:
        return InvalidTypeError(
            f"a {type(value).__name__} cannot be converted to {self.column_type.declared}"
        )


def convert_column(
    converter: ValueConverter, values: Sequence[Any]
) -> tuple[pa.Array, dict[int, ValueConversionError]]:
    """Convert one column; bad values become nulls and are returned by row index."""
    if converter.fast_types and set(map(type, values)) <= converter.fast_types:
        array = converter.fast_array(values)
        if array is not None:
            return array, {}
    out: list[Any] = []
    errors: dict[int, ValueConversionError] = {}
    convert = converter.convert
    for index, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            out.append(convert(value))
        except ValueConversionError as exc:
            errors[index] = exc
            out.append(None)
        except Exception as exc:  # a user object that breaks our checks is still bad input
            error = InvalidValueError(f"cannot be converted ({type(exc).__name__}: {exc})")
            error.__cause__ = exc
            errors[index] = error
            out.append(None)
    return converter.build(out), errors


def _longest(lengths: pa.Array) -> int:
    """The largest of a column's value lengths (0 when all are null or there are none)."""
    return pc.max(lengths).as_py() or 0


def _plain_number_length(value: Decimal) -> int:
    """The length of ``_plain_number_text(value)`` for a finite value, without building it."""
    if not value:
        return 1
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    significant = len(digits)
    while digits[significant - 1] == 0:  # trailing zeros of the digits are not written
        significant -= 1
    exponent += len(digits) - significant
    if exponent >= 0:
        length = significant + exponent  # 15E+3 -> 15000
    elif significant > -exponent:
        length = significant + 1  # 12345E-2 -> 123.45
    else:
        length = 2 - exponent  # 15E-4 -> 0.0015
    return sign + length


def _plain_number_text(value: Decimal) -> str:
    """Plain decimal text without exponent or trailing zeros (``1.50E+2`` -> ``150``).

    Exact for every digit (no context rounding). A value whose plain text would be
    longer than any column holds (``1E+999999999``) is refused before it is built.
    """
    if not value.is_finite():
        return {"NaN": "NaN", "sNaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}[
            str(value)
        ]
    length = _plain_number_length(value)
    if length > MAX_VARCHAR_LENGTH:
        raise InvalidValueError(
            f"the number is {length} characters long in plain notation, more than the "
            f"{MAX_VARCHAR_LENGTH} any column holds"
        )
    if not value:
        return "0"
    text = format(value, "f")  # exact: formatting without a precision never rounds
    return text.rstrip("0").rstrip(".") if "." in text else text


class NumberConverter(ValueConverter):
    """NUMBER(p,s): round HALF_UP to s digits, then require ``|v| < 10^(p-s)``."""

    accepted = (
        "an int, float, Decimal or numeric string such as '12.5', '1e3' or '-1234E-5' "
        "within the column's precision and scale"
    )
    fast_types = frozenset({int, NoneType})

    def __init__(self, column_type: ColumnType) -> None:
        super().__init__(column_type)
        assert column_type.precision is not None and column_type.scale is not None
        self.precision, self.scale = column_type.precision, column_type.scale
        self.integer_digits = self.precision - self.scale
        self.limit = 10**self.integer_digits
        self.quantum = Decimal(1).scaleb(-self.scale)
        self.int64_storage = self.scale == 0 and self.precision <= MAX_INT64_PRECISION

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        try:
            array = pa.array(values, pa.int64())
        except (OverflowError, pa.ArrowException):
            return None
        if self.integer_digits <= MAX_INT64_PRECISION:
            bounds = pc.min_max(array)
            low, high = bounds["min"].as_py(), bounds["max"].as_py()
            if low is not None and (low <= -self.limit or high >= self.limit):
                return None
        if self.int64_storage:
            return array
        if self.scale == 0:
            return array.cast(self.arrow_type)  # int64 always fits 19+ digits
        # Arrow refuses int64 -> decimal(p, s>0) casts by type, whatever the values.
        return pa.array(values, self.arrow_type)

    def out_of_range(self) -> InvalidValueError:
        """The error for a value beyond the precision (shared with Arrow batch checks)."""
        return InvalidValueError(
            f"the number is out of range for {self.column_type.declared}: its absolute value "
            f"must be below 10^{self.integer_digits} (at most {self.integer_digits} digit(s) "
            "before the decimal point)"
        )

    def convert(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise self.type_error(value)
        if isinstance(value, int):
            if -self.limit < value < self.limit:
                if self.scale == 0:
                    return value
                return Decimal(value).quantize(self.quantum, context=_DECIMAL_CONTEXT)
            raise self.out_of_range()
        if isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidValueError("NaN and infinity cannot be stored in NUMBER")
            number = Decimal(repr(value))
        elif isinstance(value, Decimal):
            if not value.is_finite():
                raise InvalidValueError("NaN and infinity cannot be stored in NUMBER")
            number = value
        elif isinstance(value, str):
            text = value.strip()
            if not NUMERIC_RE.fullmatch(text):
                raise InvalidValueError("the text is not a number")
            number = Decimal(text)
        elif isinstance(value, numbers.Integral):
            return self.convert(int(value))
        elif isinstance(value, numbers.Real):
            return self.convert(float(value))
        else:
            raise self.type_error(value)
        # Reject far-out magnitudes before rounding, so "1e100000" costs nothing.
        if number and number.adjusted() >= self.integer_digits:
            raise self.out_of_range()
        rounded = number.quantize(self.quantum, rounding=ROUND_HALF_UP, context=_DECIMAL_CONTEXT)
        if rounded.copy_abs() >= self.limit:  # not abs(): it rounds to 28 digits, up to the limit
            raise self.out_of_range()
        return int(rounded) if self.scale == 0 else rounded


class FloatConverter(ValueConverter):
    """FLOAT (64-bit): numbers, numeric strings and NaN/inf strings in any case."""

    accepted = "an int, float, Decimal, numeric string, or 'NaN', 'inf', '-inf'"
    fast_types = frozenset({float, int, NoneType})
    _SPECIAL: ClassVar[dict[str, float]] = {
        "nan": math.nan,
        "inf": math.inf,
        "+inf": math.inf,
        "infinity": math.inf,
        "+infinity": math.inf,
        "-inf": -math.inf,
        "-infinity": -math.inf,
    }

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        try:
            return pa.array(values, pa.float64())
        except (OverflowError, pa.ArrowException):
            return None  # ints beyond 2^53 go through float() per value

    def convert(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise self.type_error(value)
        if isinstance(value, float):
            return value
        if isinstance(value, str):
            text = value.strip()
            special = self._SPECIAL.get(text.lower())
            if special is not None:
                return special
            if not NUMERIC_RE.fullmatch(text):
                raise InvalidValueError("the text is not a number")
            value = text
        elif not isinstance(value, (numbers.Real, Decimal)):
            raise self.type_error(value)
        try:
            result = float(value)
        except OverflowError as exc:
            raise InvalidValueError("the number is too large for a 64-bit FLOAT") from exc
        if math.isinf(result) and not (isinstance(value, Decimal) and value.is_infinite()):
            raise InvalidValueError("the number is too large for a 64-bit FLOAT")
        return result


class TextConverter(ValueConverter):
    """VARCHAR(n): text up to n code points; numbers and booleans become plain text."""

    fast_types = frozenset({str, NoneType})

    def __init__(self, column_type: ColumnType) -> None:
        super().__init__(column_type)
        assert column_type.length is not None
        self.length = column_type.length

    @property
    def accepted(self) -> str:  # type: ignore[override]
        return (
            f"a str of at most {self.length} characters (or an int, float, Decimal or bool, "
            "stored as plain text), or widen the column"
        )

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        try:
            array = pa.array(values, pa.string())
        except (UnicodeError, pa.ArrowException):
            return None  # lone surrogates: the per-value path names the row
        return None if _longest(pc.utf8_length(array)) > self.length else array

    def convert(self, value: Any) -> Any:
        if isinstance(value, str):
            text = value
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise InvalidValueError(
                    f"the text has a lone surrogate at position {exc.start}, which is not "
                    "valid Unicode"
                ) from exc
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float, Decimal)):
            text = self._number_text(value)
        else:
            raise self.type_error(value)
        if len(text) > self.length:
            raise InvalidValueError(
                f"the text is too long: {len(text)} characters, at most {self.length} allowed"
            )
        return text

    def _number_text(self, value: int | float | Decimal) -> str:
        """Every digit: an int as str() writes it, a float by its shortest text."""
        if isinstance(value, int):
            try:
                return str(value)
            except ValueError:
                pass  # more digits than str() writes (sys.get_int_max_str_digits)
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        length = _plain_number_length(number) if number.is_finite() else 0
        if length > self.length:  # checked first: 1E+999999999 must not be written out
            raise InvalidValueError(
                f"the text is too long: {length} characters, at most {self.length} allowed"
            )
        return _plain_number_text(number)


class BinaryConverter(ValueConverter):
    """BINARY(n): bytes-like values or hex text, at most n bytes."""

    fast_types = frozenset({bytes, NoneType})

    def __init__(self, column_type: ColumnType) -> None:
        super().__init__(column_type)
        assert column_type.length is not None
        self.length = column_type.length

    @property
    def accepted(self) -> str:  # type: ignore[override]
        return (
            f"bytes, bytearray, memoryview or a hex string (even length, digits 0-9 a-f) of at "
            f"most {self.length} bytes"
        )

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        array = pa.array(values, pa.binary())
        return None if _longest(pc.binary_length(array)) > self.length else array

    def convert(self, value: Any) -> Any:
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        elif isinstance(value, str):
            text = value.strip()
            if not _HEX_RE.fullmatch(text):
                raise InvalidValueError(
                    "the text is not hex: it needs an even number of the digits 0-9, a-f"
                )
            data = bytes.fromhex(text)
        else:
            raise self.type_error(value)
        if len(data) > self.length:
            raise InvalidValueError(
                f"the value is too long: {len(data)} bytes, at most {self.length} allowed"
            )
        return data


class BooleanConverter(ValueConverter):
    """BOOLEAN: bools, numbers (0 is false) and the seed's true/false words."""

    accepted = (
        "a bool, a number (0 is false), or one of 'true/t/yes/y/on/1' and "
        "'false/f/no/n/off/0' in any case"
    )
    fast_types = frozenset({bool, NoneType})
    _WORDS: ClassVar[dict[str, bool]] = {
        **dict.fromkeys(("true", "t", "yes", "y", "on", "1"), True),
        **dict.fromkeys(("false", "f", "no", "n", "off", "0"), False),
    }

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        return pa.array(values, pa.bool_())

    def convert(self, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            word = self._WORDS.get(value.strip().lower())
            if word is None:
                raise InvalidValueError("the text is not a boolean word")
            return word
        if isinstance(value, (numbers.Real, Decimal)):
            if (isinstance(value, Decimal) and value.is_nan()) or value != value:  # NaN
                raise InvalidValueError("NaN is neither true nor false")
            return value != 0  # exact for a Decimal or an int of any size
        raise self.type_error(value)
