"""Binding a query's names to our objects: each table, stream or CHANGES clause a query
names becomes a Spark temporary view of what the transaction sees, and the query text
is rewritten to read those views. Spark then evaluates the query as written.

``SYSTEM$STREAM_HAS_DATA('s')`` is answered here, as a literal TRUE or FALSE in place of
the call, so Spark never sees a function it does not have.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from catalog import TableInfo, ViewRecord, full_name
from flush.spark_tables import read_delta
from flush.tables import ROW_ID_COLUMN
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.history import data_changed
from pipelines.sql.plan_guard import check_tree
from pipelines.sql.refresh_history import FUNCTION as HISTORY_FUNCTION
from pipelines.sql.refresh_history import history_call, history_frame
from pipelines.sql.statements import NAME, spark_sql_text, split_name
from pipelines.streams.changes import ChangeMode
from pipelines.transactions.snapshot_pins import consistent_pins
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["Binder", "check_writable", "parse"]

_VIEW_NUMBERS = itertools.count(1)
#: How deep views may read views (a guard against runaway definitions, far above use).
MAX_VIEW_DEPTH = 32
STREAM_HAS_DATA = "SYSTEM$STREAM_HAS_DATA"
_STREAM_NAME = re.compile(NAME)


def parse(text: str) -> exp.Expression:
    """One statement as sqlglot's Spark dialect reads it (after quoting METADATA$ names).

    Raises:
        SqlError: a syntax error, with sqlglot's description of where.
    """
    try:
        trees = sqlglot.parse(spark_sql_text(text), read="spark")
    except SqlglotError as exc:
        raise SqlError(syntax_error(exc), "SQL_COMPILATION_ERROR") from None
    except RecursionError:
        raise SqlError("the statement is too complex to read; split it or flatten it",
                       "STATEMENT_TOO_COMPLEX") from None  # fmt: skip
    found = [t for t in trees if t is not None]
    if len(found) != 1:
        raise SqlError(
            f"expected one statement, got {len(found)}; send statements one at a time",
            "SQL_COMPILATION_ERROR",
        )
    check_tree(found[0])  # the first wall of the SQL boundary: refused names
    return found[0]


def _names_a_cte(table: exp.Table) -> bool:
    """Whether a one-part name means a CTE in its scope: one defined by a WITH of a query
    around it (a CTE in a subquery does not hide a table of the same name outside it)."""
    name = table.name.upper()
    node: exp.Expression | None = table.parent
    while node is not None:
        with_ = node.args.get("with") or node.args.get("with_")
        if isinstance(with_, exp.With) and any(
            cte.alias_or_name.upper() == name for cte in with_.expressions
        ):
            return True
        node = node.parent
    return False


def syntax_error(exc: Exception) -> str:
    """A parser's error in plain words: what was expected, where, and the text there (no
    parser class names, no terminal escape codes)."""
    errors = getattr(exc, "errors", None) or []
    if not errors:
        return "syntax error: the statement cannot be read; check it against the SQL reference"
    first = errors[0]
    near = _PRINTABLE.sub("", f"{first.get('start_context') or ''}{first.get('highlight') or ''}")
    description = _PRINTABLE.sub("", str(first.get("description") or "unexpected text"))
    description = _PARSER_CLASS.sub("this expression", description)
    return (
        f"syntax error at line {first.get('line')}, column {first.get('col')}: "
        f"{description[:200]} (near {near[-60:]!r})"
    )


_PARSER_CLASS = re.compile(r"<class '[\w.]+'>")
_PRINTABLE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


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


def _reads_a_change_stream(table: exp.Table) -> bool:
    """A ``READ_<change stream>(...)`` call (other table functions, such as Spark's
    ``range``, are Spark's)."""
    call = table.this
    if not isinstance(call, exp.Anonymous):
        return False
    name = call.this.name if isinstance(call.this, exp.Identifier) else str(call.this)
    return name.upper().startswith("READ_")


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
        self.defaults = defaults
        self.within = within

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

    def view(self, frame: object, table: exp.Table) -> exp.Table:
        """Register ``frame`` as a temporary view; the reference that replaces ``table``."""
        view = f"ingest_v{next(_VIEW_NUMBERS)}"
        frame.createOrReplaceTempView(view)  # type: ignore[attr-defined]
        self.session.views.append(view)
        self.session.view_names[view] = ".".join(self.names(table)) if not table.args.get(
            "changes") else table.name  # fmt: skip
        alias = table.args.get("alias") or exp.TableAlias(
            this=exp.to_identifier(table.name, quoted=True)
        )
        # TABLESAMPLE belongs to the reference: kept, or the sample would read every row.
        return exp.Table(this=exp.to_identifier(view), alias=alias,
                         sample=table.args.get("sample"))  # fmt: skip

    def bind_query(self, tree: exp.Expression) -> exp.Expression:
        """:meth:`bind` a query so that the dynamic tables of one graph it reads are read
        at one data timestamp: if they stand at different ones, those first read by this
        query are pinned (:func:`consistent_pins`) and the query is bound again."""
        original = tree.copy()
        pinned_before = set(self.txn.versions)
        bound = self.bind(tree)
        first_read = [t.id for t in self.tables if t.id not in pinned_before]
        pins = consistent_pins(self.session.catalog, first_read)
        if not pins:
            return bound
        for table_id, version in pins.items():
            self.txn.versions[table_id] = version
            self.txn.handles.pop(table_id, None)
        self.tables, self.expanded, self.streams = [], [], []
        self.source_views = {}
        return self.bind(original)

    def bind(self, tree: exp.Expression, skip: exp.Table | None = None) -> exp.Expression:
        """Replace every table, stream and CHANGES reference in ``tree`` (in place) but
        ``skip`` (a DML target) and CTE names; record the streams read. Calls of
        SYSTEM$STREAM_HAS_DATA become their answer."""
        for call in list(tree.find_all(exp.Anonymous)):
            if call.name.upper() == STREAM_HAS_DATA:
                call.replace(self._stream_has_data(call))
        # Unquoted names are upper-cased, as on the ingest side, so a result's columns
        # are named as the reference system names them (Spark resolves names either way).
        for identifier in tree.find_all(exp.Identifier):
            if not identifier.quoted:
                identifier.set("this", identifier.this.upper())
        for table in list(tree.find_all(exp.Table)):
            if (history := history_call(table)) is not None:
                table.replace(self._history(table, history))
                continue
            if _reads_a_change_stream(table):
                table.replace(self._table_function(table))
                continue
            if table is skip or not isinstance(table.this, exp.Identifier):
                continue
            if not table.args.get("db") and _names_a_cte(table):
                continue
            table.replace(self._frame_for(table))
        return tree

    def _history(self, table: exp.Table, call: exp.Anonymous) -> exp.Table:
        """``TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...))`` as a view of its rows."""
        defaults = self.defaults or (self.session.database, self.session.schema)
        view = f"ingest_v{next(_VIEW_NUMBERS)}"
        history_frame(self.session, call, defaults).createOrReplaceTempView(view)
        self.session.views.append(view)
        self.session.view_names[view] = HISTORY_FUNCTION
        alias = table.args.get("alias") or exp.TableAlias(
            this=exp.to_identifier(HISTORY_FUNCTION, quoted=True)
        )
        return exp.Table(this=exp.to_identifier(view), alias=alias)

    def _table_function(self, table: exp.Table) -> exp.Table:
        """A table-valued call (a change stream's ``READ_<name>(...)``) as a view of the
        rows the session's :meth:`~pipelines.sql.context.StatementContext.table_function`
        returns for it."""
        defaults = self.defaults or (self.session.database, self.session.schema)
        view = f"ingest_v{next(_VIEW_NUMBERS)}"
        self.session.table_function(table, defaults).createOrReplaceTempView(view)
        self.session.views.append(view)
        call = table.this
        label = call.this.name if isinstance(call.this, exp.Identifier) else str(call.this)
        self.session.view_names[view] = label
        alias = table.args.get("alias") or exp.TableAlias(
            this=exp.to_identifier(label, quoted=True)
        )
        return exp.Table(this=exp.to_identifier(view), alias=alias)

    def _stream_has_data(self, call: exp.Anonymous) -> exp.Expression:
        """``SYSTEM$STREAM_HAS_DATA('name')``: TRUE when a commit after the stream's offset,
        up to the version this transaction reads, added or removed rows (an empty net
        change may answer TRUE, as in the reference system; see
        :func:`pipelines.sql.history.data_changed`). Reading it pins the stream in the
        transaction like a read, but consumes nothing."""
        arguments = call.expressions
        if len(arguments) != 1 or not (
            isinstance(arguments[0], exp.Literal) and arguments[0].is_string
        ):
            raise SqlError(
                f"{STREAM_HAS_DATA} takes one argument, the stream's name as a string: "
                f"{STREAM_HAS_DATA}('MY_STREAM') or '<db>.<schema>.<stream>'",
                "SQL_COMPILATION_ERROR",
            )
        text = arguments[0].name.strip()
        if _STREAM_NAME.fullmatch(text) is None:
            raise SqlError(
                f"{STREAM_HAS_DATA}: {text[:80]!r} is not a stream name; write NAME, "
                "SCHEMA.NAME or DB.SCHEMA.NAME (double quotes inside the string keep case: "
                "'\"My Stream\"')",
                "SQL_COMPILATION_ERROR",
            )
        parts = split_name(text)
        default_database, default_schema = self.defaults or (self.session.database,
                                                             self.session.schema)  # fmt: skip
        schema = parts[-2] if len(parts) > 1 else default_schema
        database = parts[-3] if len(parts) > 2 else default_database
        stream = self.session.catalog.get_stream(database, schema, parts[-1])
        if stream is None:
            raise ObjectNotFoundError(
                f"stream {full_name(database, schema, parts[-1])} does not exist ("
                f"{STREAM_HAS_DATA} names a stream; unquoted names are upper-cased, USE "
                "DATABASE/SCHEMA sets the defaults)"
            )
        self.session.check_stream_fresh(stream)
        read = self.txn.stream_read(stream)
        answer = exp.Boolean(this=data_changed(read.table.uri, read.offset, read.to))
        if isinstance(call.parent, exp.Select):  # a projection: named as the call was written
            return exp.alias_(answer, call.sql("spark").strip("`").replace("`(", "(", 1),
                              quoted=True)  # fmt: skip
        return answer

    def _frame_for(self, table: exp.Table) -> exp.Expression:
        changes = table.args.get("changes")
        if changes is not None:
            self.fixed_reads = True
            return self.view(self._changes(table, changes), table)
        database, schema, name = self.names(table)
        stream = self.session.catalog.get_stream(database, schema, name)
        info = self.session.find_table(database, schema, name)
        when, as_of = table.args.get("when"), table.args.get("version")
        travel = when is not None or as_of is not None
        if travel and info is None and self.session.catalog.get_view(database, schema, name):
            raise SqlError(f"time travel reads a table; {database}.{schema}.{name} is a view: "
                           "read its tables AT (...) in a query of your own",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        if when is not None or as_of is not None:
            # Time travel: t AT | BEFORE (VERSION | TIMESTAMP | STREAM => ...), or Spark's
            # t VERSION | TIMESTAMP AS OF ..., which means AT.
            if info is None:
                raise SqlError(
                    f"time travel needs a table; {database}.{schema}.{name} is not one",
                    "SQL_COMPILATION_ERROR",
                )
            if when is not None:
                at, kind, value = when.this.upper(), when.args["kind"].upper(), when.expression
            else:
                assert as_of is not None
                at, kind, value = "AT", str(as_of.this).upper(), as_of.expression
            version = self.session.point(info, at, kind, value)
            self.fixed_reads = True
            frame = read_delta(self.session.spark, info.uri, version).drop(ROW_ID_COLUMN)
            table.set("when", None)
            table.set("version", None)
            return self.view(frame, table)
        if info is not None:
            if not self.analysis:
                _check_initialized(self.session, info)
            self.tables.append(info)
            if self.sources is None:
                return self.view(self.txn.table_frame(info), table)
            bound = self.view(self.sources(info), table)
            self.source_views[bound.name] = info
            return bound
        if stream is not None:
            self.streams.append(stream.id)
            self.session.check_stream_fresh(stream)
            return self.view(self.txn.stream_frame(stream, ChangeMode(stream.mode)), table)
        view = self.session.catalog.get_view(database, schema, name)
        if view is not None:
            return self._expand(view, table)
        raise ObjectNotFoundError(
            f"object {database}.{schema}.{name} does not exist: no table, stream or view of "
            "that name (unquoted names are upper-cased; USE DATABASE/SCHEMA sets the defaults)"
            + (f"; view {self.within[-1]} reads it" if self.within else "")
        )

    def _expand(self, view: ViewRecord, table: exp.Table) -> exp.Expression:
        """A view's body, bound, in place of its name (a subquery named as the reference
        was). A view reading a stream is refused: that read would never be consumed."""
        if view.full_name in self.within:
            chain = " -> ".join([*self.within[self.within.index(view.full_name) :], view.full_name])
            raise SqlError(f"views read each other in a cycle ({chain}); a view cannot read "
                           "itself", "SQL_COMPILATION_ERROR")  # fmt: skip
        if len(self.within) >= MAX_VIEW_DEPTH:
            raise SqlError(f"views nest more than {MAX_VIEW_DEPTH} deep ({self.within[0]} -> "
                           "...); flatten them", "STATEMENT_TOO_COMPLEX")  # fmt: skip
        inner = Binder(self.session, self.txn, (view.default_database, view.default_schema),
                       (*self.within, view.full_name), self.analysis, self.sources)  # fmt: skip
        body = inner.bind(parse(view.query))
        self.tables.extend(inner.tables)
        self.source_views.update(inner.source_views)
        self.expanded.extend([view, *inner.expanded])
        self.fixed_reads |= inner.fixed_reads
        if inner.streams:
            stream = self.session.catalog.get_stream_by_id(inner.streams[0])
            raise SqlError(
                f"view {view.full_name} reads stream {stream.full_name if stream else '?'}; a "
                "view cannot read a stream (its changes would never be consumed): read the "
                "stream in the statement itself",
                "SQL_COMPILATION_ERROR",
            )
        alias = table.args.get("alias") or exp.TableAlias(
            this=exp.to_identifier(table.name, quoted=True)
        )
        return exp.Subquery(this=body, alias=alias)

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
