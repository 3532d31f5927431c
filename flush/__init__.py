"""Intermediate Parquet writing, the Delta commit protocol, recovery and Spark helpers.

Nothing here speaks HTTP; the channel server calls in.
"""

from flush.catalog_tables import check_column_names, create_catalog_table, purge_dropped
from flush.commit import (
    COMMIT_METADATA_KEY,
    ChannelProgress,
    CommitRecord,
    TableWriter,
    commits_after,
    replay_commits,
)
from flush.parquet_files import WrittenFile, write_parquet_file
from flush.tables import (
    ROW_ID_COLUMN,
    arrow_filesystem,
    create_table,
    delta_schema,
    drop_table,
    new_table_folder,
    read_table,
    table_schema_of,
)

__all__ = [
    "COMMIT_METADATA_KEY",
    "ROW_ID_COLUMN",
    "ChannelProgress",
    "CommitRecord",
    "TableWriter",
    "WrittenFile",
    "arrow_filesystem",
    "check_column_names",
    "commits_after",
    "create_catalog_table",
    "create_table",
    "delta_schema",
    "drop_table",
    "new_table_folder",
    "purge_dropped",
    "read_table",
    "replay_commits",
    "table_schema_of",
    "write_parquet_file",
]
