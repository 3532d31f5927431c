"""Every error the SDK raises, in one tree with one root.

    IngestError                      root; ``retriable`` tells the retry policy
    ├── ConfigurationError           a bad option (unknown time zone, bad limit)
    ├── SchemaError                  a column declaration that does not parse
    │   └── UnsupportedFeatureError  GEOGRAPHY/GEOMETRY, AUTOINCREMENT, DEFAULT, COLLATE
    ├── ValueConversionError         one value cannot become its column's type
    │   ├── InvalidTypeError         a Python type the column does not accept
    │   └── InvalidValueError        the right type but a bad value
    └── InsertValidationError        ON_ERROR=ABORT met a bad row

A conversion error is raised deep inside a value converter, which knows neither
the column nor the row. The row converter then *locates* it (``locate``), which
fills in the row, column, value and accepted forms, so the message a producer
reads names all four and the fix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from ingest_sdk.validation import InsertError

__all__ = [
    "ConfigurationError",
    "IngestError",
    "InsertValidationError",
    "InvalidTypeError",
    "InvalidValueError",
    "SchemaError",
    "UnsupportedFeatureError",
    "ValueConversionError",
]

#: How many characters of an offending value an error message repeats.
MAX_VALUE_REPR = 100


def describe_value(value: Any) -> str:
    """A short, safe rendering of a user value for error messages."""
    try:
        text = repr(value)
    except Exception:  # a user object whose __repr__ fails must not hide the error
        text = f"<{type(value).__name__} object>"
    if len(text) > MAX_VALUE_REPR:
        text = f"{text[:MAX_VALUE_REPR]}... ({len(text)} characters)"
    return text


class IngestError(Exception):
    """Root of every error this SDK raises."""

    #: Whether repeating the same call may succeed; read by the retry policy.
    retriable: ClassVar[bool] = False


class ConfigurationError(IngestError, ValueError):
    """An option given to the SDK is invalid."""


class SchemaError(IngestError, ValueError):
    """A column declaration or table schema is invalid."""


class UnsupportedFeatureError(SchemaError):
    """A column uses a feature that streaming ingest cannot honour."""


class ValueConversionError(IngestError, ValueError):
    """One value could not be converted to its column's type.

    Attributes:
        reason: what is wrong with the value, without location.
        row_index: index of the row in the batch, once located.
        column: the column name, once located.
        column_type: the declared column type, once located.
        value: the offending value, once located.
        accepted: the accepted input forms for the column, once located.
    """

    kind: ClassVar[str] = "conversion"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.row_index: int | None = None
        self.column: str | None = None
        self.column_type: str | None = None
        self.value: Any = None
        self.accepted: str | None = None

    def locate(
        self,
        *,
        row_index: int,
        column: str | None,
        column_type: str | None,
        value: Any,
        accepted: str | None,
    ) -> Self:
        """Attach where the error happened and rebuild the message."""
        self.row_index = row_index
        self.column = column
        self.column_type = column_type
        self.value = value
        self.accepted = accepted
        where = f"Row {row_index}"
        if column is not None:
            where += f', column "{column}" ({column_type})'
        elif column_type is not None:
            where += f" ({column_type})"
        message = f"{where}: {self.kind} error: {self.reason}; got {describe_value(value)}"
        if accepted:
            message += f". Fix: send {accepted}"
        self.args = (message,)
        return self


class InvalidTypeError(ValueConversionError):
    """The value's Python type is not accepted by the column type."""

    kind = "type"


class InvalidValueError(ValueConversionError):
    """The value has an accepted type but cannot be converted (bad text, too long, out of range)."""

    kind = "value"


class InsertValidationError(IngestError):
    """Raised under ON_ERROR=ABORT: a row failed validation and no row of the batch went in.

    Attributes:
        row_index: the first failing row.
        insert_error: the full description of that row's problems.
    """

    def __init__(self, insert_error: InsertError) -> None:
        super().__init__(f"Batch aborted (ON_ERROR=ABORT), no row inserted: {insert_error.message}")
        self.row_index = insert_error.row_index
        self.insert_error = insert_error
