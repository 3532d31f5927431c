"""Binding a query's names to our objects: each table, stream or CHANGES clause a query
names becomes a Spark temporary view of what the transaction sees, and exactly those
characters of the query text are replaced (:mod:`pipelines.sql.source_text`): Spark then
evaluates the query as written.

Spark's parser says which words are table names (:mod:`pipelines.sql.spark_reading`).
Our clauses, which Spark's grammar lacks (``AT``/``BEFORE``/``CHANGES``, ``VERSION AS
OF``, ``READ_<change stream>(...)``, ``TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...))``), are
read by sqlglot first and replaced by views the same way. ``SYSTEM$STREAM_HAS_DATA('s')``
is answered here, as a literal TRUE or FALSE in place of the call, so Spark never sees a
function it does not have.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

from sqlglot import exp

from catalog import TableInfo, ViewRecord, did_you_mean, full_name
from flush.spark_tables import read_delta
from flush.tables import ROW_ID_COLUMN
from ingest_sdk.schema import quote_identifier
from pipelines.change_sets import ChangeMode
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.history import data_changed
from pipelines.sql.plan_guard import RefusedStatementError
from pipelines.sql.source_text import (
    Splice,
    blanked,
    check_one_statement,
    extent,
    has_extensions,
    parse_with_spans,
    quoted_names,
    span,
    writes_watermark,
)
from pipelines.sql.spark_reading import Output, Reference, name_parts, outputs, references
from pipelines.sql.statements import INFORMATION_SCHEMA, NAME, spark_sql_text, split_name
from pipelines.sql.time_literals import special_literals
from pipelines.transactions.snapshot_pins import consistent_pins
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["Binder", "check_writable", "function_name", "quote", "result_names"]

_VIEW_NUMBERS = itertools.count(1)
#: How deep views may read views (a guard against runaway definitions, far above use).
MAX_VIEW_DEPTH = 32
STREAM_HAS_DATA = "SYSTEM$STREAM_HAS_DATA"
_TABLE_QUERY = re.compile(r"\bTABLE\s*$", re.I)
_STREAM_NAME = re.compile(NAME)
#: What a name in a query may name, for the "did you mean" of one that names nothing.
_READ_KINDS = ("table", "stream", "view")


def quote(name: str) -> str:
    """A name in backquotes, as Spark reads it back exactly."""
    return "`" + name.replace("`", "``") + "`"


def _part(identifier: exp.Identifier | None) -> str | None:
    if identifier is None or not isinstance(identifier, exp.Identifier):
        return None
    return identifier.name if identifier.quoted else identifier.name.upper()


def check_writable(session: StatementContext, info: TableInfo, what: str) -> None:
    """Refuse to write a dynamic table with ``what`` (a statement's name).

    Raises:
        SqlError: DYNAMIC_TABLE_READ_ONLY, naming the table and what to do instead.
    """
    if session.catalog.get_dynamic_table(info.id) is not None:
        raise SqlError(
            f"{info.full_name} is a dynamic table: only its refreshes write it, so {what} "
            "cannot change it. Change its query with CREATE OR REPLACE DYNAMIC TABLE, refresh "
            "it with ALTER DYNAMIC TABLE ... REFRESH, or drop it with DROP DYNAMIC TABLE",
            "DYNAMIC_TABLE_READ_ONLY",
        )


def _check_initialized(session: StatementContext, info: TableInfo) -> None:
    """A dynamic table is read once its first refresh has given it content."""
    dynamic = session.catalog.get_dynamic_table(info.id)
    if dynamic is not None and dynamic.data_timestamp_us is None:
        raise SqlError(
            f"dynamic table {info.full_name} is not initialized yet: run ALTER DYNAMIC TABLE "
            f"{info.full_name} REFRESH, or wait for its first scheduled refresh",
            "DYNAMIC_TABLE_NOT_INITIALIZED",
        )


def function_name(call: exp.Anonymous) -> str:
    """A call's function name as written (a quoted name keeps its case)."""
    return call.this.name if isinstance(call.this, exp.Identifier) else str(call.this)


def _table_function(table: exp.Table) -> tuple[exp.Anonymous, str | None] | None:
    """The call of one of our table functions a table reference holds, and the database
    it is qualified by: ``READ_<change stream>(...)``, or ``TABLE(<name>(...))`` for a
    name of :data:`TABLE_FUNCTIONS`, which may be qualified as Snowflake writes it
    (``TABLE([db.]INFORMATION_SCHEMA.<name>(...))``). Other calls, such as Spark's
    ``range``, are Spark's."""
    call = table.this
    if not isinstance(call, exp.Anonymous):
        return None
    name = function_name(call)
    if name.upper().startswith("READ_"):
        return call, None
    inner = call.expressions[0] if len(call.expressions) == 1 else None
    if name.upper() != "TABLE" or inner is None:
        return None
    if isinstance(inner, exp.Column):
        _refuse_uncalled(inner)
    database = None
    if isinstance(inner, exp.Dot):
        qualifier, inner = _information_schema(inner.this), inner.expression
        if qualifier is None:
            return None
        database = qualifier or None
    if isinstance(inner, exp.Anonymous) and inner.name.upper() in TABLE_FUNCTIONS:
        return inner, database
    return None


def _refuse_uncalled(name: exp.Column) -> None:
    """``TABLE(<built-in>)`` without the call's parentheses, or ``TABLE(INFORMATION_SCHEMA.
    <view>)``: the form to write (Spark would answer UNRESOLVED_COLUMN). The form is built
    from the names, not the text (a comment inside stays out of it)."""
    parts = [part for part in (name.args.get(k) for k in ("catalog", "db", "table", "this"))
             if isinstance(part, exp.Identifier)]  # fmt: skip
    shown = [quote_identifier(p.name) if p.quoted else p.name for p in parts]
    written = ".".join(shown)
    qualifier = parts[-2] if len(parts) > 1 else None
    in_schema = qualifier is not None and _information_schema(qualifier) is not None
    if name.name.upper() in TABLE_FUNCTIONS:
        call = written
        if qualifier is not None and not in_schema:  # DB.PUBLIC.F: F lives in INFORMATION_SCHEMA
            call = ".".join([*shown[:-2][-1:], INFORMATION_SCHEMA, shown[-1]])
        raise SqlError(f"TABLE({written}) names the table function without calling it: "
                       f"write TABLE({call}())", "SQL_COMPILATION_ERROR")  # fmt: skip
    if in_schema:
        raise SqlError(f"{written} is not a table function; the names of "
                       f"{INFORMATION_SCHEMA} are read as tables: write SELECT ... FROM "
                       f"{written}", "SQL_COMPILATION_ERROR")  # fmt: skip


def _information_schema(node: exp.Expression) -> str | None:
    """``INFORMATION_SCHEMA`` (its stored name: unquoted in any case, or quoted exactly)
    -> ``""``, ``db.INFORMATION_SCHEMA`` -> the database's name as stored (unquoted
    upper-cased, quoted exact); else None."""
    database = None
    if isinstance(node, exp.Dot):
        if not isinstance(node.this, exp.Identifier):
            return None
        database = node.this.name if node.this.quoted else node.this.name.upper()
        node = node.expression
    if not isinstance(node, exp.Identifier):
        return None
    if (node.name if node.quoted else node.name.upper()) != INFORMATION_SCHEMA:
        return None
    return database or ""


def _in_database(call: exp.Anonymous, database: str) -> exp.Anonymous:
    """A call of ``db.INFORMATION_SCHEMA``: the tables of database ``db`` only (its
    NAME_PREFIX, unless the call names a table or a prefix itself)."""
    given = {a.this.name.upper() for a in call.expressions if isinstance(a, exp.Kwarg)}
    if given & {"NAME", "NAME_PREFIX"}:
        return call
    prefix = exp.Kwarg(this=exp.var("NAME_PREFIX"),
                       expression=exp.Literal.string(quote_identifier(database) + "."))  # fmt: skip
    limited = call.copy()
    limited.append("expressions", prefix)
    return limited


#: The table functions written ``TABLE(<name>(...))`` that the session answers.
TABLE_FUNCTIONS = frozenset(
    {"DYNAMIC_TABLE_REFRESH_HISTORY", "DYNAMIC_TABLE_GRAPH_HISTORY", "DYNAMIC_TABLES"}
)


def result_names(binder: Binder, frame: DataFrame, text: str) -> DataFrame:
    """A query's result with Snowflake's column names, decided per column (``text``: the
    bound text Spark ran):

    - a name given with AS is upper-cased, unless written in quotes (``AS x`` gives ``X``,
      ``AS "x"`` and ``AS `x``` give ``x``);
    - a column of a table, stream or view read, selected by name or by ``*``, keeps its
      name as stored (``doc`` of a column created as ``"Doc"`` gives ``Doc``);
    - any other name (Spark's name of an expression, of a column list ``AS t(a, b)``, of a
      generator's output) is upper-cased, unless the statement writes it in quotes.

    Only the names of the result change; Spark resolved every name inside the query
    case-insensitively.

    Raises:
        SqlError: the last rule, which reads the quotes of the whole statement, would give
            two columns Spark names apart one name.
    """
    columns = outputs(frame, text, binder.view_columns)
    names = [_result_name(column, binder.quoted) for column in columns]
    seen: dict[str, Output] = {}
    for column, name in zip(columns, names, strict=True):
        other = seen.setdefault(name, column)
        if other.name != column.name and binder.quoted & {
            c.name for c in (column, other) if not (c.alias or c.column is not None)
        }:
            raise SqlError(
                f"the result would have two columns named {name} ({other.name} and "
                f"{column.name} as Spark names them): give them names of their own with AS",
                "SQL_COMPILATION_ERROR",
            )
    return frame if names == frame.columns else frame.toDF(*names)


def _result_name(column: Output, quoted: set[str]) -> str:
    if column.alias:
        return column.name if column.quoted else column.name.upper()
    if column.column is not None:
        return column.column
    return column.name if column.name in quoted else column.name.upper()


class Binder:
    """Binds the names of one statement in one transaction.

    A view's body is bound by a binder of its own (:meth:`_expand`), with the view's
    defaults for unqualified names and the chain of views being expanded (``within``),
    so a cycle or a chain deeper than :data:`MAX_VIEW_DEPTH` is refused.
    """

    def __init__(
        self,
        session: StatementContext,
        txn: Transaction,
        defaults: tuple[str, str] | None = None,
        within: tuple[str, ...] = (),
        analysis: bool = False,
        sources: Callable[[TableInfo], DataFrame] | None = None,
    ) -> None:
        self.session = session
        self.txn = txn
        #: What a table reads as, in place of the transaction's view of it (a dynamic
        #: table's refresh reads its sources' changes); the views made so, by name.
        self.sources = sources
        self.source_views: dict[str, TableInfo] = {}
        #: Only analysed, never evaluated (a definition being checked): a dynamic table
        #: not yet initialized may be named.
        self.analysis = analysis
        self.streams: list[int] = []
        #: The tables read as they are (not time-travelled) and the views expanded, in
        #: views' bodies too: what a dynamic table's definition depends on.
        self.tables: list[TableInfo] = []
        self.expanded: list[ViewRecord] = []
        #: Whether a read names a fixed point (time travel, CHANGES): never current.
        self.fixed_reads = False
        #: What was read of the warehouse's own description (an INFORMATION_SCHEMA view, a
        #: DYNAMIC_TABLE_*_HISTORY call): rows no table version holds.
        self.metadata_reads: list[str] = []
        #: The texts bound, views' bodies included (read by :attr:`time_literals`).
        self.texts: list[str] = []
        self.defaults = defaults
        self.within = within
        #: Names the texts bound wrote in backquotes, and the columns of each view made
        #: (by lower-case name): where result columns' names come from (:func:`result_names`).
        self.quoted: set[str] = set()
        self.view_columns: dict[str, list[str]] = {}
        #: The views this binder made (lower case): the only ones a name it binds may be.
        self.made: set[str] = set()
        #: The alias each view made for a clause of ours goes by, until placed (:meth:`bind`).
        self._labels: dict[str, str] = {}

    @property
    def time_literals(self) -> list[str]:
        """Typed literals of Spark's special datetime values (``TIMESTAMP'now'``) in the
        texts bound: a value fixed when the text is parsed
        (:mod:`pipelines.sql.time_literals`). Read only by the definitions that care (a
        tokenizer's pass over a large statement is not free), not at every bind."""
        return [literal for text in self.texts for literal in special_literals(text)]

    def names(self, table: exp.Table) -> tuple[str, str, str]:
        """``DB.SCHEMA.NAME`` of a table reference, defaults filled from ``USE`` (or, in
        a view's body, from the session that created the view)."""
        name = _part(table.this) if isinstance(table.this, exp.Identifier) else None
        if name is None:
            raise SqlError(f"cannot read from {table.sql('spark')!r}", "SQL_COMPILATION_ERROR")
        database, schema = self.defaults or (self.session.database, self.session.schema)
        schema = _part(table.args.get("db")) or schema
        database = _part(table.args.get("catalog")) or database
        return database, schema, name

    def table(self, table: exp.Table) -> TableInfo:
        return self.session.table_or_error(*self.names(table))

    def target(self, table: exp.Table, what: str) -> TableInfo:
        """The table a statement writes (``what``: INSERT, UPDATE, ...); never a dynamic
        table, which only its refreshes write."""
        info = self.table(table)
        check_writable(self.session, info, what)
        return info

    def view(self, frame: object, label: str) -> str:
        """Register ``frame`` as a temporary view; its name (``label``: what errors call it)."""
        view = f"ingest_v{next(_VIEW_NUMBERS)}"
        frame.createOrReplaceTempView(view)  # type: ignore[attr-defined]
        self.session.views.append(view)
        self.session.view_names[view] = label
        self.view_columns[view.lower()] = list(frame.columns)  # type: ignore[attr-defined]
        self.made.add(view.lower())
        return view

    def bind_query(self, text: str) -> str:
        """:meth:`bind` a query so that the dynamic tables of one graph it reads are read
        at one data timestamp: if they stand at different ones, those first read by this
        query are pinned (:func:`consistent_pins`) and the query is bound again."""
        pinned_before = set(self.txn.versions)
        bound = self.bind(text)
        first_read = [t.id for t in self.tables if t.id not in pinned_before]
        pins = consistent_pins(self.session.catalog, first_read)
        if not pins:
            return bound
        for table_id, version in pins.items():
            self.txn.versions[table_id] = version
            self.txn.handles.pop(table_id, None)
        self.tables, self.expanded, self.streams, self.texts = [], [], [], []
        self.source_views = {}
        return self.bind(text)

    def bind(self, text: str) -> str:
        """The query text with every table, stream, view and clause of ours replaced by
        what it reads (the characters around them kept as written); the streams read are
        recorded. Names Spark takes for a CTE are left to Spark."""
        check_one_statement(text)
        text = self._our_clauses(spark_sql_text(text))
        self.texts.append(text)
        self.quoted |= quoted_names(text)
        splice, code = Splice(text), blanked(text)  # code: no comment reads as TABLE
        for reference in references(self.session.spark, text):
            if len(reference.parts) == 1 and reference.parts[0].lower() in self.made:
                # A view this binder made: a DML target (aliased by the query we wrote),
                # or a clause of ours, which gets its alias here, where Spark reads one.
                label = self._labels.pop(reference.parts[0].lower(), None)
            else:
                written = text[reference.start : reference.end]
                replacement, label = self._reference(reference, written)
                splice.replace(reference.start, reference.end, replacement)
            # ``TABLE t`` (a query of one table) takes no alias; after a TABLESAMPLE, the
            # alias goes after the sample (Spark reads ``t [time travel] [sample] [alias]``).
            if label is not None and not (
                reference.aliased or _TABLE_QUERY.search(code, 0, reference.start)
            ):
                splice.replace(reference.alias_at, reference.alias_at, f" AS {quote(label)}")
        return splice.render()

    def _reference(self, reference: Reference, written: str) -> tuple[str, str]:
        """What replaces a table name Spark read, and the alias it goes by."""
        if re.match(r"IDENTIFIER\s*\(", written, re.I):
            raise RefusedStatementError(
                "IDENTIFIER(...) is not supported: write the table or function name itself"
            )
        if reference.time_travel:  # read by sqlglot as our clause before; never here
            raise SqlError(f"cannot read the time travel on {written[:80]!r}; write "
                           "AT(VERSION => n) or AT(TIMESTAMP => '...')",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        parts = [name if quoted else name.upper() for name, quoted in name_parts(written)]
        if len(parts) != len(reference.parts) or len(parts) > 3:
            raise SqlError(f"cannot read from {written[:80]!r}: a name has one to three parts "
                           "(db.schema.name)", "SQL_COMPILATION_ERROR")  # fmt: skip
        database, schema = self.defaults or (self.session.database, self.session.schema)
        name = parts[-1]
        schema = parts[-2] if len(parts) > 1 else schema
        database = parts[-3] if len(parts) > 2 else database
        if schema == INFORMATION_SCHEMA:
            if name in TABLE_FUNCTIONS:  # as in Snowflake, a function only: no view of it
                raise SqlError(f"{schema}.{name} is a table function, not a view: write "
                               f"SELECT ... FROM TABLE({schema}.{name}())",
                               "SQL_COMPILATION_ERROR")  # fmt: skip
            frame = self.session.information_schema_view(database, name)
            self.metadata_reads.append(f"{schema}.{name}")
            return self.view(frame, f"{database}.{schema}.{name}"), name
        return self._named(database, schema, name), name

    def _our_clauses(self, text: str) -> str:
        """The text with our clauses and functions replaced (read by sqlglot, as Spark's
        grammar lacks them); the text itself when it holds none."""
        if not has_extensions(text):
            return text
        try:
            tree = parse_with_spans(text)
        except SqlError:
            if writes_watermark(text):  # Spark's clause, unknown to the reader of ours
                raise SqlError(
                    "a WATERMARK clause cannot be read in a statement that also uses "
                    "AT(...), BEFORE(...), CHANGES(...), a change stream's READ_ function or "
                    "SYSTEM$STREAM_HAS_DATA: create a view of that read and put the WATERMARK "
                    "on the view", "SQL_COMPILATION_ERROR",
                ) from None  # fmt: skip
            raise
        splice = Splice(text)
        for call in tree.find_all(exp.Anonymous):
            if call.name.upper() == STREAM_HAS_DATA:
                splice.replace(*span(call), self._stream_has_data(call, text))
        for table in tree.find_all(exp.Table):
            found = self._clause(table)
            if found is None:
                continue
            start, end, replacement, label = found
            # Its alias, if Spark reads none, is added where Spark reads one (:meth:`bind`).
            self._labels[replacement.lower()] = label
            splice.replace(start, end, replacement)
        return splice.render()

    def _clause(self, table: exp.Table) -> tuple[int, int, str, str] | None:
        """A table reference that holds a clause of ours: its characters (name through
        clause, not the alias), what replaces them and the alias it goes by."""
        names = [table.args.get(k) for k in ("catalog", "db", "this")]
        first = min(span(n)[0] for n in names if n is not None)
        if (found := _table_function(table)) is not None:
            call, database = found
            defaults = self.defaults or (self.session.database, self.session.schema)
            if database is not None:
                if self.session.catalog.get_database(database) is None:
                    raise ObjectNotFoundError(f"database {quote_identifier(database)} does not "
                                              "exist; SHOW DATABASES lists them")  # fmt: skip
                call = _in_database(call, database)
                defaults = (database, defaults[1])
            if call.name.upper() in TABLE_FUNCTIONS:  # not a change stream's READ_<name>
                self.metadata_reads.append(call.name.upper())
            frame, label = self.session.table_function(table, call, defaults)
            return first, span(table.this)[1], self.view(frame, label), label
        clauses = [table.args.get(k) for k in ("when", "version", "changes")]
        if not isinstance(table.this, exp.Identifier) or not any(clauses):
            return None
        end = max(extent(node)[1] for node in (*clauses, table.this) if node is not None)
        changes = table.args.get("changes")
        if changes is not None:
            self.fixed_reads = True
            return first, end, self.view(self._changes(table, changes), table.name), table.name
        database, schema, name = self.names(table)
        return first, end, self.view(self._travel(table), ".".join((database, schema, name))), name

    def _stream_has_data(self, call: exp.Anonymous, text: str) -> str:
        """``SYSTEM$STREAM_HAS_DATA('name')``: TRUE when a commit after the stream's offset,
        up to the version this transaction reads, added or removed rows (an empty net
        change may answer TRUE, as in the reference system; see
        :func:`pipelines.sql.history.data_changed`). Reading it pins the stream in the
        transaction like a read, but consumes nothing. As a projection of its own it is
        named as the call was written."""
        arguments = call.expressions
        if len(arguments) != 1 or not (
            isinstance(arguments[0], exp.Literal) and arguments[0].is_string
        ):
            raise SqlError(
                f"{STREAM_HAS_DATA} takes one argument, the stream's name as a string: "
                f"{STREAM_HAS_DATA}('MY_STREAM') or '<db>.<schema>.<stream>'",
                "SQL_COMPILATION_ERROR",
            )
        stream_name = arguments[0].name.strip()
        if _STREAM_NAME.fullmatch(stream_name) is None:
            raise SqlError(
                f"{STREAM_HAS_DATA}: {stream_name[:80]!r} is not a stream name; write NAME, "
                "SCHEMA.NAME or DB.SCHEMA.NAME (double quotes inside the string keep case: "
                "'\"My Stream\"')",
                "SQL_COMPILATION_ERROR",
            )
        answer = "TRUE" if self._stream_changed(split_name(stream_name)) else "FALSE"
        if isinstance(call.parent, exp.Select):
            written = text[slice(*span(call))].replace("`", "")
            return f"{answer} AS {quote(written)}"
        return answer

    def _stream_changed(self, parts: list[str]) -> bool:
        default_database, default_schema = self.defaults or (self.session.database,
                                                             self.session.schema)  # fmt: skip
        schema = parts[-2] if len(parts) > 1 else default_schema
        database = parts[-3] if len(parts) > 2 else default_database
        stream = self.session.catalog.get_stream(database, schema, parts[-1])
        if stream is None:
            raise ObjectNotFoundError(
                f"stream {full_name(database, schema, parts[-1])} does not exist"
                f"{did_you_mean(self.session.catalog, database, schema, parts[-1], ['stream'])} ("
                f"{STREAM_HAS_DATA} names a stream; unquoted names are upper-cased, USE "
                "DATABASE/SCHEMA sets the defaults)"
            )
        self.session.check_stream_fresh(stream)
        if stream.on_view:
            from pipelines.sql.view_streams import view_stream_changed

            return view_stream_changed(self.txn, stream)
        read = self.txn.stream_read(stream)
        return data_changed(read.table.uri, read.offset, read.to)

    def _travel(self, table: exp.Table) -> DataFrame:
        """Time travel: t AT | BEFORE (VERSION | TIMESTAMP | STREAM => ...), or Spark's
        t VERSION | TIMESTAMP AS OF ..., which means AT."""
        database, schema, name = self.names(table)
        info = self.session.find_table(database, schema, name)
        if info is None and self.session.catalog.get_view(database, schema, name):
            raise SqlError(f"time travel reads a table; {database}.{schema}.{name} is a view: "
                           "read its tables AT (...) in a query of your own",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        if info is None:
            raise SqlError(f"time travel needs a table; {database}.{schema}.{name} is not one",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        when, as_of = table.args.get("when"), table.args.get("version")
        if when is not None:
            at, kind, value = when.this.upper(), when.args["kind"].upper(), when.expression
        else:
            assert as_of is not None  # _clause saw one of the two
            at, kind, value = "AT", str(as_of.this).upper(), as_of.expression
        version = self.session.point(info, at, kind, value)
        self.fixed_reads = True
        return read_delta(self.session.spark, info.uri, version).drop(ROW_ID_COLUMN)

    def _named(self, database: str, schema: str, name: str) -> str:
        """What replaces the name of a table, stream or view: a view of what this
        transaction reads of it, or a view's body bound, in parentheses."""
        label = ".".join((database, schema, name))
        stream = self.session.catalog.get_stream(database, schema, name)
        info = self.session.find_table(database, schema, name)
        if info is not None:
            if not self.analysis:
                _check_initialized(self.session, info)
            self.tables.append(info)
            if self.sources is None:
                return self.view(self.txn.table_frame(info), label)
            bound = self.view(self.sources(info), label)
            self.source_views[bound] = info
            return bound
        if stream is not None:
            self.streams.append(stream.id)
            self.session.check_stream_fresh(stream)
            if stream.on_view:
                from pipelines.sql.view_streams import view_stream_frame

                return self.view(view_stream_frame(self.session, self.txn, stream), label)
            return self.view(self.txn.stream_frame(stream, ChangeMode(stream.mode)), label)
        view = self.session.catalog.get_view(database, schema, name)
        if view is not None:
            return self._expand(view)
        raise ObjectNotFoundError(
            f"object {database}.{schema}.{name} does not exist"
            f"{did_you_mean(self.session.catalog, database, schema, name, _READ_KINDS)}: no "
            "table, stream or view of that name (unquoted names are upper-cased; USE "
            "DATABASE/SCHEMA sets the defaults)"
            + (f"; view {self.within[-1]} reads it" if self.within else "")
        )

    def _expand(self, view: ViewRecord) -> str:
        """A view's body, bound, in parentheses in place of its name. A view reading a
        stream is refused: that read would never be consumed."""
        if view.full_name in self.within:
            chain = " -> ".join([*self.within[self.within.index(view.full_name) :], view.full_name])
            raise SqlError(f"views read each other in a cycle ({chain}); a view cannot read "
                           "itself", "SQL_COMPILATION_ERROR")  # fmt: skip
        if len(self.within) >= MAX_VIEW_DEPTH:
            raise SqlError(f"views nest more than {MAX_VIEW_DEPTH} deep ({self.within[0]} -> "
                           "...); flatten them", "STATEMENT_TOO_COMPLEX")  # fmt: skip
        inner = Binder(self.session, self.txn, (view.default_database, view.default_schema),
                       (*self.within, view.full_name), self.analysis, self.sources)  # fmt: skip
        body = inner.bind(view.query.rstrip().removesuffix(";"))
        self.tables.extend(inner.tables)
        self.source_views.update(inner.source_views)
        self.expanded.extend([view, *inner.expanded])
        self.fixed_reads |= inner.fixed_reads
        self.metadata_reads.extend(inner.metadata_reads)
        self.texts.extend(inner.texts)
        self.quoted |= inner.quoted
        self.view_columns.update(inner.view_columns)
        if inner.streams:
            stream = self.session.catalog.get_stream_by_id(inner.streams[0])
            raise SqlError(
                f"view {view.full_name} reads stream {stream.full_name if stream else '?'}; a "
                "view cannot read a stream (its changes would never be consumed): read the "
                "stream in the statement itself",
                "SQL_COMPILATION_ERROR",
            )
        return f"({body}\n)"

    def _changes(self, table: exp.Table, changes: exp.Changes) -> object:
        from pipelines.streams.changes import read_changes

        info = self.table(table)
        information = changes.args.get("information")
        mode_name = information.name.upper() if information is not None else "DEFAULT"
        try:
            mode = ChangeMode(mode_name)
        except ValueError:
            raise SqlError(
                f"CHANGES(INFORMATION => {mode_name}) is not supported; use DEFAULT, "
                "APPEND_ONLY or APPEND_ONLY_FINAL",
                "SQL_COMPILATION_ERROR",
            ) from None
        start = changes.args.get("at_before")
        if start is None:
            raise SqlError(
                "a CHANGES clause needs AT(...) or BEFORE(...) to say where the changes start",
                "SQL_COMPILATION_ERROR",
            )
        after = self.session.point(info, start.this.upper(), start.args["kind"].upper(),
                                   start.expression)  # fmt: skip
        end = changes.args.get("end")
        to = self.txn.version(info)
        if end is not None:
            to = self.session.point(info, "AT", end.args["kind"].upper(), end.expression)
        if to < after:
            raise SqlError(
                f"the CHANGES clause ends (version {to}) before it starts (version {after})",
                "SQL_COMPILATION_ERROR",
            )
        return read_changes(self.session.spark, info.uri, info.schema, after, to, mode)
