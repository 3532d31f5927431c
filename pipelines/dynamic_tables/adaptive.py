"""ADAPTIVE refresh: incremental by default, FULL for one refresh when the change is too
large for an incremental refresh to pay off.

The measure is the **share of changed source rows**: the rows the sources' commits since
the last refresh inserted, updated or deleted, against the rows the sources hold now.
Both come from the Delta logs alone (no Spark job): a merge's, delete's or update's
operation metrics count the rows it touched; a commit without them (an append, an
overwrite) counts the rows of the data files it added and removed (their ``numRecords``
statistics); the rows held are the ``numRecords`` of the live files. The count is gross
(a row inserted then deleted counts twice), an upper bound of the net change.

A refresh goes FULL (reason ``CHANGE_TOO_LARGE``) when the share exceeds
:data:`FULL_ABOVE_SHARE` and at least :data:`FULL_FROM_ROWS` rows changed: below that
count either way's fixed costs (planning, Spark jobs) dominate, and the incremental
change is the one followers want. The share was calibrated by ``python -m bench
dt_adaptive_shares`` at scale 1 (a 1M-row source joined to a 100k-row one; two runs on a
quiet two-core machine, as ``make bench`` runs it): the incremental refresh of an inner
and a LEFT join was 1.02-1.22x FULL's speed with 10% of the large source's rows updated,
0.99-1.26x with 15% and slower with 20% (0.80-0.95x); 15% and 20% of that source are 14%
and 18% of both sources' rows, the measure's denominator.

Rows are not work: some queries refresh incrementally slower than FULL at any share (a
GROUP BY whose groups are recomputed from the sources, a join over large sources whose
change is tiny). So a table whose sources hold at least :data:`COST_FROM_ROWS` rows also
goes FULL (reason ``INCREMENTAL_SLOWER``) when its history shows its newest incremental
refresh took more than :data:`SLOWER_BY` times its FULL refreshes (the quicker of the
newest two), unless the change now is under half of that incremental refresh's
(a smaller change may pay off) or :data:`RETRY_AFTER` refreshes went FULL for this
reason since (the next one measures the incremental way again: sources grow, FULL's
time with them). Under that many rows both ways cost about their fixed costs (a second
on two cores), and which is faster is noise. A refresh's time is the one the process
that ran it recorded (``took_s``): one finished by recovery has none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

if TYPE_CHECKING:
    from catalog import DynamicTableRecord, RefreshRecord
    from pipelines.dynamic_tables.refresh_change import PinnedSource

__all__ = ["CHANGE_TOO_LARGE", "COST_FROM_ROWS", "FULL_ABOVE_SHARE", "FULL_FROM_ROWS",
           "HISTORY_ROWS", "INCREMENTAL_SLOWER", "RETRY_AFTER", "SLOWER_BY", "Measure",
           "Timing", "choose", "is_adaptive", "measure", "timing"]  # fmt: skip

log = logging.getLogger(__name__)

#: The share of changed source rows above which an ADAPTIVE refresh goes FULL
#: (calibrated by ``dt_adaptive_shares``, see the module's docstring).
FULL_ABOVE_SHARE = 0.15
#: The fewest changed rows for which an ADAPTIVE refresh goes FULL whatever the share.
FULL_FROM_ROWS = 1000
#: The reason code of an ADAPTIVE refresh that went FULL for its change's size.
CHANGE_TOO_LARGE = "CHANGE_TOO_LARGE"
#: The reason code of an ADAPTIVE refresh that went FULL because the table's incremental
#: refreshes were slower than its FULL ones (see the module's docstring).
INCREMENTAL_SLOWER = "INCREMENTAL_SLOWER"
#: The fewest rows the sources hold for the history's times to weigh in.
COST_FROM_ROWS = 100_000
#: How many times its FULL refreshes' time (the quicker of the newest two) the table's
#: newest incremental refresh must have taken: refresh times of one table vary by about a
#: fifth between runs (``dt_adaptive_shares``).
SLOWER_BY = 1.25
#: After this many refreshes gone FULL for INCREMENTAL_SLOWER, one goes incremental.
RETRY_AFTER = 8
#: How many history rows are read for the times (NO_DATA rows between included).
HISTORY_ROWS = 200

#: Operation metrics that count the rows a commit touched (delta-rs' and Spark's names).
_ROW_METRICS = (
    "num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted",
    "num_deleted_rows", "num_updated_rows", "numTargetRowsInserted", "numTargetRowsUpdated",
    "numTargetRowsDeleted", "numDeletedRows", "numUpdatedRows",
)  # fmt: skip


def is_adaptive(dt: DynamicTableRecord) -> bool:
    """Whether the table refreshes ADAPTIVE: declared so, or AUTO over a query that can
    be refreshed incrementally (its row ids are an incremental table's)."""
    return dt.refresh_mode in ("AUTO", "ADAPTIVE") and dt.row_ids in ("PACKED", "DERIVED")


@dataclass(frozen=True, slots=True)
class Measure:
    """Rows changed in the sources since the last refresh, and the rows they hold now."""

    changed: int
    total: int

    @property
    def share(self) -> float:
        if not self.changed:
            return 0.0
        return self.changed / self.total if self.total else float("inf")

    @property
    def too_large(self) -> bool:
        return self.changed >= FULL_FROM_ROWS and self.share > FULL_ABOVE_SHARE

    @property
    def weighs_times(self) -> bool:
        """Whether the table's refresh times weigh in on this change (it is not too large
        already, and the sources hold enough rows for the times to mean something)."""
        return not self.too_large and self.total >= COST_FROM_ROWS and self.changed > 0

    def text(self, full: bool) -> str:
        """The history's message: the measure and the rule it met."""
        share = "more than all" if self.share == float("inf") else f"{self.share:.2%}"
        return (f"ADAPTIVE chose {'FULL' if full else 'INCREMENTAL'}: the sources' commits "
                f"since the last refresh changed {self.changed:,} "
                f"row{'' if self.changed == 1 else 's'}, {share} of the {self.total:,} rows "
                f"they hold (FULL above {FULL_ABOVE_SHARE:.0%} and from {FULL_FROM_ROWS:,} "
                "changed rows)")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Timing:
    """What a table's history says of its two ways (:func:`timing`): the newest
    incremental refresh's seconds and changed rows (None if its commits are gone, or not
    read), FULL's seconds, and the refreshes gone FULL for INCREMENTAL_SLOWER since that
    incremental one."""

    incremental_s: float
    incremental_changed: int | None
    full_s: float
    full_since: int

    @property
    def slower(self) -> bool:
        """Whether the incremental refresh was the slower, by :data:`SLOWER_BY`."""
        return self.incremental_s > SLOWER_BY * self.full_s

    def weigh(self, found: Measure) -> tuple[bool, str]:
        """Whether the refresh of the change ``found`` goes FULL for these times, and
        what the history's message adds ("" when the times do not weigh in)."""
        if not found.weighs_times or not self.slower:
            return False, ""
        then = self.incremental_changed
        rows = "" if then is None else f", for {then:,} changed rows"
        said = (f"; the table's newest incremental refresh took {self.incremental_s:.2f} s"
                f"{rows}, more than {SLOWER_BY}x the {self.full_s:.2f} s of the quicker of its "
                "two newest FULL refreshes")  # fmt: skip
        if self.full_since >= RETRY_AFTER:
            return False, f"{said}, and {self.full_since} refreshes went FULL since: measured again"
        if then is not None and 2 * found.changed < then:
            return False, f"{said}, and this change is under half as large"
        return True, (f"{said} (incremental again for a change under half as large, or "
                      f"after {RETRY_AFTER} such FULL refreshes)")  # fmt: skip


def choose(
    pinned: Sequence[PinnedSource], history: Callable[[], Sequence[RefreshRecord]]
) -> tuple[str, str]:
    """The reason an ADAPTIVE refresh goes FULL (``CHANGE_TOO_LARGE``,
    ``INCREMENTAL_SLOWER``, or "" to go incremental) and the message naming the measure;
    ``history``: the table's refreshes, newest first (read only when its times weigh in).
    A log that cannot be read gives no measure: the incremental attempt then finds what
    is missing itself."""
    try:
        found = measure(pinned)
    except Exception:  # advice only: a log it cannot read never fails the refresh
        log.warning("the change of %s could not be measured", [p.info.full_name for p in pinned],
                    exc_info=True)  # fmt: skip
        found = None
    if found is None:
        return "", ""
    if found.too_large:
        return CHANGE_TOO_LARGE, found.text(True)
    times = None
    if found.weighs_times:
        try:
            times = timing(history(), pinned)
        except Exception:  # the same: without times, the share alone decides
            log.warning("the refresh times of %s could not be read",
                        [p.info.full_name for p in pinned], exc_info=True)  # fmt: skip
    full, said = times.weigh(found) if times is not None else (False, "")
    return (INCREMENTAL_SLOWER if full else ""), found.text(full) + said


def timing(history: Sequence[RefreshRecord], pinned: Sequence[PinnedSource]) -> Timing | None:
    """The times in ``history`` (newest first) of the refreshes that succeeded and were
    timed by the process that ran them (not those recovery finished): the newest
    incremental one's (its time grows with its change, so an older, smaller change's
    would flatter it) and the quicker of the two newest FULL ones (FULL's time hardly
    moves with the change: one slow outlier does not decide); None without both ways.
    The incremental refresh's changed rows are read only if it was the slower."""
    done = [r for r in history if r.state == "SUCCEEDED" and r.took_s is not None
            and r.action in ("INCREMENTAL", "FULL")]  # fmt: skip
    incremental = next((r for r in done if r.action == "INCREMENTAL"), None)
    full = [r for r in done if r.action == "FULL"][:2]
    if incremental is None or not full:
        return None
    newer = done[: done.index(incremental)]
    since = sum(r.action == "FULL" and r.reason == INCREMENTAL_SLOWER for r in newer)
    times = Timing(_took(incremental), None, min(map(_took, full)), since)
    if times.slower:
        times = replace(times, incremental_changed=_changed_then(incremental, pinned))
    return times


def _took(record: RefreshRecord) -> float:
    return max(0.0, record.took_s or 0.0)


def _changed_then(record: RefreshRecord, pinned: Sequence[PinnedSource]) -> int | None:
    """The rows the sources' commits changed for an earlier refresh, from the versions
    its history row read; None if a source is not among today's or a commit is gone."""
    uris = {item.info.full_name: item.info.uri for item in pinned}
    if not record.source_versions:
        return None
    changed = 0
    for name, versions in record.source_versions.items():
        after, to = versions
        if name not in uris or after is None or to < after:
            return None
        rows = _changed_rows(uris[name], after, to)
        if rows is None:
            return None
        changed += rows
    return changed


def measure(pinned: Sequence[PinnedSource]) -> Measure | None:
    """The sources' changed rows in ``(after, to]`` and their rows at ``to``."""
    changed = total = 0
    for item in pinned:
        if item.after is None or item.to < item.after:
            return None
        rows = _changed_rows(item.info.uri, item.after, item.to)
        if rows is None:
            return None
        changed += rows
        total += _rows(DeltaTable(item.info.uri, version=item.to))
    return Measure(changed, total)


def _rows(table: DeltaTable) -> int:
    """The rows of a table version, from its live files' statistics."""
    counts = pa.table(table.get_add_actions(flatten=True)).column("num_records")
    return int(pc.sum(counts).as_py() or 0)


def _changed_rows(uri: str, after: int, to: int) -> int | None:
    """The rows the commits in ``(after, to]`` changed; None if a commit file is gone."""
    log = Path(uri) / "_delta_log"
    removed_files: list[dict[str, Any]] = []
    added: dict[str, int] = {}
    changed = 0
    for version in range(after + 1, to + 1):
        try:
            text = (log / f"{version:020d}.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        metrics = next((a["commitInfo"].get("operationMetrics") for a in actions
                        if "commitInfo" in a), None) or {}  # fmt: skip
        counted = [int(metrics[key]) for key in _ROW_METRICS if key in metrics]
        files = [(kind, a[kind]) for a in actions for kind in ("add", "remove")
                 if kind in a and a[kind].get("dataChange", True)]  # fmt: skip
        for kind, file in files:
            if kind == "add":
                added[file["path"]] = _records(file) or 0
        if counted:
            changed += sum(counted)
            continue
        changed += sum(added[f["path"]] for kind, f in files if kind == "add")
        removed_files += [f for kind, f in files if kind == "remove"]
    return changed + _removed_rows(uri, after, removed_files, added)


def _records(file: dict[str, Any]) -> int | None:
    stats = file.get("stats")
    if not stats:
        return None
    value = json.loads(stats).get("numRecords")
    return int(value) if value is not None else None


def _removed_rows(
    uri: str, after: int, removed: list[dict[str, Any]], added: dict[str, int]
) -> int:
    """The rows of files removed without row metrics (an overwrite): their statistics,
    else those of the file as added in the range or held at ``after``."""
    rows, unknown = 0, []
    for file in removed:
        count = _records(file)
        if count is None:
            count = added.get(file["path"])
        if count is None:
            unknown.append(file["path"])
        else:
            rows += count
    if unknown:
        held = pa.table(DeltaTable(uri, version=after).get_add_actions(flatten=True))
        sizes = dict(zip(held.column("path").to_pylist(), held.column("num_records").to_pylist(),
                         strict=True))  # fmt: skip
        rows += sum(int(sizes.get(path) or 0) for path in unknown)
    return rows
