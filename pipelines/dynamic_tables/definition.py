"""CREATE [OR REPLACE] DYNAMIC TABLE, ALTER DYNAMIC TABLE, DROP DYNAMIC TABLE, SHOW
DYNAMIC TABLES and DESCRIBE DYNAMIC TABLE.

A definition is checked in full before anything is made: the query is bound and
analysed by Spark over the objects it names now (tables, views, dynamic tables; no
stream, no time travel, at least one table), its columns give the table's, its
analyzed plan gives its refresh class (:mod:`pipelines.dynamic_tables.classify`), and
the graph of dynamic tables stays acyclic with no lag shorter than an upstream's
(:func:`pipelines.dynamic_tables.schedule.check_graph`). The initial refresh then runs
at once (INITIALIZE = ON_CREATE, the default): if it fails, the CREATE fails with its
error and leaves nothing behind. OR REPLACE builds the new table beside the old one,
which stays readable (and refreshing) until the new one is ready, then swaps them in
one catalog transaction.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson

from catalog import DynamicSource, DynamicTableRecord, TableInfo, did_you_mean, full_name
from flush.catalog_tables import purge_dropped
from flush.spark_tables import rows_frame
from flush.table_locks import table_lock
from flush.tables import create_table, drop_table, new_table_folder
from ingest_sdk.errors import TableAlreadyExistsError, TableNotFoundError
from ingest_sdk.schema import check_object_name
from pipelines.dynamic_tables.adaptive import is_adaptive
from pipelines.dynamic_tables.classify import PlanClass
from pipelines.dynamic_tables.classify import classify as classify_plan
from pipelines.dynamic_tables.derived import plan_over_stand_ins
from pipelines.dynamic_tables.refresh import BUILDING, INITIAL, MANUAL, RefreshFailed, refresh
from pipelines.dynamic_tables.rewrite import RewriteError, is_hidden, rewrite
from pipelines.dynamic_tables.schedule import Node, TargetLag, check_graph, parse_target_lag
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.binding import Binder
from pipelines.sql.ddl_common import (
    DESCRIBE_COLUMNS,
    check_name_free,
    drop_table_info,
    in_scope,
    like,
    literal,
    status_frame,
    utc,
)
from pipelines.sql.ddl_queries import _ctas_schema, query_frame
from pipelines.sql.statements import OPTION
from pipelines.transactions.commit import when_free
from pipelines.transactions.commit_owner import IN_FLIGHT, new_owner
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext
    from pipelines.sql.statements import Statement

__all__ = ["HANDLERS", "refresh_with_upstreams"]

_MODES = ("AUTO", "INCREMENTAL", "FULL", "INCREMENTAL_STRICT", "ADAPTIVE")
#: The modes under which a query that is not stateless goes to the query-delta engine
#: (AUTO resolves to ADAPTIVE when the engine covers it, to FULL when it does not).
_ENGINE_MODES = ("AUTO", "ADAPTIVE", "INCREMENTAL", "INCREMENTAL_STRICT")
#: The modes that refuse at CREATE a query that cannot be refreshed incrementally.
_INCREMENTAL_MODES = ("ADAPTIVE", "INCREMENTAL", "INCREMENTAL_STRICT")
#: In the names of the tables CREATE OR REPLACE builds beside the ones they replace.
_INITIALIZE = ("ON_CREATE", "ON_SCHEDULE")


def _options(text: str) -> dict[str, str]:
    """The header's ``KEY = value`` options, keys upper-cased; unknown or repeated keys
    refused. WAREHOUSE is accepted and ignored (one Spark worker serves all)."""
    found: dict[str, str] = {}
    for key, value in OPTION.findall(text):
        key = key.upper()
        if key not in ("TARGET_LAG", "REFRESH_MODE", "INITIALIZE", "WAREHOUSE", "COMMENT"):
            raise SqlError(f"unknown dynamic table option {key}; the options are TARGET_LAG, "
                           "REFRESH_MODE, INITIALIZE, WAREHOUSE and COMMENT",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        if key in found:
            raise SqlError(f"{key} is given twice", "SQL_COMPILATION_ERROR")
        found[key] = value
    return found


def _lag(text: str | None) -> TargetLag:
    if text is None:
        raise SqlError("CREATE DYNAMIC TABLE needs TARGET_LAG = '<duration>' (such as "
                       "'5 minutes') or TARGET_LAG = DOWNSTREAM",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    try:
        return parse_target_lag(literal(text) if text.startswith("'") else text)
    except ValueError as exc:
        raise SqlError(str(exc), "SQL_COMPILATION_ERROR") from None


def _choice(options: dict[str, str], key: str, allowed: tuple[str, ...]) -> str:
    value = options.get(key, allowed[0]).upper()
    if value not in allowed:
        raise SqlError(f"{key} must be one of {', '.join(allowed)}, got {value[:40]}",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    return value


def dynamic_or_error(session: StatementContext, name: str) -> tuple[TableInfo, DynamicTableRecord]:
    """The dynamic table a dotted name names, or an error saying what is there instead."""
    database, schema_name, table = session.qualify(name)
    info = session.find_table(database, schema_name, table)
    dt = session.catalog.get_dynamic_table(info.id) if info is not None else None
    if info is None or dt is None:
        what = "is a table, not a dynamic table" if info is not None else "does not exist"
        if info is None:
            what += did_you_mean(session.catalog, database, schema_name, table,
                                 ["dynamic table"])  # fmt: skip
        raise ObjectNotFoundError(
            f"dynamic table {full_name(database, schema_name, table)} {what}; SHOW DYNAMIC "
            "TABLES lists them"
        )
    return info, dt


def graph_nodes(session: StatementContext, replace: dict[str, Node] | None = None) -> list[Node]:
    """Every dynamic table as a scheduling node (``replace``: nodes by name to use
    instead of, or besides, the recorded ones)."""
    catalog = session.catalog
    names = {t.id: t.full_name for t in catalog.list_tables()}
    dynamic = catalog.list_dynamic_tables()
    ids = {dt.table_id for dt in dynamic}
    nodes = {
        names[dt.table_id]: Node(
            names[dt.table_id], dt.target_lag_us,
            tuple(names[s.source_id] for s in dt.sources if s.kind != "view"
                  and s.source_id in ids and s.source_id in names),
            dt.state == "ACTIVE",
        )
        for dt in dynamic if dt.table_id in names
    }  # fmt: skip
    nodes.update(replace or {})
    return list(nodes.values())


def _check_graph(nodes: list[Node]) -> None:
    try:
        check_graph(nodes)
    except ValueError as exc:
        raise SqlError(str(exc), "DYNAMIC_TABLE_GRAPH") from None


def create_dynamic_table(session: StatementContext, statement: Statement) -> DataFrame:
    parts = statement.parts
    database, schema_name, name = session.qualify(parts["name"] or "")
    for part, what in ((database, "database"), (schema_name, "schema"), (name, "table")):
        check_object_name(part, f"the {what} name")
    if BUILDING in name.upper():
        raise SqlError(f"a dynamic table's name may not hold {BUILDING!r}, which names the "
                       "tables CREATE OR REPLACE builds; choose another name",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if parts["replace"] and parts["if_not_exists"]:
        raise SqlError("OR REPLACE and IF NOT EXISTS cannot be used together",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    options = _options(parts["options"] or "")
    lag = _lag(options.get("TARGET_LAG"))
    mode = _choice(options, "REFRESH_MODE", _MODES)
    initialize = _choice(options, "INITIALIZE", _INITIALIZE)
    shown = full_name(database, schema_name, name)
    existing = session.find_table(database, schema_name, name)
    if existing is not None:
        if session.catalog.get_dynamic_table(existing.id) is None:
            raise SqlError(f"{shown} is a table; a dynamic table needs a name no table has "
                           "(DROP TABLE it first, or choose another name)",
                           "OBJECT_ALREADY_EXISTS")  # fmt: skip
        if parts["if_not_exists"]:
            return status_frame(session, f"{name} already exists, statement succeeded.")
        if not parts["replace"]:
            raise SqlError(f"dynamic table {shown} already exists; write CREATE OR REPLACE "
                           "DYNAMIC TABLE to replace it, or IF NOT EXISTS to keep it",
                           "TABLE_EXISTS")  # fmt: skip
    check_name_free(session, (database, schema_name, name), "table")
    query = (parts["query"] or "").rstrip().removesuffix(";").rstrip()
    defaults = (session.database, session.schema)
    txn = Transaction(session.catalog, session.spark, read_only=True)
    try:
        binder, frame = query_frame(session, txn, query, "CREATE DYNAMIC TABLE ... AS",
                                    analysis=True)  # fmt: skip
        _check_reads(session, binder, shown, existing)
        schema = _ctas_schema(frame, None)
        verdict = classify_plan(session.spark, frame, session.views, binder.time_literals)
        if verdict.incremental:
            verdict = _rewritable(session, txn, query)
        if not verdict.incremental and verdict.engine_may_cover and mode in _ENGINE_MODES:
            verdict = _derivable(session, query)
    finally:
        session.release_views()
    if mode in _INCREMENTAL_MODES and not verdict.incremental:
        raise SqlError(
            f"REFRESH_MODE = {mode} needs a query that can be refreshed incrementally; this "
            f"one cannot ({verdict.reason_text}): use REFRESH_MODE = AUTO or FULL, or change "
            "the query", "DYNAMIC_TABLE_NOT_INCREMENTAL",
        )  # fmt: skip
    tables = {t.id: t for t in binder.tables}
    upstream = tuple(t.full_name for t in tables.values()
                     if session.catalog.get_dynamic_table(t.id) is not None)  # fmt: skip
    _check_graph(graph_nodes(session, {shown: Node(shown, lag.lag_us, upstream)}))
    sources = [DynamicSource(t.id, "table" if t.full_name not in upstream else "dynamic_table",
                             t.full_name,
                             orjson.dumps(t.schema.declarations()).decode())
               for t in tables.values()]  # fmt: skip
    views = {v.id: v for v in binder.expanded}
    sources += [DynamicSource(v.id, "view", v.full_name, v.uid) for v in views.values()]
    definition: dict[str, Any] = {
        "query": query, "default_database": defaults[0], "default_schema": defaults[1],
        "target_lag_us": lag.lag_us, "refresh_mode": mode, "mode_reason": verdict.reason_text,
        "row_ids": _row_ids(verdict, mode),
        "initialize": initialize,
        "comment": literal(options.get("COMMENT")),
    }  # fmt: skip
    building = name if existing is None else f"{name}{BUILDING}{uuid.uuid4().hex[:12]}"
    state = verdict.state if definition["row_ids"] == "DERIVED" else ()
    info = _build(session, (database, schema_name, building), (schema, state), definition,
                  sources, initialize)  # fmt: skip
    if existing is not None:
        _swap(session, existing, info, shown)
    return status_frame(session, f"Dynamic table {name} successfully created.")


def _rewritable(session: StatementContext, txn: Transaction, query: str) -> PlanClass:
    """A stateless query whose incremental rewrite (insertions into the text as written)
    can be made; else the construct it cannot carry is the reason it refreshes FULL."""
    binder = Binder(session, txn, analysis=True, sources=txn.table_frame)
    bound = binder.bind(query)
    try:
        rewrite(bound, set(binder.source_views))
        for info in binder.tables:
            hidden = [name for name in info.schema.names if is_hidden(name)]
            if hidden:
                raise RewriteError(f"{info.full_name} has a column {hidden[0]!r}, a name the "
                                   "rewrite gives a hidden column")  # fmt: skip
    except RewriteError as exc:
        return PlanClass((f"REWRITE_UNSUPPORTED:{str(exc)[:120]}",))
    return PlanClass(())


def _derivable(session: StatementContext, query: str) -> PlanClass:
    """A query the query-delta engine maintains (:mod:`.derived`), or the reasons it
    cannot, from its optimized plan."""
    defaults = (session.database, session.schema)

    def bind(frames: Any) -> str:
        txn = Transaction(session.catalog, session.spark, read_only=True)
        # analysis: an upstream dynamic table not initialized yet (ON_SCHEDULE) is read
        # as its stand-in like any other source.
        return Binder(session, txn, defaults, analysis=True, sources=frames).bind(query)

    plan = plan_over_stand_ins(session, bind)
    reasons = plan.reasons()
    state = plan.state() if not reasons else None
    return PlanClass(tuple(reasons), engine=not reasons,
                     state=tuple(state.fields) if state is not None else ())  # fmt: skip


def _row_ids(verdict: PlanClass, mode: str) -> str:
    """How the table's rows get their ids: PACKED (the stateless rewrite passes its
    sources' ids through), DERIVED (the engine derives them from ids and keys), or
    SEQUENCE (reserved for the inserted rows of a FULL refresh's difference)."""
    if not verdict.incremental or mode == "FULL":
        return "SEQUENCE"
    return "DERIVED" if verdict.engine else "PACKED"


def _swap(session: StatementContext, existing: TableInfo, built: TableInfo, shown: str) -> None:
    """Put the table built beside ``existing`` in its place; if that cannot be (another
    client dropped or replaced it meanwhile), drop the built one and say so."""
    catalog = session.catalog
    try:
        with table_lock(existing.uri):  # not while a refresh of the old one commits
            when_free(catalog, lambda: catalog.swap_dynamic_table(existing.id, built.id),
                      [existing.id])  # fmt: skip
    except (TableNotFoundError, TableAlreadyExistsError, FileNotFoundError):
        drop_table_info(session, built)
        raise SqlError(f"dynamic table {shown} was dropped or replaced by another client while "
                       "this CREATE OR REPLACE ran; nothing was created: run it again",
                       "TRANSACTION_CONFLICT") from None  # fmt: skip
    purge_dropped(catalog, session.warehouse)  # the old one's folder, unless kept


def _check_reads(
    session: StatementContext, binder: Any, shown: str, existing: TableInfo | None
) -> None:
    """A definition reads at least one table, no stream, nothing at a fixed point, and
    not the table it defines."""
    if binder.streams:
        stream = session.catalog.get_stream_by_id(binder.streams[0])
        shown = stream.full_name if stream else "?"
        raise SqlError(f"a dynamic table cannot read a stream ({shown}): it reads tables, views "
                       "and dynamic tables, and follows their changes itself",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if binder.fixed_reads:
        raise SqlError(
            "a dynamic table's query cannot use time travel or CHANGES: it always "
            "reads its sources as of its data timestamp",
            "SQL_COMPILATION_ERROR",
        )
    if binder.metadata_reads:
        raise SqlError(f"a dynamic table's query cannot read {binder.metadata_reads[0]}: it "
                       "describes the warehouse, and its rows change with no table version a "
                       "refresh could follow; read it in a query, or keep a table of it",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if not binder.tables:
        raise SqlError("a dynamic table's query must read at least one table (its refreshes "
                       "follow the tables' changes)", "SQL_COMPILATION_ERROR")  # fmt: skip
    if existing is not None and any(t.id == existing.id for t in binder.tables):
        raise SqlError(f"dynamic table {shown} would read itself; a dynamic table cannot be "
                       "its own source", "DYNAMIC_TABLE_GRAPH")  # fmt: skip


def _build(
    session: StatementContext, names: tuple[str, str, str], columns: tuple[Any, Any],
    definition: dict[str, Any], sources: list[DynamicSource], initialize: str,
) -> TableInfo:  # fmt: skip
    """Make the table (INITIALIZING, owned by this process while it is built) and run
    its initial refresh; on any failure drop it again and raise. ``columns``: its
    schema, and the hidden state columns it keeps."""
    owner = new_owner()
    IN_FLIGHT.add(owner)
    folder = new_table_folder(session.warehouse, *names)
    schema, state = columns
    try:
        create_table(str(folder), schema, state)
        info, _ = session.catalog.create_dynamic_table(
            names, str(folder), schema, {**definition, "owner": owner}, sources
        )
    except BaseException:
        drop_table(folder, session.warehouse)
        IN_FLIGHT.discard(owner)
        raise
    try:
        if initialize == "ON_SCHEDULE":
            if BUILDING not in names[2]:  # a replacement goes live at its swap
                session.catalog.set_dynamic_table(info.id, state="ACTIVE", owner="")
            return info
        record = refresh_with_upstreams(session, info.id, INITIAL)
        if record.state != "SUCCEEDED":
            raise RefreshFailed(
                f"the initial refresh of {full_name(*names[:2], names[2].split('$')[0])} "
                f"failed ({record.reason}): {record.error}; nothing was created",
                record.reason,
            )
        return info
    except BaseException:
        if not session.catalog.commits_holding([info.id], decided_only=True):
            drop_table_info(session, info)
        raise
    finally:
        IN_FLIGHT.discard(owner)


def refresh_with_upstreams(
    session: StatementContext, table_id: int, trigger: str, moment: int | None = None
) -> Any:
    """Refresh the dynamic table for one data timestamp (now by default), after every
    active dynamic table upstream of it for the same one (MANUAL), so that it reads them
    at one snapshot; returns its history row."""
    from flush.commit_clock import clock

    moment = moment if moment is not None else clock()
    catalog = session.catalog
    order: list[int] = []

    def visit(table: int, path: tuple[int, ...]) -> None:
        dt = catalog.get_dynamic_table(table)
        if dt is None or table in order or table in path:
            return
        for source in dt.sources:
            if source.kind != "view":
                visit(source.source_id, (*path, table))
        order.append(table)

    visit(table_id, ())
    # One moment for all, later than any data timestamp they have (none goes back).
    stamps = [
        dt.data_timestamp_us
        for key in order
        if (dt := catalog.get_dynamic_table(key)) and dt.data_timestamp_us is not None
    ]
    moment = max([moment, *(stamp + 1 for stamp in stamps)])
    for upstream in order[:-1]:
        refresh(session, upstream, MANUAL, moment)
    return refresh(session, table_id, trigger, moment)


def alter_dynamic_table(session: StatementContext, statement: Statement) -> DataFrame:
    name = statement.parts["name"] or ""
    if statement.parts.get("if_exists") and session.find_table(*session.qualify(name)) is None:
        # As in Snowflake: IF EXISTS makes a missing table a success that changes nothing.
        return status_frame(session, "Statement executed successfully.")
    info, dt = dynamic_or_error(session, name)
    action = (statement.parts["action"] or "").split()[0].upper()
    catalog = session.catalog
    if action == "REFRESH":
        if dt.state == "INITIALIZING":
            raise SqlError(f"{info.full_name} is still being created", "DYNAMIC_TABLE_BUSY")
        record = refresh_with_upstreams(session, info.id, MANUAL)
        if record.state == "EXECUTING":  # its commit is decided; recovery completes it
            return status_frame(session, f"Dynamic table {info.name}: the refresh is decided and "
                                "its completion pending; the next session or the service's "
                                "recovery completes it.")  # fmt: skip
        if record.state == "FAILED":
            raise RefreshFailed(
                f"the refresh of {info.full_name} failed ({record.reason}): "
                f"{record.error}; the table is unchanged",
                record.reason,
            )
        counts = (
            f"{record.rows_inserted or 0} inserted, {record.rows_deleted or 0} deleted, "
            f"{record.rows_updated or 0} updated"
            if record.action in ("FULL", "INCREMENTAL")
            else record.reason or ""
        )
        return status_frame(session, f"Dynamic table {info.name} refreshed: {record.action}"
                            + (f" ({counts})" if counts else "") + ".")  # fmt: skip
    if action in ("SUSPEND", "RESUME"):
        state = "SUSPENDED" if action == "SUSPEND" else "ACTIVE"
        if dt.state == "INITIALIZING":
            raise SqlError(f"{info.full_name} is still being created", "DYNAMIC_TABLE_BUSY")
        catalog.set_dynamic_table(info.id, state=state)
        return status_frame(session, "Statement executed successfully.")
    lag = _lag(statement.parts["lag"])
    upstream = next(n for n in graph_nodes(session) if n.name == info.full_name).upstream
    node = Node(info.full_name, lag.lag_us, upstream, dt.state == "ACTIVE")
    _check_graph(graph_nodes(session, {info.full_name: node}))
    catalog.set_dynamic_table(info.id, target_lag_us=lag.lag_us)
    return status_frame(session, "Statement executed successfully.")


def drop_dynamic_table(session: StatementContext, statement: Statement) -> DataFrame:
    database, schema_name, name = session.qualify(statement.parts["name"] or "")
    info = session.find_table(database, schema_name, name)
    if info is None and statement.parts["if_exists"]:
        return status_frame(
            session, "Drop statement executed successfully (dynamic table did not exist)."
        )
    info, _ = dynamic_or_error(session, statement.parts["name"] or "")
    try:
        with table_lock(info.uri):  # not while a refresh commits: it finishes first
            drop_table_info(session, info)
    except FileNotFoundError:  # dropped by another client meanwhile
        raise ObjectNotFoundError(f"dynamic table {info.full_name} was dropped meanwhile") from None
    return status_frame(session, f"{info.name} successfully dropped.")


_SHOW_SCHEMA = (
    "created_on TIMESTAMP, name STRING, database_name STRING, schema_name STRING, "
    "target_lag STRING, refresh_mode STRING, refresh_mode_reason STRING, "
    "scheduling_state STRING, data_timestamp TIMESTAMP, last_refresh_action STRING, "
    "last_refresh_end TIMESTAMP, current_lag_seconds DOUBLE, text STRING, comment STRING"
)


def show_dynamic_tables(session: StatementContext, statement: Statement) -> DataFrame:
    from pipelines.dynamic_tables.schedule import format_target_lag

    pattern, scope = like(statement.parts.get("like")), in_scope(session, statement)
    tables = {t.id: t for t in session.catalog.list_tables()}
    rows = []
    now = time.time()
    for dt in session.catalog.list_dynamic_tables():
        info = tables.get(dt.table_id)
        if (info is None or not pattern(info.name) or BUILDING in info.name
                or not scope(info.database, info.schema_name)):  # fmt: skip
            continue
        last = next(iter(session.catalog.list_refreshes(dt.table_id, limit=1)), None)
        stamp = dt.data_timestamp_us / 1e6 if dt.data_timestamp_us is not None else None
        rows.append((
            utc(info.created_at), info.name, info.database, info.schema_name,
            format_target_lag(TargetLag(dt.target_lag_us)), effective_mode(dt),
            dt.mode_reason if effective_mode(dt) == "FULL" else "", dt.state,
            utc(stamp) if stamp is not None else None, last.action if last else None,
            utc(last.ended_at) if last and last.ended_at else None,
            round(now - stamp, 3) if stamp is not None else None, dt.query, dt.comment,
        ))  # fmt: skip
    return rows_frame(session.spark, rows, _SHOW_SCHEMA)


def effective_mode(dt: DynamicTableRecord) -> str:
    """ADAPTIVE, INCREMENTAL or FULL: what refreshes after the initial one do, AUTO shown
    as what it resolved to (an incremental table's refreshes go FULL only for a reason
    its history names)."""
    if is_adaptive(dt):
        return "ADAPTIVE"
    return "INCREMENTAL" if dt.row_ids in ("PACKED", "DERIVED") else "FULL"


def describe_dynamic_table(session: StatementContext, statement: Statement) -> DataFrame:
    info, _ = dynamic_or_error(session, statement.parts["name"] or "")
    rows = [(c.name, c.declaration, "COLUMN", "Y" if c.nullable else "N") for c in info.schema]
    return rows_frame(session.spark, rows, DESCRIBE_COLUMNS)


HANDLERS: dict[str, Callable[[StatementContext, Statement], DataFrame]] = {
    "create_dynamic_table": create_dynamic_table,
    "alter_dynamic_table": alter_dynamic_table,
    "drop_dynamic_table": drop_dynamic_table,
    "show_dynamic_tables": show_dynamic_tables,
    "describe_dynamic_table": describe_dynamic_table,
}


def recover_dynamic_tables(session: StatementContext) -> None:
    """After a crash: a dynamic table whose creation died before its initial refresh was
    decided is dropped (it never existed for anyone), and refreshes whose process died
    are marked FAILED (INTERRUPTED) unless their commit completes them."""
    from pipelines.transactions.commit_owner import owner_alive

    catalog = session.catalog
    for dt in catalog.list_dynamic_tables():
        if dt.state != "INITIALIZING" or owner_alive(dt.owner) or dt.claimed_by is not None:
            continue
        info = catalog.get_table_by_id(dt.table_id)
        if info is not None and not catalog.commits_holding([info.id]):
            drop_table_info(session, info)
    for row in catalog.list_refreshes(executing=True):
        if not owner_alive(row.owner):
            holder = catalog.get_dynamic_table(row.dt_table_id)
            if holder is None or holder.claimed_by is None:
                catalog.update_refresh(row.id, state="FAILED", action="FAILED",
                                       reason="INTERRUPTED", ended_at=time.time(),
                                       error="the process running the refresh stopped")  # fmt: skip
