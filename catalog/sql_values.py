"""Values one of the catalog's databases cannot take, given one meaning on both.

PostgreSQL's TEXT cannot hold a NUL character (U+0000); SQLite's can. SQLite refuses an
integer past 64 bits (OverflowError); PostgreSQL compares it as a numeric and finds
nothing. Every statement :class:`catalog.sqlite.SqlCatalog` runs passes its arguments
through :func:`checked` (:class:`CheckedConnection`), so both catalogs answer alike,
whichever operation carries the value:

- a statement that stores (``INSERT``, ``UPDATE``) text holding a NUL or an integer past
  64 bits is refused with :class:`catalog.base.UnstorableValueError` and writes nothing:
  no name, comment or query text the catalog keeps holds a NUL;
- a lookup (``SELECT``) or a ``DELETE`` compares such a value as NULL, which equals
  nothing stored: a name holding a NUL, or an id past 64 bits, is not found.

Text that reports what went wrong (a refresh's error quoting a value, the reason a
dynamic table was suspended, a compaction's error) is kept rather than refused:
:func:`printable` replaces each NUL by U+FFFD before it is stored, so a failure is always
recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from catalog.base import UnstorableValueError
from ingest_sdk.errors import describe_value

__all__ = ["REPORT_COLUMNS", "CheckedConnection", "checked", "printable", "printable_reports"]

NUL = "\x00"
#: The integers both databases store: 64-bit, signed.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: What a NUL becomes in reports (:func:`printable`): Unicode's replacement character.
REPLACEMENT = "\ufffd"
#: The columns of reports, whose text is kept with its NULs replaced, never refused.
REPORT_COLUMNS = frozenset({"error", "reason", "state_reason"})
#: How the statements that only find (and may delete) rows begin.
_LOOKUPS = ("SELECT", "DELETE")


def _unstorable(value: Any) -> bool:
    if isinstance(value, str):
        return NUL in value
    return isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX


def _refusal(value: Any) -> str:
    if isinstance(value, int):
        return (
            f"the integer {value} cannot be stored in the catalog: it is past 64 bits "
            f"({INT64_MIN} to {INT64_MAX})"
        )
    return (
        f"text holding a NUL character (U+0000) cannot be stored in the catalog: "
        f"{describe_value(value)}; remove the character (a SQL string literal may write "
        "it as the escape \\u0000)"
    )


def checked(sql: str, args: Sequence[Any]) -> Sequence[Any]:
    """A statement's arguments as both databases can take them: unchanged, or, for a
    lookup, each unstorable one as NULL (it equals nothing stored).

    Raises:
        UnstorableValueError: a statement that stores rows carries text holding a NUL,
            or an integer past 64 bits.
    """
    if not any(_unstorable(value) for value in args):
        return args
    if sql.lstrip()[:6].upper() in _LOOKUPS:
        return [None if _unstorable(value) else value for value in args]
    raise UnstorableValueError(_refusal(next(value for value in args if _unstorable(value))))


def printable(text: Any) -> Any:
    """Report text as the catalog keeps it: each NUL replaced by U+FFFD."""
    return text.replace(NUL, REPLACEMENT) if isinstance(text, str) else text


def printable_reports(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (columns to store) with the text of :data:`REPORT_COLUMNS` printable."""
    return {key: printable(v) if key in REPORT_COLUMNS else v for key, v in values.items()}


class CheckedConnection:
    """The part of a connection the catalog uses, each statement's arguments
    :func:`checked` before the database sees them."""

    def __init__(self, db: Any) -> None:
        self._db = db

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self._db.execute(sql, checked(sql, args))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        return self._db.executemany(sql, [checked(sql, row) for row in rows])
