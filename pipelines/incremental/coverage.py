"""Which plans the query-delta engine (:mod:`.delta`) refreshes: the operators its rules
cover, and for a plan it cannot refresh the reason codes of a FULL refresh (ORDER_BY,
LIMIT, SAMPLE, WINDOW_WITHOUT_PARTITION_BY, SUBQUERY_EXPRESSION, RESERVED_NAME,
GENERATOR:<name>, UNSUPPORTED:<operator>), checked before any refresh reads a row.
"""

from __future__ import annotations

from collections.abc import Callable

from ingest_sdk.schema import spark_fold
from pipelines.incremental import existence, row_maps, subqueries
from pipelines.incremental.group_ids import GROUP_ID_RULE
from pipelines.incremental.plan import Node, PlanReader, join_type

__all__ = ["ROW_WISE", "renews_group_ids", "unsupported"]

#: Operators that map each row alone (a leaf of the walk is a source); an ``Expand``
#: (ROLLUP, CUBE, GROUPING SETS, several COUNT DISTINCTs) maps it to one row per
#: projection, a ``Generate`` (explode, inline) to one per element (:mod:`.row_maps`).
ROW_WISE = frozenset({"Project", "Filter", "Expand", "Generate"})
_JOINS = frozenset({"Inner", "Cross", "LeftOuter", "RightOuter", "FullOuter", "LeftSemi",
                    "LeftAnti", existence.EXISTENCE})  # fmt: skip
#: Operators no rule covers yet, by reason code.
_REASONS = {
    "Sort": "ORDER_BY", "GlobalLimit": "LIMIT", "LocalLimit": "LIMIT", "Offset": "LIMIT",
    "Tail": "LIMIT", "Sample": "SAMPLE",
}  # fmt: skip


def unsupported(reader: PlanReader, root: Node, is_source: Callable[[Node], bool]) -> list[str]:
    """The reason codes that keep the engine from the plan (empty: it covers it)."""
    found: set[str] = set()
    for node in _walk(root):
        if node.kind in _REASONS:
            found.add(_REASONS[node.kind])
        elif not node.children:
            if not is_source(node) and node.kind not in row_maps.CONSTANT:
                found.add(f"UNSUPPORTED:{node.kind}")
        elif node.kind == "Generate":
            if not row_maps.generates(reader, node):
                found.add(f"GENERATOR:{node.jvm.generator().prettyName()}")
        elif node.kind == "Join":
            kind = join_type(node)
            if kind not in _JOINS:
                found.add(f"UNSUPPORTED:{kind}")
        elif node.kind == "Window":
            if not reader.items(node.jvm.partitionSpec()):
                found.add("WINDOW_WITHOUT_PARTITION_BY")
        elif node.kind == "Union":
            if node.jvm.byName() or node.jvm.allowMissingCol():
                found.add("UNSUPPORTED:Union")
        elif node.kind not in ROW_WISE | {"Aggregate", "Window"}:
            found.add(f"UNSUPPORTED:{node.kind}")
        if subqueries.expressions(reader, node):
            if not subqueries.evaluable(reader, node):
                found.add("SUBQUERY_EXPRESSION")
            for plan in reader.items(node.jvm.subqueries()):  # plans of their own
                found.update(unsupported(reader, existence.subquery_plan(reader, plan),
                                         is_source))  # fmt: skip
        for attribute in node.output:
            if spark_fold(str(attribute.name())).startswith("_ingest_"):  # Spark's rule
                found.add("RESERVED_NAME")
    return sorted(found)


def _walk(node: Node) -> list[Node]:
    return [node, *(n for child in node.children for n in _walk(child))]


def renews_group_ids(plan: Node, rule: int | None) -> bool:
    """Whether a table maintained under group id ``rule`` (None: written before rules
    were recorded, 1) holds ids the current rule gives otherwise: a plan grouping by
    keys, under an older rule."""
    grouped = any(n.kind == "Aggregate" and n.jvm.groupingExpressions().nonEmpty()
                  for n in _walk(plan))  # fmt: skip
    return grouped and (rule or 1) < GROUP_ID_RULE
