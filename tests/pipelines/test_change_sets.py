"""The one equality of ``pipelines.change_sets`` in its three forms, and the one netting.

Hypothesis draws values of flat and nested types from the ones the rule has something
to say about (both zeros, NaNs of either sign and with a payload, NULL, neighbours in
the last bit, maps in any entry order) and checks: ``same_values`` is the rule as read
in Python here; grouping by ``arrow_key`` in Arrow, and comparing (``<=>``) or grouping
by ``spark_key`` in Spark, split the values exactly as ``same_values`` does. Then
``net_rows`` (which a stream's ``net_events`` and a refresh's ``net_change`` both use)
against sets of states, and the zeros through both of them.
"""

from __future__ import annotations

import math
import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from flush.tables import ROW_ID_COLUMN
from pipelines.change_sets import (
    REFRESH_ACTION,
    STREAM_ACTION,
    STREAM_ISUPDATE,
    ChangeMode,
    arrow_key,
    net_change,
    net_events,
    net_rows,
    same_values,
    spark_key,
)

NAN = float("nan")
#: Floats the rule has something to say about: both zeros, NaNs of either sign and with a
#: payload (all one value), neighbours that differ in the last bit, the smallest subnormal.
FLOATS = [0.0, -0.0, NAN, -NAN, struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000001))[0],
          1.0, math.nextafter(1.0, 2.0), 5e-324, 1e300, None]  # fmt: skip
FLOAT = st.sampled_from(FLOATS) | st.floats(width=64)
TEXT = st.sampled_from(["x", "x, y", None])  # ", ": a struct's or list's text would merge


def _types(item: pa.DataType):
    """Types built over ``item``: flat, in a list, in a struct, nested two levels."""
    return {
        "list": pa.list_(item),
        "struct": pa.struct([("f", item), ("s", pa.string())]),
        "list_of_structs": pa.list_(pa.struct([("f", item)])),
        "struct_of_lists": pa.struct([("l", pa.list_(item)), ("s", pa.list_(pa.string()))]),
    }


TYPES = {"double": pa.float64(), "float": pa.float32(), "string": pa.string(),
         "int": pa.int64(), **_types(pa.float64()),
         "map": pa.map_(pa.string(), pa.float64()),
         "list_of_maps": pa.list_(pa.map_(pa.string(), pa.float64()))}  # fmt: skip
#: Kinds Spark can compare with ``<=>`` (not maps); every kind can be grouped by.
COMPARABLE = [kind for kind in TYPES if "map" not in kind]


def values(kind: pa.DataType) -> st.SearchStrategy:
    """Python values of an Arrow type (None: NULL), drawn to meet each other often."""
    if pa.types.is_floating(kind):
        return FLOAT
    if pa.types.is_string(kind):
        return TEXT
    if pa.types.is_integer(kind):
        return st.none() | st.integers(-2, 2)
    if pa.types.is_map(kind):
        entries = st.dictionaries(st.sampled_from("ab"), values(kind.item_type), max_size=2)
        return st.none() | entries.flatmap(lambda d: st.permutations(list(d.items())))
    if pa.types.is_list(kind):
        return st.none() | st.lists(values(kind.value_type), max_size=2)
    fields = {field.name: values(field.type) for field in kind}
    return st.none() | st.fixed_dictionaries(fields)


def same(kind: pa.DataType, a, b) -> bool:
    """The rule, read in Python: NULL is NULL, a NaN is every NaN, -0.0 is not 0.0,
    nested values by value (a map's entries in any order)."""
    if a is None or b is None:
        return a is None and b is None
    if pa.types.is_floating(kind):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if pa.types.is_map(kind):
        a, b = dict(a), dict(b)
        return a.keys() == b.keys() and all(same(kind.item_type, a[k], b[k]) for k in a)
    if pa.types.is_list(kind):
        return len(a) == len(b) and all(same(kind.value_type, x, y)
                                        for x, y in zip(a, b, strict=True))  # fmt: skip
    if pa.types.is_struct(kind):
        return all(same(field.type, a[field.name], b[field.name]) for field in kind)
    return bool(a == b)


@st.composite
def columns(draw, kinds=tuple(TYPES), max_size=8):
    """A table of one column per kind, with the same number of values each."""
    size = draw(st.integers(0, max_size))
    drawn = {kind: draw(st.lists(values(TYPES[kind]), min_size=size, max_size=size))
             for kind in kinds}  # fmt: skip
    return pa.table({kind: pa.array(column, TYPES[kind], from_pandas=False)
                     for kind, column in drawn.items()})  # fmt: skip


def expected_pairs(column: pa.ChunkedArray, kind: pa.DataType) -> list[list[bool]]:
    stored = column.to_pylist()
    return [[same(kind, a, b) for b in stored] for a in stored]


def every_pair(n: int) -> tuple[pa.Array, pa.Array]:
    """The indices (i, j) of every pair of n rows, i the slower."""
    return (pa.array([i for i in range(n) for _ in range(n)], pa.int64()),
            pa.array([j for _ in range(n) for j in range(n)], pa.int64()))  # fmt: skip


def partition(groups: list[list[int]]) -> dict[int, int]:
    """Each row's group number, from the lists of rows of each group."""
    return {row: number for number, rows in enumerate(groups) for row in rows}


# The one equality ---------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(columns(max_size=10), st.integers(0, 4))
def test_same_values_is_the_rule(table, cut):
    """Every pair of values of a column, flat and nested, against the rule read on the
    values as stored (a float32 keeps fewer digits); sliced and chunked inputs (offsets
    into the buffers) give the same answer."""
    n = table.num_rows
    for kind in table.column_names:
        column = table.column(kind).combine_chunks()
        left, right = (column.take(indices) for indices in every_pair(n))
        expected = [x for row in expected_pairs(table.column(kind), TYPES[kind]) for x in row]
        assert same_values(left, right).to_pylist() == expected, kind
        cut = min(cut, len(left))
        chunked = pa.chunked_array([left.slice(0, cut), left.slice(cut)], left.type)
        assert same_values(chunked, right).to_pylist() == expected, kind
        assert same_values(left.slice(cut), right.slice(cut)).to_pylist() == expected[cut:]


def test_same_values_on_the_zeros_and_nans_spelled_out():
    left = pa.array([0.0, -0.0, NAN, None, 1.0, None])
    right = pa.array([-0.0, -0.0, -NAN, None, None, 1.0])
    assert same_values(left, right).to_pylist() == [False, True, True, True, False, False]
    maps = pa.array([[("a", 0.0), ("b", 1.0)], [("a", -0.0)]], pa.map_(pa.string(), pa.float64()))
    other = pa.array([[("b", 1.0), ("a", 0.0)], [("a", 0.0)]], maps.type)
    assert same_values(maps, other).to_pylist() == [True, False]


@settings(max_examples=200, deadline=None)
@given(columns(kinds=("double", "float", "string", "int"), max_size=20))
def test_arrow_grouping_by_arrow_key_splits_as_same_values(table):
    """The columns Arrow can group by (the flat ones): rows share a group exactly when
    ``same_values`` says their values are the same."""
    n = table.num_rows
    for kind in table.column_names:
        keyed = pa.table({"k": arrow_key(table.column(kind)), "i": pa.array(range(n))})
        grouped = keyed.group_by("k").aggregate([("i", "list")]).column("i_list").to_pylist()
        group = partition(grouped)
        expected = expected_pairs(table.column(kind), TYPES[kind])
        for i in range(n):
            for j in range(n):
                assert (group[i] == group[j]) == expected[i][j], (kind, i, j)


@settings(max_examples=12, deadline=None)
@given(columns(kinds=tuple(COMPARABLE), max_size=7))
def test_spark_key_compares_as_same_values(spark, table):
    """Spark's ``<=>`` of the keys of every pair of values is ``same_values`` of the
    values (one Spark job for all kinds)."""
    n = table.num_rows
    left, right = (table.take(indices) for indices in every_pair(n))
    both = pa.table([*left.columns, *right.columns],
                    names=[*(f"{k}_l" for k in COMPARABLE), *(f"{k}_r" for k in COMPARABLE)])
    df = spark.createDataFrame(both)
    types = {f.name: f.dataType for f in df.schema.fields}
    found = df.select(*[
        spark_key(df[f"{k}_l"], types[f"{k}_l"]).eqNullSafe(spark_key(df[f"{k}_r"], types[f"{k}_r"]))
        .alias(k) for k in COMPARABLE
    ]).toArrow()  # fmt: skip
    for kind in COMPARABLE:
        expected = same_values(left.column(kind), right.column(kind)).to_pylist()
        assert found.column(kind).to_pylist() == expected, kind


@settings(max_examples=8, deadline=None)
@given(columns(max_size=8))
def test_grouping_by_spark_key_splits_as_same_values(spark, table):
    """Grouped by the key (as ``value_diff`` and the engine's consolidation group), rows
    share a group exactly when ``same_values`` says their values are the same: maps in
    any entry order and every NaN are one value, -0.0 and 0.0 two."""
    n = table.num_rows
    df = spark.createDataFrame(table.append_column("i", pa.array(range(n), pa.int64())))
    for kind in table.column_names:
        key = spark_key(df[kind], df.schema[kind].dataType)
        groups = df.groupBy(key.alias("K")).agg(F.collect_list("i").alias("G"))
        group = partition(groups.toArrow().column("G").to_pylist())
        column = table.column(kind)
        for i in range(n):
            for j in range(n):
                equal = same_values(column.take([i]), column.take([j]))[0].as_py()
                assert (group[i] == group[j]) == equal, (kind, column[i], column[j])


# The one netting ----------------------------------------------------------------------

STATES = st.dictionaries(st.integers(0, 12), st.tuples(FLOAT, st.sampled_from(["p", "q"])),
                         max_size=10)  # fmt: skip


def states(rows: dict) -> pa.Table:
    return pa.table({"F": pa.array([v[0] for v in rows.values()], pa.float64()),
                     "S": pa.array([v[1] for v in rows.values()], pa.string()),
                     ROW_ID_COLUMN: pa.array(list(rows), pa.int64())})  # fmt: skip


def unchanged(a, b):
    return same(pa.float64(), a[0], b[0]) and a[1] == b[1]


@settings(max_examples=300, deadline=None)
@given(before=STATES, after=STATES)
def test_net_rows_drops_equal_states_and_labels_the_rest(before, after):
    net = net_rows(states(before), states(after), ["F", "S"])
    changed = {i for i in before.keys() & after.keys() if not unchanged(before[i], after[i])}
    kept_before = [i for i in before if i not in after or i in changed]  # input order kept
    kept_after = [i for i in after if i not in before or i in changed]
    assert net.before.column(ROW_ID_COLUMN).to_pylist() == kept_before
    assert net.after.column(ROW_ID_COLUMN).to_pylist() == kept_after
    assert net.before_updated.to_pylist() == [i in changed for i in kept_before]
    assert net.after_updated.to_pylist() == [i in changed for i in kept_after]
    assert set(net.deleted.column(ROW_ID_COLUMN).to_pylist()) == before.keys() - after.keys()
    assert set(net.inserted.column(ROW_ID_COLUMN).to_pylist()) == after.keys() - before.keys()
    assert net.updated == len(changed)
    assert net.after.column("S").to_pylist() == [after[i][1] for i in kept_after]


def _update_events(old: float, new: float) -> pa.Table:
    return pa.table({
        "X": pa.array([old, new], pa.float64()),
        ROW_ID_COLUMN: pa.array([7, 7], pa.int64()),
        "_change_type": ["update_preimage", "update_postimage"],
        "_commit_version": pa.array([3, 3], pa.int64()),
    })  # fmt: skip


def _refresh_rows(rows, arrow_type=TYPES["double"]) -> pa.Table:
    """The rewritten query's output: (X, id, action) rows."""
    return pa.table({"X": pa.array([r[0] for r in rows], arrow_type),
                     ROW_ID_COLUMN: pa.array([r[1] for r in rows], pa.int64()),
                     REFRESH_ACTION: [r[2] for r in rows]})  # fmt: skip


@pytest.mark.parametrize(("old", "new"), [(0.0, -0.0), (-0.0, 0.0)])
def test_a_stream_reports_an_update_between_the_zeros(old, new):
    result = net_events(_update_events(old, new), ["X"], ChangeMode.DEFAULT).to_pydict()
    assert result[STREAM_ACTION] == ["DELETE", "INSERT"]
    assert result[STREAM_ISUPDATE] == [True, True]
    assert [math.copysign(1.0, x) for x in result["X"]] == [math.copysign(1.0, old),
                                                             math.copysign(1.0, new)]  # fmt: skip
    assert net_events(_update_events(NAN, -NAN), ["X"], ChangeMode.DEFAULT).num_rows == 0


@pytest.mark.parametrize(("old", "new"), [(0.0, -0.0), (-0.0, 0.0)])
def test_a_refresh_writes_an_update_between_the_zeros(old, new):
    change = net_change(_refresh_rows([(old, 7, "DELETE"), (new, 7, "INSERT")]), ["X"])
    assert (change.updated, change.deleted.to_pylist(), change.new_ids.to_pylist()) == (1, [], [])
    [written] = change.rows.column("X").to_pylist()
    assert math.copysign(1.0, written) == math.copysign(1.0, new)
    assert net_change(_refresh_rows([(NAN, 7, "DELETE"), (-NAN, 7, "INSERT")]), ["X"]).updated == 0


def test_a_refresh_compares_nested_values_by_the_same_rule():
    """Changed from the netting before the one module: it compared nested values as
    Python values, which took -0.0 for 0.0 inside a list and a map's entries in another
    order for another map."""
    rows = [([0.0], 1, "DELETE"), ([-0.0], 1, "INSERT"),  # the zeros: an update
            ([NAN, None], 2, "DELETE"), ([-NAN, None], 2, "INSERT"),  # NaN is NaN: nothing
            ([1.0], 3, "DELETE"), ([1.0, 1.0], 3, "INSERT")]  # fmt: skip
    change = net_change(_refresh_rows(rows, pa.list_(pa.float64())), ["X"])
    assert change.rows.column(ROW_ID_COLUMN).to_pylist() == [1, 3]
    assert change.updated == 2
    maps = [([("a", 1.0), ("b", 2.0)], 1, "DELETE"), ([("b", 2.0), ("a", 1.0)], 1, "INSERT")]
    assert net_change(_refresh_rows(maps, pa.map_(pa.string(), pa.float64())), ["X"]).updated == 0
