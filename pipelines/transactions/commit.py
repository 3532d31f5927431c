"""The consumer commit: how a transaction's writes and stream offsets become durable
together, once, or not at all, across any number of tables. Stream consumption, DML
and TRUNCATE use it; dynamic-table refreshes will too.

Delta has no multi-table transaction, so the decision is made in the catalog, in four
steps: **reserve** write intents on every table (two transactions that update or delete
rows of one table never hold intents together; appends never conflict), **validate**
every table (no row this transaction changes was changed since it read it: the first
committer wins, and the loser changes nothing), **decide** (claim the consumed streams
by compare-and-swap), **roll forward** (one Delta commit per table, then the offsets
move and the intents go). Once decided, a commit is only ever rolled forward: its
intents keep every other pipeline writer off its rows, and appends, flushes and
compaction cannot make a table's change impossible to apply. A commit whose owner
died (or gave up) is rolled forward by the next writer that needs its tables, the
next session that opens the catalog, or the service's recovery task. Each table's
Delta commit carries the commit's app id, unique to this catalog, so a roll-forward
never applies a table's change twice.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from deltalake import DeltaTable
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from catalog import (
    APPEND_INTENT,
    REFRESH_PLAN_KEY,
    ROWS_INTENT,
    Catalog,
    CommitGoneError,
    CommitIntent,
    IntentConflict,
    PendingCommit,
    StreamClaim,
    StreamClaimConflict,
    StreamRecord,
    TableBusyError,
    TableInfo,
    TablesGoneError,
)
from flush.change_commit import (
    ChangeSet,
    ConcurrentChangeError,
    StagedChange,
    check_unchanged,
    commit_staged,
    stage_change_set,
)
from flush.commit_clock import clock
from flush.failpoints import failpoint
from pipelines.errors import SqlError, StreamConflictError, TransactionConflictError
from pipelines.transactions.commit_owner import IN_FLIGHT, new_owner, owner_alive
from pipelines.transactions.statement_deadline import past_deadline

__all__ = [
    "TableWrites",
    "busy_message",
    "commit_consumer",
    "recover_pending",
    "stream_app_id",
    "when_free",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How long a writer waits for another transaction's intents on its tables (a live
#: owner rolling forward) before it gives up with TABLE_BUSY.
INTENT_WAIT_SECONDS = 30.0


def stream_app_id(stream: StreamRecord) -> str:
    """The Delta app-transaction id a consumption of the stream carries on its targets."""
    return f"ingest-stream:{stream.uid or stream.id}"


def commit_app_id(pending: PendingCommit) -> str:
    """The app transaction that marks the commit in each table's log: the catalog's id
    and a random one (a catalog restored from a backup never reuses it)."""
    return pending.plan.get("app_id") or f"ingest-pipeline-commit:{pending.id}"


@dataclass(slots=True)
class TableWrites:
    """What one transaction writes to one table, computed on ``base_version``."""

    info: TableInfo
    base_version: int
    change: ChangeSet


def _after_earlier(catalog: Catalog, pending: PendingCommit) -> None:
    """Wait until no commit of several tables decided before this one (also of several
    tables) and sharing a table with it is pending: completing it if its owner is dead,
    for up to :data:`INTENT_WAIT_SECONDS` if alive (then :class:`TableBusyError`).

    So commits of several tables write a table they share in the order of their
    decisions, each after the one before ended, and the end of each can give every one
    of its versions one change stream moment: no other commit's held version lies below
    its own (:func:`catalog.sqlite_change_streams.seal_commit`). Decision order has no
    cycles, so neither do the waits."""
    tables = pending.held
    if not tables:
        return

    def attempt_once() -> None:
        earlier = [
            p.id for p in catalog.pending_commits()
            if p.decided and p.id != pending.id and p.decided_seq < pending.decided_seq
            and p.held & tables
        ]  # fmt: skip
        if earlier:
            raise TableBusyError(sorted(tables), earlier)

    _wait_for_holders(catalog, attempt_once)


def _roll_forward(catalog: Catalog, pending: PendingCommit) -> dict[int, int]:
    """The last step of :func:`commit_consumer` for a decided commit; idempotent."""
    _after_earlier(catalog, pending)
    versions: dict[int, int] = {}
    app_transactions = pending.plan.get("app_transactions") or {
        f"ingest-stream:{c.stream_id}": c.new
        for c in pending.claims  # an older plan
    }
    for entry in pending.plan["tables"]:
        staged = StagedChange.from_dict(entry["staged"]) if entry["staged"] else None
        versions[entry["table_id"]] = commit_staged(
            entry["uri"],
            staged,
            commit_app=commit_app_id(pending),
            base_version=entry["base_version"],
            app_transactions=app_transactions,
            metadata={**pending.plan.get("metadata", {}),
                      "statement": pending.plan.get("statement", "")[:500], "commit": pending.id},
        )  # fmt: skip
        failpoint("pipeline_between_tables")
    failpoint("pipeline_before_finish")
    # The offsets move, the intents go, and (several tables) the versions get one moment.
    catalog.finish_commit(pending.id, versions, floor_us=clock())
    return versions


def commit_consumer(
    catalog: Catalog,
    writes: Sequence[TableWrites],
    claims: Sequence[StreamClaim],
    statement: str,
    stream_apps: dict[int, str],
    *,
    app_transactions: dict[str, int] | None = None,
    metadata: dict[str, object] | None = None,
    refresh: dict[str, object] | None = None,
) -> dict[int, int]:
    """Commit a transaction's writes and move the streams it consumed; returns each
    table's new version.

    A dynamic table's refresh passes ``refresh`` (the claim on its next refresh, see
    :data:`catalog.REFRESH_PLAN_KEY`: decided by compare-and-swap, recorded at the
    end), ``app_transactions`` (each source version it read, carried by its commit) and
    ``metadata`` (kept in the commit's metadata).

    Steps:
      1. Stage each table's change set as a Parquet file in the table folder (fsync).
      2. Reserve: record the commit (``preparing``) with a write intent per table;
         wait while another commit holds a conflicting intent (helping it if its owner
         is dead).
      3. Validate every table: rows this transaction updates or deletes must be as it
         read them. Otherwise it is abandoned having changed nothing.
      4. Decide: claim the streams (their offsets must be as read) and mark the commit
         ``decided``, in one catalog transaction.
      5. Roll forward: one Delta commit per table (its rows, an app transaction per
         consumed stream, the commit's app id), then move the offsets and drop the
         intents in one catalog transaction.
    A crash after step 4 is rolled forward by :func:`recover_pending`; before it,
    nothing happened (the staged files are unreferenced and vacuumed in time).

    Raises:
        StreamConflictError: another transaction consumed a stream first.
        TransactionConflictError: another writer changed rows this one changes.
        SqlError: TABLE_BUSY (another live transaction held the tables too long),
            COMMIT_PENDING (decided, the roll-forward failed; recovery completes it).
    """
    plan_tables, intents = [], []
    for item in writes:  # Step 1
        change = item.change
        empty = not change.replaces and change.rows.num_rows == 0 and len(change.deleted) == 0
        staged = None if empty else stage_change_set(item.info.uri, change)
        plan_tables.append({"table_id": item.info.id, "uri": item.info.uri,
                            "name": item.info.full_name, "base_version": item.base_version,
                            "staged": staged.to_dict() if staged else None})  # fmt: skip
        rows = staged is not None and staged.changes_rows
        intents.append(CommitIntent(item.info.id, ROWS_INTENT if rows else APPEND_INTENT))
    failpoint("pipeline_after_stage")
    plan = {
        "tables": plan_tables,
        "statement": statement[:500],
        "app_id": f"ingest-pipeline-commit:{catalog.catalog_id()}:{uuid.uuid4().hex}",
        "app_transactions": {**{stream_apps[c.stream_id]: c.new for c in claims},
                             **(app_transactions or {})},
        "stream_apps": {str(k): v for k, v in stream_apps.items()},
        "metadata": metadata or {},
    }  # fmt: skip
    if refresh is not None:
        plan[REFRESH_PLAN_KEY] = refresh
    owner = new_owner()
    IN_FLIGHT.add(owner)
    try:
        pending = _reserve(catalog, owner, plan, intents)  # Step 2
    except BaseException:
        IN_FLIGHT.discard(owner)
        raise
    try:
        failpoint("pipeline_after_reserve")
        _validate(catalog, pending, claims)  # Step 3
        failpoint("pipeline_after_validate")
        pending = _decide(catalog, pending, claims)  # Step 4
        failpoint("pipeline_after_decide")
        return _roll_forward(catalog, pending)  # Step 5
    except BaseException as exc:
        if _give_up(catalog, pending.id, owner) and isinstance(exc, Exception):
            raise _pending_error(pending, exc) from exc
        raise
    finally:
        IN_FLIGHT.discard(owner)


def _give_up(catalog: Catalog, commit_id: int, owner: str) -> bool:
    """After a failure: abandon the commit if undecided (it wrote nothing), release it
    to recovery if decided (returns True then). Never raises: the first error counts."""
    try:
        for pending in catalog.pending_commits():
            if pending.id == commit_id and pending.owner == owner:
                if pending.decided:
                    catalog.release_commit(commit_id, owner)
                    return True
                catalog.abandon_commit(commit_id)
    except Exception:
        log.exception("could not hand pipeline commit %d to recovery", commit_id)
        return True
    return False


def _reserve(
    catalog: Catalog, owner: str, plan: dict, intents: list[CommitIntent]
) -> PendingCommit:
    """Step 2, waiting for (or helping) the commits in the way (:func:`_wait_for_holders`)."""
    mine = sorted({i.table_id for i in intents})

    def attempt_once() -> PendingCommit:
        try:
            return catalog.reserve_commit(owner, plan, intents)
        except IntentConflict as conflict:
            raise TableBusyError(mine, conflict.holders) from None

    try:
        return _wait_for_holders(catalog, attempt_once)
    except TableBusyError as busy:
        theirs = {i.table_id for p in catalog.pending_commits() if p.id in busy.commit_ids
                  for i in p.intents}  # fmt: skip
        busy.table_ids = sorted(set(mine) & theirs) or mine
        raise SqlError(busy_message(catalog, busy), "TABLE_BUSY") from None
    except TablesGoneError as gone:
        names = [t["name"] for t in plan["tables"] if t["table_id"] in gone.table_ids]
        raise TransactionConflictError(
            f"table(s) {', '.join(names)} were dropped or replaced by another writer after "
            "this transaction read them; this transaction changed nothing"
        ) from None


def _validate(catalog: Catalog, pending: PendingCommit, claims: Sequence[StreamClaim]) -> None:
    """Step 3: every table, before anything is written; abandons on a conflict."""
    _check_offsets(catalog, pending, claims)
    for entry in pending.plan["tables"]:
        staged = StagedChange.from_dict(entry["staged"]) if entry["staged"] else None
        try:
            check_unchanged(entry["uri"], staged, entry["base_version"],
                            f" in {entry.get('name', entry['uri'])}")  # fmt: skip
        except ConcurrentChangeError as exc:
            catalog.abandon_commit(pending.id)
            raise TransactionConflictError(
                f"{exc}: the other writer committed first, and this transaction changed "
                "nothing (no table, no stream); run it again"
            ) from exc


def _check_offsets(catalog: Catalog, pending: PendingCommit, claims: Sequence[StreamClaim]) -> None:
    """A target whose log holds a stream's app transaction past the stream's offset was
    fed by a consumption the catalog does not remember (a catalog restored from an older
    backup): consuming from the offset would deliver those changes twice. The offset
    moves to the log's version and the transaction fails, having changed nothing."""
    apps = pending.plan.get("stream_apps", {})
    for claim in claims:
        app = apps.get(str(claim.stream_id))
        stream = catalog.get_stream_by_id(claim.stream_id)
        if stream is not None and stream.claimed_by not in (None, pending.id):
            continue  # another pending commit's consumption: step 4 settles it
        for entry in pending.plan["tables"] if app else ():
            landed = DeltaTable(entry["uri"]).transaction_version(app)
            if landed is None or landed <= claim.expected:
                continue
            catalog.abandon_commit(pending.id)
            name = stream.full_name if stream else f"#{claim.stream_id}"
            if claim.bases:  # on a view: the base offsets of that consumption are unknown
                raise StreamConflictError(
                    f"stream {name} was already consumed into {entry.get('name', entry['uri'])} "
                    "past its offsets in the catalog (a catalog restored from an older "
                    "backup?); this transaction changed nothing. Recreate the stream with "
                    "CREATE OR REPLACE STREAM ... ON VIEW (it starts at the current versions)"
                )
            with contextlib.suppress(StreamClaimConflict):  # moved meanwhile: nothing to do
                moved = StreamClaim(claim.stream_id, claim.expected, landed)
                catch_up = catalog.begin_commit(new_owner(), {"tables": []}, [moved])
                catalog.finish_commit(catch_up.id)
            raise StreamConflictError(
                f"stream {name} was already consumed up to version {landed} into "
                f"{entry.get('name', entry['uri'])}, past its offset {claim.expected} in the "
                "catalog (a catalog restored from an older backup?); its offset moved to "
                f"{landed}, and this transaction changed nothing: run it again to consume "
                "the changes after it"
            )


def _decide(
    catalog: Catalog, pending: PendingCommit, claims: Sequence[StreamClaim]
) -> PendingCommit:
    """Step 4; a stream held by a dead consumer's commit is recovered first, once."""
    for last in (False, True):
        try:
            return catalog.decide_commit(pending.id, claims)
        except CommitGoneError as exc:  # taken for dead and abandoned: nothing was written
            raise TransactionConflictError(
                "this transaction's commit was abandoned by recovery before it was decided; "
                "it changed nothing, run it again"
            ) from exc
        except StreamClaimConflict:
            if last or not recover_pending(catalog):
                catalog.abandon_commit(pending.id)
                raise _lost(catalog, claims) from None
    raise AssertionError("unreachable")  # pragma: no cover


def when_free(
    catalog: Catalog,
    action: Callable[[], T],
    table_ids: Sequence[int] = (),
    decided_only: bool = False,
    read_only: bool = False,
) -> T:
    """Run ``action`` once no pending commit (``decided_only``: no decided one) names
    ``table_ids`` or, for a drop, the tables it drops: a commit of a dead owner is
    completed first, a live one is waited for up to :data:`INTENT_WAIT_SECONDS` (or the
    statement's deadline); then :class:`TableBusyError` goes to the caller.

    Drops wait for every pending commit (its roll-forward must find the table); a
    transaction pinning a table waits for decided ones, so that it reads every commit
    decided before it (snapshot isolation) and not a table half-way through one. A
    ``read_only`` statement (a query alone, writing nothing) runs at once, on the last
    committed versions, when a commit in the way cannot complete (its roll-forward just
    failed): it reads what any Delta reader reads, instead of nothing until an operator
    mends the damage."""

    def attempt_once() -> T:
        if holders := catalog.commits_holding(table_ids, decided_only):
            raise TableBusyError(sorted(table_ids), holders)
        return action()

    return _wait_for_holders(catalog, attempt_once, action if read_only else None)


def _wait_for_holders(
    catalog: Catalog, attempt_once: Callable[[], T], when_hopeless: Callable[[], T] | None = None
) -> T:
    """Run ``attempt_once``, which raises :class:`TableBusyError` while pending commits
    are in the way, until it passes: after each refusal the commits of dead owners are
    completed (:func:`_helped`) and live ones waited for, up to
    :data:`INTENT_WAIT_SECONDS` or the statement's deadline (then STATEMENT_TIMEOUT);
    the last refusal goes to the caller, at once if completing a commit in the way just
    failed (or ``when_hopeless`` runs instead)."""

    def help_holders(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, TableBusyError) and not _helped(catalog, error.commit_ids):
            raise _Hopeless(error)

    attempts = Retrying(
        retry=retry_if_exception_type(TableBusyError),
        stop=stop_after_delay(INTENT_WAIT_SECONDS) | _PastDeadline(),
        wait=wait_random_exponential(multiplier=0.02, max=0.5),
        before_sleep=help_holders,
        reraise=True,
    )
    try:
        return attempts(attempt_once)
    except _Hopeless as hopeless:
        if when_hopeless is not None:
            log.warning("reading past pending commit(s) %s, whose completion failed: "
                        "the last committed versions", hopeless.busy.commit_ids)  # fmt: skip
            return when_hopeless()
        raise hopeless.busy from None
    except TableBusyError:
        if past_deadline():
            raise SqlError(
                "the statement's timeout passed while it waited for another transaction's "
                "commit on its tables to end; it changed nothing: run it again when that "
                "commit ends (SHOW PENDING COMMITS lists them), or raise the timeout",
                "STATEMENT_TIMEOUT",
            ) from None
        raise


class _PastDeadline(stop_base):
    """Stop waiting once the statement's deadline has passed."""

    def __call__(self, retry_state: RetryCallState) -> bool:
        return past_deadline()


class _Hopeless(Exception):
    """Waiting will not end the commits in the way: their recovery just failed."""

    def __init__(self, busy: TableBusyError) -> None:
        super().__init__(str(busy))
        self.busy = busy


def _helped(catalog: Catalog, commit_ids: Sequence[int]) -> bool:
    """Complete the commits in the way whose owner is gone; False if one of them is
    still pending with no live owner (its roll-forward failed: the log says why), so
    that waiting for it is pointless; True if waiting may help."""
    recover_pending(catalog, only=set(commit_ids))
    return not any(
        p.id in commit_ids and not owner_alive(p.owner) for p in catalog.pending_commits()
    )


def busy_message(catalog: Catalog, error: TableBusyError) -> str:
    """Why a table cannot be dropped, replaced or read now, and what to do."""
    names = []
    for table_id in error.table_ids:
        info = catalog.get_table_by_id(table_id)
        names.append(info.full_name if info else f"#{table_id}")
    holders = [p for p in catalog.pending_commits() if p.id in error.commit_ids]
    what = "; ".join(
        f"commit {p.id}, {p.state}, of {p.plan.get('statement', '')[:160]!r}" for p in holders
    )
    return (
        f"table(s) {', '.join(names)} are written by another transaction's pending commit "
        f"({what or 'ended meanwhile'}), which did not end within {INTENT_WAIT_SECONDS:.0f} s "
        "or whose completion failed (the log says why; every writer, session and the "
        "service's recovery tries again); this statement changed nothing: run it again "
        "when that commit ends. SHOW PENDING COMMITS lists it; one that cannot complete "
        "is given up with ABANDON COMMIT <id>"
    )


def _pending_error(pending: PendingCommit, exc: BaseException) -> SqlError:
    return SqlError(
        f"commit {pending.id} is decided but not finished ({type(exc).__name__}: {exc}); the "
        "next writer of its tables, the next session on this warehouse or the service's "
        "recovery completes it",
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


def recover_pending(catalog: Catalog, only: set[int] | None = None) -> int:
    """Complete every pending commit (or those in ``only``) whose owner is gone or gave
    up; returns how many ended. A decided one is rolled forward, one still preparing is
    abandoned (it wrote nothing). Each is first taken over by compare-and-swap, so one
    process at a time works on it."""
    done = 0
    for pending in catalog.pending_commits():
        if (only is not None and pending.id not in only) or owner_alive(pending.owner):
            continue
        me = new_owner()
        IN_FLIGHT.add(me)
        if not catalog.take_over_commit(pending.id, pending.owner, me):
            IN_FLIGHT.discard(me)
            continue  # another process or thread took it first
        try:
            if not pending.decided:
                catalog.abandon_commit(pending.id)
                log.info("abandoned undecided pipeline commit %d of %s", pending.id, pending.owner)
            else:
                _roll_forward(catalog, pending)
                log.info("rolled forward pipeline commit %d of %s", pending.id, pending.owner)
            done += 1
        except Exception:  # retried by the next recovery; never stops a session opening
            log.exception("rolling forward pipeline commit %d failed; it stays pending "
                          "for the next recovery", pending.id)  # fmt: skip
            catalog.release_commit(pending.id, me)
        finally:
            IN_FLIGHT.discard(me)
    return done
