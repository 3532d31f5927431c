"""Primary keys declared at CREATE TABLE: parsed from the column list, kept in the
catalog, shown by DESCRIBE TABLE, their columns NOT NULL, never enforced otherwise; bad
declarations refused with nothing created.

``table_definition`` is pure (no Spark), so its input space is explored with hypothesis;
the statements run through a real session.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import SqliteCatalog
from pipelines import SqlError
from pipelines.sql.ddl_common import table_definition
from tests.pipelines.conftest import rows
from tests.pipelines.refusals import assert_refused


def described(session, name):
    return [(r["name"], r["null"], r["primary key"])
            for r in session.sql(f"DESCRIBE TABLE {name}").collect()]  # fmt: skip


def test_a_table_constraint_and_a_column_key(session):
    session.sql("CREATE TABLE A (ID NUMBER, REGION VARCHAR, N NUMBER, "
                "CONSTRAINT pk PRIMARY KEY (region, \"ID\"))")  # fmt: skip
    assert session.require_table("A").primary_key == ("REGION", "ID")
    assert described(session, "A") == [("ID", "N", "Y"), ("REGION", "N", "Y"), ("N", "Y", "N")]
    session.sql("CREATE TABLE U (ID NUMBER NOT NULL PRIMARY KEY, NAME VARCHAR)")
    assert session.require_table("U").primary_key == ("ID",)
    assert described(session, "U") == [("ID", "N", "Y"), ("NAME", "Y", "N")]
    session.sql('CREATE TABLE Q ("we ird" VARCHAR(3) primary key)')
    assert session.require_table("Q").primary_key == ("we ird",)
    # Kept by the catalog: another opening reads it back.
    catalog = SqliteCatalog(Path(session.warehouse) / "catalog.sqlite")
    try:
        assert catalog.get_table("DB", "PUBLIC", "A").primary_key == ("REGION", "ID")
        assert catalog.get_table("DB", "PUBLIC", "U").properties["change_tracking"] is False
    finally:
        catalog.close()


def test_the_key_is_not_enforced_but_its_columns_are_not_null(session):
    session.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("INSERT INTO K VALUES (1, 'a'), (1, 'b')")  # the same key twice: accepted
    session.sql("MERGE INTO K USING (SELECT 1 AS ID, 'c' AS V) S ON FALSE "
                "WHEN NOT MATCHED THEN INSERT VALUES (S.ID, S.V)")  # fmt: skip
    assert sorted(rows(session.sql("SELECT V FROM K WHERE ID = 1"))) == [("a",), ("b",), ("c",)]
    with pytest.raises(SqlError, match="ID"):
        session.sql("INSERT INTO K VALUES (NULL, 'x')")
    assert len(rows(session.sql("SELECT * FROM K"))) == 3


@pytest.mark.parametrize(("columns", "message"), [
    ("ID NUMBER, PRIMARY KEY (NOPE)", "does not declare"),
    ("ID NUMBER PRIMARY KEY, V VARCHAR, PRIMARY KEY (V)", "declared twice"),
    ("ID NUMBER PRIMARY KEY, V VARCHAR PRIMARY KEY", "declared twice"),
    ("ID NUMBER, PRIMARY KEY (ID, ID)", "distinct"),
    ("ID NUMBER, PRIMARY KEY ()", "distinct"),
    ("ID NUMBER, PRIMARY KEY (ID,)", "distinct"),
    ("ID VARIANT PRIMARY KEY", "no order"),
    ("ID NUMBER, A ARRAY, PRIMARY KEY (ID, A)", "no order"),
    ("PRIMARY KEY (ID)", "does not declare"),
])  # fmt: skip
def test_bad_keys_are_refused_and_nothing_is_created(session, columns, message):
    statement = f"CREATE TABLE BAD ({columns})"
    assert_refused(session, statement, "SQL_COMPILATION_ERROR", message, collect=False)
    assert session.find_table("DB", "PUBLIC", "BAD") is None


def test_ctas_takes_no_key(session):
    with pytest.raises(SqlError, match="takes no PRIMARY KEY") as refused:
        session.sql("CREATE TABLE C (ID, PRIMARY KEY (ID)) AS SELECT 1 AS ID")
    assert refused.value.code == "SQL_COMPILATION_ERROR"
    assert session.find_table("DB", "PUBLIC", "C") is None


_NAMES = st.sampled_from(["ID", "A", "B", '"q x"', "region"])


@settings(max_examples=150, deadline=None)
@given(
    names=st.lists(_NAMES, min_size=1, max_size=4, unique_by=lambda n: n.strip('"').upper()),
    data=st.data(),
)
def test_table_definition_keys_name_declared_columns_in_order(names, data):
    key = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    as_column = len(key) == 1 and data.draw(st.booleans())
    definitions = [f"{n} NUMBER{' PRIMARY KEY' if as_column and n == key[0] else ''}"
                   for n in names]  # fmt: skip
    if key and not as_column:
        definitions.insert(data.draw(st.integers(0, len(definitions))),
                           f"PRIMARY KEY ({', '.join(key)})")  # fmt: skip
    schema, found = table_definition(", ".join(definitions))
    stored = [n.strip('"') if n.startswith('"') else n.upper() for n in names]
    assert list(schema.names) == stored
    assert found == tuple(k.strip('"') if k.startswith('"') else k.upper() for k in key)
    for column in schema:
        assert column.nullable == (column.name not in found)
