"""Dynamic tables whose rows the query-delta engine maintains (row ids DERIVED): joins,
aggregates, windows with PARTITION BY, semi and anti joins (EXISTS, IN, NOT IN) and
outer joins, composed with filters, projections and UNION ALL (:mod:`pipelines.incremental`).

The definition's query is bound over stand-ins of its sources (their schema, no rows)
and Spark's optimized plan of it says which operators the refresh evaluates; each
source of the plan is then read at the versions the refresh pins: the rows at the
version the last refresh read, at the version it reads now, and the net change between.
The generic part (the plan over stand-ins, a table as a source) lives below, shared
with streams on views: :mod:`pipelines.incremental.stand_ins`,
:mod:`pipelines.transactions.table_sources`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipelines.incremental import plan_cache, stand_ins
from pipelines.incremental.stand_ins import EnginePlan, engine
from pipelines.transactions import table_sources

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from catalog import TableInfo
    from pipelines.sql.binding import Binder
    from pipelines.sql.context import StatementContext

__all__ = [
    "EnginePlan", "TableSource", "cached_plan_over_stand_ins", "engine", "plan_over_stand_ins",
]  # fmt: skip


def plan_over_stand_ins(
    session: StatementContext, bind: Callable[[Callable[[TableInfo], DataFrame]], str]
) -> EnginePlan:
    """The plan of the query ``bind`` binds (given the frame each source table reads as),
    its sources standing in as empty relations Spark cannot fold."""
    return stand_ins.plan_over_stand_ins(session.spark, session.run_spark, bind)


def cached_plan_over_stand_ins(
    session: StatementContext,
    bind: Callable[[Callable[[TableInfo], DataFrame]], tuple[Binder, str]],
) -> EnginePlan:
    """:func:`plan_over_stand_ins`, kept between refreshes
    (:mod:`pipelines.incremental.plan_cache`): ``bind`` gives the binder and the bound
    text, which with the stand-in views it made key the plan."""

    def bound(frames: Callable[[TableInfo], DataFrame]) -> tuple[str, Mapping[str, TableInfo]]:
        binder, text = bind(frames)
        return text, binder.source_views

    return plan_cache.cached_plan(session.spark, session.run_spark, bound)


@dataclass(init=False)
class TableSource(table_sources.TableSource):
    """A source table read at the refresh's versions (``after`` None: no old version)."""

    def __init__(
        self, session: StatementContext, info: TableInfo, after: int | None, to: int
    ) -> None:
        super().__init__(session.spark, info, after, to)
