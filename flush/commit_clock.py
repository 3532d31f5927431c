"""One clock for "when": a commit timestamp stamped into every commit's metadata,
strictly increasing per table whatever the writers' clocks say.

Delta's own ``timestamp`` is each writer's wall clock, so two writers with skewed
clocks (or one whose clock steps back) can commit a later version with an earlier
time, and delta-rs refuses Delta's in-commit timestamps. Every commit path of
:mod:`flush` therefore stamps ``ingest.commit_ts`` (microseconds since the epoch) =
max(now, the previous version's stamp + 1), computed on the version it commits on,
and commits with ``max_commit_retries=0``: delta-rs must not move the commit to a
later version on its own (it would, silently, for an append), because the stamp was
computed for the next version only. A commit refused that way is retried by the
caller on the newest version, with a new stamp. Data timestamps, "the newest version
committed at T" and ``AT (TIMESTAMP => ...)`` read these stamps.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from deltalake import CommitProperties, DeltaTable, Transaction

from flush.storage import read_bytes
from flush.tables import logged_versions

__all__ = [
    "COMMIT_TS_KEY",
    "commit_actions",
    "commit_info",
    "commit_ts",
    "next_commit_ts",
    "now_us",
    "stamped",
    "table_folder",
    "version_at",
]

log = logging.getLogger(__name__)

#: The commit metadata key of the stamp (microseconds since the epoch, as text).
COMMIT_TS_KEY = "ingest.commit_ts"


def now_us() -> int:
    """The wall clock in microseconds since the epoch (tests replace it to skew writers)."""
    return time.time_ns() // 1000


#: The clock every stamp reads; a test skews a writer by replacing it.
clock: Callable[[], int] = now_us


def table_folder(table: DeltaTable) -> str:
    """The table's folder as a plain path (``table_uri`` is a ``file://`` URI)."""
    uri = table.table_uri
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        uri = unquote(urlparse(uri).path)
    return uri.rstrip("/")


def commit_actions(table_uri: str, version: int) -> list[dict[str, Any]] | None:
    """The actions of one version, read from its commit file (one JSON object a line);
    None once log cleanup removed the file."""
    content = read_bytes(table_uri, f"_delta_log/{version:020d}.json")
    if content is None:
        return None
    return [orjson.loads(line) for line in content.splitlines() if line.strip()]


def commit_info(table_uri: str, version: int) -> dict[str, Any] | None:
    """The ``commitInfo`` of one version, read from its commit file (delta-rs' history
    labels entries from the loaded version, so a commit landing meanwhile shifts them);
    None once log cleanup removed the file."""
    actions = commit_actions(table_uri, version)
    if actions is None:
        return None
    for action in actions:
        if "commitInfo" in action:
            info: dict[str, Any] = action["commitInfo"]
            return info
    return {}


#: Stamps read so far, by (table, version): a committed version never changes.
_STAMPS: dict[tuple[str, int], int] = {}
_STAMPS_KEPT = 65536


def commit_ts(table_uri: str, version: int) -> int | None:
    """The commit timestamp (µs) of ``version``: its stamp, or for a commit made before
    stamps existed its Delta timestamp; None when the log does not hold the version
    (cleaned up, or not committed yet: never cached)."""
    key = (table_uri.rstrip("/"), version)
    found = _STAMPS.get(key)
    if found is not None:
        return found
    info = commit_info(table_uri, version)
    if info is None:
        return None
    stamp = info.get(COMMIT_TS_KEY)
    found = int(stamp) if stamp is not None else int(info.get("timestamp", 0)) * 1000
    if len(_STAMPS) >= _STAMPS_KEPT:
        _STAMPS.clear()
    _STAMPS[key] = found
    return found


def next_commit_ts(table: DeltaTable) -> int:
    """The stamp of a commit made on ``table``'s loaded version: strictly after that
    version's stamp, and no earlier than this writer's clock."""
    now = clock()
    uri = table_folder(table)
    previous = commit_ts(uri, table.version()) or 0
    if previous >= now + 1_000_000:
        log.warning("the clock is %.3f s behind the newest commit of %s; its commits "
                    "are stamped after that commit", (previous - now) / 1e6, uri)  # fmt: skip
    return max(now, previous + 1)


def stamped(
    table: DeltaTable,
    custom_metadata: dict[str, Any] | None = None,
    app_transactions: Sequence[Transaction] | None = None,
) -> CommitProperties:
    """Commit properties for one attempt on ``table``'s loaded version: the metadata
    with the stamp, and no retries inside delta-rs (see the module docstring). Build
    them anew for every attempt, from the handle that attempt commits on."""
    metadata = {**(custom_metadata or {}), COMMIT_TS_KEY: str(next_commit_ts(table))}
    return CommitProperties(
        custom_metadata=metadata,
        app_transactions=list(app_transactions) if app_transactions else None,
        max_commit_retries=0,
    )


def version_at(table_uri: str, moment_us: int, strictly_before: bool = False) -> int | None:
    """The newest version committed at ``moment_us`` (before it, with ``strictly_before``)
    among the versions the log still holds; None if every one is later.

    Stamps increase with the version, so this is a bisection over the logged versions
    (versions stamped by older releases use Delta's timestamp and are assumed in order)."""
    versions = sorted(logged_versions(table_uri))
    search = bisect.bisect_left if strictly_before else bisect.bisect_right
    position = search(versions, moment_us, key=lambda v: commit_ts(table_uri, v) or 0)
    return versions[position - 1] if position else None
