"""The query-delta engine: a query's net change between two versions of its sources,
built operator by operator from Spark's optimized plan and run by Spark.

Every operator of the plan is evaluated three ways, each a DataFrame with the operator's
output columns (the plan's attributes, ids kept) and a row id: its rows at the **old**
versions, at the **new** versions, and its **delta** (rows with a sign, +1 inserted, -1
deleted, whose signed sum turns old into new). The rules, for an operator over inputs
whose deltas are known:

- projection, filter: applied to each row of the delta as to the rows (the row id
  passes through);
- UNION ALL: the children's deltas, each branch's ids hashed with its position;
- inner and cross join: ``dA ⋈ B_new + A_old ⋈ dB`` (the two-term delta rule); a joined
  row's id is a hash of its two sources' ids, so a changed row on either side shows as a
  deletion and an insertion of one id, an update;
- semi, anti, outer and existence joins (:mod:`.existence`): the rows of the kept side
  that changed, or that the condition matches with a changed row of the other side, are
  recomputed at both versions (the condition as written: NOT IN's NULL rule holds, a
  NULL matches all);
- aggregation (GROUP BY, DISTINCT, scalar aggregates): the groups whose input changed
  are aggregated again at both versions: every aggregate stays exact (MIN, MAX, COUNT
  DISTINCT, float sums) and a group's row id is a hash of its key, kept while it exists;
- window with PARTITION BY: the partitions whose input changed are computed again.

Nothing is held between refreshes but the table (no operator state in memory): a refresh
reads the sources at the two versions and their changes; what it collects is the
consolidated delta of the query (:meth:`Deltas.net`), which grows with the change. An
aggregation of counts, sums, averages, minima and maxima at the root reads less:
its table keeps each group's state in hidden columns, and its change is computed from
the input's change and that state alone (:mod:`.algebraic`). Which plans the rules
cover, and the reason codes of those they do not, is :mod:`.coverage`.

Row ids are 64-bit hashes (``xxhash64``) of the ids and keys they derive from: two rows
of one table share an id with probability about n²/2⁶⁵ (1 in 300,000 for ten million
rows); a refresh that meets one fails rather than merge them (:meth:`Deltas.net`).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipelines.change_sets import keyed, spark_key
from pipelines.incremental import algebraic, existence, pruning, row_maps, subqueries
from pipelines.incremental.coverage import ROW_WISE
from pipelines.incremental.group_ids import GROUP_ID_RULE, group_id, grouping
from pipelines.incremental.hidden import COUNT as _COUNT
from pipelines.incremental.hidden import HIT_LEFT as _HIT_LEFT
from pipelines.incremental.hidden import HIT_RIGHT as _HIT_RIGHT
from pipelines.incremental.hidden import ID, SIGN
from pipelines.incremental.hidden import KEY as _KEY
from pipelines.incremental.hidden import LEFT as _LEFT
from pipelines.incremental.hidden import RIGHT as _RIGHT
from pipelines.incremental.plan import Node, PlanReader, cast_select, join_type

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_SPARK_HOW = {"Inner": "inner", "Cross": "cross", "LeftOuter": "left_outer",
              "RightOuter": "right_outer", "FullOuter": "full_outer",
              "LeftSemi": "left_semi", "LeftAnti": "left_anti"}  # fmt: skip

__all__ = ["GROUP_ID_RULE", "ID", "SIGN", "Deltas", "Source", "group_id", "grouping"]


class Source:
    """A source table as the engine reads it: its rows at the old and new versions and
    its net change, each with the table's columns in order, then ``ID`` (and ``SIGN``
    in ``changes``). Read on demand: a FULL evaluation reads the new rows only."""

    def old(self) -> DataFrame:
        raise NotImplementedError

    def new(self) -> DataFrame:
        raise NotImplementedError

    def changes(self) -> DataFrame:
        raise NotImplementedError

    def unchanged(self) -> bool:
        """Whether the old and new versions are known to be one (no change to read)."""
        return False

    def prunable(self, version: str) -> bool:
        """Whether reading only some of the rows at ``version`` can pay off (:mod:`.pruning`)."""
        return False

    def pruned(
        self, version: str, position: int | None, values: list[Any], nulls: bool = False
    ) -> DataFrame | None:  # fmt: skip
        """The rows at ``version`` of only the files whose statistics of the column at
        ``position`` (None: the row id) admit one of the sorted ``values`` (or, with
        ``nulls``, may hold a NULL of it); None when that leaves no file out."""
        return None


class Deltas:
    """The three evaluations of every operator of one plan (memoised per node)."""

    def __init__(
        self, reader: PlanReader, root: Node, source: Callable[[Node], Source],
        kept: Callable[[], DataFrame] | None = None, state: algebraic.Layout | None = None,
        memo: tuple[dict[Any, Any], dict[Any, Any]] | None = None,
    ) -> None:  # fmt: skip
        """``kept``: the root's rows at the old versions as a table holds them (a dynamic
        table's content, its columns in the root's order, then ``ID``, then the state
        columns of ``state``), which :meth:`net` reads instead of computing them again
        where it can; ``state``: the root aggregation's state the table keeps
        (:mod:`.algebraic`), maintained from the change alone; ``memo``: where the
        subqueries' plans and the leaves' binding columns are kept (the plan's own)."""
        self.reader, self.root, self.source, self._kept = reader, root, source, kept
        self.layout = state
        self._memo: dict[tuple[int, str], DataFrame] = {}
        self._still: dict[int, bool] = {}
        # What depends on the plan alone (``memo``: the plan's own, kept with it)
        self._subqueries: dict[int, list[tuple[Any, Node]]] = memo[0] if memo else {}
        self._binders: dict[tuple[int, tuple[str, ...]], list[Column]] = memo[1] if memo else {}
        self.pruning_values: dict[tuple[int, str], tuple[DataFrame, list[Any] | None, bool]] = {}

    # The rows at a version ("old", "new") and the delta ("delta"), per operator
    def state(self, node: Node, version: str) -> DataFrame:
        return self.memoised(node, version, lambda: self._state(node, version))

    def delta(self, node: Node) -> DataFrame:
        return self.memoised(node, "delta", lambda: self._delta(node))

    def subqueries(self, node: Node) -> list[tuple[Any, Node]]:
        """The subquery expressions in ``node``'s expressions, each with its plan (one
        :class:`Node` tree per refresh: the evaluations of its operators are memoised)."""
        if id(node) not in self._subqueries:  # (shared by refreshes: the first one kept)
            self._subqueries.setdefault(id(node), [
                (s, existence.subquery_plan(self.reader, s.plan()))
                for s in subqueries.expressions(self.reader, node)])  # fmt: skip
        return self._subqueries[id(node)]

    def unchanged(self, node: Node) -> bool:
        """Whether nothing under ``node`` changed: its delta is empty, and a rule skips
        the terms (and the scans) that would compute it."""
        if id(node) not in self._still:
            children = [*node.children, *(plan for _, plan in self.subqueries(node))]
            self._still[id(node)] = (all(self.unchanged(c) for c in children) if children
                                     else node.kind in row_maps.CONSTANT
                                     or self.source(node).unchanged())  # fmt: skip
        return self._still[id(node)]

    def split(self, node: Node) -> bool:
        """Whether ``node``'s delta is its new rows of some ids with +1 and its old rows
        of the same ids with -1 (nothing cancelled, nothing else), so that a rule may
        read those rows from the delta instead of the states. Every rule's delta has
        that form but the two-term join of two changed sides."""
        if self.unchanged(node) or not node.children:
            return True
        if node.kind == "Join" and join_type(node) in ("Inner", "Cross"):
            return any(self.unchanged(c) for c in node.children) and all(
                self.split(c) for c in node.children)  # fmt: skip
        if node.kind in ROW_WISE or node.kind == "Union":
            return all(self.split(c) for c in node.children)
        return True

    def leaf_rows(self, node: Node, frame: DataFrame, keep: list[str]) -> DataFrame:
        """A source's ``frame`` as the leaf ``node``'s rows (its attributes, then ``keep``):
        :meth:`PlanReader.rebound`, with the binding columns made once per refresh."""
        names = tuple(n for n in frame.columns if n not in keep)
        if (id(node), names) not in self._binders:
            self._binders[(id(node), names)] = self.reader.binders(names, node.output)
        return frame.select(*self._binders[(id(node), names)], *keep)

    def made(self, node: Node, what: str) -> DataFrame | None:
        """The frame :meth:`memoised` made for ``node`` and ``what`` (None: not yet)."""
        return self._memo.get((id(node), what))

    def memoised(self, node: Node, what: str, make: Callable[[], DataFrame]) -> DataFrame:
        """``make()``'s frame for ``node`` and ``what``, made once per refresh."""
        key = (id(node), what)
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def _state(self, node: Node, version: str) -> DataFrame:
        if node.kind in row_maps.CONSTANT:
            return row_maps.constant(self.reader, node)
        if not node.children:
            source = self.source(node)
            frame = source.old() if version == "old" else source.new()
            return self.leaf_rows(node, frame, [ID])
        return self.evaluated(node, [self.state(c, version) for c in node.children], version)

    def evaluated(self, node: Node, inputs: list[DataFrame], version: str) -> DataFrame:
        """``node`` evaluated over its children's rows at ``version``, ``inputs``."""
        if node.kind == "Aggregate":
            return self._aggregate(node, inputs[0], version)
        if node.kind == "Window":
            return self._window(node, inputs[0])
        if node.kind == "Join":
            return self._join(node, inputs[0], inputs[1], [], version)
        return self._row_wise(node, inputs, [], version)

    def _delta(self, node: Node) -> DataFrame:
        from pyspark.sql import functions as F

        if self.unchanged(node):  # Spark folds the false filter: nothing is read
            return self.state(node, "new").where(F.lit(False)).withColumn(SIGN, F.lit(1))
        if not node.children:
            changes = self.source(node).changes()
            return self.leaf_rows(node, changes, [ID, SIGN])
        if self.subqueries(node) and subqueries.changed(self, node):
            return subqueries.recomputed(self, node)  # (else: the rules, with one value)
        if node.kind in ROW_WISE or node.kind == "Union":
            return self._row_wise(node, [self.delta(c) for c in node.children], [SIGN])
        if node.kind == "Join" and join_type(node) in ("Inner", "Cross"):
            left, right = node.children
            terms = []  # a side that did not change adds no term
            if not self.unchanged(left):
                right_rows = self._matching(node, 1, "new", self.delta(left))
                terms.append(self._join(node, self.delta(left), right_rows, [SIGN]))
            if not self.unchanged(right):
                left_rows = self._matching(node, 0, "old", self.delta(right))
                terms.append(self._join(node, left_rows, self.delta(right), [SIGN]))
            return functools.reduce(lambda a, b: a.union(b), terms)
        if node.kind == "Join":
            return self._recomputed_join(node)
        child = node.children[0]
        keys = (self.reader.items(node.jvm.groupingExpressions()) if node.kind == "Aggregate"
                else self.reader.items(node.jvm.partitionSpec()))  # fmt: skip
        touched = self._touched_keys(keys, self.delta(child)) if keys else None
        parts = []
        for version, sign in (("new", 1), ("old", -1)):
            rows = (self.state(child, version) if touched is None
                    else self.restricted(self._keyed(child, version, keys, touched), keys, touched))
            evaluated = (self._aggregate(node, rows, version) if node.kind == "Aggregate"
                         else self._window(node, rows))  # fmt: skip
            parts.append(evaluated.withColumn(SIGN, F.lit(sign)))
        return parts[0].union(parts[1])

    # Operators
    def _row_wise(
        self, node: Node, inputs: list[DataFrame], extra: list[str], version: str = "new"
    ) -> DataFrame:  # fmt: skip
        """``node`` over ``inputs`` (a scalar subquery of it: its value at ``version``)."""
        from pyspark.sql import functions as F

        if self.subqueries(node):
            return subqueries.evaluated(self, node, inputs[0], version, extra)
        columns = self.reader.columns
        if node.kind == "Project":
            return inputs[0].select(*columns(node.jvm.projectList()), ID, *extra)
        if node.kind == "Filter":
            return inputs[0].where(self.reader.column(node.jvm.condition()))
        if node.kind == "Expand":
            return row_maps.expand(self.reader, node, inputs[0], extra)
        if node.kind == "Generate":
            return row_maps.generate(self.reader, node, inputs[0], extra)
        branches = [  # Union: each branch's ids told apart by its position
            frame.withColumn(ID, F.xxhash64(F.col(ID), F.lit(position)))
            for position, frame in enumerate(inputs)
        ]
        return functools.reduce(lambda a, b: a.union(b), branches)

    def _aggregate(self, node: Node, rows: DataFrame, version: str = "new") -> DataFrame:
        return self.aggregate(node, rows, [], version)

    def aggregate(
        self, node: Node, rows: DataFrame, state: list[Column], version: str = "new"
    ) -> DataFrame:  # fmt: skip
        """The aggregation of ``rows``, each group with its id, then the aggregates
        ``state`` (named columns) over its rows; its scalar subqueries' values are those
        at ``version``, grouped by as keys (one value: the groups are the same)."""
        from pyspark.sql import functions as F

        keys_of = self.reader.items(node.jvm.groupingExpressions())
        keys = [grouping(self.reader, k) for k in keys_of]
        if self.subqueries(node):
            rows = subqueries.attached(self, node, rows, version)
            keys += [F.col(n) for n in subqueries.names(self, node)]
        outputs = self.reader.items(node.jvm.aggregateExpressions())
        grouped = rows.groupBy(*keys).agg(*[subqueries.column(self, node, e) for e in outputs],
                                          group_id(keys_of, self.reader).alias(ID), *state)
        named = grouped.columns[len(grouped.columns) - len(state):]
        return grouped.select(*[self.reader.column(e.toAttribute()) for e in outputs], ID,
                              *named)  # fmt: skip

    def _window(self, node: Node, rows: DataFrame) -> DataFrame:
        child = [self.reader.column(a) for a in node.children[0].output]
        windows = self.reader.columns(node.jvm.windowExpressions())
        return rows.select(*child, *windows, ID)

    def _join(
        self, node: Node, left: DataFrame, right: DataFrame, extra: list[str],
        version: str = "new",
    ) -> DataFrame:  # fmt: skip
        """The join of two evaluations of its children; ``extra`` (the sign) comes from
        whichever side holds it."""
        outputs = [self.reader.column(a) for a in node.output]
        return self._join_with_ids(node, left, right, version).select(*outputs, ID, *extra)

    def _recomputed_join(self, node: Node) -> DataFrame:
        """Semi, anti and outer joins: the rows of the kept side(s) whose result can have
        changed, recomputed at both versions."""
        from pyspark.sql import functions as F

        kind = join_type(node)
        left, right = node.children
        keep_left = kind in ("LeftSemi", "LeftAnti", "LeftOuter", "FullOuter",
                             existence.EXISTENCE)  # fmt: skip
        keep_right = kind in ("RightOuter", "FullOuter")
        if kind != "FullOuter":
            kept, other = (left, right) if keep_left else (right, left)
            if self.unchanged(other) and self.split(kept):
                return self._kept_changes(node, keep_left)
        touched_left = self._touched(node, left, right) if keep_left else None
        touched_right = self._touched(node, right, left) if keep_right else None
        parts = []
        for version, sign in (("new", 1), ("old", -1)):
            l_rows, r_rows = self.state(left, version), self.state(right, version)
            if kind != "FullOuter":
                if touched_left is not None:  # (and the other side's rows they can meet)
                    l_rows = self._by_ids(left, version, touched_left)
                    r_rows = self._matching(node, 1, version, l_rows)
                if touched_right is not None:
                    r_rows = self._by_ids(right, version, touched_right)
                    l_rows = self._matching(node, 0, version, r_rows)
                joined = self._join(node, l_rows, r_rows, [], version)
            else:
                joined = self._full_touched(node, (l_rows, r_rows), touched_left,
                                            touched_right, version)  # fmt: skip
            parts.append(joined.withColumn(SIGN, F.lit(sign)))
        return parts[0].union(parts[1])

    def _kept_changes(self, node: Node, left_kept: bool) -> DataFrame:
        """A semi, anti or one-sided outer join whose other side did not change: the kept
        side's changed rows, joined at each version as the delta holds them
        (:meth:`split`), are all that can differ; the kept side is not read again."""
        from pyspark.sql import functions as F

        kept = node.children[0] if left_kept else node.children[1]
        parts = []
        for version, sign in (("new", 1), ("old", -1)):
            rows = self.delta(kept).where(F.col(SIGN) == sign).drop(SIGN)
            others = self._matching(node, int(left_kept), version, rows)
            pair = (rows, others) if left_kept else (others, rows)
            parts.append(self._join(node, *pair, [], version).withColumn(SIGN, F.lit(sign)))
        return parts[0].union(parts[1])

    def _touched(self, node: Node, kept: Node, other: Node) -> DataFrame:
        """Ids of ``kept``'s rows whose join result can differ: those that changed, and
        those the condition matches with a changed row of ``other`` (at either
        version)."""
        from pyspark.sql import functions as F

        condition = self.reader.option(node.jvm.condition())
        on = subqueries.column(self, node, condition) if condition is not None else F.lit(True)
        changed = self.delta(kept).select(ID)
        if self.unchanged(other):  # no row of the other side can match anew
            return self.materialised(changed.distinct())
        side = 0 if kept is node.children[0] else 1
        both = self._matching(node, side, "old", self.delta(other)).union(
            self._matching(node, side, "new", self.delta(other)))  # fmt: skip
        if self.subqueries(node):  # (one value at both versions here)
            both = subqueries.attached(self, node, both, "new")
        changed_other = self.delta(other).drop(SIGN).withColumnRenamed(ID, _KEY)
        matched = both.join(changed_other, on=on, how="left_semi").select(ID)
        return self.materialised(changed.union(matched).distinct())

    def materialised(self, frame: DataFrame) -> DataFrame:
        """``frame`` computed now and read back as a new relation: what a change touched
        (ids, keys) is small, and a relation of its own shares no column with the plans
        it then restricts (Spark renames a side whose columns it meets again)."""
        from flush.spark_tables import arrow_frame

        return arrow_frame(self.reader.spark, frame.toArrow())

    def _full_touched(
        self, node: Node, sides: tuple[DataFrame, DataFrame],
        touched_left: DataFrame | None, touched_right: DataFrame | None, version: str,
    ) -> DataFrame:  # fmt: skip
        """A full outer join's rows that hold a touched row of either side."""
        from pyspark.sql import functions as F

        joined = self._join_with_ids(node, *sides, version)
        for touched, column, flag in ((touched_left, _LEFT, _HIT_LEFT),
                                      (touched_right, _RIGHT, _HIT_RIGHT)):
            assert touched is not None
            marks = touched.select(F.col(ID).alias(_KEY), F.lit(True).alias(flag))
            joined = joined.join(marks, F.col(column) == F.col(_KEY), "left_outer").drop(_KEY)
        hit = F.coalesce(F.col(_HIT_LEFT), F.col(_HIT_RIGHT), F.lit(False))
        outputs = [self.reader.column(a) for a in node.output]
        return joined.where(hit).select(*outputs, ID)

    def _join_with_ids(
        self, node: Node, left: DataFrame, right: DataFrame, version: str
    ) -> DataFrame:  # fmt: skip
        """The join with both sides' ids kept as ``_LEFT`` and ``_RIGHT`` and the joined
        row's id as ``ID``: the kept row's for semi and anti joins, else a hash of the
        two (a missing side told apart from any id); its condition's scalar subqueries
        read their values at ``version`` (joined to the left side)."""
        from pyspark.sql import functions as F

        kind = join_type(node)
        condition = self.reader.option(node.jvm.condition())
        on = subqueries.column(self, node, condition) if condition is not None else F.lit(True)
        if self.subqueries(node):
            left = subqueries.attached(self, node, left, version)
        if kind == existence.EXISTENCE:
            return existence.marked(self.reader, node, left.withColumnRenamed(ID, _LEFT),
                                    right.withColumnRenamed(ID, _RIGHT), on)  # fmt: skip
        joined = left.withColumnRenamed(ID, _LEFT).join(
            right.withColumnRenamed(ID, _RIGHT), on=on, how=_SPARK_HOW[kind]
        )
        if kind in ("LeftSemi", "LeftAnti"):
            return joined.withColumn(ID, F.col(_LEFT))
        row_id = F.xxhash64(F.col(_LEFT), F.col(_RIGHT), F.col(_LEFT).isNull(),
                            F.col(_RIGHT).isNull())  # fmt: skip
        return joined.withColumn(ID, row_id)

    def _touched_keys(
        self, keys: list[Any], changes: DataFrame, hashed: bool = False
    ) -> DataFrame:
        """The distinct values ``keys`` (expressions over the rows) take in ``changes``,
        as columns ``_INGEST_K0...``: the groups or partitions a change touched,
        computed once and read back by both versions' :meth:`restricted`; ``hashed``:
        with the id :meth:`_aggregate` gives their group, as ``ID``."""
        columns = [self.reader.column(k) for k in keys]
        names = [f"{_KEY}{i}" for i in range(len(columns))]
        touched = changes.select(*[c.alias(n) for c, n in zip(columns, names, strict=True)])
        touched = touched.distinct()
        if hashed:  # hashed before the round trip, over the values' own types
            touched = touched.withColumn(ID, group_id(keys, self.reader, names))
        return self.materialised(touched)

    # Reading less (:mod:`.pruning`)
    def _matching(self, node: Node, side: int, version: str, other: DataFrame) -> DataFrame:
        """The rows at ``version`` of the join's child ``side`` (0: left) that can meet a
        row of ``other`` (rows of the other child): by the condition's equalities."""
        pairs = pruning.equi_keys(self.reader, node)
        return pruning.narrowed(self, node.children[side], version, [
            (pair[side], other, self.reader.column(pair[1 - side])) for pair in pairs])

    def _keyed(self, node: Node, version: str, keys: list[Any], touched: DataFrame) -> DataFrame:
        """``node``'s rows at ``version`` that can hold a ``touched`` key (:meth:`restricted`)."""
        return pruning.narrowed(self, node, version, [  # (NULL matches NULL there)
            (key, touched, f"{_KEY}{i}") for i, key in enumerate(keys)], nulls_match=True)

    def _by_ids(self, node: Node, version: str, ids: DataFrame) -> DataFrame:
        """``node``'s rows at ``version`` of the ids ``ids`` holds."""
        rows = pruning.narrowed(self, node, version, [(None, ids, ID)])
        return rows.join(ids, on=ID, how="left_semi")

    def restricted(self, rows: DataFrame, keys: list[Any], touched: DataFrame) -> DataFrame:
        """``rows`` whose ``keys`` take a value of ``touched`` (:meth:`_touched_keys`;
        NULL matching NULL)."""
        columns: list[Column] = [self.reader.column(k) for k in keys]
        same = [c.eqNullSafe(touched[f"{_KEY}{i}"]) for i, c in enumerate(columns)]
        return rows.join(touched, on=functools.reduce(operator.and_, same), how="left_semi")

    # The answer
    def net(self) -> DataFrame:
        """The root's delta consolidated: each (row, id) once with its net sign, ±1
        (rows whose changes cancel are gone), its columns named by position (``c0``...).
        A net sign past ±1 means two rows share an id (a hash collision, or a source
        whose ids repeat): raised when collected.

        Rows are grouped by the one equality of :mod:`pipelines.change_sets`: a column
        holding floats (or VARIANT) by its :func:`~pipelines.change_sets.spark_key`,
        which tells -0.0 from 0.0 (Spark's grouping takes them for one value and writes
        0.0), and it keeps its own value. With a ``state``, its columns follow ``ID``
        (a row whose state alone changed is an update; a float state by the same rule)."""
        from pyspark.sql import functions as F

        state: list[str] = []
        if self.layout is not None:
            assert self._kept is not None
            delta = algebraic.delta(self, self.layout, self._kept())
            state = self.layout.names
        else:
            kept = self._kept_delta()
            delta = self.delta(self.root) if kept is None else kept
        names = [f"c{i}" for i in range(len(self.root.output))]
        positional = delta.select(
            *[self.reader.column(a).alias(n) for a, n in zip(self.root.output, names,
                                                               strict=True)],
            *state, ID, SIGN)  # fmt: skip
        types = {field.name: field.dataType for field in positional.schema.fields}
        exact = {n for n in [*names, *state] if keyed(types[n])}  # a MIN's state: a float
        keys = [spark_key(F.col(n), types[n]).alias(f"{_KEY}{n}") if n in exact else F.col(n)
                for n in [*names, *state]]  # fmt: skip
        summed = (
            positional.groupBy(*keys, F.col(ID))
            .agg(F.sum(SIGN).alias(_COUNT), *[F.first(n).alias(n) for n in sorted(exact)])
            .where(F.col(_COUNT) != 0)
        )
        checked = F.when(F.abs(F.col(_COUNT)) == 1, F.col(_COUNT)).otherwise(
            F.raise_error(F.lit("two rows of the dynamic table's query share a row id"))
        )
        return summed.select(*names, ID, *state, checked.alias(SIGN))

    def _kept_delta(self) -> DataFrame | None:
        """The root's delta with its old rows read from the kept table (``kept``), when
        the root is an aggregation under projections and filters only (which keep a
        group's id): the touched groups' rows at the old versions are the kept rows of
        their ids, so the aggregation's input is read at the new versions only. None
        where that does not hold (the delta is then computed from both versions)."""
        from pyspark.sql import functions as F

        chain, node = [], self.root
        while node.kind in ("Project", "Filter"):
            chain.append(node)
            node = node.children[0]
        if self._kept is None or node.kind != "Aggregate" or self.unchanged(node):
            return None
        if any(self.subqueries(n) for n in [*chain, node]):  # may change untouched groups
            return None
        keys = self.reader.items(node.jvm.groupingExpressions())
        rows = self.state(node.children[0], "new")
        kept = self._kept()
        names = [*(f"{_KEY}{i}" for i in range(len(kept.columns) - 1)), ID]
        kept = kept.toDF(*names)
        if keys:
            touched = self._touched_keys(keys, self.delta(node.children[0]), hashed=True)
            rows = self.restricted(self._keyed(node.children[0], "new", keys, touched), keys,
                                   touched)  # fmt: skip
            kept = kept.join(touched.select(ID), on=ID, how="left_semi")
        new = self._aggregate(node, rows)
        for above in reversed(chain):
            new = self._row_wise(above, [new], [])
        new = new.withColumn(SIGN, F.lit(1))
        old = cast_select(kept, [(c, f.dataType) for c, f in zip(  # in order: a join on
            names, new.schema.fields, strict=False)]).withColumn(SIGN, F.lit(-1))  # ID moves it
        return new.union(old)

    def rows(self, version: str = "new") -> DataFrame:
        """The root's rows at a version, with their ids (then the ``state`` columns)."""
        if self.layout is not None:
            return algebraic.rows(self, self.layout, version)
        return self.state(self.root, version)
