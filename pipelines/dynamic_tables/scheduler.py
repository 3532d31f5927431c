"""Running what the schedule says is due: ``session.refresh_due()`` for embedded use, and
the loop the service's worker runs on a thread of its own.

:func:`pipelines.dynamic_tables.schedule.due` says which table refreshes for which
aligned tick (pure, any clock); :func:`run_due` runs them in that order (by tick,
upstream first) and records what it did. The last tick a table handled is kept in the
catalog (``last_tick_us``), so a restarted scheduler goes on where the last one
stopped: ticks missed meanwhile become one SKIPPED row (SCHEDULE_OVERRUN), never a
backlog. A table whose upstream has no refresh for the tick (failed, skipped or
suspended) skips it too, naming the upstream: it never reads two snapshots.

Failures stay with their table: a refresh records its own failure (never raises), and
anything else that goes wrong with one table's tick is logged and recorded as its
FAILED row (INTERNAL_ERROR); the tick counts as handled and the round goes on. A table
failing tick after tick for one reason keeps one FAILED row whose ``skipped_ticks``
counts the repeats, as a table skipping tick after tick keeps one SKIPPED row.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from catalog import DynamicTableRecord, RefreshRecord
from flush.commit_clock import clock
from pipelines.dynamic_tables.definition import graph_nodes
from pipelines.dynamic_tables.refresh import INITIAL, SCHEDULED, refresh, session_text
from pipelines.dynamic_tables.schedule import Refresh, due, effective_periods
from pipelines.errors import SqlError
from pipelines.transactions.snapshot_pins import refreshed_versions

if TYPE_CHECKING:
    from pipelines.sql.context import StatementContext

__all__ = [
    "SCHEDULER_LEASE",
    "SCHEDULER_LEASE_SECONDS",
    "SERVICE_ID_VARIABLE",
    "RefreshLoop",
    "next_tick",
    "run_due",
]

#: The catalog lease of the one scheduler among several services on a warehouse.
SCHEDULER_LEASE = "dynamic-table-scheduler"
#: How long a round's take of the lease lasts (the service renews it more often).
SCHEDULER_LEASE_SECONDS = 10.0
#: The environment variable naming the service a worker belongs to (the lease's holder).
SERVICE_ID_VARIABLE = "INGEST_SERVICE_ID"

log = logging.getLogger(__name__)


def _tables(session: StatementContext) -> dict[str, tuple[int, DynamicTableRecord]]:
    names = {t.id: t.full_name for t in session.catalog.list_tables()}
    return {names[dt.table_id]: (dt.table_id, dt)
            for dt in session.catalog.list_dynamic_tables() if dt.table_id in names}  # fmt: skip


def _handled(dt: DynamicTableRecord) -> int | None:
    """The last tick the table handled: scheduled, skipped, or passed by a manual or
    initial refresh of a later data timestamp."""
    known = [t for t in (dt.last_tick_us, dt.data_timestamp_us) if t is not None]
    return max(known) if known else None


def run_due(session: StatementContext, now_us: int | None = None) -> list[RefreshRecord]:
    """Run every refresh due at ``now_us`` (the commit clock's now by default); returns
    their history rows, skipped ones included, in the order they ran. One table's
    failure is its own history row: the round goes on for the others."""
    now = now_us if now_us is not None else clock()
    tables = _tables(session)
    nodes = graph_nodes(session)
    runnable = [n for n in nodes if n.name in tables and tables[n.name][1].state != "INITIALIZING"]
    last = {name: _handled(dt) for name, (_, dt) in tables.items()}
    done: list[RefreshRecord] = []
    for item in due(runnable, last, now):
        done.extend(_tick(session, tables[item.name][0], item))
    return done


def _tick(session: StatementContext, table_id: int, item: Refresh) -> list[RefreshRecord]:
    """One table's due tick, which it handles whatever happens (``last_tick_us``): its
    history rows. An unexpected error is logged and recorded as the tick's FAILED row."""
    try:
        done = _run_tick(session, table_id, item)
    except Exception as exc:  # never the round's end: the other tables go on
        log.exception("the scheduled refresh of %s failed", item.name)
        done = _crashed(session, table_id, item, exc)
    try:
        if session.catalog.get_dynamic_table(table_id) is not None:
            session.catalog.set_dynamic_table(table_id, last_tick_us=item.tick_us)
    except Exception:  # the tick comes again next round
        log.exception("could not record %s's tick as handled", item.name)
    return done


def _run_tick(session: StatementContext, table_id: int, item: Refresh) -> list[RefreshRecord]:
    dt = session.catalog.get_dynamic_table(table_id)
    if dt is None:  # dropped meanwhile
        return []
    done: list[RefreshRecord] = []
    if item.skipped_ticks:
        done.append(_skip(session, table_id, item.name, item.last_skipped_us or item.tick_us,
                          "SCHEDULE_OVERRUN", item.skipped_ticks))  # fmt: skip
    blocked = _upstream_missing(session, dt, item)
    if blocked:
        done.append(_skip(session, table_id, item.name, item.tick_us, blocked, 1))
        return done
    try:
        record = refresh(session, table_id, SCHEDULED, item.tick_us)
    except SqlError as exc:
        if exc.code == "OBJECT_NOT_FOUND" and session.catalog.get_dynamic_table(table_id) is None:
            return done  # dropped while it refreshed: its history went with it
        raise
    return [*done, _folded(session, table_id, record)]


def _folded(session: StatementContext, table_id: int, record: RefreshRecord) -> RefreshRecord:
    """A scheduled refresh failing for the reason its previous one failed for is folded
    into that row (``skipped_ticks`` counts the repeats; the latest tick, end and
    error): a table failing on every tick keeps one FAILED row. Returns the row."""
    if record.state != "FAILED" or record.trigger not in (SCHEDULED, INITIAL):
        return record
    newest = session.catalog.list_refreshes(table_id, limit=2)
    if len(newest) < 2 or newest[0].id != record.id:
        return record
    previous = newest[1]
    if (previous.state, previous.trigger, previous.reason) != ("FAILED", record.trigger,
                                                               record.reason):  # fmt: skip
        return record
    repeats = previous.skipped_ticks + 1 + record.skipped_ticks
    if not session.catalog.fold_refresh(record.id, previous.id, skipped_ticks=repeats,
                                        data_timestamp_us=record.data_timestamp_us,
                                        ended_at=record.ended_at, error=record.error):  # fmt: skip
        return record
    return session.catalog.get_refresh(previous.id) or record


def _crashed(
    session: StatementContext, table_id: int, item: Refresh, exc: Exception
) -> list[RefreshRecord]:
    """The FAILED row (INTERNAL_ERROR) of a tick whose handling raised outside any
    refresh's own row; none if even that cannot be written (logged)."""
    now = time.time()
    try:
        if session.catalog.get_dynamic_table(table_id) is None:
            return []  # dropped meanwhile: its history went with it
        text = session_text(session, str(exc))[:500] or "no message"
        refresh_id = session.catalog.add_refresh({
            "dt_table_id": table_id, "name": item.name, "refresh_uid": uuid.uuid4().hex,
            "trigger": SCHEDULED, "action": "FAILED", "state": "FAILED",
            "reason": "INTERNAL_ERROR", "error": f"the scheduled refresh failed on an "
            f"unexpected error ({text}); the service log has the details",
            "data_timestamp_us": item.tick_us, "started_at": now, "ended_at": now,
        })  # fmt: skip
        record = session.catalog.get_refresh(refresh_id)
        return [_folded(session, table_id, record)] if record is not None else []
    except Exception:
        log.exception("could not record the failure of %s's tick", item.name)
        return []


def _upstream_missing(session: StatementContext, dt: DynamicTableRecord, item: Refresh) -> str:
    """Why the table cannot refresh for this tick ('' if it can): an upstream dynamic
    table without a refresh for it."""
    for source in dt.sources:
        upstream = session.catalog.get_dynamic_table(source.source_id)
        if source.kind == "view" or upstream is None:
            continue
        if item.tick_us in refreshed_versions(session.catalog, upstream):
            continue  # refreshed for the tick (and maybe again since)
        if upstream.state == "SUSPENDED":
            return f"UPSTREAM_SUSPENDED:{source.name}"
        last = next(iter(session.catalog.list_refreshes(source.source_id, limit=1)), None)
        failed = last is not None and last.state == "FAILED"
        return f"UPSTREAM_{'FAILED' if failed else 'SKIPPED'}:{source.name}"
    return ""


def _skip(
    session: StatementContext, table_id: int, name: str, tick: int, reason: str, ticks: int
) -> RefreshRecord:
    now = time.time()
    last = next(iter(session.catalog.list_refreshes(table_id, limit=1)), None)
    if last is not None and last.state == "SKIPPED" and last.reason == reason:
        # The same reason again (an upstream failing tick after tick): one row counts them.
        session.catalog.update_refresh(last.id, skipped_ticks=last.skipped_ticks + ticks,
                                       data_timestamp_us=tick, ended_at=now)  # fmt: skip
        return next(r for r in session.catalog.list_refreshes(table_id, limit=1))
    refresh_id = session.catalog.add_refresh({
        "dt_table_id": table_id, "name": name, "refresh_uid": uuid.uuid4().hex,
        "trigger": SCHEDULED, "action": "SKIPPED", "state": "SKIPPED", "reason": reason,
        "data_timestamp_us": tick, "started_at": now, "ended_at": now, "skipped_ticks": ticks,
    })  # fmt: skip
    return next(r for r in session.catalog.list_refreshes(table_id, limit=5) if r.id == refresh_id)


def next_tick(session: StatementContext, now_us: int) -> int | None:
    """The next aligned tick after ``now_us`` of any scheduled table (None: none is)."""
    tables = _tables(session)
    nodes = [n for n in graph_nodes(session) if n.name in tables]
    periods = [p for p in effective_periods(nodes).values() if p is not None]
    return min((now_us // p + 1) * p for p in periods) if periods else None


class RefreshLoop:
    """Runs :func:`run_due` whenever a tick comes, on a thread of its own, until stopped.

    Args:
        session_factory: makes the session the loop refreshes with (on its thread).
        poll_seconds: how often it looks for new or changed tables between ticks.
        before: called on the loop's thread before it starts (e.g. to choose the Spark
            scheduler pool its jobs run in).
        lease: called before each round: whether this loop is the warehouse's scheduler
            (it holds :data:`SCHEDULER_LEASE`); a round is skipped while it is not.
    """

    def __init__(
        self,
        session_factory: Callable[[], StatementContext],
        poll_seconds: float = 1.0,
        before: Callable[[], None] | None = None,
        lease: Callable[[], bool] | None = None,
    ) -> None:
        self._factory = session_factory
        self._poll = poll_seconds
        self._before = before
        self._lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dynamic-table-refresh",
                                        daemon=True)  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        if self._before is not None:
            self._before()
        session = self._factory()
        try:
            while not self._stop.is_set():
                wait = self._poll
                try:
                    if self._lease is not None and not self._lease():
                        self._stop.wait(wait)
                        continue
                    run_due(session)
                    upcoming = next_tick(session, clock())
                    if upcoming is not None:
                        wait = min(wait, max(0.0, (upcoming - clock()) / 1e6))
                except Exception:  # one failing round never ends the loop
                    log.exception("a round of dynamic table refreshes failed")
                self._stop.wait(wait)
        finally:
            close = getattr(session, "close", None)
            if close is not None:
                close()
