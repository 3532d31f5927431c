"""The pipeline layer: a SQL session on Spark, DML as change sets keyed by the hidden
row id, and streams with exactly-once consumption.

    from pipelines import Session
    with Session(warehouse="warehouse") as session:
        session.sql("CREATE STREAM s ON TABLE t")
        session.sql("INSERT INTO t2 SELECT a FROM s")   # consumes s when it commits
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.changes import ChangeMode
from pipelines.errors import (
    ObjectNotFoundError,
    SqlError,
    StreamConflictError,
    StreamStaleError,
    TransactionConflictError,
    UnsupportedStatementError,
    evaluation_errors,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipelines.session import Session

__all__ = [
    "ChangeMode",
    "ObjectNotFoundError",
    "Session",
    "SqlError",
    "StreamConflictError",
    "StreamStaleError",
    "TransactionConflictError",
    "UnsupportedStatementError",
    "evaluation_errors",
    "register_data_sources",
    "source_errors",
]

from pipelines.source_options import source_errors


def __getattr__(name: str) -> object:
    """``Session`` is imported on first use: the CLI's ``--url`` mode and the service's
    HTTP side import this package without needing the session (and its imports)."""
    if name == "Session":
        from pipelines.session import Session

        return Session
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")


def register_data_sources(spark: SparkSession) -> None:
    """Make ``format("ingest-changes")`` (change rows, batch and streaming) and
    ``format("ingest")`` (append, batch and streaming) known to ``spark``."""
    from pipelines.change_source import ChangesDataSource
    from pipelines.table_sink import TableSinkDataSource

    spark.dataSource.register(ChangesDataSource)
    spark.dataSource.register(TableSinkDataSource)
