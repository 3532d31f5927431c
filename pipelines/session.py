"""The SQL session: one statement at a time, Spark as the engine, our tables as the data.

``Session(warehouse=...)`` opens the same catalog and tables as the service. Each
statement is classified by its header and handed to one handler from one table of
them; statements that hold a query are bound to our objects and evaluated by Spark.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable
from sqlglot import exp

from catalog import (
    CATALOG_FILE,
    Catalog,
    RefreshRecord,
    StreamRecord,
    TableBusyError,
    TableInfo,
    did_you_mean,
    open_catalog,
)
from flush import commit_clock
from flush.commit_clock import version_at
from flush.tables import logged_versions
from ingest_sdk.errors import IngestError
from pipelines import information_schema
from pipelines.change_streams import definition as change_streams
from pipelines.change_streams.function import read_frame
from pipelines.dynamic_tables import definition as dynamic
from pipelines.dynamic_tables import graph_history, refresh_history, tables_function
from pipelines.errors import (
    ObjectNotFoundError,
    SqlError,
    StreamStaleError,
    evaluation_errors,
)
from pipelines.sql import ddl, dml, view_streams
from pipelines.sql.binding import Binder, function_name, result_names
from pipelines.sql.plan_guard import guarded_frame
from pipelines.sql.source_text import parse_with_spans
from pipelines.sql.statements import (
    DEFAULT_DATABASE,
    DEFAULT_SCHEMA,
    INFORMATION_SCHEMA,
    Statement,
    classify,
    qualified,
    spark_sql_text,
    split_name,
)  # fmt: skip
from pipelines.transactions.commit import busy_message, recover_pending
from pipelines.transactions.transaction import Transaction, autocommit_attempts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["Session"]

log = logging.getLogger(__name__)
_VIEW_NAME = re.compile(r"\bingest_v\d+\b")
DAY = 86_400.0
#: How far past the commit clock ``refresh_due(now_us)`` may go (a test's controllable
#: clock runs ahead; a tick further ahead would hold the schedule until then).
MAX_TICK_AHEAD_US = 2 * 3_600_000_000
_TRANSACTION_KINDS = {"begin", "commit", "rollback"}
_DML: dict[str, Callable[..., DataFrame]] = {
    "insert": dml.run_insert,
    "update": dml.run_update,
    "delete": dml.run_delete,
    "merge": dml.run_merge,
}


class Session:
    """A SQL session on a warehouse (the service's folder and catalog).

    Args:
        warehouse: the warehouse folder (``catalog.sqlite`` and the tables inside).
        spark: a Spark session to use; by default a local one (shared in the process).
        database, schema: the defaults for one- and two-part names (``USE`` changes them).
        catalog: the catalog, or where it is (a SQLite file or a ``postgresql://`` URL:
            :func:`catalog.open_catalog`); default the warehouse's ``catalog.sqlite``.
    """

    def __init__(
        self,
        warehouse: str | Path,
        spark: SparkSession | None = None,
        database: str = DEFAULT_DATABASE,
        schema: str = DEFAULT_SCHEMA,
        catalog: Catalog | str | Path | None = None,
    ) -> None:
        self.warehouse = Path(warehouse)
        self.warehouse.mkdir(parents=True, exist_ok=True)
        self._own_catalog = not isinstance(catalog, Catalog)
        if not isinstance(catalog, Catalog):
            catalog = open_catalog(catalog or self.warehouse / CATALOG_FILE)
        self.catalog = catalog
        if spark is None:
            from flush.spark_tables import spark_session

            spark = spark_session(app_name="ingest-pipelines")
        else:  # a session the caller made: its Py4J lookups kept too (flush.jvm_lookups)
            from flush import jvm_lookups

            jvm_lookups.install()
        self.spark = spark
        # A session given by the caller too: ${env:X} in a statement would read the
        # environment before the plan guard sees anything (flush.spark_tables says why).
        spark.conf.set("spark.sql.variable.substitute", "false")
        from pipelines import register_data_sources

        register_data_sources(spark)  # format("ingest-changes") and format("ingest")
        self.database, self.schema = database, schema
        self.views: list[str] = []
        #: Each view's table or stream, as the user named it (errors say that, not the view).
        self.view_names: dict[str, str] = {}
        self._transaction: Transaction | None = None
        # Spark logs every failed query; here each one is answered as a SqlError instead.
        for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        recover_pending(self.catalog)
        dynamic.recover_dynamic_tables(self)

    # The public face
    def sql(self, text: str) -> DataFrame:
        """Run one statement; a query's rows, or one row of status or counts.

        Raises:
            SqlError: the statement cannot run (the message names the cause and the fix);
                nothing was changed.
        """
        statement = classify(text)
        try:
            return self._run(statement)
        except SqlError:
            raise
        except TableBusyError as exc:  # DROP, DROP SCHEMA ... CASCADE, CREATE OR REPLACE
            raise SqlError(busy_message(self.catalog, exc), "TABLE_BUSY") from None
        except IngestError as exc:  # conversion rules, names, types: the user's to fix
            raise SqlError(str(exc), getattr(exc, "code", "SQL_EXECUTION_ERROR")) from None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Session]:
        """``with session.transaction():`` BEGIN, then COMMIT, or ROLLBACK on an error."""
        self.sql("BEGIN")
        try:
            yield self
        except BaseException:
            if self._transaction is not None:
                self.sql("ROLLBACK")
            raise
        self.sql("COMMIT")

    def refresh_due(self, now_us: int | None = None) -> list[RefreshRecord]:
        """Run the dynamic-table refreshes due now (or at ``now_us``, microseconds since
        the epoch on the commit clock), as the service's scheduler does; returns their
        history rows. For embedded use: without the service, nothing refreshes on its own.
        """
        from pipelines.dynamic_tables.scheduler import run_due

        if self._transaction is not None:
            raise SqlError("refresh_due cannot run inside a transaction; COMMIT or ROLLBACK "
                           "first", "SQL_COMPILATION_ERROR")  # fmt: skip
        if now_us is not None and now_us > commit_clock.clock() + MAX_TICK_AHEAD_US:
            # A tick becomes the data timestamp and the last tick handled: one far ahead
            # would hold every scheduled refresh until the clock reached it.
            raise SqlError(f"refresh_due: now_us {now_us} is more than "
                           f"{MAX_TICK_AHEAD_US // 3_600_000_000} hours past the commit clock; "
                           "pass a time at most that far ahead, or none for now",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        return run_due(self, now_us)

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (BEGIN without COMMIT or ROLLBACK yet)."""
        return self._transaction is not None

    def release_views(self) -> None:
        """Drop the Spark views earlier statements made; DataFrames a query returned
        before this no longer work afterwards (the worker calls it after each answer)."""
        for view in self.views:
            self.spark.catalog.dropTempView(view)
        self.views.clear()
        self.view_names.clear()

    def table_function(
        self, table: exp.Table, call: exp.Anonymous, defaults: tuple[str, str]
    ) -> tuple[DataFrame, str]:
        """A change stream's ``READ_<name>(...)`` (:mod:`pipelines.change_streams.function`)
        or ``TABLE(<dynamic-table function>(...))`` (:mod:`pipelines.dynamic_tables.
        refresh_history`, ``graph_history``, ``tables_function``) in a query."""
        if call.name.upper() == refresh_history.FUNCTION:
            return refresh_history.history_frame(self, call, defaults), refresh_history.FUNCTION
        if call.name.upper() == graph_history.FUNCTION:
            return graph_history.graph_frame(self, call), graph_history.FUNCTION
        if call.name.upper() == tables_function.FUNCTION:
            return tables_function.tables_frame(self, call, defaults), tables_function.FUNCTION
        return read_frame(self, table, defaults), function_name(call)

    def information_schema_view(self, database: str, name: str) -> DataFrame:
        return information_schema.view_frame(self, database, name)

    def user_names(self, text: str) -> str:
        """``text`` (an error message) with our temporary views' names replaced by the
        names of the tables and streams they stand for."""
        return _VIEW_NAME.sub(lambda m: self.view_names.get(m.group(0), "the table"), text)

    def close(self) -> None:
        self.release_views()
        self._transaction = None
        if self._own_catalog:
            self.catalog.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Running statements
    def _run(self, statement: Statement) -> DataFrame:
        if statement.kind in _TRANSACTION_KINDS:
            return self._transaction_control(statement)
        handler = (ddl.HANDLERS.get(statement.kind) or dynamic.HANDLERS.get(statement.kind)
                   or change_streams.HANDLERS.get(statement.kind))  # fmt: skip
        if handler is not None:
            if self._transaction is not None:
                raise SqlError(
                    f"{statement.kind.replace('_', ' ').upper()} cannot run inside a "
                    "transaction; COMMIT or ROLLBACK first",
                    "SQL_COMPILATION_ERROR",
                )
            return handler(self, statement)
        if self._transaction is not None:
            return self._in(self._transaction, statement)
        # Autocommit: a statement that lost a race on its rows runs again on fresh data.
        for attempt in autocommit_attempts():
            with attempt:
                txn = Transaction(self.catalog, self.spark, statement.kind == "query")
                result = self._in(txn, statement)
                txn.commit(statement.text)
        return result

    def _in(self, txn: Transaction, statement: Statement) -> DataFrame:
        runner = _DML.get(statement.kind)
        if runner is None:  # a query: Spark reads it (no other parser's reading decides)
            binder = Binder(self, txn)
            bound = binder.bind_query(statement.text)
            return result_names(binder, self.run_spark(bound), bound)
        text = spark_sql_text(statement.text.rstrip().removesuffix(";"))
        tree = _dml_tree(text, statement.kind)
        kind = {"insert": exp.Insert, "update": exp.Update, "delete": exp.Delete,
                "merge": exp.Merge}[statement.kind]  # fmt: skip
        if not isinstance(tree, kind):
            raise SqlError(f"cannot read this {statement.kind.upper()} statement",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        try:
            with evaluation_errors():  # raised while Spark computed the change
                result = runner(self, txn, tree, text)
            txn.statements.append(statement.text.strip())
            return result
        finally:
            if txn is not self._transaction:  # an explicit transaction may reuse them
                self.release_views()

    def _transaction_control(self, statement: Statement) -> DataFrame:
        if statement.kind == "begin":
            if self._transaction is not None:
                raise SqlError("a transaction is already open; COMMIT or ROLLBACK it first",
                               "TRANSACTION_ALREADY_OPEN")  # fmt: skip
            self._transaction = Transaction(self.catalog, self.spark)
            return ddl.status_frame(self, "Statement executed successfully.")
        txn, self._transaction = self._transaction, None
        if statement.kind == "commit" and txn is not None:
            txn.commit("; ".join([*txn.statements, "COMMIT"]))  # what others are told
        return ddl.status_frame(self, "Statement executed successfully.")

    def run_spark(self, text: str) -> DataFrame:
        """A query's DataFrame, once :mod:`pipelines.sql.plan_guard` has checked that it reads
        only the views this session's binder made and calls only allowed functions; Spark's
        errors become :class:`SqlError` with Spark's message."""
        try:
            return guarded_frame(self.spark, text, self.views)
        except SqlError as exc:
            raise type(exc)(self.user_names(str(exc)), exc.code) from None

    def consumed(self, txn: Transaction, binder: Binder) -> None:
        """A DML statement read these streams: it consumes them when it commits."""
        for stream_id in binder.streams:
            stream = self.catalog.get_stream_by_id(stream_id)
            if stream is not None:
                txn.consume(stream)

    # Names and objects
    def qualify(self, name: str) -> tuple[str, str, str]:
        parts = split_name(name)
        if not parts or len(parts) > 3:
            raise SqlError(f"invalid name {name[:80]!r}", "SQL_COMPILATION_ERROR")
        return qualified(parts, self.database, self.schema)

    def find_table(self, database: str, schema: str, name: str) -> TableInfo | None:
        try:
            return self.catalog.get_table(database, schema, name)
        except IngestError:
            return None

    def require_table(self, name: str) -> TableInfo:
        return self.table_or_error(*self.qualify(name))

    def table_or_error(self, database: str, schema: str, table: str) -> TableInfo:
        """The table, or an error that names it and says what to check."""
        info = self.find_table(database, schema, table)
        if info is None and self.catalog.get_view(database, schema, table) is not None:
            raise SqlError(
                f"{database}.{schema}.{table} is a view, and this statement needs a table "
                "(views are read, never written or time-travelled): name a table",
                "SQL_COMPILATION_ERROR",
            )
        if info is None and schema == INFORMATION_SCHEMA:
            raise SqlError(f"{database}.{schema}.{table} is read-only: {INFORMATION_SCHEMA} "
                           "holds views that describe the database; write to a table",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        if info is None:
            raise ObjectNotFoundError(
                f"table {database}.{schema}.{table} does not exist"
                f"{did_you_mean(self.catalog, database, schema, table, ['table'])}; check the "
                "name (unquoted names are upper-cased; USE DATABASE/SCHEMA sets the defaults) "
                "or create it"
            )
        return info

    def require_stream(self, name: str) -> StreamRecord:
        database, schema, stream_name = self.qualify(name)
        stream = self.catalog.get_stream(database, schema, stream_name)
        if stream is None:
            raise ObjectNotFoundError(
                f"stream {database}.{schema}.{stream_name} does not exist"
                + did_you_mean(self.catalog, database, schema, stream_name, ["stream"])
            )
        return stream

    def point(self, info: TableInfo, at: str, kind: str, value: Any) -> int:
        """The table version an AT/BEFORE(VERSION|TIMESTAMP|STREAM => ...) names: the
        version whose state the changes start after."""
        text = value.sql("spark") if isinstance(value, exp.Expression) else str(value).strip()
        literal = text[1:-1].replace("''", "'") if text[:1] == "'" else text
        current = DeltaTable(info.uri).version()
        if kind in ("VERSION", "OFFSET"):
            if not literal.lstrip("-").isdigit():
                raise SqlError(
                    f"{kind} => needs a whole number, got {text}", "SQL_COMPILATION_ERROR"
                )
            version = int(literal)
        elif kind == "STREAM":
            stream = self.require_stream(literal)
            if stream.on_view:
                raise SqlError(f"stream {stream.full_name} is on a view: its offsets are one "
                               "per base table; name a stream on the table",
                               "SQL_COMPILATION_ERROR")  # fmt: skip
            if stream.table_id != info.id:
                raise SqlError(
                    f"stream {stream.full_name} is on another table", "SQL_COMPILATION_ERROR"
                )
            version = stream.offset_version
            at = "AT"
        elif kind == "TIMESTAMP":
            version = self._version_at(info, literal, strictly_before=at == "BEFORE")
            at = "AT"
        else:
            raise SqlError(f"unsupported point {kind}", "SQL_COMPILATION_ERROR")
        version = version - 1 if at == "BEFORE" else version
        if not 0 <= version <= current:
            raise SqlError(
                f"version {version} of {info.full_name} does not exist (versions 0 to "
                f"{current})", "SQL_COMPILATION_ERROR",
            )  # fmt: skip
        return version

    def _version_at(self, info: TableInfo, text: str, strictly_before: bool) -> int:
        from ingest_sdk.errors import InvalidValueError
        from ingest_sdk.temporal import moment_micros

        try:  # the one reading of moments in statements, options and arguments
            micros = moment_micros(text)
        except InvalidValueError as error:
            raise SqlError(f"cannot read the timestamp {text!r}: {error}",
                           "SQL_COMPILATION_ERROR") from None  # fmt: skip
        if micros is None:
            raise SqlError(f"cannot read the timestamp {text!r}; write 'YYYY-MM-DD HH:MM:SS' "
                           "(UTC unless it ends with an offset such as +01:00)",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        # The commits' monotonic stamps (flush.commit_clock), not the writers' clocks.
        found = version_at(info.uri, micros, strictly_before)
        if found is None:
            raise SqlError(f"{info.full_name} has no version at or before {text}",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        return found

    # Streams
    def staleness(self, stream: StreamRecord, table: TableInfo | None) -> tuple[bool, float]:
        """Whether the stream is stale, and when it becomes stale if not consumed.

        ``STALE_AFTER`` = when the offset last moved + the larger of the table's data
        retention and its maximum extension (the extension holds while unconsumed).
        """
        if table is None:
            return True, stream.offset_moved_at
        days = max(table.properties["data_retention_time_in_days"],
                   table.properties["max_data_extension_time_in_days"])  # fmt: skip
        stale_after = stream.offset_moved_at + days * DAY
        return time.time() > stale_after or not _history_kept(table, stream), stale_after

    def check_stream_fresh(self, stream: StreamRecord) -> None:
        if stream.on_view:
            view_streams.check_fresh(self, stream)
            return
        stale, _ = self.staleness(stream, self.catalog.get_table_by_id(stream.table_id))
        if stale:
            raise StreamStaleError(
                f"stream {stream.full_name} is stale: its offset (version "
                f"{stream.offset_version}) is outside the table's retained history, or its "
                "table was dropped or replaced; recreate it with CREATE OR REPLACE STREAM"
            )


def _dml_tree(text: str, kind: str) -> exp.Expression:
    """The structure of a DML statement, read by sqlglot (its expressions are carried as
    written); where it cannot read one, the error says how to write it instead.

    Raises:
        SqlError: SQL_COMPILATION_ERROR, naming the place.
    """
    try:
        return parse_with_spans(text)
    except SqlError as exc:
        if exc.code != "SQL_COMPILATION_ERROR" or "syntax error at" not in str(exc):
            raise
        raise SqlError(
            f"{exc}. {kind.upper()} is read by a parser of its own before Spark runs its "
            "expressions as written: if Spark reads that expression, write it as a function "
            "call (collate(v, 'UTF8_LCASE') for CAST(v AS STRING COLLATE UTF8_LCASE)), or "
            "compute it in a view (CREATE VIEW w AS SELECT ...) that the statement reads",
            "SQL_COMPILATION_ERROR",
        ) from None


def _history_kept(table: TableInfo, stream: StreamRecord) -> bool:
    """Whether every commit after the stream's offset is still in the table's log."""
    versions = logged_versions(table.uri)
    return (
        not versions
        or min(versions) <= stream.offset_version + 1
        or max(versions) <= (stream.offset_version)
    )
