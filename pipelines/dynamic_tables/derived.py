"""Dynamic tables whose rows the query-delta engine maintains (row ids DERIVED): joins,
aggregates, windows with PARTITION BY, semi and anti joins (EXISTS, IN, NOT IN) and
outer joins, composed with filters, projections and UNION ALL (:mod:`pipelines.incremental`).

The definition's query is bound over stand-ins of its sources (their schema, no rows)
and Spark's optimized plan of it says which operators the refresh evaluates; each
source of the plan is then read at the versions the refresh pins: the rows at the
version the last refresh read, at the version it reads now, and the net change between.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flush.tables import ROW_ID_COLUMN, delta_schema
from pipelines.change_sets import STREAM_ACTION, STREAM_ROW_ID
from pipelines.incremental.delta import ID, SIGN, Deltas, Source, unsupported
from pipelines.incremental.plan import Node, PlanReader
from pipelines.streams.changes import read_changes
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from catalog import TableInfo
    from pipelines.sql.context import StatementContext

__all__ = ["EnginePlan", "TableSource", "plan_over_stand_ins"]


@dataclass
class EnginePlan:
    """The optimized plan of a query over stand-ins, and which table each leaf reads."""

    reader: PlanReader
    root: Node
    #: Each table's stand-ins, as their optimized plans (JVM), by table id.
    stand_ins: dict[int, list[Any]] = field(default_factory=dict)

    def table_of(self, leaf: Node) -> int | None:
        """The id of the table a leaf of the plan reads (None: not one of ours)."""
        for table_id, plans in self.stand_ins.items():
            if any(leaf.jvm.sameResult(plan) for plan in plans):
                return table_id
        return None

    def reasons(self) -> list[str]:
        """What keeps the engine from the plan (empty: it maintains it)."""
        return unsupported(self.reader, self.root, lambda n: self.table_of(n) is not None)


def plan_over_stand_ins(
    session: StatementContext, bind: Callable[[Callable[[TableInfo], DataFrame]], str]
) -> EnginePlan:
    """The plan of the query ``bind`` binds (given the frame each source table reads as),
    its sources standing in as empty relations Spark cannot fold."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark = session.spark
    plan = EnginePlan(PlanReader(spark), root=None)  # type: ignore[arg-type]

    def stand_in(info: TableInfo) -> DataFrame:
        schema = from_arrow_schema(delta_schema(info.schema).remove(
            delta_schema(info.schema).get_field_index(ROW_ID_COLUMN)))  # fmt: skip
        frame = spark.createDataFrame(spark.sparkContext.emptyRDD(), schema)
        optimized = frame._jdf.queryExecution().optimizedPlan()
        plan.stand_ins.setdefault(info.id, []).append(optimized)
        return frame

    frame = session.run_spark(bind(stand_in))
    plan.root = plan.reader.optimized(frame)
    return plan


@dataclass
class TableSource(Source):
    """A source table read at the refresh's versions (``after`` None: no old version)."""

    session: StatementContext
    info: TableInfo
    after: int | None
    to: int
    _changes: DataFrame | None = None

    def _columns(self, frame: DataFrame, extra: Sequence[Any]) -> DataFrame:
        from pyspark.sql import functions as F

        names = ["`" + n.replace("`", "``") + "`" for n in self.info.schema.names]
        return frame.select(*[F.col(n) for n in names], *extra)

    def _at(self, version: int) -> DataFrame:
        txn = Transaction(self.session.catalog, self.session.spark, read_only=True)
        txn.versions[self.info.id] = version
        frame = txn.table_frame(self.info, row_ids=True)
        return self._columns(frame, [ROW_ID_COLUMN]).withColumnRenamed(ROW_ID_COLUMN, ID)

    def old(self) -> DataFrame:
        assert self.after is not None
        return self._at(self.after)

    def unchanged(self) -> bool:
        return self.after == self.to

    def new(self) -> DataFrame:
        return self._at(self.to)

    def changes(self) -> DataFrame:
        from pyspark.sql import functions as F

        if self._changes is None:
            after = self.after if self.after is not None else -1
            frame = read_changes(self.session.spark, self.info.uri, self.info.schema,
                                 after, self.to)  # fmt: skip
            sign = F.when(F.col(f"`{STREAM_ACTION}`") == "INSERT", 1).otherwise(-1)
            self._changes = self._columns(frame, [
                F.col(f"`{STREAM_ROW_ID}`").alias(ID), sign.alias(SIGN)])  # fmt: skip
        return self._changes


def engine(plan: EnginePlan, sources: dict[int, TableSource]) -> Deltas:
    """The engine over ``plan`` reading ``sources`` (by table id)."""

    def source(leaf: Node) -> Source:
        table_id = plan.table_of(leaf)
        assert table_id is not None
        return sources[table_id]

    return Deltas(plan.reader, plan.root, source)
