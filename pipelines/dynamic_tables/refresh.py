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

A refresh never ends with an exception (but for its table dropped meanwhile): a failure
is its row's FAILED state with a reason code, an error no rule knows is INTERNAL_ERROR
with its text (and its traceback in the log), and no row is left EXECUTING but a
decided commit's, which recovery completes and records.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from catalog import (
    Catalog,
    DynamicTableRecord,
    RefreshClaimConflict,
    RefreshRecord,
    TableInfo,
)
from flush.commit_clock import clock, version_at
from flush.table_locks import table_lock
from ingest_sdk.errors import IngestError
from pipelines.dynamic_tables.refresh_change import (
    Computed,
    PinnedSource,
    RefreshFailed,
    app_transactions,
    compute,
    has_followers,
)
from pipelines.dynamic_tables.sources import check_sources
from pipelines.errors import SqlError, evaluation_errors
from pipelines.sql.history import data_changed
from pipelines.transactions.commit import TableWrites, commit_consumer, recover_pending
from pipelines.transactions.commit_owner import IN_FLIGHT, new_owner
from pipelines.transactions.snapshot_pins import refreshed_versions

if TYPE_CHECKING:
    from pipelines.sql.context import StatementContext

__all__ = [
    "BUILDING",
    "INITIAL",
    "MANUAL",
    "SCHEDULED",
    "RefreshFailed",
    "check_sources",
    "refresh",
]

log = logging.getLogger(__name__)
INITIAL, MANUAL, SCHEDULED = "INITIAL", "MANUAL", "SCHEDULED"
#: In the name of the table ``CREATE OR REPLACE`` builds beside the one it replaces.
BUILDING = "$BUILDING$"


def refresh(
    session: StatementContext,
    table_id: int,
    trigger: str,
    data_timestamp_us: int | None = None,
) -> RefreshRecord:
    """Refresh the dynamic table for ``data_timestamp_us`` (now by default); returns its
    history row (SUCCEEDED, SKIPPED or FAILED). Never raises for a failure of the
    refresh itself, expected or not: that is in the row (``reason``, ``error``). Raises
    only when the dynamic table was dropped (OBJECT_NOT_FOUND: no row is left)."""
    catalog = session.catalog
    dt = _current(session, table_id)
    moment = data_timestamp_us if data_timestamp_us is not None else clock()
    if dt.data_timestamp_us is not None and data_timestamp_us is None:
        moment = max(moment, dt.data_timestamp_us + 1)  # "now" never goes back (clock steps)
    if dt.data_timestamp_us is None:
        trigger = INITIAL
    info = catalog.get_table_by_id(table_id)
    looked, quick = _quick(session, dt, info, moment, trigger)
    if quick is not None:
        return _row(session, table_id, quick)
    owner = new_owner()
    IN_FLIGHT.add(owner)  # alive for recovery while this thread works on it
    refresh_id = catalog.add_refresh({
        "dt_table_id": table_id, "name": info.full_name if info else str(table_id),
        "refresh_uid": uuid.uuid4().hex, "trigger": trigger, "state": "EXECUTING",
        "data_timestamp_us": moment, "started_at": time.time(), "owner": owner,
    })  # fmt: skip
    try:
        _attempt(session, dt, info, moment, refresh_id, looked)
    finally:
        IN_FLIGHT.discard(owner)
        session.release_views()
    return _row(session, table_id, refresh_id)


def _quick(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo | None, moment: int,
    trigger: str,
) -> tuple[tuple[list[PinnedSource], bool] | None, int | None]:  # fmt: skip
    """The common refresh, whose sources did not change (NO_DATA: one catalog write, no
    history row before): the sources as looked at, and the NO_DATA row's id if it was
    that one. Whatever fails here is left to the full path, which records it."""
    if info is None or dt.data_timestamp_us is None or moment <= dt.data_timestamp_us:
        return None, None
    try:
        looked = _sources_at(session, dt, moment)
        if not looked[1]:
            return looked, None
        return looked, _no_data(session, dt, info, moment, trigger, looked[0])
    except Exception:  # the full path below meets it again and records it
        return None, None


def _attempt(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo | None, moment: int,
    refresh_id: int, looked: tuple[list[PinnedSource], bool] | None,
) -> None:  # fmt: skip
    """The refresh past its EXECUTING row, which it always ends (SUCCEEDED, SKIPPED or
    FAILED), but for a decided commit that recovery completes and records."""
    catalog = session.catalog
    try:
        if info is None:
            raise RefreshFailed("the dynamic table was dropped", "DROPPED")
        if dt.data_timestamp_us is not None and moment <= dt.data_timestamp_us:
            catalog.update_refresh(refresh_id, state="SKIPPED", action="SKIPPED",
                                   reason="ALREADY_REFRESHED", ended_at=time.time())  # fmt: skip
        else:
            _run(session, dt, info, moment, refresh_id, looked)
    except RefreshClaimConflict:
        _concurrent(session, refresh_id)
    except RefreshFailed as exc:
        _failed(session, refresh_id, exc.reason, str(exc))
    except SqlError as exc:
        if exc.code == "COMMIT_PENDING":
            pass  # decided: recovery completes it and records it (the row stays EXECUTING)
        elif _refreshed_meanwhile(session, dt):  # it lost a race to another refresh's commit
            _concurrent(session, refresh_id)
        else:
            _failed(session, refresh_id, *_moved(session, dt, _reason(session, exc)))
    except IngestError as exc:
        _failed(session, refresh_id, getattr(exc, "code", "CONVERSION"), str(exc))
    except Exception as exc:  # no refresh ends with an exception
        if catalog.get_dynamic_table(dt.table_id) is None:  # e.g. its folder gone: OSError
            raise SqlError(
                f"dynamic table {info.full_name if info else dt.table_id} was dropped "
                "during its refresh; nothing was written", "OBJECT_NOT_FOUND",
            ) from None  # its history went with it: no row to end  # fmt: skip
        log.exception("refresh %s of dynamic table %s failed", refresh_id, dt.table_id)
        _failed(session, refresh_id, *_moved(session, dt, _unexpected(session, exc)))


def _unexpected(session: StatementContext, exc: Exception) -> tuple[str, str]:
    """The reason and message of a failure no rule above knows (the log has the
    traceback): INTERNAL_ERROR, with the error's text."""
    text = session_text(session, str(exc)) or "no message"
    return "INTERNAL_ERROR", (
        f"the refresh failed on an unexpected error ({text[:500]}); the table is unchanged "
        "and the service log has the details"
    )


def _moved(
    session: StatementContext, dt: DynamicTableRecord, found: tuple[str, str]
) -> tuple[str, str]:
    """``found``, unless a source moved while the refresh ran (it was checked before
    the read): then the reason the sources' check gives now."""
    try:
        check_sources(session, dt)
    except RefreshFailed as exc:
        return exc.reason, str(exc)
    except Exception:  # the first error is the one to record
        log.debug("checking the sources again failed", exc_info=True)
    return found


def _refreshed_meanwhile(session: StatementContext, dt: DynamicTableRecord) -> bool:
    """Whether another refresh was applied (or claimed) since this one read the table."""
    now = session.catalog.get_dynamic_table(dt.table_id)
    return now is not None and (now.refresh_seq != dt.refresh_seq or now.claimed_by is not None)


def _concurrent(session: StatementContext, refresh_id: int) -> None:
    """The refresh lost to another: SKIPPED, without the message of what it would have
    done (ADAPTIVE's choice, written before its commit)."""
    session.catalog.update_refresh(refresh_id, state="SKIPPED", action="SKIPPED",
                                   reason="CONCURRENT_REFRESH", error="",
                                   ended_at=time.time())  # fmt: skip


def _reason(session: StatementContext, exc: SqlError) -> tuple[str, str]:
    """The reason code and message of a failed refresh: ROW_ID_SPACE for a row id packed
    past 64 bits (Spark's advice to turn ANSI off does not apply), else the error's."""
    if "ARITHMETIC_OVERFLOW" in str(exc):
        return "ROW_ID_SPACE", (
            "a row id of this dynamic table would pass 64 bits (each UNION ALL doubles its "
            "sources' row ids); nothing was written. CREATE OR REPLACE it with REFRESH_MODE "
            "= FULL, whose row ids come from its own sequence"
        )
    return exc.code, session_text(session, str(exc))


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
    # By id: another process refreshing in a loop may have added any number since.
    row = session.catalog.get_refresh(refresh_id)
    if row is None or row.dt_table_id != table_id:
        raise SqlError("the dynamic table was dropped during its refresh", "OBJECT_NOT_FOUND")
    return row


def _pin(session: StatementContext, pinned: list[PinnedSource], moment: int) -> list[PinnedSource]:
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
        elif upstream.data_timestamp_us == moment and upstream.data_version is None:
            to = DeltaTable(item.info.uri).version()  # ended by ABANDON COMMIT: no version known
        elif moment in (held := refreshed_versions(session.catalog, upstream)):
            to = held[moment]  # also when the upstream has refreshed again since
        else:
            raise RefreshFailed(
                f"upstream dynamic table {item.info.full_name} has no refresh for this data "
                "timestamp (its refresh was skipped or failed), and reading it at another "
                "would break snapshot isolation", "UPSTREAM_NOT_REFRESHED",
            )  # fmt: skip
        result.append(PinnedSource(item.position, item.info, item.after, to))
    return result


def _unchanged(pinned: list[PinnedSource]) -> bool:
    """Whether no source changed data since the versions the last refresh read (no
    Spark job: a look at the commits' actions)."""
    for item in pinned:
        if item.after is None or item.to < item.after:
            return False
        if item.to > item.after and data_changed(item.info.uri, item.after, item.to):
            return False
    return True


def _sources_at(
    session: StatementContext, dt: DynamicTableRecord, moment: int
) -> tuple[list[PinnedSource], bool]:
    """The sources checked and pinned for ``moment``, and whether none of them changed
    data since the last refresh (never, before the initial one)."""
    pinned = _pin(session, check_sources(session, dt), moment)
    return pinned, dt.data_timestamp_us is not None and _unchanged(pinned)


def _no_data(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo, moment: int,
    trigger: str, pinned: list[PinnedSource],
) -> int | None:  # fmt: skip
    """The common refresh, whose sources did not change, as one catalog write (its
    history row and the move of the data timestamp together); returns the row's id.
    None if another refresh came first: the full path then runs and records it."""
    return session.catalog.add_no_data_refresh({
        "dt_table_id": info.id, "name": info.full_name, "refresh_uid": uuid.uuid4().hex,
        "trigger": trigger, "data_timestamp_us": moment, "started_at": time.time(),
        "owner": "",
        "source_versions": {item.info.full_name: [item.after, item.to] for item in pinned},
    }, dt.refresh_seq, {item.position: item.to for item in pinned})  # fmt: skip


def _run(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo, moment: int,
    refresh_id: int, looked: tuple[list[PinnedSource], bool] | None = None,
) -> None:  # fmt: skip
    """The refresh past its history row; ``looked``: :func:`_sources_at` for ``moment``
    if the caller has it already."""
    catalog = session.catalog
    pinned, unchanged = looked if looked is not None else _sources_at(session, dt, moment)
    shown = {item.info.full_name: [item.after, item.to] for item in pinned}
    if unchanged:
        moved = {item.position: item.to for item in pinned}
        if not catalog.record_no_data(info.id, dt.refresh_seq, moment, moved, refresh_id, shown):
            raise RefreshClaimConflict(info.id)
        return
    catalog.update_refresh(refresh_id, source_versions=shown)
    handle = DeltaTable(info.uri)
    base = handle.version()
    with evaluation_errors():
        computed = compute(session, dt, info, pinned, base, handle)
    with table_lock(info.uri):  # never at once with a compaction or a drop of the table
        if catalog.get_dynamic_table(info.id) is None:  # dropped before this took the lock
            raise FileNotFoundError(info.uri)
        if computed.change.replaces and has_followers(catalog, info.id):
            # A stream came while the overwrite was computed (CREATE STREAM on a dynamic
            # table takes this lock): it gets the difference instead.
            with evaluation_errors():
                computed = compute(session, dt, info, pinned, base, handle, followed=True)
        _commit(session, dt, info, moment, refresh_id, pinned, base, computed)


def _commit(
    session: StatementContext, dt: DynamicTableRecord, info: TableInfo, moment: int,
    refresh_id: int, pinned: list[PinnedSource], base: int, computed: Computed,
) -> None:  # fmt: skip
    """The refresh's one commit, under the table's lock."""
    catalog = session.catalog
    versions = {str(item.position): item.to for item in pinned}
    if computed.reason or computed.message:  # why FULL; ADAPTIVE's measure as the message
        catalog.update_refresh(refresh_id, reason=computed.reason, error=computed.message)
    metadata: dict[str, object] = {"dynamic_table": {
        "refresh": refresh_id, "seq": dt.refresh_seq + 1, "data_timestamp_us": moment,
        "action": computed.action, "sources": versions,
    }}  # fmt: skip
    claim: dict[str, Any] = {
        "dt": info.id, "uid": dt.uid, "seq": dt.refresh_seq, "history": refresh_id,
        "data_timestamp_us": moment, "sources": versions, "counts": computed.counts,
        "action": computed.action,
        "activate": BUILDING not in info.name,  # a replacement goes live at its swap
    }  # fmt: skip
    commit_consumer(
        catalog, [TableWrites(info, base, computed.change)], [],
        f"refresh of {info.full_name}", {},
        app_transactions=app_transactions(dt, pinned),
        metadata=metadata, refresh=claim,
    )  # fmt: skip
    _record_took(catalog, refresh_id)


def _record_took(catalog: Catalog, refresh_id: int) -> None:
    """The refresh's seconds, as this process saw them end (ADAPTIVE weighs them): a
    refresh recovery finishes keeps none, its end being the recovery's. Advice only: the
    refresh is committed, and a failure here never reports it otherwise."""
    try:
        record = catalog.get_refresh(refresh_id)
        if record is not None and record.state == "SUCCEEDED" and record.ended_at is not None:
            catalog.update_refresh(refresh_id, took_s=record.ended_at - record.started_at)
    except Exception:
        log.warning("the time of refresh %s was not recorded", refresh_id, exc_info=True)
