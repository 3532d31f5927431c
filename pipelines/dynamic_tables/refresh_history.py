"""``TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...))``: the refresh history of dynamic tables as
a relation a query reads (filtered, joined, ordered by Spark like any other).

The binder finds the call and the session answers it before Spark sees the query: the
rows come from the catalog's history (:meth:`catalog.Catalog.list_refreshes`, newest
first) and become a temporary view. Arguments, by name: ``NAME => 'db.schema.dt'`` (one
table; unqualified parts take the session's defaults), ``NAME_PREFIX => 'DB.S'`` (tables
whose qualified name starts so), ``ERROR_ONLY => TRUE`` (failed refreshes only),
``RESULT_LIMIT => n`` (at most n rows, 1 to 10,000; 100 by default, newest first).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import orjson
from sqlglot import exp

from catalog import RefreshRecord, did_you_mean, full_name
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.statements import NAME, qualified, split_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["COLUMNS", "FUNCTION", "history_frame", "history_rows"]

FUNCTION = "DYNAMIC_TABLE_REFRESH_HISTORY"
DEFAULT_LIMIT, MAX_LIMIT = 100, 10_000
COLUMNS = (
    "NAME STRING, SCHEMA_NAME STRING, DATABASE_NAME STRING, QUALIFIED_NAME STRING, "
    "STATE STRING, STATE_CODE STRING, STATE_MESSAGE STRING, REFRESH_ACTION STRING, "
    "REFRESH_TRIGGER STRING, DATA_TIMESTAMP TIMESTAMP, REFRESH_START_TIME TIMESTAMP, "
    "REFRESH_END_TIME TIMESTAMP, LAG_SECONDS DOUBLE, ROWS_INSERTED BIGINT, "
    "ROWS_DELETED BIGINT, ROWS_UPDATED BIGINT, SOURCE_VERSIONS STRING, TABLE_VERSION BIGINT, "
    "SKIPPED_TICKS BIGINT"
)
_ARGUMENTS = ("NAME", "NAME_PREFIX", "ERROR_ONLY", "RESULT_LIMIT")


def _arguments(call: exp.Anonymous) -> dict[str, exp.Expression]:
    found: dict[str, exp.Expression] = {}
    for argument in call.expressions:
        if not isinstance(argument, exp.Kwarg):
            raise SqlError(
                f"{FUNCTION} takes named arguments ({', '.join(_ARGUMENTS)}), e.g. "
                f"{FUNCTION}(NAME => 'MY_DT')", "SQL_COMPILATION_ERROR",
            )  # fmt: skip
        key = argument.this.name.upper()
        if key not in _ARGUMENTS or key in found:
            raise SqlError(f"{FUNCTION}: unknown or repeated argument {key[:40]}; the arguments "
                           f"are {', '.join(_ARGUMENTS)}", "SQL_COMPILATION_ERROR")  # fmt: skip
        found[key] = argument.expression
    return found


def _text(value: exp.Expression, key: str) -> str:
    if not (isinstance(value, exp.Literal) and value.is_string):
        raise SqlError(f"{FUNCTION}: {key} takes a string", "SQL_COMPILATION_ERROR")
    return value.name


def history_rows(
    session: StatementContext, call: exp.Anonymous, defaults: tuple[str, str]
) -> list[tuple[object, ...]]:
    """The rows the call answers, newest first."""
    import re

    arguments = _arguments(call)
    wanted: int | None = None
    prefix = ""
    if "NAME" in arguments:
        text = _text(arguments["NAME"], "NAME").strip()
        if re.fullmatch(NAME, text) is None:
            raise SqlError(f"{FUNCTION}: {text[:80]!r} is not a name", "SQL_COMPILATION_ERROR")
        names = qualified(split_name(text), *defaults)
        info = session.find_table(*names)
        if info is None or session.catalog.get_dynamic_table(info.id) is None:
            hint = did_you_mean(session.catalog, *names, ["dynamic table"])
            raise ObjectNotFoundError(f"dynamic table {full_name(*names)} does not exist{hint} "
                                      f"({FUNCTION}'s NAME names one)")  # fmt: skip
        wanted = info.id
    if "NAME_PREFIX" in arguments:
        prefix = _text(arguments["NAME_PREFIX"], "NAME_PREFIX").strip()
    error_only = False
    if "ERROR_ONLY" in arguments:
        flag = arguments["ERROR_ONLY"]
        if not isinstance(flag, exp.Boolean):
            raise SqlError(f"{FUNCTION}: ERROR_ONLY takes TRUE or FALSE", "SQL_COMPILATION_ERROR")
        error_only = bool(flag.this)
    limit = DEFAULT_LIMIT
    if "RESULT_LIMIT" in arguments:
        value = arguments["RESULT_LIMIT"]
        if not (isinstance(value, exp.Literal) and value.is_int
                and 1 <= int(value.name) <= MAX_LIMIT):  # fmt: skip
            raise SqlError(f"{FUNCTION}: RESULT_LIMIT takes a whole number from 1 to "
                           f"{MAX_LIMIT}", "SQL_COMPILATION_ERROR")  # fmt: skip
        limit = int(value.name)
    tables = {t.id: t for t in session.catalog.list_tables()}
    rows = []
    for record in session.catalog.list_refreshes(wanted, limit=MAX_LIMIT):
        info = tables.get(record.dt_table_id)
        qualified_name = info.full_name if info is not None else record.name
        if prefix and not qualified_name.startswith(prefix):
            continue
        if error_only and record.state != "FAILED":
            continue
        rows.append(_row(record, info.name if info else record.name.rsplit(".", 1)[-1],
                         info.schema_name if info else "", info.database if info else "",
                         qualified_name))  # fmt: skip
        if len(rows) >= limit:
            break
    return rows


def _utc(seconds: float | None) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC).replace(tzinfo=None) if seconds else None


def _row(
    record: RefreshRecord, name: str, schema: str, database: str, qualified_name: str
) -> tuple[object, ...]:
    stamp = record.data_timestamp_us / 1e6
    lag = round(record.ended_at - stamp, 6) if record.ended_at else None
    return (
        name, schema, database, qualified_name, record.state, record.reason or None,
        record.error or None, record.action, record.trigger, _utc(stamp), _utc(record.started_at),
        _utc(record.ended_at), lag, record.rows_inserted, record.rows_deleted,
        record.rows_updated, orjson.dumps(record.source_versions).decode(), record.table_version,
        record.skipped_ticks,
    )  # fmt: skip


def history_frame(
    session: StatementContext, call: exp.Anonymous, defaults: tuple[str, str]
) -> DataFrame:
    return session.spark.createDataFrame(history_rows(session, call, defaults), COLUMNS)
