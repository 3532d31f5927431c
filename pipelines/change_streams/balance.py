"""The balancer: splits change stream partitions that stay hot and merges adjacent ones
that stay cold, as Spanner splits and merges its data.

At each check it counts, per open partition, the changed rows committed since the last
check to the tables the stream watches (the key columns of the versions' change feed,
hashed as records are), and turns them into rates. A partition above the policy's
split rate for ``sustain`` checks in a row is split in two; two adjacent partitions
below the merge rate as long are merged (:func:`.partitions.choose`). Splits and merges
happen at a seal, so readers see them as child partitions records. The service runs a
check every few seconds; an embedded application may call :meth:`Balancer.check`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable

import pyarrow as pa
from deltalake import DeltaTable

from catalog import Catalog, ChangeStreamRecord, PartitionRecord, TableInfo
from flush.tables import ROW_ID_COLUMN
from pipelines.change_streams.partitions import BalancePolicy, choose, merge, open_partitions, split
from pipelines.change_streams.read import stream_tables
from pipelines.change_streams.records import json_values, partition_of
from pipelines.change_streams.timeline import newest_version
from pipelines.errors import SqlError

__all__ = ["Balancer"]

log = logging.getLogger(__name__)


def _row_counts(
    table: TableInfo, after: int, to: int, partitions: list[PartitionRecord]
) -> dict[str, int]:
    """Changed rows of versions ``(after, to]`` per partition token (update pre-images
    do not count: an update is one change)."""
    key = list(table.primary_key) or [ROW_ID_COLUMN]
    reader = DeltaTable(table.uri).load_cdf(
        starting_version=after + 1,
        ending_version=to,
        columns=[*('"' + k.replace('"', '""') + '"' for k in key), "_change_type"],
    )
    events = pa.table(reader)
    kinds = events.column("_change_type").cast(pa.string()).to_pylist()
    token_of = partition_of(partitions)
    counts: dict[str, int] = defaultdict(int)
    columns = [
        events.column(k).to_pylist()
        if k == ROW_ID_COLUMN
        else json_values(events.column(k), table.schema[k].type)
        for k in key
    ]  # fmt: skip  (hashed as records hash their keys)
    for index in range(events.num_rows):
        if kinds[index] == "update_preimage":
            continue
        counts[token_of([column[index] for column in columns])] += 1
    return counts


class Balancer:
    """Split/merge decisions over time: the versions already counted per (stream, table)
    and each partition's hot and cold streaks. One per process."""

    def __init__(
        self, catalog: Catalog, policy: BalancePolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.catalog = catalog
        self.policy = policy or BalancePolicy()
        self._clock = clock
        self._seen: dict[tuple[str, int], int] = {}
        self._checked: dict[str, float] = {}
        self._hot: dict[str, int] = defaultdict(int)
        self._cold: dict[str, int] = defaultdict(int)

    def check(self) -> list[str]:
        """One check of every change stream; returns what it did, for the log."""
        done: list[str] = []
        for stream in self.catalog.list_change_streams():
            try:
                done += self._check(stream)
            except SqlError as exc:  # a race with an ALTER: the next check sees the result
                log.info("balancing change stream %s: %s", stream.full_name, exc)
        return done

    def _check(self, stream: ChangeStreamRecord) -> list[str]:
        now = self._clock()
        partitions = open_partitions(self.catalog, stream)
        counts: dict[str, int] = defaultdict(int)
        for table in stream_tables(self.catalog, stream):
            newest = newest_version(table.uri)
            last = self._seen.get((stream.uid, table.id))
            self._seen[(stream.uid, table.id)] = newest
            if last is None or newest <= last:
                continue
            for token, count in _row_counts(table, last, newest, partitions).items():
                counts[token] += count
        since = self._checked.get(stream.uid)
        self._checked[stream.uid] = now
        if since is None or now <= since:
            return []
        elapsed = now - since
        for p in partitions:
            rate = counts.get(p.token, 0) / elapsed
            self._hot[p.token] = (
                self._hot[p.token] + 1 if rate > self.policy.split_rows_per_s else 0
            )
            self._cold[p.token] = (
                self._cold[p.token] + 1 if rate < self.policy.merge_rows_per_s else 0
            )
        splits, merges = choose(partitions, self._hot, self._cold, self.policy)
        done = []
        for token in splits:
            made = split(self.catalog, stream, token)
            done.append(f"split {stream.full_name} {token} into {', '.join(p.token for p in made)}")
        for pair in merges:
            made_one = merge(self.catalog, stream, pair)
            done.append(f"merged {stream.full_name} {' and '.join(pair)} into {made_one.token}")
        for token in [*splits, *(t for pair in merges for t in pair)]:
            self._hot.pop(token, None)
            self._cold.pop(token, None)
        return done
