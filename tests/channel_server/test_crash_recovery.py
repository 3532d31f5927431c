"""SIGKILL at the dangerous moments of the commit protocol; nothing lost, nothing doubled.

Each test runs the real server as a child process, kills it (with SIGKILL, from
outside or from a failpoint inside the flush), restarts it on the same port,
and lets a producer do what the docs tell producers to do: reopen the channel,
read the latest committed token, resume right after it.
"""

import contextlib
from collections import Counter
from pathlib import Path

from deltalake import DeltaTable

from flush.failpoints import InjectedFailure
from ingest_sdk import (
    ChannelInvalidatedError,
    CommitTimeoutError,
    OpenChannelRequest,
    RetryPolicy,
    StreamingIngestClient,
    TransportError,
)
from tests.servers import table_folder

TABLE = "db.s.events"
REQUEST = OpenChannelRequest("partition-0", "DB", "S", "EVENTS")


def produce_exactly_once(url, total, batch=25, lag=0.1, attempts=10):
    """A producer that follows the recovery recipe until all ``total`` records commit."""
    for _ in range(attempts):
        client = StreamingIngestClient("producer", url=url, max_client_lag=lag,
                                       retry=RetryPolicy(deadline=10))  # fmt: skip
        try:
            channel = client.open_channel(REQUEST)
            token = channel.get_latest_committed_offset_token()
            start = int(token) + 1 if token is not None else 0
            for first in range(start, total, batch):
                last = min(first + batch, total) - 1
                channel.insert_rows([{"ID": n} for n in range(first, last + 1)],
                                    end_offset_token=str(last))  # fmt: skip
            if start < total:
                assert channel.wait_for_commit(timeout=60) == str(total - 1)
            return channel.get_latest_committed_offset_token()
        except (ChannelInvalidatedError, TransportError, CommitTimeoutError):
            continue
        finally:
            with contextlib.suppress(Exception):
                client.close()
    raise AssertionError("the producer never finished")


def committed_ids(warehouse: Path) -> list[int]:
    table = DeltaTable(table_folder(warehouse, "DB", "S", "EVENTS")).to_pyarrow_table()
    return [int(v) for v in table.column("ID").to_pylist()]


def assert_exactly_once(warehouse: Path, total: int) -> None:
    ids = committed_ids(warehouse)
    counts = Counter(ids)
    assert not [n for n, c in counts.items() if c > 1], "duplicated rows"
    assert sorted(ids) == list(range(total)), "lost rows"


def start_producer(url, count):
    """A client whose channel has sent rows 0..count-1 (the server may die flushing them)."""
    client = StreamingIngestClient("p", url=url, max_client_lag=0.1, retry=RetryPolicy(deadline=2))
    channel = client.open_channel(REQUEST)
    channel.insert_rows([{"ID": n} for n in range(count)], end_offset_token=str(count - 1))
    return client


def setup_table(url):
    with StreamingIngestClient("admin", url=url) as admin:
        admin.create_table(TABLE, {"ID": "INT NOT NULL"})


def test_kill_while_rows_are_buffered(process_server_factory):
    server = process_server_factory().start()
    setup_table(server.url)
    produce_exactly_once(server.url, 100)  # rows 0..99 committed, token "99"
    # A slow-flushing handle sends 100..299, which sit in the server's buffer.
    slow = StreamingIngestClient("slow", url=server.url, max_client_lag=60,
                                 retry=RetryPolicy(deadline=2))  # fmt: skip
    channel = slow.open_channel(REQUEST)
    channel.insert_rows([{"ID": n} for n in range(100, 300)], end_offset_token="299")
    try:
        channel.wait_for_commit(timeout=1.0)  # returns only after the rows reached the server
        raise AssertionError("the rows should still be buffered")
    except CommitTimeoutError:
        pass
    server.kill()
    server.start()
    assert produce_exactly_once(server.url, 300) == "299"
    assert_exactly_once(server.warehouse, 300)
    with contextlib.suppress(Exception):
        slow.close()


def test_kill_after_parquet_write_before_commit(process_server_factory):
    server = process_server_factory(failpoints="after_parquet_write=kill").start()
    setup_table(server.url)
    client = start_producer(server.url, 50)
    assert server.wait_killed() != 0  # the first flush wrote its file and died
    ingest = Path(table_folder(server.warehouse, "DB", "S", "EVENTS")) / "_ingest"
    orphans = list(ingest.glob("*.parquet"))
    assert len(orphans) == 1  # written and fsynced, never committed
    server.start(failpoints="")
    assert produce_exactly_once(server.url, 120) == "119"
    assert_exactly_once(server.warehouse, 120)
    referenced = {Path(uri).name for uri in DeltaTable(str(ingest.parent)).file_uris()}
    assert orphans[0].name not in referenced  # the orphan never became visible
    with contextlib.suppress(Exception):
        client.close()


def test_kill_after_commit_before_catalog_update(process_server_factory):
    server = process_server_factory(failpoints="after_delta_commit=kill").start()
    setup_table(server.url)
    client = start_producer(server.url, 60)
    assert server.wait_killed() != 0
    assert sorted(committed_ids(server.warehouse)) == list(range(60))  # the commit stands
    server.start(failpoints="")  # recovery replays the commit into the catalog
    with StreamingIngestClient("check", url=server.url) as check:
        (status,) = check.get_latest_committed_offset_tokens([("db.s.events", "partition-0")])
        assert status.offset_token == "59"
        (shown,) = check.show_channels(TABLE)
        assert shown["rows_committed"] == 60
    assert produce_exactly_once(server.url, 150) == "149"
    assert_exactly_once(server.warehouse, 150)
    with contextlib.suppress(Exception):
        client.close()


def test_failed_commits_are_retried_and_tokens_wait_for_them(
    server_factory, client_factory, monkeypatch
):
    from flush import failpoints

    monkeypatch.setitem(failpoints._POINTS, "before_delta_commit", ["error", 3])
    server = server_factory()
    client = client_factory(server.url)
    client.create_table(TABLE, {"ID": "INT NOT NULL"})
    channel = client.open_channel(REQUEST)
    channel.insert_rows([{"ID": n} for n in range(10)], end_offset_token="9")
    assert channel.wait_for_commit(timeout=60) == "9"
    assert failpoints._POINTS["before_delta_commit"][1] == 0  # it failed three times first
    assert_exactly_once(server.config.warehouse, 10)
    assert issubclass(InjectedFailure, RuntimeError)


def test_tokens_survive_a_restart_and_old_handles_are_invalidated(server_factory, client_factory):
    server = server_factory()
    client = client_factory(server.url)
    client.create_table(TABLE, {"ID": "INT NOT NULL"})
    channel = client.open_channel(REQUEST)
    channel.insert_rows([{"ID": n} for n in range(20)], end_offset_token="19")
    channel.wait_for_commit(timeout=30)
    warehouse = server.config.warehouse
    server.stop()
    restarted = server_factory(warehouse=warehouse)
    again = client_factory(restarted.url)
    (status,) = again.get_latest_committed_offset_tokens([("db.s.events", "partition-0")])
    assert status.offset_token == "19"
    assert produce_exactly_once(restarted.url, 40) == "39"
    assert_exactly_once(warehouse, 40)


def test_a_dropped_channel_opened_again_commits_and_survives_a_kill_after_its_commit(
    process_server_factory,
):
    """The channel's catalog row goes with the drop, its app transaction stays in the log:
    the reopened channel must start above it, commit, and be replayed after a SIGKILL
    between its Delta commit and the catalog update."""
    server = process_server_factory().start()
    setup_table(server.url)
    assert produce_exactly_once(server.url, 50) == "49"
    with StreamingIngestClient("admin", url=server.url) as admin:
        admin.drop_channel(REQUEST)
    server.kill()
    server.start(failpoints="after_delta_commit=kill")
    client = StreamingIngestClient("p", url=server.url, max_client_lag=0.1,
                                   retry=RetryPolicy(deadline=2))  # fmt: skip
    channel = client.open_channel(REQUEST)
    assert channel.generation >= 2  # above the generation the log holds
    assert channel.get_latest_committed_offset_token() is None  # the drop removed the token
    channel.insert_rows([{"ID": n} for n in range(50, 100)], end_offset_token="99")
    assert server.wait_killed() != 0  # died right after the commit
    server.start(failpoints="")
    with StreamingIngestClient("check", url=server.url) as check:
        (status,) = check.get_latest_committed_offset_tokens([("db.s.events", "partition-0")])
        assert status.offset_token == "99"
    assert_exactly_once(server.warehouse, 100)
    with contextlib.suppress(Exception):
        client.close()
