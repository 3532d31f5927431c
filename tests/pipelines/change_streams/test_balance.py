"""The balancer splits partitions that stay hot and merges adjacent ones that stay cold;
readers follow the lineage and get every change once."""

import json

import pytest

from catalog import PartitionRecord
from flush.commit_clock import clock
from pipelines.change_streams.balance import Balancer
from pipelines.change_streams.partitions import BalancePolicy, choose, open_partitions
from pipelines.change_streams.records import rfc3339


class Ticks:
    """A clock the test moves: each check is ``step`` seconds after the last."""

    def __init__(self, step=1.0):
        self.now, self.step = 0.0, step

    def __call__(self):
        self.now += self.step
        return self.now


def _part(token, lo, hi):
    return PartitionRecord(token, "u", lo, hi, 0, None, ())


def test_choose_splits_hot_and_merges_adjacent_cold():
    parts = [_part("a", 0, 10), _part("b", 10, 20), _part("c", 20, 30), _part("d", 30, 40)]
    policy = BalancePolicy(sustain=2, min_partitions=1, max_partitions=8)
    splits, merges = choose(parts, {"a": 2, "b": 1}, {"c": 2, "d": 2, "b": 5}, policy)
    assert splits == ["a"]
    assert merges == [("b", "c")]  # a is being split; d has no cold neighbour left
    # Bounds: never past max_partitions, never below min_partitions.
    assert choose(parts, {t: 9 for t in "abcd"}, {}, BalancePolicy(max_partitions=5))[0] == ["a"]
    cold = {t: 9 for t in "abcd"}
    assert choose(parts, {}, cold, BalancePolicy(min_partitions=3))[1] == [("a", "b")]
    # Not adjacent: no merge.
    gap = [_part("a", 0, 10), _part("c", 20, 30)]
    assert choose(gap, {}, {"a": 9, "c": 9}, BalancePolicy()) == ([], [])


def _every_change(session, start_us):
    """Every mod of CS from ``start_us``, following the partition tree parents-first;
    and the tokens read."""
    start = rfc3339(start_us)
    pending = []
    for row in session.sql(f"SELECT * FROM READ_CS('{start}', NULL, NULL, 1000)").collect():
        for child in json.loads(row[0])["child_partitions_record"]["child_partitions"]:
            pending.append((child["token"], start))
    mods, read = [], []
    while pending:
        token, at = pending.pop(0)
        if token in read:
            continue
        read.append(token)
        rows = session.sql(f"SELECT * FROM READ_CS('{at}', NULL, '{token}', 1000)").collect()
        for row in rows:
            record = json.loads(row[0])
            if "data_change_record" in record:
                mods += [m["keys"]["ID"] for m in record["data_change_record"]["mods"]]
            elif "child_partitions_record" in record:
                child = record["child_partitions_record"]
                pending += [
                    (c["token"], child["start_timestamp"]) for c in child["child_partitions"]
                ]
    return mods, read


def test_a_hot_partition_splits_and_cold_ones_merge_back(session):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    start = clock()
    policy = BalancePolicy(split_rows_per_s=5, merge_rows_per_s=1, sustain=1)
    ticks = Ticks(step=1.0)
    balancer = Balancer(session.catalog, policy, clock=ticks)
    assert balancer.check() == []  # the first check only takes the table's position
    session.sql("INSERT INTO T SELECT id, 'a' FROM range(50)")  # 50 rows in a second
    done = balancer.check()
    assert len(done) == 1 and done[0].startswith("split DB.PUBLIC.CS")
    halves = open_partitions(session.catalog, stream)
    assert len(halves) == 2 and halves[0].hi == halves[1].lo
    session.sql("UPDATE T SET V = 'c' WHERE ID < 5")  # 5 rows in 100 s: cold
    ticks.step = 100.0
    done = balancer.check()
    assert len(done) == 1 and done[0].startswith("merged DB.PUBLIC.CS")
    assert len(open_partitions(session.catalog, stream)) == 1
    session.sql("DELETE FROM T WHERE ID >= 45")
    mods, read = _every_change(session, start)
    assert len(read) == 4  # the first partition, its two halves, the merged one
    expected = list(range(50)) + list(range(5)) + list(range(45, 50))
    assert sorted(mods) == sorted(expected)  # each change once, across the whole tree


@pytest.mark.parametrize("threshold", [1e9])
def test_nothing_moves_below_the_thresholds(session, threshold):
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T OPTIONS (partitions = 2)")
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    balancer = Balancer(session.catalog, BalancePolicy(split_rows_per_s=threshold,
                                                       merge_rows_per_s=0), clock=Ticks())  # fmt: skip
    for n in range(3):
        session.sql(f"INSERT INTO T VALUES ({n}, 'x')")
        assert balancer.check() == []
    assert len(open_partitions(session.catalog, stream)) == 2
