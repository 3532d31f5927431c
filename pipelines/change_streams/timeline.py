"""Change stream time: the timestamp a table version's records carry, and the seals that
make heartbeats true whatever the writers' clocks say.

A version's commit stamp (:mod:`flush.commit_clock`) increases per table, but a writer
whose clock lags can commit, after a reader said "everything up to H has been
returned", a version stamped before H. So the change stream timestamp of a version is
fixed by a **seal**: a catalog row ``(table, version N, heartbeat H)`` written in one
catalog transaction that read the table's newest version N, with H at least every
sealed version's timestamp and at least the reader's clock. Then:

- a version ``v`` at or before the last seal before it, ``(V, H)`` with ``V < v``, has the
  timestamp ``max(stamp(v), H + (v - V))``: after H, strictly increasing, and equal to
  its commit stamp whenever the clocks agree;
- a reader returns a version's records only once a seal covers it (``N >= v``), and a
  heartbeat H only once every table of its partition is sealed up to H.

Every reader computes the same timestamps from the same rows, so a restarted reader,
and every partition, agree. Seals older than the longest retention are forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from catalog import Catalog, PartitionRecord, Seal, TableInfo
from catalog.sqlite_change_streams import Repartition, SealCompute
from flush.commit_clock import clock, commit_ts
from flush.tables import logged_versions

__all__ = ["newest_version", "seal", "sealing", "timestamps"]

#: The newest version seen per table folder, to probe the next one from.
_NEWEST: dict[str, int] = {}


def newest_version(table_uri: str) -> int:
    """The newest committed version of a table, by probing its log for the next commit
    files from the last version seen (a listing only the first time)."""
    log = Path(table_uri) / "_delta_log"
    known = _NEWEST.get(table_uri)
    if known is None:
        known = max(logged_versions(table_uri), default=-1)
    while (log / f"{known + 1:020d}.json").exists():
        known += 1
    _NEWEST[table_uri] = known
    return known


def timestamps(catalog: Catalog, table: TableInfo, after: int, to: int) -> dict[int, int]:
    """The change stream timestamps (µs) of the versions ``(after, to]`` of ``table``.

    A version ``v`` between seals ``(Va, Ha)`` and ``(Vb, Hb)`` (``Va < v <= Vb``) has
    ``min(max(stamp, Ha + (v - Va)), Hb - (Vb - v))``: after the seal before it, within
    the seal that covers it (a writer whose clock is behind or ahead moves no record
    across a heartbeat), strictly increasing, and its commit stamp when clocks agree.
    A version no seal covers yet has only the lower bound (the caller's guess)."""
    seals = catalog.seals_between(table.id, after + 1, to)
    found: dict[int, int] = {}
    previous: Seal | None = None
    index = 0
    for version in range(after + 1, to + 1):
        while index < len(seals) and seals[index].version < version:
            previous = seals[index]
            index += 1
        stamp = commit_ts(table.uri, version) or 0
        if previous is not None:
            stamp = max(stamp, previous.heartbeat_us + (version - previous.version))
        if index < len(seals):
            covering = seals[index]
            stamp = min(stamp, covering.covers_us - (covering.version - version))
        found[version] = stamp
    return found


def sealing(tables: Iterable[TableInfo]) -> tuple[int, SealCompute]:
    """This process's clock and how ``tables`` are sealed at it: their newest versions, at
    that clock or later if an earlier seal is later or too close for the versions since it
    (each takes a microsecond). The computation runs inside the catalog's write."""
    by_id = {table.id: table for table in tables}
    now = clock()

    def compute(latest: dict[int, Seal]) -> dict[int, Seal]:
        heartbeat = now
        newest: dict[int, int] = {}
        for table_id, table in by_id.items():
            version = newest_version(table.uri)
            newest[table_id] = version
            last = latest.get(table_id)
            if last is not None:
                heartbeat = max(heartbeat, last.heartbeat_us + max(0, version - last.version))
        return {table_id: Seal(version, heartbeat) for table_id, version in newest.items()}

    return now, compute


def seal(
    catalog: Catalog, tables: Iterable[TableInfo], stream_uid: str | None = None,
    repartition: Repartition | None = None,
) -> tuple[dict[int, Seal], list[PartitionRecord]]:  # fmt: skip
    """Seal ``tables`` now with one heartbeat for all (:func:`sealing`). With
    ``repartition``, change ``stream_uid``'s partitions at that heartbeat in the same
    catalog write (:mod:`.partitions`). Returns the seals and new partitions."""
    tables = list(tables)
    now, compute = sealing(tables)
    return catalog.seal_tables([t.id for t in tables], compute, stream_uid, repartition,
                               floor_us=now)  # fmt: skip
