"""The catalog: databases, schemas, tables, channels, row-id sequences, streams and
pending pipeline commits. SQLite by default; nothing here imports a layer above."""

from catalog.base import (
    Catalog,
    ObjectAlreadyExistsError,
    ObjectNotEmptyError,
    StreamClaimConflict,
)
from catalog.records import (
    ChannelProgress,
    ChannelRecord,
    CommitRecord,
    DatabaseRecord,
    PendingCommit,
    SchemaRecord,
    StreamClaim,
    StreamRecord,
    TableInfo,
    full_name,
)
from catalog.sqlite import SqliteCatalog

__all__ = [
    "Catalog",
    "ChannelProgress",
    "ChannelRecord",
    "CommitRecord",
    "DatabaseRecord",
    "ObjectAlreadyExistsError",
    "ObjectNotEmptyError",
    "PendingCommit",
    "SchemaRecord",
    "SqliteCatalog",
    "StreamClaim",
    "StreamClaimConflict",
    "StreamRecord",
    "TableInfo",
    "full_name",
]
