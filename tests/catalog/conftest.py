"""Every catalog test runs on both catalogs: a SQLite file and a PostgreSQL database
(tests/postgres_server.py; skipped where PostgreSQL's binaries are missing, failed in CI)."""

from __future__ import annotations

import pytest

from catalog import open_catalog


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_location(request, tmp_path):
    """Where a test's catalog lives: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "catalog.sqlite"
    return request.getfixturevalue("postgres_dsn")


@pytest.fixture
def catalog(catalog_location):
    made = open_catalog(catalog_location)
    yield made
    made.close()
