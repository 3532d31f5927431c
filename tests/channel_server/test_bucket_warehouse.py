"""A warehouse in an S3 bucket (moto): channels commit there as on local disk, a SIGKILL
at the dangerous moments loses and doubles nothing, three servers on one bucket and one
PostgreSQL catalog keep every offset once while producers move between them and servers
die, and the parts that need Spark refuse the bucket by name without changing anything."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from flush.tables import ROW_ID_COLUMN, read_table
from ingest_sdk import (
    ChannelInvalidatedError,
    CommitTimeoutError,
    OpenChannelRequest,
    RetryPolicy,
    StreamingIngestClient,
    TransportError,
)
from ingest_sdk.errors import InvalidRequestError, SqlStatementError
from tests.s3_server import IgnoringConditionalPuts
from tests.servers import ROOT, ProcessServer

TABLE = "db.s.events"


def objects(prefix: str) -> list[str]:
    """Every object key under an ``s3://`` prefix."""
    filesystem, path = pafs.FileSystem.from_uri(prefix)
    found = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(info.path for info in found if info.type == pafs.FileType.File)


def send(url: str, channel: str, last: int, base: int = 0, batch: int = 20) -> str | None:
    """The producer recipe on the server at ``url``: open the channel, resume after its
    committed token, send records up to ``last`` (ids ``base + n``), wait for the commit."""
    client = StreamingIngestClient("producer", url=url, max_client_lag=0.1,
                                   retry=RetryPolicy(deadline=5))  # fmt: skip
    try:
        handle = client.open_channel(OpenChannelRequest(channel, "DB", "S", "EVENTS"))
        token = handle.get_latest_committed_offset_token()
        start = int(token) + 1 if token is not None else 0
        for first in range(start, last + 1, batch):
            end = min(first + batch - 1, last)
            handle.insert_rows([{"ID": base + n} for n in range(first, end + 1)],
                               end_offset_token=str(end))  # fmt: skip
        if start <= last:
            handle.wait_for_commit(timeout=60)
        return handle.get_latest_committed_offset_token()
    finally:
        with contextlib.suppress(Exception):
            client.close()


def bucket_server(tmp_path: Path, warehouse: str, name: str, *args: str, failpoints: str = ""):
    """A ``python -m channel_server`` process on the bucket, its own files in a local folder."""
    state = tmp_path / name
    state.mkdir()
    return ProcessServer(state / "unused", "--warehouse", warehouse, "--state-dir", str(state),
                         *args, failpoints=failpoints)  # fmt: skip


def start_refused(warehouse: str, state: Path) -> subprocess.CompletedProcess[str]:
    """``python -m channel_server`` on the bucket, expected to refuse to start (exit 2)."""
    finished = subprocess.run(
        [sys.executable, "-m", "channel_server", "--port", "0", "--warehouse", warehouse,
         "--state-dir", str(state)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert finished.returncode == 2, finished.stderr[-2000:]
    return finished


def test_channels_commit_into_the_bucket_and_resume_from_its_log(
    s3_warehouse, server_factory, client_factory, tmp_path
):
    server = server_factory(warehouse=s3_warehouse, state_dir=tmp_path / "state")
    client = client_factory(server.url)
    info = client.create_table(TABLE, {"ID": "INT NOT NULL"})
    assert info["location"].startswith(s3_warehouse + "/DB/S/EVENTS-")
    assert send(server.url, "c", 99) == "99"
    assert send(server.url, "c", 149) == "149"  # a reopen resumes after the log's token
    table = DeltaTable(info["location"])
    rows = read_table(table)
    assert sorted(rows.column("ID").to_pylist()) == list(range(150))
    assert len(set(rows.column(ROW_ID_COLUMN).to_pylist())) == 150
    keys = objects(info["location"])
    assert any("/_ingest/" in key and key.endswith(".parquet") for key in keys)
    assert any("/_delta_log/" in key for key in keys)
    # Nothing of the table on local disk: the state folder holds the catalog only.
    assert {p.name for p in (tmp_path / "state").iterdir()} <= {
        "catalog.sqlite", "catalog.sqlite-wal", "catalog.sqlite-shm"
    }  # fmt: skip


def test_sql_and_compaction_refuse_a_bucket_by_name_and_change_nothing(
    s3_warehouse, server_factory, client_factory, tmp_path
):
    server = server_factory(warehouse=s3_warehouse, state_dir=tmp_path / "state")
    client = client_factory(server.url)
    info = client.create_table(TABLE, {"ID": "INT NOT NULL"})
    send(server.url, "c", 9)
    before = objects(info["location"])
    with pytest.raises(SqlStatementError, match="warehouse in a bucket") as refused:
        client.sql(f"DELETE FROM {TABLE}")
    assert (refused.value.status, refused.value.sql_code) == (400, "NOT_SUPPORTED_IN_BUCKET")
    with pytest.raises(InvalidRequestError, match="compaction does not run on a warehouse in a"):
        client.compact(TABLE)
    assert objects(info["location"]) == before
    assert sorted(read_table(DeltaTable(info["location"])).column("ID").to_pylist()) == list(
        range(10)
    )


def test_a_dropped_table_leaves_no_object_in_the_bucket(
    s3_warehouse, server_factory, client_factory, tmp_path
):
    server = server_factory(warehouse=s3_warehouse, state_dir=tmp_path / "state")
    client = client_factory(server.url)
    kept = client.create_table("db.s.kept", {"ID": "INT NOT NULL"})
    info = client.create_table(TABLE, {"ID": "INT NOT NULL"})
    send(server.url, "c", 9)
    client.drop_table(TABLE)
    assert objects(info["location"]) == []
    assert objects(kept["location"])  # the neighbour is untouched


@pytest.mark.parametrize("failpoint", ["after_parquet_write", "after_delta_commit"])
def test_sigkill_around_a_commit_into_the_bucket_keeps_every_offset_once(
    s3_warehouse, tmp_path, failpoint
):
    server = bucket_server(tmp_path, s3_warehouse, "state", failpoints=f"{failpoint}=kill")
    server.start()
    try:
        with StreamingIngestClient("admin", url=server.url) as admin:
            location = admin.create_table(TABLE, {"ID": "INT NOT NULL"})["location"]
        with pytest.raises((TransportError, CommitTimeoutError, ChannelInvalidatedError)):
            send(server.url, "c", 59)
        assert server.wait_killed() != 0
        server.start(failpoints="")  # recovery replays a commit the catalog lacks
        assert send(server.url, "c", 199) == "199"
        ids = read_table(DeltaTable(location)).column("ID").to_pylist()
        assert sorted(ids) == list(range(200))
        with StreamingIngestClient("check", url=server.url) as check:
            (status,) = check.get_latest_committed_offset_tokens([(TABLE, "c")])
            assert status.offset_token == "199"
    finally:
        server.kill()


def test_three_servers_on_one_bucket_keep_every_offset_once_while_servers_die(
    s3_warehouse, postgres_dsn, tmp_path
):
    """Producers reopen their channels on the next server every round; one server dies by
    SIGKILL after a Delta commit, another after writing a Parquet file, and each is
    restarted. Every offset lands once, row ids stay unique, and every server answers
    the log's token."""
    deaths = ["", "after_delta_commit=kill", "after_parquet_write=kill"]
    servers = [bucket_server(tmp_path, s3_warehouse, f"state{n}", "--catalog", postgres_dsn,
                             failpoints=deaths[n]) for n in range(3)]  # fmt: skip
    for server in servers:
        server.args += ["--advertise-url", server.url]
        server.start()
    try:
        with StreamingIngestClient("admin", url=servers[0].url) as admin:
            location = admin.create_table(TABLE, {"ID": "INT NOT NULL"})["location"]
        channels, rounds, per_round, restarts = ["p0", "p1", "p2"], 4, 40, 0
        for round_ in range(rounds):
            for index, channel in enumerate(channels):
                last = (round_ + 1) * per_round - 1
                turn = round_ + index
                while True:
                    server = servers[turn % 3]
                    try:
                        assert send(server.url, channel, last, base=index * 100_000) == str(last)
                        break
                    except (TransportError, CommitTimeoutError, ChannelInvalidatedError):
                        if server.process is not None and server.process.poll() is not None:
                            server.start(failpoints="")  # died: back without its failpoint
                            restarts += 1
                        turn += 1  # and the producer moves on to the next server
        assert restarts == 2  # each server with a failpoint died once, at its first flush
        rows = read_table(DeltaTable(location))
        ids = rows.column("ID").to_pylist()
        total = rounds * per_round
        assert sorted(ids) == sorted(i * 100_000 + n for i in range(3) for n in range(total))
        assert max(Counter(rows.column(ROW_ID_COLUMN).to_pylist()).values()) == 1
        for server in servers:
            with StreamingIngestClient("check", url=server.url) as check:
                statuses = check.get_latest_committed_offset_tokens(
                    [(TABLE, channel) for channel in channels]
                )
                assert [s.offset_token for s in statuses] == [str(total - 1)] * 3
    finally:
        for server in servers:
            server.kill()


def test_the_service_refuses_to_start_on_a_store_that_ignores_conditional_puts(
    s3_server, s3_bucket, s3_warehouse, tmp_path, monkeypatch
):
    with IgnoringConditionalPuts(s3_server) as store:
        endpoint = store.endpoint_url
        for name, value in store.env.items():
            monkeypatch.setenv(name, value)
        finished = start_refused(s3_warehouse, tmp_path / "state")
    (line,) = [line for line in finished.stderr.splitlines() if line.startswith("error:")]
    assert f"the object store at {endpoint} overwrote a Delta commit" in line
    assert "Traceback" not in finished.stderr
    assert s3_server.keys(s3_bucket.name) == []  # nothing written, the probe deleted
    assert not (tmp_path / "state").exists()  # no catalog made either
