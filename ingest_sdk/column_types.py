"""Declared column types of the seed system and how each is stored in Delta.

A producer declares ``NUMBER(10,2)`` or ``TIMESTAMP_LTZ(3)``; Delta only knows
``decimal``, ``timestamp`` and friends. A :class:`ColumnType` holds both: the
declared form (kept in the Delta field metadata under :data:`DECLARED_TYPE_KEY`,
so it survives with the table) and the Arrow/Delta storage type that Spark and
delta-rs read without custom code. The mapping and what storage cannot keep are
documented in docs/types.md.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

import pyarrow as pa

from ingest_sdk.errors import SchemaError, UnsupportedFeatureError

__all__ = ["DECLARED_TYPE_KEY", "ColumnType", "TypeKind"]

#: Delta/Arrow field metadata key that keeps the declared type of a column.
DECLARED_TYPE_KEY = "ingest.declared_type"

MAX_VARCHAR_LENGTH = 16_777_216
MAX_BINARY_LENGTH = 8_388_608
MAX_NUMBER_PRECISION = 38
MAX_FRACTION_PRECISION = 9
#: NUMBER(p,0) up to this precision is stored as a 64-bit integer (Delta ``long``).
MAX_INT64_PRECISION = 18


class TypeKind(enum.Enum):
    """The families of column types; synonyms collapse to one kind."""

    NUMBER = "NUMBER"
    FLOAT = "FLOAT"
    VARCHAR = "VARCHAR"
    BINARY = "BINARY"
    BOOLEAN = "BOOLEAN"
    DATE = "DATE"
    TIME = "TIME"
    TIMESTAMP_NTZ = "TIMESTAMP_NTZ"
    TIMESTAMP_LTZ = "TIMESTAMP_LTZ"
    TIMESTAMP_TZ = "TIMESTAMP_TZ"
    VARIANT = "VARIANT"
    OBJECT = "OBJECT"
    ARRAY = "ARRAY"


# Declared names (upper case, single spaces) -> (kind, fixed parameters).
# Integer synonyms are NUMBER(38,0), as in the seed system.
_INTEGER_NAMES = ("INT", "INTEGER", "BIGINT", "SMALLINT", "TINYINT", "BYTEINT")
_SYNONYMS: dict[str, TypeKind] = {
    **{name: TypeKind.NUMBER for name in ("NUMBER", "DECIMAL", "NUMERIC", "DEC")},
    **{name: TypeKind.NUMBER for name in _INTEGER_NAMES},
    **{
        name: TypeKind.FLOAT
        for name in ("FLOAT", "FLOAT4", "FLOAT8", "DOUBLE", "DOUBLE PRECISION", "REAL")
    },
    **{
        name: TypeKind.VARCHAR
        for name in (
            "VARCHAR",
            "CHAR",
            "CHARACTER",
            "NCHAR",
            "STRING",
            "TEXT",
            "NVARCHAR",
            "NVARCHAR2",
            "CHAR VARYING",
            "CHARACTER VARYING",
            "NCHAR VARYING",
        )
    },
    **{name: TypeKind.BINARY for name in ("BINARY", "VARBINARY")},
    "BOOLEAN": TypeKind.BOOLEAN,
    "DATE": TypeKind.DATE,
    "TIME": TypeKind.TIME,
    **{
        name: TypeKind.TIMESTAMP_NTZ
        for name in (
            "TIMESTAMP",
            "DATETIME",
            "TIMESTAMP_NTZ",
            "TIMESTAMPNTZ",
            "TIMESTAMP WITHOUT TIME ZONE",
        )
    },
    **{
        name: TypeKind.TIMESTAMP_LTZ
        for name in ("TIMESTAMP_LTZ", "TIMESTAMPLTZ", "TIMESTAMP WITH LOCAL TIME ZONE")
    },
    **{
        name: TypeKind.TIMESTAMP_TZ
        for name in ("TIMESTAMP_TZ", "TIMESTAMPTZ", "TIMESTAMP WITH TIME ZONE")
    },
    "VARIANT": TypeKind.VARIANT,
    "OBJECT": TypeKind.OBJECT,
    "ARRAY": TypeKind.ARRAY,
}
# The seed system's CHAR without a length is CHAR(1); VARCHAR and STRING take the maximum.
_CHAR_DEFAULT_ONE = frozenset({"CHAR", "CHARACTER", "NCHAR"})
_UNSUPPORTED = {
    "GEOGRAPHY": "GEOGRAPHY columns are not supported by streaming ingest",
    "GEOMETRY": "GEOMETRY columns are not supported by streaming ingest",
}
_NAMES_LONGEST_FIRST = sorted([*_SYNONYMS, *_UNSUPPORTED], key=len, reverse=True)
_PARAMS_RE = re.compile(r"\(\s*([^()]*?)\s*\)")


@dataclass(frozen=True, slots=True)
class ColumnType:
    """A declared column type.

    Attributes:
        kind: the type family.
        precision: NUMBER digits (1..38) or fractional-second digits (0..9) of
            TIME and TIMESTAMP_*; ``None`` for other kinds.
        scale: NUMBER digits after the point (0..precision).
        length: VARCHAR characters or BINARY bytes.
    """

    kind: TypeKind
    precision: int | None = None
    scale: int | None = None
    length: int | None = None

    @classmethod
    def parse(cls, text: str) -> ColumnType:
        """Parse a declared type such as ``NUMBER(10,2)`` or ``timestamp_ltz(3)``.

        Returns the type and leaves no trailing text; use
        :func:`split_declared_type` to separate a type from column constraints.

        Raises:
            SchemaError: the text is not a known type or its parameters are out of range.
            UnsupportedFeatureError: a recognised type that cannot be ingested.
        """
        column_type, rest = split_declared_type(text)
        if rest:
            raise SchemaError(f"unexpected text {rest!r} after column type in {text!r}")
        return column_type

    @property
    def declared(self) -> str:
        """The canonical declared form, e.g. ``NUMBER(38,0)``, ``VARCHAR(16777216)``."""
        kind = self.kind
        if kind is TypeKind.NUMBER:
            return f"NUMBER({self.precision},{self.scale})"
        if kind in (TypeKind.VARCHAR, TypeKind.BINARY):
            return f"{kind.value}({self.length})"
        if self.precision is not None:
            return f"{kind.value}({self.precision})"
        return kind.value

    def __str__(self) -> str:
        return self.declared

    @property
    def arrow_type(self) -> pa.DataType:
        """The Arrow type rows of this column are converted to (and Delta stores)."""
        return _storage_type(self)

    def arrow_field(self, name: str, nullable: bool = True) -> pa.Field:
        """An Arrow field carrying the declared type in its metadata."""
        return pa.field(
            name, self.arrow_type, nullable=nullable, metadata={DECLARED_TYPE_KEY: self.declared}
        )


def split_declared_type(text: str) -> tuple[ColumnType, str]:
    """Split ``"NUMBER(38,0) NOT NULL"`` into the type and the remaining text."""
    if not isinstance(text, str):
        raise SchemaError(f"a column type must be a string such as 'NUMBER(38,0)', got {text!r}")
    normalized = " ".join(text.split())
    upper = normalized.upper()
    for name in _NAMES_LONGEST_FIRST:
        if upper == name or upper.startswith(name + " ") or upper.startswith(name + "("):
            break
    else:
        raise SchemaError(
            f"unknown column type {text!r}; known types: NUMBER, DECIMAL, INT, FLOAT, VARCHAR, "
            "BINARY, BOOLEAN, DATE, TIME, TIMESTAMP_NTZ/LTZ/TZ, VARIANT, OBJECT, ARRAY"
        )
    if name in _UNSUPPORTED:
        raise UnsupportedFeatureError(f"{_UNSUPPORTED[name]} (declared as {text!r})")
    rest = normalized[len(name) :].lstrip()
    params: list[str] = []
    match = _PARAMS_RE.match(rest)
    if match:
        params = [p.strip() for p in match.group(1).split(",")]
        rest = rest[match.end() :].strip()
    return _build(name, _SYNONYMS[name], params, text), rest


def _shown(text: str) -> str:
    """A declaration or parameter as error messages repeat it: at most 80 characters."""
    return repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(text)} characters)"


def _int_param(value: str, what: str, text: str, low: int, high: int) -> int:
    if not re.fullmatch(r"[0-9]+", value):
        raise SchemaError(f"{what} must be a whole number in {_shown(text)}, got {_shown(value)}")
    if len(value.lstrip("0")) > 12:  # past every limit; int() of 5,000 digits would raise
        raise SchemaError(
            f"{what} must be between {low} and {high} in {_shown(text)}, got a number of "
            f"{len(value)} digits"
        )
    number = int(value)
    if not low <= number <= high:
        raise SchemaError(
            f"{what} must be between {low} and {high} in {_shown(text)}, got {number}"
        )
    return number


def _build(name: str, kind: TypeKind, params: list[str], text: str) -> ColumnType:
    def expect_at_most(count: int) -> None:
        if len(params) > count:
            raise SchemaError(f"{name} takes at most {count} parameter(s), got {text!r}")

    if kind is TypeKind.NUMBER:
        if name in _INTEGER_NAMES:
            expect_at_most(0)
            return ColumnType(kind, precision=MAX_NUMBER_PRECISION, scale=0)
        expect_at_most(2)
        precision = (
            _int_param(params[0], "precision", text, 1, MAX_NUMBER_PRECISION)
            if params
            else MAX_NUMBER_PRECISION
        )
        scale = _int_param(params[1], "scale", text, 0, precision) if len(params) > 1 else 0
        return ColumnType(kind, precision=precision, scale=scale)
    if kind is TypeKind.VARCHAR:
        expect_at_most(1)
        default = 1 if name in _CHAR_DEFAULT_ONE else MAX_VARCHAR_LENGTH
        length = _int_param(params[0], "length", text, 1, MAX_VARCHAR_LENGTH) if params else default
        return ColumnType(kind, length=length)
    if kind is TypeKind.BINARY:
        expect_at_most(1)
        length = (
            _int_param(params[0], "length", text, 1, MAX_BINARY_LENGTH)
            if params
            else MAX_BINARY_LENGTH
        )
        return ColumnType(kind, length=length)
    if kind in (
        TypeKind.TIME,
        TypeKind.TIMESTAMP_NTZ,
        TypeKind.TIMESTAMP_LTZ,
        TypeKind.TIMESTAMP_TZ,
    ):
        expect_at_most(1)
        precision = (
            _int_param(params[0], "precision", text, 0, MAX_FRACTION_PRECISION)
            if params
            else MAX_FRACTION_PRECISION
        )
        return ColumnType(kind, precision=precision)
    expect_at_most(0)
    return ColumnType(kind)


_TIMESTAMP_UTC = pa.timestamp("us", tz="UTC")
_FIXED_STORAGE: dict[TypeKind, pa.DataType] = {
    TypeKind.FLOAT: pa.float64(),
    TypeKind.VARCHAR: pa.string(),
    TypeKind.BINARY: pa.binary(),
    TypeKind.BOOLEAN: pa.bool_(),
    TypeKind.DATE: pa.date32(),
    # Delta has no TIME type: fixed-width text HH:MM:SS[.fraction] keeps all nine
    # digits, sorts correctly and reads as-is in Spark.
    TypeKind.TIME: pa.string(),
    # Delta timestamps hold microseconds; ntz = wall clock, plain = UTC instant.
    TypeKind.TIMESTAMP_NTZ: pa.timestamp("us"),
    TypeKind.TIMESTAMP_LTZ: _TIMESTAMP_UTC,
    TypeKind.TIMESTAMP_TZ: _TIMESTAMP_UTC,
    TypeKind.VARIANT: pa.string(),
    TypeKind.OBJECT: pa.string(),
    TypeKind.ARRAY: pa.string(),
}


def _storage_type(column_type: ColumnType) -> pa.DataType:
    if column_type.kind is TypeKind.NUMBER:
        precision, scale = column_type.precision, column_type.scale
        assert precision is not None and scale is not None
        if scale == 0 and precision <= MAX_INT64_PRECISION:
            return pa.int64()
        return pa.decimal128(precision, scale)
    return _FIXED_STORAGE[column_type.kind]
