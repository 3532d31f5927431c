"""Databases, schemas and columns: CREATE/DROP DATABASE|SCHEMA, SHOW DATABASES|SCHEMAS,
SHOW COLUMNS.

Databases and schemas are catalog objects, and they are also implied: a table or
stream names its database and schema, which exist while it does (warehouses made before
databases were objects keep theirs), and ``CREATE TABLE`` or ``CREATE STREAM`` in a
schema nobody created creates it, as it always did. ``USE`` does not check that what it
names exists (the session's defaults, ``DB.PUBLIC``, exist only once something is made
there).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from catalog import ObjectNotEmptyError
from flush import purge_dropped
from flush.spark_tables import rows_frame
from flush.table_locks import table_lock
from ingest_sdk.column_types import ColumnType, TypeKind
from ingest_sdk.schema import quote_identifier
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.ddl_common import check_parts, like, status_frame, utc
from pipelines.sql.statements import INFORMATION_SCHEMA
from pipelines.transactions.commit import when_free

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.sql.statements import Statement

__all__ = [
    "create_database",
    "data_type_json",
    "drop_database",
    "show_columns",
    "show_databases",
    "show_schemas",
]

#: The schema every new database gets, as in the reference system.
PUBLIC = "PUBLIC"


def _database_and_schema(session: StatementContext, statement: Statement) -> tuple[str, str | None]:
    """``(database, schema)`` a CREATE/DROP names; ``schema`` None for a database."""
    name = statement.parts["name"] or ""
    if (statement.parts["what"] or "").upper() == "DATABASE":
        return check_parts(name, ("database",))[0], None
    parts = check_parts(name, ("database", "schema"))
    return (session.database if len(parts) == 1 else parts[0]), parts[-1]


def _shown(database: str, schema: str | None) -> str:
    """``DB`` or ``DB.SCHEMA``, parts quoted where needed, as messages name them."""
    return ".".join(quote_identifier(p) for p in (database, schema) if p is not None)


def create_database(session: StatementContext, statement: Statement) -> DataFrame:
    """``CREATE DATABASE|SCHEMA [IF NOT EXISTS] x``. As in the reference system a new
    database gets the schema PUBLIC, and the session then uses what was created (``USE``);
    an existing one is an error, or with IF NOT EXISTS changes nothing."""
    what = (statement.parts["what"] or "").upper()
    if statement.parts["replace"]:
        raise SqlError(
            f"CREATE OR REPLACE {what} is not supported: it would drop everything in the "
            f"{what.lower()}. Write DROP {what} ... CASCADE, then CREATE {what}",
            "SQL_COMPILATION_ERROR",
        )
    database, schema = _database_and_schema(session, statement)
    if schema == INFORMATION_SCHEMA:
        raise SqlError(f"the schema name {INFORMATION_SCHEMA} is reserved: every database's "
                       f"{INFORMATION_SCHEMA} holds the views that describe it; choose "
                       "another name", "SQL_COMPILATION_ERROR")  # fmt: skip
    catalog = session.catalog
    if schema is None:
        _, created = catalog.create_database(database)
        if created:
            catalog.create_schema(database, PUBLIC)
            session.database, session.schema = database, PUBLIC
    else:
        _, created = catalog.create_schema(database, schema)
        if created:
            session.database, session.schema = database, schema
    # Success names the object as the reference system does: its own name, unqualified.
    own = quote_identifier(schema if schema is not None else database)
    if not created:
        if statement.parts["if_not_exists"]:
            return status_frame(session, f"{own} already exists, statement succeeded.")
        raise SqlError(
            f"{what.lower()} {_shown(database, schema)} already exists; write CREATE {what} "
            "IF NOT EXISTS to keep it",
            "OBJECT_ALREADY_EXISTS",
        )
    return status_frame(session, f"{what.capitalize()} {own} successfully created.")


def _drop(session: StatementContext, database: str, schema: str | None, cascade: bool) -> Any:
    catalog = session.catalog
    if schema is None:
        return when_free(catalog, lambda: catalog.drop_database(database, cascade=cascade))
    return when_free(catalog, lambda: catalog.drop_schema(database, schema, cascade))


def _dynamic_table_locks(
    session: StatementContext, database: str, schema: str | None
) -> contextlib.ExitStack:
    """The table locks of the dynamic tables a CASCADE drops, as DROP DYNAMIC TABLE takes
    one: a refresh committing meanwhile finishes first, and one starting later finds its
    table gone instead of staging files into the dropped folder."""
    dynamic = {dt.table_id for dt in session.catalog.list_dynamic_tables()}
    uris = sorted(t.uri for t in session.catalog.list_tables() if t.id in dynamic
                  and t.database == database and schema in (None, t.schema_name))  # fmt: skip
    stack = contextlib.ExitStack()
    for uri in uris:  # in one order, so two drops never wait for each other
        with contextlib.suppress(FileNotFoundError):  # dropped meanwhile
            stack.enter_context(table_lock(uri))
    return stack


def drop_database(session: StatementContext, statement: Statement) -> DataFrame:
    """``DROP DATABASE|SCHEMA [IF EXISTS] x [CASCADE | RESTRICT]``: RESTRICT (the default)
    refuses one that holds tables or streams, naming them; CASCADE drops them too (each
    table as DROP TABLE drops it: catalog entry, then folder)."""
    what = (statement.parts["what"] or "").upper()
    database, schema = _database_and_schema(session, statement)
    cascade = (statement.parts["mode"] or "").upper() == "CASCADE"
    shown = _shown(database, schema)
    try:
        locks = _dynamic_table_locks(session, database, schema) if cascade else None
        with locks or contextlib.nullcontext():
            dropped = _drop(session, database, schema, cascade)
    except ObjectNotEmptyError as exc:
        raise SqlError(
            f"cannot drop {exc}; drop them first (DROP TABLE, DROP STREAM), or write DROP "
            f"{what} {shown} CASCADE to drop them with it",
            "OBJECT_NOT_EMPTY",
        ) from None
    if dropped is None:
        if statement.parts["if_exists"]:
            return status_frame(
                session, f"Drop statement executed successfully ({what.lower()} did not exist)."
            )
        raise ObjectNotFoundError(
            f"{what.lower()} {shown} does not exist; check the name (unquoted names are "
            f"upper-cased; SHOW {what}S lists them)"
        )
    purge_dropped(session.catalog, session.warehouse)  # their folders, unless kept
    own = quote_identifier(schema if schema is not None else database)
    return status_frame(session, f"{own} successfully dropped.")


def _is_current(value: bool) -> str:
    return "Y" if value else "N"


def show_databases(session: StatementContext, statement: Statement) -> DataFrame:
    """``SHOW DATABASES [LIKE '...']``: ``created_on``, ``name``, ``is_current``, ``kind``."""
    pattern = like(statement.parts.get("like"))
    rows = [
        (utc(d.created_at), d.name, _is_current(d.name == session.database), "STANDARD")
        for d in session.catalog.list_databases() if pattern(d.name)
    ]  # fmt: skip
    return rows_frame(
        session.spark, rows, "created_on TIMESTAMP, name STRING, is_current STRING, kind STRING"
    )


def show_schemas(session: StatementContext, statement: Statement) -> DataFrame:
    """``SHOW SCHEMAS [LIKE '...'] [IN ACCOUNT | IN DATABASE [d]]``: the schemas of the
    current database unless IN says otherwise, as the reference system scopes it."""
    pattern = like(statement.parts.get("like"))
    database: str | None = session.database
    if statement.parts.get("account"):
        database = None
    elif statement.parts.get("database"):
        database = check_parts(statement.parts["database"] or "", ("database",))[0]
        if session.catalog.get_database(database) is None:
            raise ObjectNotFoundError(f"database {_shown(database, None)} does not exist")
    current = (session.database, session.schema)
    rows = [
        (utc(s.created_at), s.name, _is_current((s.database, s.name) == current), s.database)
        for s in session.catalog.list_schemas(database) if pattern(s.name)
    ]  # fmt: skip
    columns = "created_on TIMESTAMP, name STRING, is_current STRING, database_name STRING"
    return rows_frame(session.spark, rows, columns)


def data_type_json(column_type: ColumnType, nullable: bool) -> str:
    """A column type as the reference system's SHOW COLUMNS writes it (``data_type``)."""
    kind = column_type.kind
    value: dict[str, Any]
    if kind is TypeKind.NUMBER:
        value = {"type": "FIXED", "precision": column_type.precision, "scale": column_type.scale}
    elif kind in (TypeKind.VARCHAR, TypeKind.BINARY):
        length = column_type.length or 0
        byte_length = min(length * 4, 16_777_216) if kind is TypeKind.VARCHAR else length
        value = {"type": "TEXT" if kind is TypeKind.VARCHAR else "BINARY", "length": length,
                 "byteLength": byte_length}  # fmt: skip
    elif kind is TypeKind.FLOAT:
        value = {"type": "REAL"}
    elif column_type.precision is not None:  # TIME and TIMESTAMP_*: digits of the fraction
        value = {"type": kind.value, "precision": 0, "scale": column_type.precision}
    else:
        value = {"type": kind.value}
    value["nullable"] = nullable
    if kind in (TypeKind.VARCHAR, TypeKind.BINARY):
        value["fixed"] = False
    return json.dumps(value, separators=(",", ":"))


_COLUMNS_SCHEMA = (
    "table_name STRING, schema_name STRING, column_name STRING, data_type STRING, "
    "`null?` STRING, `default` STRING, kind STRING, expression STRING, comment STRING, "
    "database_name STRING, autoincrement STRING"
)


def show_columns(session: StatementContext, statement: Statement) -> DataFrame:
    """``SHOW COLUMNS [LIKE '...'] IN [TABLE] t``: one row per column, in table order, with
    the reference system's columns (``data_type`` as its JSON; ``null?`` true/false)."""
    info = session.require_table(statement.parts["name"] or "")
    pattern = like(statement.parts.get("like"))
    rows = [
        (info.name, info.schema_name, c.name, data_type_json(c.type, c.nullable),
         str(c.nullable).lower(), "", "COLUMN", "", "", info.database, "")
        for c in info.schema if pattern(c.name)
    ]  # fmt: skip
    return rows_frame(session.spark, rows, _COLUMNS_SCHEMA)
