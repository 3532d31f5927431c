"""Statements that run a query or change rows but are not plain DML: CREATE TABLE ... AS
SELECT, TRUNCATE TABLE and EXPLAIN.

Each reads through a :class:`~pipelines.transactions.transaction.Transaction` and the
binder, and hands Spark only the text the binder made, through ``session.run_spark`` (the
plan guard), as every query does. CREATE TABLE ... AS inserts its rows exactly as
``INSERT INTO t SELECT`` does (ingest conversion rules, row ids from the table's sequence,
streams it reads consumed at its commit); TRUNCATE deletes exactly as ``DELETE FROM t``
does, so streams on the table see the deletes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pyarrow as pa
from sqlglot import exp

from catalog import TableInfo, did_you_mean, full_name
from flush import check_column_names, create_catalog_table
from flush.change_commit import ChangeSet
from flush.spark_tables import rows_frame
from flush.tables import ROW_ID_COLUMN, delta_schema
from ingest_sdk import SchemaError, TableSchema
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.errors import TableAlreadyExistsError
from ingest_sdk.schema import quote_identifier
from pipelines.errors import (
    ObjectNotFoundError,
    SqlError,
    UnsupportedStatementError,
    evaluation_errors,
    spark_errors,
)
from pipelines.sql import dml
from pipelines.sql.binding import Binder, check_writable, result_names
from pipelines.sql.binding import quote as quote_name
from pipelines.sql.ddl_common import (
    COLUMN_DEFINITION,
    drop_table_info,
    new_table_name,
    split_columns,
    status_frame,
)
from pipelines.sql.source_text import parse_with_spans
from pipelines.sql.statements import Statement, classify, split_name
from pipelines.transactions.commit import when_free
from pipelines.transactions.transaction import Transaction, autocommit_attempts

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructField

    from pipelines.sql.context import StatementContext

__all__ = ["create_table_as", "explain", "query_frame", "spark_declaration", "truncate"]


def query_frame(
    session: StatementContext,
    txn: Transaction,
    text: str,
    what: str,
    within: tuple[str, ...] = (),
    analysis: bool = False,
) -> tuple[Binder, DataFrame]:
    """The bound query of a statement that holds one (``what`` names the statement), as an
    unevaluated DataFrame that passed the plan guard (``within``: the view being defined,
    which its own body may not read; ``analysis``: a definition checked, not run)."""
    text = text.rstrip().removesuffix(";")
    try:
        kind = classify(text).kind
    except UnsupportedStatementError:
        kind = "unsupported"
    if kind != "query":
        raise SqlError(f"{what} needs a query (SELECT, WITH or VALUES) after it, got "
                       f"{' '.join(text.split())[:60]!r}", "SQL_COMPILATION_ERROR")  # fmt: skip
    binder = Binder(session, txn, within=within, analysis=analysis)
    bound = binder.bind_query(text)
    return binder, result_names(binder, session.run_spark(bound), bound)


# CREATE TABLE ... AS SELECT
def spark_declaration(field: StructField) -> str:
    """The column declaration of a query column (types.md names them): integers are
    ``NUMBER(38,0)`` as the reference system's integer types are, decimals keep their
    precision and scale, strings are ``VARCHAR`` of the longest length, a bare NULL is
    ``VARCHAR``; NOT NULL where Spark knows the column holds no NULL.

    Raises:
        SqlError: a Spark type no table column stores (``UNSUPPORTED_TYPE``).
    """
    from pyspark.sql import types as T

    kind = field.dataType
    declared: str | None = None
    if isinstance(kind, T.ByteType | T.ShortType | T.IntegerType | T.LongType):
        declared = "NUMBER(38,0)"
    elif isinstance(kind, T.DecimalType):
        declared = f"NUMBER({kind.precision},{kind.scale})"
    elif isinstance(kind, T.FloatType | T.DoubleType):
        declared = "FLOAT"
    elif isinstance(kind, T.CharType | T.VarcharType):
        declared = f"VARCHAR({kind.length})"
    elif isinstance(kind, T.StringType | T.NullType):
        declared = "VARCHAR"
    else:
        simple: dict[type[T.DataType], str] = {
            T.BinaryType: "BINARY", T.BooleanType: "BOOLEAN", T.DateType: "DATE",
            T.TimestampNTZType: "TIMESTAMP_NTZ", T.TimestampType: "TIMESTAMP_LTZ",
        }  # fmt: skip
        declared = simple.get(type(kind))
    if declared is None:
        shown = quote_identifier(field.name)
        raise SqlError(
            f"the query's column {shown} has the Spark type {kind.simpleString()}, which no "
            f"table column stores: convert it in the query (to_json({shown}) gives its JSON "
            f"text, for a column declared VARIANT, OBJECT or ARRAY in a column list: CREATE "
            f"TABLE t ({shown} VARIANT, ...) AS SELECT ...), or leave it out",
            "UNSUPPORTED_TYPE",
        )
    return declared if field.nullable else f"{declared} NOT NULL"


def _ctas_schema(frame: DataFrame, columns: str | None) -> TableSchema:
    """The new table's schema: the query's columns, or the column list's names and (where
    given) declarations, matched by position."""
    fields = frame.schema.fields
    written: list[tuple[str, str | None]] = [(quote_identifier(f.name), None) for f in fields]
    if columns is not None:
        definitions = split_columns(columns)
        if any(re.search(r"\bPRIMARY\s+KEY\b", d, re.I) for d in definitions):
            raise SqlError("CREATE TABLE ... AS takes no PRIMARY KEY; create the table with "
                           "its key (CREATE TABLE t (..., PRIMARY KEY (...))), then INSERT "
                           "INTO t SELECT ...", "SQL_COMPILATION_ERROR")  # fmt: skip
        if len(definitions) != len(fields):
            raise SqlError(
                f"the column list names {len(definitions)} column(s) but the query gives "
                f"{len(fields)}; list one name (and optionally a type) per query column",
                "SQL_COMPILATION_ERROR",
            )
        written = []
        for definition in definitions:
            match = COLUMN_DEFINITION.fullmatch(definition)
            if match is None:
                raise SqlError(f"cannot read the column definition {definition[:80]!r}; write "
                               "NAME [TYPE [NOT NULL]]", "SQL_COMPILATION_ERROR")  # fmt: skip
            written.append((match.group(1), match.group(2)))
    declarations: dict[str, str] = {}
    seen: set[str] = set()
    for field, (name, declaration) in zip(fields, written, strict=True):
        stored = split_name(name)[0]
        if stored in seen:
            raise SqlError(
                f"the query gives two columns named {quote_identifier(stored)}; name each "
                "column once (SELECT ... AS other_name, or a column list)",
                "SQL_COMPILATION_ERROR",
            )
        seen.add(stored)
        declarations[name] = declaration or spark_declaration(field)
    schema = TableSchema.parse(declarations)
    if any(column.name.upper() == ROW_ID_COLUMN for column in schema):
        raise SchemaError(f'the column name "{ROW_ID_COLUMN}" is reserved for the hidden row id')
    check_column_names(schema)
    return schema


def create_table_as(session: StatementContext, statement: Statement) -> DataFrame:
    """``CREATE [OR REPLACE] TABLE [IF NOT EXISTS] t [(col [TYPE], ...)] AS <query>``.

    Nothing is created or replaced until the query's rows are computed and pass the
    conversion rules. OR REPLACE moves the old table aside (a rename, which keeps it
    whole) while the new one is made, drops it once the new one committed, and puts it
    back if that failed; a failed insert leaves no new table behind. IF NOT EXISTS on an
    existing table runs nothing and changes nothing.
    """
    parts = statement.parts
    database, schema_name, name = new_table_name(session, parts)
    shown = full_name(database, schema_name, name)
    existing = session.find_table(database, schema_name, name)
    if existing is not None and parts["if_not_exists"]:
        return status_frame(session, f"{existing.name} already exists, statement succeeded.")
    if existing is not None and not parts["replace"]:
        raise SqlError(
            f"table {shown} already exists; write CREATE TABLE IF NOT EXISTS to keep it, or "
            "CREATE OR REPLACE TABLE to replace it",
            "TABLE_EXISTS",
        )
    if existing is not None:
        check_writable(session, existing, "CREATE OR REPLACE TABLE")
    txn = Transaction(session.catalog, session.spark)
    try:
        binder, frame = query_frame(session, txn, parts["query"] or "", "CREATE TABLE ... AS")
        schema = _ctas_schema(frame, parts["columns"])
        with evaluation_errors():
            data = frame.toArrow()
        # By position, each name spelt so the identifier rules find exactly its column.
        names = [quote_identifier(name) for name in schema.names]
        checked = check_arrow_batch(schema, data.rename_columns(names))
        info = _replace_with(session, existing, (database, schema_name, name), schema,
                             lambda info: _insert(session, txn, binder, info, checked,
                                                  statement.text))  # fmt: skip
    finally:
        session.release_views()
    return status_frame(session, f"Table {info.name} successfully created.")


def _insert(
    session: StatementContext, txn: Transaction, binder: Binder, info: TableInfo, checked: pa.Table,
    text: str,
) -> None:  # fmt: skip
    """Commit the checked rows to the new table with ids from its sequence, consuming the
    streams the query read (as INSERT INTO ... SELECT does)."""
    if checked.num_rows == 0 and not binder.streams:
        return  # nothing to commit: the table is empty at version 0
    first = session.catalog.reserve_row_ids(info.id, checked.num_rows)
    ids = pa.array(range(first, first + checked.num_rows), pa.int64())
    target = delta_schema(info.schema)
    rows = checked.append_column(target.field(ROW_ID_COLUMN), ids).cast(target)
    txn.stage(info, ChangeSet(rows, new_ids=ids))
    session.consumed(txn, binder)
    txn.commit(text)


def _replace_with(
    session: StatementContext,
    existing: TableInfo | None,
    names: tuple[str, str, str],
    schema: TableSchema,
    fill: Callable[[TableInfo], None],
) -> TableInfo:
    """Create the table ``names`` and ``fill`` it (a callable taking the new table), in
    place of ``existing`` if given; see :func:`create_table_as` for the order of steps.

    A fill that fails before its commit is decided drops the new table and puts the old
    one back. Once decided (recorded in the catalog) the commit is completed, now or by
    recovery, into the new table: that one stays, and the old one goes.
    """
    database, schema_name, name = names
    catalog = session.catalog
    if existing is not None:  # not while a pending commit writes it: nothing changes then
        aside = f"{name}$REPLACED${uuid.uuid4().hex[:12]}"
        when_free(catalog, lambda: catalog.rename_table(existing.id, database, schema_name, aside),
                  [existing.id])  # fmt: skip
    try:
        info, _ = create_catalog_table(
            catalog, session.warehouse, database, schema_name, name, schema
        )
    except BaseException as exc:
        if existing is not None:
            _put_back(session, existing, names)
        if isinstance(exc, TableAlreadyExistsError):  # created by someone else meanwhile
            raise SqlError(
                f"table {full_name(*names)} already exists; write CREATE TABLE IF NOT EXISTS "
                "to keep it, or CREATE OR REPLACE TABLE to replace it",
                "TABLE_EXISTS",
            ) from None
        raise
    try:
        fill(info)
    except BaseException:
        if not _decided(session, info):
            drop_table_info(session, info)
            if existing is not None:
                _put_back(session, existing, names)
            raise
        if existing is not None:
            drop_table_info(session, existing)
        raise
    if existing is not None:
        drop_table_info(session, existing)
    return info


def _decided(session: StatementContext, info: TableInfo) -> bool:
    """Whether a decided pipeline commit writes to the table (its decision stands)."""
    return bool(session.catalog.commits_holding([info.id], decided_only=True))


def _put_back(session: StatementContext, existing: TableInfo, names: tuple[str, str, str]) -> None:
    try:
        session.catalog.rename_table(existing.id, *names)
    except Exception as exc:  # the name was taken meanwhile: say where the old table is
        aside = session.catalog.get_table_by_id(existing.id)
        raise SqlError(
            f"CREATE OR REPLACE TABLE failed and the old table could not get its name back "
            f"({exc}); it is kept as {aside.full_name if aside else '?'}: rename it with "
            "ALTER TABLE ... RENAME TO",
            "SQL_EXECUTION_ERROR",
        ) from exc


# TRUNCATE TABLE
def truncate(session: StatementContext, statement: Statement) -> DataFrame:
    """``TRUNCATE [TABLE] [IF EXISTS] t``: every row deleted in one commit, as ``DELETE
    FROM t`` deletes them (streams on the table see one DELETE per row); a statement that
    lost a race with another writer runs again on fresh data, as an autocommit DELETE does.
    """
    database, schema_name, name = session.qualify(statement.parts["name"] or "")
    info = session.find_table(database, schema_name, name)
    if info is None and not statement.parts["if_exists"]:
        info = session.table_or_error(database, schema_name, name)  # a view: says so
    if info is None:
        if statement.parts["if_exists"]:
            return status_frame(session, "Statement executed successfully (table did not exist).")
        raise ObjectNotFoundError(
            f"table {full_name(database, schema_name, name)} does not exist"
            f"{did_you_mean(session.catalog, database, schema_name, name, ['table'])}; check "
            "the name (unquoted names are upper-cased; USE DATABASE/SCHEMA sets the defaults)"
        )
    check_writable(session, info, "TRUNCATE")
    for attempt in autocommit_attempts():
        with attempt:
            txn = Transaction(session.catalog, session.spark)
            text = "DELETE FROM " + ".".join(map(quote_name, (info.database, info.schema_name,
                                                          info.name)))  # fmt: skip
            try:
                with evaluation_errors():
                    tree = parse_with_spans(text)
                    assert isinstance(tree, exp.Delete)
                    dml.run_delete(session, txn, tree, text)
                txn.commit(statement.text)
            finally:
                session.release_views()
    return status_frame(session, "Statement executed successfully.")


# EXPLAIN
_EXPLAIN_MODES = {None: "simple", "EXTENDED": "extended", "FORMATTED": "formatted",
                  "COST": "cost"}  # fmt: skip
#: A scan's file list (``Location: InMemoryFileIndex(1 paths)[file:/...``), up to the next
#: field of the same line or the end of the line.
_LOCATION = re.compile(r"Location: [^\n]*?(?=, PartitionFilters:|\n|\Z)")
_FILE_URI = re.compile(r"file:[^\s,\]\)]*")


def without_paths(plan: str, warehouse: str | Path) -> str:
    """A plan's text without the warehouse's file paths: scans' file lists become
    ``Location: <warehouse>``, and any other spelling of the warehouse folder (as a
    path, a ``file:`` URI or percent-escaped) ``<warehouse>``."""
    plan = _LOCATION.sub("Location: <warehouse>", plan)
    given, root = Path(warehouse), Path(warehouse).resolve()
    spellings = {root.as_uri(), f"file:{root}", str(root), str(given.absolute()), quote(str(root))}
    for spelling in sorted(spellings, key=len, reverse=True):
        plan = plan.replace(spelling, "<warehouse>")
    return _FILE_URI.sub("<path>", plan)


def explain(session: StatementContext, statement: Statement) -> DataFrame:
    """``EXPLAIN [EXTENDED | FORMATTED | COST] <query>``: Spark's plan of the query as the
    binder hands it to Spark (the plan guard checked it), one row per line in the column
    ``plan``, without file paths. Tables appear as the views the binder made of them."""
    txn = Transaction(session.catalog, session.spark)
    _, frame = query_frame(session, txn, statement.parts["query"] or "", "EXPLAIN")
    mode = _EXPLAIN_MODES[(statement.parts["mode"] or "").upper() or None]
    with spark_errors("SQL_COMPILATION_ERROR"):
        utils = session.spark._jvm.PythonSQLUtils  # type: ignore[union-attr]
        text = str(utils.explainString(frame._jdf.queryExecution(), mode))
    lines = without_paths(text, session.warehouse).rstrip("\n").split("\n")
    return rows_frame(session.spark, [(line,) for line in lines], "plan STRING")
