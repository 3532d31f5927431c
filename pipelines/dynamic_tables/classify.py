"""Whether a dynamic table's query can refresh incrementally, decided from Spark's
analyzed plan (the plan that will run), never from the text.

The first class of incremental refresh is **stateless**: every output row comes from
exactly one source row (projections, deterministic expressions, filters, UNION ALL,
subqueries in FROM and CTEs of those), so the net change of the output is the query
run over the sources' net changes, with the row id passed through. Everything else
refreshes FULL, with a reason code per construct that keeps it from being stateless
(documented in docs/dynamic-tables.md); later work turns most of them incremental.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipelines.sql.plan_guard import analyzed_nodes
from pipelines.sql.time_literals import TIME_FUNCTIONS, special_cast

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["REASONS", "PlanClass", "classify"]

#: Plan nodes a stateless query is made of (a source view is a leaf of the walk).
STATELESS_NODES = frozenset({
    "Project", "Filter", "Union", "SubqueryAlias", "WithCTE", "CTERelationDef",
    "CTERelationRef", "RepartitionByExpression", "Repartition", "RebalancePartitions",
})  # fmt: skip

#: Plan nodes that keep a query from being stateless, by reason code.
_NODE_REASONS = {
    "Aggregate": "AGGREGATE", "Expand": "AGGREGATE", "Pivot": "AGGREGATE",
    "Join": "JOIN", "LateralJoin": "LATERAL",
    "Window": "WINDOW", "WindowGroupLimit": "WINDOW",
    "Distinct": "DISTINCT", "Deduplicate": "DISTINCT",
    "Intersect": "SET_OPERATION", "Except": "SET_OPERATION",
    "GlobalLimit": "LIMIT", "LocalLimit": "LIMIT", "Offset": "LIMIT", "Tail": "LIMIT",
    "Sort": "ORDER_BY",
    "Generate": "GENERATOR",
    "Sample": "SAMPLE",
    "OneRowRelation": "CONSTANT_RELATION", "LocalRelation": "CONSTANT_RELATION",
    "Range": "CONSTANT_RELATION",
}  # fmt: skip

#: Expressions that run a query of their own: a subquery outside FROM.
_SUBQUERIES = frozenset({"ScalarSubquery", "Exists", "InSubquery", "ListQuery",
                         "LateralSubquery"})  # fmt: skip


#: Every reason code, with what it means (the docs list the same).
REASONS = {
    "AGGREGATE": "GROUP BY, aggregate functions, PIVOT, GROUPING SETS",
    "JOIN": "a join of any kind",
    "LATERAL": "a LATERAL subquery",
    "WINDOW": "a window function (OVER, QUALIFY)",
    "DISTINCT": "DISTINCT or UNION without ALL",
    "SET_OPERATION": "INTERSECT or EXCEPT",
    "LIMIT": "LIMIT or OFFSET",
    "ORDER_BY": "ORDER BY",
    "GENERATOR": "explode, LATERAL VIEW, inline, stack, json_tuple, a table function",
    "SAMPLE": "TABLESAMPLE",
    "CONSTANT_RELATION": "rows not read from a table (VALUES, SELECT without FROM, range)",
    "SUBQUERY_OUTSIDE_FROM": "a subquery outside FROM (EXISTS, IN (SELECT ...), scalar)",
    "NON_DETERMINISTIC": "a non-deterministic function (rand, uuid, ...)",
    "TIME_DEPENDENT": "a function of the current time (current_timestamp, ...), or a "
                      "special datetime value ('now', 'today', ...) in a literal or a cast",
    "UNSUPPORTED": "a plan node the classifier does not know (fails closed)",
    "REWRITE_UNSUPPORTED": "a construct the rewrite cannot carry as written (struct(*))",
}


#: Reasons of the stateless check that the query-delta engine may take over.
ENGINE_REASONS = frozenset({"AGGREGATE", "JOIN", "WINDOW", "DISTINCT", "SET_OPERATION",
                            "SUBQUERY_OUTSIDE_FROM", "REWRITE_UNSUPPORTED", "GENERATOR",
                            "CONSTANT_RELATION"})  # fmt: skip


@dataclass(frozen=True, slots=True)
class PlanClass:
    """The verdict on one query: stateless (incremental) or not, and why not.

    ``reasons`` are ``CODE`` or ``CODE:detail`` (the function or plan node), sorted,
    each once; empty exactly when ``incremental``."""

    reasons: tuple[str, ...]
    #: Maintained by the query-delta engine (not the stateless rewrite).
    engine: bool = False
    #: The aggregation state a table of the engine keeps (hidden ``pa.Field``s).
    state: tuple[Any, ...] = ()

    @property
    def incremental(self) -> bool:
        return not self.reasons

    @property
    def engine_may_cover(self) -> bool:
        """Whether every reason is one the query-delta engine may cover (its own check
        of the optimized plan decides)."""
        return bool(self.reasons) and all(
            reason.split(":")[0] in ENGINE_REASONS for reason in self.reasons
        )

    @property
    def reason_text(self) -> str:
        """The reasons as SHOW DYNAMIC TABLES' refresh_mode_reason shows them."""
        return ", ".join(self.reasons)


class _Traits:
    """Per expression class, whether it is one of Spark's non-deterministic ones (one
    JVM call per class, not per node)."""

    def __init__(self, spark: SparkSession) -> None:
        jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self._trait = jvm.java.lang.Class.forName(
            "org.apache.spark.sql.catalyst.expressions.Nondeterministic"
        )
        self._known: dict[str, bool] = {}

    def nondeterministic(self, name: str, node: Any) -> bool:
        known = self._known.get(name)
        if known is None:
            known = self._known[name] = bool(self._trait.isInstance(node))
        return known


def classify(
    spark: SparkSession, frame: DataFrame, sources: Collection[str],
    time_literals: Collection[str] = (),
) -> PlanClass:  # fmt: skip
    """The refresh class of a bound, guarded query (``sources``: the binder's views;
    ``time_literals``: its typed literals of the current time, ``TIMESTAMP'now'``).

    Fails closed: a plan node not known to be stateless is a reason, named."""
    traits = _Traits(spark)
    reasons = {f"TIME_DEPENDENT:{literal}" for literal in time_literals}
    for name, node, is_plan in analyzed_nodes(spark, frame, sources):
        if name == "Cast" and not is_plan:
            cast = special_cast(node)  # CAST('now' AS TIMESTAMP), d = 'today'
            if cast is not None:
                reasons.add(f"TIME_DEPENDENT:{cast}")
                continue
        if is_plan:
            if name in STATELESS_NODES:
                continue
            code = _NODE_REASONS.get(name)
            reasons.add(code if code else f"UNSUPPORTED:{name}")
        elif name in _SUBQUERIES:
            reasons.add("SUBQUERY_OUTSIDE_FROM")
        elif name in TIME_FUNCTIONS:
            reasons.add(f"TIME_DEPENDENT:{_function(node, name)}")
        elif traits.nondeterministic(name, node):
            reasons.add(f"NON_DETERMINISTIC:{_function(node, name)}")
    return PlanClass(tuple(sorted(reasons)))


def _function(node: Any, name: str) -> str:
    try:
        return str(node.prettyName())
    except Exception:  # an expression without a pretty name: its class says enough
        return name
