"""Spark's own reading of a query: the tables it names and where they are in the text.

Spark's parser gives the unresolved plan of a text without analysing anything (no
table is looked up, no function resolved). Each ``UnresolvedRelation`` in it carries
the character positions it was read from, so the binder replaces exactly those
characters: Spark, not a second parser, decides which words of a query are table names.
A name is a CTE where Spark will take it for one: a non-recursive CTE is visible after
its definition and in the main query, not in its own body; ``WITH RECURSIVE`` sees itself;
an inner WITH hides an outer one of the same name (Spark's default precedence).

Spark's plans also say where each result column comes from (:func:`outputs`): an alias
the text writes (and whether in backquotes, by the alias's characters), a column of one
of the binder's views, or neither, followed by Spark's expression ids.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipelines.errors import SqlError, spark_errors
from pipelines.sql.plan_guard import members
from pipelines.sql.type_names import parse_plan_text

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Output", "Reference", "name_parts", "outputs", "parse_plan", "references"]

#: Plan nodes that give the relation below them its alias (no alias is added then).
_ALIASES = frozenset({"SubqueryAlias", "UnresolvedSubqueryColumnAliases"})
#: Clauses Spark reads between a table's name and its alias (``t [time travel]
#: [TABLESAMPLE (...)] [WATERMARK ...] [AS alias]``): a sample, a sample of n rows (a
#: limit), an event-time watermark.
_AFTER_NAME = frozenset(
    {"Sample", "GlobalLimit", "LocalLimit", "Limit", "UnresolvedEventTimeWatermark"}
)


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
        SqlError: Spark cannot parse it (SQL_COMPILATION_ERROR, with Spark's message;
            STATEMENT_TOO_COMPLEX if it is too deep for Spark's parser).
    """
    jspark: Any = spark._jsparkSession  # type: ignore[attr-defined]
    try:
        with spark_errors("SQL_COMPILATION_ERROR"):
            return parse_plan_text(jspark, text)[0]
    except SqlError as exc:
        if "FAILED_TO_PARSE_TOO_COMPLEX" not in str(exc):
            raise
        raise SqlError(f"{exc} Write long chains of operators shorter (a + b + ... of "
                       "hundreds of terms is too deep for Spark's parser): sum a list with "
                       "aggregate(array(...), 0, (acc, x) -> acc + x), or split the statement",
                       "STATEMENT_TOO_COMPLEX") from None  # fmt: skip


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
            if not node.options().isEmpty():
                raise SqlError(f"options on a table read ({'.'.join(parts)} WITH (...)) are "
                               "not supported: the warehouse reads its tables itself; remove "
                               "the WITH (...) after the name",
                               "SQL_COMPILATION_ERROR")  # fmt: skip
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
            stack.append((child, ((kind, node), *above[:_ABOVE]), scope))
        for plan in _list(node.subqueries()):
            stack.append((plan, (), scope))
    return sorted(found, key=lambda r: r.start)


#: A plan node still to visit: the node, up to :data:`_ABOVE` + 1 of its ancestors
#: nearest first (kind, node), and the CTE names in scope.
_Item = tuple[Any, tuple[tuple[str, Any], ...], frozenset[str]]
#: Ancestors kept beyond the parent: a time travel, a sample of rows (two limits) and a
#: watermark can stand between a name and its alias.
_ABOVE = 4


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
    [TABLESAMPLE (...)] [WATERMARK ...] [AS alias]``, so an alias added goes after the
    last of these clauses written after the name."""
    start, end = _range(node)
    travel = [kind for kind, _ in above[:1]] == ["RelationTimeTravel"]
    chain = above[1:] if travel else above
    alias_at = end
    for kind, clause in chain:
        if kind not in _AFTER_NAME:
            break
        first, last = _range(clause)
        if first < end:  # a LIMIT of the query, not a clause of the name
            break
        alias_at = max(alias_at, last)
    holder = chain[0] if chain else ("", None)
    return Reference(parts, start, end, alias_at, holder[0] in _ALIASES, travel)


def _range(node: Any) -> tuple[int, int]:
    origin = node.origin()
    return int(origin.startIndex().get()), int(origin.stopIndex().get()) + 1


@dataclass(frozen=True)
class Output:
    """A result column: Spark's name for it and where that name comes from: an alias the
    text writes (``quoted``: in backquotes), a column of one of the binder's views
    (``column``: its name as stored), or neither (a name Spark made up)."""

    name: str
    alias: bool
    quoted: bool
    column: str | None


def outputs(frame: DataFrame, text: str, views: Mapping[str, Sequence[str]]) -> list[Output]:
    """Where each result column of a query's frame comes from, by Spark's expression ids:
    ``text`` is the text Spark parsed, ``views`` the binder's views and their columns."""
    spark = frame.sparkSession
    execution = frame._jdf.queryExecution()
    analyzed = execution.analyzed()
    names = list(frame.columns)
    ids = _expression_ids(analyzed.output(), names)
    aliases = _written_aliases(spark, execution.logical(), text)
    columns = {} if set(ids) <= set(aliases) else _view_columns(spark, analyzed, views)
    return [Output(name, found in aliases, aliases.get(found, False), columns.get(found))
            for name, found in zip(names, ids, strict=True)]  # fmt: skip


#: After an attribute's name in Spark's text of it: its id, a LONG's suffix, a watermark.
_ID = re.compile(r"#(\d+)L?(?:-T\d+ms)?(?=\x01|\Z)")


def _expression_ids(attributes: Any, names: Sequence[str]) -> list[int]:
    """The expression ids of a sequence of attributes named ``names``, in one call (read
    from Spark's text of them), or one call per attribute if that text is unexpected."""
    shown, ids, position = str(attributes.mkString("\x01")), [], 0
    for name in names:
        found = _ID.match(shown, position + len(name))
        if not shown.startswith(f"{name}#", position) or found is None:
            return [int(attribute.exprId().id()) for attribute in _list(attributes)]
        ids.append(int(found.group(1)))
        position = found.end() + 1
    return ids


def _written_aliases(spark: SparkSession, parsed: Any, text: str) -> dict[int, bool]:
    """The aliases of the parsed plan's nodes (each ``expression AS name``: in a select
    list, a subquery, a CTE or a view's body), by expression id: whether the name is
    written in backquotes (the parser's alias spans the expression and its name)."""
    found: dict[int, bool] = {}
    stack = [parsed]
    while stack:
        node = stack.pop()
        if _short(node) == "UnresolvedWith":
            stack.extend(pair._2() for pair in _list(node.cteRelations()))
        stack.extend(_list(node.children()))
        kinds, expressions = members(spark, node.expressions())
        for index, kind in enumerate(kinds):
            if kind.endswith(".Alias"):
                alias = expressions[index]
                stop = alias.origin().stopIndex()
                last = int(stop.get()) if stop.isDefined() else -1
                found[int(alias.exprId().id())] = last >= 0 and text[last : last + 1] == "`"
            elif kind.endswith(".LateralSubquery"):
                stack.append(expressions[index].plan())
    return found


def _view_columns(
    spark: SparkSession, analyzed: Any, views: Mapping[str, Sequence[str]]
) -> dict[int, str]:
    """The columns of the binder's views in the analyzed plan, by expression id."""
    found: dict[int, str] = {}
    stack = [analyzed]
    while stack:
        node = stack.pop()
        if _short(node) == "View":
            columns = views.get(str(node.desc().identifier().table()).lower())
            ids = _expression_ids(node.output(), columns) if columns is not None else []
            if columns is not None and len(ids) == len(columns):
                found.update(zip(ids, columns, strict=True))
            continue
        stack.extend(_list(node.children()))
        kinds, expressions = members(spark, node.expressions())
        stack.extend(expressions[i].plan() for i, k in enumerate(kinds)
                     if k.endswith(".LateralSubquery"))  # fmt: skip
    return found


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
