"""Errors of the pipeline layer: each names the cause and what to do, never a traceback.

``code`` is stable (the HTTP face answers it); the message is for people.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

__all__ = [
    "InvalidOptionError",
    "ObjectNotFoundError",
    "SqlError",
    "StreamConflictError",
    "StreamStaleError",
    "TransactionConflictError",
    "UnsupportedStatementError",
    "evaluation_errors",
]


class SqlError(Exception):
    """A statement could not run; nothing was changed.

    Attributes:
        code: a stable error code, e.g. ``SQL_COMPILATION_ERROR``.
    """

    code = "SQL_ERROR"

    def __init__(self, message: str, code: str | None = None) -> None:
        if code == "SQL_COMPILATION_ERROR" and not message.startswith("SQL compilation error"):
            message = f"SQL compilation error: {message}"
        super().__init__(message)
        if code is not None:
            self.code = code


class UnsupportedStatementError(SqlError):
    """The statement is not one this system runs."""

    code = "UNSUPPORTED_STATEMENT"


class ObjectNotFoundError(SqlError):
    """A table, stream or schema named by the statement does not exist."""

    code = "OBJECT_NOT_FOUND"


class StreamStaleError(SqlError):
    """The stream's offset is outside the table's retained history."""

    code = "STREAM_STALE"


class StreamConflictError(SqlError):
    """Another transaction consumed the stream first; this one changed nothing."""

    code = "STREAM_CONSUMED_CONCURRENTLY"


class TransactionConflictError(SqlError):
    """Another writer changed the rows this transaction changes; it changed nothing."""

    code = "TRANSACTION_CONFLICT"


class InvalidOptionError(SqlError):
    """A Spark data source option is unknown, missing or out of range."""

    code = "INVALID_OPTION"


@contextlib.contextmanager
def spark_errors(code: str) -> Iterator[None]:
    """Spark's errors (``PySparkException``) inside the block as :class:`SqlError` with
    ``code`` and the first line of Spark's message."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JJavaError) as exc:
        message = _spark_message(exc)
        if code == "SQL_EXECUTION_ERROR":
            message = f"SQL execution error: {message}"
        raise SqlError(message, code) from None  # a compilation error gets its prefix there


def _spark_message(exc: Exception) -> str:
    """The first line of Spark's message, without Java class names: for a Java error that
    PySpark did not translate, the message of its innermost cause."""
    text = str(exc)
    java = getattr(exc, "java_exception", None)
    if java is not None and not hasattr(exc, "getErrorClass"):
        try:
            cause = java
            while cause.getCause() is not None:
                cause = cause.getCause()
            text = str(cause.getMessage() or "the Spark job failed")
        except Exception:  # the JVM is gone: its message cannot be asked for
            text = "the Spark job failed"
    first = (text.strip().splitlines() or ["the Spark job failed"])[0]
    return _JAVA_CLASS.sub("", first)[:500]


_JAVA_CLASS = re.compile(
    r"`?\b(?:org|java|javax|scala|py4j|com|io|net)(?:\.[A-Za-z_$][\w$]*)+`?(?::\s*)?"
)


def evaluation_errors() -> contextlib.AbstractContextManager[None]:
    """Spark's errors while it evaluates a query's DataFrame (a division by zero, a
    failed cast) as :class:`SqlError` ``SQL_EXECUTION_ERROR``: ``Session.sql`` returns
    queries unevaluated, so the faces that evaluate them (HTTP, CLI) wrap the action."""
    return spark_errors("SQL_EXECUTION_ERROR")
