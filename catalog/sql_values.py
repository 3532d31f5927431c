"""Values SQLite stores and PostgreSQL cannot, given one meaning on both catalogs.

PostgreSQL's TEXT cannot hold a NUL character (U+0000); SQLite's can. Every statement
:class:`catalog.sqlite.SqlCatalog` runs passes its arguments through :func:`checked`
(:class:`CheckedConnection`), so both catalogs answer alike, whichever operation carries
the value:

- a statement that stores (``INSERT``, ``UPDATE``) text holding a NUL is refused with
  :class:`catalog.base.UnstorableValueError` and writes nothing: no name, comment or query
  text the catalog keeps holds one;
- a lookup (``SELECT``) or a ``DELETE`` compares such text as NULL, which equals nothing
  stored: a name holding a NUL is not found, as on SQLite.

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
#: What a NUL becomes in reports (:func:`printable`): Unicode's replacement character.
REPLACEMENT = "\ufffd"
#: The columns of reports, whose text is kept with its NULs replaced, never refused.
REPORT_COLUMNS = frozenset({"error", "reason", "state_reason"})
#: How the statements that only find (and may delete) rows begin.
_LOOKUPS = ("SELECT", "DELETE")


def _unstorable(value: Any) -> bool:
    return isinstance(value, str) and NUL in value


def checked(sql: str, args: Sequence[Any]) -> Sequence[Any]:
    """A statement's arguments as both databases can take them: unchanged, or, for a
    lookup, each unstorable one as NULL (it equals nothing stored).

    Raises:
        UnstorableValueError: a statement that stores rows carries text holding a NUL.
    """
    if not any(_unstorable(value) for value in args):
        return args
    if sql.lstrip()[:6].upper() in _LOOKUPS:
        return [None if _unstorable(value) else value for value in args]
    found = next(value for value in args if _unstorable(value))
    raise UnstorableValueError(
        f"text holding a NUL character (U+0000) cannot be stored in the catalog: "
        f"{describe_value(found)}; remove the character (a SQL string literal may write "
        "it as the escape \\u0000)"
    )


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
