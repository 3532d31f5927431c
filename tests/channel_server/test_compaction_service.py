"""The service starts compaction in the background and reports its history."""

import time

import pytest
from deltalake import DeltaTable

from channel_server import CompactionTrigger
from ingest_sdk import InvalidRequestError, OpenChannelRequest


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
    assert server.service.metrics.compactions_started >= 1
    table = DeltaTable(info["location"])
    assert sorted(int(v) for v in table.to_pyarrow_table().column("ID").to_pylist()) == list(
        range(60)
    )
    channel.insert_rows([{"ID": 60}], end_offset_token="6")  # ingestion goes on
    assert channel.wait_for_commit(timeout=30) == "6"


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
    logs = list((server.config.warehouse / "_logs").glob("compaction-*.log"))
    assert len(logs) == 1
