"""Partitions of a change stream and their lineage: splits, merges, and the balancer's
choice of them.

A partition is a range of the key space (a key's hash, :func:`.records.key_hash`) for
an interval of commit timestamps. A split ends one partition and starts several over
its range; a merge ends adjacent partitions and starts one over their union. Either
happens at a seal (:mod:`.timeline`): in the same catalog write the tables are sealed
at a heartbeat H and the old partitions end at H + 1 where the new ones start, so every
version's records fall on one side. The catalog keeps the whole tree, so every reader,
and a reader after a restart, sees the same lineage.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from catalog import Catalog, ChangeStreamRecord, PartitionRecord
from flush.failpoints import failpoint
from pipelines.change_streams.read import stream_tables
from pipelines.change_streams.timeline import seal
from pipelines.errors import SqlError
from pipelines.transactions.commit import when_free

__all__ = ["BalancePolicy", "choose", "merge", "open_partitions", "split"]


def open_partitions(catalog: Catalog, stream: ChangeStreamRecord) -> list[PartitionRecord]:
    """The stream's partitions that have not ended, in key order."""
    found = [p for p in catalog.list_partitions(stream.uid) if p.end_us is None]
    return sorted(found, key=lambda p: p.lo)


def _apply(
    catalog: Catalog, stream: ChangeStreamRecord, tokens: Sequence[str], make: list[tuple[int, int]]
) -> list[PartitionRecord]:
    """End ``tokens`` and start partitions over the ``(lo, hi)`` ranges of ``make``."""

    def repartition(
        heartbeat: int, current: list[PartitionRecord]
    ) -> tuple[Sequence[str], Sequence[PartitionRecord]]:
        live = {p.token for p in current if p.end_us is None}
        gone = [t for t in tokens if t not in live]
        if gone:
            raise SqlError(
                f"partition {gone[0][:64]} of {stream.full_name} has ended (split or merged "
                "meanwhile); SHOW CHANGE STREAM PARTITIONS lists the open ones",
                "SQL_COMPILATION_ERROR",
            )
        parents = tuple(tokens)
        start = heartbeat + 1
        children = [
            PartitionRecord(uuid.uuid4().hex, stream.uid, lo, hi, start, None, parents)
            for lo, hi in make
        ]
        failpoint("change_stream_repartition")  # inside the catalog transaction
        return tokens, children

    tables = stream_tables(catalog, stream)
    # Every table sealed at the heartbeat: after a commit of several tables holding one.
    _, made = when_free(catalog, lambda: seal(catalog, tables, stream.uid, repartition),
                        [t.id for t in tables], decided_only=True)  # fmt: skip
    return made


def split(
    catalog: Catalog, stream: ChangeStreamRecord, token: str, parts: int = 2
) -> list[PartitionRecord]:
    """End partition ``token`` and start ``parts`` partitions over equal parts of its
    range. Raises SqlError if it is not open or too narrow to split."""
    found = {p.token: p for p in open_partitions(catalog, stream)}.get(token)
    if found is None:
        raise SqlError(f"{token[:64]!r} is not an open partition of {stream.full_name}",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    if not 2 <= parts <= 16 or found.hi - found.lo < parts:
        raise SqlError(f"partition {token} cannot be split in {parts}; split it in 2 to 16",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    width = (found.hi - found.lo) // parts
    bounds = [found.lo + i * width for i in range(parts)] + [found.hi]
    return _apply(catalog, stream, [token], list(itertools.pairwise(bounds)))


def merge(catalog: Catalog, stream: ChangeStreamRecord, tokens: Sequence[str]) -> PartitionRecord:
    """End the adjacent open partitions ``tokens`` and start one over their range."""
    live = {p.token: p for p in open_partitions(catalog, stream)}
    missing = [t for t in tokens if t not in live]
    if missing or len(set(tokens)) < 2:
        raise SqlError(
            (f"{missing[0][:64]!r} is not an open partition of {stream.full_name}" if missing
             else "merge at least two different partitions"), "SQL_COMPILATION_ERROR",
        )  # fmt: skip
    picked = sorted((live[t] for t in set(tokens)), key=lambda p: p.lo)
    if any(a.hi != b.lo for a, b in itertools.pairwise(picked)):
        raise SqlError("only adjacent partitions (key ranges that touch) can be merged",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    return _apply(catalog, stream, [p.token for p in picked], [(picked[0].lo, picked[-1].hi)])[0]


@dataclass(frozen=True, slots=True)
class BalancePolicy:
    """When the service splits and merges: a partition whose change rate stays above
    ``split_rows_per_s`` for ``sustain`` checks in a row is split in two; two adjacent
    partitions both below ``merge_rows_per_s`` for as long are merged (never below
    ``min_partitions`` open ones, never above ``max_partitions``)."""

    split_rows_per_s: float = 20_000.0
    merge_rows_per_s: float = 10.0
    sustain: int = 3
    min_partitions: int = 1
    max_partitions: int = 64


def choose(
    partitions: Sequence[PartitionRecord], hot: Mapping[str, int], cold: Mapping[str, int],
    policy: BalancePolicy,
) -> tuple[list[str], list[tuple[str, str]]]:  # fmt: skip
    """The partitions to split and the adjacent pairs to merge, given how many checks in
    a row each open partition was hot or cold."""
    ordered = sorted(partitions, key=lambda p: p.lo)
    count = len(ordered)
    splits = []
    for p in ordered:
        if (
            hot.get(p.token, 0) >= policy.sustain
            and count < policy.max_partitions
            and p.hi - p.lo >= 2
        ):
            splits.append(p.token)
            count += 1
    merges: list[tuple[str, str]] = []
    taken = set(splits)
    for a, b in itertools.pairwise(ordered):
        if count <= policy.min_partitions:
            break
        if a.token in taken or b.token in taken or a.hi != b.lo:
            continue
        if min(cold.get(a.token, 0), cold.get(b.token, 0)) >= policy.sustain:
            merges.append((a.token, b.token))
            taken |= {a.token, b.token}
            count -= 1
    return splits, merges
