"""Change sets: the one rule of when a row changed, and the one netting of row states.

A change set says, for a set of row ids, which rows were deleted, inserted or updated.
Every change set of the pipeline layer is netted here: a stream's, from the table's
change data feed (:func:`net_events`), and an incremental refresh's, from the rewritten
query's DELETE and INSERT rows (:func:`net_change`). Both give :func:`net_rows` the
state of each id before and after, and it drops the ids whose two states are the same
value.

**The one equality.** Two values are the same value when both are NULL, or both are
not and: floats have the same bits, except that every NaN is every NaN (a NaN is a
NaN whatever its sign or payload) and -0.0 differs from 0.0, because an update from
one to the other is a change a reader can see; lists, structs and maps hold the same
values in the same places (a map's entries in any order, as Spark groups maps); any
other type is compared by value. It is written once per engine, each form checked
against the others by the tests:

- :func:`same_values`, pairwise in Arrow (the netting);
- :func:`arrow_key`, what Arrow's grouping must group by (the FULL refresh's
  ``arrow_value_diff``);
- :func:`spark_key`, what Spark must compare or group by (``id_diff``, ``value_diff``,
  the query-delta engine's consolidation): Spark's ``<=>`` and grouping take -0.0 for
  0.0, so each float inside a column is compared as its text (``CAST(f AS STRING)``:
  ``-0.0``, ``NaN``, or digits that read back as the same value).

**The column names.** A stream's rows carry :data:`STREAM_ACTION`,
:data:`STREAM_ISUPDATE` and :data:`STREAM_ROW_ID`, the ``METADATA$`` columns a user
selects. An incremental refresh carries its source rows' action through the rewritten
query as the hidden :data:`REFRESH_ACTION`, beside the table's own hidden row id
(``flush.tables.ROW_ID_COLUMN``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flush.tables import ROW_ID_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

__all__ = [
    "REFRESH_ACTION",
    "STREAM_ACTION",
    "STREAM_ISUPDATE",
    "STREAM_ROW_ID",
    "ChangeMode",
    "NetChange",
    "NetRows",
    "arrow_key",
    "keyed",
    "net_change",
    "net_events",
    "net_rows",
    "same_values",
    "spark_key",
]

STREAM_ACTION = "METADATA$ACTION"
STREAM_ISUPDATE = "METADATA$ISUPDATE"
STREAM_ROW_ID = "METADATA$ROW_ID"
REFRESH_ACTION = "_INGEST_ACTION"

_BEFORE_KINDS = pa.array(["delete", "update_preimage"])
_AFTER_KINDS = pa.array(["insert", "update_postimage"])


class ChangeMode(StrEnum):
    """What a stream reports of the rows changed in its range.

    - ``DEFAULT`` (standard streams): net changes; an update is a DELETE + INSERT pair
      with ``METADATA$ISUPDATE`` true and the same row id.
    - ``APPEND_ONLY`` (the reference's meaning): every row inserted in the range, as
      inserted, even if it was updated or deleted later. Reads only the inserts.
    - ``APPEND_ONLY_FINAL`` (Databend's meaning): the final state of the rows inserted in
      the range that still exist.
    """

    DEFAULT = "DEFAULT"
    APPEND_ONLY = "APPEND_ONLY"
    APPEND_ONLY_FINAL = "APPEND_ONLY_FINAL"


# The equality -----------------------------------------------------------------------


def same_values(left: pa.Array | pa.ChunkedArray, right: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Whether each pair of values is the same value by the module's one rule.

    Args:
        left: values of one type.
        right: as many values of the same type.

    Returns:
        A boolean array without nulls (NULL and NULL are the same value).
    """
    return _same(_whole(left), _whole(right))


def _whole(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _same(left: pa.Array, right: pa.Array) -> pa.Array:
    kind = left.type
    if pa.types.is_map(kind):
        return _same(_entries(left), _entries(right))
    both_null = pc.and_(left.is_null(), right.is_null())
    valid = pc.and_(left.is_valid(), right.is_valid())
    if pa.types.is_null(kind):
        return both_null
    if pa.types.is_struct(kind):
        equal = valid
        for mine, theirs in zip(left.flatten(), right.flatten(), strict=True):
            equal = pc.and_(equal, _same(mine, theirs))
    elif _is_list(kind):
        equal = _same_lists(left, right, valid)
    elif pa.types.is_floating(kind):
        equal = pc.or_(pc.equal(_bits(left), _bits(right)),
                       pc.and_(pc.is_nan(left), pc.is_nan(right)))  # fmt: skip
    else:
        equal = pc.equal(left, right)
    return pc.or_(both_null, pc.and_(valid, equal).fill_null(False))


def _is_list(kind: pa.DataType) -> bool:
    return (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_list_view(kind)
            or pa.types.is_large_list_view(kind) or pa.types.is_fixed_size_list(kind))  # fmt: skip


def _same_lists(left: pa.Array, right: pa.Array, valid: pa.Array) -> pa.Array:
    """Lists of the same length whose elements are pairwise the same: the elements of the
    pairs of equal length, flattened, line up."""
    lengths = pc.equal(pc.list_value_length(left), pc.list_value_length(right))
    paired = pc.and_(valid, lengths).fill_null(False)
    left, right = left.filter(paired), right.filter(paired)
    elements = _same(pc.list_flatten(left), pc.list_flatten(right))
    differing = pc.list_parent_indices(left).filter(pc.invert(elements))
    lists = pa.array(np.arange(len(left), dtype=np.int64))
    equal = pc.invert(pc.is_in(lists, value_set=differing.cast(pa.int64())))
    return pc.replace_with_mask(pa.array(np.zeros(len(paired), np.bool_)), paired, equal)


def _entries(values: pa.Array) -> pa.Array:
    """A map column as lists of its (key, value) entries sorted by key, so that two maps
    holding the same entries in another order are the same value. Keys of a type Arrow
    cannot sort (nested keys) stay in their stored order."""
    kind = values.type
    lists = values.cast(pa.list_(pa.struct([kind.key_field, kind.item_field])))
    entries = pc.list_flatten(lists)
    keys = entries.flatten()[0]
    positions = {"map": pc.list_parent_indices(lists), "key": keys}
    if pa.types.is_floating(keys.type):  # -0.0 and 0.0 sort as equal but are two keys
        positions["bits"] = _bits(keys)
    try:
        order = pc.sort_indices(pa.table(positions),
                                sort_keys=[(name, "ascending") for name in positions])
    except (pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return lists
    lengths = pc.list_value_length(lists).fill_null(0)
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(lengths)])
    return pa.ListArray.from_arrays(offsets, entries.take(order), mask=lists.is_null())


def _bits(values: pa.Array) -> pa.Array:
    """Floats as the integers of their bits (the sign of a zero included)."""
    width = values.type.bit_width
    return values.view(pa.int64() if width == 64 else pa.int32() if width == 32 else pa.int16())


def arrow_key(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` as Arrow's grouping must see it to group by the one rule.

    Arrow groups floats by their bits, which already tells -0.0 from 0.0, but also a
    NaN with its sign bit set (Spark's ``-x`` of a NaN) from the NaN: every NaN becomes
    the one NaN. Nested types Arrow cannot group by at all (it raises
    ``ArrowNotImplementedError``).
    """
    if not pa.types.is_floating(column.type):
        return column
    return pc.if_else(pc.is_nan(column), pa.scalar(float("nan"), column.type), column)


def keyed(dtype: DataType) -> bool:
    """Whether :func:`spark_key` changes a column of this Spark type: it is or holds a
    float, a VARIANT or a string of a collation. Other columns Spark compares and groups
    by the rule already."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.FloatType | T.DoubleType | T.VariantType):
        return True
    if isinstance(dtype, T.StringType):
        return dtype.collation != "UTF8_BINARY"  # 'a' is 'A' under UTF8_LCASE
    if isinstance(dtype, T.ArrayType):
        return keyed(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return keyed(dtype.keyType) or keyed(dtype.valueType)
    if isinstance(dtype, T.StructType):
        return any(keyed(f.dataType) for f in dtype.fields)
    return False


def spark_key(column: Column, dtype: DataType) -> Column:
    """``column`` (of Spark type ``dtype``) as Spark must compare (``<=>``) or group it to
    follow the one rule: every float or VARIANT inside it as its text, every string of a
    collation in the binary one, the rest as it is.

    Spark's ``<=>`` and grouping already take NULL for NULL and NaN for NaN, but also
    -0.0 for 0.0; the text of a float is ``-0.0``, ``NaN``, or digits that read back as
    the same value, so two texts are equal exactly when the rule says the floats are.
    VARIANT Spark can neither compare nor group: its JSON text is its value. Arrays,
    structs and maps keep their shape (no text of a whole value: ``["a, b"]`` and
    ``["a", "b"]`` print alike; a map still groups whatever the order of its entries).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not keyed(dtype):
        return column
    if isinstance(dtype, T.FloatType | T.DoubleType | T.VariantType):
        return column.cast("string")
    if isinstance(dtype, T.StringType):  # compared as written, not by its collation
        return F.collate(column, "UTF8_BINARY")
    if isinstance(dtype, T.ArrayType):
        element = dtype.elementType
        return F.transform(column, lambda value: spark_key(value, element))
    if isinstance(dtype, T.MapType):
        keys, values = dtype.keyType, dtype.valueType
        column = F.transform_keys(column, lambda key, _: spark_key(key, keys))
        return F.transform_values(column, lambda _, value: spark_key(value, values))
    assert isinstance(dtype, T.StructType)
    fields = [spark_key(column.getField(f.name), f.dataType).alias(f.name) for f in dtype.fields]
    return F.when(column.isNotNull(), F.struct(*fields))


# The netting ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NetRows:
    """The net change of a set of row ids, as :func:`net_rows` leaves it.

    Attributes:
        before: the rows to delete: the state before of each id deleted, or updated
            (every column the input had, in input order).
        after: the rows to write: the state after of each id inserted or updated.
        before_updated: for each ``before`` row, whether it is an update's old state
            (its id is in ``after`` too).
        after_updated: for each ``after`` row, whether it is an update's new state.
    """

    before: pa.Table
    after: pa.Table
    before_updated: pa.Array
    after_updated: pa.Array

    @property
    def deleted(self) -> pa.Table:
        """The ids gone: ``before`` rows that are no update."""
        return self.before.filter(pc.invert(self.before_updated))

    @property
    def inserted(self) -> pa.Table:
        """The ids new: ``after`` rows that are no update."""
        return self.after.filter(pc.invert(self.after_updated))

    @property
    def updated(self) -> int:
        return int(pc.sum(self.after_updated.cast(pa.int64())).as_py() or 0)


def net_rows(
    before: pa.Table, after: pa.Table, columns: Sequence[str], row_id: str = ROW_ID_COLUMN
) -> NetRows:
    """The one netting: each id's state before against its state after.

    Each ``after`` row is paired with the ``before`` row of its id (a full outer join on
    the id); an id on both sides whose ``columns`` are all the same value
    (:func:`same_values`) drops out of both. What is left is a delete (an id only
    before), an insert (only after) or an update (both).

    Args:
        before: the state before of each id that had one: ``columns`` and ``row_id``
            (other columns are carried along). Each id at most once.
        after: the state after of each id that has one, likewise.
        columns: the columns compared.
        row_id: the id column.
    """
    before_ids = before.column(row_id).combine_chunks()
    after_ids = after.column(row_id).combine_chunks()
    positions = pc.index_in(after_ids, value_set=before_ids)  # null: no state before
    paired = before.take(positions)
    same = pc.is_valid(positions)
    for name in columns:
        same = pc.and_(same, same_values(after.column(name), paired.column(name)))
    unchanged = after_ids.filter(same)
    kept_before = before.filter(pc.invert(pc.is_in(before_ids, value_set=unchanged)))
    kept = pc.invert(same)
    return NetRows(
        before=kept_before,
        after=after.filter(kept),
        before_updated=pc.is_in(kept_before.column(row_id).combine_chunks(), value_set=after_ids),
        after_updated=pc.is_valid(positions).filter(kept),
    )


def net_events(
    events: pa.Table, columns: Sequence[str], mode: ChangeMode = ChangeMode.DEFAULT
) -> pa.Table:
    """A stream's rows from change data feed events: the net change of each row id.

    A row's first event (by version, before-image first) holds its state before the
    range if it is a delete or pre-image, its last event its state after if it is an
    insert or post-image; :func:`net_rows` nets the two. ``APPEND_ONLY`` nets nothing:
    it keeps each row's first insert. ``APPEND_ONLY_FINAL`` keeps the inserts only.

    Args:
        events: ``columns``, the row id, ``_change_type`` and ``_commit_version`` (as
            ``pipelines.streams.changes.change_events`` gives them), in any order.
        columns: the table's columns.
        mode: what the stream reports.

    Returns:
        ``columns``, then ``METADATA$ACTION``, ``METADATA$ISUPDATE`` and
        ``METADATA$ROW_ID``: deletes first, then inserts, each by row id.
    """
    if mode is ChangeMode.APPEND_ONLY:  # inserts only: the cheap read on insert-only history
        first, _ = _ends(events.filter(pc.equal(events.column("_change_type"), "insert")))
        return _labelled(first, columns, "INSERT", pa.array(np.zeros(first.num_rows, np.bool_)))
    first, last = _ends(events)
    net = net_rows(
        first.filter(pc.is_in(first.column("_change_type"), value_set=_BEFORE_KINDS)),
        last.filter(pc.is_in(last.column("_change_type"), value_set=_AFTER_KINDS)),
        columns,
    )
    if mode is ChangeMode.APPEND_ONLY_FINAL:
        inserted = net.inserted
        return _labelled(inserted, columns, "INSERT", pa.array(np.zeros(len(inserted), np.bool_)))
    return pa.concat_tables([
        _labelled(net.before, columns, "DELETE", net.before_updated),
        _labelled(net.after, columns, "INSERT", net.after_updated),
    ])  # fmt: skip


def _ends(events: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Each row's first and last event, by row id: events sorted by (version, a before
    kind first) within a row."""
    before_kind = pc.is_in(events.column("_change_type"), value_set=_BEFORE_KINDS)
    order = pc.add(pc.multiply(events.column("_commit_version"), 2),
                   pc.if_else(before_kind, 0, 1).cast(pa.int64()))  # fmt: skip
    ordered = events.append_column("__order", order).sort_by(
        [(ROW_ID_COLUMN, "ascending"), ("__order", "ascending")]
    )
    ids = ordered.column(ROW_ID_COLUMN).combine_chunks()
    if len(ids) == 0:
        return ordered, ordered
    new_id = pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1))
    first = ordered.filter(pa.concat_arrays([pa.array([True]), new_id]))
    last = ordered.filter(pa.concat_arrays([new_id, pa.array([True])]))
    return first, last


def _labelled(rows: pa.Table, columns: Sequence[str], action: str, is_update: pa.Array) -> pa.Table:
    return pa.table(
        [*(rows.column(name) for name in columns),
         pa.array([action] * rows.num_rows, pa.string()),
         is_update,
         rows.column(ROW_ID_COLUMN)],
        names=[*columns, STREAM_ACTION, STREAM_ISUPDATE, STREAM_ROW_ID],
    )  # fmt: skip


@dataclass(frozen=True)
class NetChange:
    """The net change of a dynamic table from one incremental refresh.

    ``rows``: user columns + ``_INGEST_ROW_ID``, the rows to write (inserts and
    updates); ``deleted``: ids to delete; ``new_ids``: the ids in ``rows`` that are
    inserts (no row to replace); ``updated``: how many rows replace one."""

    rows: pa.Table
    deleted: pa.Array
    new_ids: pa.Array
    updated: int


def net_change(result: pa.Table, columns: Sequence[str]) -> NetChange:
    """Net the rewritten query's output over change sources (design §4 "ChangeSet").

    The DELETE rows are the ids' states before, the INSERT rows their states after
    (:func:`net_rows`): a DELETE and an INSERT of one id with the same values drop out,
    so a change to a column the query does not select writes nothing.

    Args:
        result: the user columns (named ``columns``, in order), ``_INGEST_ROW_ID``,
            ``_INGEST_ACTION``.
        columns: the user column names.

    Raises:
        ValueError: an id twice among DELETE rows or among INSERT rows (the sources'
            changes were not netted), a null id, or an action that is neither.
    """
    ids = pc.cast(result.column(ROW_ID_COLUMN), pa.int64())
    if ids.null_count:
        raise ValueError(f"{ROW_ID_COLUMN} is null in {ids.null_count} rows")
    action = result.column(REFRESH_ACTION)
    deleting, inserting = pc.equal(action, "DELETE"), pc.equal(action, "INSERT")
    if not pc.all(pc.or_(deleting, inserting).fill_null(False), min_count=0).as_py():
        raise ValueError(f"{REFRESH_ACTION} holds a value other than INSERT and DELETE")
    table = pa.table([*(result.column(c) for c in columns), ids], names=[*columns, ROW_ID_COLUMN])
    deletes, inserts = table.filter(deleting), table.filter(inserting)
    for kind, rows in (("DELETE", deletes), ("INSERT", inserts)):
        if len(pc.unique(rows.column(ROW_ID_COLUMN))) != rows.num_rows:
            raise ValueError(f"an id appears twice among {kind} rows: the change sets "
                             "of the sources were not netted")  # fmt: skip
    net = net_rows(deletes, inserts, columns)
    return NetChange(
        rows=net.after,
        deleted=net.deleted.column(ROW_ID_COLUMN).combine_chunks(),
        new_ids=net.inserted.column(ROW_ID_COLUMN).combine_chunks(),
        updated=net.updated,
    )
