"""Incremental refresh of a stateless dynamic table: the query rewritten to carry row ids
and actions through (design §4); :func:`pipelines.change_sets.net_change` nets its output.

A stateless query maps every output row to exactly one source row, so running it over
the sources' net changes gives the net change of its output, provided each output row
says which source row it came from and whether that row was deleted or inserted. The
rewrite adds those two columns to every SELECT; at each ``UNION ALL`` the id is tagged
with the branch (``id * 2 + k``), innermost union first, so the outermost branch is the
lowest bit and the codes of different paths never collide (outermost first does).

The rewrite only inserts text: every character the user wrote is kept, so Spark reads
each expression as written (no parser's regeneration can change its meaning). At the
end of every SELECT list goes ``, <id> AS `_INGEST_ROW_ID`, `_INGEST_ACTION```; after
every ``*`` goes ``EXCEPT (`_INGEST_ROW_ID`, `_INGEST_ACTION`)`` (so a star still
means the user's columns); at the end of a column list naming a relation's columns
(``AS t(x, y)``, ``WITH c(x, y)``) go the two names. sqlglot, with the characters each
node was read from, says where those places are and what the query's shape is; the
caller checks that Spark gives the rewritten text the written query's columns.

Why a second check of the shape: the caller classified the plan with Spark already;
anything here that is not a projection, filter, UNION ALL, subquery in FROM or CTE over
the source views fails closed with :class:`RewriteError` rather than write a wrong id.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from flush.tables import ROW_ID_COLUMN
from ingest_sdk.schema import spark_fold
from pipelines.change_sets import REFRESH_ACTION
from pipelines.errors import SqlError
from pipelines.sql.source_text import Splice, extent, parse_with_spans

__all__ = ["RewriteError", "is_hidden", "rewrite"]

_HIDDEN = f"`{ROW_ID_COLUMN}`, `{REFRESH_ACTION}`"

#: Constructs that keep a query from being stateless, by what the message calls them.
_REFUSED: tuple[tuple[type[exp.Expression], str], ...] = (
    (exp.Join, "a join"), (exp.Lateral, "LATERAL"), (exp.AggFunc, "an aggregate"),
    (exp.Group, "GROUP BY"), (exp.Having, "HAVING"), (exp.Window, "a window function"),
    (exp.Qualify, "QUALIFY"), (exp.Distinct, "DISTINCT"), (exp.Limit, "LIMIT"),
    (exp.Offset, "OFFSET"), (exp.Fetch, "FETCH"), (exp.Sort, "SORT BY"),
    (exp.Cluster, "CLUSTER BY"), (exp.Intersect, "INTERSECT"), (exp.Except, "EXCEPT"),
    (exp.UDTF, "a generator or table function"), (exp.Inline, "a generator"),
    (exp.TableSample, "TABLESAMPLE"), (exp.Pivot, "PIVOT"),
    (exp.Rand, "a non-deterministic function"), (exp.Randn, "a non-deterministic function"),
    (exp.Uuid, "a non-deterministic function"),
    (exp.CurrentTimestamp, "a function of the current time"),
    (exp.CurrentDate, "a function of the current time"),
    (exp.CurrentTime, "a function of the current time"),
    (exp.Localtimestamp, "a function of the current time"),
    (exp.CurrentTimezone, "a function of the current time"),
)  # fmt: skip
#: Functions sqlglot does not model (exp.Anonymous) that are generators or vary by run.
_REFUSED_CALLS = frozenset({"stack", "json_tuple", "inline_outer", "shuffle", "now",
                            "monotonically_increasing_id", "spark_partition_id",
                            "input_file_name"})  # fmt: skip
#: The only clauses a SELECT, table reference or subquery may carry (anything else fails).
_SELECT_ARGS = frozenset({"expressions", "from_", "where", "with_", "hint", "distribute"})
_TABLE_ARGS = frozenset({"this", "alias"})
_SUBQUERY_ARGS = frozenset({"this", "alias", "with_"})
_UNION_ARGS = frozenset({"this", "expression", "distinct", "with_"})


class RewriteError(ValueError):
    """The query is not one the incremental rewrite supports; the message names what."""

    code = "REWRITE_UNSUPPORTED"


def rewrite(text: str, sources: Collection[str]) -> str:
    """The query over change sources, carrying each output row's packed id and action.

    Args:
        text: a bound query: its table references are the views named in ``sources``
            (each with the user's columns, then ``_INGEST_ROW_ID`` and
            ``_INGEST_ACTION``) or its CTEs; views are subqueries.
        sources: the names of the change views.

    Returns:
        ``text`` with insertions only: its columns are the query's own, then
        ``_INGEST_ROW_ID`` (the source id tagged ``id*2+k`` at every UNION ALL branch,
        innermost first; bigint, ANSI overflow raises) and ``_INGEST_ACTION``.

    Raises:
        RewriteError: anything but projections, filters, UNION ALL, subqueries in FROM
            and CTEs over the views of ``sources``.
    """
    try:
        tree = parse_with_spans(text)
        rewriter = _Rewriter(text, {_fold(name) for name in sources})
        _refuse(tree, rewriter.show)
        if not isinstance(tree, exp.Query):
            raise RewriteError(f"not a query ({rewriter.show(tree)})")
        rewriter.query(tree, frozenset())
        for select in tree.find_all(exp.Select):
            if id(select) not in rewriter.tags:
                raise RewriteError(f"a subquery outside FROM ({rewriter.show(select)})")
        for star in tree.find_all(exp.Star):  # struct(*), hash(*) in WHERE: hidden ones too
            if id(star) not in rewriter.stars:
                shown = rewriter.show(star.parent or star)
                raise RewriteError(f"a * inside an expression ({shown})")
        return rewriter.render()
    except SqlError as exc:  # a part sqlglot read without saying where
        raise RewriteError(str(exc)) from None


def _refuse(tree: exp.Expression, show: Any) -> None:
    """Fail on the first construct that is not stateless, naming it."""
    for node in tree.walk():
        for kind, what in _REFUSED:
            if isinstance(node, kind):
                raise RewriteError(f"{what} ({show(node)})")
        if isinstance(node, exp.Order) and not isinstance(node, exp.Distribute):
            raise RewriteError(f"ORDER BY ({show(node)})")
        if isinstance(node, exp.Union) and node.args.get("distinct") is not False:
            raise RewriteError(f"UNION without ALL ({show(node)})")
        if isinstance(node, exp.Anonymous) and node.name.lower() in _REFUSED_CALLS:
            raise RewriteError(f"the function {node.name} ({show(node)})")
        if isinstance(node, exp.Select) and node.args.get("from_") is None:
            raise RewriteError(f"a SELECT without FROM ({show(node)})")
        if isinstance(node, exp.Identifier) and _fold(node.name) in _HIDDEN_KEYS:
            raise RewriteError(f"a name that is one of the hidden columns {ROW_ID_COLUMN}, "
                               f"{REFRESH_ACTION}")  # fmt: skip


_fold = spark_fold


def is_hidden(name: str) -> bool:
    """Whether Spark takes ``name`` for one of the two columns the rewrite adds."""
    return _fold(name) in _HIDDEN_KEYS


_HIDDEN_KEYS = frozenset({_fold(ROW_ID_COLUMN), _fold(REFRESH_ACTION)})


def _extra(node: exp.Expression, allowed: frozenset[str], show: Any) -> None:
    for key, value in node.args.items():
        if key not in allowed and value not in (None, False, []):
            raise RewriteError(f"{key.upper()} in {show(node)}")


def _tagged(branches: list[int]) -> str:
    """The id of a row that took these UNION ALL branches (innermost first): ``(e) * 2 +
    k`` in bigint arithmetic for each, so ANSI mode raises on overflow."""
    expression = f"`{ROW_ID_COLUMN}`"
    for branch in branches:
        expression = f"({expression}) * CAST(2 AS BIGINT) + CAST({branch} AS BIGINT)"
    return expression


@dataclass
class _Rewriter:
    """One walk over the tree: checks the shape, marks where the two columns go in every
    SELECT, and collects the branches each SELECT's rows take through UNION ALLs."""

    text: str
    views: set[str]
    tags: dict[int, list[int]] = field(default_factory=dict)  # id(Select) -> branches
    ends: dict[int, int] = field(default_factory=dict)  # id(Select) -> its list's end
    inserts: dict[int, list[str]] = field(default_factory=dict)  # position -> texts, in order
    stars: set[int] = field(default_factory=set)  # id(Star) of the SELECT lists' stars

    def show(self, node: exp.Expression) -> str:
        """The characters ``node`` was read from, at most 80."""
        try:
            start, end = extent(node)
        except SqlError:
            return type(node).__name__
        found = " ".join(self.text[start:end].split())
        return found if len(found) <= 80 else found[:77] + "..."

    def insert(self, position: int, text: str) -> None:
        self.inserts.setdefault(position, []).append(text)

    def render(self) -> str:
        for key, end in self.ends.items():  # after a * ending the list: its EXCEPT first
            self.insert(end, f", {_tagged(self.tags[key])} AS {_HIDDEN}")
        splice = Splice(self.text)
        for position, texts in self.inserts.items():
            splice.replace(position, position, "".join(texts))
        return splice.render()

    def query(self, node: exp.Expression, ctes: frozenset[str]) -> list[exp.Select]:
        """Rewrite a query; the SELECTs that produce its rows (through unions and
        parentheses, not into FROM or WITH)."""
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise RewriteError(f"WITH RECURSIVE ({self.show(with_)})")
            for cte in with_.expressions:
                self._columns(cte.args.get("alias"))
                self.query(cte.this, ctes)
                ctes = ctes | {_fold(cte.alias)}
        if isinstance(node, exp.Subquery):
            _extra(node, _SUBQUERY_ARGS, self.show)
            return self.query(node.this, ctes)
        if type(node) is exp.Union:
            _extra(node, _UNION_ARGS, self.show)
            branches = (self.query(node.this, ctes), self.query(node.expression, ctes))
            for branch, producers in enumerate(branches):
                for select in producers:  # innermost unions were tagged first
                    self.tags[id(select)].append(branch)
            return branches[0] + branches[1]
        if isinstance(node, exp.Select):
            self._select(node, ctes)
            return [node]
        raise RewriteError(f"{type(node).__name__} where a query belongs ({self.show(node)})")

    def _select(self, select: exp.Select, ctes: frozenset[str]) -> None:
        _extra(select, _SELECT_ARGS, self.show)
        relation = select.args["from_"].this
        if isinstance(relation, exp.Table):
            _extra(relation, _TABLE_ARGS, self.show)
            if _fold(relation.name) not in ctes | self.views or relation.args.get("db"):
                raise RewriteError(f"a table that is not a source or a CTE "
                                   f"({self.show(relation)})")  # fmt: skip
        elif isinstance(relation, exp.Subquery):
            self.query(relation, ctes)
        else:
            raise RewriteError(f"{type(relation).__name__} in FROM ({self.show(relation)})")
        self._columns(relation.args.get("alias"))
        for item in select.expressions:
            self._star(item, _fold(relation.alias_or_name))
        self.tags[id(select)] = []
        self.ends[id(select)] = extent(select.expressions[-1])[1]

    def _star(self, item: exp.Expression, relation: str) -> None:
        """A ``*`` or ``q.*`` (``q`` the relation) in a SELECT list keeps meaning the
        user's columns; ``s.*`` over a struct column has no hidden fields. A star anywhere
        else is refused by :func:`rewrite`."""
        star = item.this if isinstance(item, exp.Column) else item
        if not isinstance(star, exp.Star):
            return
        if any(star.args.get(key) for key in ("except_", "except", "replace", "rename")):
            raise RewriteError(f"a * with EXCEPT, REPLACE or RENAME ({self.show(item)})")
        self.stars.add(id(star))
        qualifier = [part.name for part in item.parts[:-1]] if isinstance(item, exp.Column) else []
        if qualifier and [_fold(part) for part in qualifier] != [relation]:
            return  # a struct's fields: Spark reads a one-part name as the relation first
        self.insert(extent(item)[1], f" EXCEPT ({_HIDDEN})")

    def _columns(self, alias: exp.Expression | None) -> None:
        """A list naming a relation's columns names the hidden two as well."""
        if isinstance(alias, exp.TableAlias) and alias.columns:
            self.insert(extent(alias.columns[-1])[1], f", {_HIDDEN}")
