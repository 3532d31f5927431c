"""Client SDK for streaming ingest: clients and channels, column types and value conversion.

The public names are re-exported here; import from ``ingest_sdk`` only.
"""

from ingest_sdk.change_records import (
    ChangeRecord,
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
    record_from_json,
)
from ingest_sdk.change_stream_reader import ChangeStreamReader, CheckpointPolicy
from ingest_sdk.channel import AsyncChannel
from ingest_sdk.client import AsyncStreamingIngestClient, ClientLimits, OpenChannelRequest
from ingest_sdk.column_types import DECLARED_TYPE_KEY, ColumnType, TypeKind
from ingest_sdk.errors import (
    AuthenticationError,
    BackpressureError,
    ChannelClosedError,
    ChannelInvalidatedError,
    ChannelNotFoundError,
    CommitTimeoutError,
    ConfigurationError,
    IngestError,
    InsertValidationError,
    InvalidRequestError,
    InvalidTypeError,
    InvalidValueError,
    MalformedRecordError,
    SchemaError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
    TableAlreadyExistsError,
    TableBusyError,
    TableNotFoundError,
    TransportError,
    UnsupportedFeatureError,
    ValueConversionError,
)
from ingest_sdk.rows import ConversionOptions, convert_rows, convert_value
from ingest_sdk.schema import Column, TableSchema, normalize_identifier
from ingest_sdk.sync_client import Channel, StreamingIngestClient
from ingest_sdk.transport import RetryPolicy, Timeouts
from ingest_sdk.validation import (
    ChannelStatus,
    InsertError,
    InsertValidationResponse,
    OnErrorOption,
)

__all__ = [
    "DECLARED_TYPE_KEY",
    "AsyncChannel",
    "AsyncStreamingIngestClient",
    "AuthenticationError",
    "BackpressureError",
    "ChangeRecord",
    "ChangeStreamReader",
    "Channel",
    "ChannelClosedError",
    "ChannelInvalidatedError",
    "ChannelNotFoundError",
    "ChannelStatus",
    "CheckpointPolicy",
    "ChildPartition",
    "ChildPartitionsRecord",
    "ClientLimits",
    "Column",
    "ColumnType",
    "CommitTimeoutError",
    "ConfigurationError",
    "ConversionOptions",
    "DataChangeRecord",
    "HeartbeatRecord",
    "IngestError",
    "InsertError",
    "InsertValidationError",
    "InsertValidationResponse",
    "InvalidRequestError",
    "InvalidTypeError",
    "InvalidValueError",
    "MalformedRecordError",
    "OnErrorOption",
    "OpenChannelRequest",
    "RetryPolicy",
    "SchemaError",
    "ServerError",
    "ServiceError",
    "ServiceUnreachableError",
    "StreamingIngestClient",
    "TableAlreadyExistsError",
    "TableBusyError",
    "TableNotFoundError",
    "TableSchema",
    "Timeouts",
    "TransportError",
    "TypeKind",
    "UnsupportedFeatureError",
    "ValueConversionError",
    "convert_rows",
    "convert_value",
    "normalize_identifier",
    "record_from_json",
]
