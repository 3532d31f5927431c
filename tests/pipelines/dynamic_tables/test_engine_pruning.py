"""The query-delta engine reads only the source files that can hold the rows a rule
needs (:mod:`pipelines.incremental.pruning`): an inner join's term reads the other side's
files whose key range meets the change's keys, a recomputed aggregation or window the
files of the touched keys, a semi, anti or outer join the files of the touched rows.

Sources of several files, each holding one range of keys; the size below which a source
is read whole is set to 0, so every rule that can prune does. Every refresh must stay
INCREMENTAL and equal to its query run fresh; and a change confined to one key range
must be refreshed from that range's files.
"""

from __future__ import annotations

import re

import pytest

from pipelines.incremental import pruning
from tests.pipelines.dynamic_tables.batched import assert_every_step_refreshes_incrementally
from tests.pipelines.dynamic_tables.checks import (
    assert_same_as_query,
    pruning_warehouse,
    record_engine_refreshes,
)


def _filled(table: str, rows: str) -> str:
    return f"INSERT INTO {table} VALUES {rows}"


def _t_rows(low: int) -> str:
    """Ten keys from ``low``, two rows each (one commit: one file)."""
    return ", ".join(f"({low * 10 + i}, {low + i // 2}, {i * 7 % 90})" for i in range(20))


SOURCES = [
    "CREATE TABLE T (ID BIGINT, K INT, V INT)",
    "CREATE TABLE C (K INT, R VARCHAR)",
    *[_filled("T", _t_rows(low)) for low in range(0, 60, 10)],  # 6 files: K 0-9, ..., 50-59
    *[_filled("C", ", ".join(f"({k}, 'r{k % 4}')" for k in range(low, low + 20)))
      for low in range(0, 60, 20)],
]
QUERIES = {
    "join": "SELECT T.ID, T.V, C.R FROM T JOIN C ON T.K = C.K WHERE T.V <> 13",
    "join_sums": "SELECT C.R, count(*) AS N, sum(T.V) AS S FROM T JOIN C ON C.K = T.K GROUP BY C.R",
    "float_sums": "SELECT K, sum(CAST(V AS DOUBLE)) AS S, count(*) AS N FROM T GROUP BY K",
    "window": "SELECT ID, K, row_number() OVER (PARTITION BY K ORDER BY V, ID) AS RN FROM T",
    "exists": "SELECT K, R FROM C WHERE EXISTS (SELECT 1 FROM T WHERE T.K = C.K AND T.V > 50)",
    "left": "SELECT T.ID, C.R FROM T LEFT JOIN C ON T.K = C.K",
}
#: One side changed, both (an inner join's two terms), the other side alone.
STEPS: list[str | list[str]] = [
    ["INSERT INTO T VALUES (1000, 70, 5), (1001, 71, 60), (1002, 15, 61), (1003, NULL, 3)",
     "UPDATE T SET K = 5 WHERE ID = 505"],  # a row moves to another key range
    ["DELETE FROM T WHERE K BETWEEN 40 AND 42", "INSERT INTO C VALUES (70, 'r0'), (15, 'r2')"],
    "UPDATE C SET R = 'r3' WHERE K = 25 OR K = 34",
]
#: Each table, and the source of which it reads fewer files after a change to T's keys 20
#: and 21.
CONFINED = {"join": "C", "float_sums": "T", "window": "T", "left": "C", "exists": "C",
            "exists_rows": "T"}  # fmt: skip


@pytest.fixture(scope="module")
def wh(tmp_path_factory, spark):
    yield from pruning_warehouse(tmp_path_factory.mktemp("pruning"), spark, SOURCES,
                                 {f"P_{name}": query for name, query in QUERIES.items()})  # fmt: skip


def test_every_refresh_is_incremental_and_exact(wh):
    assert_every_step_refreshes_incrementally(
        wh, STEPS, {f"P_{name}": query for name, query in QUERIES.items()}, no_data=True)


def _files_read(session, deltas, table: str) -> int:
    """How many of the table's data files the plan of a refresh's net change reads."""
    def local(path: str) -> str:
        return re.sub(r"^file:/*", "/", path)

    folder = local(session.require_table(table).uri).rstrip("/") + "/"
    return len({p for p in map(local, deltas.net().inputFiles()) if p.startswith(folder)})


def _refreshed(session, monkeypatch, exact: bool) -> dict[str, int]:
    """Each table of :data:`CONFINED` refreshed after an update of T's keys 20 and 21
    (INCREMENTAL; compared with its query where ``exact``): how many files of its table
    it read."""
    seen = record_engine_refreshes(monkeypatch)
    session.sql("UPDATE T SET V = V + 60 WHERE K IN (20, 21)")  # (past EXISTS's V > 50)
    read = {}
    for name, table in CONFINED.items():
        if name == "exists_rows":  # the same refresh: T's rows that the touched rows of C meet
            read[name] = _files_read(session, seen[-1], table)
            continue
        status = session.sql(f"ALTER DYNAMIC TABLE P_{name} REFRESH").collect()[0].status
        assert "INCREMENTAL" in status, (name, status)
        if exact:
            assert_same_as_query(session, f"P_{name}", QUERIES[name])
        read[name] = _files_read(session, seen[-1], table)
    return read


def test_a_change_in_one_key_range_reads_that_ranges_files(wh, monkeypatch):
    """T's keys 20-21 live in one of its first files (and in the file the first step
    added) and meet one of C's first files (and the one a step added): each refresh
    reads fewer files than with pruning off (a source too small to prune). (The count
    is of the files the net change's plan reads: what a rule collected before, e.g.
    EXISTS's touched rows of C, is not in it.)"""
    monkeypatch.setattr(pruning, "PRUNE_FROM_BYTES", 0)
    pruned = _refreshed(wh, monkeypatch, exact=True)
    monkeypatch.setattr(pruning, "PRUNE_FROM_BYTES", 1 << 60)
    whole = _refreshed(wh, monkeypatch, exact=False)
    assert all(pruned[name] < whole[name] for name in CONFINED), str((pruned, whole))
