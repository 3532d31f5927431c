"""Every error the SDK raises, in one tree with one root.

    IngestError                      root; ``retriable`` tells the retry policy
    ├── ConfigurationError           a bad option (unknown time zone, bad limit)
    ├── SchemaError                  a column declaration that does not parse
    │   └── UnsupportedFeatureError  GEOGRAPHY/GEOMETRY, AUTOINCREMENT, DEFAULT, COLLATE
    ├── ValueConversionError         one value cannot become its column's type
    │   ├── InvalidTypeError         a Python type the column does not accept
    │   └── InvalidValueError        the right type but a bad value
    ├── InsertValidationError        ON_ERROR=ABORT met a bad row
    ├── ChannelClosedError           the handle was closed by its owner
    ├── CommitTimeoutError           wait_for_commit ran out of time
    ├── MalformedRecordError         a change stream record not of the form of its kind
    ├── TransportError (retriable)   the server could not be reached
    │   └── ServiceUnreachableError  refused before the service ever answered (not retried)
    └── ServiceError                 the server answered with an error (status, code)
        ├── InvalidRequestError      400: a malformed request
        ├── AuthenticationError      401: missing or wrong token
        ├── TableNotFoundError       404
        ├── ChannelNotFoundError     404
        ├── TableAlreadyExistsError  409
        ├── ChannelInvalidatedError  409: a newer open or a server restart replaced this handle
        ├── BackpressureError        429 (retriable): the server buffer is full
        └── ServerError              5xx (retriable)

``SchemaError`` and ``UnsupportedFeatureError`` also travel from the server
(status 400). :data:`ERRORS_BY_CODE` is the one table that maps the wire code
of an error to its class, for the server (raise) and the SDK (re-raise).

A conversion error is raised deep inside a value converter, which knows neither
the column nor the row. The row converter then *locates* it (``locate``), which
fills in the row, column, value and accepted forms, so the message a producer
reads names all four and the fix.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Self

if TYPE_CHECKING:
    from ingest_sdk.validation import InsertError

__all__ = [
    "ERRORS_BY_CODE",
    "AuthenticationError",
    "BackpressureError",
    "ChangeStreamNotFoundError",
    "ChannelClosedError",
    "ChannelInvalidatedError",
    "ChannelNotFoundError",
    "CommitTimeoutError",
    "ConfigurationError",
    "IngestError",
    "InsertValidationError",
    "InvalidRequestError",
    "InvalidTypeError",
    "InvalidValueError",
    "MalformedRecordError",
    "SchemaError",
    "ServerError",
    "ServiceError",
    "SqlStatementError",
    "TableAlreadyExistsError",
    "TableBusyError",
    "TableNotFoundError",
    "TransportError",
    "UnsupportedFeatureError",
    "ValueConversionError",
]

#: How many characters of an offending value an error message repeats.
MAX_VALUE_REPR = 100


def describe_value(value: Any) -> str:
    """A short, safe rendering of a user value for error messages."""
    try:
        # A Decimal is a number the producer wrote (JSON rows parse long numbers to
        # Decimal): echo it as written, not as Python's Decimal('...').
        text = str(value) if isinstance(value, Decimal) else repr(value)
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


class ChannelClosedError(IngestError):
    """The channel handle was closed; open the channel again to insert."""


class CommitTimeoutError(IngestError, TimeoutError):
    """``wait_for_commit`` ran out of time; the rows may still commit later."""


class MalformedRecordError(IngestError, ValueError):
    """A change stream record lacks a field of its kind or holds one not of its form
    (:mod:`ingest_sdk.change_records`). Not retriable: the same read returns it again."""


class TransportError(IngestError):
    """The server could not be reached or the connection broke mid-request."""

    retriable = True


class ServiceUnreachableError(TransportError):
    """The connection was refused before the service ever answered this client: nothing
    listens at the URL (a wrong port, a service not started). Not retried: waiting out
    the retry deadline would only hide the mistake. Once the service has answered, a
    refused connection is a restart and is retried (:class:`TransportError`)."""

    retriable = False


class ServiceError(IngestError):
    """The server answered with an error.

    Attributes:
        status: the HTTP status.
        code: the wire code (a key of :data:`ERRORS_BY_CODE`).
        details: extra fields the server sent (e.g. ``retry_after``).
    """

    status: ClassVar[int] = 400
    code: ClassVar[str] = "BAD_REQUEST"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


class InvalidRequestError(ServiceError):
    """The request was malformed; repeating it will not help."""


class AuthenticationError(ServiceError):
    status, code = 401, "UNAUTHENTICATED"


class TableNotFoundError(ServiceError):
    status, code = 404, "TABLE_NOT_FOUND"


class ChangeStreamNotFoundError(ServiceError):
    """No change stream of that name (a read of ``GET /v1/change-streams/{name}/read``)."""

    status, code = 404, "CHANGE_STREAM_NOT_FOUND"


class ChannelNotFoundError(ServiceError):
    status, code = 404, "CHANNEL_NOT_FOUND"


class TableAlreadyExistsError(ServiceError):
    status, code = 409, "TABLE_EXISTS"


class TableBusyError(ServiceError):
    """A pending multi-table pipeline commit writes the table: it cannot be dropped until
    that commit ends (moments, or at the next recovery if its owner died)."""

    status, code = 409, "TABLE_BUSY"


class ChannelInvalidatedError(ServiceError):
    """A newer open of the channel, a drop, or a server restart replaced this handle.

    Rows this handle had sent but that were not committed are discarded. Reopen
    the channel and resume after ``get_latest_committed_offset_token()``.
    """

    status, code = 409, "CHANNEL_INVALIDATED"


class BackpressureError(ServiceError):
    """The server's buffer is full; the SDK waits ``retry_after`` seconds and retries."""

    status, code = 429, "BACKPRESSURE"
    retriable = True


class ServerError(ServiceError):
    """The server failed; the request is safe to repeat (every data call is idempotent)."""

    status, code = 500, "INTERNAL"
    retriable = True


class SqlStatementError(ServiceError):
    """A SQL statement sent to ``POST /v1/sql`` failed; nothing was changed.

    ``details["sql_code"]`` is the statement's own code (``OBJECT_NOT_FOUND``,
    ``STREAM_STALE``, ``STREAM_CONSUMED_CONCURRENTLY``, ``STATEMENT_TIMEOUT``...).
    """

    code = "SQL_ERROR"

    @property
    def sql_code(self) -> str:
        return str(self.details.get("sql_code", "SQL_ERROR"))


class _RemoteSchemaError(ServiceError, SchemaError):
    code = "SCHEMA_ERROR"


class _RemoteUnsupportedFeatureError(ServiceError, UnsupportedFeatureError):
    code = "UNSUPPORTED_FEATURE"


#: Wire code -> error class; the server sends the code, the SDK raises the class.
ERRORS_BY_CODE: dict[str, type[ServiceError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        AuthenticationError,
        TableNotFoundError,
        ChannelNotFoundError,
        ChangeStreamNotFoundError,
        TableAlreadyExistsError,
        TableBusyError,
        ChannelInvalidatedError,
        BackpressureError,
        ServerError,
        _RemoteSchemaError,
        _RemoteUnsupportedFeatureError,
        SqlStatementError,
    )
}


def error_code_of(exc: BaseException) -> tuple[int, str]:
    """The (HTTP status, wire code) the server answers for an exception."""
    if isinstance(exc, ServiceError):
        return exc.status, exc.code
    if isinstance(exc, UnsupportedFeatureError):
        return 400, "UNSUPPORTED_FEATURE"
    if isinstance(
        exc, (SchemaError, ValueConversionError, InsertValidationError, ConfigurationError)
    ):
        return 400, "SCHEMA_ERROR" if isinstance(exc, SchemaError) else "BAD_REQUEST"
    return 500, "INTERNAL"
