"""Client SDK for streaming ingest: column types, value conversion and (later) channels.

The public names are re-exported here; import from ``ingest_sdk`` only.
"""

from ingest_sdk.column_types import DECLARED_TYPE_KEY, ColumnType, TypeKind
from ingest_sdk.errors import (
    ConfigurationError,
    IngestError,
    InsertValidationError,
    InvalidTypeError,
    InvalidValueError,
    SchemaError,
    UnsupportedFeatureError,
    ValueConversionError,
)
from ingest_sdk.rows import ConversionOptions, convert_rows, convert_value
from ingest_sdk.schema import Column, TableSchema, normalize_identifier
from ingest_sdk.validation import InsertError, InsertValidationResponse, OnErrorOption

__all__ = [
    "DECLARED_TYPE_KEY",
    "Column",
    "ColumnType",
    "ConfigurationError",
    "ConversionOptions",
    "IngestError",
    "InsertError",
    "InsertValidationError",
    "InsertValidationResponse",
    "InvalidTypeError",
    "InvalidValueError",
    "OnErrorOption",
    "SchemaError",
    "TableSchema",
    "TypeKind",
    "UnsupportedFeatureError",
    "ValueConversionError",
    "convert_rows",
    "convert_value",
    "normalize_identifier",
]
