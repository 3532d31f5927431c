"""Netting change events (``pipelines.change_sets.net_events``) agrees with comparing snapshots.

Hypothesis writes random histories of a keyed table (inserts, updates that may change
nothing, deletes; several rows per commit), turns them into change data feed events
as delta-rs reports them (in any order), and checks that the netted changes after any
offset are exactly the difference between the table at the offset and at the end,
for every mode. The equality and the netting under it are tested in
``tests/pipelines/test_change_sets.py``.
"""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from flush.tables import ROW_ID_COLUMN
from pipelines.change_sets import (
    STREAM_ACTION,
    STREAM_ISUPDATE,
    STREAM_ROW_ID,
    ChangeMode,
    net_events,
)

VALUES = st.one_of(st.none(), st.integers(-3, 3))  # few values: updates often change nothing


@st.composite
def histories(draw):
    """(events, snapshots): snapshots[v] is {row id: (A, B)} after version v."""
    table: dict[int, tuple] = {}
    snapshots = [dict(table)]
    events = []
    next_id = 0
    for version in range(1, draw(st.integers(1, 8)) + 1):
        touched = set()
        for _ in range(draw(st.integers(0, 5))):
            op = draw(st.sampled_from(["insert", "update", "delete"]))
            free = sorted(set(table) - touched)
            if op == "insert" or not free:
                row = (draw(VALUES), draw(st.text(max_size=2)))
                table[next_id] = row
                touched.add(next_id)
                events.append(("insert", version, next_id, row))
                next_id += 1
                continue
            row_id = draw(st.sampled_from(free))
            touched.add(row_id)
            old = table[row_id]
            if op == "update":
                new = (draw(VALUES), old[1] if draw(st.booleans()) else draw(st.text(max_size=2)))
                table[row_id] = new
                events.append(("update_preimage", version, row_id, old))
                events.append(("update_postimage", version, row_id, new))
            else:
                del table[row_id]
                events.append(("delete", version, row_id, old))
        snapshots.append(dict(table))
    return draw(st.permutations(events)), snapshots


def _events(events, after):
    picked = [e for e in events if e[1] > after]
    return pa.table(
        {
            "A": pa.array([e[3][0] for e in picked], pa.int64()),
            "B": pa.array([e[3][1] for e in picked], pa.string()),
            ROW_ID_COLUMN: pa.array([e[2] for e in picked], pa.int64()),
            "_change_type": pa.array([e[0] for e in picked], pa.string()),
            "_commit_version": pa.array([e[1] for e in picked], pa.int64()),
        }
    )


def _result(table):
    data = table.to_pydict()
    return sorted(
        zip(data[STREAM_ROW_ID], data[STREAM_ACTION], data[STREAM_ISUPDATE], data["A"], data["B"],
            strict=True),
        key=repr,
    )


def _expected_default(before, now):
    out = []
    for row_id in set(before) | set(now):
        old, new = before.get(row_id), now.get(row_id)
        if old == new:
            continue
        update = old is not None and new is not None
        if old is not None:
            out.append((row_id, "DELETE", update, *old))
        if new is not None:
            out.append((row_id, "INSERT", update, *new))
    return sorted(out, key=repr)


@settings(max_examples=400, deadline=None)
@given(histories(), st.integers(0, 8))
def test_net_changes_are_the_difference_of_snapshots(history, after):
    events, snapshots = history
    after = min(after, len(snapshots) - 1)
    before, now = snapshots[after], snapshots[-1]
    table = _events(events, after)

    assert _result(net_events(table, ["A", "B"], ChangeMode.DEFAULT)) == _expected_default(
        before, now
    )

    inserted = {e[2]: e[3] for e in events if e[0] == "insert" and e[1] > after}
    append_only = sorted(((i, "INSERT", False, *row) for i, row in inserted.items()), key=repr)
    assert _result(net_events(table, ["A", "B"], ChangeMode.APPEND_ONLY)) == append_only

    final = sorted(((i, "INSERT", False, *now[i]) for i in inserted if i in now), key=repr)
    assert _result(net_events(table, ["A", "B"], ChangeMode.APPEND_ONLY_FINAL)) == final


def test_no_events_is_no_change():
    empty = _events([], 0)
    for mode in ChangeMode:
        result = net_events(empty, ["A", "B"], mode)
        assert result.num_rows == 0
        assert result.column_names == ["A", "B", STREAM_ACTION, STREAM_ISUPDATE, STREAM_ROW_ID]


def test_nan_and_null_count_as_unchanged():
    table = pa.table(
        {
            "X": pa.array([float("nan"), float("nan"), None, None, 1.0, 2.0]),
            ROW_ID_COLUMN: pa.array([1, 1, 2, 2, 3, 3], pa.int64()),
            "_change_type": ["update_preimage", "update_postimage"] * 3,
            "_commit_version": pa.array([4] * 6, pa.int64()),
        }
    )
    result = net_events(table, ["X"], ChangeMode.DEFAULT).to_pydict()
    assert sorted(zip(result[STREAM_ROW_ID], result[STREAM_ACTION], result["X"], strict=True)) == [
        (3, "DELETE", 1.0),
        (3, "INSERT", 2.0),
    ]
