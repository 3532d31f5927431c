"""Column declarations, constraints, identifier matching and schema round trips."""

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_sdk import (
    ColumnType,
    SchemaError,
    TableSchema,
    UnsupportedFeatureError,
    normalize_identifier,
)
from ingest_sdk.schema import spark_fold


def test_parse_declarations_with_constraints():
    schema = TableSchema.parse(
        {"id": "NUMBER(38,0) NOT NULL", "Name": "VARCHAR(10) NULL", '"Mixed"': "DATE DEFAULT NULL"}
    )
    assert [c.name for c in schema] == ["ID", "NAME", "Mixed"]
    assert [c.nullable for c in schema] == [False, True, True]
    assert schema["ID"].type == ColumnType.parse("NUMBER(38,0)")


@pytest.mark.parametrize(
    ("key", "found"),
    [
        ("id", "ID"),
        ("ID", "ID"),
        (" Id ", "ID"),
        ('"ID"', "ID"),
        ('"id"', None),
        ('"Mixed"', "Mixed"),
        ("mixed", None),
        ("MIXED", None),
        ("nope", None),
        ("", None),
    ],
)
def test_row_keys_follow_identifier_rules(key, found):
    schema = TableSchema.parse({"ID": "INT", '"Mixed"': "INT"})
    column = schema.find(key)
    assert (column.name if column else None) == found


def test_quoted_identifier_unescapes_double_quotes():
    assert normalize_identifier('"a""b"') == 'a"b'
    assert normalize_identifier("abc") == "ABC"


@pytest.mark.parametrize(
    ("declaration", "error", "message"),
    [
        ("NUMBER AUTOINCREMENT", UnsupportedFeatureError, "AUTOINCREMENT/IDENTITY"),
        ("NUMBER IDENTITY(1,1)", UnsupportedFeatureError, "AUTOINCREMENT/IDENTITY"),
        ("NUMBER DEFAULT 5", UnsupportedFeatureError, "DEFAULT 5 is not supported"),
        ("VARCHAR DEFAULT 'x'", UnsupportedFeatureError, "DEFAULT 'x' is not supported"),
        ("VARCHAR COLLATE 'en-ci'", UnsupportedFeatureError, "collations are not supported"),
        ("GEOGRAPHY", UnsupportedFeatureError, "GEOGRAPHY columns are not supported"),
        ("VARCHAR PRIMARY KEY", SchemaError, "cannot understand 'PRIMARY KEY'"),
        ("FOO", SchemaError, "unknown column type"),
    ],
)
def test_unsupported_and_invalid_declarations_name_the_column(declaration, error, message):
    with pytest.raises(error, match=message) as info:
        TableSchema.parse({"col": declaration})
    assert 'column "COL"' in str(info.value)


def test_duplicate_and_empty_names_are_refused():
    with pytest.raises(SchemaError, match='column "A" is declared twice'):
        TableSchema.parse({"a": "INT", "A": "INT"})
    with pytest.raises(SchemaError, match="non-empty string"):
        TableSchema.parse({"": "INT"})
    with pytest.raises(SchemaError, match="at least one column"):
        TableSchema.parse({})
    with pytest.raises(SchemaError, match="must be a mapping"):
        TableSchema.parse([("A", "INT")])  # type: ignore[arg-type]


def test_arrow_round_trip_keeps_declared_types_and_nullability():
    schema = TableSchema.parse(
        {"ID": "INT NOT NULL", '"t s"': "TIMESTAMP_LTZ(3)", "C": "CHAR(4)", "V": "VARIANT"}
    )
    assert TableSchema.from_arrow(schema.to_arrow()) == schema
    assert TableSchema.parse(schema.declarations()) == schema


def test_delta_round_trip_keeps_declared_types(tmp_path):
    from deltalake import DeltaTable

    schema = TableSchema.parse({"ID": "NUMBER(10,0) NOT NULL", "T": "TIME(3)", "O": "OBJECT"})
    DeltaTable.create(str(tmp_path), schema.to_arrow())
    arrow_schema = pa.schema(DeltaTable(str(tmp_path)).schema())
    assert TableSchema.from_arrow(arrow_schema) == schema


def test_from_arrow_without_metadata_is_refused():
    with pytest.raises(SchemaError, match="has no declared type"):
        TableSchema.from_arrow(pa.schema([pa.field("X", pa.int64())]))


#: i I, dotted capital I, dotless i, k K, Kelvin sign, s S, long s, sharp s, three sigmas,
#: three forms of DZ with caron, and plain letters.
_CASE_TRICKS = "iI\u0130\u0131kK\u212asS\u017f\u00df\u03c3\u03c2\u03a3\u01c5\u01c4\u01c6_aA"


@settings(max_examples=300, deadline=None)
@given(st.text(_CASE_TRICKS, max_size=4), st.text(_CASE_TRICKS, max_size=4))
def test_spark_fold_says_what_javas_equals_ignore_case_says(spark, left, right):
    """Two names are one for Spark exactly when Java's equalsIgnoreCase says so (the
    characters whose Python and Java case mappings differ are over-represented)."""
    java = spark._jvm.org.apache.commons.lang3.StringUtils.equalsIgnoreCase(left, right)
    assert (spark_fold(left) == spark_fold(right)) == java
