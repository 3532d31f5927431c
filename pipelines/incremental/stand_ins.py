"""The engine's glue to our tables, shared by every reader of a query's change (dynamic
tables' refreshes, streams on views): the query's optimized plan over stand-ins of its
source tables, and which table each leaf of the plan reads.

The query is bound by the caller (``bind`` gets the frame each source table reads as
and returns the text Spark runs), so this layer knows nothing of SQL binding; the
stand-ins carry each table's schema and no rows, in a form the optimizer cannot fold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flush.tables import ROW_ID_COLUMN, delta_schema
from pipelines.incremental import algebraic
from pipelines.incremental.algebraic import Layout
from pipelines.incremental.coverage import unsupported
from pipelines.incremental.delta import Deltas, Source
from pipelines.incremental.plan import Node, PlanReader

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from catalog import TableInfo

__all__ = ["EnginePlan", "engine", "plan_over_stand_ins", "stand_in_schema"]


@dataclass
class EnginePlan:
    """The optimized plan of a query over stand-ins, and which table each leaf reads."""

    reader: PlanReader
    root: Node
    #: Each table's stand-ins, as their optimized plans (JVM), by table id.
    stand_ins: dict[int, list[Any]] = field(default_factory=dict)
    #: The frame the bound query gave (over the stand-ins): its columns' names.
    frame: DataFrame | None = None
    #: What the engine derives from the plan alone, made once per plan (a plan kept
    #: between refreshes, :mod:`.plan_cache`, keeps them too): each operator's subquery
    #: plans and each leaf's binding columns (:class:`~.delta.Deltas`).
    subqueries: dict[int, list[tuple[Any, Node]]] = field(default_factory=dict)
    binders: dict[tuple[int, tuple[str, ...]], list[Any]] = field(default_factory=dict)
    _reasons: list[str] | None = None
    _state: tuple[Layout | None] | None = None

    def table_of(self, leaf: Node) -> int | None:
        """The id of the table a leaf of the plan reads (None: not one of ours)."""
        for table_id, plans in self.stand_ins.items():
            if any(leaf.jvm.sameResult(plan) for plan in plans):
                return table_id
        return None

    def reasons(self) -> list[str]:
        """What keeps the engine from the plan (empty: it maintains it)."""
        if self._reasons is None:
            self._reasons = unsupported(self.reader, self.root,
                                        lambda n: self.table_of(n) is not None)  # fmt: skip
        return list(self._reasons)

    def state(self) -> Layout | None:
        """The aggregation state a table of this query can keep (:mod:`.algebraic`)."""
        if self._state is None:
            self._state = (algebraic.layout(self.reader, self.root),)
        return self._state[0]


def stand_in_schema(info: TableInfo) -> StructType:
    """The schema of a table's stand-in: its user columns (no row id), nullability kept."""
    from pyspark.sql.pandas.types import from_arrow_schema

    columns = delta_schema(info.schema)
    return from_arrow_schema(columns.remove(columns.get_field_index(ROW_ID_COLUMN)))


def plan_over_stand_ins(
    spark: SparkSession,
    run: Callable[[str], DataFrame],
    bind: Callable[[Callable[[TableInfo], DataFrame]], str],
) -> EnginePlan:
    """The plan of the query ``bind`` binds (given the frame each source table reads as),
    its sources standing in as empty relations Spark cannot fold; ``run`` turns the
    bound text into its DataFrame (the session's guarded run)."""
    plan = EnginePlan(PlanReader(spark), root=None)  # type: ignore[arg-type]

    def stand_in(info: TableInfo) -> DataFrame:
        frame = spark.createDataFrame(spark.sparkContext.emptyRDD(), stand_in_schema(info))
        optimized = frame._jdf.queryExecution().optimizedPlan()
        plan.stand_ins.setdefault(info.id, []).append(optimized)
        return frame

    plan.frame = run(bind(stand_in))
    plan.root = plan.reader.optimized(plan.frame)
    return plan


def engine(
    plan: EnginePlan, sources: Mapping[int, Source], kept: Callable[[], DataFrame] | None = None,
    state: Layout | None = None,
) -> Deltas:
    """The engine over ``plan`` reading ``sources`` (by table id); ``kept``: the query's
    rows at the old versions as a table holds them, ``state``: the aggregation state it
    keeps (:class:`Deltas`)."""

    def source(leaf: Node) -> Source:
        table_id = plan.table_of(leaf)
        assert table_id is not None
        return sources[table_id]

    return Deltas(plan.reader, plan.root, source, kept, state, memo=(plan.subqueries, plan.binders))
