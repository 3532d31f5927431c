"""Declared type parsing and the Arrow/Delta storage mapping."""

import pyarrow as pa
import pytest

from ingest_sdk import ColumnType, SchemaError, TypeKind, UnsupportedFeatureError

PARSE_CASES = [
    ("NUMBER", "NUMBER(38,0)"),
    ("number(10)", "NUMBER(10,0)"),
    ("NUMBER(10, 2)", "NUMBER(10,2)"),
    ("DECIMAL(38,38)", "NUMBER(38,38)"),
    ("NUMERIC(5,1)", "NUMBER(5,1)"),
    ("INT", "NUMBER(38,0)"),
    ("INTEGER", "NUMBER(38,0)"),
    ("BIGINT", "NUMBER(38,0)"),
    ("SMALLINT", "NUMBER(38,0)"),
    ("TINYINT", "NUMBER(38,0)"),
    ("BYTEINT", "NUMBER(38,0)"),
    ("FLOAT", "FLOAT"),
    ("FLOAT4", "FLOAT"),
    ("FLOAT8", "FLOAT"),
    ("DOUBLE", "FLOAT"),
    ("double   precision", "FLOAT"),
    ("REAL", "FLOAT"),
    ("VARCHAR", "VARCHAR(16777216)"),
    ("VARCHAR(10)", "VARCHAR(10)"),
    ("STRING", "VARCHAR(16777216)"),
    ("TEXT", "VARCHAR(16777216)"),
    ("CHAR(5)", "VARCHAR(5)"),
    ("CHAR", "VARCHAR(1)"),
    ("CHARACTER", "VARCHAR(1)"),
    ("CHARACTER VARYING(7)", "VARCHAR(7)"),
    ("BINARY", "BINARY(8388608)"),
    ("BINARY(16)", "BINARY(16)"),
    ("VARBINARY", "BINARY(8388608)"),
    ("BOOLEAN", "BOOLEAN"),
    ("DATE", "DATE"),
    ("TIME", "TIME(9)"),
    ("TIME(0)", "TIME(0)"),
    ("TIMESTAMP", "TIMESTAMP_NTZ(9)"),
    ("DATETIME", "TIMESTAMP_NTZ(9)"),
    ("TIMESTAMP_NTZ(3)", "TIMESTAMP_NTZ(3)"),
    ("TIMESTAMP_LTZ", "TIMESTAMP_LTZ(9)"),
    ("TIMESTAMP WITH LOCAL TIME ZONE", "TIMESTAMP_LTZ(9)"),
    ("TIMESTAMP_TZ(6)", "TIMESTAMP_TZ(6)"),
    ("TIMESTAMP WITH TIME ZONE", "TIMESTAMP_TZ(9)"),
    ("VARIANT", "VARIANT"),
    ("OBJECT", "OBJECT"),
    ("ARRAY", "ARRAY"),
]


@pytest.mark.parametrize(("text", "declared"), PARSE_CASES)
def test_parse_gives_canonical_declared_form(text, declared):
    column_type = ColumnType.parse(text)
    assert column_type.declared == declared
    assert ColumnType.parse(declared) == column_type  # the canonical form round-trips


STORAGE_CASES = [
    ("NUMBER(18,0)", pa.int64(), "long"),
    ("NUMBER(9,0)", pa.int64(), "long"),
    ("NUMBER(19,0)", pa.decimal128(19, 0), "decimal(19,0)"),
    ("INT", pa.decimal128(38, 0), "decimal(38,0)"),
    ("NUMBER(10,2)", pa.decimal128(10, 2), "decimal(10,2)"),
    ("FLOAT", pa.float64(), "double"),
    ("VARCHAR(3)", pa.string(), "string"),
    ("BINARY", pa.binary(), "binary"),
    ("BOOLEAN", pa.bool_(), "boolean"),
    ("DATE", pa.date32(), "date"),
    ("TIME", pa.string(), "string"),
    ("TIMESTAMP_NTZ", pa.timestamp("us"), "timestamp_ntz"),
    ("TIMESTAMP_LTZ", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("TIMESTAMP_TZ", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("VARIANT", pa.string(), "string"),
    ("OBJECT", pa.string(), "string"),
    ("ARRAY", pa.string(), "string"),
]


@pytest.mark.parametrize(("text", "arrow_type", "delta_type"), STORAGE_CASES)
def test_storage_type(text, arrow_type, delta_type, tmp_path):
    from deltalake import DeltaTable

    column_type = ColumnType.parse(text)
    assert column_type.arrow_type == arrow_type
    field = column_type.arrow_field("C")
    DeltaTable.create(str(tmp_path), pa.schema([field]))
    stored = DeltaTable(str(tmp_path)).schema().fields[0]
    assert stored.type.type == delta_type
    assert stored.metadata == {"ingest.declared_type": column_type.declared}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NUMBER(39)", "precision must be between 1 and 38"),
        ("NUMBER(0)", "precision must be between 1 and 38"),
        ("NUMBER(5,6)", "scale must be between 0 and 5"),
        ("NUMBER(a)", "precision must be a whole number"),
        ("NUMBER(1,2,3)", "at most 2 parameter"),
        ("INT(5)", "at most 0 parameter"),
        ("VARCHAR(0)", "length must be between 1 and 16777216"),
        ("VARCHAR(16777217)", "length must be between 1 and 16777216"),
        ("BINARY(8388609)", "length must be between 1 and 8388608"),
        ("TIMESTAMP(10)", "precision must be between 0 and 9"),
        ("BOOLEAN(1)", "at most 0 parameter"),
        ("BLOB", "unknown column type 'BLOB'"),
        ("", "unknown column type"),
        ("VARCHAR(10) extra", "unexpected text 'extra'"),
    ],
)
def test_invalid_declarations_name_the_problem(text, message):
    with pytest.raises(SchemaError, match=message):
        ColumnType.parse(text)


@pytest.mark.parametrize("text", ["GEOGRAPHY", "GEOMETRY", "geography"])
def test_geo_types_are_recognised_and_refused(text):
    with pytest.raises(UnsupportedFeatureError, match="not supported by streaming ingest"):
        ColumnType.parse(text)


def test_non_string_declaration_is_a_schema_error():
    with pytest.raises(SchemaError, match="must be a string"):
        ColumnType.parse(5)  # type: ignore[arg-type]


def test_kind_and_parameters_are_exposed():
    column_type = ColumnType.parse("NUMBER(12,3)")
    assert (column_type.kind, column_type.precision, column_type.scale) == (TypeKind.NUMBER, 12, 3)
    assert ColumnType.parse("VARCHAR(4)").length == 4
    assert str(ColumnType.parse("time(2)")) == "TIME(2)"
