"""Uncorrelated scalar subqueries (``WHERE x > (SELECT avg(y) FROM u)``), which Spark's
optimizer keeps as expressions of a projection, a filter, a join's condition or an
aggregate's outputs (a correlated one it rewrites into a join), as the query-delta
engine evaluates them (:class:`pipelines.incremental.delta.Deltas`).

A subquery's value at a version is its plan evaluated by the engine at that version, as
a relation of one row, by Spark's rule for a scalar subquery: no row gives NULL, more
than one is an error. The operator is evaluated over its input (a join: its left side)
joined with that row, each subquery in its expressions replaced by the row's column
(Spark may merge several subqueries over one relation into one, whose value is a struct
the expressions read); an aggregate also groups by it (one value: the same groups).

Its delta: where the subqueries' sources did not change, or their values did not (one
small Spark job computes and compares the values at both versions, kept for the rest of
the refresh), the operator's own rule applies with that one value; where a value
changed, any row can change, and the operator is evaluated at both versions whole.
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any

from pipelines.change_sets import spark_key
from pipelines.incremental import existence
from pipelines.incremental.hidden import ID, KEY, SIGN
from pipelines.incremental.plan import Node, PlanReader

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pipelines.incremental.delta import Deltas

__all__ = ["attached", "changed", "column", "evaluable", "evaluated", "expressions", "names",
           "recomputed"]  # fmt: skip

#: The operators whose scalar subqueries the engine evaluates (an aggregate's: with
#: grouping keys, not in them).
_HOLDERS = frozenset({"Project", "Filter", "Join", "Aggregate"})
#: Spark's words when a scalar subquery returns more than one row.
_TOO_MANY = ("[SCALAR_SUBQUERY_TOO_MANY_ROWS] More than one row returned by a subquery "
             "used as an expression.")  # fmt: skip


def expressions(reader: PlanReader, node: Node) -> list[Any]:
    """The subquery expressions in ``node``'s own expressions (not in its children's),
    each once by its id; none (no JVM walk) for an operator without subqueries."""
    if node.jvm.subqueries().isEmpty():
        return []
    found: dict[int, Any] = {}
    for expression in reader.items(node.jvm.expressions()):
        _collect(reader, expression, found)
    return list(found.values())


def evaluable(reader: PlanReader, node: Node) -> bool:
    """Whether the engine evaluates ``node``'s subqueries: a projection's, a filter's,
    a join's or a grouped aggregate's outside its keys (an aggregate without keys has a
    row even without input, which grouping by the value would lose), every one a scalar
    subquery without outer references (their plans are checked as plans of their own)."""
    found = expressions(reader, node)
    if node.kind == "Aggregate":
        keys = reader.items(node.jvm.groupingExpressions())
        in_keys: dict[int, Any] = {}
        for key in keys:
            _collect(reader, key, in_keys)
        if not keys or in_keys:
            return False
    return node.kind in _HOLDERS and all(
        s.getClass().getSimpleName() == "ScalarSubquery" and s.outerAttrs().isEmpty()
        for s in found
    )


def _collect(reader: PlanReader, expression: Any, found: dict[int, Any]) -> None:
    if expression.getClass().getSimpleName() in _SUBQUERY_KINDS:
        found.setdefault(int(expression.exprId().id()), expression)
        return
    for child in reader.items(expression.children()):
        _collect(reader, child, found)


#: Spark's subquery expressions (``SubqueryExpression``'s subclasses).
_SUBQUERY_KINDS = frozenset({"ScalarSubquery", "Exists", "ListQuery", "LateralSubquery",
                             "FunctionTableSubqueryArgumentExpression"})  # fmt: skip


def changed(deltas: Deltas, node: Node) -> bool:
    """Whether a subquery of ``node`` has another value at the new versions."""
    return not _same(deltas, node)


def recomputed(deltas: Deltas, node: Node) -> DataFrame:
    """``node``'s delta where a subquery's value changed: the operator at both
    versions, whole."""
    from pyspark.sql import functions as F

    parts = [deltas.state(node, version).withColumn(SIGN, F.lit(sign))
             for version, sign in (("new", 1), ("old", -1))]  # fmt: skip
    return parts[0].union(parts[1])


def names(deltas: Deltas, node: Node) -> list[str]:
    """The columns :func:`attached` adds: one per subquery of ``node``."""
    return [_name(s) for s, _ in deltas.subqueries(node)]


def attached(deltas: Deltas, node: Node, rows: DataFrame, version: str) -> DataFrame:
    """``rows`` with the values of ``node``'s subqueries at ``version`` as columns."""
    return rows.crossJoin(_values(deltas, node, version))


def column(deltas: Deltas, node: Node, expression: Any) -> Column:
    """One of ``node``'s expressions as a Column over :func:`attached` rows (as it is,
    for an operator without subqueries)."""
    reader = deltas.reader
    if not deltas.subqueries(node):
        return reader.column(expression)
    by_id = {int(s.exprId().id()): _name(s) for s, _ in deltas.subqueries(node)}
    return reader.column(_replaced(reader, expression, by_id))


def evaluated(
    deltas: Deltas, node: Node, rows: DataFrame, version: str, extra: list[str]
) -> DataFrame:  # fmt: skip
    """A projection or filter over ``rows`` with its subqueries' values at ``version``."""
    joined = attached(deltas, node, rows, version)
    if node.kind == "Project":
        items = deltas.reader.items(node.jvm.projectList())
        return joined.select(*[column(deltas, node, e) for e in items], ID, *extra)
    condition = column(deltas, node, node.jvm.condition())
    return joined.where(condition).drop(*names(deltas, node))


def _name(subquery: Any) -> str:
    return f"{KEY}S{subquery.exprId().id()}"


def _replaced(reader: PlanReader, expression: Any, names: dict[int, str]) -> Any:
    """``expression`` with each scalar subquery replaced by the column ``names`` gives
    it (by the subquery's id); the parts without one are kept as they are."""
    if expression.getClass().getSimpleName() == "ScalarSubquery":
        return reader.jvm.org.apache.spark.sql.catalyst.analysis.UnresolvedAttribute.quoted(
            names[int(expression.exprId().id())])  # fmt: skip
    children = reader.items(expression.children())
    replaced = [_replaced(reader, c, names) for c in children]
    if all(new is old for new, old in zip(replaced, children, strict=True)):
        return expression
    return expression.withNewChildren(reader.jvm.PythonUtils.toSeq(replaced))


def _values(deltas: Deltas, node: Node, version: str) -> DataFrame:
    """The subqueries' values at ``version``: one row, a column each. Where a source of
    theirs changed, read from the frame :func:`_compared` computed, if it was."""
    if _unchanged(deltas, node):
        version = "new"
    both = deltas.made(node, _COMPARED)
    if both is None:
        return deltas.memoised(node, f"values-{version}",
                               lambda: _computed(deltas, node, version))  # fmt: skip
    suffix = "" if version == "old" else "_NEW"
    return both.select(*[both[f"{n}{suffix}"].alias(n) for n in names(deltas, node)])


def _computed(deltas: Deltas, node: Node, version: str) -> DataFrame:
    from pyspark.sql import functions as F

    frames = []
    for subquery, plan in deltas.subqueries(node):
        rows = deltas.state(plan, version)
        if existence.limited_to_one(deltas.reader, subquery.plan()):
            rows = rows.limit(1)  # the LIMIT 1 of an EXISTS: every row holds one value
        value = deltas.reader.column(plan.output[0])
        too_many = F.count(F.lit(1)) > 1
        frames.append(rows.agg(F.when(too_many, F.raise_error(F.lit(_TOO_MANY)))
                               .otherwise(F.first(value)).alias(_name(subquery))))  # fmt: skip
    return functools.reduce(lambda a, b: a.crossJoin(b), frames)


def _unchanged(deltas: Deltas, node: Node) -> bool:
    return all(deltas.unchanged(plan) for _, plan in deltas.subqueries(node))


def _compared(deltas: Deltas, node: Node) -> DataFrame:
    """The values at both versions (the new ones' columns named ``..._NEW``) and whether
    each kept its value (``KEY`` + ``SAME``), computed in one Spark job and kept (a
    local checkpoint: the subqueries are not evaluated again)."""
    from pyspark.sql import functions as F

    def compare() -> DataFrame:
        old, new = _computed(deltas, node, "old"), _computed(deltas, node, "new")
        new = new.select(*[F.col(n).alias(f"{n}_NEW") for n in new.columns])
        kinds = {f.name: f.dataType for f in old.schema.fields}
        same = [spark_key(F.col(n), k).eqNullSafe(spark_key(F.col(f"{n}_NEW"), k))
                for n, k in kinds.items()]  # fmt: skip
        both = old.crossJoin(new).withColumn(f"{KEY}SAME", functools.reduce(operator.and_,
                                                                          same))  # fmt: skip
        return both.localCheckpoint()

    return deltas.memoised(node, _COMPARED, compare)


_COMPARED = "values-compared"


def _same(deltas: Deltas, node: Node) -> bool:
    """Whether every subquery of ``node`` has one value at both versions (a value that
    cannot be compared exactly counts as changed: the operator is evaluated whole)."""
    from pyspark.sql.types import _parse_datatype_json_string

    if _unchanged(deltas, node):
        return True
    kinds = [_parse_datatype_json_string(plan.output[0].dataType().json())
             for _, plan in deltas.subqueries(node)]  # fmt: skip
    if not all(_comparable(kind) for kind in kinds):
        return False
    row = _compared(deltas, node).select(f"{KEY}SAME").head()
    return row is not None and bool(row[0])


def _comparable(kind: Any) -> bool:
    """Whether Spark's ``<=>`` over :func:`~pipelines.change_sets.spark_key` tells two
    values of type ``kind`` apart exactly: not for maps and calendar intervals (Spark
    does not compare them) nor strings of a collation (``'a'`` is ``'A'`` under
    ``UTF8_LCASE``, though a projection of it shows which), inside anything too."""
    from pyspark.sql import types as T

    if isinstance(kind, T.MapType | T.CalendarIntervalType):
        return False
    if isinstance(kind, T.StringType):
        return kind.collation == "UTF8_BINARY"
    if isinstance(kind, T.ArrayType):
        return _comparable(kind.elementType)
    if isinstance(kind, T.StructType):
        return all(_comparable(f.dataType) for f in kind.fields)
    return True
