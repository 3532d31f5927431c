"""Incremental refresh of a stateless dynamic table: the query rewritten to carry row ids
and actions through, and the net change of its output (design §4).

A stateless query maps every output row to exactly one source row, so running it over
the sources' net changes gives the net change of its output, provided each output row
says which source row it came from and whether that row was deleted or inserted. The
rewrite adds those two columns to every SELECT; at each ``UNION ALL`` the id is tagged
with the branch (``id * 2 + k``), innermost union first, so the outermost branch is the
lowest bit and the codes of different paths never collide (outermost first does).

Why a second check at all: the caller classified the plan with Spark already; anything
here that is not a projection, filter, UNION ALL, subquery in FROM or CTE over the
source views fails closed with :class:`RewriteError` rather than write a wrong id.

Names: ``qualify`` runs case-sensitively so names keep their case, but Spark resolves
names case-insensitively (``spark.sql.caseSensitive`` false), so every identifier is
first respelled to one spelling per case-insensitive class (a source column's own,
else the first seen). Output column names may therefore differ from Spark's (``_col_0``
for an unnamed expression, a column's spelling): callers map the result **by position**.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.qualify import qualify

from pipelines.streams.changes import _same_values

__all__ = ["ACTION", "ROW_ID", "NetChange", "RewriteError", "net_change", "rewrite"]

ROW_ID = "_INGEST_ROW_ID"
ACTION = "_INGEST_ACTION"
_DIALECT = "spark, normalization_strategy=case_sensitive"

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


def rewrite(tree: exp.Query, sources: Mapping[str, Sequence[str]]) -> exp.Query:
    """The query over change sources, carrying each output row's packed id and action.

    Args:
        tree: a bound query (Spark dialect): table references are the ``ingest_v<N>``
            views of ``sources``, views are subqueries. Not modified.
        sources: view name -> its user columns in order (not the two hidden ones).

    Returns:
        A query whose columns are the original output columns (same order and values,
        names possibly respelled: map them by position), then ``_INGEST_ROW_ID`` (the
        source id tagged ``id*2+k`` at every UNION ALL branch, innermost first; bigint,
        ANSI overflow raises) and ``_INGEST_ACTION`` (the source row's action).

    Raises:
        RewriteError: anything but projections, filters, UNION ALL, subqueries in FROM
            and CTEs over the views of ``sources``.
    """
    tree = tree.copy()
    _refuse(tree)
    for table in list(tree.find_all(exp.Table)):
        alias = table.args.get("alias")
        if alias is not None and alias.columns:  # qualify moves a subquery's into its SELECT
            bare = exp.Table(this=table.this.copy(), alias=exp.TableAlias(this=table.this.copy()))
            table.replace(exp.Subquery(this=exp.select("*").from_(bare), alias=alias.pop()))
    schema = _respell(tree, sources)
    try:
        qualified = qualify(
            tree,
            schema=schema,
            dialect=_DIALECT,
            expand_stars=True,
            quote_identifiers=True,
            validate_qualify_columns=True,
            identify=True,
        )
    except (SqlglotError, RecursionError) as exc:
        raise RewriteError(f"the query cannot be resolved for the rewrite: {exc}") from exc
    if not isinstance(qualified, exp.Query):
        raise RewriteError(f"not a query ({_show(qualified)})")
    if qualified.find(exp.Star):
        raise RewriteError("a * that could not be expanded to the source columns")
    rewriter = _Rewriter(set(schema))
    rewriter.query(qualified, frozenset(), nested=False)
    for select in qualified.find_all(exp.Select):
        if id(select) not in rewriter.rows:
            raise RewriteError(f"a subquery outside FROM ({_show(select)})")
    return qualified


def _show(node: exp.Expression) -> str:
    text = node.sql("spark")
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(tree: exp.Expression) -> None:
    """Fail on the first construct that is not stateless, naming it."""
    for node in tree.walk():
        for kind, what in _REFUSED:
            if isinstance(node, kind):
                raise RewriteError(f"{what} ({_show(node)})")
        if isinstance(node, exp.Order) and not isinstance(node, exp.Distribute):
            raise RewriteError(f"ORDER BY ({_show(node)})")
        if isinstance(node, exp.Union) and node.args.get("distinct") is not False:
            raise RewriteError(f"UNION without ALL ({_show(node)})")
        if isinstance(node, exp.Anonymous) and node.name.lower() in _REFUSED_CALLS:
            raise RewriteError(f"the function {node.name} ({_show(node)})")
        if isinstance(node, exp.Select) and node.args.get("from_") is None:
            raise RewriteError(f"a SELECT without FROM ({_show(node)})")


def _fold(name: str) -> str:
    """The case-insensitive key of a name, as Java's ``equalsIgnoreCase`` compares
    (character by character: upper, then lower)."""
    out = []
    for char in name:
        upper = char.upper() if len(char.upper()) == 1 else char
        out.append(upper.lower() if len(upper.lower()) == 1 else upper)
    return "".join(out)


def _respell(tree: exp.Expression, sources: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """Give every identifier one spelling per case-insensitive class (in place), so the
    case-sensitive ``qualify`` resolves names as Spark does; the schema it needs."""
    views = {_fold(name): name for name in sources}
    spelling: dict[str, str] = {}
    used: list[str] = []
    for table in tree.find_all(exp.Table):
        view = views.get(_fold(table.name))
        if view is not None and not _names_a_cte(table) and view not in used:
            used.append(view)
            spelling.setdefault(_fold(view), view)
            seen: set[str] = set()
            for column in sources[view]:
                if _fold(column) in seen:
                    raise RewriteError(f"{view} has columns whose names differ only in case "
                                       f"({column!r}); Spark cannot tell them apart")  # fmt: skip
                seen.add(_fold(column))
                spelling.setdefault(_fold(column), column)
        elif view is None and not _names_a_cte(table):
            raise RewriteError(f"a table that is not a source or a CTE ({_show(table)})")
    names = [i for i in tree.find_all(exp.Identifier) if not i.find_ancestor(exp.DataType)]
    for identifier in names:
        spelling.setdefault(_fold(identifier.name), identifier.name)
    hidden = {_fold(ROW_ID), _fold(ACTION)}
    if hidden & set(spelling):
        raise RewriteError(f"a name that is one of the hidden columns {ROW_ID}, {ACTION}")
    for identifier in names:
        identifier.set("this", spelling[_fold(identifier.name)])
    return {v: {spelling[_fold(c)]: "STRING" for c in sources[v]} for v in used}


def _names_a_cte(table: exp.Table) -> bool:
    """Whether a one-part name is a CTE of a WITH around it (before the respelling, so
    compared case-insensitively)."""
    if table.args.get("db") or table.args.get("catalog"):
        return False
    node = table.parent
    while node is not None:
        with_ = node.args.get("with_")
        if isinstance(with_, exp.With) and any(
            _fold(cte.alias) == _fold(table.name) for cte in with_.expressions
        ):
            return True
        node = node.parent
    return False


def _extra(node: exp.Expression, allowed: frozenset[str]) -> None:
    for key, value in node.args.items():
        if key not in allowed and value not in (None, False, []):
            raise RewriteError(f"{key.upper()} in {_show(node)}")
    alias = node.args.get("alias")
    if isinstance(alias, exp.TableAlias) and alias.columns:  # qualify should have moved it
        raise RewriteError(f"a column list on {_show(node)}")


def _tag(expression: exp.Expression, branch: int) -> exp.Expression:
    """``(e) * 2 + k`` in bigint arithmetic, so ANSI mode raises on overflow."""

    def bigint(value: int) -> exp.Expression:
        return exp.cast(exp.Literal.number(value), exp.DataType.build("BIGINT"))

    return exp.Add(this=exp.Mul(this=exp.Paren(this=expression), expression=bigint(2)),
                   expression=bigint(branch))  # fmt: skip


class _Rewriter:
    """One walk over the qualified tree: checks the shape, appends the two columns to
    every SELECT and tags the SELECTs that produce each UNION ALL branch."""

    def __init__(self, views: set[str]) -> None:
        self.views = views
        self.rows: dict[int, exp.Alias] = {}  # id(Select) -> its row-id column

    def query(self, node: exp.Expression, ctes: frozenset[str], nested: bool) -> list[exp.Select]:
        """Rewrite a query; the SELECTs that produce its rows (through unions and
        parentheses, not into FROM or WITH). ``nested``: its columns are read by name."""
        with_ = node.args.get("with_")
        if with_ is not None:
            if with_.args.get("recursive"):
                raise RewriteError(f"WITH RECURSIVE ({_show(with_)})")
            for cte in with_.expressions:
                if cte.args.get("alias") is not None and cte.args["alias"].columns:
                    raise RewriteError(f"a CTE column list that qualify kept ({_show(cte)})")
                self.query(cte.this, ctes, nested=True)
                ctes = ctes | {cte.alias}
        if nested:
            _check_names(node)
        if isinstance(node, exp.Subquery):
            _extra(node, _SUBQUERY_ARGS)
            return self.query(node.this, ctes, nested=False)
        if type(node) is exp.Union:
            _extra(node, _UNION_ARGS)
            branches = (self.query(node.this, ctes, nested=False),
                        self.query(node.expression, ctes, nested=False))  # fmt: skip
            for branch, producers in enumerate(branches):
                for select in producers:  # innermost unions were tagged first
                    alias = self.rows[id(select)]
                    alias.set("this", _tag(alias.this, branch))
            return branches[0] + branches[1]
        if isinstance(node, exp.Select):
            self._select(node, ctes)
            return [node]
        raise RewriteError(f"{type(node).__name__} where a query belongs ({_show(node)})")

    def _select(self, select: exp.Select, ctes: frozenset[str]) -> None:
        _extra(select, _SELECT_ARGS)
        relation = select.args["from_"].this
        if isinstance(relation, exp.Table):
            _extra(relation, _TABLE_ARGS)
            if relation.name not in ctes and relation.name not in self.views:
                raise RewriteError(f"a table that is not a source or a CTE ({_show(relation)})")
        elif isinstance(relation, exp.Subquery):
            self.query(relation, ctes, nested=True)
        else:
            raise RewriteError(f"{type(relation).__name__} in FROM ({_show(relation)})")
        source = relation.alias_or_name
        row_id = exp.alias_(exp.column(ROW_ID, source, quoted=True), ROW_ID, quoted=True)
        action = exp.alias_(exp.column(ACTION, source, quoted=True), ACTION, quoted=True)
        select.set("expressions", [*select.expressions, row_id, action])
        self.rows[id(select)] = row_id


def _check_names(node: exp.Expression) -> None:
    """A query read by name must name its columns once each: a ``*`` over it worked by
    position in Spark, but its expansion into names would be ambiguous."""
    while isinstance(node, exp.Subquery):
        node = node.this
    seen: set[str] = set()
    for name in node.named_selects if isinstance(node, exp.Query) else ():
        if _fold(name) in seen:
            raise RewriteError(f"a subquery or CTE with two columns named {name!r}")
        seen.add(_fold(name))


@dataclass(frozen=True)
class NetChange:
    """The net change of a dynamic table from one incremental refresh.

    ``rows``: user columns + ``_INGEST_ROW_ID``, the rows to write (inserts and
    updates); ``deleted``: ids to delete; ``new_ids``: the ids in ``rows`` that are
    inserts (no row to replace); ``updated``: how many rows replace one."""

    rows: pa.Table
    deleted: pa.Array
    new_ids: pa.Array
    updated: int


def net_change(result: pa.Table, columns: Sequence[str]) -> NetChange:
    """Net the rewritten query's output over change sources (design §4 "ChangeSet").

    A DELETE and an INSERT with the same id and equal values (null-safe, NaN = NaN) drop
    out: a change to a column the query does not select writes nothing.

    Args:
        result: the user columns (named ``columns``, in order), ``_INGEST_ROW_ID``,
            ``_INGEST_ACTION``.
        columns: the user column names.

    Raises:
        ValueError: an id twice among DELETE rows or among INSERT rows (the sources'
            changes were not netted), a null id, or an action that is neither.
    """
    table = result.select([*columns, ROW_ID, ACTION])
    ids = pc.cast(table.column(ROW_ID), pa.int64())
    if ids.null_count:
        raise ValueError(f"{ROW_ID} is null in {ids.null_count} rows")
    action = table.column(ACTION)
    deleting, inserting = pc.equal(action, "DELETE"), pc.equal(action, "INSERT")
    if not pc.all(pc.or_(deleting, inserting).fill_null(False), min_count=0).as_py():
        raise ValueError(f"{ACTION} holds a value other than INSERT and DELETE")
    kept = pa.table([*(table.column(c) for c in columns), ids], names=[*columns, ROW_ID])
    deletes = kept.filter(deleting).combine_chunks()
    inserts = kept.filter(inserting).combine_chunks()
    for kind, rows in (("DELETE", deletes), ("INSERT", inserts)):
        if len(pc.unique(rows.column(ROW_ID))) != rows.num_rows:
            raise ValueError(f"an id appears twice among {kind} rows: the change sets "
                             "of the sources were not netted")  # fmt: skip
    delete_ids = deletes.column(ROW_ID).combine_chunks()
    insert_ids = inserts.column(ROW_ID).combine_chunks()
    before = deletes.take(pc.index_in(insert_ids, value_set=delete_ids))
    same = pc.is_in(insert_ids, value_set=delete_ids)
    for position in range(len(columns)):
        equal = _equal(inserts.column(position), before.column(position))
        same = pc.and_(same, equal.fill_null(False))
    rows = inserts.filter(pc.invert(same))
    row_ids = rows.column(ROW_ID).combine_chunks()
    replaced = pc.is_in(row_ids, value_set=delete_ids)
    return NetChange(
        rows=rows,
        deleted=delete_ids.filter(pc.invert(pc.is_in(delete_ids, value_set=insert_ids))),
        new_ids=row_ids.filter(pc.invert(replaced)),
        updated=pc.sum(pc.cast(replaced, pa.int64())).as_py() or 0,
    )


def _equal(left: pa.ChunkedArray, right: pa.ChunkedArray) -> pa.Array:
    """``_same_values``; for types Arrow cannot compare (lists, structs, maps) by
    their Python values (NaN = NaN)."""
    try:
        return _same_values(left, right)
    except pa.ArrowNotImplementedError:
        return pa.array([_same(a, b) for a, b in zip(left.to_pylist(), right.to_pylist(),
                                                     strict=True)])  # fmt: skip


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, float) and isinstance(right, float) and left != left:
        return right != right
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same(left[k], right[k]) for k in left)
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        return len(left) == len(right) and all(map(_same, left, right))
    return bool(left == right)
