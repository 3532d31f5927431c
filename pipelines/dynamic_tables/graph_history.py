"""``TABLE(DYNAMIC_TABLE_GRAPH_HISTORY())``: the graph of dynamic tables, one row per
dynamic table with what it reads, as Snowflake's function of that name describes them.

Only the current description of each table is kept, so the call takes no argument but
``NAME_PREFIX`` (as ``DYNAMIC_TABLE_REFRESH_HISTORY``'s; ``db.INFORMATION_SCHEMA.`` before
the call gives its database's):
``AS_OF``, ``HISTORY_START`` and ``HISTORY_END`` (Snowflake's look into past
descriptions) are refused by name, and ``VALID_FROM`` is the table's creation (an ALTER
since then does not start a new description here), ``VALID_TO`` NULL. ``INPUTS`` holds
every object the table's refreshes read (a view, and the tables the view reads), each by
its current full name and kind (``TABLE``, ``VIEW``, ``DYNAMIC_TABLE``); a source
dropped since keeps the name and kind it was defined with.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlglot import exp

from catalog import DynamicTableRecord, full_name
from flush.spark_tables import rows_frame
from pipelines.dynamic_tables import arguments

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["COLUMNS", "FUNCTION", "graph_frame", "graph_rows", "scheduling_state"]

FUNCTION = "DYNAMIC_TABLE_GRAPH_HISTORY"
COLUMNS = (
    "NAME STRING, SCHEMA_NAME STRING, DATABASE_NAME STRING, QUALIFIED_NAME STRING, "
    "INPUTS ARRAY<STRUCT<name: STRING, kind: STRING>>, TARGET_LAG_TYPE STRING, "
    "TARGET_LAG_SEC BIGINT, QUERY_TEXT STRING, VALID_FROM TIMESTAMP, VALID_TO TIMESTAMP, "
    "SCHEDULING_STATE STRUCT<state: STRING, reason_code: STRING, reason_message: STRING>, "
    "REFRESH_MODE STRING, REFRESH_MODE_REASON STRING"
)
_REFUSED = dict.fromkeys(
    ("AS_OF", "HISTORY_START", "HISTORY_END"),
    f"only the current description of each dynamic table is kept; call {FUNCTION}() "
    "without arguments (TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...)) holds what each refresh "
    "read)",
)


def _prefix(call: exp.Anonymous) -> str:
    """The call's NAME_PREFIX (``db.INFORMATION_SCHEMA.`` before the call gives one: its
    database's tables only), or ""; any other argument refused."""
    found = arguments.named_arguments(call, FUNCTION, ("NAME_PREFIX",), _REFUSED)
    if "NAME_PREFIX" not in found:
        return ""
    return arguments.text(found["NAME_PREFIX"], FUNCTION, "NAME_PREFIX").strip()


def graph_rows(session: StatementContext, prefix: str = "") -> list[tuple[object, ...]]:
    """One row per dynamic table whose qualified name starts with ``prefix``, ordered by
    qualified name."""
    from pipelines.dynamic_tables.definition import effective_mode

    catalog = session.catalog
    dynamic = {dt.table_id: dt for dt in catalog.list_dynamic_tables()}
    tables = {t.id: t for t in catalog.list_tables()}
    views = {v.id: v for v in catalog.list_views()}
    rows = []
    for table_id, dt in dynamic.items():
        info = tables.get(table_id)
        if info is None or dt.state == "INITIALIZING" or not info.full_name.startswith(prefix):
            continue  # (INITIALIZING: a CREATE still running)
        inputs = []
        for source in dt.sources:
            if source.kind == "view":
                view = views.get(source.source_id)
                name = full_name(view.database, view.schema_name, view.name) if view else None
                kind = "VIEW"
            else:
                table = tables.get(source.source_id)
                name = table.full_name if table else None
                dynamic_now = source.source_id in dynamic
                kind = "DYNAMIC_TABLE" if source.kind == "dynamic_table" or dynamic_now else "TABLE"
            inputs.append((name or source.name, kind))
        mode = effective_mode(dt)
        rows.append((
            info.name, info.schema_name, info.database, info.full_name, inputs,
            "DOWNSTREAM" if dt.target_lag_us is None else "USER_DEFINED",
            None if dt.target_lag_us is None else dt.target_lag_us // 1_000_000, dt.query,
            datetime.fromtimestamp(info.created_at, UTC).replace(tzinfo=None), None,
            scheduling_state(dt), mode, dt.mode_reason if mode == "FULL" else None,
        ))  # fmt: skip
    return sorted(rows, key=lambda row: str(row[3]))


def scheduling_state(dt: DynamicTableRecord) -> tuple[str, str | None, str | None]:
    if dt.state == "SUSPENDED":
        return ("SUSPENDED", "USER_SUSPENDED",
                dt.state_reason or "suspended by ALTER DYNAMIC TABLE ... SUSPEND")  # fmt: skip
    return ("ACTIVE", None, None)


def graph_frame(session: StatementContext, call: exp.Anonymous) -> DataFrame:
    return rows_frame(session.spark, graph_rows(session, _prefix(call)), COLUMNS)
