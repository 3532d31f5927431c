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
from pipelines.session import Session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
]


def register_data_sources(spark: SparkSession) -> None:
    """Make ``format("ingest-changes")`` (change rows, batch and streaming) and
    ``format("ingest")`` (append, batch and streaming) known to ``spark``."""
    from pipelines.change_source import ChangesDataSource
    from pipelines.table_sink import TableSinkDataSource

    spark.dataSource.register(ChangesDataSource)
    spark.dataSource.register(TableSinkDataSource)
