"""Which version of each dynamic table a statement reads, so that dynamic tables of one
graph read together are read at one data timestamp.

Refreshes are aligned (a slower table's ticks are also its faster neighbours'), but at a
given moment the faster tables have refreshed for later ticks than the slower ones. A
statement reading several dynamic tables connected through their definitions' sources
reads each at ``T*``, the oldest of their data timestamps: at the version of its newest
refresh for a data timestamp at or before ``T*`` (its history row's table version). A
table whose history no longer holds such a row (pruned) is read at its current version.
"""

from __future__ import annotations

from collections.abc import Iterable

from catalog import Catalog, DynamicTableRecord

__all__ = ["consistent_pins"]


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
            if source.kind == "table" and source.source_id in every:
                a, b = root(dt.table_id), root(source.source_id)
                parent[max(a, b)] = min(a, b)
    return {key: root(key) for key in every}


def consistent_pins(catalog: Catalog, table_ids: Iterable[int]) -> dict[int, int]:
    """Versions to read (table id -> version) for the dynamic tables among ``table_ids``
    that share a graph with another one of them and are ahead of the oldest; empty when
    nothing needs pinning (one dynamic table per graph, or all at one data timestamp)."""
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
        moment = min(dt.data_timestamp_us or 0 for dt in group)
        for dt in group:
            if dt.data_timestamp_us == moment:
                continue  # read as it is
            for row in catalog.list_refreshes(dt.table_id, limit=5000):  # newest first
                if (row.state == "SUCCEEDED" and row.table_version is not None
                        and row.data_timestamp_us <= moment):  # fmt: skip
                    pins[dt.table_id] = row.table_version
                    break
    return pins
