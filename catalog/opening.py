"""Which catalog a location names: a PostgreSQL URL (``postgresql://`` or
``postgres://``) or the path of a SQLite file (the default, ``<warehouse>/catalog.sqlite``)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from catalog.base import Catalog

__all__ = ["CATALOG_FILE", "CATALOG_VARIABLE", "holds_catalog", "is_postgres", "open_catalog"]

#: The SQLite catalog's file in a warehouse folder, when no other catalog is named.
CATALOG_FILE = "catalog.sqlite"
#: The environment variable naming the catalog for every face that takes no option for it
#: (the service's Spark worker, compaction by hand, the Spark data sources).
CATALOG_VARIABLE = "INGEST_CATALOG"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(_POSTGRES_SCHEMES)


def open_catalog(location: str | Path) -> Catalog:
    """Open (and lay out, the first time) the catalog at ``location``."""
    if is_postgres(location):
        from catalog.postgres import PostgresCatalog

        return PostgresCatalog(str(location))
    from catalog.sqlite_file import SqliteCatalog

    return SqliteCatalog(location)


def holds_catalog(location: str | Path) -> bool:
    """Whether a catalog is laid out at ``location``, checked without creating anything
    (opening one lays it out, which the faces that only read must never do): the
    catalog's ``tables`` table in the SQLite file (opened read-only) or the database.

    Raises:
        CatalogUnavailableError: the PostgreSQL server cannot be reached or refuses the login.
    """
    if is_postgres(location):
        from catalog.postgres import _Connection

        connection = _Connection(str(location))
        try:
            row = connection.execute("SELECT to_regclass('tables') IS NOT NULL").fetchone()
        finally:
            connection.close()
        return bool(row[0])
    path = Path(location)
    if not path.is_file() or path.stat().st_size == 0:
        return False
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
        ) as db:
            found = db.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'tables'"
            ).fetchone()[0]
    except sqlite3.Error:
        return False
    return bool(found == 1)
