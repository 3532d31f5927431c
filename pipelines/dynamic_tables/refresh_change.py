"""What a refresh writes: the change that brings a dynamic table's content to its query's
result at the pinned source versions, computed INCREMENTALly or FULL.

- **INCREMENTAL** (stateless queries, PACKED row ids): the query rewritten to carry row
  ids and actions (:mod:`pipelines.dynamic_tables.rewrite`) runs over each source's net
  changes since the versions the last refresh read; its output, netted
  (:func:`pipelines.change_sets.net_change`), is the table's net change. One Spark job;
  only the changes reach the driver.
- **FULL**: the query over the snapshots, applied as the difference to the content
  (:mod:`pipelines.dynamic_tables.diff`): matched by id when ids are PACKED (the
  rewritten query gives each row its id), in Spark; by value otherwise (SEQUENCE ids,
  reserved for the inserted rows), in Arrow on the driver, which holds the result and
  the content for it. The initial refresh appends the whole result.
- **FULL without followers**: the difference is worth its cost only to whoever reads
  the table's changes by row id: its streams and the dynamic tables reading it. A table
  without them is overwritten with the result instead (one commit; PACKED ids are the
  query's own, SEQUENCE ids new), which costs what writing the result costs.

A table with incremental row ids refreshes FULL instead of INCREMENTAL only with a
reason in its history: CHANGES_NOT_RETAINED (a source's changes were cleaned up),
CATALOG_BEHIND (its log holds a refresh the catalog does not remember: a restored
catalog), CHANGE_TOO_LARGE (ADAPTIVE: :mod:`pipelines.dynamic_tables.adaptive`); with
INCREMENTAL_STRICT the first two fail the refresh instead. GROUP_IDS_RENEWED (a table the
engine maintains, grouping by keys, whose commits carry an older rule of group ids) goes
FULL once in every mode: the only refresh that leaves such a table right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from catalog import Catalog, DynamicTableRecord, TableInfo
from flush.change_commit import ChangeSet
from flush.spark_tables import read_delta
from flush.tables import ROW_ID_COLUMN, delta_schema, live_paths, state_columns
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.schema import quote_identifier
from pipelines.change_sets import REFRESH_ACTION, STREAM_ACTION, STREAM_ROW_ID, net_change
from pipelines.dynamic_tables import adaptive
from pipelines.dynamic_tables.derived import (
    EnginePlan,
    TableSource,
    cached_plan_over_stand_ins,
    engine,
)
from pipelines.dynamic_tables.diff import (
    UncomparableColumnError,
    arrow_value_diff,
    id_diff,
    value_diff,
)
from pipelines.dynamic_tables.rewrite import RewriteError, rewrite
from pipelines.errors import SqlError, StreamStaleError
from pipelines.incremental import algebraic
from pipelines.incremental.algebraic import Layout
from pipelines.incremental.coverage import renews_group_ids
from pipelines.incremental.delta import GROUP_ID_RULE, SIGN, Deltas
from pipelines.incremental.plan import cast_select
from pipelines.sql.binding import Binder
from pipelines.streams.changes import read_changes
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = [
    "Computed", "PinnedSource", "RefreshFailed", "app_transactions", "compute", "dt_app_id",
    "has_followers",
]  # fmt: skip

#: The app transaction every refresh of a DERIVED table carries: the rule its group ids
#: follow (:data:`pipelines.incremental.delta.GROUP_ID_RULE`; absent: 1).
GROUP_ID_APP = "ingest-group-id-rule"

#: The hidden columns a refresh's rows carry after the user's: the row id and the action.
_HIDDEN = (ROW_ID_COLUMN, REFRESH_ACTION)


class RefreshFailed(SqlError):
    """A refresh failed; its history row says why (``reason``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, "DYNAMIC_TABLE_REFRESH_FAILED")
        self.reason = reason


def dt_app_id(dt: DynamicTableRecord, position: int) -> str:
    """The app transaction a refresh carries for the dynamic table's ``position``-th
    source: the source version it read (unique to this definition: ``uid``)."""
    return f"ingest-dt:{dt.uid}:{position}"


def app_transactions(dt: DynamicTableRecord, pinned: Sequence[PinnedSource]) -> dict[str, int]:
    """The app transactions a refresh commits: each source's version it read, and for a
    table the engine maintains the rule of its group ids."""
    versions = {dt_app_id(dt, item.position): item.to for item in pinned}
    return {**versions, GROUP_ID_APP: GROUP_ID_RULE} if dt.row_ids == "DERIVED" else versions


@dataclass(frozen=True, slots=True)
class PinnedSource:
    """A table source at the version this refresh reads (``after``: the version the last
    refresh read, None before the first)."""

    position: int
    info: TableInfo
    after: int | None
    to: int


@dataclass(frozen=True, slots=True)
class Computed:
    """The change to commit, its counts (inserted, deleted, updated), the action
    (INCREMENTAL or FULL), why a table with incremental row ids went FULL (a reason
    code) and what chose the action (ADAPTIVE's measure: the history's message)."""

    change: ChangeSet
    counts: list[int]
    action: str
    reason: str = ""
    message: str = ""


def compute(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo,
    pinned: Sequence[PinnedSource], base: int, handle: DeltaTable, followed: bool | None = None,
) -> Computed:  # fmt: skip
    """The change of one refresh (the table at ``base``, loaded as ``handle``);
    ``followed``: whether the table has followers (None: ask the catalog)."""
    initial = dt.data_timestamp_us is None
    if dt.row_ids == "DERIVED":
        return _derived(session, dt, info, pinned, base, handle, followed)
    packed = dt.row_ids == "PACKED"
    why = ("", "")
    if packed and dt.refresh_mode != "FULL" and not initial:
        computed, why = _attempt(session, dt, pinned, handle,
                                 lambda: _incremental(session, dt, info, pinned))  # fmt: skip
        if computed is not None:
            return computed
    txn = _pinned_transaction(session, pinned)
    if packed:
        frame = _as_table(info, _rewritten(session, dt, pinned, lambda t: _with_actions(
            txn.table_frame(t, row_ids=True))), _HIDDEN)  # fmt: skip
    else:
        _, bound = _bind(session, dt, pinned, txn.table_frame)
        frame = _as_table(info, session.run_spark(bound), [])
    return _full(session, info, (frame, packed), (base, handle, initial), followed, why)


def _attempt(
    session: StatementContext, dt: DynamicTableRecord, pinned: Sequence[PinnedSource],
    handle: DeltaTable, incremental: Callable[[], Computed],
) -> tuple[Computed | None, tuple[str, str]]:  # fmt: skip
    """The INCREMENTAL change, or None and the reason (and message) the refresh goes
    FULL instead (CATALOG_BEHIND, SOURCE_MOVED_BACK, CHANGES_NOT_RETAINED; for ADAPTIVE
    also CHANGE_TOO_LARGE or INCREMENTAL_SLOWER, decided before anything runs); with
    INCREMENTAL_STRICT that reason fails the refresh."""
    reason, message = _catalog_behind(dt, pinned, handle), ""
    if not reason and adaptive.is_adaptive(dt):
        reason, message = adaptive.choose(
            pinned, lambda: session.catalog.list_refreshes(dt.table_id, limit=adaptive.HISTORY_ROWS)
        )
    if not reason:
        try:
            return replace(incremental(), message=message), ("", "")
        except StreamStaleError:
            reason, message = "CHANGES_NOT_RETAINED", ""
    if dt.refresh_mode == "INCREMENTAL_STRICT":
        raise RefreshFailed(
            f"the refresh cannot be incremental ({reason}) and REFRESH_MODE is "
            "INCREMENTAL_STRICT; CREATE OR REPLACE DYNAMIC TABLE starts it again", reason,
        )  # fmt: skip
    return None, (reason, message)


def _full(
    session: StatementContext, info: TableInfo, result: tuple[DataFrame, bool],
    table: tuple[int, DeltaTable, bool], followed: bool | None, why: tuple[str, str],
) -> Computed:  # fmt: skip
    """A FULL refresh of the query's ``result`` (its frame, and whether its rows carry
    their ids) on the ``table`` (its version, handle, and whether this is its initial
    refresh): appended (initial), an overwrite (no followers), else the difference;
    ``why``: its reason and message."""
    frame, by_id = result
    base, handle, initial = table
    if followed is None:
        followed = has_followers(session.catalog, info.id)
    if not initial and not followed:
        computed = _overwrite(session, info, frame, by_id, handle)
    elif by_id:
        computed = _full_by_id(session, info, frame, base, handle, initial)
    else:
        computed = _full_by_value(session, info, frame, base, handle, initial)
    return Computed(computed.change, computed.counts, "FULL", *why)


def _derived(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo,
    pinned: Sequence[PinnedSource], base: int, handle: DeltaTable, followed: bool | None,
) -> Computed:  # fmt: skip
    """A refresh of a table the query-delta engine maintains: its net change from the
    sources' changes (INCREMENTAL), or the query's rows with their derived ids (FULL:
    the initial refresh, REFRESH_MODE = FULL, or a reason)."""
    from pyspark.sql import functions as F

    initial = dt.data_timestamp_us is None
    plan = cached_plan_over_stand_ins(session, lambda frames: _bind(session, dt, pinned, frames))
    if plan.reasons():
        raise RefreshFailed(f"the query's plan now holds what the incremental engine cannot "
                            f"refresh ({', '.join(plan.reasons())}); CREATE OR REPLACE "
                            "DYNAMIC TABLE defines it again", "SOURCE_CHANGED")  # fmt: skip
    sources = {item.info.id: TableSource(session, item.info, item.after, item.to)
               for item in pinned}  # fmt: skip
    state = _state(plan, handle)
    names = state.names if state is not None else []
    deltas = engine(plan, sources, lambda: _kept(session, info, base, handle, names), state)
    why = ("", "")
    renewed = renews_group_ids(plan.root, handle.transaction_version(GROUP_ID_APP))
    if dt.refresh_mode != "FULL" and not initial and renewed:
        why = ("GROUP_IDS_RENEWED", "the table's group row ids follow an older rule, in "
               "which groups whose keys differ only in where their NULLs are shared an "
               "id; this FULL refresh gives them the current ids, once")  # fmt: skip
    elif dt.refresh_mode != "FULL" and not initial:
        computed, why = _attempt(session, dt, pinned, handle,
                                 lambda: _derived_incremental(info, deltas, names))  # fmt: skip
        if computed is not None:
            return computed
    frame = _as_table(info, deltas.rows("new").withColumn(REFRESH_ACTION, F.lit("INSERT")),
                      (ROW_ID_COLUMN, *names, REFRESH_ACTION))  # fmt: skip
    return _full(session, info, (frame, True), (base, handle, initial), followed, why)


def _state(plan: EnginePlan, handle: DeltaTable) -> Layout | None:
    """The aggregation state the table keeps (:mod:`pipelines.incremental.algebraic`),
    None if it keeps none; a plan that now needs other state fails the refresh."""
    stored = algebraic.stored(pa.schema(handle.schema()))
    if not stored:
        return None
    state = plan.state()
    if state is None or [(f.name, f.type) for f in state.fields] != [
            (f.name, f.type) for f in stored]:  # fmt: skip
        raise RefreshFailed("the query's plan now needs other aggregation state than the "
                            "table keeps (a source's column types changed); CREATE OR "
                            "REPLACE DYNAMIC TABLE defines it again", "SOURCE_CHANGED")  # fmt: skip
    return state


def _kept(
    session: StatementContext, info: TableInfo, base: int, handle: DeltaTable,
    state: Sequence[str],
) -> DataFrame:  # fmt: skip
    """The table's rows at ``base`` (the query's at the last refresh's versions), its
    columns in order, then their ids, then its ``state`` columns: the engine reads the
    old side of the groups a change touched from them."""
    from pyspark.sql import functions as F

    rows = read_delta(session.spark, info.uri, base, loaded=handle, state=True)
    return rows.select(*[F.col(_spark_name(n)) for n in info.schema.names], ROW_ID_COLUMN,
                       *state)  # fmt: skip


def _derived_incremental(info: TableInfo, deltas: Deltas, state: Sequence[str]) -> Computed:
    # Each row's action from its sign once collected (two Spark operations fewer, each
    # an analysis of the whole plan).
    signed = _as_table(info, deltas.net(), (ROW_ID_COLUMN, *state, SIGN)).toArrow()
    action = pc.if_else(pc.greater(signed.column(SIGN), 0), "INSERT", "DELETE")
    collected = signed.drop_columns([SIGN]).append_column(REFRESH_ACTION, action)
    change = net_change(collected, [*info.schema.names, *state])
    rows = _checked(info, change.rows, state)
    return Computed(
        ChangeSet(rows, change.deleted.cast(pa.int64()), change.new_ids.cast(pa.int64())),
        [len(change.new_ids), len(change.deleted), change.updated], "INCREMENTAL",
    )  # fmt: skip


def has_followers(catalog: Catalog, table_id: int) -> bool:
    """Whether anything in the catalog reads the table's changes by row id: a stream on
    it, a change stream watching it, or a dynamic table reading it. Readers of its Delta
    change feed from outside the catalog (the ``ingest-changes`` Spark source) are not
    known here."""
    if catalog.list_streams(table_id):
        return True
    if any(cs.for_all or table_id in cs.table_ids for cs in catalog.list_change_streams()):
        return True
    return any(source.kind != "view" and source.source_id == table_id
               for dt in catalog.list_dynamic_tables() for source in dt.sources)  # fmt: skip


def _catalog_behind(
    dt: DynamicTableRecord, pinned: Sequence[PinnedSource], handle: DeltaTable
) -> str:
    """CATALOG_BEHIND if the table's log holds a source version past the one the catalog
    recorded (a catalog restored from an older backup): the changes after the recorded
    one are already in the table, so only a FULL refresh is right."""
    for item in pinned:
        landed = handle.transaction_version(dt_app_id(dt, item.position))
        if item.after is None or (landed is not None and landed > item.after):
            return "CATALOG_BEHIND"
        if item.to < item.after:
            return "SOURCE_MOVED_BACK"
    return ""


def _pinned_transaction(session: StatementContext, pinned: Sequence[PinnedSource]) -> Transaction:
    txn = Transaction(session.catalog, session.spark, read_only=True)
    for item in pinned:
        txn.versions[item.info.id] = item.to
    return txn


def _with_actions(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.withColumn(REFRESH_ACTION, F.lit("INSERT"))


def _bind(
    session: StatementContext, dt: DynamicTableRecord, pinned: Sequence[PinnedSource],
    sources: Callable[[TableInfo], DataFrame] | None,
) -> tuple[Binder, str]:  # fmt: skip
    """The definition's query bound over ``sources`` (the pinned versions when None)."""
    binder = Binder(session, Transaction(session.catalog, session.spark, read_only=True),
                    (dt.default_database, dt.default_schema), sources=sources)  # fmt: skip
    bound = binder.bind(dt.query)
    if sorted({t.id for t in binder.tables}) != sorted(item.info.id for item in pinned):
        raise RefreshFailed("the query now reads other tables than when it was defined (a "
                            "view it reads was changed); CREATE OR REPLACE DYNAMIC TABLE "
                            "defines it again", "SOURCE_CHANGED")  # fmt: skip
    return binder, bound


def _as_table(info: TableInfo, frame: DataFrame, extra: Sequence[str]) -> DataFrame:
    """``frame``'s columns named and typed as the table's, by position, then ``extra``."""
    from pyspark.sql.pandas.types import from_arrow_schema

    names = list(info.schema.names)
    if len(frame.columns) != len(names) + len(extra):
        raise RefreshFailed("the query now gives other columns than the dynamic table has; "
                            "CREATE OR REPLACE DYNAMIC TABLE defines it again",
                            "SOURCE_CHANGED")  # fmt: skip
    types = {f.name: f.dataType for f in from_arrow_schema(delta_schema(info.schema)).fields}
    positional = frame.toDF(*[f"c{i}" for i in range(len(names))], *extra)
    return cast_select(positional, [(f"c{i}", types[name], name) for i, name in enumerate(names)],
                       extra)  # fmt: skip


def _rewritten(
    session: StatementContext, dt: DynamicTableRecord, pinned: Sequence[PinnedSource],
    changes: Callable[[TableInfo], DataFrame],
) -> DataFrame:  # fmt: skip
    """The definition's query over the sources' changes, rewritten to carry row ids and
    actions (:func:`rewrite`, insertions only), once Spark gives it the written query's
    columns (names and types, then the two hidden ones): else the refresh fails."""
    binder, bound = _bind(session, dt, pinned, changes)
    try:
        frame = session.run_spark(rewrite(bound, set(binder.source_views)))
    except RewriteError as exc:
        raise RefreshFailed(str(exc), exc.code) from None
    found = [(f.name, f.dataType) for f in frame.schema.fields]
    sources = tuple((t.id, repr(t.schema.declarations())) for t in binder.tables)
    key = (dt.table_id, dt.query, sources, repr(found))
    if key in _CHECKED:
        return frame
    _, written = _bind(session, dt, pinned, lambda t: changes(t).drop(*_HIDDEN))
    expected = [(f.name, f.dataType) for f in session.run_spark(written).schema.fields]
    if found[:-2] != expected or tuple(name for name, _ in found[-2:]) != _HIDDEN:
        raise RefreshFailed("the incremental rewrite of the query does not give the query's "
                            "own columns; REFRESH_MODE = FULL refreshes it",
                            RewriteError.code)  # fmt: skip
    if len(_CHECKED) >= 4096:
        _CHECKED.clear()
    _CHECKED.add(key)
    return frame


#: Rewrites whose columns were checked: the table, its query, its sources' schemas and
#: the rewritten columns (so the check runs again when any of them changes).
_CHECKED: set[tuple[Any, ...]] = set()


def _incremental(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo,
    pinned: Sequence[PinnedSource],
) -> Computed:  # fmt: skip
    from pyspark.sql import functions as F

    by_id = {item.info.id: item for item in pinned}

    def changes(table: TableInfo) -> DataFrame:
        item = by_id[table.id]
        after = item.after if item.after is not None else -1
        frame = read_changes(session.spark, table.uri, table.schema, after, item.to)
        return frame.select(
            *[F.col(_spark_name(n)) for n in table.schema.names],
            F.col(f"`{STREAM_ROW_ID}`").alias(ROW_ID_COLUMN),
            F.col(f"`{STREAM_ACTION}`").alias(REFRESH_ACTION),
        )  # fmt: skip

    frame = _as_table(info, _rewritten(session, dt, pinned, changes), _HIDDEN)
    names = list(info.schema.names)
    net = net_change(frame.toArrow(), names)
    rows = _checked(info, net.rows)
    return Computed(ChangeSet(rows, net.deleted.cast(pa.int64()), net.new_ids.cast(pa.int64())),
                    [len(net.new_ids), len(net.deleted), net.updated], "INCREMENTAL")  # fmt: skip


def _spark_name(name: str) -> str:
    """A column name as Spark reads it whatever it holds (dots, spaces, backquotes)."""
    return "`" + name.replace("`", "``") + "`"


def _checked(info: TableInfo, rows: pa.Table, state: Sequence[str] = ()) -> pa.Table:
    """Rows of user columns and row ids (then the ``state`` columns, as they are),
    checked by the table's conversion rules and typed as its Delta schema."""
    target = delta_schema(info.schema)
    ids = rows.column(ROW_ID_COLUMN).cast(pa.int64())
    checked = _typed(info, rows).append_column(target.field(ROW_ID_COLUMN), ids)
    for name in state:
        checked = checked.append_column(name, rows.column(name))
    return checked


def _typed(info: TableInfo, rows: pa.Table) -> pa.Table:
    """The user columns of ``rows``, checked by the table's conversion rules and typed
    as its Delta schema's."""
    names = list(info.schema.names)
    checked = check_arrow_batch(
        info.schema, rows.select(names).rename_columns([quote_identifier(n) for n in names])
    )
    return checked.cast(info.schema.to_arrow())


def _content(info: TableInfo, handle: DeltaTable) -> pa.Table:
    """The table's rows at the version ``handle`` is at (user columns and row ids), read
    from its files with pyarrow: no Spark job, no delta-rs scan."""
    import pyarrow.dataset as ds

    schema = delta_schema(info.schema)
    files = live_paths(info.uri, handle)
    return ds.dataset(files, schema=schema, format="parquet").to_table() if files else (
        schema.empty_table())  # fmt: skip


def _full_by_id(
    session: StatementContext, info: TableInfo, frame: DataFrame, base: int,
    handle: DeltaTable, initial: bool,
) -> Computed:  # fmt: skip
    names = list(info.schema.names)
    state = _state_names(handle)
    new = frame.drop(REFRESH_ACTION)
    if initial:
        return _all_new(_checked(info, new.toArrow(), state))
    old = read_delta(session.spark, info.uri, base, loaded=handle, state=True)
    try:
        diff = id_diff(old, new, [*names, *state])
    except UncomparableColumnError:
        return _replace_all(session, info, new, old, state)
    rows = _checked(info, diff.rows, state)
    return Computed(ChangeSet(rows, diff.deleted, diff.new_ids.cast(pa.int64())),
                    [diff.inserted, len(diff.deleted), diff.updated], "FULL")  # fmt: skip


def _overwrite(
    session: StatementContext, info: TableInfo, frame: DataFrame, packed: bool,
    handle: DeltaTable,
) -> Computed:  # fmt: skip
    """The result as the table's whole new content (no follower reads its row ids):
    PACKED ids are the rewritten query's own, SEQUENCE ids new."""
    if packed:
        rows = _checked(info, frame.drop(REFRESH_ACTION).toArrow(), _state_names(handle))
    else:
        rows = _with_new_ids(session, info, frame.toArrow())
    before = pa.table(handle.get_add_actions(flatten=True)).column("num_records")
    replaced = int(pc.sum(before).as_py() or 0)
    return Computed(ChangeSet(rows, replaces=True), [rows.num_rows, replaced, 0], "FULL")


def _all_new(rows: pa.Table) -> Computed:
    """An initial refresh: every row of the result inserted."""
    ids = rows.column(ROW_ID_COLUMN).combine_chunks()
    return Computed(ChangeSet(rows, new_ids=ids), [rows.num_rows, 0, 0], "FULL")


def _state_names(handle: DeltaTable) -> list[str]:
    """The table's aggregation state columns (:func:`_state`)."""
    return state_columns(pa.schema(handle.schema()))


def _replace_all(
    session: StatementContext, info: TableInfo, new: DataFrame, old: DataFrame,
    state: Sequence[str] = (),
) -> Computed:  # fmt: skip
    """Every old row deleted, every new one inserted (columns no diff can compare)."""
    deleted = old.select(ROW_ID_COLUMN).toArrow().column(0).combine_chunks().cast(pa.int64())
    if ROW_ID_COLUMN in new.columns:
        rows = _checked(info, new.toArrow(), state)
    else:
        rows = _with_new_ids(session, info, new.toArrow())
    ids = rows.column(ROW_ID_COLUMN).combine_chunks()
    return Computed(ChangeSet(rows, deleted, ids), [rows.num_rows, len(deleted), 0], "FULL")


def _with_new_ids(session: StatementContext, info: TableInfo, inserted: pa.Table) -> pa.Table:
    first = session.catalog.reserve_row_ids(info.id, inserted.num_rows) if inserted.num_rows else 0
    ids = pa.array(np.arange(first, first + inserted.num_rows, dtype=np.int64))
    return _checked(info, inserted.append_column(ROW_ID_COLUMN, ids))


def _full_by_value(
    session: StatementContext, info: TableInfo, frame: DataFrame, base: int,
    handle: DeltaTable, initial: bool,
) -> Computed:  # fmt: skip
    names = list(info.schema.names)
    if initial:
        return _all_new(_with_new_ids(session, info, frame.toArrow()))
    try:
        diff = arrow_value_diff(_content(info, handle), _typed(info, frame.toArrow()))
    except pa.ArrowNotImplementedError:  # a type Arrow cannot group by: Spark's diff
        old = read_delta(session.spark, info.uri, base, loaded=handle)
        try:
            diff = value_diff(old, frame, names)
        except UncomparableColumnError:
            return _replace_all(session, info, frame, old)
    rows = _with_new_ids(session, info, diff.inserted)
    ids = rows.column(ROW_ID_COLUMN).combine_chunks()
    return Computed(ChangeSet(rows, diff.deleted.cast(pa.int64()), ids),
                    [rows.num_rows, len(diff.deleted), 0], "FULL")  # fmt: skip
