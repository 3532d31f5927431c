"""Pending pipeline commits in the SQLite catalog: reservations with write intents,
decisions that claim streams, hand-over between owners, and the end of a commit.

Kept apart from :mod:`catalog.sqlite` so the commit protocol's catalog half reads in
one place. Every operation is one ``BEGIN IMMEDIATE`` transaction, so two processes
reserving, deciding or taking over the same commit serialise on SQLite's write lock.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from catalog.base import CommitGoneError, IntentConflict, StreamClaimConflict, TablesGoneError
from catalog.records import CommitIntent, PendingCommit, StreamClaim
from catalog.sqlite_change_streams import seal_commit
from catalog.sqlite_dynamic import claim_refresh, finish_refresh, release_refresh
from catalog.sqlite_layout import PENDING_COLUMNS, claims_text, to_claim, to_pending

if TYPE_CHECKING:
    from catalog.sqlite import _Transaction

__all__ = ["SCHEMA_VERSION", "PendingCommitStore", "ensure_catalog_id"]


#: The layout's version, kept in ``catalog_meta``: a program refuses a catalog a newer
#: one laid out (it would misread it); a newer program brings an older one up to date
#: (``ADDED_COLUMNS``) and writes its own number.
#: 2: channels.committed_position, leases; 3: tables.positions_from, channels.server.
SCHEMA_VERSION = 3


def ensure_catalog_id(db: sqlite3.Connection) -> None:
    """Give a new (or pre-id) catalog its random id and layout version, and older streams
    their uids.

    Raises:
        RuntimeError: a newer program laid the catalog out.
    """
    db.execute(
        "INSERT INTO catalog_meta (key, value) VALUES ('catalog_id', ?) ON CONFLICT DO NOTHING",
        (uuid.uuid4().hex,),
    )
    row = db.execute("SELECT value FROM catalog_meta WHERE key='schema_version'").fetchone()
    if row is not None and int(row[0]) > SCHEMA_VERSION:
        raise RuntimeError(
            f"the catalog's layout is version {row[0]}, newer than this program's "
            f"{SCHEMA_VERSION}: a newer version of the service wrote it; run that version"
        )
    db.execute(
        "INSERT INTO catalog_meta (key, value) VALUES ('schema_version', ?)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (str(SCHEMA_VERSION),),
    )
    for (stream_id,) in db.execute("SELECT id FROM streams WHERE uid = ''").fetchall():
        db.execute("UPDATE streams SET uid=? WHERE id=?", (uuid.uuid4().hex, stream_id))


def _pending(db: sqlite3.Connection) -> list[PendingCommit]:
    return [to_pending(row) for row in db.execute(f"SELECT {PENDING_COLUMNS} FROM pending_commits")]


class PendingCommitStore:
    """The pending-commit half of :class:`catalog.sqlite.SqliteCatalog` (a mixin)."""

    if TYPE_CHECKING:

        def _immediate(self) -> _Transaction: ...
        def _read(self, sql: str, args: tuple = ()) -> list[tuple]: ...  # type: ignore[type-arg]

    def catalog_id(self) -> str:
        return str(self._read("SELECT value FROM catalog_meta WHERE key='catalog_id'")[0][0])

    def reserve_commit(
        self, owner: str, plan: dict[str, Any], intents: Sequence[CommitIntent]
    ) -> PendingCommit:
        now = time.time()
        intents = tuple(intents)
        with self._immediate() as db:
            holders = sorted(
                p.id
                for p in _pending(db)
                if any(mine.conflicts_with(theirs) for mine in intents for theirs in p.intents)
            )
            if holders:
                raise IntentConflict(holders)
            gone = [i.table_id for i in intents if db.execute(
                "SELECT 1 FROM tables WHERE id=?", (i.table_id,)).fetchone() is None]  # fmt: skip
            if gone:  # checked with the intents: a drop comes before, or is refused after
                raise TablesGoneError(gone)
            cursor = db.execute(
                "INSERT INTO pending_commits (owner, plan, claims, created_at, state, intents)"
                " VALUES (?, ?, '[]', ?, 'preparing', ?) RETURNING id",
                (owner, orjson.dumps(plan).decode(), now,
                 orjson.dumps([(i.table_id, i.kind) for i in intents]).decode()),
            )  # fmt: skip
            commit_id = int(cursor.fetchone()[0])
        return PendingCommit(commit_id, owner, plan, (), now, "preparing", intents)

    def decide_commit(self, commit_id: int, claims: Sequence[StreamClaim]) -> PendingCommit:
        with self._immediate() as db:
            row = db.execute(
                f"SELECT {PENDING_COLUMNS} FROM pending_commits WHERE id=?", (commit_id,)
            ).fetchone()
            if row is None:
                raise CommitGoneError(f"pending commit {commit_id} is no longer recorded")
            lost = []
            for claim in claims:
                stream = db.execute(
                    "SELECT offset_version, claimed_by FROM streams WHERE id=?",
                    (claim.stream_id,),
                ).fetchone()
                if (
                    stream is None
                    or stream[0] != claim.expected
                    or stream[1] not in (None, commit_id)
                    or claim.new < claim.expected  # an offset never moves back
                ):
                    lost.append(claim.stream_id)
            if lost:
                raise StreamClaimConflict(lost)
            claim_refresh(db, commit_id, orjson.loads(row[2]))
            seq = db.execute("SELECT coalesce(max(decided_seq), 0) + 1 FROM pending_commits")
            decided_seq = int(seq.fetchone()[0])
            db.execute(
                "UPDATE pending_commits SET claims=?, state='decided', decided_seq=? WHERE id=?",
                (claims_text(claims), decided_seq, commit_id),
            )
            for claim in claims:
                db.execute(
                    "UPDATE streams SET claimed_by=? WHERE id=?", (commit_id, claim.stream_id)
                )
        pending = to_pending(row)
        return PendingCommit(pending.id, pending.owner, pending.plan, tuple(claims),
                             pending.created_at, "decided", pending.intents,
                             decided_seq)  # fmt: skip

    def finish_commit(
        self, commit_id: int, versions: Mapping[int, int] | None = None, floor_us: int = 0
    ) -> None:
        now = time.time()
        with self._immediate() as db:
            row = db.execute("SELECT claims, plan FROM pending_commits WHERE id=?", (commit_id,))
            found = row.fetchone()
            if found is None:
                return  # finished already (recovery and the owner may both try)
            plan = orjson.loads(found[1])
            finish_refresh(db, commit_id, plan, versions or {})
            seal_commit(db, plan, versions or {}, floor_us)
            for claim in map(to_claim, orjson.loads(found[0])):
                moved = db.execute(
                    "UPDATE streams SET offset_version=?, offset_moved_at=?, claimed_by=NULL"
                    " WHERE id=? AND claimed_by=?",
                    (claim.new, now, claim.stream_id, commit_id),
                ).rowcount
                for table_id, version in claim.bases if moved else ():  # a stream on a view
                    db.execute(
                        "UPDATE stream_offsets SET version=? WHERE stream_id=? AND table_id=?",
                        (version, claim.stream_id, table_id),
                    )
            db.execute("DELETE FROM pending_commits WHERE id=?", (commit_id,))

    def abandon_commit(self, commit_id: int) -> None:
        with self._immediate() as db:
            db.execute("UPDATE streams SET claimed_by=NULL WHERE claimed_by=?", (commit_id,))
            release_refresh(db, commit_id)
            db.execute("DELETE FROM pending_commits WHERE id=?", (commit_id,))

    def take_over_commit(self, commit_id: int, owner: str, new_owner: str) -> bool:
        with self._immediate() as db:
            cursor = db.execute(
                "UPDATE pending_commits SET owner=? WHERE id=? AND owner=?",
                (new_owner, commit_id, owner),
            )
            return cursor.rowcount == 1

    def release_commit(self, commit_id: int, owner: str) -> None:
        self.take_over_commit(commit_id, owner, "")

    def pending_commits(self) -> list[PendingCommit]:
        rows = self._read(f"SELECT {PENDING_COLUMNS} FROM pending_commits ORDER BY id")
        return [to_pending(row) for row in rows]
