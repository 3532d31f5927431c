"""SHOW PENDING COMMITS and ABANDON COMMIT: the operator's view of multi-table commits
in flight, and the way out of one that outside damage keeps from completing (see
:mod:`pipelines.transactions.commit_admin`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flush.spark_tables import rows_frame
from pipelines.sql.ddl_common import status_frame
from pipelines.transactions.commit_admin import abandon_commit, pending_status

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.sql.statements import Statement

__all__ = ["abandon_commit_statement", "show_pending_commits"]

_SCHEMA = (
    "id BIGINT, state STRING, owner_alive BOOLEAN, age_seconds DOUBLE, tables STRING, "
    "landed_in STRING, streams STRING, statement STRING"
)


def show_pending_commits(session: StatementContext, statement: Statement) -> DataFrame:
    rows = [(s.id, s.state, s.owner_alive, round(s.age_seconds, 3), ", ".join(s.tables),
             ", ".join(s.landed), ", ".join(s.streams), s.statement)
            for s in pending_status(session.catalog)]  # fmt: skip
    return rows_frame(session.spark, rows, _SCHEMA)


def abandon_commit_statement(session: StatementContext, statement: Statement) -> DataFrame:
    return status_frame(session, abandon_commit(session.catalog, int(statement.parts["id"] or 0)))
