"""What a change stream watches: ``FOR ALL``, or tables, each whole or with a column list.

Spanner's form: ``FOR Accounts(Balance, Owner), Orders`` watches the two columns of
``Accounts`` (and its keys, which every stream tracks) and the whole of ``Orders``;
``FOR Accounts()`` watches its keys only, so only inserts and deletes. The list is
checked here, at the door, before anything changes: a column the table does not have
(with the names close to it), a key column (Spanner refuses them: every record's
``keys`` carry them), the hidden row id (it is the key of a table without a primary
key) and a column listed twice are refused by name.

A table's columns never change in place here (there is no ``ALTER TABLE ... DROP
COLUMN``; ``CREATE OR REPLACE TABLE`` makes a new table, which the stream, as for a
dropped one, stops watching), so a listed column cannot disappear under a stream. Should
one be missing all the same, reads skip it: the stream stops watching it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from catalog import ChangeStreamRecord, TableInfo, did_you_mean, full_name
from catalog.suggest import close_names
from flush.tables import ROW_ID_COLUMN
from ingest_sdk.schema import quote_identifier
from pipelines.change_streams.records import ROW_ID_KEY
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.statements import NAME, split_name

if TYPE_CHECKING:
    from pipelines.sql.context import StatementContext

__all__ = ["Watched", "read_watched", "watched_text"]

#: One watched table of a FOR clause, with its column list if it has one (read name by
#: name, as the header did: a quoted name may hold a parenthesis or a comma).
_ITEM = re.compile(
    rf"(?P<table>{NAME})(?:\s*\((?P<columns>(?:\s*{NAME}(?:\s*,\s*{NAME})*)?)\s*\))?"
)
#: One name of a column list (the header admits one-part names only there).
_COLUMN = re.compile(NAME)
#: How many of a table's columns an unknown column's error lists.
_LISTED = 12


@dataclass(frozen=True, slots=True)
class Watched:
    """A FOR clause read: ``FOR ALL``, or table ids with the column lists of some."""

    for_all: bool
    table_ids: tuple[int, ...]
    column_lists: tuple[tuple[int, tuple[str, ...]], ...]


def _compile_error(message: str) -> SqlError:
    return SqlError(message, "SQL_COMPILATION_ERROR")


def _columns(table: TableInfo, text: str) -> tuple[str, ...]:
    """The column names of a list (``a, "b"``: unquoted names upper-cased), checked."""
    written = [found.group(0) for found in _COLUMN.finditer(text)]  # '"a,b"' is one
    names = [split_name(part)[0] for part in written]
    known, keys = table.schema.names, table.primary_key
    seen: set[str] = set()
    for shown, name in zip(written, names, strict=True):
        where = f"the column list of {table.full_name}"
        if name in (ROW_ID_COLUMN, ROW_ID_KEY):
            raise _compile_error(
                f"{shown[:80]} in {where} is the hidden row id: it is the key of a table "
                f"without a primary key, which every record's keys carry ({ROW_ID_KEY}); list "
                "only the columns to watch besides the key"
            )
        if name in keys:
            raise _compile_error(
                f"{quote_identifier(name)} in {where} is a primary key column: every record's "
                "keys carry the key columns, so a column list names only other columns (as in "
                f"Spanner); write {table.full_name}() to watch the keys only"
            )
        if name not in known:
            close = close_names(name, known)
            hint = f" (did you mean {' or '.join(map(quote_identifier, close))}?)" if close else ""
            more = ", ..." if len(known) > _LISTED else ""
            raise _compile_error(
                f"column {shown[:80]} in {where} does not exist{hint}; its columns are "
                f"{', '.join(map(quote_identifier, known[:_LISTED]))}{more}"
            )
        if name in seen:
            raise _compile_error(f"the column {quote_identifier(name)} is listed twice in {where}")
        seen.add(name)
    return tuple(names)


def read_watched(session: StatementContext, target: str | None) -> Watched:
    """A FOR clause's tables and column lists, checked (``None``: no FOR, nothing).

    Raises:
        ObjectNotFoundError: a table that does not exist (or a view).
        SqlError: a table listed twice, or a column list :func:`_columns` refuses.
    """
    if target is None:
        return Watched(False, (), ())
    if target.strip().upper() == "ALL":
        return Watched(True, (), ())
    ids: list[int] = []
    lists: list[tuple[int, tuple[str, ...]]] = []
    for match in _ITEM.finditer(target):
        if match.group("table").upper() == "ALL":  # unquoted: the keyword, misplaced
            raise _compile_error(
                "FOR ALL watches every column of every table: it takes no "
                "column list and no other table; write FOR ALL alone, or "
                'list the tables (a table named ALL is written "ALL")'
            )
        database, schema_name, name = session.qualify(match.group("table"))
        info = session.find_table(database, schema_name, name)
        if info is None:
            kind = "a view" if session.catalog.get_view(database, schema_name, name) else "no table"
            hint = did_you_mean(session.catalog, database, schema_name, name, ["table"])
            raise ObjectNotFoundError(f"table {full_name(database, schema_name, name)} does not "
                                      f"exist{hint} ({kind}); a change stream watches tables "
                                      "and dynamic tables")  # fmt: skip
        if info.id in ids:
            raise _compile_error(f"the table {info.full_name} is listed twice")
        ids.append(info.id)
        if match.group("columns") is not None:
            lists.append((info.id, _columns(info, match.group("columns"))))
    return Watched(False, tuple(ids), tuple(lists))


def watched_text(stream: ChangeStreamRecord, tables: dict[int, str]) -> str:
    """What ``stream`` watches as SHOW CHANGE STREAMS writes it: ``ALL``, or its tables'
    full names (those that exist), each with its column list if it has one."""
    if stream.for_all:
        return "ALL"
    shown = []
    for table_id in stream.table_ids:
        if table_id not in tables:
            continue
        columns = stream.watched_columns(table_id)
        listed = "" if columns is None else f"({', '.join(map(quote_identifier, columns))})"
        shown.append(tables[table_id] + listed)
    return ", ".join(shown)
