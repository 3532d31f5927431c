"""``TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...))``: the refresh history of dynamic tables as
a relation a query reads (filtered, joined, ordered by Spark like any other).

The binder finds the call and the session answers it before Spark sees the query: the
rows come from the catalog's history (:meth:`catalog.Catalog.list_refreshes`, newest
first) and become a temporary view. Arguments, by name: ``NAME => 'db.schema.dt'`` (one
table; unqualified parts take the session's defaults), ``NAME_PREFIX => 'DB.S'`` (tables
whose qualified name starts so), ``ERROR_ONLY => TRUE`` (failed refreshes only),
``RESULT_LIMIT => n`` (at most n rows, 1 to 10,000; 100 by default, newest first),
``DATA_TIMESTAMP_START`` / ``DATA_TIMESTAMP_END => '<timestamp>'`` (refreshes whose data
timestamp is within; without them, every refresh the catalog keeps, where Snowflake's
default is the last day). Their reading is :mod:`pipelines.dynamic_tables.arguments`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import orjson
from sqlglot import exp

from catalog import RefreshRecord
from flush.spark_tables import rows_frame
from pipelines.dynamic_tables import arguments

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
_ARGUMENTS = ("NAME", "NAME_PREFIX", "ERROR_ONLY", "RESULT_LIMIT", "DATA_TIMESTAMP_START",
              "DATA_TIMESTAMP_END")

def history_rows(
    session: StatementContext, call: exp.Anonymous, defaults: tuple[str, str]
) -> list[tuple[object, ...]]:
    """The rows the call answers, newest first."""
    found = arguments.named_arguments(call, FUNCTION, _ARGUMENTS)
    wanted: int | None = None
    if "NAME" in found:
        wanted = arguments.dynamic_table(session, found["NAME"], FUNCTION, defaults).id
    prefix = ""
    if "NAME_PREFIX" in found:
        prefix = arguments.text(found["NAME_PREFIX"], FUNCTION, "NAME_PREFIX").strip()
    error_only = "ERROR_ONLY" in found and arguments.boolean(found["ERROR_ONLY"], FUNCTION,
                                                             "ERROR_ONLY")  # fmt: skip
    limit = DEFAULT_LIMIT
    if "RESULT_LIMIT" in found:
        limit = arguments.limit(found["RESULT_LIMIT"], FUNCTION, MAX_LIMIT)
    start, end = (arguments.timestamp_us(found[key], FUNCTION, key) if key in found else None
                  for key in ("DATA_TIMESTAMP_START", "DATA_TIMESTAMP_END"))  # fmt: skip
    tables = {t.id: t for t in session.catalog.list_tables()}
    rows = []
    for record in session.catalog.list_refreshes(wanted, limit=MAX_LIMIT):
        info = tables.get(record.dt_table_id)
        qualified_name = info.full_name if info is not None else record.name
        if prefix and not qualified_name.startswith(prefix):
            continue
        if error_only and record.state != "FAILED":
            continue
        stamp = record.data_timestamp_us
        if (start is not None and stamp < start) or (end is not None and stamp > end):
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
    return rows_frame(session.spark, history_rows(session, call, defaults), COLUMNS)
