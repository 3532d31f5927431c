"""Statements about objects: tables, streams, SHOW, DESCRIBE, USE, ALTER; and
:data:`HANDLERS`, the one table of every statement handler (kind -> function).

Each handler takes the session and the classified statement and returns a DataFrame
(a status row, or the rows of SHOW/DESCRIBE), as the reference system answers. Handlers
of databases and schemas live in :mod:`pipelines.sql.ddl_schemas`, of statements that run a
query or change rows in :mod:`pipelines.sql.ddl_queries`, of a table's log in
:mod:`pipelines.sql.history`.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from catalog import ObjectAlreadyExistsError, StreamRecord, did_you_mean, full_name
from flush import create_catalog_table
from flush.spark_tables import rows_frame
from flush.table_locks import table_lock
from ingest_sdk.errors import TableAlreadyExistsError
from ingest_sdk.schema import check_object_name
from pipelines.change_sets import ChangeMode
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.binding import check_writable
from pipelines.sql.ddl_commits import abandon_commit_statement, show_pending_commits
from pipelines.sql.ddl_common import (
    DESCRIBE_COLUMNS,
    check_name_free,
    drop_named,
    drop_table_info,
    in_scope,
    like,
    literal,
    new_table_name,
    status_frame,
    table_definition,
    utc,
)
from pipelines.sql.ddl_queries import create_table_as, explain, truncate
from pipelines.sql.ddl_schemas import (
    create_database,
    drop_database,
    show_columns,
    show_databases,
    show_schemas,
)
from pipelines.sql.ddl_views import create_view, describe_view, drop_view, show_views
from pipelines.sql.history import describe_history
from pipelines.sql.statements import Statement, split_name
from pipelines.sql.view_streams import create_view_stream, view_stream_row

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["HANDLERS", "status_frame"]

_SETTINGS = {
    "CHANGE_TRACKING": ("change_tracking", None),
    "DATA_RETENTION_TIME_IN_DAYS": ("data_retention_time_in_days", (0, 90)),
    "MAX_DATA_EXTENSION_TIME_IN_DAYS": ("max_data_extension_time_in_days", (0, 90)),
}
_STREAM_MODES = {None: ChangeMode.DEFAULT, "FALSE": ChangeMode.DEFAULT,
                 "TRUE": ChangeMode.APPEND_ONLY, "FINAL": ChangeMode.APPEND_ONLY_FINAL}  # fmt: skip


def create_table(session: StatementContext, statement: Statement) -> DataFrame:
    parts = statement.parts
    database, schema_name, name = new_table_name(session, parts)
    schema, key = table_definition(parts["columns"] or "")
    existing = session.find_table(database, schema_name, name)
    if existing is not None and parts["replace"]:
        check_writable(session, existing, "CREATE OR REPLACE TABLE")
        drop_table_info(session, existing)
    try:
        info, created = create_catalog_table(
            session.catalog, session.warehouse, database, schema_name, name, schema,
            if_not_exists=bool(parts["if_not_exists"]),
            properties={"primary_key": list(key)} if key else None,
        )  # fmt: skip
    except TableAlreadyExistsError:  # its message names the HTTP fix; say the SQL one
        raise SqlError(
            f"table {full_name(database, schema_name, name)} already exists; write CREATE "
            "TABLE IF NOT EXISTS to keep it, or CREATE OR REPLACE TABLE to replace it",
            "TABLE_EXISTS",
        ) from None
    if not created:
        return status_frame(session, f"{info.name} already exists, statement succeeded.")
    return status_frame(session, f"Table {info.name} successfully created.")


def drop_table_statement(session: StatementContext, statement: Statement) -> DataFrame:
    database, schema_name, name = session.qualify(statement.parts["name"] or "")
    info = session.find_table(database, schema_name, name)
    if info is None:
        if statement.parts["if_exists"]:
            return status_frame(
                session, "Drop statement executed successfully (table did not exist)."
            )
        raise ObjectNotFoundError(
            f"table {database}.{schema_name}.{name} does not exist"
            + did_you_mean(session.catalog, database, schema_name, name, ["table"])
        )
    check_writable(session, info, "DROP TABLE")
    drop_table_info(session, info)
    return status_frame(session, f"{info.name} successfully dropped.")


def rename_table(session: StatementContext, statement: Statement) -> DataFrame:
    info = session.require_table(statement.parts["name"] or "")
    check_writable(session, info, "ALTER TABLE ... RENAME")
    database, schema_name, name = session.qualify(statement.parts["new"] or "")
    check_object_name(name, "the table name")
    check_name_free(session, (database, schema_name, name), "table")
    session.catalog.rename_table(info.id, database, schema_name, name)
    return status_frame(session, "Statement executed successfully.")


def alter_table_set(session: StatementContext, statement: Statement) -> DataFrame:
    info = session.require_table(statement.parts["name"] or "")
    properties: dict[str, Any] = {}
    for key, value in re.findall(
        r"([A-Za-z_]+)\s*=\s*([^\s,]+)", statement.parts["settings"] or ""
    ):
        setting = _SETTINGS.get(key.upper())
        if setting is None:
            raise SqlError(f"unsupported table setting {key}; supported: {', '.join(_SETTINGS)}",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        field, bounds = setting
        if bounds is None:
            if value.upper() not in ("TRUE", "FALSE"):
                raise SqlError(f"{key} must be TRUE or FALSE, got {value}", "SQL_COMPILATION_ERROR")
            properties[field] = value.upper() == "TRUE"
        else:
            if not value.isdigit() or not bounds[0] <= int(value) <= bounds[1]:
                raise SqlError(f"{key} must be a whole number of days from {bounds[0]} to "
                               f"{bounds[1]}, got {value}", "SQL_COMPILATION_ERROR")  # fmt: skip
            properties[field] = int(value)
    session.catalog.set_table_properties(info.id, properties)
    return status_frame(session, "Statement executed successfully.")


def show_tables(session: StatementContext, statement: Statement) -> DataFrame:
    pattern, scope = like(statement.parts.get("like")), in_scope(session, statement)
    dynamic = {dt.table_id for dt in session.catalog.list_dynamic_tables()}
    rows = [
        (utc(t.created_at), t.name, t.database, t.schema_name,
         "DYNAMIC TABLE" if t.id in dynamic else "TABLE",
         "ON" if t.properties["change_tracking"] else "OFF",
         t.properties["data_retention_time_in_days"])
        for t in session.catalog.list_tables()
        if pattern(t.name) and scope(t.database, t.schema_name)
    ]  # fmt: skip
    schema = ("created_on TIMESTAMP, name STRING, database_name STRING, schema_name STRING, "
              "kind STRING, change_tracking STRING, retention_time BIGINT")  # fmt: skip
    return rows_frame(session.spark, rows, schema)


def describe_table(session: StatementContext, statement: Statement) -> DataFrame:
    info = session.require_table(statement.parts["name"] or "")
    key = info.primary_key
    rows = [(c.name, c.declaration, "COLUMN", "Y" if c.nullable else "N",
             "Y" if c.name in key else "N") for c in info.schema]  # fmt: skip
    return rows_frame(session.spark, rows, f"{DESCRIBE_COLUMNS}, `primary key` STRING")


def create_stream(session: StatementContext, statement: Statement) -> DataFrame:
    parts = statement.parts
    database, schema_name, name = session.qualify(parts["name"] or "")
    check_object_name(name, "the stream name")
    on_view = (parts["on"] or "").upper() == "VIEW"
    if not on_view:
        _check_not_view(session, parts["table"] or "")
        info = session.require_table(parts["table"] or "")
    check_name_free(session, (database, schema_name, name), "stream")
    if parts["replace"] and parts["if_not_exists"]:
        raise SqlError(
            "OR REPLACE and IF NOT EXISTS cannot be used together", "SQL_COMPILATION_ERROR"
        )
    existing = session.catalog.get_stream(database, schema_name, name)
    if existing is not None and parts["if_not_exists"]:
        return status_frame(session, f"{name} already exists, statement succeeded.")
    if (parts["initial"] or "").upper() == "TRUE":
        raise SqlError("SHOW_INITIAL_ROWS = TRUE is not supported: a stream starts at the "
                       "table's current version; read the rows it holds with a SELECT",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if on_view:
        create_view_stream(session, (database, schema_name, name), parts["table"] or "", parts)
        return status_frame(session, f"Stream {name} successfully created.")
    mode = _STREAM_MODES[(parts["append_only"] or "").upper() or None]
    # On a dynamic table, not while a refresh commits: a refresh that found no follower
    # overwrites the table, and checks again under this lock (refresh.py), so the new
    # stream starts after that overwrite or makes it a difference.
    dynamic = session.catalog.get_dynamic_table(info.id) is not None
    with table_lock(info.uri) if dynamic else contextlib.nullcontext():
        offset = DeltaTable(info.uri).version()
        if parts["at_kind"]:
            kind = (parts["point_kind"] or "").upper()
            offset = session.point(info, parts["at_kind"].upper(), kind, parts["point"] or "")
        try:
            session.catalog.create_stream(
                database, schema_name, name, info.id, mode.value, offset,
                comment=literal(parts["comment"]), replace=bool(parts["replace"]),
            )  # fmt: skip
        except ObjectAlreadyExistsError as exc:
            raise SqlError(str(exc), "OBJECT_ALREADY_EXISTS") from None
    if not info.properties["change_tracking"]:
        session.catalog.set_table_properties(info.id, {"change_tracking": True})
    return status_frame(session, f"Stream {name} successfully created.")


def _check_not_view(session: StatementContext, name: str) -> None:
    database, schema_name, table = session.qualify(name)
    if session.find_table(database, schema_name, table) is None and session.catalog.get_view(
        database, schema_name, table
    ):
        raise SqlError(f"{database}.{schema_name}.{table} is a view: write CREATE STREAM ... ON "
                       "VIEW to follow its changes", "SQL_COMPILATION_ERROR")  # fmt: skip


def drop_stream(session: StatementContext, statement: Statement) -> DataFrame:
    return drop_named(session, statement, "stream", session.catalog.get_stream,
                      lambda stream: session.catalog.drop_stream(stream.id))  # fmt: skip


_STREAM_SCHEMA = (
    "created_on TIMESTAMP, name STRING, database_name STRING, schema_name STRING, "
    "comment STRING, table_name STRING, source_type STRING, base_tables STRING, type STRING, "
    "stale BOOLEAN, mode STRING, stale_after TIMESTAMP, offset_version BIGINT, "
    "base_offsets STRING"
)


def stream_row(session: StatementContext, stream: StreamRecord) -> tuple[Any, ...]:
    """One row of SHOW STREAMS. A stream on a view shows the view as ``table_name``, its
    base tables and their offsets (JSON, by name); its ``offset_version`` is NULL."""
    start = (utc(stream.created_at), stream.name, stream.database, stream.schema_name,
             stream.comment)  # fmt: skip
    if stream.on_view:
        row = view_stream_row(session, stream)
        return (*start, row["table_name"], "VIEW", row["base_tables"], "DELTA", row["stale"],
                stream.mode, utc(row["stale_after"]), None, row["base_offsets"])  # fmt: skip
    table = session.catalog.get_table_by_id(stream.table_id)
    stale, stale_after = session.staleness(stream, table)
    name = table.full_name if table else None
    return (*start, name, "TABLE", name, "DELTA", stale, stream.mode, utc(stale_after),
            stream.offset_version, None)  # fmt: skip


def show_streams(session: StatementContext, statement: Statement) -> DataFrame:
    pattern, scope = like(statement.parts.get("like")), in_scope(session, statement)
    rows = [stream_row(session, s) for s in session.catalog.list_streams()
            if pattern(s.name) and scope(s.database, s.schema_name)]  # fmt: skip
    return rows_frame(session.spark, rows, _STREAM_SCHEMA)


def describe_stream(session: StatementContext, statement: Statement) -> DataFrame:
    stream = session.require_stream(statement.parts["name"] or "")
    return rows_frame(session.spark, [stream_row(session, stream)], _STREAM_SCHEMA)


def use(session: StatementContext, statement: Statement) -> DataFrame:
    parts = split_name(statement.parts["name"] or "")
    what = (statement.parts["what"] or ("SCHEMA" if len(parts) == 2 else "DATABASE")).upper()
    for part in parts:
        check_object_name(part, "the name")
    if what == "DATABASE" and len(parts) == 1:
        session.database = parts[0]
    elif what == "SCHEMA" and len(parts) == 1:
        session.schema = parts[0]
    elif what == "SCHEMA" and len(parts) == 2:
        session.database, session.schema = parts
    else:
        raise SqlError(f"USE {what} takes {'one' if what == 'DATABASE' else 'one or two'} "
                       "name part(s)", "SQL_COMPILATION_ERROR")  # fmt: skip
    return status_frame(session, "Statement executed successfully.")


HANDLERS: dict[str, Callable[[StatementContext, Statement], DataFrame]] = {
    "create_table": create_table,
    "drop_table": drop_table_statement,
    "rename_table": rename_table,
    "alter_table_set": alter_table_set,
    "show_tables": show_tables,
    "describe_table": describe_table,
    "create_stream": create_stream,
    "drop_stream": drop_stream,
    "show_streams": show_streams,
    "describe_stream": describe_stream,
    "use": use,
    "create_table_as": create_table_as,
    "truncate": truncate,
    "explain": explain,
    "create_database": create_database,
    "drop_database": drop_database,
    "show_databases": show_databases,
    "show_schemas": show_schemas,
    "show_columns": show_columns,
    "describe_history": describe_history,
    "show_pending_commits": show_pending_commits,
    "abandon_commit": abandon_commit_statement,
    "create_view": create_view,
    "drop_view": drop_view,
    "show_views": show_views,
    "describe_view": describe_view,
}
