"""``<db>.INFORMATION_SCHEMA.<view>``: the read-only views a query reads to learn what
database ``<db>`` holds, named as the systems we follow name them.

Spanner's change stream views: ``CHANGE_STREAMS`` (one row per stream), its tables
(``CHANGE_STREAM_TABLES``), the columns of its column lists (``CHANGE_STREAM_COLUMNS``)
and its options (``CHANGE_STREAM_OPTIONS``), with the catalog and schema columns holding
our database and schema (Spanner's are empty strings); and ``STREAMS``, one row per
Snowflake-style stream as SHOW STREAMS describes it (ours: Snowflake's INFORMATION_SCHEMA
has no such view; its dynamic tables are the table function ``DYNAMIC_TABLES()``). The
binder answers a name in the schema ``INFORMATION_SCHEMA`` with a frame from the catalog
(through the session's :meth:`~pipelines.session.Session.information_schema_view`) before
Spark runs the query, so the views join and filter like tables. The schema name is
reserved: CREATE SCHEMA refuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from catalog import ChangeStreamRecord
from flush.spark_tables import rows_frame
from ingest_sdk.schema import quote_identifier
from pipelines.change_streams.definition import retention_text
from pipelines.errors import ObjectNotFoundError
from pipelines.sql.statements import DEFAULT_DATABASE
from pipelines.sql.statements import INFORMATION_SCHEMA as SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["SCHEMA", "VIEWS", "view_frame"]

_STREAM = "CHANGE_STREAM_CATALOG STRING, CHANGE_STREAM_SCHEMA STRING, CHANGE_STREAM_NAME STRING"


def _streams(session: StatementContext, database: str) -> list[ChangeStreamRecord]:
    return [s for s in session.catalog.list_change_streams() if s.database == database]


def _change_streams(session: StatementContext, database: str) -> list[tuple[object, ...]]:
    return [(s.database, s.schema_name, s.name, s.for_all) for s in _streams(session, database)]


def _change_stream_tables(session: StatementContext, database: str) -> list[tuple[object, ...]]:
    """Each table a stream watches now: every table for a stream FOR ALL (those created
    later join it), the listed ones that still exist otherwise."""
    tables = session.catalog.list_tables()
    by_id = {t.id: t for t in tables}
    rows: list[tuple[object, ...]] = []
    for s in _streams(session, database):
        watched = tables if s.for_all else [by_id[i] for i in s.table_ids if i in by_id]
        rows.extend((s.database, s.schema_name, s.name, t.database, t.schema_name, t.name,
                     s.watched_columns(t.id) is None) for t in watched)  # fmt: skip
    return rows


def _change_stream_columns(session: StatementContext, database: str) -> list[tuple[object, ...]]:
    """Each column a stream's column list names (a table watched whole has none here, as
    in Spanner), of the tables that still exist."""
    by_id = {t.id: t for t in session.catalog.list_tables()}
    return [(s.database, s.schema_name, s.name, t.database, t.schema_name, t.name, column)
            for s in _streams(session, database) for table_id, columns in s.column_lists
            if (t := by_id.get(table_id)) is not None for column in columns]  # fmt: skip


def _change_stream_options(session: StatementContext, database: str) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for s in _streams(session, database):
        rows.append((s.database, s.schema_name, s.name, "value_capture_type", "STRING",
                     s.value_capture_type))  # fmt: skip
        rows.append((s.database, s.schema_name, s.name, "retention_period", "STRING",
                     retention_text(s.retention_s)))  # fmt: skip
        rows.extend((s.database, s.schema_name, s.name, option, "BOOL", str(on).upper())
                    for option, on in s.exclusions)  # fmt: skip
    return rows


def _snowflake_streams(session: StatementContext, database: str) -> list[tuple[object, ...]]:
    """``STREAMS`` (ours: Snowflake's INFORMATION_SCHEMA has no such view): one row per
    stream of the database, as SHOW STREAMS describes it."""
    from pipelines.sql.ddl import stream_row

    rows: list[tuple[object, ...]] = []
    for stream in session.catalog.list_streams():
        if stream.database != database:
            continue
        (created, name, db, schema, comment, table, source_type, bases, kind, stale, mode,
         stale_after, *_) = stream_row(session, stream)  # fmt: skip
        rows.append((db, schema, name, comment or None, table, source_type, bases, kind, mode,
                     stale, stale_after, created))  # fmt: skip
    return sorted(rows, key=lambda row: (str(row[1]), str(row[2])))


#: View name -> (its columns, its rows in a database).
VIEWS: dict[str, tuple[str, Callable[[StatementContext, str], list[tuple[object, ...]]]]] = {
    "CHANGE_STREAMS": (f"{_STREAM}, `ALL` BOOLEAN", _change_streams),
    "CHANGE_STREAM_TABLES": (
        f"{_STREAM}, TABLE_CATALOG STRING, TABLE_SCHEMA STRING, TABLE_NAME STRING, "
        "ALL_COLUMNS BOOLEAN",
        _change_stream_tables,
    ),
    "CHANGE_STREAM_COLUMNS": (
        f"{_STREAM}, TABLE_CATALOG STRING, TABLE_SCHEMA STRING, TABLE_NAME STRING, "
        "COLUMN_NAME STRING",
        _change_stream_columns,
    ),
    "CHANGE_STREAM_OPTIONS": (
        f"{_STREAM}, OPTION_NAME STRING, OPTION_TYPE STRING, OPTION_VALUE STRING",
        _change_stream_options,
    ),
    "STREAMS": (
        "STREAM_CATALOG STRING, STREAM_SCHEMA STRING, STREAM_NAME STRING, COMMENT STRING, "
        "TABLE_NAME STRING, SOURCE_TYPE STRING, BASE_TABLES STRING, TYPE STRING, MODE STRING, "
        "STALE BOOLEAN, STALE_AFTER TIMESTAMP, CREATED TIMESTAMP",
        _snowflake_streams,
    ),
}


def view_frame(session: StatementContext, database: str, name: str) -> DataFrame:
    """The rows of ``<database>.INFORMATION_SCHEMA.<name>``.

    Raises:
        ObjectNotFoundError: no such view, naming those there are.
    """
    found = VIEWS.get(name)  # (as stored: an unquoted name comes upper-cased, a quoted exact)
    if found is None:
        raise ObjectNotFoundError(
            f"{database}.{SCHEMA}.{name[:80]} does not exist; {SCHEMA} holds "
            f"{', '.join(sorted(VIEWS))}"
        )
    columns, rows = found
    if session.catalog.get_database(database) is None:
        if database == DEFAULT_DATABASE:  # there before its first table, as SHOW says
            return rows_frame(session.spark, [], columns)
        raise ObjectNotFoundError(f"database {quote_identifier(database)} does not exist; "
                                  "SHOW DATABASES lists them")  # fmt: skip
    return rows_frame(session.spark, rows(session, database), columns)
