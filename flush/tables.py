"""Delta tables as this system lays them out: user columns plus a hidden row id.

Every ingested row gets a stable unique id in :data:`ROW_ID_COLUMN`, a per-table
sequence assigned at flush time and recorded in each commit's metadata, so
compaction and change tracking can follow a row. The column is marked hidden in
its field metadata and left out of the user-facing :class:`TableSchema`.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from tenacity import Retrying, retry_if_result, stop_after_attempt, wait_random

from flush.storage import delete_tree, file_names, is_object_store, join, make_folder
from ingest_sdk import SchemaError, TableSchema
from ingest_sdk.schema import spark_fold

__all__ = [
    "INGEST_DIR",
    "ROW_ID_COLUMN",
    "STATE_MARK",
    "TABLE_CONFIGURATION",
    "TXN_RETENTION",
    "TXN_RETENTION_KEY",
    "arrow_filesystem",
    "commit_history",
    "create_table",
    "delta_schema",
    "drop_table",
    "live_files",
    "live_paths",
    "logged_versions",
    "new_table_folder",
    "read_table",
    "state_columns",
    "table_schema_of",
]

ROW_ID_COLUMN = "_INGEST_ROW_ID"
HIDDEN_KEY = "ingest.hidden"
#: The hidden mark of a column holding a dynamic table's aggregation state.
STATE_MARK = "state"
#: Folder (inside the table) for intermediate Parquet files written by flushes.
INGEST_DIR = "_ingest"
#: How long a table keeps an app transaction that carries its time (those of pipeline
#: commits and consumptions; channel tokens carry none and stay): far longer than any
#: recovery needs, short enough that a snapshot does not grow with every commit.
TXN_RETENTION = "interval 7 days"
TXN_RETENTION_KEY = "delta.setTransactionRetentionDuration"
TABLE_CONFIGURATION = {"delta.enableChangeDataFeed": "true", TXN_RETENTION_KEY: TXN_RETENTION}


def delta_schema(schema: TableSchema) -> pa.Schema:
    """The Arrow schema of the Delta table: the user's columns, then the row id."""
    row_id = pa.field(ROW_ID_COLUMN, pa.int64(), nullable=False, metadata={HIDDEN_KEY: "row_id"})
    return schema.to_arrow().append(row_id)


def state_columns(schema: pa.Schema) -> list[str]:
    """The hidden columns of a Delta schema that hold a dynamic table's aggregation
    state (marked :data:`STATE_MARK`)."""
    key, mark = HIDDEN_KEY.encode(), STATE_MARK.encode()
    return [f.name for f in schema if (f.metadata or {}).get(key) == mark]


def create_table(uri: str, schema: TableSchema, hidden: Sequence[pa.Field] = ()) -> None:
    """Create an empty Delta table; fails if one exists at ``uri``. ``hidden``: more
    hidden columns after the row id (a dynamic table's aggregation state), each marked
    in its metadata."""
    if any(spark_fold(column.name) == spark_fold(ROW_ID_COLUMN) for column in schema):
        raise SchemaError(f'the column name "{ROW_ID_COLUMN}" is reserved for the hidden row id '
                          "(Spark takes names that differ only in case for one)")  # fmt: skip
    make_folder(uri)
    from deltalake import CommitProperties

    from flush.commit_clock import COMMIT_TS_KEY, clock  # it reads this module's log helpers

    DeltaTable.create(
        uri, pa.schema([*delta_schema(schema), *hidden]), mode="error",
        configuration=TABLE_CONFIGURATION,
        commit_properties=CommitProperties(custom_metadata={COMMIT_TS_KEY: str(clock())}),
    )  # fmt: skip


def table_schema_of(table: DeltaTable) -> TableSchema:
    """The user-facing schema of a table (declared types, hidden columns left out)."""
    hidden = HIDDEN_KEY.encode()
    fields = [f for f in pa.schema(table.schema()) if hidden not in (f.metadata or {})]
    return TableSchema.from_arrow(pa.schema(fields))


def arrow_filesystem(table: DeltaTable) -> pafs.FileSystem:
    """A native pyarrow filesystem rooted at the table, for ``to_pyarrow_table`` and
    ``to_pyarrow_dataset`` (``filesystem=``).

    delta-rs reads through a filesystem written in Python by default; pyarrow releases
    it on its own threads after a scan returns, which aborts a process that exits just
    then (exit 134, see :mod:`ingest_sdk.process_exit`). A native one never calls Python.
    """
    filesystem, root = pafs.FileSystem.from_uri(table.table_uri)
    return pafs.SubTreeFileSystem(root, filesystem)


def read_table(table: DeltaTable | str, **kwargs: Any) -> pa.Table:
    """A table version's rows as Arrow, read with :func:`arrow_filesystem` (safe at exit)."""
    table = table if isinstance(table, DeltaTable) else DeltaTable(table)
    return table.to_pyarrow_table(filesystem=arrow_filesystem(table), **kwargs)


def commit_history(table_uri: str, since: int = -1) -> tuple[DeltaTable, list[dict[str, Any]]]:
    """The table, and its commits after version ``since`` (newest first) with the right
    versions: each entry as ``DeltaTable.history()`` gives it (``version``,
    ``timestamp`` in ms, the commit's metadata keys).

    delta-rs 1.6 lists every commit in the log but labels them counting down from the
    version the handle loaded, so a commit landing in between shifts every label (the
    newest commit is reported as the loaded version). The listing is kept only when no
    commit landed between the load and a reload after the listing.
    """

    def attempt() -> tuple[DeltaTable, list[dict[str, Any]]] | None:
        table = DeltaTable(table_uri)
        loaded = table.version()
        entries = table.history(limit=loaded - since) if loaded > since else []
        table.update_incremental()
        if table.version() != loaded:
            return None
        return table, [e for e in entries if int(e.get("version", -1)) > since]

    found = Retrying(
        retry=retry_if_result(lambda result: result is None),
        stop=stop_after_attempt(50),
        wait=wait_random(0, 0.05),
        retry_error_callback=lambda state: None,
    )(attempt)
    if found is None:
        raise RuntimeError(f"commits kept landing in {table_uri} while its history was read")
    return found


def logged_versions(table_uri: str) -> list[int]:
    """The versions whose commit files are still in the table's log (log cleanup
    removes the oldest once a checkpoint covers them)."""
    names = file_names(table_uri, "_delta_log", ".json")
    return [int(name.split(".")[0]) for name in names if name[0].isdigit()]


def live_files(table: DeltaTable) -> list[dict[str, Any]]:
    """The data files of a table version, one dict per add action: ``path`` (relative to
    the table, as the log holds it), ``size_bytes``, ``num_records`` and flattened stats."""
    rows: list[dict[str, Any]] = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return rows


def live_paths(table_uri: str, table: DeltaTable) -> list[str]:
    """The data files of a table version as plain paths under ``table_uri``, for Spark
    and pyarrow: ``file_uris()`` escapes them (a space becomes %20), which they read as is."""
    return [os.path.join(table_uri, f["path"]) for f in live_files(table)]


def _folder_name(part: str) -> str:
    """A readable, always-safe folder name for a name part (ASCII letters, digits, _ and -)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", part)[:48] or "_"


def new_table_folder(warehouse: str | Path, database: str, schema_name: str, name: str) -> str:
    """A folder no table has used, for a new table: ``<warehouse>/<db>/<schema>/<name>-<id>``.

    Names never become paths as they are: each part is reduced to safe characters (so
    ``..``, ``/`` or a 1,000-byte name cannot leave the warehouse or exceed a file
    system's limits) and a random suffix makes the folder unique, so a create never
    meets, let alone deletes, an existing folder. In a bucket, a prefix of the same shape.
    """
    parts = (_folder_name(database), _folder_name(schema_name),
             f"{_folder_name(name)}-{uuid.uuid4().hex[:12]}")  # fmt: skip
    if is_object_store(warehouse):
        return join(warehouse, *parts)
    root = Path(warehouse).resolve()
    folder = root.joinpath(*parts)
    if not folder.resolve().is_relative_to(root):  # cannot happen; the last line of defence
        raise ValueError(f"table folder {folder} would lie outside the warehouse {root}")
    return str(folder)


def _is_table_folder(uri: str | Path, warehouse: str | Path) -> bool:
    """Whether ``uri`` is a table folder of this warehouse: exactly three levels below it
    (database, schema, table), with no ``..`` on the way (tables made by older versions
    from names like ``".."`` fail this and are never deleted)."""
    if is_object_store(warehouse) or is_object_store(uri):
        root = str(warehouse).rstrip("/") + "/"
        below = str(uri).removeprefix(root).split("/")
        return str(uri).startswith(root) and len(below) == 3 and "" not in below \
            and not {".", ".."} & set(below)  # fmt: skip
    path = Path(uri)
    if ".." in path.parts:
        return False
    resolved, root_path = path.resolve(), Path(warehouse).resolve()
    return resolved.parent.parent.parent == root_path


def drop_table(uri: str | Path, warehouse: str | Path) -> bool:
    """Delete a table's folder (log and data files) if it is a table folder of ``warehouse``.

    Returns:
        Whether the folder was deleted; False (nothing deleted) for a path outside the
        warehouse or at the wrong depth, which only a catalog entry made by an older
        version from a hostile name can hold.
    """
    if not _is_table_folder(uri, warehouse):
        return False
    delete_tree(uri)
    return True
