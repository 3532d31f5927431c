"""Which version of each dynamic table a statement reads, so that dynamic tables of one
graph read together are read at one data timestamp.

Refreshes are aligned (a slower table's ticks are also its faster neighbours'), but at a
given moment the faster tables have refreshed for later ticks than the slower ones. A
statement reading several dynamic tables connected through their definitions' sources
reads each at ``T*``: the newest data timestamp every one of them has a refresh for
(from the refresh history: each refresh row holds the table version it made or kept).
Without a common one (history pruned, refreshes skipped), each is read at its newest
refresh at or before the oldest of their current data timestamps.
"""

from __future__ import annotations

from collections.abc import Iterable

from catalog import Catalog, DynamicTableRecord

__all__ = ["consistent_pins", "refreshed_versions"]

#: How many history rows of a table are looked at for its versions by data timestamp.
HISTORY_LOOKBACK = 5000


def refreshed_versions(catalog: Catalog, dt: DynamicTableRecord) -> dict[int, int]:
    """The table version holding each data timestamp the table was refreshed for (data
    timestamp in µs -> version), from its history and its current state."""
    found: dict[int, int] = {}
    for row in catalog.list_refreshes(dt.table_id, limit=HISTORY_LOOKBACK):  # newest first
        if row.state == "SUCCEEDED" and row.table_version is not None:
            found.setdefault(row.data_timestamp_us, row.table_version)
    if dt.data_timestamp_us is not None and dt.data_version is not None:
        found[dt.data_timestamp_us] = dt.data_version
    return found


def _components(every: dict[int, DynamicTableRecord]) -> dict[int, int]:
    """Each dynamic table's component (the smallest table id in it)."""
    parent = {key: key for key in every}

    def root(key: int) -> int:
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    for dt in every.values():
        for source in dt.sources:
            if source.kind != "view" and source.source_id in every:
                a, b = root(dt.table_id), root(source.source_id)
                parent[max(a, b)] = min(a, b)
    return {key: root(key) for key in every}


def consistent_pins(catalog: Catalog, table_ids: Iterable[int]) -> dict[int, int]:
    """Versions to read (table id -> version) for the dynamic tables among ``table_ids``
    that share a graph with another one of them; empty when nothing needs pinning (one
    dynamic table per graph, or all at one data timestamp)."""
    wanted = set(table_ids)
    every = {dt.table_id: dt for dt in catalog.list_dynamic_tables()}
    read = [every[key] for key in wanted if key in every and every[key].data_timestamp_us]
    if len(read) < 2:
        return {}
    component = _components(every)
    groups: dict[int, list[DynamicTableRecord]] = {}
    for dt in read:
        groups.setdefault(component[dt.table_id], []).append(dt)
    pins: dict[int, int] = {}
    for group in groups.values():
        if len(group) < 2 or len({dt.data_timestamp_us for dt in group}) == 1:
            continue
        versions = {dt.table_id: refreshed_versions(catalog, dt) for dt in group}
        common = set.intersection(*(set(v) for v in versions.values()))
        if common:
            moment = max(common)
            pins.update({key: found[moment] for key, found in versions.items()})
            continue
        oldest = min(dt.data_timestamp_us or 0 for dt in group)
        for key, found in versions.items():
            earlier = [stamp for stamp in found if stamp <= oldest]
            if earlier:
                pins[key] = found[max(earlier)]
    return pins
