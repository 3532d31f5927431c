"""The pipeline layer: a SQL session on Spark, DML as change sets keyed by the hidden
row id, and streams with exactly-once consumption.

    from pipelines import Session
    with Session(warehouse="warehouse") as session:
        session.sql("CREATE STREAM s ON TABLE t")
        session.sql("INSERT INTO t2 SELECT a FROM s")   # consumes s when it commits

Inside: ``session`` (the SQL session) and ``worker`` (the service's Spark worker) put
together ``sql`` (statement handlers, binder, plan guard), ``transactions``
(transactions and the consumer commit), ``streams`` (change sets between table
versions), ``incremental`` (the query-delta engine), ``dynamic_tables``,
``change_streams`` and ``spark_sources`` (the PySpark data sources); ``errors`` and
``change_sets`` (when a value changed, and the one netting of change sets) are shared by
all, and ``python -m pipelines`` is the command line.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

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

    from pipelines.change_sets import ChangeMode
    from pipelines.session import Session
    from pipelines.spark_sources.source_options import source_errors

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


def __getattr__(name: str) -> object:
    """``Session``, ``ChangeMode`` and ``source_errors`` are imported on first use: the
    CLI's ``--url`` mode and the service's HTTP side import this package without needing
    them (and their imports: the catalog, Delta, Arrow, the SDK)."""
    if name == "Session":
        from pipelines.session import Session

        return Session
    if name == "ChangeMode":
        from pipelines.change_sets import ChangeMode

        return ChangeMode
    if name == "source_errors":
        from pipelines.spark_sources.source_options import source_errors

        return source_errors
    raise AttributeError(f"module 'pipelines' has no attribute {name!r}")


_REGISTERING = threading.Lock()


def register_data_sources(spark: SparkSession) -> None:
    """Make ``format("ingest-changes")`` (change rows, batch and streaming),
    ``format("ingest-change-stream")`` (a change stream's records, batch and streaming)
    and ``format("ingest")`` (append, batch and streaming) known to ``spark``."""
    from pipelines.spark_sources.change_source import ChangesDataSource
    from pipelines.spark_sources.change_stream_source import ChangeStreamDataSource
    from pipelines.spark_sources.table_sink import TableSinkDataSource

    with _REGISTERING:  # two at once (sessions opened on two threads) make Spark refuse one
        spark.dataSource.register(ChangesDataSource)
        spark.dataSource.register(ChangeStreamDataSource)
        spark.dataSource.register(TableSinkDataSource)
