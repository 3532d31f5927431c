"""Streams on views: the view's net change between the stream's offsets (one version per
base table) and the versions the transaction reads, computed by the query-delta engine.

A stream on a view stores no rows, as a table's stream does not: the catalog keeps an
offset per base table. Reading it binds the view's text over stand-ins of its base
tables, reads Spark's optimized plan of it (:mod:`pipelines.incremental.stand_ins`) and
evaluates it with every base table at its offset as the old version, at the pinned
version as the new one, and its net change from the Delta change feed between
(:class:`pipelines.transactions.table_sources.TableSource`). The root's consolidated
change is the stream's rows; a deletion and an insertion of one derived row id are an
update (``METADATA$ISUPDATE``). The result is computed once, on the driver, when the
statement is bound, so every use of the stream in the statement reads the same rows.

Views the engine does not maintain are refused at CREATE by name with its reasons.
A view dropped or replaced (or a view inside it), or a base table dropped or replaced,
makes the stream stale, as in the reference system: recreate it.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from catalog import ObjectAlreadyExistsError, StreamRecord, TableInfo, ViewRecord, did_you_mean
from flush.spark_tables import arrow_frame
from flush.table_locks import table_lock
from flush.tables import logged_versions
from pipelines.change_sets import STREAM_ACTION as ACTION
from pipelines.change_sets import STREAM_ISUPDATE as ISUPDATE
from pipelines.change_sets import STREAM_ROW_ID as ROW_ID
from pipelines.change_sets import ChangeMode
from pipelines.errors import ObjectNotFoundError, SqlError, StreamStaleError
from pipelines.incremental.delta import ID, SIGN
from pipelines.incremental.stand_ins import EnginePlan, engine, plan_over_stand_ins
from pipelines.sql.plan_guard import analyzed_nodes
from pipelines.sql.time_literals import TIME_FUNCTIONS, special_cast
from pipelines.transactions.table_sources import TableSource
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = [
    "ViewPlan",
    "create_view_stream",
    "view_staleness",
    "view_stream_changed",
    "view_stream_frame",
    "view_stream_row",
]  # fmt: skip

DAY = 86_400.0


@dataclass
class ViewPlan:
    """A view's query as the engine reads it: its plan, result names, the base tables
    (by id, in the order first read) and the uids of the views expanded."""

    plan: EnginePlan
    names: list[str]
    tables: dict[int, TableInfo]
    view_uids: tuple[str, ...]
    #: Its typed literals of the current time (``TIMESTAMP'now'``).
    time_literals: tuple[str, ...] = ()

    def reasons(self, session: StatementContext) -> list[str]:
        """Why the engine cannot give this view's change (empty: it can)."""
        assert self.plan.frame is not None
        return sorted({*self.plan.reasons(), *_volatile(session, self.plan.frame),
                       *(f"TIME_DEPENDENT:{literal}" for literal in self.time_literals)})


def _quoted_name(view: ViewRecord) -> str:
    return ".".join("`" + p.replace("`", "``") + "`"
                    for p in (view.database, view.schema_name, view.name))  # fmt: skip


def view_plan(session: StatementContext, view: ViewRecord) -> ViewPlan:
    """The view's query bound over stand-ins of its base tables (views inside expanded)."""
    from pipelines.sql.binding import Binder, result_names

    binders: list[tuple[Binder, str]] = []

    def bind(frames: Any) -> str:
        txn = Transaction(session.catalog, session.spark, read_only=True)
        binder = Binder(session, txn, analysis=True, sources=frames)
        bound = binder.bind(f"SELECT * FROM {_quoted_name(view)}")
        if binder.metadata_reads:
            raise SqlError(f"a stream cannot follow view {view.full_name}: it reads "
                           f"{binder.metadata_reads[0]}, which describes the warehouse and "
                           "changes with no table version to follow", "SQL_COMPILATION_ERROR")
        binders.append((binder, bound))
        return bound

    plan = plan_over_stand_ins(session.spark, session.run_spark, bind)
    binder, bound = binders[-1]
    assert plan.frame is not None
    names = list(result_names(binder, plan.frame, bound).columns)
    tables = {t.id: t for t in binder.tables}
    return ViewPlan(plan, names, tables, tuple(v.uid for v in binder.expanded),
                    tuple(binder.time_literals))  # fmt: skip


def _volatile(session: StatementContext, frame: DataFrame) -> set[str]:
    """Functions whose value differs between evaluations (rand, current_timestamp):
    the two versions the engine compares would differ where no table changed."""
    jvm: Any = session.spark._jvm  # type: ignore[attr-defined]
    trait = jvm.java.lang.Class.forName(
        "org.apache.spark.sql.catalyst.expressions.Nondeterministic"
    )
    found = set()
    for name, node, is_plan in analyzed_nodes(session.spark, frame, session.views):
        if is_plan:
            continue
        cast = special_cast(node) if name == "Cast" else None  # CAST('now' AS TIMESTAMP)
        if cast is not None:
            found.add(f"TIME_DEPENDENT:{cast}")
        elif name in TIME_FUNCTIONS:  # a stream could not reproduce their rows
            found.add(f"TIME_DEPENDENT:{name}")
        elif trait.isInstance(node):
            found.add(f"NON_DETERMINISTIC:{name}")
    return found


def create_view_stream(
    session: StatementContext, name: tuple[str, str, str], view_name: str, parts: dict[str, Any]
) -> None:
    """Record a stream on a view (see the module docstring); the offsets start at each
    base table's current version, or at a point (TIMESTAMP, or another stream's).

    Raises:
        ObjectNotFoundError: no view of that name.
        SqlError: VIEW_STREAM_UNSUPPORTED (the engine's reasons, and what to change),
            SQL_COMPILATION_ERROR (a mode or point a view cannot take).
    """
    view = _require_view(session, view_name)
    mode = (parts["append_only"] or "FALSE").upper()
    if mode == "FINAL":
        raise SqlError("APPEND_ONLY = FINAL is for streams on tables; a stream on a view takes "
                       "APPEND_ONLY = TRUE (inserts only) or FALSE", "SQL_COMPILATION_ERROR")
    planned = view_plan(session, view)
    reasons = planned.reasons(session)
    if reasons:
        raise SqlError(
            f"cannot create a stream on view {view.full_name}: the incremental engine cannot "
            f"compute its changes ({', '.join(reasons)}). Remove what it names from the view "
            "(LIMIT, ORDER BY, a window without PARTITION BY, rand(), ...), or create the "
            "stream on its tables and apply the view's query to the stream's rows",
            "VIEW_STREAM_UNSUPPORTED",
        )
    dynamic = [t for t in planned.tables.values()
               if session.catalog.get_dynamic_table(t.id) is not None]  # fmt: skip
    with contextlib.ExitStack() as locks:  # as for a table's stream: not while a refresh commits
        for info in dynamic:
            locks.enter_context(table_lock(info.uri))
        offsets = _start_offsets(session, planned, parts, view)
        kept = ChangeMode.APPEND_ONLY if mode == "TRUE" else ChangeMode.DEFAULT
        try:
            session.catalog.create_stream(
                *name, 0, kept.value, 0, comment=_literal(parts["comment"]),
                replace=bool(parts["replace"]), view=(view.id, planned.view_uids, offsets),
            )  # fmt: skip
        except ObjectAlreadyExistsError as exc:
            raise SqlError(str(exc), "OBJECT_ALREADY_EXISTS") from None
    for info in planned.tables.values():
        if not info.properties["change_tracking"]:
            session.catalog.set_table_properties(info.id, {"change_tracking": True})


def _literal(text: str | None) -> str:
    from pipelines.sql.ddl_common import literal

    return literal(text)


def _require_view(session: StatementContext, name: str) -> ViewRecord:
    database, schema, view_name = session.qualify(name)
    view = session.catalog.get_view(database, schema, view_name)
    if view is not None:
        return view
    if session.find_table(database, schema, view_name) is not None:
        raise SqlError(f"{database}.{schema}.{view_name} is a table, not a view: write CREATE "
                       "STREAM ... ON TABLE", "SQL_COMPILATION_ERROR")  # fmt: skip
    raise ObjectNotFoundError(
        f"view {database}.{schema}.{view_name} does not exist"
        f"{did_you_mean(session.catalog, database, schema, view_name, ['view'])}; check the "
        "name (unquoted names are upper-cased; USE DATABASE/SCHEMA sets the defaults) or "
        "create it with CREATE VIEW"
    )


def _start_offsets(
    session: StatementContext, planned: ViewPlan, parts: dict[str, Any], view: ViewRecord
) -> dict[int, int]:
    """Each base table's offset: its current version, its version at a TIMESTAMP, or
    another stream's offset on the same view."""
    kind = (parts["point_kind"] or "").upper() if parts["at_kind"] else ""
    if kind == "STREAM":
        literal = str(parts["point"]).strip()
        other = session.require_stream(literal[1:-1].replace("''", "'")
                                       if literal[:1] == "'" else literal)  # fmt: skip
        if other.view_id != view.id:
            raise SqlError(f"stream {other.full_name} is not on view {view.full_name}: "
                           "AT (STREAM => ...) names a stream on the same view",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        return dict(other.base_offsets)
    if kind in ("VERSION", "OFFSET"):
        raise SqlError(f"a stream on a view starts at a TIMESTAMP or another stream's offsets, "
                       f"not a {kind} (a version belongs to one table; the view reads "
                       f"{len(planned.tables)}): write AT (TIMESTAMP => '...')",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if kind == "TIMESTAMP":
        at = parts["at_kind"].upper()
        return {t.id: session.point(t, at, kind, parts["point"]) for t in planned.tables.values()}
    return {t.id: DeltaTable(t.uri).version() for t in planned.tables.values()}


def view_staleness(
    session: StatementContext, stream: StreamRecord
) -> tuple[bool, float, str]:
    """Whether a stream on a view is stale, when it becomes so if not consumed, and why
    (empty: not stale). ``STALE_AFTER`` is the earliest of its base tables'."""
    view = session.catalog.get_view_by_id(stream.view_id or 0)
    if view is None or view.uid != (stream.view_uids or ("",))[0]:
        return True, stream.offset_moved_at, "its view was dropped or replaced"
    stale_after, why = float("inf"), ""
    for table_id, offset in stream.base_offsets:
        table = session.catalog.get_table_by_id(table_id)
        if table is None:
            return True, stream.offset_moved_at, "a base table was dropped or replaced"
        days = max(table.properties["data_retention_time_in_days"],
                   table.properties["max_data_extension_time_in_days"])  # fmt: skip
        stale_after = min(stale_after, stream.offset_moved_at + days * DAY)
        if not _history_kept(table.uri, offset):
            why = f"the history of {table.full_name} after version {offset} is gone"
    if not why and time.time() > stale_after:
        why = "it was not consumed within its base tables' retention"
    return bool(why), stale_after, why


def _history_kept(uri: str, offset: int) -> bool:
    versions = logged_versions(uri)
    return not versions or min(versions) <= offset + 1 or max(versions) <= offset


def check_fresh(session: StatementContext, stream: StreamRecord) -> None:
    stale, _, why = view_staleness(session, stream)
    if stale:
        raise StreamStaleError(f"stream {stream.full_name} is stale: {why}; recreate it with "
                               "CREATE OR REPLACE STREAM ... ON VIEW")  # fmt: skip


def view_stream_row(session: StatementContext, stream: StreamRecord) -> dict[str, Any]:
    """What SHOW STREAMS says of a stream on a view beyond a table stream's columns."""
    view = session.catalog.get_view_by_id(stream.view_id or 0)
    names = {}
    for table_id, offset in stream.base_offsets:
        table = session.catalog.get_table_by_id(table_id)
        names[table.full_name if table else f"#{table_id} (dropped)"] = offset
    stale, stale_after, _ = view_staleness(session, stream)
    if not stale and view is not None:
        stale = _reads_other_tables(session, view, stream)
    return {"table_name": view.full_name if view else None, "base_tables": ", ".join(names),
            "base_offsets": orjson.dumps(names).decode(), "stale": stale,
            "stale_after": stale_after}  # fmt: skip


def _reads_other_tables(session: StatementContext, view: ViewRecord, stream: StreamRecord) -> bool:
    """Whether the view now reads other tables or views than the stream follows (a base
    table renamed away and another created under its name): its read is then stale. A
    view that does not bind now (a base table renamed away, nothing under the name) is
    not stale: its read names the missing table, and a rename back restores it."""
    try:
        return _follows_others(view_plan(session, view), stream)
    except SqlError:
        return False


def _follows_others(planned: ViewPlan, stream: StreamRecord) -> bool:
    """Whether the view as planned now reads other views or tables than the stream
    follows (the one rule of the read and of SHOW/DESCRIBE)."""
    bases = {table_id for table_id, _ in stream.base_offsets}
    return planned.view_uids != stream.view_uids or set(planned.tables) != bases


def view_stream_changed(txn: Transaction, stream: StreamRecord) -> bool:
    """SYSTEM$STREAM_HAS_DATA of a stream on a view: a base table's commit since its
    offset added or removed rows (the view's net change may still be empty)."""
    from pipelines.sql.history import data_changed

    read = txn.view_stream_read(stream)
    return any(data_changed(b.table.uri, b.offset, b.to) for b in read.bases)


def view_stream_frame(
    session: StatementContext, txn: Transaction, stream: StreamRecord
) -> DataFrame:
    """The stream's rows for this transaction: the view's net change from the offsets to
    the pinned versions, with METADATA$ACTION, METADATA$ISUPDATE and METADATA$ROW_ID
    (the engine's derived id, BIGINT as a table stream's)."""
    read = txn.view_stream_read(stream)
    view = session.catalog.get_view_by_id(stream.view_id or 0)
    if view is None:
        raise StreamStaleError(f"stream {stream.full_name} is stale: its view was dropped or "
                               "replaced; recreate it with CREATE OR REPLACE STREAM ... ON VIEW")
    planned = view_plan(session, view)
    bases = {b.table.id: b for b in read.bases}
    if _follows_others(planned, stream):
        raise StreamStaleError(
            f"stream {stream.full_name} is stale: view {view.full_name} now reads other views "
            "or tables than when the stream was created (one was replaced); recreate it "
            "with CREATE OR REPLACE STREAM ... ON VIEW")  # fmt: skip
    append_only = stream.mode == ChangeMode.APPEND_ONLY.value
    if all(b.offset == b.to for b in bases.values()):
        changes = _empty(planned)
    else:
        sources = {i: TableSource(session.spark, b.table, b.offset, b.to, append_only)
                   for i, b in bases.items()}  # fmt: skip
        changes = _labelled(engine(planned.plan, sources).net().toArrow(), append_only)
    return arrow_frame(session.spark, changes.rename_columns([*planned.names, ACTION, ISUPDATE,
                                                              ROW_ID]))  # fmt: skip


def _empty(planned: ViewPlan) -> pa.Table:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert planned.plan.frame is not None
    schema = to_arrow_schema(planned.plan.frame.schema)
    extra = [pa.field(ACTION, pa.string()), pa.field(ISUPDATE, pa.bool_()),
             pa.field(ROW_ID, pa.int64())]  # fmt: skip
    return pa.schema([*schema, *extra]).empty_table()


def _labelled(net: pa.Table, append_only: bool) -> pa.Table:
    """The engine's net change (``c0``..., ``ID``, ``SIGN``) as stream rows: deletes
    first, then inserts; an id both deleted and inserted is an update pair."""
    values = [c for c in net.column_names if c not in (ID, SIGN)]
    if append_only:  # inserts only: what the view gained from the rows inserted
        net = net.filter(pc.greater(net.column(SIGN), 0))
    ids = net.column(ID)
    counts = net.group_by(ID).aggregate([(SIGN, "count")])
    twice = counts.filter(pc.greater(counts.column(f"{SIGN}_count"), 1)).column(ID)
    is_update = pc.is_in(ids, value_set=twice.combine_chunks())
    parts = []
    for action, keep in (("DELETE", pc.less(net.column(SIGN), 0)),
                         ("INSERT", pc.greater(net.column(SIGN), 0))):  # fmt: skip
        rows = net.filter(keep)
        parts.append(pa.table(
            [*(rows.column(c) for c in values), pa.array([action] * rows.num_rows, pa.string()),
             is_update.filter(keep), rows.column(ID).cast(pa.int64())],
            names=[*values, ACTION, ISUPDATE, ROW_ID]))  # fmt: skip
    return pa.concat_tables(parts)
