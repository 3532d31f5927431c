"""A full refresh as a diff: applying it to the old content gives exactly the new one,
with the fewest changed rows, and unchanged rows keep their row ids."""

from __future__ import annotations

import math
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flush.tables import ROW_ID_COLUMN
from pipelines.dynamic_tables.diff import (
    IdDiff,
    UncomparableColumnError,
    ValueDiff,
    arrow_value_diff,
    id_diff,
    value_diff,
)

RID = ROW_ID_COLUMN
COLUMNS = ["N", "S"]
SCHEMA = pa.schema([("N", pa.int64()), ("S", pa.string())])


def frame(spark, rows, ids=None, schema=SCHEMA):
    """A DataFrame of ``rows`` (tuples), with the row id column if ``ids`` is given."""
    table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)
    if ids is not None:
        table = table.append_column(RID, pa.array(ids, pa.int64()))
    return spark.createDataFrame(table)


def inserted_rows(diff: ValueDiff) -> list[tuple]:
    return [tuple(r.values()) for r in diff.inserted.to_pylist()]


def test_three_copies_to_one_deletes_the_two_highest_ids(spark):
    old = frame(spark, [(1, "a")] * 3, ids=[9, 5, 7])
    diff = value_diff(old, frame(spark, [(1, "a")]), COLUMNS)
    assert sorted(diff.deleted.to_pylist()) == [7, 9]
    assert diff.num_inserted == 0


def test_one_copy_to_three_inserts_two(spark):
    old = frame(spark, [(1, "a"), (2, "b")], ids=[4, 5])
    diff = value_diff(old, frame(spark, [(1, "a")] * 3 + [(2, "b")]), COLUMNS)
    assert diff.num_deleted == 0
    assert inserted_rows(diff) == [(1, "a"), (1, "a")]
    assert diff.inserted.column_names == COLUMNS


def test_nulls_group_as_equal(spark):
    rows = [(None, "x"), (1, None), (None, None)]
    old = frame(spark, rows, ids=[1, 2, 3])
    diff = value_diff(old, frame(spark, [*rows, (None, None)]), COLUMNS)
    assert diff.num_deleted == 0
    assert inserted_rows(diff) == [(None, None)]


def test_unchanged_content_gives_an_empty_diff(spark):
    rows = [(1, "a"), (1, "a"), (2, None)]
    diff = value_diff(frame(spark, rows, ids=[1, 2, 3]), frame(spark, rows[::-1]), COLUMNS)
    assert (diff.num_deleted, diff.num_inserted) == (0, 0)
    assert diff.inserted.schema.names == COLUMNS


def test_a_changed_value_is_a_delete_and_an_insert(spark):
    old = frame(spark, [(1, "a"), (2, "b")], ids=[1, 2])
    diff = value_diff(old, frame(spark, [(1, "a"), (2, "c")]), COLUMNS)
    assert diff.deleted.to_pylist() == [2]
    assert inserted_rows(diff) == [(2, "c")]


def test_column_names_are_quoted(spark):
    schema = pa.schema([("a.b", pa.int64()), ("c d", pa.string())])
    old = frame(spark, [(1, "x")], ids=[1], schema=schema)
    diff = value_diff(old, frame(spark, [(2, "x")], schema=schema), ["a.b", "c d"])
    assert diff.deleted.to_pylist() == [1]
    assert diff.inserted.to_pylist() == [{"a.b": 2, "c d": "x"}]


def test_floats_match_by_the_one_equality(spark):
    """NaN equals NaN, but -0.0 differs from 0.0 (Spark's own grouping would take one
    for the other); an inserted value is the one the query gave: -0.0 stays -0.0."""
    schema = pa.schema([("F", pa.float64())])
    old = frame(spark, [(math.nan,), (-0.0,), (1.5,)], ids=[1, 2, 3], schema=schema)
    diff = value_diff(old, frame(spark, [(math.nan,), (0.0,), (1.5,)], schema=schema), ["F"])
    assert diff.deleted.to_pylist() == [2]
    assert [math.copysign(1.0, v) for v in diff.inserted.column("F").to_pylist()] == [1.0]
    diff = value_diff(old, frame(spark, [(-math.nan,), (-0.0,), (-0.0,)], schema=schema), ["F"])
    assert diff.deleted.to_pylist() == [3]
    [value] = diff.inserted.column("F").to_pylist()
    assert value == 0.0 and math.copysign(1.0, value) == -1.0


def test_maps_group_whatever_their_entry_order(spark):
    schema = pa.schema([("M", pa.map_(pa.string(), pa.int64()))])
    old = frame(spark, [([("a", 1), ("b", 2)],)], ids=[1], schema=schema)
    diff = value_diff(old, frame(spark, [([("b", 2), ("a", 1)],)], schema=schema), ["M"])
    assert (diff.num_deleted, diff.num_inserted) == (0, 0)
    with pytest.raises(UncomparableColumnError) as raised:
        id_diff(old, old, ["M"])
    assert (raised.value.column, raised.value.type_name) == ("M", "MAP<STRING,BIGINT>")


def test_variant_cannot_be_grouped(spark):
    old = spark.sql(f"SELECT 1 AS N, array(parse_json('1')) AS V, 1L AS {RID}")
    with pytest.raises(UncomparableColumnError, match=r"'V'.*ARRAY<VARIANT>") as raised:
        value_diff(old, old.drop(RID), ["N", "V"])
    assert isinstance(raised.value, ValueError)


def test_id_diff_labels_inserts_updates_and_deletes(spark):
    old = frame(spark, [(1, "a"), (2, None), (3, "c"), (None, "d")], ids=[1, 2, 3, 4])
    new = frame(spark, [(1, "a"), (2, None), (3, "C"), (None, "d"), (5, "e")], ids=[1, 2, 3, 7, 5])
    diff = id_diff(old, new, COLUMNS)
    assert (diff.inserted, diff.updated) == (2, 1)
    assert diff.deleted.to_pylist() == [4]
    assert sorted(diff.new_ids.to_pylist()) == [5, 7]
    rows = diff.rows.to_pylist()
    assert {r[RID]: (r["N"], r["S"]) for r in rows} == {3: (3, "C"), 5: (5, "e"), 7: (None, "d")}
    assert rows[-1][RID] == 3  # inserts first, then updates


VALUES = st.tuples(st.sampled_from([0, 1, 2, None]), st.sampled_from(["x", "y", None]))


@st.composite
def with_ids(draw, rows, id_range=10**6):
    """``rows`` with unique row ids drawn from ``range(id_range)``."""
    drawn = draw(rows)
    ids = draw(st.lists(st.integers(0, id_range), min_size=len(drawn), max_size=len(drawn),
                        unique=True))  # fmt: skip
    return dict(zip(ids, drawn, strict=True))


OVERLAPPING = with_ids(st.lists(VALUES, max_size=10), id_range=15)  # ids shared by old and new


@settings(max_examples=25, deadline=None)
@given(old=with_ids(st.lists(VALUES, max_size=12)), new=st.lists(VALUES, max_size=12))
def test_value_diff_applied_to_old_gives_new_with_fewest_changes(spark, old, new):
    diff = value_diff(frame(spark, old.values(), ids=old.keys()), frame(spark, new), COLUMNS)
    deleted = diff.deleted.to_pylist()
    assert len(set(deleted)) == len(deleted) and set(deleted) <= old.keys()
    kept = {i: row for i, row in old.items() if i not in set(deleted)}
    assert Counter(kept.values()) + Counter(inserted_rows(diff)) == Counter(new)
    before, after = Counter(old.values()), Counter(new)
    fewest = (before - after).total() + (after - before).total()  # the symmetric difference
    assert diff.num_deleted + diff.num_inserted == fewest
    for value in before:  # the lowest ids of each value stay
        ids = sorted(i for i, row in old.items() if row == value)
        assert [i for i in ids if i in kept] == ids[: min(before[value], after[value])]


def arrow(rows, ids=None, schema=SCHEMA):
    """``frame``'s table, for the Arrow diff."""
    table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)
    return table if ids is None else table.append_column(RID, pa.array(ids, pa.int64()))


@settings(max_examples=200, deadline=None)
@given(old=with_ids(st.lists(VALUES, max_size=30)), new=st.lists(VALUES, max_size=30))
def test_arrow_value_diff_is_the_same_difference_as_spark_s(old, new):
    """The same property, without Spark (so many more examples): old minus the deleted
    ids plus the inserted rows is new, with the fewest changes, the lowest ids kept."""
    diff = arrow_value_diff(arrow(old.values(), ids=list(old.keys())), arrow(new))
    deleted = diff.deleted.to_pylist()
    assert diff.deleted.type == pa.int64() and diff.inserted.schema == SCHEMA
    assert len(set(deleted)) == len(deleted) and set(deleted) <= old.keys()
    kept = {i: row for i, row in old.items() if i not in set(deleted)}
    assert Counter(kept.values()) + Counter(inserted_rows(diff)) == Counter(new)
    before, after = Counter(old.values()), Counter(new)
    assert diff.num_deleted + diff.num_inserted == (before - after).total() + (
        after - before
    ).total()  # fmt: skip
    for value in before:
        ids = sorted(i for i, row in old.items() if row == value)
        assert [i for i in ids if i in kept] == ids[: min(before[value], after[value])]


def test_arrow_value_diff_tells_signed_zeros_apart_and_matches_nan():
    schema = pa.schema([("F", pa.float64())])
    old = arrow([(math.nan,), (-0.0,), (None,)], ids=[1, 2, 3], schema=schema)
    diff = arrow_value_diff(old, arrow([(math.nan,), (-0.0,), (None,)], schema=schema))
    assert (diff.num_deleted, diff.num_inserted) == (0, 0)
    diff = arrow_value_diff(old, arrow([(math.nan,), (0.0,), (None,)], schema=schema))
    assert diff.deleted.to_pylist() == [2]
    [value] = diff.inserted.column("F").to_pylist()
    assert value == 0.0 and math.copysign(1.0, value) == 1.0


def test_arrow_value_diff_refuses_what_arrow_cannot_group():
    schema = pa.schema([("L", pa.list_(pa.int64()))])
    with pytest.raises(pa.ArrowNotImplementedError):
        arrow_value_diff(arrow([([1],)], ids=[1], schema=schema), arrow([([2],)], schema=schema))


@settings(max_examples=25, deadline=None)
@given(old=OVERLAPPING, new=OVERLAPPING)
def test_id_diff_applied_to_old_gives_new_with_fewest_changes(spark, old, new):
    diff: IdDiff = id_diff(frame(spark, old.values(), ids=old.keys()),
                           frame(spark, new.values(), ids=new.keys()), COLUMNS)  # fmt: skip
    result = {i: row for i, row in old.items() if i not in set(diff.deleted.to_pylist())}
    written = {r[RID]: (r["N"], r["S"]) for r in diff.rows.to_pylist()}
    assert diff.rows.num_rows == len(written) == diff.inserted + diff.updated
    assert {**result, **written} == new
    assert set(diff.deleted.to_pylist()) == old.keys() - new.keys()
    assert set(diff.new_ids.to_pylist()) == new.keys() - old.keys()
    assert diff.updated == sum(1 for i in old.keys() & new.keys() if old[i] != new[i])


# -0.0 and 0.0 are two values in every diff (the one equality of pipelines.change_sets);
# every NaN is one value.

NAN = float("nan")
ZEROS = pa.schema([("F", pa.float64())])
NESTED = pa.schema([("L", pa.list_(pa.float64())), ("T", pa.struct([("f", pa.float64())]))])


@pytest.mark.parametrize("diff_name", ["value_diff", "arrow_value_diff"])
def test_value_diffs_see_an_update_between_the_zeros(spark, diff_name):
    old_rows, new_rows = [(0.0,), (NAN,), (None,), (-0.0,)], [(-0.0,), (-NAN,), (None,), (-0.0,)]
    if diff_name == "value_diff":
        old = frame(spark, old_rows, ids=[1, 2, 3, 4], schema=ZEROS)
        diff = value_diff(old, frame(spark, new_rows, schema=ZEROS), ["F"])
    else:
        diff = arrow_value_diff(arrow(old_rows, ids=[1, 2, 3, 4], schema=ZEROS),
                                arrow(new_rows, schema=ZEROS))  # fmt: skip
    assert diff.deleted.to_pylist() == [1]  # the 0.0; the -0.0 (id 4) stays
    [value] = diff.inserted.column("F").to_pylist()
    assert value == 0.0 and math.copysign(1.0, value) == -1.0


def test_id_diff_sees_an_update_between_the_zeros(spark):
    old = frame(spark, [(0.0,), (NAN,), (None,), (-0.0,)], ids=[1, 2, 3, 4], schema=ZEROS)
    new = frame(spark, [(-0.0,), (-NAN,), (None,), (-0.0,)], ids=[1, 2, 3, 4], schema=ZEROS)
    diff = id_diff(old, new, ["F"])
    assert (diff.inserted, diff.updated, diff.deleted.to_pylist()) == (0, 1, [])
    [row] = diff.rows.to_pylist()
    assert row[RID] == 1 and math.copysign(1.0, row["F"]) == -1.0


def test_spark_diffs_see_the_zeros_inside_lists_and_structs(spark):
    old_rows = [([0.0], {"f": 1.0}), ([1.0], {"f": 0.0}), ([NAN], {"f": NAN}), ([2.0], None)]
    new_rows = [([-0.0], {"f": 1.0}), ([1.0], {"f": -0.0}), ([-NAN], {"f": -NAN}), ([2.0], None)]
    old = frame(spark, old_rows, ids=[1, 2, 3, 4], schema=NESTED)
    by_id = id_diff(old, frame(spark, new_rows, ids=[1, 2, 3, 4], schema=NESTED), ["L", "T"])
    assert sorted(by_id.rows.column(RID).to_pylist()) == [1, 2]
    assert by_id.updated == 2
    by_value = value_diff(old, frame(spark, new_rows, schema=NESTED), ["L", "T"])
    assert sorted(by_value.deleted.to_pylist()) == [1, 2]
    inserted = by_value.inserted.to_pylist()
    assert sorted((math.copysign(1.0, r["L"][0]), math.copysign(1.0, r["T"]["f"]))
                  for r in inserted) == [(-1.0, 1.0), (1.0, -1.0)]  # fmt: skip
