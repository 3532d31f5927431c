"""SHOW TABLES | STREAMS | VIEWS | DYNAMIC TABLES | CHANGE STREAMS with Snowflake's scope,
``IN ACCOUNT | IN DATABASE [db] | IN SCHEMA [[db.]schema]``, after ``LIKE``."""

from __future__ import annotations

import pytest

from pipelines import Session, SqlError

KINDS = ("TABLES", "STREAMS", "VIEWS", "DYNAMIC TABLES", "CHANGE STREAMS")


@pytest.fixture(scope="module")
def objects(tmp_path_factory, spark):
    """A session over one object of each kind in DB.PUBLIC, OTHER.PUBLIC and OTHER.S2."""
    session = Session(tmp_path_factory.mktemp("show_scope") / "warehouse", spark=spark)
    for database, schema in (("DB", "PUBLIC"), ("OTHER", "PUBLIC"), ("OTHER", "S2")):
        if (database, schema) == ("OTHER", "PUBLIC"):
            session.sql("CREATE DATABASE OTHER")
        elif schema == "S2":
            session.sql("CREATE SCHEMA OTHER.S2")
        where = f"{database}.{schema}"
        session.sql(f"CREATE TABLE {where}.T_{schema} (ID NUMBER)")
        session.sql(f"CREATE STREAM {where}.ST_{schema} ON TABLE {where}.T_{schema}")
        session.sql(f"CREATE VIEW {where}.V_{schema} AS SELECT ID FROM {where}.T_{schema}")
        session.sql(f"CREATE DYNAMIC TABLE {where}.D_{schema} TARGET_LAG = '1 hour' "
                    f"AS SELECT ID FROM {where}.T_{schema}")  # fmt: skip
        session.sql(f"CREATE CHANGE STREAM {where}.CS_{schema} FOR {where}.T_{schema}")
    yield session
    session.close()


@pytest.fixture
def warehouse(objects):
    """The module's session, back in DB.PUBLIC."""
    objects.sql("USE SCHEMA DB.PUBLIC")
    return objects


def shown(session, kind: str, scope: str = "", like: str = "") -> list[tuple[str, str]]:
    """The (database, schema) of each object SHOW lists, dynamic tables apart from
    SHOW TABLES' other tables."""
    found = session.sql(f"SHOW {kind}{like}{scope}").collect()
    return sorted((r.database_name, r.schema_name) for r in found
                  if kind != "TABLES" or r.kind == "TABLE")  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_each_show_keeps_to_its_scope(warehouse, kind):
    every = [("DB", "PUBLIC"), ("OTHER", "PUBLIC"), ("OTHER", "S2")]
    assert shown(warehouse, kind) == every  # no IN: the whole warehouse, as before
    assert shown(warehouse, kind, " IN ACCOUNT") == every
    assert shown(warehouse, kind, " IN DATABASE") == [("DB", "PUBLIC")]  # the current one
    assert shown(warehouse, kind, " IN DATABASE other") == every[1:]
    assert shown(warehouse, kind, " IN SCHEMA") == [("DB", "PUBLIC")]
    assert shown(warehouse, kind, " IN SCHEMA OTHER.S2") == [("OTHER", "S2")]
    assert shown(warehouse, kind, " IN OTHER.S2") == [("OTHER", "S2")]  # SCHEMA is optional
    assert shown(warehouse, kind, " in schema other.public", " LIKE '%public'") == [
        ("OTHER", "PUBLIC")]  # fmt: skip
    assert shown(warehouse, kind, " IN SCHEMA OTHER.S2", " LIKE '%public'") == []
    warehouse.sql("USE DATABASE OTHER")
    assert shown(warehouse, kind, " IN SCHEMA S2") == [("OTHER", "S2")]  # in the current db


@pytest.mark.parametrize("scope, words", [
    (" IN DATABASE NOPE", "database NOPE does not exist"),
    (" IN SCHEMA NOPE", "schema DB.NOPE does not exist"),
    (" IN SCHEMA OTHER.NOPE", "schema OTHER.NOPE does not exist"),
    (" IN DATABASE A.B", "invalid database name"),
    (" IN SCHEMA A.B.C", "invalid schema name"),
])  # fmt: skip
def test_a_scope_that_names_nothing_says_so(warehouse, scope, words):
    for kind in KINDS:
        with pytest.raises(SqlError, match=words):
            warehouse.sql(f"SHOW {kind}{scope}")
