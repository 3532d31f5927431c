"""What an operator can see of pending pipeline commits and do about one that cannot
complete: the way out when outside damage (a staged file removed by hand, a broken
disk) makes a decided commit's roll-forward fail every time, so that its tables would
otherwise stay fenced for good.

Giving a commit up is never automatic: a decided commit is all-or-nothing only while it
can still be rolled forward, and once one of its tables has its change, giving it up
leaves the transaction half-applied. The operator decides, and is told exactly what
landed and what did not.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from deltalake import DeltaTable

from catalog import Catalog, PendingCommit
from pipelines.commit import commit_app_id, recover_pending
from pipelines.commit_owner import IN_FLIGHT, new_owner, owner_alive
from pipelines.errors import ObjectNotFoundError, SqlError

__all__ = ["CommitStatus", "abandon_commit", "pending_status"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CommitStatus:
    """One pending commit as SHOW PENDING COMMITS lists it."""

    id: int
    state: str
    owner_alive: bool
    age_seconds: float
    tables: tuple[str, ...]
    landed: tuple[str, ...]  # tables whose log already holds the commit's change
    streams: tuple[str, ...]
    statement: str


def _landed(pending: PendingCommit) -> tuple[list[str], list[str]]:
    """The commit's tables split into those whose log holds its app id and the rest (a
    table whose log cannot be read counts as not landed: its change is not readable)."""
    app = commit_app_id(pending)
    landed: list[str] = []
    missing: list[str] = []
    for entry in pending.plan.get("tables", []):
        name = str(entry.get("name", entry.get("uri", "?")))
        try:
            done = DeltaTable(entry["uri"]).transaction_version(app) is not None
        except Exception:  # a folder gone or broken by hand: nothing there to read
            done = False
        (landed if done else missing).append(name)
    return landed, missing


def _stream_names(catalog: Catalog, pending: PendingCommit) -> list[str]:
    names = []
    for claim in pending.claims:
        stream = catalog.get_stream_by_id(claim.stream_id)
        names.append(stream.full_name if stream else f"#{claim.stream_id} (dropped)")
    return names


def pending_status(catalog: Catalog) -> list[CommitStatus]:
    """Every pending commit, with which of its tables already hold its change."""
    now = time.time()
    rows = []
    for pending in catalog.pending_commits():
        landed, _ = _landed(pending) if pending.decided else ([], [])
        tables = [str(t.get("name", t.get("uri", "?"))) for t in pending.plan.get("tables", [])]
        age = max(0.0, now - pending.created_at)
        rows.append(CommitStatus(
            pending.id, pending.state, owner_alive(pending.owner), age, tuple(tables),
            tuple(landed), tuple(_stream_names(catalog, pending)),
            str(pending.plan.get("statement", ""))[:500],
        ))  # fmt: skip
    return rows


def abandon_commit(catalog: Catalog, commit_id: int) -> str:
    """Give up a pending commit that cannot complete; returns what happened, in words.

    First the commit is rolled forward once more: if that works, nothing is given up.
    Otherwise it is taken over (compare-and-swap, so no recovery works on it meanwhile)
    and ended: one that no table holds yet is abandoned whole (its streams keep their
    offsets: nothing lost, nothing delivered twice); one that some tables already hold
    ends there: its streams move past what it consumed (those tables have the rows) and
    the tables without its change never get it.

    Raises:
        ObjectNotFoundError: no pending commit has this id.
        SqlError: COMMIT_IN_PROGRESS while its owner is alive and working on it.
    """
    pending = _find(catalog, commit_id)
    if owner_alive(pending.owner):
        raise SqlError(
            f"commit {commit_id} is being rolled forward by a live process ({pending.owner}); "
            "it ends by itself: wait, and SHOW PENDING COMMITS again",
            "COMMIT_IN_PROGRESS",
        )
    recover_pending(catalog, only={commit_id})
    if not any(p.id == commit_id for p in catalog.pending_commits()):
        return (f"commit {commit_id} completed on this try: every table has its change, "
                "nothing was given up.")
    pending = _find(catalog, commit_id)
    me = new_owner()
    IN_FLIGHT.add(me)
    try:
        if owner_alive(pending.owner) or not catalog.take_over_commit(commit_id, pending.owner, me):
            raise SqlError(f"commit {commit_id} was taken by another process meanwhile; SHOW "
                           "PENDING COMMITS, then try again", "COMMIT_IN_PROGRESS")  # fmt: skip
        if not pending.decided:
            catalog.abandon_commit(commit_id)
            return f"commit {commit_id} was not decided and had written nothing; it is abandoned."
        landed, missing = _landed(pending)
        streams = _stream_names(catalog, pending)
        if not landed:
            catalog.abandon_commit(commit_id)
            message = (
                f"commit {commit_id} abandoned: no table had its change, so nothing of it "
                "is applied; the streams it consumed"
                f"{' (' + ', '.join(streams) + ')' if streams else ''} keep their offsets."
            )
        else:
            catalog.finish_commit(commit_id)
            message = (
                f"commit {commit_id} abandoned HALF-APPLIED: {', '.join(landed)} hold its "
                f"change, {', '.join(missing)} never will (rows it wrote there are lost; "
                "write them again if needed)"
                + (f"; streams {', '.join(streams)} moved past what it consumed" if streams else "")
                + "."
            )
        log.warning("operator gave up pipeline commit %d: %s", commit_id, message)
        return message
    finally:
        IN_FLIGHT.discard(me)


def _find(catalog: Catalog, commit_id: int) -> PendingCommit:
    for pending in catalog.pending_commits():
        if pending.id == commit_id:
            return pending
    raise ObjectNotFoundError(
        f"no pending commit {commit_id}: it ended already, or never was "
        "(SHOW PENDING COMMITS lists the pending ones)"
    )
