"""The pipeline layer: a SQL session on Spark, DML as change sets keyed by the hidden
row id, and streams with exactly-once consumption.

    from pipelines import Session
    with Session(warehouse="warehouse") as session:
        session.sql("CREATE STREAM s ON TABLE t")
        session.sql("INSERT INTO t2 SELECT a FROM s")   # consumes s when it commits
"""

from pipelines.changes import ChangeMode
from pipelines.errors import (
    ObjectNotFoundError,
    SqlError,
    StreamConflictError,
    StreamStaleError,
    TransactionConflictError,
    UnsupportedStatementError,
)
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
]
