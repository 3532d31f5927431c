"""Which catalog a location names: a PostgreSQL URL (``postgresql://`` or
``postgres://``) or the path of a SQLite file (the default, ``<warehouse>/catalog.sqlite``)."""

from __future__ import annotations

from pathlib import Path

from catalog.base import Catalog

__all__ = ["CATALOG_FILE", "is_postgres", "open_catalog"]

#: The SQLite catalog's file in a warehouse folder, when no other catalog is named.
CATALOG_FILE = "catalog.sqlite"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: str | Path) -> bool:
    return isinstance(location, str) and location.startswith(_POSTGRES_SCHEMES)


def open_catalog(location: str | Path) -> Catalog:
    """Open (and lay out, the first time) the catalog at ``location``."""
    if is_postgres(location):
        from catalog.postgres import PostgresCatalog

        return PostgresCatalog(str(location))
    from catalog.sqlite import SqliteCatalog

    return SqliteCatalog(location)
