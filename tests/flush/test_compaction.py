"""Spark compaction on real Delta tables, with the shared Spark session."""

import itertools
import math
import os
import random
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from catalog import SqliteCatalog
from flush import ROW_ID_COLUMN, ChannelProgress, TableWriter, compaction, create_table
from flush.bin_rewrite import BinCheckFailed, BinTask, KeyRange, range_boundaries, rewrite_bin
from flush.compaction import CompactionPolicy, compact_table, plan_bins
from flush.maintenance import maintain_table, vacuum_data_folders
from flush.spark_tables import read_delta
from ingest_sdk import OpenChannelRequest, TableSchema, convert_rows

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = TableSchema.parse(
    {"ID": "INT NOT NULL", "K": "NUMBER(9,0)", "S": "VARCHAR(20)", "TS": "TIMESTAMP_LTZ(6)"}
)


def flush_many(uri, flushes, rows_per_flush, seed=1):
    """Many small flushes through the real commit path; returns the writer."""
    rng = random.Random(seed)
    writer = TableWriter(uri, SCHEMA)
    next_id = 0
    for number in range(flushes):
        rows = [
            {"ID": number * rows_per_flush + i, "K": rng.randrange(1000), "S": f"s{i}",
             "TS": 1_700_000_000 + number}
            for i in range(rows_per_flush)
        ]  # fmt: skip
        batch, _ = convert_rows(SCHEMA, rows)
        record = writer.commit_flush(
            [pa.Table.from_batches([batch])],
            [ChannelProgress("c", 1, number + 1, str(number), rows_per_flush)],
            next_id,
        )
        next_id = record.next_row_id
    return writer


@pytest.fixture
def table_uri(tmp_path):
    uri = str(tmp_path / "t")
    create_table(uri, SCHEMA)
    return uri


def snapshot(uri):
    return DeltaTable(uri).to_pyarrow_table().sort_by(ROW_ID_COLUMN)


def test_compaction_bins_files_and_changes_no_row(spark, table_uri):
    flush_many(table_uri, 30, 50)
    before = snapshot(table_uri)
    sizes = [
        a["size_bytes"]
        for a in pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    ]
    target = sum(sizes[:10]) + 1  # ten files per bin
    result = compact_table(spark, table_uri, CompactionPolicy(target_file_bytes=target))
    assert result.status == "SUCCEEDED", result.error
    assert (result.files_in, result.files_out, result.bins) == (30, 3, [10, 10, 10])
    assert result.rows_in == result.rows_out == 1500
    table = DeltaTable(table_uri)
    assert len(table.file_uris()) == 3
    assert all("/_compacted/" in uri for uri in table.file_uris())
    for uri in table.file_uris():
        columns = pq.read_metadata(uri).row_group(0)
        for index in range(columns.num_columns):
            column = columns.column(index)
            assert column.compression == "ZSTD" and column.statistics.has_min_max
    assert snapshot(table_uri).equals(before)  # every row and value unchanged
    ids = [pq.read_table(uri, columns=[ROW_ID_COLUMN]).column(0) for uri in table.file_uris()]
    assert all(i.equals(i.take(pc.sort_indices(i))) for i in ids)  # each in ingestion order
    cdf = table.load_cdf(starting_version=result.version, ending_version=result.version)
    assert cdf.read_all().num_rows == 0  # a change feed sees nothing new
    assert table.history(1)[0]["ingest.compaction"]
    # Spark reads the same table (the reverse engine check).
    assert read_delta(spark, table_uri).count() == 1500
    again = compact_table(spark, table_uri, CompactionPolicy(target_file_bytes=target * 100))
    assert again.status == "SUCCEEDED" and again.files_out == 1  # undersized files merge


def test_statistics_let_delta_rs_skip_files(spark, table_uri):
    flush_many(table_uri, 20, 50)
    sizes = sum(
        a["size_bytes"]
        for a in pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    )
    result = compact_table(spark, table_uri, CompactionPolicy(target_file_bytes=sizes // 4 + 1))
    assert result.files_out >= 4
    actions = pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    assert all(
        a["num_records"] > 0 and a["min.ID"] is not None and a["null_count.K"] == 0 for a in actions
    )
    dataset = DeltaTable(table_uri).to_pyarrow_dataset()
    fragments = list(dataset.get_fragments(filter=pc.field("ID") < pa.scalar(Decimal(10))))
    assert len(fragments) == 1  # min/max of the row-ordered files exclude all others


@pytest.mark.parametrize("max_range_tasks", [8, 1], ids=["arrow-range-tasks", "spark-sql"])
def test_clustering_makes_file_ranges_disjoint(spark, table_uri, monkeypatch, max_range_tasks):
    monkeypatch.setattr(compaction, "MAX_RANGE_TASKS", max_range_tasks)
    flush_many(table_uri, 24, 100)
    before = snapshot(table_uri)
    total = sum(
        a["size_bytes"]
        for a in pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    )
    policy = CompactionPolicy(target_file_bytes=total // 3 + 1, clustering=("K",))
    result = compact_table(spark, table_uri, policy)
    assert result.status == "SUCCEEDED" and result.files_out >= 2
    ranges = sorted(
        (a["min.K"], a["max.K"])
        for a in pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    )
    for (_, high), (low, _) in itertools.pairwise(ranges):
        assert high < low, ranges  # non-overlapping per-file ranges
    assert snapshot(table_uri).equals(before)


def test_key_ranges_cover_every_value_once_with_null_and_nan_last():
    values = pa.table({"X": pa.array([None, float("nan"), 1.0, 2.0, 3.0, 5.0, 7.0])})
    dataset = ds.dataset(values)
    ranges = [KeyRange("X", (2.0, 5.0), index) for index in range(3)]
    held = [
        dataset.to_table(filter=r.predicate(pa.float64())).column("X").to_pylist() for r in ranges
    ]
    assert held[0] == [1.0] and held[1] == [2.0, 3.0]
    assert held[2][2:] == [5.0, 7.0] and held[2][0] is None and math.isnan(held[2][1])
    assert KeyRange("X", (), 0).predicate(pa.float64()) is None  # one range: every row


def test_range_boundaries_split_rows_evenly_and_skip_repeats(tmp_path):
    path = str(tmp_path / "k.parquet")
    keys = [None] * 50 + [float("nan")] * 5 + [1.0] * 60 + [float(i) for i in range(2, 42)]
    pq.write_table(pa.table({"K": keys}), path)
    boundaries = range_boundaries([path], "K", 4)
    # 1.0 holds 60 of the 100 known values (nulls and NaN are left out): the cuts at
    # the 25th and 50th value fall on it and are dropped, so no range is empty.
    assert boundaries == (17.0,)
    assert range_boundaries([path], "K", 1) == ()


def test_clustering_by_a_column_with_nulls_and_nan_keeps_every_row(spark, tmp_path):
    schema = TableSchema.parse({"ID": "INT NOT NULL", "F": "FLOAT"})
    uri = str(tmp_path / "f")
    create_table(uri, schema)
    writer = TableWriter(uri, schema)
    rng = random.Random(3)
    for number in range(12):
        rows = [
            {"ID": number * 40 + i,
             "F": rng.choice([None, float("nan"), rng.random() * 100, rng.random() * 100])}
            for i in range(40)
        ]  # fmt: skip
        batch, _ = convert_rows(schema, rows)
        progress = ChannelProgress("c", 1, number + 1, str(number), 40)
        writer.commit_flush([pa.Table.from_batches([batch])], [progress], number * 40)

    def rows(table):  # NaN != NaN, so compare it as text
        return [
            {k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            for row in table.to_pylist()
        ]

    before = rows(snapshot(uri))
    assert sum(r["F"] == "NaN" for r in before) > 0 and sum(r["F"] is None for r in before) > 0
    total = sum(a["size_bytes"] for a in live_actions(uri))
    policy = CompactionPolicy(target_file_bytes=total // 3 + 1, clustering=("F",))
    result = compact_table(spark, uri, policy)
    assert result.status == "SUCCEEDED" and result.files_out >= 2, result.error
    assert rows(snapshot(uri)) == before  # null and NaN rows kept, once each
    ranges = sorted((a["min.F"], a["max.F"]) for a in live_actions(uri))
    for (_, high), (low, _) in itertools.pairwise(ranges):
        assert high < low, ranges


def test_one_clustered_bin_is_sorted_by_the_clustering_columns(spark, table_uri):
    flush_many(table_uri, 10, 40)
    before = snapshot(table_uri)
    result = compact_table(spark, table_uri, CompactionPolicy(clustering=("K", "S")))
    assert result.status == "SUCCEEDED" and result.files_out == 1
    (uri,) = DeltaTable(table_uri).file_uris()
    data = pq.read_table(uri)
    keys = [("K", "ascending"), ("S", "ascending"), (ROW_ID_COLUMN, "ascending")]
    assert data.equals(data.sort_by(keys))
    assert snapshot(table_uri).equals(before)


def test_files_from_both_rewrite_paths_compact_together(spark, table_uri):
    """Spark SQL's clustered files, left undersized, merge with new flushes in a bin task."""
    flush_many(table_uri, 12, 50)
    total = sum(a["size_bytes"] for a in live_actions(table_uri))
    clustered = CompactionPolicy(target_file_bytes=total // 2 + 1, clustering=("K",))
    first = compact_table(spark, table_uri, clustered)
    assert first.files_out >= 2  # the Spark SQL range-partitioning pass
    more = TableWriter(table_uri, SCHEMA)
    batch, _ = convert_rows(
        SCHEMA, [{"ID": 10_000 + i, "K": i, "S": "x", "TS": 1} for i in range(30)]
    )
    more.commit_flush([pa.Table.from_batches([batch])], [ChannelProgress("d", 1, 1, "0", 30)], 600)
    before = snapshot(table_uri)
    result = compact_table(spark, table_uri, CompactionPolicy(target_file_bytes=total * 10))
    assert result.status == "SUCCEEDED", result.error
    assert (result.files_in, result.files_out) == (first.files_out + 1, 1)
    assert snapshot(table_uri).equals(before)


def test_a_bin_whose_rows_do_not_check_out_fails_the_run_and_commits_nothing(spark, table_uri):
    """An input read twice (repeated row ids) is caught inside the Spark task."""
    flush_many(table_uri, 4, 10)
    files = live_actions(table_uri)
    doubled = [[files[0], files[0], *files[1:]]]
    with pytest.raises(RuntimeError, match=r"a bin rewrite task failed: .*repeated row ids"):
        compaction._run_tasks(spark, compaction._bin_tasks(table_uri, doubled, (), "bad-run"))
    assert not list(Path(table_uri).glob("_compacted/bad-run/*"))  # refused before writing
    version = DeltaTable(table_uri).version()
    assert compact_table(spark, table_uri, CompactionPolicy()).status == "SUCCEEDED"
    assert DeltaTable(table_uri).version() == version + 1


def test_bin_rewrite_checks_rows_against_the_log_and_repeated_ids(table_uri):
    flush_many(table_uri, 3, 10)
    paths = tuple(a["path"] for a in live_actions(table_uri))
    task = BinTask(table_uri, paths, "_compacted/r/out.parquet", (), ROW_ID_COLUMN, 31)
    with pytest.raises(BinCheckFailed, match="read 30 rows from 3 files whose Delta stats say 31"):
        rewrite_bin(task)
    repeated = BinTask(
        table_uri, (*paths, paths[0]), "_compacted/r/out.parquet", (), ROW_ID_COLUMN, None
    )
    with pytest.raises(BinCheckFailed, match="repeated row ids"):
        rewrite_bin(repeated)
    written = rewrite_bin(
        BinTask(table_uri, paths, "_compacted/r/out.parquet", ("K",), ROW_ID_COLUMN, 30)
    )
    assert written.rows == 30 and orjson.loads(written.stats)["numRecords"] == 30
    assert not list((Path(table_uri) / "_compacted" / "r").glob(".*.tmp"))  # renamed into place


def test_bin_rewrite_uses_dictionaries_only_for_repeating_columns(table_uri):
    writer = TableWriter(table_uri, SCHEMA)
    rows = [{"ID": i, "K": i, "S": "ab"[i % 2], "TS": 1} for i in range(200)]
    batch, _ = convert_rows(SCHEMA, rows)
    writer.commit_flush([pa.Table.from_batches([batch])], [ChannelProgress("c", 1, 1, "0", 200)], 0)
    paths = tuple(a["path"] for a in live_actions(table_uri))
    written = rewrite_bin(
        BinTask(table_uri, paths, "_compacted/r/d.parquet", (), ROW_ID_COLUMN, 200)
    )
    group = pq.read_metadata(Path(table_uri) / written.path).row_group(0)
    encodings = {
        group.column(i).path_in_schema: group.column(i).encodings for i in range(group.num_columns)
    }
    assert "RLE_DICTIONARY" in encodings["S"] and "RLE_DICTIONARY" in encodings["TS"]
    assert not {"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & set(encodings["ID"] + encodings["K"])


def live_actions(uri):
    return pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()


def test_plan_leaves_large_optimized_files_alone():
    files = [
        {"path": "_ingest/a.parquet", "size_bytes": 10},
        {"path": "_compacted/r/big.parquet", "size_bytes": 1000},
        {"path": "_compacted/r/small.parquet", "size_bytes": 100},
    ]
    bins = plan_bins(files, CompactionPolicy(target_file_bytes=1000))
    assert [[f["path"] for f in b] for b in bins] == [
        ["_ingest/a.parquet", "_compacted/r/small.parquet"]
    ]
    assert plan_bins(files[1:2], CompactionPolicy(target_file_bytes=1000)) == []


def test_a_concurrent_removal_abandons_the_run_cleanly(spark, table_uri):
    flush_many(table_uri, 6, 10)
    before = snapshot(table_uri)
    victim = pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()[0]

    def remove_one_input(message):
        if "written" in message:  # after Spark wrote the outputs, before the commit
            table = DeltaTable(table_uri)
            table.create_write_transaction(
                [RemoveAction(victim["path"], True, int(time.time() * 1000), victim["size_bytes"])],
                "append",
                table.schema(),
            )

    result = compact_table(spark, table_uri, CompactionPolicy(), progress=remove_one_input)
    assert result.status == "ABANDONED" and "removed concurrently" in result.error
    assert not list((Path(table_uri) / "_compacted").glob("*/*.parquet"))  # outputs deleted
    after = snapshot(table_uri)
    assert after.num_rows == before.num_rows - victim["num_records"]  # only the removal shows


def test_compaction_while_producers_insert(spark, server_factory, client_factory):
    server = server_factory()
    client = client_factory(server.url, max_client_lag=0.05)
    info = client.create_table("db.s.t", {"ID": "INT NOT NULL"})
    channel = client.open_channel(OpenChannelRequest("c", "DB", "S", "T"))
    stop = threading.Event()
    inserted = []

    def produce():
        n = 0
        while not stop.is_set() or n < 400:
            channel.insert_rows([{"ID": i} for i in range(n, n + 20)], end_offset_token=str(n + 19))
            n += 20
            inserted.append(n)
            time.sleep(0.01)

    thread = threading.Thread(target=produce)
    thread.start()
    results = []
    for _ in range(2):
        time.sleep(0.5)
        results.append(compact_table(spark, info["location"], CompactionPolicy()))
    stop.set()
    thread.join()
    total = inserted[-1]
    assert channel.wait_for_commit(timeout=60) == str(total - 1)
    assert any(r.status == "SUCCEEDED" for r in results)
    ids = sorted(
        int(v) for v in DeltaTable(info["location"]).to_pyarrow_table().column("ID").to_pylist()
    )
    assert ids == list(range(total))  # none lost, none doubled
    assert channel.get_latest_committed_offset_token() == str(total - 1)


def _prepare_warehouse(tmp_path):
    warehouse = tmp_path / "warehouse"
    catalog = SqliteCatalog(warehouse / "catalog.sqlite")
    uri = str(warehouse / "DB" / "S" / "T")
    create_table(uri, SCHEMA)
    info = catalog.create_table("DB", "S", "T", uri, SCHEMA)
    catalog.close()
    flush_many(uri, 12, 20)
    return warehouse, uri, info


def _run_cli(warehouse, *extra, failpoints=""):
    env = dict(os.environ, PYTHONPATH=str(ROOT), INGEST_FAILPOINTS=failpoints)
    return subprocess.run(
        [sys.executable, "-m", "flush.compact", "--warehouse", str(warehouse), "--table", "db.s.t",
         "--spark-master", "local[1]", *extra],
        env=env, cwd=ROOT, capture_output=True, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("failpoint", ["compaction_before_commit", "compaction_after_commit"])
def test_killed_compaction_leaves_the_same_rows_and_vacuum_removes_orphans(tmp_path, failpoint):
    warehouse, uri, _ = _prepare_warehouse(tmp_path)
    before = snapshot(uri)
    killed = _run_cli(warehouse, "--no-maintenance", failpoints=f"{failpoint}=kill")
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    assert snapshot(uri).equals(before)  # readable, exactly the same rows
    committed = failpoint == "compaction_after_commit"
    assert len(DeltaTable(uri).file_uris()) == (1 if committed else 12)
    leftovers = [p for p in Path(uri).rglob("*.parquet")]
    assert len(leftovers) == 13  # 12 flushed files + 1 compacted file, committed or not
    deleted = vacuum_data_folders(uri, 0, allow_short_retention=True)
    remaining = {str(p.relative_to(uri)) for p in Path(uri).rglob("*.parquet")}
    referenced = {str(Path(u).relative_to(uri)) for u in DeltaTable(uri).file_uris()}
    assert remaining == referenced and len(deleted) >= 12 - len(referenced) + 1
    assert snapshot(uri).equals(before)


def test_cli_records_the_migration_history_and_maintains(tmp_path):
    warehouse, uri, info = _prepare_warehouse(tmp_path)
    done = _run_cli(warehouse, "--retention-hours", "0", "--allow-short-retention")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert b"committed version" in done.stderr  # progress display
    catalog = SqliteCatalog(warehouse / "catalog.sqlite")
    (run,) = catalog.list_migrations(info.id)
    catalog.close()
    assert run["status"] == "SUCCEEDED" and run["files_in"] == 12 and run["files_out"] == 1
    assert run["rows_in"] == run["rows_out"] == 240 and run["version"] == 13
    assert run["bytes_in"] > 0 and run["ended_at"] >= run["started_at"]
    assert len(list((Path(uri) / "_ingest").glob("*.parquet"))) == 0  # vacuumed
    assert list((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))


def test_serve_answers_each_request_and_survives_bad_ones(tmp_path):
    warehouse, uri, info = _prepare_warehouse(tmp_path)
    requests = b'not json\n{"table": "db.s.nope"}\n{"table": "db.s.t"}\n{"table": "db.s.t"}\n'
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "flush.compact", "--warehouse", str(warehouse), "--serve",
         "--spark-master", "local[1]", "--no-maintenance"],
        input=requests, env=env, cwd=ROOT, capture_output=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    answers = [orjson.loads(line) for line in done.stdout.splitlines()]  # only answers on stdout
    assert [a["status"] for a in answers] == ["FAILED", "FAILED", "SUCCEEDED", "NOTHING_TO_DO"]
    assert "JSONDecodeError" in answers[0]["error"] and "NOPE" in answers[1]["error"]
    assert answers[2]["files_in"] == 12 and answers[2]["table"] == "DB.S.T"
    catalog = SqliteCatalog(warehouse / "catalog.sqlite")
    assert [r["status"] for r in catalog.list_migrations(info.id)] == ["SUCCEEDED", "NOTHING_TO_DO"]
    catalog.close()
    assert len(DeltaTable(uri).file_uris()) == 1


def test_vacuum_refuses_short_retention_by_default(table_uri):
    with pytest.raises(ValueError, match="retention under 1"):
        vacuum_data_folders(table_uri, 0.5)
    assert maintain_table(table_uri).deleted_files == []
