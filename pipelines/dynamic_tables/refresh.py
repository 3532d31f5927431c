"""One refresh of a dynamic table for one data timestamp: check the sources, pin the
versions they had at that moment, then NO_DATA, FULL or INCREMENTAL, applied by one
consumer commit.

Every refresh leaves one history row. One that changes the table is one Delta commit
holding its rows, an app transaction per source (the version read) and the refresh in
its metadata, made by :func:`pipelines.transactions.commit.commit_consumer`; the
catalog records the refresh (data timestamp, source versions, history) in the same
transaction that ends that commit, so a refresh killed at any step is applied once or
not at all. A refresh that finds its sources unchanged runs no Spark job and writes no
Delta commit: it moves the data timestamp in the catalog (NO_DATA).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa
from deltalake import DeltaTable

from catalog import (
    DynamicSource,
    DynamicTableRecord,
    RefreshClaimConflict,
    RefreshRecord,
    TableInfo,
)
from flush.change_commit import ChangeSet
from flush.commit_clock import clock, version_at
from flush.spark_tables import read_delta
from flush.tables import ROW_ID_COLUMN, delta_schema
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.errors import IngestError
from ingest_sdk.schema import quote_identifier
from pipelines.dynamic_tables.diff import UncomparableColumnError, value_diff
from pipelines.errors import SqlError, evaluation_errors
from pipelines.sql.binding import Binder, parse
from pipelines.sql.history import data_changed
from pipelines.transactions.commit import TableWrites, commit_consumer, recover_pending
from pipelines.transactions.commit_owner import IN_FLIGHT, new_owner
from pipelines.transactions.transaction import Transaction

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["INITIAL", "MANUAL", "SCHEDULED", "RefreshFailed", "dt_app_id", "refresh"]

log = logging.getLogger(__name__)
INITIAL, MANUAL, SCHEDULED = "INITIAL", "MANUAL", "SCHEDULED"


class RefreshFailed(SqlError):
    """A refresh failed; its history row says why (``reason``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, "DYNAMIC_TABLE_REFRESH_FAILED")
        self.reason = reason


def dt_app_id(dt: DynamicTableRecord, position: int) -> str:
    """The app transaction a refresh carries for the dynamic table's ``position``-th
    source: the source version it read (unique to this definition: ``uid``)."""
    return f"ingest-dt:{dt.uid}:{position}"


@dataclass(frozen=True, slots=True)
class _Pinned:
    """A table source at the version this refresh reads."""

    position: int
    source: DynamicSource
    info: TableInfo
    to: int


def refresh(
    session: StatementContext,
    table_id: int,
    trigger: str,
    data_timestamp_us: int | None = None,
) -> RefreshRecord:
    """Refresh the dynamic table for ``data_timestamp_us`` (now by default); returns its
    history row (SUCCEEDED, SKIPPED or FAILED). Never raises for a failure of the
    refresh itself: that is in the row (``reason``, ``error``)."""
    catalog = session.catalog
    dt = _current(session, table_id)
    moment = data_timestamp_us if data_timestamp_us is not None else clock()
    if dt.data_timestamp_us is None:
        trigger = INITIAL
    info = catalog.get_table_by_id(table_id)
    owner = new_owner()
    IN_FLIGHT.add(owner)  # alive for recovery while this thread works on it
    refresh_id = catalog.add_refresh({
        "dt_table_id": table_id, "name": info.full_name if info else str(table_id),
        "refresh_uid": uuid.uuid4().hex, "trigger": trigger, "state": "EXECUTING",
        "data_timestamp_us": moment, "started_at": time.time(), "owner": owner,
    })  # fmt: skip
    try:
        if info is None:
            raise RefreshFailed("the dynamic table was dropped", "DROPPED")
        if dt.data_timestamp_us is not None and moment <= dt.data_timestamp_us:
            catalog.update_refresh(refresh_id, state="SKIPPED", action="SKIPPED",
                                   reason="ALREADY_REFRESHED", ended_at=time.time())  # fmt: skip
        else:
            _run(session, dt, info, moment, refresh_id)
    except RefreshClaimConflict:
        catalog.update_refresh(refresh_id, state="SKIPPED", action="SKIPPED",
                               reason="CONCURRENT_REFRESH", ended_at=time.time())  # fmt: skip
    except RefreshFailed as exc:
        _failed(session, refresh_id, exc.reason, str(exc))
    except SqlError as exc:
        if exc.code != "COMMIT_PENDING":  # decided: recovery completes and records it
            _failed(session, refresh_id, exc.code, session_text(session, str(exc)))
    except IngestError as exc:
        _failed(session, refresh_id, getattr(exc, "code", "CONVERSION"), str(exc))
    finally:
        IN_FLIGHT.discard(owner)
        session.release_views()
    return _row(session, table_id, refresh_id)


def session_text(session: StatementContext, text: str) -> str:
    names: Callable[[str], str] | None = getattr(session, "user_names", None)
    return names(text) if names else text


def _current(session: StatementContext, table_id: int) -> DynamicTableRecord:
    """The dynamic table's record, once a decided refresh of a dead process is complete."""
    dt = session.catalog.get_dynamic_table(table_id)
    if dt is None:
        raise SqlError("the dynamic table was dropped meanwhile", "OBJECT_NOT_FOUND")
    if dt.claimed_by is not None and recover_pending(session.catalog, only={dt.claimed_by}):
        dt = session.catalog.get_dynamic_table(table_id) or dt
    return dt


def _failed(session: StatementContext, refresh_id: int, reason: str, error: str) -> None:
    session.catalog.update_refresh(refresh_id, state="FAILED", action="FAILED", reason=reason,
                                   error=error[:2000], ended_at=time.time())  # fmt: skip


def _row(session: StatementContext, table_id: int, refresh_id: int) -> RefreshRecord:
    for row in session.catalog.list_refreshes(table_id, limit=50):
        if row.id == refresh_id:
            return row
    raise SqlError("the dynamic table was dropped during its refresh", "OBJECT_NOT_FOUND")


def check_sources(session: StatementContext, dt: DynamicTableRecord) -> list[_Pinned]:
    """The table sources as recorded, each still the table the definition was checked
    against, with its columns unchanged; views not dropped or replaced.

    Raises:
        RefreshFailed: SOURCE_DROPPED, SOURCE_REPLACED, SOURCE_CHANGED, VIEW_DROPPED or
            VIEW_REPLACED, naming the source and the fix (CREATE OR REPLACE).
    """
    catalog = session.catalog
    pinned: list[_Pinned] = []
    fix = "; CREATE OR REPLACE DYNAMIC TABLE defines it again over what exists now"
    for position, source in enumerate(dt.sources):
        if source.kind == "view":
            view = catalog.get_view(*_split(source.name))
            if view is None:
                raise RefreshFailed(f"view {source.name}, which the query reads, was dropped"
                                    + fix, "VIEW_DROPPED")  # fmt: skip
            if view.uid != source.marker:
                raise RefreshFailed(f"view {source.name}, which the query reads, was replaced"
                                    + fix, "VIEW_REPLACED")  # fmt: skip
            continue
        info = catalog.get_table_by_id(source.source_id)
        if info is None:
            named = session.find_table(*_split(source.name))
            code = "SOURCE_REPLACED" if named is not None else "SOURCE_DROPPED"
            raise RefreshFailed(f"table {source.name}, which the query reads, was "
                                f"{'replaced' if named else 'dropped'}" + fix, code)  # fmt: skip
        if orjson.dumps(info.schema.declarations()).decode() != source.marker:
            raise RefreshFailed(f"the columns of {info.full_name}, which the query reads, "
                                "changed" + fix, "SOURCE_CHANGED")  # fmt: skip
        pinned.append(_Pinned(position, source, info, -1))
    return pinned


def _split(name: str) -> tuple[str, str, str]:
    from pipelines.sql.statements import split_name

    database, schema, table = split_name(name)
    return database, schema, table


def _pin(session: StatementContext, pinned: list[_Pinned], moment: int) -> list[_Pinned]:
    """Each table source at the newest version committed at ``moment``; a dynamic table
    source at the version holding its refresh for ``moment``.

    Raises:
        RefreshFailed: UPSTREAM_NOT_REFRESHED when an upstream dynamic table has no
            refresh for ``moment`` (snapshot isolation forbids reading another one).
    """
    result = []
    for item in pinned:
        upstream = session.catalog.get_dynamic_table(item.info.id)
        if upstream is None:
            found = version_at(item.info.uri, moment)
            to = found if found is not None else 0
        elif upstream.data_timestamp_us == moment:
            held = upstream.data_version  # None: ended by ABANDON COMMIT, which knew no version
            to = held if held is not None else DeltaTable(item.info.uri).version()
        else:
            raise RefreshFailed(
                f"upstream dynamic table {item.info.full_name} has no refresh for this data "
                "timestamp (its refresh was skipped or failed), and reading it at another "
                "would break snapshot isolation", "UPSTREAM_NOT_REFRESHED",
            )  # fmt: skip
        result.append(_Pinned(item.position, item.source, item.info, to))
    return result


def _unchanged(dt: DynamicTableRecord, pinned: list[_Pinned]) -> bool:
    """Whether no source changed data since the versions the last refresh read (no
    Spark job: a look at the commits' actions)."""
    for item in pinned:
        after = item.source.version
        if after is None or item.to < after:
            return False
        if item.to > after and data_changed(item.info.uri, after, item.to):
            return False
    return True


def _run(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo, moment: int,
    refresh_id: int,
) -> None:  # fmt: skip
    catalog = session.catalog
    pinned = _pin(session, check_sources(session, dt), moment)
    versions = {item.position: item.to for item in pinned}
    shown = {item.info.full_name: [item.source.version, item.to] for item in pinned}
    catalog.update_refresh(refresh_id, source_versions=shown)
    if dt.data_timestamp_us is not None and _unchanged(dt, pinned):
        if not catalog.record_no_data(info.id, dt.refresh_seq, moment, versions, refresh_id):
            raise RefreshClaimConflict(info.id)
        return
    handle = DeltaTable(info.uri)
    base = handle.version()
    txn = Transaction(catalog, session.spark, read_only=True)
    for item in pinned:
        txn.versions[item.info.id] = item.to
    frame = _query(session, dt, txn, info, pinned)
    with evaluation_errors():
        change, counts = _full_change(session, info, frame, base, handle,
                                      initial=dt.data_timestamp_us is None)  # fmt: skip
    action = "FULL"
    metadata: dict[str, object] = {"dynamic_table": {
        "refresh": refresh_id, "seq": dt.refresh_seq + 1, "data_timestamp_us": moment,
        "action": action, "sources": {str(k): v for k, v in versions.items()},
    }}  # fmt: skip
    claim: dict[str, Any] = {
        "dt": info.id, "uid": dt.uid, "seq": dt.refresh_seq, "history": refresh_id,
        "data_timestamp_us": moment, "sources": {str(k): v for k, v in versions.items()},
        "counts": counts, "action": action,
    }  # fmt: skip
    commit_consumer(
        catalog, [TableWrites(info, base, change)], [], f"refresh of {info.full_name}", {},
        app_transactions={dt_app_id(dt, k): v for k, v in versions.items()},
        metadata=metadata, refresh=claim,
    )  # fmt: skip


def _query(
    session: StatementContext, dt: DynamicTableRecord, txn: Transaction, info: TableInfo,
    pinned: list[_Pinned],
) -> DataFrame:  # fmt: skip
    """The definition's query over the pinned versions, its columns named and typed as
    the dynamic table's (matched by position)."""
    binder = Binder(session, txn, (dt.default_database, dt.default_schema), (info.full_name,))
    frame = session.run_spark(binder.bind(parse(dt.query)).sql("spark"))
    read = sorted({t.id for t in binder.tables})
    if read != sorted(item.info.id for item in pinned):
        raise RefreshFailed("the query now reads other tables than when it was defined (a "
                            "view it reads was changed); CREATE OR REPLACE DYNAMIC TABLE "
                            "defines it again", "SOURCE_CHANGED")  # fmt: skip
    if len(frame.columns) != len(info.schema.names):
        raise RefreshFailed("the query now gives other columns than the dynamic table has; "
                            "CREATE OR REPLACE DYNAMIC TABLE defines it again",
                            "SOURCE_CHANGED")  # fmt: skip
    return frame


def _full_change(
    session: StatementContext,
    info: TableInfo,
    frame: DataFrame,
    base: int,
    handle: DeltaTable,
    initial: bool,
) -> tuple[ChangeSet, list[int]]:
    """A full refresh as the change to the table's content: the whole result when the
    table is empty, else the difference matched by value (unchanged rows keep their ids);
    with the counts (inserted, deleted, updated)."""
    from pyspark.sql import functions as F

    names = list(info.schema.names)
    old = read_delta(session.spark, info.uri, base, loaded=handle)
    typed = frame.toDF(*[f"c{i}" for i in range(len(names))]).select(
        *[F.col(f"c{i}").cast(old.schema[name].dataType).alias(name)
          for i, name in enumerate(names)]
    )  # fmt: skip
    deleted = pa.array([], pa.int64())
    if initial:
        inserted = typed.toArrow()
    else:
        try:
            diff = value_diff(old, typed, names)
            inserted, deleted = diff.inserted, diff.deleted
        except UncomparableColumnError:  # replace everything
            inserted = typed.toArrow()
            deleted = old.select(ROW_ID_COLUMN).toArrow().column(0).combine_chunks()
    checked = check_arrow_batch(
        info.schema, inserted.rename_columns([quote_identifier(n) for n in names])
    )
    first = session.catalog.reserve_row_ids(info.id, checked.num_rows) if checked.num_rows else 0
    ids = pa.array(range(first, first + checked.num_rows), pa.int64())
    target = delta_schema(info.schema)
    rows = checked.append_column(target.field(ROW_ID_COLUMN), ids).cast(target)
    return ChangeSet(rows, deleted.cast(pa.int64()), ids), [checked.num_rows, len(deleted), 0]
