"""A dynamic table's full refresh as the difference between its content and the query's.

Rewriting the whole table would give every row a new row id, so a stream on the table
would report every row deleted and inserted again at each refresh. The diff keeps the
row ids of unchanged rows and yields only the real changes, from one Spark query with
one shuffle (adaptive execution runs its map side as a job of its own); only the
changed rows reach the driver.

All three match values by the one equality of :mod:`pipelines.change_sets` (NULL
equals NULL, every NaN equals every NaN, -0.0 differs from 0.0, nested values by value),
each in its engine's form of it:

- :func:`arrow_value_diff` (queries whose rows carry no stable id; what a refresh
  uses): rows are matched by value as a multiset, in Arrow on the driver, grouped by
  :func:`~pipelines.change_sets.arrow_key`.
- :func:`value_diff`: the same difference in Spark, for columns Arrow cannot group by
  (lists, structs, maps; no table column has those types today), grouped by
  :func:`~pipelines.change_sets.spark_key` (Spark alone would take -0.0 for 0.0). Maps
  are equal whatever the order of their entries; an inserted row of a column without
  floats gets the group's normalised value (map entries sorted by key), of a column with
  floats a new row's value as the query gave it. VARIANT, even nested, cannot be grouped
  by.
- :func:`id_diff` (queries whose rows carry a deterministic row id): rows are matched
  by id and compared null-safely by :func:`~pipelines.change_sets.spark_key`. Neither
  MAP nor VARIANT can be compared.

A column these cannot handle raises :class:`UncomparableColumnError`; the caller then
replaces the whole content instead.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql import types as T

from flush.tables import ROW_ID_COLUMN
from pipelines.change_sets import arrow_key, keyed, spark_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "IdDiff",
    "UncomparableColumnError",
    "ValueDiff",
    "arrow_value_diff",
    "id_diff",
    "value_diff",
]

# Working columns; the leading underscores keep them apart from user columns.
_NEW, _OLD, _IDS, _GONE, _COPIES, _KIND = (
    "__DIFF_NEW", "__DIFF_OLD", "__DIFF_IDS", "__DIFF_GONE", "__DIFF_COPIES", "__DIFF_KIND",
)  # fmt: skip
_INSERT, _UPDATE, _DELETE = 0, 1, 2
# Spark's refusals when a type cannot be grouped by or compared (the backstop for types
# the schema walk below does not know of, e.g. in another Spark version).
_REFUSALS = ("GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE", "DATATYPE_MISMATCH.INVALID_ORDERING_TYPE")


class UncomparableColumnError(ValueError):
    """A column's type cannot be grouped by or compared in Spark: no diff is possible.

    Attributes:
        column: the column's name.
        type_name: its Spark type (``VARIANT``, ``MAP<STRING, INT>``), for a reason code.
    """

    def __init__(self, column: str, type_name: str, why: str) -> None:
        super().__init__(
            f"column {column!r} of type {type_name} cannot be diffed ({why}); "
            "the refresh must replace the whole content"
        )
        self.column, self.type_name = column, type_name


@dataclass(frozen=True, slots=True)
class ValueDiff:
    """What turns the old content into the new one, rows matched by value.

    Attributes:
        deleted: ids of old rows to delete (int64).
        inserted: rows to insert, user columns only; the caller reserves their ids.
    """

    deleted: pa.Array
    inserted: pa.Table

    @property
    def num_deleted(self) -> int:
        return len(self.deleted)

    @property
    def num_inserted(self) -> int:
        return self.inserted.num_rows


@dataclass(frozen=True, slots=True)
class IdDiff:
    """What turns the old content into the new one, rows matched by row id.

    Attributes:
        rows: inserted rows, then updated rows (their new state), with their row ids.
        deleted: ids of old rows to delete (int64).
        inserted: how many leading ``rows`` are inserts.
        updated: how many trailing ``rows`` are updates.
    """

    rows: pa.Table
    deleted: pa.Array
    inserted: int
    updated: int

    @property
    def new_ids(self) -> pa.Array:
        """Ids no old row holds (the change set's ``new_ids``)."""
        return self.rows.column(ROW_ID_COLUMN).slice(0, self.inserted).combine_chunks()


def value_diff(old: DataFrame, new: DataFrame, columns: Sequence[str]) -> ValueDiff:
    """The multiset difference between ``old`` (user columns and unique row ids) and
    ``new`` (the query's result), so that applying it to ``old`` gives ``new`` with as
    few changed rows as possible.

    Both sides are unioned and grouped by all user columns (one shuffle; no join, which
    would need a window to pair duplicates), a column holding floats by its
    :func:`~pipelines.change_sets.spark_key` (so -0.0 and 0.0 fall apart) with its value
    taken from a new row of the group. A group whose old and new counts differ
    changed: surplus old copies lose their highest ids, so the lowest ids stay and a
    refresh after a refresh is stable; missing copies are inserted. Spark already
    picks the ids to delete and counts the copies to insert, so the driver receives
    one row per changed group plus the deleted ids, never the unchanged rows.

    Args:
        old: the table's content, ``columns`` and ``_INGEST_ROW_ID``.
        new: the query's result, ``columns`` of the same types.
        columns: the user columns, in table order.

    Raises:
        UncomparableColumnError: a column of a type Spark cannot group by (VARIANT).
    """
    _check(old, columns, (T.VariantType,), "GROUP_EXPRESSION_TYPE_IS_NOT_ORDERABLE")
    named, columns = columns, _positions(columns)
    old, new = _positional(old, named), _positional(new, named)
    values = [F.col(_q(name)) for name in columns]
    both = old.select(*values, F.col(ROW_ID_COLUMN), F.lit(0).alias(_NEW)).unionByName(
        new.select(*values, F.lit(None).cast("bigint").alias(ROW_ID_COLUMN), F.lit(1).alias(_NEW))
    )
    types = {f.name: f.dataType for f in both.schema.fields}
    floats = [name for name in columns if keyed(types[name])]
    keys = [spark_key(F.col(name), types[name]).alias(f"{name}_KEY") if name in floats
            else F.col(name) for name in columns]  # fmt: skip
    taken = [F.max_by(name, _NEW).alias(name) for name in floats]  # a new row's value
    n_new, n_old = F.col(_NEW), F.size(_IDS)
    with _refusals():
        changed = (
            both.groupBy(*keys)
            .agg(  # collect_list skips the NULL ids of the new rows
                F.sum(_NEW).cast("int").alias(_NEW),
                F.sort_array(F.collect_list(ROW_ID_COLUMN)).alias(_IDS),
                *taken,
            )
            .where(n_new != n_old)
            .select(
                *values,
                F.when(n_old > n_new, F.slice(_IDS, n_new + 1, n_old - n_new)).alias(_GONE),
                F.greatest(n_new - n_old, F.lit(0)).alias(_COPIES),
            )
            .toArrow()
        )
    deleted = pc.list_flatten(changed.column(_GONE)).combine_chunks().cast(pa.int64())
    copies = changed.column(_COPIES).combine_chunks().cast(pa.int32())
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(copies)])
    # One list of copies[i] slots per group: its parent indices repeat each group's index.
    slots = pa.ListArray.from_arrays(offsets, pa.nulls(offsets[-1].as_py()))
    inserted = changed.select(list(columns)).take(pc.list_parent_indices(slots))
    return ValueDiff(deleted=deleted, inserted=inserted.rename_columns(list(named)))


def arrow_value_diff(old: pa.Table, new: pa.Table) -> ValueDiff:
    """:func:`value_diff` in Arrow, on the driver: the same multiset difference and the
    same choice of ids (surplus copies lose their highest ids), about ten times cheaper
    than Spark's grouping by every column (``bench/dynamic_tables.py``).

    Rows are grouped by :func:`~pipelines.change_sets.arrow_key`, Arrow's form of the
    one equality, for every type a table column has: NULL equals NULL, every NaN equals
    every NaN (an inserted one is written as the one NaN), and -0.0 differs from 0.0, so
    an update from one to the other is a change.

    Args:
        old: the table's content: its user columns, then ``_INGEST_ROW_ID``.
        new: the query's result: the same user columns, of the same types.

    Raises:
        pyarrow.ArrowNotImplementedError: a column of a type Arrow cannot group by
            (lists, structs, maps); :func:`value_diff` can.
    """
    width = new.num_columns
    keys = _positions(new.column_names)
    ids = old.column(ROW_ID_COLUMN).cast(pa.int64())
    new = new.cast(old.schema.remove(width))
    both = pa.concat_tables([
        pa.table([*map(arrow_key, old.columns[:width]), ids,
                  pa.array(np.zeros(old.num_rows, np.int8))], names=[*keys, _IDS, _NEW]),
        pa.table([*map(arrow_key, new.columns), pa.nulls(new.num_rows, pa.int64()),
                  pa.array(np.ones(new.num_rows, np.int8))], names=[*keys, _IDS, _NEW]),
    ])  # fmt: skip
    grouped = both.group_by(keys).aggregate([(_NEW, "sum"), (_IDS, "count"), (_IDS, "list")])
    n_new, n_old = grouped.column(f"{_NEW}_sum"), grouped.column(f"{_IDS}_count")
    changed = grouped.filter(pc.not_equal(n_new, n_old))
    n_new = changed.column(f"{_NEW}_sum").combine_chunks().cast(pa.int64())
    n_old = changed.column(f"{_IDS}_count").combine_chunks().cast(pa.int64())
    # Deleted: in each group, the old ids past the first n_new of them in id order.
    lists = changed.column(f"{_IDS}_list").combine_chunks()
    flat = pa.table({"g": pc.list_parent_indices(lists), "id": pc.list_flatten(lists)})
    flat = flat.filter(pc.is_valid(flat.column("id")))  # the new rows' NULL ids
    flat = flat.sort_by([("g", "ascending"), ("id", "ascending")])
    group = flat.column("g").combine_chunks()
    starts = pc.subtract(pc.cumulative_sum(n_old), n_old)
    position = pc.subtract(pa.array(np.arange(flat.num_rows, dtype=np.int64)), starts.take(group))
    deleted = flat.column("id").filter(pc.greater_equal(position, n_new.take(group)))
    # Inserted: max(n_new - n_old, 0) copies of each group's values.
    copies = pc.max_element_wise(pc.subtract(n_new, n_old), 0).cast(pa.int32())
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(copies)])
    slots = pa.ListArray.from_arrays(offsets, pa.nulls(offsets[-1].as_py()))
    inserted = changed.select(keys).take(pc.list_parent_indices(slots))
    return ValueDiff(deleted=deleted.combine_chunks(),
                     inserted=inserted.rename_columns(new.column_names))  # fmt: skip


def id_diff(old: DataFrame, new: DataFrame, columns: Sequence[str]) -> IdDiff:
    """The difference between ``old`` and ``new`` when both carry row ids that mean
    the same row (a stateless query passes its sources' ids through).

    One full outer join on the int64 id (one shuffle); a row in both with every column
    the same value (null-safe, compared by :func:`~pipelines.change_sets.spark_key`, so
    -0.0 and 0.0 differ) is unchanged and never leaves Spark.

    Args:
        old: the table's content, ``columns`` and ``_INGEST_ROW_ID``.
        new: the query's result, ``columns`` and ``_INGEST_ROW_ID`` (unique).
        columns: the user columns, in table order.

    Raises:
        UncomparableColumnError: a column of a type Spark cannot compare (MAP, VARIANT).
    """
    _check(old, columns, (T.MapType, T.VariantType), "DATATYPE_MISMATCH.INVALID_ORDERING_TYPE")
    named, columns = columns, _positions(columns)
    old, new = _positional(old, named), _positional(new, named)
    keys = [F.col(_q(name)) for name in columns]
    n = new.select(*keys, F.col(ROW_ID_COLUMN), F.lit(True).alias(_NEW)).alias("n")
    o = old.select(*keys, F.col(ROW_ID_COLUMN), F.lit(True).alias(_OLD)).alias("o")
    joined = n.join(o, ROW_ID_COLUMN, "full_outer")
    new_types = {f.name: f.dataType for f in new.schema.fields}
    old_types = {f.name: f.dataType for f in old.schema.fields}
    pairs = (
        spark_key(F.col(f"n.{_q(c)}"), new_types[c]).eqNullSafe(
            spark_key(F.col(f"o.{_q(c)}"), old_types[c])
        )
        for c in columns
    )
    same = functools.reduce(operator.and_, pairs, F.lit(True))
    kind = (
        F.when(F.col(_OLD).isNull(), _INSERT)
        .when(F.col(_NEW).isNull(), _DELETE)
        .when(~same, _UPDATE)
    )
    with _refusals():
        changed = (
            joined.select(
                *(F.col(f"n.{_q(c)}").alias(c) for c in columns),
                F.col(ROW_ID_COLUMN),
                kind.cast("tinyint").alias(_KIND),
            )
            .where(F.col(_KIND).isNotNull())
            .toArrow()
        )
    kinds = changed.column(_KIND)
    rows = changed.select([*columns, ROW_ID_COLUMN]).rename_columns([*named, ROW_ID_COLUMN])
    inserts = rows.filter(pc.equal(kinds, _INSERT))
    updates = rows.filter(pc.equal(kinds, _UPDATE))
    gone = changed.column(ROW_ID_COLUMN).filter(pc.equal(kinds, _DELETE))
    return IdDiff(
        rows=pa.concat_tables([inserts, updates]),
        # once each: a table whose group ids an older rule gave holds some twice
        deleted=pc.unique(gone.combine_chunks()).cast(pa.int64()),
        inserted=inserts.num_rows,
        updated=updates.num_rows,
    )


def _positions(columns: Sequence[str]) -> list[str]:
    """The names the diff gives the user columns inside its plans: by position, so no
    user column can meet a working column of the same name."""
    return [f"__DIFF_C{i}" for i in range(len(columns))]


def _positional(frame: DataFrame, columns: Sequence[str]) -> DataFrame:
    """``frame`` with its user ``columns`` renamed by :func:`_positions` (the row id, when
    there, kept)."""
    renamed = [F.col(_q(c)).alias(p) for c, p in zip(columns, _positions(columns), strict=True)]
    extra = [F.col(ROW_ID_COLUMN)] if ROW_ID_COLUMN in frame.columns else []
    return frame.select(*renamed, *extra)


def _q(name: str) -> str:
    """A quoted identifier: a dot or space in a column name is part of the name."""
    return "`" + name.replace("`", "``") + "`"


def _contains(dtype: T.DataType, kinds: tuple[type[T.DataType], ...]) -> bool:
    if isinstance(dtype, kinds):
        return True
    if isinstance(dtype, T.ArrayType):
        return _contains(dtype.elementType, kinds)
    if isinstance(dtype, T.MapType):
        return _contains(dtype.keyType, kinds) or _contains(dtype.valueType, kinds)
    if isinstance(dtype, T.StructType):
        return any(_contains(f.dataType, kinds) for f in dtype.fields)
    return False


def _check(
    frame: DataFrame, columns: Sequence[str], kinds: tuple[type[T.DataType], ...], why: str
) -> None:
    """Refuse the known uncomparable types from the schema, before Spark does: its
    refusal is also logged at ERROR with the whole plan, on a path that is not an error
    for the caller."""
    types = {f.name: f.dataType for f in frame.schema.fields}
    for name in columns:
        if _contains(types[name], kinds):
            raise UncomparableColumnError(name, types[name].simpleString().upper(), why)


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """Turn Spark's refusal of a type that :func:`_check` did not know of into
    :class:`UncomparableColumnError`, naming the expression Spark names."""
    try:
        yield
    except AnalysisException as exc:
        condition = exc.getCondition()
        if condition not in _REFUSALS:
            raise
        shown = exc.getMessageParameters() or {}
        column = shown.get("sqlExpr", "?").strip('"')
        raise UncomparableColumnError(
            column, shown.get("dataType", "?").strip('"'), str(condition)
        ) from exc
