"""Spark's own reading of a query: the tables it names and where they are in the text.

Spark's parser gives the unresolved plan of a text without analysing anything (no
table is looked up, no function resolved). Each ``UnresolvedRelation`` in it carries
the character positions it was read from, so the binder replaces exactly those
characters: Spark, not a second parser, decides which words of a query are table names.
A name is a CTE where Spark will take it for one: a non-recursive CTE is visible after
its definition and in the main query, not in its own body; ``WITH RECURSIVE`` sees itself;
an inner WITH hides an outer one of the same name (Spark's default precedence).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipelines.errors import SqlError, spark_errors

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["Reference", "name_parts", "parse_plan", "references"]

#: Plan nodes that give the relation below them its alias (no alias is added then).
_ALIASES = frozenset({"SubqueryAlias", "UnresolvedSubqueryColumnAliases"})
#: Plan nodes a TABLESAMPLE clause becomes.
_SAMPLES = frozenset({"Sample", "GlobalLimit", "LocalLimit", "Limit"})


@dataclass(frozen=True)
class Reference:
    """A table name in a query: Spark's parts of it, its characters ``[start, end)``, and
    where an alias goes when the query gives it none (after a TABLESAMPLE, if any)."""

    parts: tuple[str, ...]
    start: int
    end: int
    alias_at: int
    aliased: bool
    time_travel: bool


def parse_plan(spark: SparkSession, text: str) -> Any:
    """Spark's unresolved plan of ``text`` (a JVM object).

    Raises:
        SqlError: Spark cannot parse it (SQL_COMPILATION_ERROR, with Spark's message).
    """
    jspark: Any = spark._jsparkSession  # type: ignore[attr-defined]
    with spark_errors("SQL_COMPILATION_ERROR"):
        return jspark.sessionState().sqlParser().parsePlan(text)


def references(spark: SparkSession, text: str) -> list[Reference]:
    """The table names of a query as Spark reads them, but those that name a CTE in
    scope, in order of position.

    Raises:
        SqlError: Spark cannot parse the text.
    """
    found: list[Reference] = []
    stack: list[_Item] = [(parse_plan(spark, text), (), frozenset())]
    while stack:
        node, above, scope = stack.pop()
        kind = _short(node)
        if kind == "UnresolvedRelation":
            parts = _seq(node.multipartIdentifier())
            if not (len(parts) == 1 and parts[0].lower() in scope):
                found.append(_reference(node, parts, above))
            continue
        if kind == "UnresolvedWith":
            stack.extend(_cte_bodies(node, scope))
            names = frozenset(str(pair._1()).lower() for pair in _list(node.cteRelations()))
            stack.append((node.child(), (), scope | names))
            continue
        children = _list(node.children())
        if kind == "RelationTimeTravel":  # ``t@v1``: its relation is not a child
            children = [node.relation()]
        for child in children:
            stack.append((child, ((kind, node), *above[:1]), scope))
        for plan in _list(node.subqueries()):
            stack.append((plan, (), scope))
    return sorted(found, key=lambda r: r.start)


#: A plan node still to visit: the node, its parent and grandparent (kind, node), and the
#: CTE names in scope.
_Item = tuple[Any, tuple[tuple[str, Any], ...], frozenset[str]]


def _cte_bodies(node: Any, scope: frozenset[str]) -> list[_Item]:
    """Each CTE's body with the names it sees: the CTEs before it (and itself, in a
    ``WITH RECURSIVE``)."""
    recursive = bool(node.allowRecursion()) if _has(node, "allowRecursion") else False
    bodies: list[_Item] = []
    seen = scope
    for pair in _list(node.cteRelations()):
        name = str(pair._1()).lower()
        bodies.append((pair._2(), (), seen | {name} if recursive else seen))
        seen = seen | {name}
    return bodies


def _reference(node: Any, parts: tuple[str, ...], above: tuple[tuple[str, Any], ...]) -> Reference:
    """A relation's name and where its alias is or goes: Spark reads ``t [time travel]
    [TABLESAMPLE (...)] [AS alias]``, so an alias added goes after the sample."""
    start, end = _range(node)
    kinds = [kind for kind, _ in above]
    travel = kinds[:1] == ["RelationTimeTravel"]
    holder = above[1] if travel and len(above) > 1 else (above[0] if above else ("", None))
    # TABLESAMPLE (n PERCENT) is a Sample, (n ROWS) a limit, read from after the name.
    sampled = holder[0] in _SAMPLES and _range(holder[1])[0] >= end
    alias_at = _range(holder[1])[1] if sampled else end
    return Reference(parts, start, end, alias_at, holder[0] in _ALIASES, travel)


def _range(node: Any) -> tuple[int, int]:
    origin = node.origin()
    return int(origin.startIndex().get()), int(origin.stopIndex().get()) + 1


_PART = re.compile(r"`((?:[^`]|``)*)`|([^\s.`]+)")
_DOT = re.compile(r"\s*\.\s*")


def name_parts(written: str) -> list[tuple[str, bool]]:
    """The parts of a dotted name as written, each with whether it was backquoted.

    Raises:
        SqlError: the characters are not a dotted name.
    """
    parts: list[tuple[str, bool]] = []
    position = 0
    while True:
        match = _PART.match(written, position)
        if match is None:
            break
        quoted = match.group(1) is not None
        parts.append((match.group(1).replace("``", "`") if quoted else match.group(2), quoted))
        position = match.end()
        dot = _DOT.match(written, position)
        if dot is None:
            break
        position = dot.end()
    if position != len(written) or not parts:
        raise SqlError(f"cannot read the table name {written[:80]!r}; write db.schema.name "
                       "with `backquotes` around a part that needs them",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    return parts


def _short(node: Any) -> str:
    return str(node.getClass().getSimpleName())


def _seq(seq: Any) -> tuple[str, ...]:
    return tuple(str(seq.apply(i)) for i in range(seq.size()))


def _list(seq: Any) -> list[Any]:
    return [seq.apply(i) for i in range(seq.size())]


def _has(node: Any, method: str) -> bool:
    try:
        getattr(node, method)
    except Exception:  # py4j raises its own error for a missing member
        return False
    return True
