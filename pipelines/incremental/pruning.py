"""Reading only the source files that can hold the rows a rule needs.

Several rules read an operator's rows only for the few keys a change holds: an inner
join's term ``A ⋈ ΔB`` needs the rows of A whose join key is one of ΔB's, and an
aggregation or window recomputed by group, or an outer, semi or anti join recomputed by
row, needs its input's rows of the touched keys or ids. Spark finds those rows by
reading the whole input. When the key is a column of one source table carried to the
operator unchanged (through projections, filters, inner joins and the kept side of semi
and anti joins, each of which keeps or drops a row by that row's own values), a source
row whose key takes none of the values can only make result rows whose key takes none
of them, which the rule drops anyway. So the source's data files whose statistics
(min and max of the column, from the Delta log) exclude every value are not read; Spark
still evaluates the join or the restriction on what is read, and the answer is the same.
A group's or partition's key matches NULL to NULL, and a file's bounds leave NULLs out:
when the touched keys hold a NULL, the files that may hold one are read too.

What it costs: the values are collected by a Spark job (small: a change, or keys already
computed), so sources smaller than :data:`PRUNE_FROM_BYTES` are read whole. Integer,
DECIMAL, DATE and row-id columns only: statistics of floats leave NaN out (Arrow's
writers), of timestamps may be truncated to milliseconds (other writers of the Delta
log), of strings are byte-wise, which a collation does not follow; a DECIMAL's are
widened by more than a binary float's rounding (a writer may store them as one).
"""

from __future__ import annotations

import bisect
import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pipelines.incremental.plan import Node, PlanReader, join_type
from pipelines.incremental.row_maps import CONSTANT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pipelines.incremental.delta import Deltas

__all__ = ["PRUNE_FROM_BYTES", "Origin", "equi_keys", "kept_files", "narrowed", "origin",
           "values_of"]  # fmt: skip

#: A source whose files at the version read add up to less than this is read whole.
PRUNE_FROM_BYTES = 16 * 1024 * 1024
#: Most distinct values a pruning tests the files against (more: the source is read whole).
MAX_VALUES = 100_000
_PRUNABLE = frozenset({"ByteType", "ShortType", "IntegerType", "LongType", "DecimalType",
                       "DateType"})  # fmt: skip
#: A binary float holds 53 bits: its rounding of a decimal is below 2⁻⁵² of it.
_RELATIVE_SLACK = Decimal("1e-14")
#: The limits a writer's 64-bit bounds of a DECIMAL saturate at (see :func:`_bounds`).
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Origin:
    """Where an operator's column comes from: the ``path`` of operators from the
    operator down to the source ``leaf`` (both included) and the leaf's column
    ``position`` (None: the row id)."""

    path: tuple[Node, ...]
    leaf: Node
    position: int | None


def narrowed(
    deltas: Deltas, node: Node, version: str, options: list[tuple[Any, DataFrame, Column | str]],
    nulls_match: bool = False,
) -> DataFrame:  # fmt: skip
    """``node``'s rows at ``version`` for a rule that keeps only those whose column
    (None: the row id) takes a value of a column of a frame, for the first option
    (column, frame, its column) whose column comes from a source: that source's files
    whose statistics exclude every value are not read. Else ``deltas.state``'s rows.

    ``nulls_match``: the rule keeps a row whose column is NULL when the frame's column
    holds a NULL (a GROUP BY's or a window's NULL key): a file that may hold a NULL of
    the column is then read too, whatever its bounds (they leave NULLs out)."""
    from pipelines.incremental.hidden import ID

    if not any(deltas.source(leaf).prunable(version) for leaf in _sources(node)):
        return deltas.state(node, version)  # (nothing read through the JVM to know)
    for attribute, frame, column in options:
        found = origin(deltas.reader, node, attribute)
        source = deltas.source(found.leaf) if found is not None else None
        if found is None or source is None or not source.prunable(version):
            continue
        key = (id(frame), str(column))
        if key not in deltas.pruning_values:  # (the same values for both versions)
            # The frame is kept with its values: while it lives, no other frame has its id.
            deltas.pruning_values[key] = (frame, *values_of(frame.select(column)))
        _, values, has_null = deltas.pruning_values[key]
        read = None if values is None else source.pruned(
            version, found.position, values, nulls=nulls_match and has_null)  # fmt: skip
        if read is None:
            break
        rows, below = deltas.leaf_rows(found.leaf, read, [ID]), found.leaf
        for above in reversed(found.path[:-1]):
            inputs = [rows if c is below else deltas.state(c, version) for c in above.children]
            rows, below = deltas.evaluated(above, inputs, version), above
        return rows
    return deltas.state(node, version)


def _sources(node: Node) -> list[Node]:
    if not node.children:
        return [] if node.kind in CONSTANT else [node]
    return [leaf for child in node.children for leaf in _sources(child)]


def origin(reader: PlanReader, node: Node, attribute: Any | None) -> Origin | None:
    """The source column ``attribute`` of ``node``'s rows (None: the row id) is,
    if every operator on the way keeps or drops a row by its own values and passes the
    column on as it is; None otherwise (or for a column of a type not pruned by)."""
    if attribute is not None and (
        attribute.getClass().getSimpleName() != "AttributeReference"
        or attribute.dataType().getClass().getSimpleName().rstrip("$") not in _PRUNABLE
    ):  # fmt: skip
        return None
    wanted = None if attribute is None else attribute.exprId().id()
    path: list[Node] = []
    while True:
        path.append(node)
        if not node.children:
            if node.kind in CONSTANT:
                return None
            if wanted is None:
                return Origin(tuple(path), node, None)
            ids = [a.exprId().id() for a in node.output]
            return Origin(tuple(path), node, ids.index(wanted)) if wanted in ids else None
        found = _through(reader, node, wanted)
        if found is None:
            return None
        node, wanted = found


def _through(reader: PlanReader, node: Node, wanted: int | None) -> tuple[Node, int | None] | None:
    """The child (and the attribute id there) ``node``'s column ``wanted`` comes from."""
    kind = node.kind
    if kind == "Filter":
        return node.children[0], wanted
    if kind == "Project":
        if wanted is None:
            return node.children[0], None
        for item in reader.items(node.jvm.projectList()):
            if item.exprId().id() != wanted:
                continue
            name = item.getClass().getSimpleName()
            if name == "Alias" and item.child().getClass().getSimpleName() == "AttributeReference":
                return node.children[0], item.child().exprId().id()
            return (node.children[0], wanted) if name == "AttributeReference" else None
        return None
    if kind != "Join":
        return None
    join = join_type(node)
    if join in ("LeftSemi", "LeftAnti"):
        return node.children[0], wanted
    if join not in ("Inner", "Cross") or wanted is None:  # (a joined row's id is a hash)
        return None
    for child in node.children:
        if wanted in [a.exprId().id() for a in child.output]:
            return child, wanted
    return None


def equi_keys(reader: PlanReader, node: Node) -> list[tuple[Any, Any]]:
    """The pairs (left expression, right expression) of the conjuncts ``l = r`` of a
    join's condition whose sides each read one side of the join only."""
    condition = reader.option(node.jvm.condition())
    if condition is None:
        return []
    left, right = ({a.exprId().id() for a in child.output} for child in node.children)
    pairs = []
    for conjunct in _conjuncts(condition):
        if conjunct.getClass().getSimpleName() != "EqualTo":
            continue
        a, b = conjunct.left(), conjunct.right()
        sides = (_references(reader, a), _references(reader, b))
        if sides[0] and sides[1] and sides[0] <= left and sides[1] <= right:
            pairs.append((a, b))
        elif sides[0] and sides[1] and sides[0] <= right and sides[1] <= left:
            pairs.append((b, a))
    return pairs


def _conjuncts(expression: Any) -> list[Any]:
    if expression.getClass().getSimpleName() == "And":
        return [*_conjuncts(expression.left()), *_conjuncts(expression.right())]
    return [expression]


def _references(reader: PlanReader, expression: Any) -> set[int]:
    return {a.exprId().id() for a in reader.items(expression.references().toSeq())}


def values_of(frame: DataFrame) -> tuple[list[Any] | None, bool]:
    """The distinct non-NULL values of ``frame``'s one column, sorted (one Spark job),
    None past :data:`MAX_VALUES` of them; and whether the column holds a NULL."""
    found = frame.distinct().limit(MAX_VALUES + 2)
    every = found.toArrow().column(0).to_pylist()
    values = [v for v in every if v is not None]
    return (None if len(values) > MAX_VALUES else sorted(values)), len(values) < len(every)


def kept_files(
    files: Sequence[dict[str, Any]], column: str, values: Sequence[Any], nulls: bool = False
) -> list[dict[str, Any]]:
    """The add actions (``live_files``) among ``files`` whose statistics of ``column``
    admit one of the sorted ``values`` (or, with ``nulls``, a NULL: a file whose null
    count of the column is not 0): a file without them is kept."""
    kept = []
    for f in files:
        if nulls and f.get(f"null_count.{column}") != 0:
            kept.append(f)
            continue
        low, high = f.get(f"min.{column}"), f.get(f"max.{column}")
        if low is None or high is None:
            kept.append(f)
            continue
        low, high = _bounds(low, high)
        at = 0 if low is None else bisect.bisect_left(values, low)
        if at < len(values) and (high is None or values[at] <= high):
            kept.append(f)
    return kept


def _bounds(low: Any, high: Any) -> tuple[Any, Any]:
    """A file's statistics as the values compare with them (None: no bound on that
    side): a DATE may come as a datetime; a DECIMAL's, which a writer may have put in
    the log as a binary float, widened by more than such a float's rounding; and an
    integral DECIMAL's bound at a 64-bit integer's limit says nothing past it (delta-rs'
    merge, which SQL updates and deletes run, writes a DECIMAL(38,0) bound past the
    limits as the limit: a file of keys over 2⁶³ gets 2⁶³ - 1 as its maximum)."""
    if isinstance(low, datetime.datetime):
        low, high = low.date(), high.date()
    if isinstance(low, Decimal):
        slack = (abs(low) + abs(high)) * _RELATIVE_SLACK
        low = None if low <= _INT64_MIN else low - slack
        high = None if high >= _INT64_MAX else high + slack
    return low, high
