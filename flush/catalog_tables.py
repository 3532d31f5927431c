"""Creating a table in the catalog and on disk together, for every layer that creates one
(the service's HTTP call and SQL sessions' CREATE TABLE)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from catalog import Catalog, TableInfo
from flush.commit_clock import now_us
from flush.failpoints import failpoint
from flush.tables import create_table, drop_table, new_table_folder
from ingest_sdk import SchemaError, TableSchema
from ingest_sdk.errors import TableAlreadyExistsError, TableNotFoundError
from ingest_sdk.schema import check_object_name

__all__ = ["check_column_names", "create_catalog_table", "purge_dropped"]

log = logging.getLogger(__name__)


def check_column_names(schema: TableSchema) -> None:
    """New columns follow the rules of table names and differ in more than case.

    Raises:
        SchemaError: a name breaks the rules; the message says which and why.
    """
    seen: dict[str, str] = {}
    for column in schema:
        check_object_name(column.name, f"the column name {column.name[:60]!r}")
        other = seen.setdefault(column.name.casefold(), column.name)
        if other != column.name:  # Delta (and Spark) match column names ignoring case
            raise SchemaError(
                f"the columns {other!r} and {column.name!r} differ only in case; Delta "
                "tables need names that differ in more than case: rename one"
            )


def create_catalog_table(
    catalog: Catalog,
    warehouse: str | Path,
    database: str,
    schema_name: str,
    name: str,
    schema: TableSchema,
    if_not_exists: bool = False,
    properties: dict[str, Any] | None = None,
) -> tuple[TableInfo, bool]:
    """Create a table (and its database and schema). Returns the table and whether it
    was created.

    Nothing is ever deleted here: the table gets a new folder of its own
    (:func:`flush.new_table_folder`), and a create that fails removes only that folder,
    which it made itself a moment before.

    Raises:
        TableAlreadyExistsError: the name is taken and ``if_not_exists`` is false.
        SchemaError: a column name or declaration is invalid.
    """
    check_column_names(schema)
    try:
        existing = catalog.get_table(database, schema_name, name)
    except TableNotFoundError:
        pass
    else:
        if if_not_exists:
            return existing, False
        raise TableAlreadyExistsError(
            f"table {existing.full_name} already exists; use if_not_exists=true to keep "
            "it, or drop it first"
        )
    folder = new_table_folder(warehouse, database, schema_name, name)
    try:
        create_table(str(folder), schema)
        info = catalog.create_table(database, schema_name, name, str(folder), schema, properties)
    except BaseException:
        drop_table(folder, warehouse)  # ours alone: made just above
        raise
    return info, True


def purge_dropped(catalog: Catalog, warehouse: str | Path) -> int:
    """Delete the folders of dropped tables no longer kept (none of the change streams
    that watched one keeps records that old) and forget them: the folder first, so a
    crash in between leaves a row whose folder is gone, purged again next time, never a
    folder nobody knows. Returns how many were purged.

    Every drop calls this (a table no change stream watches goes at once), and so does
    the service's recovery task."""
    gone = catalog.expired_dropped_tables(now_us())
    for info in gone:
        if not drop_table(info.uri, warehouse):
            log.warning("forgot dropped table %s but left its folder %s: not a table folder "
                        "of the warehouse", info.full_name, info.uri)  # fmt: skip
        failpoint("dropped_table_purge")
        catalog.forget_dropped_table(info.id)
    return len(gone)
