"""Existence joins and uncorrelated ``EXISTS``, as the query-delta engine evaluates them
(:class:`pipelines.incremental.delta.Deltas`).

Spark plans an ``EXISTS`` or ``IN (SELECT ...)`` that it cannot turn into a semi or anti
join (inside an ``OR``, in a select list) as a ``Join`` of type
``ExistenceJoin(exists#n)``: each row of the left side once, with a boolean column
``exists#n`` (never NULL) that is true when the join condition is true for some row of
the right side (for ``NOT IN``, Spark's condition is ``a = b OR isnull(a = b)``, so a
NULL on either side matches); a filter or projection above reads that column.

The DataFrame API has no such join type. The engine computes it exactly from two it
has: the left rows whose ids are in the left semi join of the two sides (the condition
as Spark planned it) are marked true, the others false. The output row's id is the left
row's. Its change follows the rule of the other joins that keep one side (semi, anti,
left outer): the left rows that changed, or that the condition matches with a changed
right row at either version, are joined again at both versions; when the right side did
not change, the left side's changed rows alone.

Spark rewrites an uncorrelated ``EXISTS (q)`` into ``isnotnull((SELECT 1 AS col FROM q
LIMIT 1))``, a scalar subquery under a ``LIMIT 1`` of a constant projection.
:func:`subquery_plan` reads that subquery without its limit: every row of the
projection holds the same constant, so any one of them (none: NULL) is Spark's value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipelines.incremental.hidden import HIT_LEFT, ID, KEY, LEFT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pipelines.incremental.plan import Node, PlanReader

__all__ = ["EXISTENCE", "limited_to_one", "marked", "subquery_plan"]

#: The join type's name without its attribute (``ExistenceJoin(exists#n)``).
EXISTENCE = "ExistenceJoin"


def marked(
    reader: PlanReader, node: Node, left: DataFrame, right: DataFrame, on: Column
) -> DataFrame:  # fmt: skip
    """The existence join ``node`` of ``left`` (its ids as ``LEFT``) and ``right`` on
    ``on``: every left row once, with the join's ``exists`` attribute (true when ``on``
    holds for some right row) and its id as ``ID``."""
    from pyspark.sql import functions as F

    hits = left.join(right, on=on, how="left_semi").select(F.col(LEFT).alias(KEY)).distinct()
    hits = hits.withColumn(HIT_LEFT, F.lit(True))
    joined = left.join(hits, F.col(LEFT).eqNullSafe(F.col(KEY)), "left_outer").drop(KEY)
    expressions = reader.jvm.org.apache.spark.sql.catalyst.expressions
    found = expressions.IsNotNull(
        reader.jvm.org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute.quoted(HIT_LEFT))
    exists = reader.aliased(found, node.jvm.joinType().exists())  # its id, for the parent
    return joined.select("*", exists).drop(HIT_LEFT).withColumn(ID, F.col(LEFT))


def limited_to_one(reader: PlanReader, plan: Any) -> bool:
    """Whether a subquery's JVM plan is Spark's form of an uncorrelated ``EXISTS``:
    ``LIMIT 1`` over a projection of constants only (any row has the one value)."""
    if plan.getClass().getSimpleName() != "GlobalLimit" or not _one(plan.limitExpr()):
        return False
    local = plan.child()
    if local.getClass().getSimpleName() != "LocalLimit" or not _one(local.limitExpr()):
        return False
    project = local.child()
    return project.getClass().getSimpleName() == "Project" and all(
        _constant(item) for item in reader.items(project.projectList()))


def _constant(item: Any) -> bool:
    """Whether a projection's item is a constant (an ``Alias`` is never foldable itself)."""
    if item.getClass().getSimpleName() == "Alias":
        item = item.child()
    return bool(item.foldable())


def subquery_plan(reader: PlanReader, plan: Any) -> Node:
    """A scalar subquery's JVM plan as the engine evaluates it: without the ``LIMIT 1``
    of :func:`limited_to_one` (its rows all hold one value), else as it is."""
    return reader.tree(plan.child().child() if limited_to_one(reader, plan) else plan)


def _one(expression: Any) -> bool:
    return expression.getClass().getSimpleName() == "Literal" and str(expression.value()) == "1"
