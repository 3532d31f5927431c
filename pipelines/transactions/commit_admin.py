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
from flush.change_commit import landed_version
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.transactions.commit import commit_app_id, recover_pending
from pipelines.transactions.commit_owner import IN_FLIGHT, new_owner, owner_alive

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


def _landed(pending: PendingCommit) -> tuple[list[str], list[str], list[str]]:
    """The commit's tables split into those whose log holds its change, those whose log
    does not, and those whose log cannot be read now (unknown: never taken for either)."""
    app = commit_app_id(pending)
    landed: list[str] = []
    missing: list[str] = []
    unknown: list[str] = []
    for entry in pending.plan.get("tables", []):
        name = str(entry.get("name", entry.get("uri", "?")))
        try:
            found = landed_version(DeltaTable(entry["uri"]), app, int(entry["base_version"]))
        except Exception as exc:  # a folder gone or broken: say so, decide nothing
            log.warning("cannot read %s for pending commit %d: %s", name, pending.id, exc)
            unknown.append(name)
            continue
        (landed if found is not None else missing).append(name)
    return landed, missing, unknown


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
        landed, _, unknown = _landed(pending) if pending.decided else ([], [], [])
        landed += [f"{name} (unreadable)" for name in unknown]
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

    A decided commit is first rolled forward once more: if that works, nothing is given
    up. Otherwise it is taken over (compare-and-swap, so no recovery works on it
    meanwhile) and ended by what the tables' logs say: one that every table holds is
    finished; one that no table holds is abandoned whole (its streams keep their
    offsets: nothing lost, nothing delivered twice); one that some tables hold ends
    there: its streams move past what it consumed (those tables have the rows) and the
    tables without its change never get it. An undecided commit wrote nothing and is
    abandoned.

    Raises:
        ObjectNotFoundError: no pending commit has this id.
        SqlError: COMMIT_STATE_UNKNOWN when a table's log cannot be read (nothing given up).
        SqlError: COMMIT_IN_PROGRESS while its owner is alive and working on it.
    """
    pending = _find(catalog, commit_id)
    if owner_alive(pending.owner):
        raise SqlError(
            f"commit {commit_id} is being worked on by a live process ({pending.owner}); "
            "wait, SHOW PENDING COMMITS again, and run ABANDON COMMIT again if it is still "
            "there",
            "COMMIT_IN_PROGRESS",
        )
    if pending.decided:
        recover_pending(catalog, only={commit_id})  # one more try: nothing given up if it works
        if not any(p.id == commit_id for p in catalog.pending_commits()):
            return (f"commit {commit_id} completed: every table has its change, nothing "
                    "was given up.")  # fmt: skip
        pending = _find(catalog, commit_id)
    me = new_owner()
    IN_FLIGHT.add(me)
    try:
        if owner_alive(pending.owner) or not catalog.take_over_commit(commit_id, pending.owner, me):
            raise SqlError(f"commit {commit_id} was taken by another process meanwhile; SHOW "
                           "PENDING COMMITS, then try again", "COMMIT_IN_PROGRESS")  # fmt: skip
        if not pending.decided:
            catalog.abandon_commit(commit_id)
            return (f"commit {commit_id} was not decided and had written nothing; it is "
                    "abandoned, and its streams keep their offsets.")  # fmt: skip
        message = _end_decided(catalog, pending)
        log.warning("operator gave up pipeline commit %d: %s", commit_id, message)
        return message
    except BaseException:
        catalog.release_commit(commit_id, me)  # still pending: for recovery, or ABANDON again
        raise
    finally:
        IN_FLIGHT.discard(me)


def _end_decided(catalog: Catalog, pending: PendingCommit) -> str:
    """End a decided commit this process has taken over (see :func:`abandon_commit`)."""
    landed, missing, unknown = _landed(pending)
    if unknown:
        raise SqlError(
            f"cannot tell whether commit {pending.id} landed in {', '.join(unknown)}: its log "
            "cannot be read now (the log says why); nothing was given up. Make the table "
            "readable, then run ABANDON COMMIT again",
            "COMMIT_STATE_UNKNOWN",
        )
    streams = _stream_names(catalog, pending)
    if not missing:  # only the catalog's last step was left
        catalog.finish_commit(pending.id)
        return (f"commit {pending.id} completed: every table has its change, nothing was "
                "given up.")  # fmt: skip
    if not landed:
        catalog.abandon_commit(pending.id)
        return (
            f"commit {pending.id} abandoned: no table had its change, so nothing of it is "
            "applied; the streams it consumed"
            f"{' (' + ', '.join(streams) + ')' if streams else ''} keep their offsets."
        )
    catalog.finish_commit(pending.id)
    return (
        f"commit {pending.id} abandoned HALF-APPLIED: {', '.join(landed)} hold its change, "
        f"{', '.join(missing)} never will (rows it wrote there are lost; write them again "
        "if needed)"
        + (f"; streams {', '.join(streams)} moved past what it consumed" if streams else "")
        + "."
    )


def _find(catalog: Catalog, commit_id: int) -> PendingCommit:
    for pending in catalog.pending_commits():
        if pending.id == commit_id:
            return pending
    raise ObjectNotFoundError(
        f"no pending commit {commit_id}: it ended already, or never was "
        "(SHOW PENDING COMMITS lists the pending ones)"
    )
