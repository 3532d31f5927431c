"""Converted batches are plain Delta data: delta-rs and Spark read them without custom code."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from deltalake import DeltaTable, write_deltalake

from flush.spark_tables import read_delta
from ingest_sdk import TableSchema, convert_rows

SCHEMA = TableSchema.parse(
    {
        "ID": "NUMBER(18,0) NOT NULL",
        "BIG": "INT",
        "AMOUNT": "NUMBER(10,2)",
        "F": "FLOAT",
        "S": "VARCHAR(20)",
        "BIN": "BINARY",
        "OK": "BOOLEAN",
        "D": "DATE",
        "T": "TIME(6)",
        "NTZ": "TIMESTAMP_NTZ(6)",
        "LTZ": "TIMESTAMP_LTZ(6)",
        "V": "VARIANT",
    }
)
ROWS = [
    {
        "ID": 1,
        "BIG": 10**30,
        "AMOUNT": "12.345",
        "F": 0.5,
        "S": "héllo",
        "BIN": "cafe",
        "OK": "yes",
        "D": "0001-01-01",
        "T": "20:57:01.123456",
        "NTZ": "2013-04-28 20:57:01.5",
        "LTZ": "2013-04-28T20:57:01+07:00",
        "V": {"k": [1, 2]},
    },
    {"ID": 2, "D": "2013-04-28"},
]
EXPECTED = [
    {
        "ID": 1,
        "BIG": Decimal(10**30),
        "AMOUNT": Decimal("12.35"),
        "F": 0.5,
        "S": "héllo",
        "BIN": b"\xca\xfe",
        "OK": True,
        "D": date(1, 1, 1),
        "T": "20:57:01.123456",
        "NTZ": datetime(2013, 4, 28, 20, 57, 1, 500000),
        "LTZ": datetime(2013, 4, 28, 13, 57, 1, tzinfo=UTC),
        "V": '{"k":[1,2]}',
    },
    {
        "ID": 2,
        "BIG": None,
        "AMOUNT": None,
        "F": None,
        "S": None,
        "BIN": None,
        "OK": None,
        "D": date(2013, 4, 28),
        "T": None,
        "NTZ": None,
        "LTZ": None,
        "V": None,
    },
]


@pytest.fixture(scope="module")
def table_uri(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("storage"))
    batch, _ = convert_rows(SCHEMA, ROWS)
    write_deltalake(uri, batch)
    return uri


def test_delta_rs_reads_back_values_types_and_declared_types(table_uri):
    table = DeltaTable(table_uri)
    assert table.to_pyarrow_table().sort_by("ID").to_pylist() == EXPECTED
    import pyarrow as pa

    assert TableSchema.from_arrow(pa.schema(table.schema())) == SCHEMA


def test_spark_reads_back_values_and_types(spark, table_uri):
    frame = read_delta(spark, table_uri)
    types = dict(frame.dtypes)
    assert types == {
        "ID": "bigint",
        "BIG": "decimal(38,0)",
        "AMOUNT": "decimal(10,2)",
        "F": "double",
        "S": "string",
        "BIN": "binary",
        "OK": "boolean",
        "D": "date",
        "T": "string",
        "NTZ": "timestamp_ntz",
        "LTZ": "timestamp",
        "V": "string",
    }
    rows = [row.asDict() for row in frame.orderBy("ID").collect()]
    # Spark returns LTZ instants as naive datetimes in the session zone (UTC here).
    expected = [dict(row, LTZ=row["LTZ"] and row["LTZ"].replace(tzinfo=None)) for row in EXPECTED]
    assert [dict(row, BIN=row["BIN"] and bytes(row["BIN"])) for row in rows] == expected
