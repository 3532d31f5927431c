"""CREATE [OR REPLACE] VIEW, DROP VIEW, SHOW VIEWS, DESCRIBE VIEW: named queries kept
in the catalog and expanded where they are read (:meth:`pipelines.sql.binding.Binder`).

A view is checked when it is created: its body must be a query that Spark can
analyse over the objects it names now, reading no stream (a view's stream read would
never be consumed) and not itself; its columns are what that analysis gives. Names in
the body resolve against the creating session's defaults, whoever reads the view
later. Nothing is stored for a view but its text: it reads its tables as they are
when it is read, and a table dropped under it makes reading it fail, naming the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog import ObjectAlreadyExistsError, ViewRecord, did_you_mean, full_name
from flush.spark_tables import rows_frame
from ingest_sdk.schema import check_object_name
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.ddl_common import (
    DESCRIBE_COLUMNS,
    check_name_free,
    drop_named,
    in_scope,
    like,
    literal,
    status_frame,
    utc,
)
from pipelines.sql.ddl_queries import query_frame
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.sql.statements import Statement

__all__ = ["create_view", "describe_view", "drop_view", "show_views"]


def create_view(session: StatementContext, statement: Statement) -> DataFrame:
    parts = statement.parts
    database, schema_name, name = session.qualify(parts["name"] or "")
    for part, what in ((database, "database"), (schema_name, "schema"), (name, "view")):
        check_object_name(part, f"the {what} name")
    if parts["replace"] and parts["if_not_exists"]:
        raise SqlError("OR REPLACE and IF NOT EXISTS cannot be used together",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    shown = full_name(database, schema_name, name)
    if parts["if_not_exists"] and session.catalog.get_view(database, schema_name, name):
        return status_frame(session, f"{name} already exists, statement succeeded.")
    check_name_free(session, (database, schema_name, name), "view")
    query = (parts["query"] or "").rstrip().removesuffix(";").rstrip()
    txn = Transaction(session.catalog, session.spark, read_only=True)
    try:
        binder, _ = query_frame(session, txn, query, "CREATE VIEW ... AS", within=(shown,),
                                analysis=True)  # fmt: skip
        if binder.streams:
            stream = session.catalog.get_stream_by_id(binder.streams[0])
            raise SqlError(
                f"view {shown} would read stream {stream.full_name if stream else '?'}; a view "
                "cannot read a stream (its changes would never be consumed): read the stream "
                "in the statement that consumes it",
                "SQL_COMPILATION_ERROR",
            )
    finally:
        session.release_views()
    try:
        session.catalog.create_view(
            database, schema_name, name, query, (session.database, session.schema),
            comment=literal(parts["comment"]), replace=bool(parts["replace"]),
        )  # fmt: skip
    except ObjectAlreadyExistsError as exc:
        raise SqlError(str(exc), "OBJECT_ALREADY_EXISTS") from None
    return status_frame(session, f"View {name} successfully created.")


def drop_view(session: StatementContext, statement: Statement) -> DataFrame:
    return drop_named(session, statement, "view", session.catalog.get_view,
                      lambda view: session.catalog.drop_view(view.id))  # fmt: skip


_VIEW_SCHEMA = (
    "created_on TIMESTAMP, name STRING, database_name STRING, schema_name STRING, "
    "comment STRING, text STRING"
)


def _row(view: ViewRecord) -> tuple[object, ...]:
    return (utc(view.created_at), view.name, view.database, view.schema_name, view.comment,
            view.query)  # fmt: skip


def show_views(session: StatementContext, statement: Statement) -> DataFrame:
    pattern, scope = like(statement.parts.get("like")), in_scope(session, statement)
    rows = [_row(v) for v in session.catalog.list_views()
            if pattern(v.name) and scope(v.database, v.schema_name)]  # fmt: skip
    return rows_frame(session.spark, rows, _VIEW_SCHEMA)


def describe_view(session: StatementContext, statement: Statement) -> DataFrame:
    """The view's columns as a read of it gives them now (name, Spark type, nullable)."""
    database, schema_name, name = session.qualify(statement.parts["name"] or "")
    view = session.catalog.get_view(database, schema_name, name)
    if view is None:
        raise ObjectNotFoundError(
            f"view {full_name(database, schema_name, name)} does not exist"
            + did_you_mean(session.catalog, database, schema_name, name, ["view"])
        )
    txn = Transaction(session.catalog, session.spark, read_only=True)
    try:
        reference = f"SELECT * FROM {_quoted(view)}"
        _, frame = query_frame(session, txn, reference, "DESCRIBE VIEW")
        rows = [(f.name, f.dataType.simpleString().upper(), "COLUMN", "Y" if f.nullable else "N")
                for f in frame.schema.fields]  # fmt: skip
    finally:
        session.release_views()
    return rows_frame(session.spark, rows, DESCRIBE_COLUMNS)


def _quoted(view: ViewRecord) -> str:
    return ".".join('"' + part.replace('"', '""') + '"'
                    for part in (view.database, view.schema_name, view.name))  # fmt: skip
