"""``TABLE([db.]INFORMATION_SCHEMA.DYNAMIC_TABLES(...))``: one row per dynamic table with
its lag as measured from the refresh history, as Snowflake's function of that name
describes them.

The lag of a table at a moment is that moment minus the data timestamp of the content
it then holds (never below 0): it grows by a second per second, and each successful
refresh (INCREMENTAL, FULL or NO_DATA) brings it down to its end minus its data
timestamp. ``MEAN_LAG_SEC``, ``MAXIMUM_LAG_SEC`` and ``TIME_ABOVE_TARGET_LAG_SEC`` are
the mean, the peak and the time above the target of that sawtooth from the end of the
first successful refresh the history keeps (7 days, 20,000 per table) until now; for a
suspended table, whose lag is not being kept, they are NULL, as in Snowflake. The
target is the current one (an ALTER does not restart the measure, unlike Snowflake's).

Arguments, by name: ``NAME => '[db.][schema.]dt'``, ``REFRESH_DATA_TIMESTAMP_START =>
'<timestamp>'`` (the measure counts refreshes with a data timestamp at or after it),
``RESULT_LIMIT => n`` (1 to 10,000; 100 by default), ``INCLUDE_CONNECTED => TRUE`` (with
``NAME`` and without ``RESULT_LIMIT``: every dynamic table of NAME's pipeline, those it
reads and those reading it, transitively), and ``NAME_PREFIX`` (ours, as
``DYNAMIC_TABLE_GRAPH_HISTORY``'s; ``db.INFORMATION_SCHEMA.`` before the call gives one).
Rows come in Snowflake's order: by the last completed refresh's state (FAILED, then
SKIPPED, then SUCCEEDED, then tables with none), then by qualified name.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlglot import exp

from catalog import DynamicTableRecord, RefreshRecord
from flush.spark_tables import rows_frame
from pipelines.dynamic_tables import arguments
from pipelines.errors import SqlError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from catalog import Catalog
    from pipelines.sql.context import StatementContext

__all__ = ["COLUMNS", "FUNCTION", "Lag", "lag_measure", "tables_frame", "tables_rows"]

FUNCTION = "DYNAMIC_TABLES"
DEFAULT_LIMIT, MAX_LIMIT = 100, 10_000
COLUMNS = (
    "NAME STRING, SCHEMA_NAME STRING, DATABASE_NAME STRING, QUALIFIED_NAME STRING, "
    "TARGET_LAG_SEC BIGINT, TARGET_LAG_TYPE STRING, "
    "SCHEDULING_STATE STRUCT<state: STRING, reason_code: STRING, reason_message: STRING>, "
    "MEAN_LAG_SEC DOUBLE, MAXIMUM_LAG_SEC DOUBLE, TIME_ABOVE_TARGET_LAG_SEC DOUBLE, "
    "TIME_WITHIN_TARGET_LAG_RATIO DOUBLE, LATEST_DATA_TIMESTAMP TIMESTAMP, "
    "LAST_COMPLETED_REFRESH_STATE STRING, LAST_COMPLETED_REFRESH_STATE_CODE STRING, "
    "LAST_COMPLETED_REFRESH_STATE_MESSAGE STRING, REFRESH_MODE STRING, "
    "REFRESH_MODE_REASON STRING"
)
_ARGUMENTS = ("NAME", "REFRESH_DATA_TIMESTAMP_START", "RESULT_LIMIT", "INCLUDE_CONNECTED",
              "NAME_PREFIX")  # fmt: skip
#: Snowflake's order of the last completed refresh's state (ours has no UPSTREAM_FAILED
#: or CANCELED: a refresh whose upstream failed fails itself, and none is cancelled).
_STATE_ORDER = {"FAILED": 0, "UPSTREAM_FAILED": 1, "SKIPPED": 2, "SUCCEEDED": 3, "CANCELED": 4}
_CODE = "SQL_COMPILATION_ERROR"


@dataclass(frozen=True, slots=True)
class Lag:
    """A table's lag over the measured time, in seconds (``above``/``within``: None
    without a time target, i.e. DOWNSTREAM)."""

    mean: float
    maximum: float
    above: float | None
    within: float | None


@dataclass(frozen=True, slots=True)
class _Call:
    wanted: int | None
    connected: bool
    prefix: str
    start_us: int | None
    limit: int


def lag_measure(
    refreshes: list[RefreshRecord], target_s: float | None, now: float, start_us: int | None = None
) -> Lag | None:
    """The lag of a table with these history rows from the end of its first successful
    refresh (with a data timestamp at or after ``start_us``) until ``now``; None without
    one. Each successful refresh holds from its end until the next one's."""
    done = sorted((r.ended_at, r.data_timestamp_us / 1e6) for r in refreshes
                  if r.state == "SUCCEEDED" and r.ended_at is not None
                  and (start_us is None or r.data_timestamp_us >= start_us))  # fmt: skip
    if not done or now < done[0][0]:
        return None
    area = peak = above = 0.0
    stamp = float("-inf")
    for (begin, data_s), (end, _) in zip(done, [*done[1:], (now, 0.0)], strict=True):
        stamp = max(stamp, data_s)  # content never goes back to an older data timestamp
        low = max(begin, stamp)  # before it, the lag is 0 (a data timestamp ahead of time)
        if end > low:
            area += (low - stamp + end - stamp) / 2 * (end - low)
            peak = max(peak, end - stamp)
        if target_s is not None:
            above += max(0.0, end - max(begin, stamp + target_s))
    span = now - done[0][0]
    if span <= 0:  # measured at the very end of the first refresh
        current = max(0.0, now - stamp)
        late = target_s is not None and current > target_s
        return Lag(round(current, 3), round(current, 3), 0.0 if target_s is not None else None,
                   (0.0 if late else 1.0) if target_s is not None else None)  # fmt: skip
    return Lag(
        round(area / span, 3), round(peak, 3),
        round(above, 3) if target_s is not None else None,
        round(1 - above / span, 6) if target_s is not None else None,
    )  # fmt: skip


def _read_call(session: StatementContext, call: exp.Anonymous, defaults: tuple[str, str]) -> _Call:
    found = arguments.named_arguments(call, FUNCTION, _ARGUMENTS)
    wanted = None
    if "NAME" in found:
        wanted = arguments.dynamic_table(session, found["NAME"], FUNCTION, defaults).id
    connected = "INCLUDE_CONNECTED" in found and arguments.boolean(
        found["INCLUDE_CONNECTED"], FUNCTION, "INCLUDE_CONNECTED")  # fmt: skip
    if connected and wanted is None:
        raise SqlError(f"{FUNCTION}: INCLUDE_CONNECTED => TRUE needs NAME => '<dynamic "
                       "table>', whose pipeline it lists", _CODE)  # fmt: skip
    if connected and "RESULT_LIMIT" in found:
        raise SqlError(f"{FUNCTION}: INCLUDE_CONNECTED => TRUE lists the whole pipeline and "
                       "takes no RESULT_LIMIT (as in Snowflake): leave RESULT_LIMIT out, or "
                       "add LIMIT n to the query", _CODE)  # fmt: skip
    prefix = ""
    if "NAME_PREFIX" in found:
        prefix = arguments.text(found["NAME_PREFIX"], FUNCTION, "NAME_PREFIX").strip()
    start_us = None
    if "REFRESH_DATA_TIMESTAMP_START" in found:
        start_us = arguments.timestamp_us(found["REFRESH_DATA_TIMESTAMP_START"], FUNCTION,
                                          "REFRESH_DATA_TIMESTAMP_START")  # fmt: skip
    limit = MAX_LIMIT if connected else DEFAULT_LIMIT
    if "RESULT_LIMIT" in found:
        limit = arguments.limit(found["RESULT_LIMIT"], FUNCTION, MAX_LIMIT)
    return _Call(wanted, connected, prefix, start_us, limit)


def _pipeline(dynamic: dict[int, DynamicTableRecord], table_id: int) -> set[int]:
    """The dynamic tables connected to ``table_id`` through what they read, either way."""
    neighbours: dict[int, set[int]] = {key: set() for key in dynamic}
    for key, dt in dynamic.items():
        for source in dt.sources:
            if source.kind != "view" and source.source_id in dynamic:
                neighbours[key].add(source.source_id)
                neighbours[source.source_id].add(key)
    seen, todo = {table_id}, [table_id]
    while todo:
        for other in neighbours.get(todo.pop(), ()):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def tables_rows(
    session: StatementContext, call: exp.Anonymous, defaults: tuple[str, str], now: float
) -> list[tuple[object, ...]]:
    """The rows the call answers, in Snowflake's order (``now``: where the lag measure
    ends, seconds since the epoch)."""
    wanted = _read_call(session, call, defaults)
    catalog = session.catalog
    dynamic = {dt.table_id: dt for dt in catalog.list_dynamic_tables()}
    if wanted.wanted is None:
        chosen = set(dynamic)
    else:
        chosen = _pipeline(dynamic, wanted.wanted) if wanted.connected else {wanted.wanted}
    tables = {t.id: t for t in catalog.list_tables()}
    ranked = []
    for table_id in chosen:
        info, dt = tables.get(table_id), dynamic[table_id]
        if info is None or dt.state == "INITIALIZING" or not info.full_name.startswith(
                wanted.prefix):  # fmt: skip
            continue  # (INITIALIZING: a CREATE still running)
        last, row = _row(catalog, info.name, info.schema_name, info.database, info.full_name,
                         dt, now, wanted.start_us)  # fmt: skip
        ranked.append((_STATE_ORDER.get(last or "", len(_STATE_ORDER)), info.full_name, row))
    return [row for _, _, row in sorted(ranked, key=lambda r: r[:2])][: wanted.limit]


def _row(
    catalog: Catalog, name: str, schema: str, database: str, qualified_name: str,
    dt: DynamicTableRecord, now: float, start_us: int | None,
) -> tuple[str | None, tuple[object, ...]]:  # fmt: skip
    """The last completed refresh's state, and the table's row."""
    from pipelines.dynamic_tables.definition import effective_mode
    from pipelines.dynamic_tables.graph_history import scheduling_state

    history = catalog.list_refreshes(dt.table_id)
    last = next((r for r in history if r.state != "EXECUTING"), None)
    target_s = None if dt.target_lag_us is None else dt.target_lag_us / 1e6
    lag = None if dt.state == "SUSPENDED" else lag_measure(history, target_s, now, start_us)
    stamp = None
    if dt.data_timestamp_us is not None:
        stamp = datetime.fromtimestamp(dt.data_timestamp_us / 1e6, UTC).replace(tzinfo=None)
    mode = effective_mode(dt)
    return last.state if last else None, (
        name, schema, database, qualified_name,
        None if dt.target_lag_us is None else dt.target_lag_us // 1_000_000,
        "DOWNSTREAM" if dt.target_lag_us is None else "USER_DEFINED", scheduling_state(dt),
        lag.mean if lag else None, lag.maximum if lag else None, lag.above if lag else None,
        lag.within if lag else None, stamp, last.state if last else None,
        (last.reason or None) if last else None, (last.error or None) if last else None,
        mode, dt.mode_reason if mode == "FULL" else None,
    )  # fmt: skip


def tables_frame(
    session: StatementContext, call: exp.Anonymous, defaults: tuple[str, str]
) -> DataFrame:
    import time

    rows = tables_rows(session, call, defaults, time.time())
    return rows_frame(session.spark, rows, COLUMNS)
