"""Pieces every statement handler shares: the status row, LIKE patterns, string literals,
times, column definitions and name checks, so each handler module answers alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from catalog import TableInfo, did_you_mean, full_name
from flush import purge_dropped
from flush.spark_tables import rows_frame
from ingest_sdk import TableSchema
from ingest_sdk.errors import SchemaError
from ingest_sdk.schema import check_not_reserved, check_object_name, quote_identifier
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.statements import split_name
from pipelines.transactions.commit import when_free

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.sql.statements import Statement

T = TypeVar("T")

#: The columns DESCRIBE answers for a table, a view and a dynamic table (a table adds
#: `primary key`).
DESCRIBE_COLUMNS = "name STRING, type STRING, kind STRING, null STRING"

__all__ = [
    "DESCRIBE_COLUMNS",
    "check_name_free",
    "check_parts",
    "drop_named",
    "drop_table_info",
    "in_scope",
    "like",
    "literal",
    "reserved",
    "split_columns",
    "status_frame",
    "table_schema",
    "utc",
]


def status_frame(session: StatementContext, message: str) -> DataFrame:
    """The one-row answer of a statement that returns no rows (Snowflake's `status`)."""
    return rows_frame(session.spark, [(message,)], "status STRING")


def drop_table_info(session: StatementContext, info: TableInfo) -> None:
    """Drop a table: its catalog entry, then its folder unless a change stream keeps it
    (its streams become stale); once no pending commit writes it (see
    :func:`pipelines.transactions.commit.when_free`). Named as ``info`` names it (a table
    moved aside under another name is dropped under its own)."""
    when_free(session.catalog, lambda: session.catalog.drop_table(info.id, info.name), [info.id])
    purge_dropped(session.catalog, session.warehouse)


def drop_named(
    session: StatementContext,
    statement: Statement,
    what: str,
    find: Callable[[str, str, str], T | None],
    drop: Callable[[T], object],
) -> DataFrame:
    """``DROP <what> [IF EXISTS] name`` of a catalog object found by ``find`` (the
    reference system's answers: dropped, did not exist, or does not exist)."""
    database, schema_name, name = session.qualify(statement.parts["name"] or "")
    found = find(database, schema_name, name)
    if found is None:
        if statement.parts["if_exists"]:
            return status_frame(
                session, f"Drop statement executed successfully ({what} did not exist)."
            )
        raise ObjectNotFoundError(
            f"{what} {full_name(database, schema_name, name)} does not exist"
            + did_you_mean(session.catalog, database, schema_name, name, [what])
        )
    drop(found)
    return status_frame(session, f"{name} successfully dropped.")


def literal(text: str | None) -> str:
    """The value of a ``'...'`` literal as a header captured it (``''`` is one quote)."""
    return "" if text is None else text[1:-1].replace("''", "'")


def like(pattern: str | None) -> Callable[[str], bool]:
    """A name filter for ``LIKE '<pattern>'`` (``%`` any run, ``_`` one character, case
    ignored as the reference system does); everything passes without a pattern."""
    if pattern is None:
        return lambda name: True
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c)
                    for c in literal(pattern))  # fmt: skip
    compiled = re.compile(regex, re.I | re.S)
    return lambda name: compiled.fullmatch(name) is not None


def in_scope(session: StatementContext, statement: Statement) -> Callable[[str, str], bool]:
    """A (database, schema) filter for SHOW's ``IN ACCOUNT | IN DATABASE [db] | IN [SCHEMA]
    [[db.]schema]`` (a missing name is the session's current one; Snowflake's SCHEMA
    keyword is optional before a name). Without IN, or with IN ACCOUNT, everything
    passes: SHOW lists the whole warehouse.

    Raises:
        SqlError: a name of more parts than the scope has.
        ObjectNotFoundError: the database or schema does not exist.
    """
    scope = (statement.parts.get("scope") or "").upper()
    name = statement.parts.get("scope_name")
    if not scope and statement.parts.get("schema_name"):
        scope, name = "SCHEMA", statement.parts["schema_name"]
    if not scope:
        return lambda database, schema: True
    if scope == "DATABASE":
        database = check_parts(name, ("database",))[0] if name else session.database
        if session.catalog.get_database(database) is None:
            raise ObjectNotFoundError(f"database {quote_identifier(database)} does not exist")
        return lambda d, s: d == database
    parts = check_parts(name, ("database", "schema")) if name else [session.schema]
    database, schema = (parts if len(parts) == 2 else [session.database, parts[0]])
    if session.catalog.get_schema(database, schema) is None:
        shown = ".".join(quote_identifier(p) for p in (database, schema))
        raise ObjectNotFoundError(f"schema {shown} does not exist")
    return lambda d, s: (d, s) == (database, schema)


def utc(seconds: float) -> datetime:
    """A catalog time (seconds since the epoch) as the naive UTC time SHOW answers."""
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None)


def new_table_name(session: StatementContext, parts: dict[str, str | None]) -> tuple[str, str, str]:
    """The ``DB.SCHEMA.NAME`` a CREATE TABLE names, checked by the name rules, and no
    stream of that name (OR REPLACE and IF NOT EXISTS together refused).

    Raises:
        SqlError: a refused name or option pair, or a stream already has the name.
    """
    database, schema_name, name = session.qualify(parts["name"] or "")
    for part, what in ((database, "database"), (schema_name, "schema"), (name, "table")):
        check_object_name(part, f"the {what} name")
    if parts["replace"] and parts["if_not_exists"]:
        raise SqlError(
            "OR REPLACE and IF NOT EXISTS cannot be used together", "SQL_COMPILATION_ERROR"
        )
    check_name_free(session, (database, schema_name, name), "table")
    return database, schema_name, name


def reserved(schema: str) -> None:
    """Refuse an object of one's own in the reserved INFORMATION_SCHEMA.

    Raises:
        SqlError: SQL_COMPILATION_ERROR, naming the schema and what to do.
    """
    try:
        check_not_reserved(schema)
    except SchemaError as exc:
        raise SqlError(str(exc), "SQL_COMPILATION_ERROR") from None


def check_name_free(session: StatementContext, key: tuple[str, str, str], kind: str) -> None:
    """Tables, streams and views share one namespace per schema: refuse a ``kind``
    (table, stream or view) named like an object of another kind.

    Raises:
        SqlError: OBJECT_ALREADY_EXISTS, naming the object in the way.
    """
    reserved(key[1])
    finders = {"table": session.find_table, "stream": session.catalog.get_stream,
               "view": session.catalog.get_view}  # fmt: skip
    for other, find in finders.items():
        if other != kind and find(*key) is not None:
            raise SqlError(f"a {other} named {full_name(*key)} exists; a {kind} needs a name "
                           f"no {other} has", "OBJECT_ALREADY_EXISTS")  # fmt: skip


def check_parts(name: str, whats: tuple[str, ...]) -> list[str]:
    """The stored parts of a dotted ``name`` for an object named by exactly
    ``len(whats)`` parts (``("database", "schema")``), each checked by the name rules.

    Raises:
        SqlError: more parts than the object has, or a part the name rules refuse.
    """
    parts = split_name(name)
    if not parts or len(parts) > len(whats):
        raise SqlError(
            f"invalid {whats[-1]} name {name[:80]!r}: write "
            f"{'.'.join(w.upper() for w in whats)} (at most {len(whats)} "
            "part(s), quoted parts in double quotes)",
            "SQL_COMPILATION_ERROR",
        )
    for part, what in zip(parts, whats[len(whats) - len(parts) :], strict=True):
        check_object_name(part, f"the {what} name")
    return parts


def split_columns(text: str) -> list[str]:
    """Column definitions at the top level of ``(...)`` (commas inside parentheses or
    quotes stay)."""
    parts: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(char)
    parts.append("".join(current).strip())
    return parts


#: One column definition: a name, then (for CREATE TABLE) its declaration.
COLUMN_DEFINITION = re.compile(r'("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\s+(.+))?', re.S)


#: A table constraint naming the primary key: ``[CONSTRAINT name] PRIMARY KEY (a, b)``.
PRIMARY_KEY_CONSTRAINT = re.compile(
    r'(?:CONSTRAINT\s+(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s+)?'
    r"PRIMARY\s+KEY\s*\((?P<columns>[^()]*)\)",
    re.S | re.I,
)
#: A column declaration ending in ``PRIMARY KEY``: the column alone is the key.
_COLUMN_KEY = re.compile(r"(?P<declaration>.*?)\s+PRIMARY\s+KEY", re.S | re.I)
#: Column types that cannot be a key: their values have no order.
_UNKEYED_TYPES = ("VARIANT", "OBJECT", "ARRAY")


def table_schema(text: str) -> TableSchema:
    """The schema of ``CREATE TABLE t (<text>)`` (see :func:`table_definition`)."""
    return table_definition(text)[0]


def table_definition(text: str) -> tuple[TableSchema, tuple[str, ...]]:
    """The schema and the declared primary key of ``CREATE TABLE t (<text>)``.

    The key is a table constraint, ``PRIMARY KEY (a, b)``, or ``PRIMARY KEY`` after one
    column's type; its columns become NOT NULL. It is not enforced (ingest and DML
    accept two rows with one key).

    Raises:
        SqlError: a definition cannot be read, a column is declared twice, or the key
            is declared twice, names a column that is not there, or one it cannot hold.
        SchemaError: a declaration is invalid (the session answers it as a SqlError).
    """
    declarations: dict[str, str] = {}
    names: dict[str, str] = {}  # stored name -> as written
    key: list[str] | None = None
    for definition in split_columns(text):
        constraint = PRIMARY_KEY_CONSTRAINT.fullmatch(definition)
        if constraint is not None:
            columns = [c.strip() for c in constraint.group("columns").split(",")]
            key = _one_key(key, [split_name(c)[0] if c else "" for c in columns])
            continue
        match = COLUMN_DEFINITION.fullmatch(definition)
        if match is not None and match.group(2) is not None:
            column_key = _COLUMN_KEY.fullmatch(match.group(2))
            if column_key is not None:
                key = _one_key(key, [split_name(match.group(1))[0]])
                match = COLUMN_DEFINITION.fullmatch(
                    f"{match.group(1)} {column_key.group('declaration')}"
                )
        if match is None or match.group(2) is None:
            raise SqlError(
                f"cannot read the column definition {definition[:80]!r}; write NAME TYPE "
                "[NOT NULL], e.g. ID NUMBER(38,0) NOT NULL",
                "SQL_COMPILATION_ERROR",
            )
        name = split_name(match.group(1))[0]
        if name in names:
            raise SqlError(f"the column {name} is declared twice", "SQL_COMPILATION_ERROR")
        names[name] = match.group(1)
        declarations[match.group(1)] = match.group(2)
    for column in key or ():
        if column not in names:
            raise SqlError(
                f"the primary key names the column {quote_identifier(column)}, which the "
                f"table does not declare (its columns: "
                f"{', '.join(map(quote_identifier, names)) or 'none'})",
                "SQL_COMPILATION_ERROR",
            )
        declaration = declarations[names[column]]
        if declaration.split("(")[0].strip().upper() in _UNKEYED_TYPES:
            raise SqlError(
                f"the primary key column {quote_identifier(column)} is {declaration}, "
                "whose values have no order; key on columns of other types",
                "SQL_COMPILATION_ERROR",
            )
        if not re.search(r"\bNOT\s+NULL\b", declaration, re.I):
            declarations[names[column]] = f"{declaration} NOT NULL"
    return TableSchema.parse(declarations), tuple(key or ())


def _one_key(found: list[str] | None, columns: list[str]) -> list[str]:
    """The key's columns, checked: declared once, no empty or repeated column."""
    if found is not None:
        raise SqlError(
            "the primary key is declared twice; declare it once, as PRIMARY KEY (a, b) or "
            "after one column's type",
            "SQL_COMPILATION_ERROR",
        )
    if "" in columns or len(set(columns)) != len(columns):
        raise SqlError(
            "PRIMARY KEY (...) needs a list of distinct column names, e.g. PRIMARY KEY (ID)",
            "SQL_COMPILATION_ERROR",
        )
    return columns
