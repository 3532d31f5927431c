"""Converters for VARIANT, OBJECT and ARRAY columns, stored as canonical JSON text.

Canonical means deterministic: keys sorted, no insignificant white space,
numbers written exactly (``Decimal`` and integers beyond 64 bits keep every
digit), ``bytes`` as hex text, dates and times as ISO-8601 text. JSON strings
from producers are parsed (duplicate keys and NaN are value errors) and written
back in the same canonical form, so equal documents are equal text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import date, time
from decimal import Decimal
from typing import Any

import orjson

from ingest_sdk.column_types import ColumnType, TypeKind
from ingest_sdk.errors import InvalidTypeError, InvalidValueError
from ingest_sdk.values import ValueConverter, _plain_number_text

__all__ = ["MAX_SEMI_STRUCTURED_BYTES", "SemiStructuredConverter"]

#: Largest serialized VARIANT/OBJECT/ARRAY value, in bytes (as in the seed system).
MAX_SEMI_STRUCTURED_BYTES = 16_777_152
_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
_INT64_MIN, _INT64_MAX = -(2**63), 2**64 - 1


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str) -> Any:
    """Parse JSON text exactly (decimals stay ``Decimal``), refusing duplicate keys and NaN."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_float=Decimal,
            parse_constant=_reject_constant,
        )
    except _DuplicateKey as exc:
        raise InvalidValueError(f"the JSON object has the key {exc.args[0]!r} twice") from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidValueError(f"the text is not valid JSON ({exc})") from exc


def _default(value: Any) -> Any:
    """orjson hook for the types it does not write itself."""
    # orjson replaces the message of what this raises; _prepare gives the precise one.
    if isinstance(value, Decimal) and value.is_finite():
        return orjson.Fragment(_plain_number_text(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    raise TypeError(type(value).__name__)


def _prepare(value: Any, depth: int = 0) -> Any:
    """Slow path: make a value orjson can write exactly, or raise InvalidValueError.

    Used only when the fast ``orjson.dumps`` refuses the value or may have turned a
    NaN into ``null``: integers beyond 64 bits become exact fragments, NaN fails.
    """
    if depth > 1000:
        raise InvalidValueError("the value is nested more than 1000 levels deep")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidValueError("NaN and infinity have no JSON form")
        return value
    if isinstance(value, Decimal) and not value.is_finite():
        raise InvalidValueError("NaN and infinity have no JSON form")
    if isinstance(value, (set, frozenset)):
        raise InvalidValueError("a set has no JSON form; send a list")
    if isinstance(value, int) and not isinstance(value, bool):
        return value if _INT64_MIN <= value <= _INT64_MAX else orjson.Fragment(str(value))
    if isinstance(value, Mapping):
        return {key: _prepare(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_prepare(item, depth + 1) for item in value]
    return value


def to_canonical_json(value: Any) -> bytes:
    """Canonical JSON bytes of a Python value.

    Raises:
        InvalidValueError: a nested value has no JSON form (NaN, a set, an object).
    """
    try:
        data = orjson.dumps(value, default=_default, option=_OPTIONS)
    except (orjson.JSONEncodeError, TypeError) as exc:
        # Too-large ints and deep nesting land here; _prepare fixes the first kind.
        try:
            data = orjson.dumps(_prepare(value), default=_default, option=_OPTIONS)
        except (orjson.JSONEncodeError, TypeError) as again:
            raise InvalidValueError(f"the value has no JSON form: {again}") from exc
        return data
    if b"null" in data:
        # orjson writes NaN as null; look closer only when a null could be one.
        data = orjson.dumps(_prepare(value), default=_default, option=_OPTIONS)
    return data


class SemiStructuredConverter(ValueConverter):
    """VARIANT accepts any JSON value; OBJECT requires an object; ARRAY wraps non-arrays."""

    def __init__(self, column_type: ColumnType) -> None:
        super().__init__(column_type)
        self.kind = column_type.kind

    @property
    def accepted(self) -> str:  # type: ignore[override]
        if self.kind is TypeKind.OBJECT:
            return "a dict or a JSON object string such as '{\"a\": 1}'"
        if self.kind is TypeKind.ARRAY:
            return "a list or tuple, a JSON array string, or any JSON value (wrapped in an array)"
        return (
            "a JSON string, or a dict, list, tuple, int, float, bool, Decimal, bytes or "
            "date/time value"
        )

    def convert(self, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if not text:
                if self.kind is TypeKind.VARIANT:
                    return None  # an empty or blank string is SQL NULL for VARIANT
                raise InvalidValueError(f"an empty string is not a JSON {self._shape()}")
            document = parse_json(text)
        elif isinstance(
            value,
            (Mapping, list, tuple, int, float, Decimal, bytes, bytearray, memoryview, date, time),
        ):
            document = value
        else:
            raise InvalidTypeError(
                f"a {type(value).__name__} cannot be converted to {self.kind.value}"
            )
        if self.kind is TypeKind.OBJECT and not isinstance(document, Mapping):
            if isinstance(value, str):
                raise InvalidValueError("the JSON text is not an object")
            raise InvalidTypeError(f"a {type(value).__name__} cannot be converted to OBJECT")
        if self.kind is TypeKind.ARRAY and not isinstance(document, (list, tuple)):
            document = [document]
        data = to_canonical_json(document)
        if len(data) > MAX_SEMI_STRUCTURED_BYTES:
            raise InvalidValueError(
                f"the serialized value is {len(data)} bytes, at most "
                f"{MAX_SEMI_STRUCTURED_BYTES} allowed"
            )
        return data.decode()

    def _shape(self) -> str:
        return "object" if self.kind is TypeKind.OBJECT else "array"
