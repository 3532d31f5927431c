"""The consumer commit: how a transaction's writes and stream offsets become durable
together, once, or not at all. Stream consumption uses it today; dynamic-table refreshes
and the Spark sink are meant to commit through it too.

Delta has no multi-table transaction, so the decision is made in the catalog: a
pending commit records the plan (each table's staged change set) and claims the
consumed streams by compare-and-swap in one catalog transaction; from then on the
commit is rolled forward, by its owner or, if the owner died, by the next session
that opens the catalog. Each table's Delta commit names the pending commit, so a
roll-forward never applies a table's change twice.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from catalog import Catalog, PendingCommit, StreamClaim, StreamClaimConflict, TableInfo
from flush.change_commit import (
    ChangeSet,
    ConcurrentChangeError,
    StagedChange,
    commit_staged,
    landed_version,
    stage_change_set,
)
from flush.failpoints import failpoint
from pipelines.errors import SqlError, StreamConflictError, TransactionConflictError

__all__ = ["OWNER", "TableWrites", "commit_consumer", "recover_pending", "stream_app_id"]

log = logging.getLogger(__name__)

#: This process, as pending commits name their owner (pid, and a token against pid reuse).
OWNER = f"{os.getpid()}:{uuid.uuid4().hex[:12]}"
#: Pending commits this process is rolling forward right now; any other of its own pending
#: commits failed half way and may be completed by recovery like a dead process's.
_IN_FLIGHT: set[int] = set()


def stream_app_id(stream_id: int) -> str:
    """The Delta app-transaction id a consumption of the stream carries on its targets."""
    return f"ingest-stream:{stream_id}"


@dataclass(slots=True)
class TableWrites:
    """What one transaction writes to one table, computed on ``base_version``."""

    info: TableInfo
    base_version: int
    change: ChangeSet


def _owner_alive(pending: PendingCommit) -> bool:
    owner = pending.owner
    pid_text, _, token = owner.partition(":")
    if owner == OWNER:
        return pending.id in _IN_FLIGHT
    try:
        pid = int(pid_text)
        if pid == os.getpid():
            return token == OWNER.partition(":")[2]
        os.kill(pid, 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _roll_forward(catalog: Catalog, pending: PendingCommit) -> dict[int, int]:
    """Steps 4 and 5 of :func:`commit_consumer` for a recorded commit; idempotent."""
    versions: dict[int, int] = {}
    app_transactions = {stream_app_id(c.stream_id): c.new for c in pending.claims}
    for entry in pending.plan["tables"]:
        staged = StagedChange.from_dict(entry["staged"]) if entry["staged"] else None
        # Step 4: one Delta commit per table (skipped where the log already holds it).
        versions[entry["table_id"]] = commit_staged(
            entry["uri"],
            staged,
            commit_id=pending.id,
            base_version=entry["base_version"],
            app_transactions=app_transactions,
            metadata={"statement": pending.plan.get("statement", "")[:500]},
        )
        failpoint("pipeline_between_tables")
    failpoint("pipeline_before_finish")
    # Step 5: the offsets move with the commit done.
    catalog.finish_commit(pending.id)
    return versions


def commit_consumer(
    catalog: Catalog, writes: Sequence[TableWrites], claims: Sequence[StreamClaim], statement: str
) -> dict[int, int]:
    """Commit a transaction's writes and move the streams it consumed; returns each
    table's new version.

    Steps:
      1. Pin the sources: the claims carry each stream's offset as read (``expected``)
         and the table version the transaction read up to (``new``).
      2. Stage each table's change set as a Parquet file in the table folder (fsync).
      3. Decide: record the plan and claim the streams in one catalog transaction; the
         first consumer of a stream wins, the others fail here having changed nothing.
      4. Commit each table: one Delta commit holding its rows, an app transaction per
         consumed stream (version = the source version read) and the commit's id.
      5. Finish: move the stream offsets and forget the plan in one catalog transaction.
    A crash after step 3 is rolled forward by :func:`recover_pending`; before it,
    nothing happened (the staged files are unreferenced and vacuumed in time).

    Raises:
        StreamConflictError: another transaction consumed a stream first.
        TransactionConflictError: another writer changed rows this one changes.
    """
    # Step 2
    plan_tables = []
    for item in writes:
        change = item.change
        empty = change.rows.num_rows == 0 and len(change.deleted) == 0
        staged = None if empty else stage_change_set(item.info.uri, change)
        plan_tables.append(
            {
                "table_id": item.info.id,
                "uri": item.info.uri,
                "base_version": item.base_version,
                "staged": staged.to_dict() if staged else None,
            }
        )
    failpoint("pipeline_after_stage")
    plan = {"tables": plan_tables, "statement": statement[:500]}
    # Step 3
    try:
        pending = catalog.begin_commit(OWNER, plan, claims)
    except StreamClaimConflict:
        if not recover_pending(catalog):
            raise _lost(catalog, claims) from None
        try:  # a dead consumer's claim was just released or completed: try once more
            pending = catalog.begin_commit(OWNER, plan, claims)
        except StreamClaimConflict:
            raise _lost(catalog, claims) from None
    failpoint("pipeline_after_decide")
    _IN_FLIGHT.add(pending.id)
    try:
        return _roll_forward(catalog, pending)
    except ConcurrentChangeError as exc:
        if _nothing_landed(pending):
            catalog.abandon_commit(pending.id)
            raise TransactionConflictError(f"{exc}; this transaction changed nothing") from exc
        raise _pending_error(pending, exc) from exc
    except Exception as exc:  # the decision stands: recovery completes it
        raise _pending_error(pending, exc) from exc
    finally:
        _IN_FLIGHT.discard(pending.id)


def _pending_error(pending: PendingCommit, exc: BaseException) -> SqlError:
    return SqlError(
        f"commit {pending.id} is decided but not finished ({type(exc).__name__}: {exc}); the "
        "next statement that consumes its streams, or the next session on this warehouse, "
        "completes it",
        "COMMIT_PENDING",
    )


def _lost(catalog: Catalog, claims: Sequence[StreamClaim]) -> StreamConflictError:
    names = []
    for claim in claims:
        stream = catalog.get_stream_by_id(claim.stream_id)
        if stream is None:
            names.append(f"#{claim.stream_id} (dropped)")
        elif stream.offset_version != claim.expected or stream.claimed_by is not None:
            names.append(stream.full_name)
    return StreamConflictError(
        f"stream(s) {', '.join(names)} were consumed by another transaction first; this "
        "transaction changed nothing. Run it again to consume the changes that are left"
    )


def _nothing_landed(pending: PendingCommit) -> bool:
    from deltalake import DeltaTable

    return all(
        landed_version(DeltaTable(t["uri"]), pending.id, t["base_version"]) is None
        for t in pending.plan["tables"]
    )


def recover_pending(catalog: Catalog) -> int:
    """Roll forward every pending commit whose owner process is gone; returns how many.

    A commit whose change can no longer apply (another writer changed its rows) and
    that landed nowhere is abandoned: its streams stay where they were.
    """
    done = 0
    for pending in catalog.pending_commits():
        if _owner_alive(pending):
            continue
        try:
            _roll_forward(catalog, pending)
            log.info("rolled forward pipeline commit %d of %s", pending.id, pending.owner)
        except ConcurrentChangeError:
            if not _nothing_landed(pending):
                log.error("pipeline commit %d is partly applied and its rows changed "
                          "meanwhile; it stays pending", pending.id)  # fmt: skip
                continue
            catalog.abandon_commit(pending.id)
            log.warning("abandoned pipeline commit %d: its rows changed meanwhile", pending.id)
        except Exception:  # retried by the next recovery; never stops a session opening
            log.exception("rolling forward pipeline commit %d failed; it stays pending",
                          pending.id)  # fmt: skip
            continue
        done += 1
    return done
