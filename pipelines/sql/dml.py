"""INSERT, UPDATE, DELETE and MERGE: Spark computes what changes, as rows keyed by the
hidden row id; the transaction stages them and commits them through ``flush``.

Each statement becomes one Spark query over the transaction's view of the target
(with its row ids) and its sources, made of the statement's own characters (each
expression, source and condition exactly as written; sqlglot only says where each one
is): for UPDATE the new state of every matching row,
for DELETE the ids of the matching rows, for MERGE the clause each source row takes.
Results are checked with the ingest conversion rules (types, lengths, NOT NULL), so a
row inserted by SQL is stored exactly as the same row ingested through a channel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from catalog import TableInfo
from flush.change_commit import ChangeSet
from flush.spark_tables import rows_frame
from flush.tables import ROW_ID_COLUMN, delta_schema
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.schema import Column, quote_identifier, spark_fold
from pipelines.errors import SqlError
from pipelines.sql.binding import Binder, quote
from pipelines.sql.source_text import extent

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.transactions.transaction import Transaction

__all__ = ["run_delete", "run_insert", "run_merge", "run_update"]

_RID = f"`{ROW_ID_COLUMN}`"


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _column(info: TableInfo, identifier: exp.Expression) -> Column:
    """The target column an assignment or column list names (identifier rules)."""
    node = identifier.this if isinstance(identifier, exp.Column) else identifier
    if isinstance(identifier, exp.Column) and identifier.table:
        _check_qualifier(identifier)
    if not isinstance(node, exp.Identifier):
        shown = identifier.sql("spark") if identifier is not None else "nothing"
        raise SqlError(f"expected a column name, got {shown[:80]!r}", "SQL_COMPILATION_ERROR")
    name = node.name if node.quoted else node.name.upper()
    column = info.schema.find(quote_identifier(name))
    if column is None:
        raise SqlError(
            f"invalid identifier {node.name!r}: table {info.full_name} has the columns "
            f"{', '.join(info.schema.names)}",
            "SQL_COMPILATION_ERROR",
        )
    return column


def _check_qualifier(column: exp.Column) -> None:
    """A target column written qualified (``SET t.c = ...``) must be qualified by the
    target's alias, or its name when it has none, as Spark resolves it.

    Raises:
        SqlError: another qualifier (a source's alias, a name no relation has): it was
            dropped, and the target's column written.
    """
    statement = column.root()
    table = statement.this.this if isinstance(statement.this, exp.Schema) else statement.this
    target = (table.alias or table.name) if isinstance(table, exp.Table) else ""
    qualifier = [part.name for part in column.parts[:-1]]
    if len(qualifier) != 1 or spark_fold(qualifier[0]) != spark_fold(target):
        raise SqlError(
            f"invalid identifier {column.sql('spark')[:80]!r}: the columns set or listed "
            f"here are the target's ({target}); write the column alone ({column.name}) or "
            f"qualified by {target}", "SQL_COMPILATION_ERROR",
        )  # fmt: skip


def _rows(
    session: StatementContext, info: TableInfo, data: pa.Table, new: bool = False
) -> pa.Table:
    """A result (the table's columns in order, then the row id unless ``new``) as the
    table's rows, checked by the ingest conversion rules. New rows get ids from the
    table's sequence, reserved in the catalog."""
    names = info.schema.names
    # The checker reads column names by identifier rules: quoted, a "Doc" stays Doc.
    user = data.select(list(range(len(names)))).rename_columns(
        [quote_identifier(name) for name in names]
    )
    checked = check_arrow_batch(info.schema, user)
    target = delta_schema(info.schema)
    if new:
        first = session.catalog.reserve_row_ids(info.id, checked.num_rows)
        ids = pa.array(range(first, first + checked.num_rows), pa.int64())
    else:
        ids = data.column(len(names)).combine_chunks().cast(pa.int64())
    return checked.append_column(target.field(ROW_ID_COLUMN), ids).cast(target)


def _result(session: StatementContext, **counts: int) -> DataFrame:
    # Snowflake's column names: "number of rows updated", "number of multi-joined ...".
    names = [name.replace("_", " ").replace("multi joined", "multi-joined") for name in counts]
    schema = ", ".join(f"`{name}` BIGINT" for name in names)
    return rows_frame(session.spark, [tuple(counts.values())], schema)


def _target(binder: Binder, txn: Transaction, table: exp.Table) -> tuple[TableInfo, str, str]:
    """The DML target, the view of it with row ids, and the alias statements use."""
    info = binder.target(table, _statement_name(table))
    alias = table.alias or table.name
    view = binder.view(txn.table_frame(info, row_ids=True), info.full_name)
    return info, view, quote(alias)


def _statement_name(table: exp.Table) -> str:
    """UPDATE, DELETE or MERGE: the statement whose target ``table`` is."""
    node = table.parent
    while node is not None and not isinstance(node, exp.Update | exp.Delete | exp.Merge):
        node = node.parent
    return type(node).__name__.upper() if node is not None else "this statement"


def _written(text: str, *nodes: exp.Expression) -> str:
    """The characters of ``text`` from the first node to the last, as written."""
    return text[extent(nodes[0])[0] : extent(nodes[-1])[1]]


def _clause(text: str, node: exp.Expression | None, keyword: str) -> str:
    """A clause as written without its keyword (``FROM a, b`` gives ``a, b``)."""
    if node is None:
        return ""
    written = _written(text, node)
    if written[: len(keyword)].upper() != keyword:
        raise SqlError(f"cannot read the {keyword} clause {written[:60]!r}",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    return written[len(keyword) :].strip()


#: What each statement may hold (sqlglot reads more; what we would not carry is refused).
_ALLOWED: dict[type[exp.Expression], set[str]] = {
    exp.Insert: {"this", "expression"},
    exp.Update: {"this", "expressions", "from_", "where"},
    exp.Delete: {"this", "using", "where"},
    exp.Merge: {"this", "using", "on", "whens"},
}


def _only_known(tree: exp.Expression) -> None:
    allowed = _ALLOWED[type(tree)]
    for key, value in tree.args.items():
        if key not in allowed and value not in (None, False, []):
            shown = key.upper().replace("_", " ")
            raise SqlError(f"{type(tree).__name__.upper()} with {shown} is not supported",
                           "SQL_COMPILATION_ERROR")  # fmt: skip


def run_insert(
    session: StatementContext, txn: Transaction, tree: exp.Insert, text: str
) -> DataFrame:
    _only_known(tree)
    binder = Binder(session, txn)
    target = tree.this
    listed = target.expressions if isinstance(target, exp.Schema) else []
    table = target.this if isinstance(target, exp.Schema) else target
    info = binder.target(table, "INSERT")
    if tree.expression is None:
        raise SqlError(
            "INSERT needs VALUES (...) or a query after the table", "SQL_COMPILATION_ERROR"
        )
    frame = session.run_spark(binder.bind_query(_written(text, tree.expression)))
    columns = [_column(info, c) for c in listed] if listed else list(info.schema.columns)
    if len(frame.columns) != len(columns):
        raise SqlError(
            f"INSERT into {info.full_name} names {len(columns)} column(s) but the query "
            f"gives {len(frame.columns)}; list the target columns or match the query to them",
            "SQL_COMPILATION_ERROR",
        )
    # By position, as INSERT means: a query's columns may share a name.
    frame = frame.toDF(*[f"c{i}" for i in range(len(frame.columns))])
    given = {c.name: f"c{i}" for i, c in enumerate(columns)}
    from pyspark.sql import functions as F

    frame = frame.select(
        *[
            (F.col(_q(given[c.name])) if c.name in given else F.lit(None)).alias(c.name)
            for c in info.schema.columns
        ]
    )
    rows = _rows(session, info, frame.toArrow(), new=True)
    txn.stage(info, ChangeSet(rows, new_ids=rows.column(ROW_ID_COLUMN).combine_chunks()))
    session.consumed(txn, binder)
    return _result(session, number_of_rows_inserted=rows.num_rows)


def run_update(
    session: StatementContext, txn: Transaction, tree: exp.Update, text: str
) -> DataFrame:
    _only_known(tree)
    binder = Binder(session, txn)
    info, view, alias = _target(binder, txn, tree.this)
    assigned = {}
    if not tree.expressions:
        raise SqlError("UPDATE needs SET column = value", "SQL_COMPILATION_ERROR")
    for assignment in tree.expressions:
        if not isinstance(assignment, exp.EQ):
            raise SqlError(
                f"cannot read the assignment {assignment.sql('spark')[:80]!r}; write "
                "SET column = value",
                "SQL_COMPILATION_ERROR",
            )
        column = _column(info, assignment.this)
        assigned[column.name] = _written(text, assignment.expression)
    values = [f"{assigned.get(c, f'{alias}.{_q(c)}')} AS {_q(c)}" for c in info.schema.names]
    sources = _clause(text, tree.args.get("from_"), "FROM")
    extra = f", {sources}" if sources else ""
    where = _where(text, tree)
    query = f"SELECT {', '.join(values)}, {alias}.{_RID} FROM {view} AS {alias}{extra}{where}"
    # A row matched by several source rows is updated once, by one of them (Snowflake's
    # default), and counted as multi-joined.
    joined = session.run_spark(binder.bind(query)).toArrow()
    ids = joined.column(ROW_ID_COLUMN)
    firsts = pc.index_in(pc.unique(ids), value_set=ids)
    counts = pc.value_counts(ids).field("counts")
    multi = pc.sum(pc.greater(counts, 1).cast(pa.int64())).as_py() or 0
    rows = _rows(session, info, joined.take(firsts))
    txn.stage(info, ChangeSet(rows))
    session.consumed(txn, binder)
    return _result(session, number_of_rows_updated=rows.num_rows,
                   number_of_multi_joined_rows_updated=multi)  # fmt: skip


def _where(text: str, tree: exp.Expression) -> str:
    """`` WHERE <condition as written>`` (a line break after it ends a trailing comment)."""
    node = tree.args.get("where")
    return f" WHERE {_clause(text, node, 'WHERE')}\n" if node is not None else ""


def run_delete(
    session: StatementContext, txn: Transaction, tree: exp.Delete, text: str
) -> DataFrame:
    _only_known(tree)
    binder = Binder(session, txn)
    info, view, alias = _target(binder, txn, tree.this)
    using = tree.args.get("using")
    extra = f", {_written(text, *using)}" if using else ""
    query = f"SELECT DISTINCT {alias}.{_RID} FROM {view} AS {alias}{extra}{_where(text, tree)}"
    ids = session.run_spark(binder.bind(query)).toArrow().column(0)
    ids = ids.combine_chunks().cast(pa.int64())
    txn.stage(info, ChangeSet(delta_schema(info.schema).empty_table(), deleted=ids))
    session.consumed(txn, binder)
    return _result(session, number_of_rows_deleted=len(ids))


def _check_deterministic(matched: pa.ChunkedArray, is_update: pa.ChunkedArray) -> None:
    """Snowflake's rule: a target row matched by several source rows is deterministic
    only if all of them chose a DELETE clause (one source row choosing UPDATE, and no
    other row matching, is the other deterministic case).

    Raises:
        SqlError: NONDETERMINISTIC_MERGE, otherwise.
    """
    ids = matched.filter(pc.is_valid(matched))
    if len(pc.unique(ids)) == len(ids):
        return
    updated = pc.unique(matched.filter(is_update))
    counts = pc.value_counts(ids)
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    if pc.any(pc.is_in(repeated, value_set=updated)).as_py():
        raise SqlError(
            "MERGE is nondeterministic: a target row matches more than one source row and "
            "one of them updates it; make the ON condition match at most one source row per "
            "target row (several matches are allowed when they all delete it)",
            "NONDETERMINISTIC_MERGE",
        )


def run_merge(session: StatementContext, txn: Transaction, tree: exp.Merge, text: str) -> DataFrame:
    """One query gives, per source row, the clause it takes (``__clause``, the index of
    the WHEN) and the target row's new values under that clause."""
    _only_known(tree)
    binder = Binder(session, txn)
    info, view, alias = _target(binder, txn, tree.this)
    source = _written(text, tree.args["using"])
    on = _written(text, tree.args["on"])
    whens = tree.args["whens"].expressions
    choice = _merge_choice(text, whens, alias)
    values = _merge_values(info, text, whens, alias, choice)
    query = (
        f"SELECT {', '.join(values)}, {alias}.{_RID}, {choice} AS __clause"
        f" FROM {source} LEFT JOIN {view} AS {alias} ON {on} WHERE ({choice}) IS NOT NULL"
    )
    data = session.run_spark(binder.bind(query)).toArrow()
    return _stage_merge(session, txn, binder, info, whens, data)


def _merge_choice(text: str, whens: list[exp.When], alias: str) -> str:
    """``CASE WHEN <matched or not> [AND <condition as written>] THEN <index> ... END``:
    the first WHEN clause a joined row satisfies."""
    clauses = []
    for index, when in enumerate(whens):
        if when.args.get("source"):
            raise SqlError("WHEN NOT MATCHED BY SOURCE is not supported", "SQL_COMPILATION_ERROR")
        matched = f"{alias}.{_RID} IS {'NOT ' if when.args.get('matched') else ''}NULL"
        condition = when.args.get("condition")
        clauses.append(
            f"WHEN {matched}{f' AND ({_written(text, condition)})' if condition else ''} "
            f"THEN {index}"
        )
    return f"CASE {' '.join(clauses)} END"


def _merge_values(
    info: TableInfo, text: str, whens: list[exp.When], alias: str, choice: str
) -> list[str]:
    """Each target column's value, by the clause chosen (``CASE <choice> WHEN <index>
    THEN <value> ... END``); a DELETE clause writes none."""
    written = [_clause_values(info, text, when, alias) for when in whens]
    values = []
    for name in info.schema.names:
        branches = [f"WHEN {index} THEN {given[name]}"
                    for index, given in enumerate(written) if given is not None]  # fmt: skip
        if not branches:  # only DELETE clauses: the values are never written
            values.append(f"{alias}.{_q(name)} AS {_q(name)}")
        else:
            values.append(f"CASE {choice} {' '.join(branches)} END AS {_q(name)}")
    return values


def _clause_values(info: TableInfo, text: str, when: exp.When, alias: str) -> dict[str, str] | None:
    """What a WHEN clause writes in each target column, as written (an UPDATE keeps the
    columns it does not set, an INSERT leaves them NULL); None for a DELETE."""
    then = when.args["then"]
    if isinstance(then, exp.Update):
        if not all(isinstance(a, exp.EQ) for a in then.expressions):
            raise SqlError(
                "cannot read an assignment of MERGE's UPDATE SET", "SQL_COMPILATION_ERROR"
            )
        assigned = {_column(info, a.this).name: _written(text, a.expression)
                    for a in then.expressions}  # fmt: skip
        return {name: assigned.get(name, f"{alias}.{_q(name)}") for name in info.schema.names}
    if isinstance(then, exp.Insert):
        if not isinstance(then.expression, exp.Expression):  # sqlglot: None or False
            raise SqlError("the INSERT clause of MERGE needs VALUES (...)", "SQL_COMPILATION_ERROR")
        listed = then.this.expressions if then.this is not None else []
        names = [_column(info, c).name for c in listed] or info.schema.names
        given = dict(zip(names, then.expression.expressions, strict=False))
        if len(names) != len(then.expression.expressions):
            raise SqlError("the INSERT clause of MERGE lists a different number of columns "
                           "and values", "SQL_COMPILATION_ERROR")  # fmt: skip
        return {name: _written(text, given[name]) if name in given else "NULL"
                for name in info.schema.names}  # fmt: skip
    return None


def _stage_merge(
    session: StatementContext, txn: Transaction, binder: Binder, info: TableInfo,
    whens: list[exp.When], data: pa.Table,
) -> DataFrame:  # fmt: skip
    """Stage what the merge query chose: updated, inserted (new ids) and deleted rows."""
    clause = data.column("__clause")
    deletes = [i for i, w in enumerate(whens) if isinstance(w.args["then"], exp.Var)]
    inserts = [i for i, w in enumerate(whens) if isinstance(w.args["then"], exp.Insert)]
    is_delete = pc.is_in(clause, value_set=pa.array(deletes, clause.type))
    is_insert = pc.is_in(clause, value_set=pa.array(inserts, clause.type))
    is_update = pc.invert(pc.or_(is_delete, is_insert))
    _check_deterministic(data.column(ROW_ID_COLUMN), is_update)
    deleted = pc.unique(data.column(ROW_ID_COLUMN).filter(is_delete).combine_chunks())
    deleted = deleted.cast(pa.int64())
    columns = len(info.schema.names) + 1
    updated = _rows(session, info, data.filter(is_update).select(list(range(columns))))
    inserted = _rows(session, info, data.filter(is_insert).select(list(range(columns))), new=True)
    rows = pa.concat_tables([updated, inserted])
    new_ids = inserted.column(ROW_ID_COLUMN).combine_chunks()
    txn.stage(info, ChangeSet(rows, deleted=deleted, new_ids=new_ids))
    session.consumed(txn, binder)
    return _result(session, number_of_rows_inserted=inserted.num_rows,
                   number_of_rows_updated=updated.num_rows,
                   number_of_rows_deleted=len(deleted))  # fmt: skip
