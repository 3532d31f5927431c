"""A table's commit log as users see it: ``DESCRIBE HISTORY t``, and whether commits after
a version changed data (``SYSTEM$STREAM_HAS_DATA``).

Every writer of a table records who it is in the commit metadata: a flush of channels
under ``ingest`` (each channel's generation, batch and new offset token, the rows), a
SQL statement under ``ingest.pipelines`` (the statement text and the pipeline commit),
compaction under ``ingest.compaction`` (its run) and the Spark sink under
``ingest.batch`` (writer and micro-batch). History shows those, never the table's
folder (Delta's CREATE TABLE entry names it; it is left out).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flush.batch_commit import BATCH_METADATA_KEY
from flush.change_commit import PIPELINE_METADATA_KEY
from flush.commit import COMMIT_METADATA_KEY
from flush.spark_tables import rows_frame
from flush.tables import commit_history
from pipelines.sql.ddl_common import utc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.sql.statements import Statement

__all__ = ["HISTORY_SCHEMA", "commit_writer", "data_changed", "describe_history"]

_COMPACTION_KEY = "ingest.compaction"
#: Our commit metadata keys, and the name of the writer each one marks.
_SOURCES = {
    COMMIT_METADATA_KEY: "INGEST",
    PIPELINE_METADATA_KEY: "SQL",
    _COMPACTION_KEY: "COMPACTION",
    BATCH_METADATA_KEY: "SPARK_SINK",
}
HISTORY_SCHEMA = (
    "version BIGINT, timestamp TIMESTAMP, operation STRING, source STRING, statement STRING, "
    "metadata STRING, operation_metrics STRING"
)


def commit_writer(entry: dict[str, Any]) -> tuple[str | None, Any]:
    """The writer of a commit and what it recorded (JSON values decoded)."""
    for key, source in _SOURCES.items():
        value = entry.get(key)
        if value is None:
            continue
        if key == _COMPACTION_KEY:
            return source, {"run": value}
        try:
            decoded = json.loads(value) if isinstance(value, str) else value
        except ValueError:
            return source, value
        if isinstance(decoded, dict) and "dynamic_table" in decoded:
            return "DYNAMIC_TABLE", decoded  # a refresh (its commit goes the SQL way)
        return source, decoded
    return None, None


def _row(entry: dict[str, Any]) -> tuple[Any, ...]:
    source, recorded = commit_writer(entry)
    statement = recorded.get("statement") if isinstance(recorded, dict) else None
    metrics = entry.get("operationMetrics")
    return (
        int(entry["version"]),
        utc(int(entry.get("timestamp", 0)) / 1000),
        str(entry.get("operation", "")),
        source,
        statement if source == "SQL" else None,
        json.dumps(recorded, sort_keys=True) if recorded is not None else None,
        json.dumps(metrics, sort_keys=True) if metrics else None,
    )


def describe_history(session: StatementContext, statement: Statement) -> DataFrame:
    """``DESCRIBE HISTORY t``: one row per version still in the table's log, newest first:
    ``version``, ``timestamp`` (UTC, the writer's clock), Delta's ``operation``, our
    ``source`` (``INGEST``, ``SQL``, ``COMPACTION``, ``SPARK_SINK``, or NULL for Delta's
    own entries such as CREATE TABLE), the SQL ``statement``, the recorded ``metadata``
    and Delta's ``operation_metrics`` (merges count the rows they touched), as JSON."""
    info = session.require_table(statement.parts["name"] or "")
    _, entries = commit_history(info.uri)
    rows = [_row(entry) for entry in sorted(entries, key=lambda e: -int(e["version"]))]
    return rows_frame(session.spark, rows, HISTORY_SCHEMA)


def data_changed(table_uri: str, after: int, to: int) -> bool:
    """Whether a commit in versions ``(after, to]`` added or removed data (an add,
    remove or change-data file with ``dataChange``).

    Compaction (files rewritten with ``dataChange=false``) and commits of app
    transactions alone (a consumption that wrote nothing) do not count; rows inserted
    and deleted again do (the net change may be empty: like the reference system's
    SYSTEM$STREAM_HAS_DATA this may answer true for an empty stream, never false for one
    with changes). A commit file log cleanup removed counts as a change.
    """
    log = Path(table_uri) / "_delta_log"
    for version in range(after + 1, to + 1):
        try:
            text = (log / f"{version:020d}.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            return True  # no false negatives: the commit cannot be read, assume data
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            for kind in ("add", "remove"):
                if kind in action and action[kind].get("dataChange", True):
                    return True
            if "cdc" in action:
                return True
    return False
