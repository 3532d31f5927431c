"""Plans over stand-ins kept between refreshes: a dynamic table's refresh binds its
query again (a view it reads may have changed), but Spark's analysis and optimization
of the same text over the same stand-ins gives the same plan, and making it (with what
the engine derives from it: coverage, state layout, leaf binders) was a quarter of a
small refresh's JVM round trips.

A plan is reused only when the bound text is the same character for character once the
names of the stand-in views the binder made are replaced by their position, and each
of those views stands for the same table (id, never reused) with the same schema. The
text then names the same sources, views included (a view's body is bound into the
text), and the stand-ins are the same frames (kept here too, one per table, schema and
occurrence), so the plan Spark would make is the one kept. The session's SQL settings
are fixed (no statement sets them), so they are not part of the key. Text that names a
view made by the binder other than a stand-in, or names a stand-in view more than once
(a literal that happens to spell it), is not cached: the key would not say what it reads.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pipelines.incremental.plan import PlanReader
from pipelines.incremental.stand_ins import EnginePlan, stand_in_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from catalog import TableInfo

__all__ = ["PlanCache", "cached_plan"]

#: The names the binder gives the views it makes (``Binder.view``).
_MADE = re.compile(r"(?<![\w$])ingest_v\d+(?![\w$])", re.IGNORECASE)

#: Binds a query over the given stand-ins: the bound text, and the stand-in views it
#: made (name -> table), in the order it made them.
Bind = Callable[[Callable[["TableInfo"], "DataFrame"]], tuple[str, Mapping[str, "TableInfo"]]]


class PlanCache:
    """The plans of one Spark session, by bound text and stand-ins (least recently used
    dropped past ``limit``)."""

    def __init__(self, spark: SparkSession, limit: int = 256) -> None:
        self.spark, self.limit = spark, limit
        self._plans: OrderedDict[tuple[Any, ...], EnginePlan] = OrderedDict()
        self._frames: OrderedDict[tuple[Any, ...], tuple[DataFrame, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def plan(self, run: Callable[[str], DataFrame], bind: Bind) -> EnginePlan:
        """The plan of the query ``bind`` binds, made by ``run`` over stand-ins unless the
        same text over the same stand-ins was planned before."""
        occurrences: Counter[tuple[Any, ...]] = Counter()
        used: list[tuple[int, Any]] = []

        def stand_in(info: TableInfo) -> DataFrame:
            frame, optimized = self._frame(info, occurrences)
            used.append((info.id, optimized))
            return frame

        text, views = bind(stand_in)
        key = _key(text, views)
        with self._lock:
            found = self._plans.get(key) if key is not None else None
            if key is not None and found is not None:
                self._plans.move_to_end(key)
                self.hits += 1
                return found
            self.misses += 1
        plan = EnginePlan(PlanReader(self.spark), root=None)  # type: ignore[arg-type]
        for table_id, optimized in used:
            plan.stand_ins.setdefault(table_id, []).append(optimized)
        plan.frame = run(text)
        plan.root = plan.reader.optimized(plan.frame)
        if key is not None:
            with self._lock:
                self._plans[key] = plan
                _trim(self._plans, self.limit)
        return plan

    def _frame(
        self, info: TableInfo, occurrences: Counter[tuple[Any, ...]]
    ) -> tuple[DataFrame, Any]:
        """The stand-in of ``info`` for its next occurrence in the query, and its plan."""
        schema = stand_in_schema(info)
        fingerprint = (info.id, schema.json())
        key = (*fingerprint, occurrences[fingerprint])
        occurrences[fingerprint] += 1
        with self._lock:
            kept = self._frames.get(key)
            if kept is not None:
                self._frames.move_to_end(key)
                return kept
        frame = self.spark.createDataFrame(self.spark.sparkContext.emptyRDD(), schema)
        kept = (frame, frame._jdf.queryExecution().optimizedPlan())
        with self._lock:
            self._frames[key] = kept
            _trim(self._frames, 4 * self.limit)
        return kept


def _key(text: str, views: Mapping[str, TableInfo]) -> tuple[Any, ...] | None:
    """The text with the stand-in views' names replaced by their positions, and what each
    stands for; None when the text cannot be keyed (see the module's docstring)."""
    positions = {name.lower(): i for i, name in enumerate(views)}
    seen: Counter[str] = Counter(m.group(0).lower() for m in _MADE.finditer(text))
    if set(seen) != set(positions) or any(count != 1 for count in seen.values()):
        return None
    normalised = _MADE.sub(lambda m: f"\x00{positions[m.group(0).lower()]}\x00", text)
    return normalised, tuple((info.id, stand_in_schema(info).json()) for info in views.values())


def _trim(kept: OrderedDict[Any, Any], limit: int) -> None:
    while len(kept) > limit:
        kept.popitem(last=False)


_CACHES: weakref.WeakKeyDictionary[Any, PlanCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def cached_plan(spark: SparkSession, run: Callable[[str], DataFrame], bind: Bind) -> EnginePlan:
    """:meth:`PlanCache.plan` in the cache of ``spark``'s session."""
    with _CACHES_LOCK:
        cache = _CACHES.get(spark)
        if cache is None:
            cache = _CACHES[spark] = PlanCache(spark)
    return cache.plan(run, bind)
