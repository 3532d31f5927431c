"""The catalog: databases, schemas, tables, channels, row-id sequences, streams, views and
pending pipeline commits. SQLite by default; nothing here imports a layer above."""

from catalog.base import (
    Catalog,
    CommitGoneError,
    IntentConflict,
    ObjectAlreadyExistsError,
    ObjectNotEmptyError,
    StreamClaimConflict,
    TableBusyError,
    TablesGoneError,
)
from catalog.records import (
    APPEND_INTENT,
    ROWS_INTENT,
    ChannelProgress,
    ChannelRecord,
    CommitIntent,
    CommitRecord,
    DatabaseRecord,
    PendingCommit,
    SchemaRecord,
    StreamClaim,
    StreamRecord,
    TableInfo,
    ViewRecord,
    full_name,
)
from catalog.sqlite import SqliteCatalog

__all__ = [
    "APPEND_INTENT",
    "ROWS_INTENT",
    "Catalog",
    "ChannelProgress",
    "ChannelRecord",
    "CommitGoneError",
    "CommitIntent",
    "CommitRecord",
    "DatabaseRecord",
    "IntentConflict",
    "ObjectAlreadyExistsError",
    "ObjectNotEmptyError",
    "PendingCommit",
    "SchemaRecord",
    "SqliteCatalog",
    "StreamClaim",
    "StreamClaimConflict",
    "StreamRecord",
    "TableBusyError",
    "TableInfo",
    "TablesGoneError",
    "ViewRecord",
    "full_name",
]
