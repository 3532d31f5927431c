"""Aggregations maintained from their change alone: a table whose query ends in a GROUP BY
(or a scalar aggregate) of COUNTs, exact SUMs and AVGs, MINs and MAXs keeps, per group,
hidden state columns from which the next refresh computes the group's new row without
reading the group's input rows again (a MIN or a MAX whose extreme may have been deleted
excepted: :mod:`.extremes`).

The recomputing rule of :class:`pipelines.incremental.delta.Deltas` reads every input
row of each touched group at the new versions: for a GROUP BY over a large source that
is a scan of the source (the touched groups' rows are spread over it), which costs what
a FULL refresh costs. Here the input's delta alone is aggregated per group, and added to
the state the table holds:

- ``_INGEST_STATE_ROWS``: the group's input rows (the group is gone at 0; a scalar
  aggregate keeps its one row);
- per aggregate function, in the order the plan holds them, ``_INGEST_STATE_<j>``:
  ``count(...)``: the rows it counts (all its arguments non-NULL), BIGINT; ``sum(x)`` and
  ``avg(x)`` of an integral or DECIMAL(p, s) ``x``: the exact sum as DECIMAL(38, s), and
  ``_INGEST_STATE_<j>_N``, how many ``x`` are not NULL (the sum and the average are NULL
  at 0); ``min(x)`` and ``max(x)`` of a number, string, date, timestamp or boolean: the
  group's extreme, in ``x``'s type, and ``_INGEST_STATE_<j>_N`` likewise. A group that
  lost a value that could be its extreme has its new row, every state column of it,
  aggregated again from its input rows at the new versions (:mod:`.extremes`): the
  other groups' rows are not read.

A group's row is then its output expressions as the plan writes them, each aggregate
function replaced by its value from the new state (a sum cast to the type Spark gives
it: BIGINT, DECIMAL(p + 10, s); an average by Spark's own final expression over its
buffer, the sum and the count) and each grouping expression by the key: Spark evaluates
them. Sums are exact (integers and decimals), so the result equals the query run fresh;
a sum past its type's range fails as the query's would (ANSI), decided on the final value
rather than on a running total. An integer's average (and a small decimal's, which
Spark's optimizer turns into the average of its unscaled integers) is Spark's average of
doubles: the exact sum rounded once to a double, which is what Spark's running double
sum gives while the group's sums stay within ±2⁵³ (past that Spark's own answer depends
on the order it adds in). Float sums and averages, MIN and MAX of other types (binary,
arrays, ...), COUNT(DISTINCT), FILTER, a HAVING (a Filter above the aggregation: the
groups it hides have no row to hold their state) and an aggregation below other
operators keep the recomputing rule.

The state is part of the table's rows, so it commits with them, atomically; readers
never see it (hidden columns, ``ingest.hidden = state``, as the row id is).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from flush.spark_tables import arrow_frame
from flush.tables import HIDDEN_KEY, STATE_MARK, state_columns
from pipelines.incremental import extremes
from pipelines.incremental.extremes import Extreme
from pipelines.incremental.group_ids import group_id, grouping
from pipelines.incremental.hidden import ID, KEY, SIGN
from pipelines.incremental.plan import (
    Node,
    PlanReader,
    cast_select,
    cast_sql,
    quoted,
    sql_type,
    typed_as,
)  # fmt: skip
from pipelines.incremental.subqueries import expressions as subquery_expressions

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pipelines.incremental.delta import Deltas

__all__ = ["STATE_PREFIX", "Layout", "delta", "extremes_of", "full", "layout", "rows", "stored"]

STATE_PREFIX = "_INGEST_STATE_"
_ROWS = f"{STATE_PREFIX}ROWS"
_VALUE = "_INGEST_V_"
_OTHER = -1  # an aggregate function kept by recomputing its groups


@dataclass(frozen=True)
class Layout:
    """Where a plan's state lives: the projections above its root aggregation (outermost
    first), the aggregation, its distinct aggregate functions (JVM ``AggregateExpression``)
    and, for each, None for a ``count``, the DECIMAL scale of its sum's state, or the
    :class:`~.extremes.Extreme` of a MIN or MAX."""

    chain: tuple[Node, ...]
    aggregate: Node
    keys: tuple[Any, ...]
    functions: tuple[Any, ...]
    scales: tuple[int | Extreme | None, ...]

    @property
    def names(self) -> list[str]:
        """The state columns, in the table's order."""
        return [f.name for f in self.fields]

    @property
    def fields(self) -> list[pa.Field]:
        """The state columns as the table's Delta schema holds them (hidden)."""
        mark = {HIDDEN_KEY: STATE_MARK}
        fields = [pa.field(_ROWS, pa.int64(), metadata=mark)]
        for j, scale in enumerate(self.scales):
            if scale is None:
                fields.append(pa.field(f"{STATE_PREFIX}{j}", pa.int64(), metadata=mark))
            elif isinstance(scale, Extreme):
                fields.append(pa.field(f"{STATE_PREFIX}{j}", scale.arrow, metadata=mark))
                fields.append(pa.field(f"{STATE_PREFIX}{j}_N", pa.int64(), metadata=mark))
            else:
                fields.append(pa.field(f"{STATE_PREFIX}{j}", pa.decimal128(38, scale),
                                       metadata=mark))  # fmt: skip
                fields.append(pa.field(f"{STATE_PREFIX}{j}_N", pa.int64(), metadata=mark))
        return fields


def layout(reader: PlanReader, root: Node) -> Layout | None:
    """The state ``root`` can be maintained with, or None: projections over an
    aggregation whose aggregate functions are all COUNTs, SUMs and AVGs of integers
    and decimals, and MINs and MAXs of the types :func:`.extremes.kept` keeps."""
    chain, node = [], root
    while node.kind == "Project":
        chain.append(node)
        node = node.children[0]
    if node.kind != "Aggregate" or any(subquery_expressions(reader, n) for n in [*chain, node]):
        return None  # (a subquery's value can change every group's row)
    functions: list[Any] = []
    for output in reader.items(node.jvm.aggregateExpressions()):
        for found in _aggregate_expressions(reader, output):
            if not any(found.semanticEquals(f) for f in functions):
                functions.append(found)
    scales = [_scale(f) for f in functions]
    if any(scale == _OTHER for scale in scales if not isinstance(scale, Extreme)):
        return None
    keys = tuple(reader.items(node.jvm.groupingExpressions()))
    return Layout(tuple(chain), node, keys, tuple(functions), tuple(scales))


def stored(schema: pa.Schema) -> list[pa.Field]:
    """The state columns a table's Delta schema holds (none: a table that keeps none)."""
    return [schema.field(name) for name in state_columns(schema)]


def full(reader: PlanReader, found: Layout) -> list[Column]:
    """The state columns as aggregates over a group's input rows (the group's whole
    state, for a refresh that evaluates the query afresh)."""
    from pyspark.sql import functions as F

    columns = [F.count(F.lit(1)).alias(_ROWS)]
    for j, (function, scale) in enumerate(zip(found.functions, found.scales, strict=True)):
        name = f"{STATE_PREFIX}{j}"
        if scale is None:  # a count: the function itself
            columns.append(reader.column(function).alias(name))
        elif isinstance(scale, Extreme):  # the function itself, and its non-NULL count
            argument = reader.column(function.aggregateFunction().child())
            columns += [reader.column(function).alias(name),
                        F.count(argument).alias(f"{name}_N")]  # fmt: skip
        else:  # an exact sum, and its non-NULL count
            value = _argument(reader, function, scale)
            columns += [F.sum(value).alias(name), F.count(value).alias(f"{name}_N")]
    return columns


def delta(deltas: Deltas, found: Layout, kept: DataFrame) -> DataFrame:
    """The root's delta from the aggregation input's delta and the state ``kept`` holds:
    each touched group's new row (+1, unless the group is gone) and its kept row (-1),
    with the state columns after ``ID`` (``kept``: the table's user columns, ``ID``, its
    state columns)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import _parse_datatype_json_string

    reader = deltas.reader
    keys = list(found.keys)
    names = [f"{KEY}{i}" for i in range(len(keys))]
    change = deltas.delta(found.aggregate.children[0])
    grouped = change.groupBy(*[grouping(reader, k).alias(n) for k, n in zip(keys, names,
                                                                             strict=True)])
    collected = grouped.agg(*_changed(reader, found)).withColumn(
        ID, group_id(keys, reader, names)).toArrow()  # fmt: skip
    touched = arrow_frame(reader.spark, collected)  # (:meth:`Deltas.materialised`)
    kinds = [_parse_datatype_json_string(key.dataType().json()) for key in keys]
    touched = cast_select(touched, list(zip(names, kinds, strict=True)),  # as they were
                          collected.column_names[len(names):])  # (Arrow has no NTZ mark)
    touched = extremes.retyped(found, touched)
    width = len(kept.columns) - 1 - len(found.names)
    old = kept.join(touched.select(ID), on=ID, how="left_semi")
    # Old state plus change, summed (a + b of two DECIMAL(38, s) would round to fewer
    # decimals: Spark's rule for an addition past 38 digits; a sum keeps the scale).
    both = touched.select(ID, *found.names).union(old.select(ID, *found.names))
    summed = both.groupBy(ID).agg(*_merged(found))
    # A group that lost a value that could be its extreme: its new row computed again
    lost = extremes.lost_values(found, collected)  # no job for a change without any
    unsafe = extremes.unsafe(deltas, found, touched, old) if lost else None
    if unsafe is not None:
        summed = summed.join(unsafe.select(ID), on=ID, how="left_anti")
    merged = touched.select(*names, ID).join(summed, on=ID)
    merged = merged.select(*names, ID, *found.names, *_values(found))
    if keys:  # a group without rows is gone; a scalar aggregate always has its row
        merged = merged.where(F.col(_ROWS) > 0)
    new = merged.select(*_outputs(reader, found, merged), ID, *found.names)
    for above in reversed(found.chain):
        new = new.select(*reader.columns(above.jvm.projectList()), ID, *found.names)
    new = new.withColumn(SIGN, F.lit(1))
    ordered = [*kept.columns[:width], ID, *found.names]
    old_rows = cast_select(old, [(c, f.dataType) for c, f in zip(
        ordered, new.schema.fields, strict=False)]).withColumn(SIGN, F.lit(-1))  # fmt: skip
    if unsafe is None:
        return new.union(old_rows)
    return extremes.recomputed(deltas, found, unsafe).union(new).union(old_rows)


def rows(deltas: Deltas, found: Layout, version: str) -> DataFrame:
    """The root's rows at ``version`` with their state columns after ``ID``."""
    reader = deltas.reader
    aggregated = deltas.aggregate(found.aggregate, deltas.state(found.aggregate.children[0],
                                                                version), full(reader, found))
    for above in reversed(found.chain):
        aggregated = aggregated.select(*reader.columns(above.jvm.projectList()), ID,
                                       *found.names)  # fmt: skip
    return aggregated


def extremes_of(found: Layout) -> list[tuple[int, Extreme]]:
    """The MINs and MAXs the state keeps, by position."""
    return [(j, s) for j, s in enumerate(found.scales) if isinstance(s, Extreme)]


def _merged(found: Layout) -> list[Column]:
    """The new state of a group from the rows of its old state and of its change: sums
    of counts and sums, Spark's MIN or MAX of an extreme (and its old one)."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_type

    columns, kinds = [], {f"{STATE_PREFIX}{j}": s for j, s in extremes_of(found)}
    for f in found.fields:
        kind = from_arrow_type(f.type)
        if f.name in kinds:
            columns.append(extremes.merged(kinds[f.name], f.name).cast(kind).alias(f.name))
        else:  # a BIGINT or DECIMAL(38, s): one expression, one JVM call
            name = quoted(f.name)
            columns.append(F.expr(f"CAST(coalesce(sum({name}), 0) AS {sql_type(kind)}) "
                                  f"AS {name}"))  # fmt: skip
    return columns


def _changed(reader: PlanReader, found: Layout) -> list[Column]:
    """The state columns as aggregates over a group's signed change rows: what the
    change adds to each."""
    from pyspark.sql import functions as F

    sign = F.col(SIGN)
    columns = [F.sum(sign).cast("bigint").alias(_ROWS)]
    for j, (function, scale) in enumerate(zip(found.functions, found.scales, strict=True)):
        arguments = reader.columns(function.aggregateFunction().children())
        if scale is None:
            counted = functools.reduce(operator.and_, [a.isNotNull() for a in arguments],
                                       F.lit(True))  # fmt: skip
            columns.append(F.sum(F.when(counted, sign).otherwise(0)).cast("bigint")
                           .alias(f"{STATE_PREFIX}{j}"))  # fmt: skip
            continue
        if isinstance(scale, Extreme):
            columns += extremes.changed(arguments[0], scale, j)
            continue
        value = _argument(reader, function, scale)
        columns.append(F.sum(F.when(sign > 0, value).otherwise(-value))
                       .alias(f"{STATE_PREFIX}{j}"))  # fmt: skip
        columns.append(F.sum(F.when(value.isNotNull(), sign).otherwise(0)).cast("bigint")
                       .alias(f"{STATE_PREFIX}{j}_N"))  # fmt: skip
    return columns


def _values(found: Layout) -> list[Column]:
    """Each aggregate function's value from the new state (``_INGEST_V_<j>``); an
    average's aggregation buffer instead (``_INGEST_V_<j>_sum``, ``_count``), which
    :func:`_outputs` evaluates by Spark's own expression."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import _parse_datatype_json_string

    values = []
    for j, (function, scale) in enumerate(zip(found.functions, found.scales, strict=True)):
        state, count = f"{STATE_PREFIX}{j}", f"{STATE_PREFIX}{j}_N"
        if _is_average(function):
            buffer = {a.name(): a for a in _buffer(function)}
            kind = _parse_datatype_json_string(buffer["sum"].dataType().json())
            values += [_cast(state, kind, f"{_VALUE}{j}_sum"),
                       F.col(count).alias(f"{_VALUE}{j}_count")]  # fmt: skip
            continue
        if scale is None:  # a count
            values.append(F.col(state).alias(f"{_VALUE}{j}"))
            continue
        kind = _parse_datatype_json_string(function.dataType().json())
        written = sql_type(kind)
        if written is None:
            values.append(F.when(F.col(count) > 0, F.col(state).cast(kind))
                          .alias(f"{_VALUE}{j}"))  # fmt: skip
            continue
        values.append(F.expr(f"CASE WHEN {quoted(count)} > 0 THEN CAST({quoted(state)} AS "
                             f"{written}) END AS {quoted(f'{_VALUE}{j}')}"))  # fmt: skip
    return values


def _cast(name: str, kind: Any, alias: str) -> Column:
    """Column ``name`` cast to ``kind`` and named ``alias`` (one JVM call where
    :func:`~.plan.cast_sql` writes the type)."""
    from pyspark.sql import functions as F

    text = cast_sql(name, kind, alias)
    return F.expr(text) if text is not None else typed_as(name, kind).alias(alias)


def _outputs(reader: PlanReader, found: Layout, merged: DataFrame) -> list[Column]:
    """The aggregation's output expressions over ``merged``: each grouping expression
    replaced by its key column, each aggregate function by its value column (an
    average by its final expression over its buffer's columns). The expressions keep
    their names and ids."""
    output = merged._jdf.queryExecution().analyzed().output()
    attributes = {a.name(): a for a in reader.items(output)}
    jvm = reader.jvm
    swaps = [(key, attributes[f"{KEY}{i}"]) for i, key in enumerate(found.keys)]

    def replaced(expression: Any, swaps: list[tuple[Any, Any]]) -> Any:
        for before, after in swaps:
            if expression.semanticEquals(before):
                return after
        if expression.getClass().getSimpleName() == "AggregateExpression":
            j = next(j for j, f in enumerate(found.functions) if f.semanticEquals(expression))
            if not _is_average(expression):
                return attributes[f"{_VALUE}{j}"]
            final = expression.aggregateFunction().evaluateExpression()
            return replaced(final, [(a, attributes[f"{_VALUE}{j}_{a.name()}"])
                                    for a in _buffer(expression)])  # fmt: skip
        children = reader.items(expression.children())
        if not children:
            return expression
        replaced_children = jvm.java.util.ArrayList()
        for child in children:
            replaced_children.add(replaced(child, swaps))
        return expression.withNewChildren(
            jvm.org.apache.spark.api.python.PythonUtils.toSeq(replaced_children))

    outputs = reader.items(found.aggregate.jvm.aggregateExpressions())
    return [reader.column(replaced(e, swaps)) if e.getClass().getSimpleName() == "Alias"
            else reader.aliased(replaced(e, swaps), e.toAttribute()) for e in outputs]  # fmt: skip


def _is_average(function: Any) -> bool:
    return bool(function.aggregateFunction().getClass().getSimpleName() == "Average")


def _buffer(function: Any) -> list[Any]:
    """An aggregate function's buffer attributes (an average's: ``sum``, ``count``)."""
    seq = function.aggregateFunction().aggBufferAttributes()
    return [seq.apply(i) for i in range(seq.size())]


def _aggregate_expressions(reader: PlanReader, expression: Any) -> list[Any]:
    if expression.getClass().getSimpleName() == "AggregateExpression":
        return [expression]
    return [found for child in reader.items(expression.children())
            for found in _aggregate_expressions(reader, child)]  # fmt: skip


def _scale(function: Any) -> int | Extreme | None:
    """None for a COUNT, the state's DECIMAL scale for a SUM or an AVG of an integral or
    DECIMAL argument, the :class:`~.extremes.Extreme` of a MIN or MAX the state keeps,
    :data:`_OTHER` for anything else (the aggregation is then not maintained from its
    change)."""
    if function.isDistinct() or function.filter().isDefined():
        return _OTHER
    if str(function.mode().toString()) != "Complete":
        return _OTHER
    from pyspark.sql.types import DecimalType, IntegralType, _parse_datatype_json_string

    aggregate = function.aggregateFunction()
    kind = aggregate.getClass().getSimpleName()
    if kind == "Count":
        return None
    extreme = extremes.kept(aggregate)
    if extreme is not None:
        return extreme if isinstance(extreme, Extreme) else _OTHER
    if kind not in ("Sum", "Average"):
        return _OTHER
    if kind == "Sum" and str(aggregate.evalContext().evalMode().toString()) == "TRY":
        return _OTHER
    argument = _parse_datatype_json_string(aggregate.child().dataType().json())
    if isinstance(argument, IntegralType):
        return 0
    return argument.scale if isinstance(argument, DecimalType) else _OTHER


def _argument(reader: PlanReader, function: Any, scale: int) -> Column:
    """A sum's argument as DECIMAL(38, scale): exact for every integral and decimal."""
    return reader.column(function.aggregateFunction().child()).cast(f"decimal(38,{scale})")
