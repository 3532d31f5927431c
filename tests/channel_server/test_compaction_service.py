"""The service starts compaction in the background and reports its history."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from deltalake import DeltaTable

from channel_server import CompactionTrigger
from channel_server.service import spark_worker_command
from ingest_sdk import InvalidRequestError, OpenChannelRequest


def test_a_run_skips_a_table_whose_lease_another_service_holds(server_factory, client_factory):
    """Of several services on one warehouse one compacts a table at a time: the run finds
    the table's lease held by another and skips, without starting Spark."""
    server = server_factory(compaction=CompactionTrigger(spark_master="local[1]"))
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT NOT NULL"})
    catalog = server.service.catalog
    table_id = catalog.get_table("DB", "S", "T").id
    lease = f"compaction:{table_id}"
    assert catalog.take_lease(lease, "another-service", 60)
    assert client.compact("db.s.t") is True
    run = server.call(server.service.compaction.run_of, table_id)
    server.run(_finished(run))
    registry = server.service.metrics.registry
    labels = {"table": "DB.S.T", "status": "SKIPPED"}
    assert registry.get_sample_value("ingest_compactions_total", labels) == 1
    assert server.service.worker._process is None  # no Spark was started for it
    assert catalog.lease_holder(lease)[0] == "another-service"  # untouched
    assert client.get_migration_history("db.s.t") == []


async def _finished(run):
    await asyncio.wait_for(asyncio.shield(run), 30)


def test_background_compaction_past_the_file_threshold(server_factory, client_factory):
    trigger = CompactionTrigger(max_intermediate_files=4, spark_master="local[1]")
    server = server_factory(compaction=trigger)
    client = client_factory(server.url, max_client_lag=0.05)
    info = client.create_table("db.s.t", {"ID": "INT NOT NULL", "K": "INT"})
    assert client.set_clustering("db.s.t", ["k"])["clustering"] == ["K"]
    channel = client.open_channel(OpenChannelRequest("c", "DB", "S", "T"))
    for n in range(6):  # six flushes: more than four intermediate files
        channel.insert_rows(
            [{"ID": n * 10 + i, "K": i} for i in range(10)], end_offset_token=str(n)
        )
        channel.wait_for_commit(timeout=30)
    deadline = time.monotonic() + 240
    history = []
    while time.monotonic() < deadline and not history:
        time.sleep(1)
        history = client.get_migration_history("db.s.t")
    assert history, "no compaction ran"
    (run,) = history
    assert run["status"] == "SUCCEEDED" and run["files_in"] >= 5 and run["files_out"] == 1
    registry = server.service.metrics.registry
    labels = {"table": "DB.S.T", "status": "SUCCEEDED"}
    deadline = time.monotonic() + 30  # the counter follows the run record by an instant
    while not registry.get_sample_value("ingest_compactions_total", labels):
        assert time.monotonic() < deadline, "the compaction was not counted"
        time.sleep(0.1)
    table = DeltaTable(info["location"])
    assert sorted(int(v) for v in table.to_pyarrow_table().column("ID").to_pylist()) == list(
        range(60)
    )
    channel.insert_rows([{"ID": 60}], end_offset_token="6")  # ingestion goes on
    assert channel.wait_for_commit(timeout=30) == "6"
    # The run gave the table's compaction lease up: another service may take it at once.
    table_id = server.service.catalog.get_table("DB", "S", "T").id
    assert server.service.catalog.take_lease(f"compaction:{table_id}", "another-service", 1)


def test_the_worker_runs_at_its_niceness(server_factory, tmp_path):
    """The Spark worker starts through nice(1) at its niceness, so its compactions and
    statements take the CPU the flushes leave; 0 runs it at the service's priority."""
    niced = server_factory(compaction=CompactionTrigger(enabled=False, worker_nice=7))
    command = spark_worker_command(niced.config)
    assert command[1:3] == ["-n", "7"] and command[3] == sys.executable
    shown = subprocess.run(
        [*command[:3], sys.executable, "-c", "import os; print(os.nice(0))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert int(shown.stdout) == min(19, os.nice(0) + 7)
    plain = server_factory(
        warehouse=tmp_path / "plain", compaction=CompactionTrigger(enabled=False, worker_nice=0)
    )
    assert spark_worker_command(plain.config)[0] == sys.executable


def test_clustering_must_name_table_columns(server, client_factory):
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    with pytest.raises(InvalidRequestError, match="'NOPE' is not a column"):
        client.set_clustering("db.s.t", ["NOPE"])
    assert client.get_migration_history("db.s.t") == []
    assert client.describe_table("db.s.t")["clustering"] == []


def test_stopping_the_service_stops_a_running_compaction(server_factory, client_factory):
    import gc

    trigger = CompactionTrigger(max_intermediate_files=1000, spark_master="local[1]")
    server = server_factory(compaction=trigger)
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(OpenChannelRequest("c", "DB", "S", "T"))
    channel.insert_rows([{"ID": 1}], end_offset_token="1")
    channel.wait_for_commit(timeout=30)
    assert client.compact("db.s.t") is True
    assert client.compact("db.s.t") is False  # one at a time per table
    time.sleep(0.5)  # the compaction process is starting its JVM
    server.stop()  # cancels it: the process is killed and reaped, nothing leaks
    gc.collect()  # a leaked subprocess transport would warn (an error in this suite) here
    logs = list((server.config.warehouse / "_logs").glob("spark-worker.log"))
    assert len(logs) == 1


def _wait_for_runs(client, table, count, timeout=240):
    deadline = time.monotonic() + timeout
    history = []
    while time.monotonic() < deadline and len(history) < count:
        time.sleep(0.5)
        history = client.get_migration_history(table)
    assert len(history) >= count, history
    return history


def _two_tables_with_flushes(client, flushes=3):
    channels = {}
    for name in ("db.s.a", "db.s.b"):
        client.create_table(name, {"ID": "INT NOT NULL"})
        _, _, table = name.split(".")
        channels[name] = client.open_channel(OpenChannelRequest("c", "DB", "S", table))
        for n in range(flushes):
            channels[name].insert_rows([{"ID": n}], end_offset_token=str(n))
            channels[name].wait_for_commit(timeout=30)
    return channels


def _ids(server, name):
    location = server.service.tables.describe(name).uri
    return sorted(int(v) for v in DeltaTable(location).to_pyarrow_table().column("ID").to_pylist())


def test_one_warm_worker_serves_every_table_and_stops_when_idle(server_factory, client_factory):
    trigger = CompactionTrigger(
        max_intermediate_files=1000, spark_master="local[1]", worker_idle_seconds=5
    )
    server = server_factory(compaction=trigger)
    client = client_factory(server.url, max_client_lag=0.05)
    _two_tables_with_flushes(client)
    assert client.compact("db.s.a") is True
    assert client.compact("db.s.b") is True  # queued behind a, in the same worker
    for name in ("db.s.a", "db.s.b"):
        (run,) = _wait_for_runs(client, name, 1)
        assert run["status"] == "SUCCEEDED" and (run["files_in"], run["files_out"]) == (3, 1)
        assert _ids(server, name) == [0, 1, 2]
    worker = server.service.worker
    assert worker.starts == 1  # the second table found the worker (and Spark) warm
    deadline = time.monotonic() + 60
    while worker.pid is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert worker.pid is None  # stopped after five idle seconds
    channel = client.open_channel(OpenChannelRequest("c2", "DB", "S", "A"))
    channel.insert_rows([{"ID": 3}], end_offset_token="3")
    channel.wait_for_commit(timeout=30)
    assert client.compact("db.s.a") is True
    assert [r["status"] for r in _wait_for_runs(client, "db.s.a", 2)] == ["SUCCEEDED"] * 2
    assert worker.starts == 2 and _ids(server, "db.s.a") == [0, 1, 2, 3]


def test_a_worker_killed_mid_run_loses_nothing_and_is_replaced(server_factory, client_factory):
    trigger = CompactionTrigger(max_intermediate_files=1000, spark_master="local[1]")
    server = server_factory(compaction=trigger)
    client = client_factory(server.url, max_client_lag=0.05)
    _two_tables_with_flushes(client, flushes=4)
    worker = server.service.worker
    assert client.compact("db.s.a") is True
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and b"DB.S.A: 4 files" not in _read(worker.log_path):
        time.sleep(0.05)
    os.kill(worker.pid, signal.SIGKILL)  # mid-run: after planning, before or in the rewrite
    run = server.service.compaction.run_of(server.service.tables.describe("db.s.a").id)
    assert run is not None
    while time.monotonic() < deadline and not run.done():
        time.sleep(0.1)
    assert run.done() and worker.pid is None
    assert _ids(server, "db.s.a") == [0, 1, 2, 3]  # the table is readable and unchanged
    assert client.compact("db.s.a") is True  # a new worker takes over
    runs = _wait_for_runs(client, "db.s.a", 1)
    assert runs[-1]["status"] == "SUCCEEDED" and runs[-1]["files_in"] == 4
    assert worker.starts == 2 and _ids(server, "db.s.a") == [0, 1, 2, 3]


def _read(path):
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
