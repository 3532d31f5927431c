"""The reference's partition workflow through ``READ_<cs>(...)``: the first query's
partitions, a merge and a split read by their parents and then their children, and
every change of many keys returned exactly once, in its key's partition of the moment."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from flush.commit_clock import now_us
from pipelines.change_streams.records import key_hash, rfc3339
from tests.pipelines.test_change_stream_read import (
    changes,
    created,
    flush_rows,
    micros,
    moment,
    partitions,
    read,
    read_tree,
)

KEYS = 300


def open_partitions(session, cs):
    return sorted((p for p in partitions(session, cs) if p["state"] == "OPEN"),
                  key=lambda p: p["key_range_start"])  # fmt: skip


def owner(parts, key) -> str:
    """The token of the partition of ``parts`` holding ``key``."""
    (found,) = [p["token"] for p in parts
                if p["key_range_start"] <= key_hash([key]) < p["key_range_end"]]  # fmt: skip
    return found


def write_before(session):
    """Changes of every key before the repartition; returns the model of each key's mods:
    key -> [(mod_type, new V or None)]."""
    values = ", ".join(f"({k}, {k})" for k in range(1, KEYS + 1))
    session.sql(f"INSERT INTO K VALUES {values}")
    session.sql("UPDATE K SET V = V + 1 WHERE ID % 3 = 0")
    flush_rows(session, "K", [{"ID": k, "V": -k} for k in range(KEYS + 1, KEYS + 21)])
    model: dict[int, list[tuple[str, Any]]] = {k: [("INSERT", k)] for k in range(1, KEYS + 1)}
    for k in range(3, KEYS + 1, 3):
        model[k].append(("UPDATE", k + 1))
    for k in range(KEYS + 1, KEYS + 21):
        model[k] = [("INSERT", -k)]
    return model


def write_after(session, model):
    """Changes of every key after the repartition, added to ``model``."""
    session.sql("UPDATE K SET V = V + 10 WHERE ID % 2 = 0")
    session.sql("DELETE FROM K WHERE ID % 5 = 0")
    values = ", ".join(f"({k}, 0)" for k in range(KEYS + 21, KEYS + 61))
    session.sql(f"INSERT INTO K VALUES {values}")
    for k, mods in model.items():
        if k % 2 == 0:
            mods.append(("UPDATE", mods[-1][1] + 10))
        if k % 5 == 0:
            mods.append(("DELETE", None))
    for k in range(KEYS + 21, KEYS + 61):
        model[k] = [("INSERT", 0)]


def returned(tree: dict[str, list[dict[str, Any]]]) -> dict[int, list[tuple[str, Any, str, int]]]:
    """Every key's mods as the partitions returned them: (mod_type, new V, token, µs), in
    commit timestamp order."""
    found: dict[int, list[tuple[str, Any, str, int]]] = {}
    for token, records in tree.items():
        for change in changes(records):
            for mod in change["mods"]:
                found.setdefault(mod["keys"]["ID"], []).append((
                    change["mod_type"], mod["new_values"].get("V"), token,
                    micros(change["commit_timestamp"]),
                ))  # fmt: skip
    return {k: sorted(mods, key=lambda m: m[3]) for k, mods in found.items()}


@pytest.fixture
def keyed(session):
    session.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR K OPTIONS (value_capture_type = 'NEW_ROW', "
                "partitions = 3)")  # fmt: skip
    return session


def test_the_first_query_returns_the_initial_partitions(keyed):
    s = keyed
    start = created(s, "CS")
    first = read(s, "CS", start)
    assert [list(r) for r in first] == [["child_partitions_record"]] * 3
    bodies = [r["child_partitions_record"] for r in first]
    assert {b["start_timestamp"] for b in bodies} == {start}
    assert [b["record_sequence"] for b in bodies] == ["00000000", "00000001", "00000002"]
    children = [c for b in bodies for c in b["child_partitions"]]
    assert all(c["parent_partition_tokens"] == [] for c in children)
    shown = partitions(s, "CS")
    assert sorted(c["token"] for c in children) == sorted(p["token"] for p in shown)
    # Three ranges that cover the key space without a gap or an overlap.
    ranges = sorted((p["key_range_start"], p["key_range_end"]) for p in shown)
    assert ranges[0][0] == 0 and ranges[-1][1] == 2**32
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


@pytest.mark.parametrize("change", ["merge", "split"])
def test_every_change_is_returned_once_across_parents_and_children(keyed, change):
    s = keyed
    start = created(s, "CS")
    model = write_before(s)
    before = open_partitions(s, "CS")
    if change == "merge":  # the reference's: 2 and 3 become 4
        parents = [before[1]["token"], before[2]["token"]]
        s.sql(f"ALTER CHANGE STREAM CS MERGE PARTITIONS '{parents[0]}', '{parents[1]}'")
    else:
        parents = [before[1]["token"]]
        s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{parents[0]}' INTO 3")
    after = open_partitions(s, "CS")
    kids = [p["token"] for p in after if p["token"] not in {b["token"] for b in before}]
    assert len(kids) == (1 if change == "merge" else 3)
    write_after(s, model)

    tree = read_tree(s, "CS", start)
    assert set(tree) == {p["token"] for p in before} | set(kids)
    # Each parent ends with one child partitions record, the same for all parents,
    # naming every parent; its start is after each of their records.
    ends = [tree[token][-1] for token in parents]
    assert all(list(e) == ["child_partitions_record"] for e in ends)
    assert all(e == ends[0] for e in ends)
    body = ends[0]["child_partitions_record"]
    assert sorted(c["token"] for c in body["child_partitions"]) == sorted(kids)
    assert all(sorted(c["parent_partition_tokens"]) == sorted(parents)
               for c in body["child_partitions"])  # fmt: skip
    assert sum("child_partitions_record" in r for t in parents for r in tree[t]) == len(parents)
    split_at = micros(body["start_timestamp"])
    for token in parents:
        assert all(micros(c["commit_timestamp"]) < split_at for c in changes(tree[token]))
    for token in kids:
        assert all(micros(c["commit_timestamp"]) >= split_at for c in changes(tree[token]))
        assert list(tree[token][-1]) == ["heartbeat_record"]  # still open
    # Every change of every key exactly once, in the partition that held the key then.
    found = returned(tree)
    assert {k: [(kind, v) for kind, v, _, _ in mods] for k, mods in found.items()} == model
    for key, mods in found.items():
        for _, _, token, at in mods:
            assert token == owner(before if at < split_at else after, key), (key, at)
    assert any(at >= split_at for mods in found.values() for *_, at in mods)


def test_a_read_that_ends_before_its_partition_ends_ends_with_a_heartbeat(keyed):
    """A parent read with an end_timestamp before the parent's end returns its records
    up to that end and a heartbeat, not the child record: that would send the reader to
    the child, past the parent's records between the two ends."""
    s = keyed
    start = created(s, "CS")
    parent = owner(open_partitions(s, "CS"), 1)
    s.sql("INSERT INTO K VALUES (1, 1)")
    middle = now_us()
    values = ", ".join(f"({k}, {k})" for k in range(2, 60))
    s.sql(f"INSERT INTO K VALUES {values}")
    s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{parent}'")
    ended = next(p for p in partitions(s, "CS") if p["token"] == parent)
    assert ended["state"] == "ENDED"
    window = read(s, "CS", start, parent, end=rfc3339(middle))
    assert all("child_partitions_record" not in r for r in window), window
    assert window[-1] == {"heartbeat_record": {"timestamp": rfc3339(middle)}}
    assert all(moment(r) <= middle for r in window)
    # Resumed from that heartbeat, the same partition returns the rest, then its end.
    rest = read(s, "CS", rfc3339(middle), parent)
    assert list(rest[-1]) == ["child_partitions_record"]
    whole = read(s, "CS", start, parent)
    assert changes(window) + changes(rest) == changes(whole)
    assert changes(rest), "the parent had records after the window"
    # At the boundary: a read whose end is the parent's last moment has all its records
    # and ends with the child record; one a microsecond earlier with a heartbeat.
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    (last_us,) = [p.end_us - 1 for p in s.catalog.list_partitions(stream.uid) if p.token == parent]
    assert list(read(s, "CS", start, parent, end=rfc3339(last_us))[-1]) == [
        "child_partitions_record"
    ]
    assert read(s, "CS", start, parent, end=rfc3339(last_us - 1))[-1] == {
        "heartbeat_record": {"timestamp": rfc3339(last_us - 1)}
    }
