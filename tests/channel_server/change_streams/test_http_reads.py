"""GET /v1/change-streams/{name}/read and the SDK's ``read_change_stream``, against a real
service on a loopback port and tables a session on the same warehouse writes: the
records equal what ``SELECT * FROM READ_<cs>(...)`` returns, the first query returns the
partitions, heartbeats on an idle table, a split ends the read with its child
partitions record, a client that leaves (or a service that stops) ends the read's
thread, every mistake is a 4xx naming the fix, and a client that never reads holds up
neither other reads nor the flusher."""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import orjson
import pytest

from channel_server import change_stream_api
from channel_server.change_stream_api import NDJSON, ReadLimits, reads_of
from flush.commit_clock import now_us
from ingest_sdk import (
    AsyncStreamingIngestClient,
    ClientLimits,
    ConfigurationError,
    InvalidRequestError,
    OpenChannelRequest,
    TransportError,
)
from ingest_sdk.errors import ChangeStreamNotFoundError
from pipelines import Session
from pipelines.change_streams.records import rfc3339

READ = "/v1/change-streams/{}/read"
#: Longest a test waits for something that happens within moments (a hang guard, never
#: a timing assertion).
PATIENCE = 60.0


@pytest.fixture
def client(server, client_factory):
    return client_factory(server.url)


def created(session: Session, cs: str = "CS") -> str:
    """The moment change stream ``cs`` was created, as a start_timestamp."""
    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    assert stream is not None
    return rfc3339(stream.created_us)


def micros(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def sql_read(session: Session, cs: str, start: str, token: str | None = None,
             end: str | None = None, heartbeat: int = 1000) -> list[dict[str, Any]]:  # fmt: skip
    """The records of ``SELECT * FROM READ_<cs>(...)``."""
    value = lambda v: "NULL" if v is None else f"'{v}'"  # noqa: E731
    text = (f"SELECT * FROM READ_{cs}(start_timestamp => {value(start)}, end_timestamp => "
            f"{value(end)}, partition_token => {value(token)}, heartbeat_milliseconds => "
            f"{heartbeat})")  # fmt: skip
    return [orjson.loads(row[0]) for row in session.sql(text).collect()]


def children(records: list[dict[str, Any]]) -> list[str]:
    return [
        child["token"]
        for record in records
        for child in record["child_partitions_record"]["child_partitions"]
    ]


def open_tokens(session: Session, cs: str = "CS") -> set[str]:
    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    assert stream is not None
    return {p.token for p in session.catalog.list_partitions(stream.uid) if p.end_us is None}


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def read_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("change-stream-read")]


async def error_of(http: aiohttp.ClientSession, name: str, **params: Any) -> tuple:
    """``(status, code, message)`` of a read the service refuses."""
    async with http.get(READ.format(name), params=params) as response:
        assert response.content_type == "application/json", await response.read()
        error = (await response.json())["error"]
        return response.status, error["code"], error["message"]


# Records


def test_records_over_http_are_those_of_the_sql_read_function(session, client):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T OPTIONS (partitions = 3)")
    start = created(session)
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    session.sql("UPDATE T SET V = 'z' WHERE ID IN (2, 3)")
    session.sql("DELETE FROM T WHERE ID = 4")
    end = rfc3339(now_us())

    first = list(client.read_change_stream("cs", start, heartbeat_milliseconds=1000))
    assert first == sql_read(session, "CS", start)  # the first query: the partitions
    assert all(list(record) == ["child_partitions_record"] for record in first)
    assert set(children(first)) == open_tokens(session) and len(children(first)) == 3

    mods = 0
    for token in children(first):
        over_http = list(client.read_change_stream(
            "DB.PUBLIC.CS", start, end_timestamp=end, partition_token=token,
            heartbeat_milliseconds=1000,
        ))  # fmt: skip
        assert over_http == sql_read(session, "CS", start, token, end)
        assert over_http[-1] == {"heartbeat_record": {"timestamp": end}}  # it ends at end
        for record in over_http[:-1]:
            assert list(record) == ["data_change_record"]
            mods += len(record["data_change_record"]["mods"])
    assert mods == 4 + 2 + 1  # every insert, update and delete, each in one partition


async def test_the_async_client_reads_as_the_sync_one_does(server, session, client):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql('CREATE CHANGE STREAM "lower" FOR T')
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "lower")
    start = datetime.fromtimestamp(stream.created_us / 1e6, UTC).replace(tzinfo=None)  # naive
    session.sql("INSERT INTO T VALUES (1, 'a')")
    end = datetime.now(UTC)
    async with AsyncStreamingIngestClient("async-reader", server.url) as reader:
        first = [r async for r in reader.read_change_stream('"lower"', start)]
        (token,) = children(first)
        found = [
            r
            async for r in reader.read_change_stream(
                'PUBLIC."lower"', start, end_timestamp=end, partition_token=token,
                heartbeat_milliseconds=1000,
            )
        ]  # fmt: skip
    expected = list(client.read_change_stream(
        '"lower"', rfc3339(stream.created_us), end_timestamp=end.isoformat(),
        partition_token=token, heartbeat_milliseconds=1000,
    ))  # fmt: skip
    assert found == expected
    ((change,),) = [r["data_change_record"]["mods"] for r in found if "data_change_record" in r]
    assert change == {"keys": {"ID": 1}, "new_values": {"V": "a"}, "old_values": {}}


def test_heartbeats_arrive_on_an_idle_table_in_order(session, client, server):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    start = created(session)
    (token,) = open_tokens(session)
    for interval in (1000, 2000):
        records = client.read_change_stream(
            "CS", start, partition_token=token, heartbeat_milliseconds=interval
        )
        beats = [next(records) for _ in range(3)]
        records.close()  # ends the read in the service too
        assert all(list(record) == ["heartbeat_record"] for record in beats), beats
        stamps = [micros(record["heartbeat_record"]["timestamp"]) for record in beats]
        assert micros(start) < stamps[0] < stamps[1] < stamps[2]
        # Each heartbeat follows the last one by about the interval (the service waits
        # that long without records before it says "nothing up to here").
        assert all(b - a >= interval * 900 for a, b in itertools.pairwise(stamps)), stamps
    wait_until(lambda: reads_of(server.app).active == 0, "the reads to end")


def test_a_split_ends_the_read_with_its_child_partitions_record(session, client):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    start = created(session)
    (token,) = open_tokens(session)
    session.sql("INSERT INTO T VALUES (1), (2), (3)")
    records = client.read_change_stream("CS", start, partition_token=token,
                                        heartbeat_milliseconds=1000)  # fmt: skip
    before = [next(records)]  # the read runs
    session.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{token}'")
    after = list(records)  # and ends by itself
    found = before + after
    kinds = [next(iter(record)) for record in found]
    assert kinds[-1] == "child_partitions_record"  # the last record
    assert set(kinds[:-1]) <= {"data_change_record", "heartbeat_record"}
    ended = found[-1]["child_partitions_record"]
    made = open_tokens(session)
    assert len(made) == 2 and token not in made
    assert {c["token"] for c in ended["child_partitions"]} == made
    assert all(c["parent_partition_tokens"] == [token] for c in ended["child_partitions"])
    assert sum(len(r["data_change_record"]["mods"]) for r in found
               if "data_change_record" in r) == 3  # fmt: skip

    # A child is read from the child partitions record's start_timestamp, not before.
    child = ended["child_partitions"][0]["token"]
    with pytest.raises(
        InvalidRequestError,
        match=r"is before partition \w+'s start .*; start at the start_timestamp",
    ):
        next(client.read_change_stream("CS", start, partition_token=child,
                                       heartbeat_milliseconds=1000))  # fmt: skip
    session.sql("INSERT INTO T VALUES (4), (5), (6), (7)")
    later = list(client.read_change_stream(
        "CS", ended["start_timestamp"], end_timestamp=rfc3339(now_us()),
        partition_token=child, heartbeat_milliseconds=1000,
    ))  # fmt: skip
    assert "heartbeat_record" in later[-1]
    assert all(micros(r["data_change_record"]["commit_timestamp"]) >= micros(ended["start_timestamp"])
               for r in later if "data_change_record" in r)  # fmt: skip


async def test_a_stream_dropped_during_a_read_ends_it_with_an_error(server, session):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    start = created(session)
    (token,) = open_tokens(session)
    async with AsyncStreamingIngestClient("dropper", server.url) as reader:
        records = reader.read_change_stream("CS", start, partition_token=token,
                                            heartbeat_milliseconds=1000)  # fmt: skip
        assert "heartbeat_record" in await anext(records)
        await asyncio.to_thread(session.sql, "DROP CHANGE STREAM CS")
        with pytest.raises(ChangeStreamNotFoundError, match="was dropped or replaced during"):
            async for record in records:
                assert "heartbeat_record" in record


# Clients that leave, a service that stops


async def test_a_client_that_leaves_ends_the_read_in_the_service(server, session, http):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    start = created(session)
    (token,) = open_tokens(session)
    params = {"start_timestamp": start, "partition_token": token, "heartbeat_milliseconds": 1000}
    async with http.get(READ.format("CS"), params=params) as response:
        assert response.status == 200 and response.content_type == NDJSON
        assert response.headers["Cache-Control"] == "no-store"
        assert orjson.loads(await response.content.readline())["heartbeat_record"]
        assert reads_of(server.app).active == 1 and len(read_threads()) == 1
    # Leaving before the end closes the connection: the service stops the read's thread.
    await asyncio.to_thread(wait_until, lambda: reads_of(server.app).active == 0,
                            "the read to end")  # fmt: skip
    await asyncio.to_thread(wait_until, lambda: not read_threads(), "the thread to end")
    async with http.get("/metrics") as response:
        assert "ingest_change_stream_reads 0.0" in await response.text()


def test_a_service_that_stops_breaks_the_read_so_the_reader_resumes(server, session, client):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    start = created(session)
    (token,) = open_tokens(session)
    records = client.read_change_stream("CS", start, partition_token=token,
                                        heartbeat_milliseconds=1000)  # fmt: skip
    assert "heartbeat_record" in next(records)
    server.stop()  # the read does not hold the shutdown (aiohttp would wait 60 s)
    wait_until(lambda: reads_of(server.app).active == 0, "the read to end")
    wait_until(lambda: not read_threads(), "the read's thread to end")
    with pytest.raises(TransportError):  # not a clean end: the reader resumes elsewhere
        for record in records:
            assert "heartbeat_record" in record


# Mistakes


async def test_every_mistake_is_a_4xx_naming_the_fix(server, session, http, client):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    session.sql("CREATE CHANGE STREAM OTHER FOR T")
    start = created(session)
    (other,) = open_tokens(session, "OTHER")
    soon = rfc3339(now_us() + 3_600_000_000)
    ok = {"start_timestamp": start, "heartbeat_milliseconds": "1000"}
    cases = [
        ("NOPE", ok, 404, "CHANGE_STREAM_NOT_FOUND", "change stream DB.PUBLIC.NOPE does not exist; SHOW CHANGE STREAMS"),
        ('"cs"', ok, 404, "CHANGE_STREAM_NOT_FOUND", 'change stream DB.PUBLIC."cs" does not exist (did you mean DB.PUBLIC.CS?)'),
        ("S.CS", ok, 404, "CHANGE_STREAM_NOT_FOUND", "change stream DB.S.CS does not exist"),
        ("A.B.C.D", ok, 400, "BAD_REQUEST", "'A.B.C.D' is not a change stream name; name it NAME, SCHEMA.NAME or DATABASE.SCHEMA.NAME"),
        ("DB. .CS", ok, 400, "BAD_REQUEST", "is not a change stream name (each part must be"),
        ("CS", {**ok, "foo": "1"}, 400, "INVALID_ARGUMENT", "unknown parameter 'foo'; the parameters are start_timestamp, end_timestamp, partition_token, heartbeat_milliseconds"),
        ("CS", {**ok, "read_options": "NULL"}, 400, "INVALID_ARGUMENT", "unknown parameter 'read_options'"),
        ("CS", [*ok.items(), ("start_timestamp", start)], 400, "INVALID_ARGUMENT", "the parameter start_timestamp is given twice"),
        ("CS", {"heartbeat_milliseconds": "1000"}, 400, "INVALID_ARGUMENT", "start_timestamp is required, e.g. start_timestamp=2026-01-31T12:00:00Z"),
        ("CS", {"start_timestamp": start}, 400, "INVALID_ARGUMENT", "heartbeat_milliseconds is required"),
        ("CS", {**ok, "heartbeat_milliseconds": "999"}, 400, "INVALID_ARGUMENT", "heartbeat_milliseconds must be a whole number from 1,000 to 300,000, got '999'"),
        ("CS", {**ok, "heartbeat_milliseconds": "300001"}, 400, "INVALID_ARGUMENT", "from 1,000 to 300,000, got '300001'"),
        ("CS", {**ok, "heartbeat_milliseconds": "1e3"}, 400, "INVALID_ARGUMENT", "got '1e3'"),
        ("CS", {**ok, "start_timestamp": "yesterday"}, 400, "INVALID_ARGUMENT", "start_timestamp 'yesterday' is not a timestamp; write it as '2026-01-31T12:00:00Z'"),
        ("CS", {**ok, "start_timestamp": soon}, 400, "INVALID_ARGUMENT", f"start_timestamp {soon} is in the future"),
        ("CS", {**ok, "start_timestamp": "2020-01-01T00:00:00Z"}, 400, "INVALID_ARGUMENT", "the stream was created; start at"),
        ("CS", {**ok, "end_timestamp": "2020-01-01T00:00:00Z"}, 400, "INVALID_ARGUMENT", f"end_timestamp 2020-01-01T00:00:00.000000Z is before start_timestamp {start}"),
        ("CS", {**ok, "end_timestamp": "soon"}, 400, "INVALID_ARGUMENT", "end_timestamp 'soon' is not a timestamp"),
        ("CS", {**ok, "start_timestamp": start[:19] + " 01:00"}, 400, "INVALID_ARGUMENT", "start_timestamp holds a space where an offset's + was: a + in a URL's query reads as a space, write it as %2B"),
        ("CS", {**ok, "partition_token": other}, 400, "INVALID_ARGUMENT", f"partition_token '{other}' is not a partition of change stream DB.PUBLIC.CS"),
        ("CS", {**ok, "partition_token": ""}, 400, "INVALID_ARGUMENT", "is not a partition of change stream DB.PUBLIC.CS"),
    ]  # fmt: skip
    for name, params, status, code, message in cases:
        found = await error_of(http, name, **dict(params)) if isinstance(params, dict) else None
        if found is None:  # a repeated parameter: a list of pairs
            async with http.get(READ.format(name), params=params) as response:
                error = (await response.json())["error"]
                found = (response.status, error["code"], error["message"])
        assert found[:2] == (status, code), (name, params, found)
        assert message in found[2], (name, params, found)
    assert reads_of(server.app).active == 0  # none was admitted

    # The SDK raises the service's message; wrong types fail before any request.
    with pytest.raises(InvalidRequestError, match="is not a partition of change stream"):
        next(client.read_change_stream("CS", start, partition_token=other))
    with pytest.raises(ChangeStreamNotFoundError, match="does not exist"):
        next(client.read_change_stream("NOPE", start))
    with pytest.raises(InvalidRequestError, match="got '999'"):
        next(client.read_change_stream("CS", start, heartbeat_milliseconds=999))
    with pytest.raises(ConfigurationError, match="heartbeat_milliseconds must be an int"):
        client.read_change_stream("CS", start, heartbeat_milliseconds="1000")
    with pytest.raises(ConfigurationError, match="must be a timestamp: RFC 3339 text"):
        client.read_change_stream("CS", b"2026-01-31")
    with pytest.raises(ConfigurationError, match="seconds since 1970"):
        client.read_change_stream("CS", 1_700_000_000_000)  # milliseconds: refused
    # A number is seconds since the epoch: 1_700_000_000 (2023-11-14T22:13:20Z) precedes
    # the stream, and the service says so.
    with pytest.raises(InvalidRequestError, match="before"):
        next(client.read_change_stream("CS", 1_700_000_000))


async def test_reads_past_the_limit_get_429(server_factory, spark, monkeypatch):
    monkeypatch.setattr(change_stream_api, "LIMITS", ReadLimits(max_reads=1))
    server = server_factory(change_stream_check_seconds=0)  # its first read takes LIMITS
    session = Session(server.config.warehouse, spark=spark)
    try:
        session.sql("CREATE TABLE T (ID NUMBER)")
        session.sql("CREATE CHANGE STREAM CS FOR T")
        start = created(session)
        (token,) = open_tokens(session)
    finally:
        session.close()
    params = {"start_timestamp": start, "partition_token": token, "heartbeat_milliseconds": 1000}
    async with aiohttp.ClientSession(base_url=server.url) as http:
        async with http.get(READ.format("CS"), params=params) as held:
            assert held.status == 200
            async with http.get(READ.format("CS"), params=params) as refused:
                assert refused.status == 429 and refused.headers["Retry-After"] == "1.000"
                error = (await refused.json())["error"]
            assert error["code"] == "BACKPRESSURE"
            assert error["message"].startswith("1 change stream reads are open on this service")
        await asyncio.to_thread(wait_until, lambda: reads_of(server.app).active == 0,
                                "the held read to end")  # fmt: skip
        async with http.get(READ.format("CS"), params=params) as again:
            assert again.status == 200  # room again


# A client that never reads


async def test_a_client_that_never_reads_holds_up_neither_other_reads_nor_the_flusher(
    server, session, client_factory
):
    session.sql("CREATE TABLE BIG (ID NUMBER, V VARCHAR)")
    session.sql("CREATE TABLE SMALL (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR BIG")
    start = created(session)
    (token,) = open_tokens(session)
    # Requests under 1 MiB: aiohttp warns about larger bodies (warnings are errors here).
    producer = client_factory(server.url, limits=ClientLimits(max_request_bytes=900_000))
    # 40 MB of records: far more than the socket buffers and the read's pipe hold.
    channel = await asyncio.to_thread(producer.open_channel,
                                      OpenChannelRequest("big", "DB", "PUBLIC", "BIG"))  # fmt: skip
    for batch in range(50):
        rows = [{"ID": batch * 80 + i, "V": f"{i:05d}" * 2000} for i in range(80)]
        await asyncio.to_thread(channel.insert_rows, rows, None, str(batch))
    assert await asyncio.to_thread(channel.wait_for_commit, "49", 120) == "49"
    end = rfc3339(now_us())
    params = {"start_timestamp": start, "end_timestamp": end, "partition_token": token,
              "heartbeat_milliseconds": 1000}  # fmt: skip

    # The stalled client: it sends its request and takes nothing (its buffers fill up).
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    query = "&".join(f"{k}={v}" for k, v in params.items())
    stalled.sendall(f"GET {READ.format('CS')}?{query} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    try:
        await asyncio.to_thread(wait_until, lambda: reads_of(server.app).active == 1,
                                "the stalled read to start")  # fmt: skip
        async with aiohttp.ClientSession(base_url=server.url) as http:
            # Another client reads the same records to the end meanwhile...
            async with http.get(READ.format("CS"), params=params) as response:
                assert response.status == 200
                lines = (await response.read()).splitlines()
            records = [orjson.loads(line) for line in lines]
            assert records[-1] == {"heartbeat_record": {"timestamp": end}}
            assert sum(len(r["data_change_record"]["mods"]) for r in records[:-1]) == 4000
            # ...the service answers...
            async with http.get("/health") as health:
                assert health.status == 200
        # ...and the flusher commits another table's rows.
        small = await asyncio.to_thread(producer.open_channel,
                                        OpenChannelRequest("small", "DB", "PUBLIC", "SMALL"))  # fmt: skip
        await asyncio.to_thread(small.insert_rows, [{"ID": 1}], None, "1")
        assert await asyncio.to_thread(small.wait_for_commit, "1", 120) == "1"
        # The stalled read is still there: it cannot have sent its 40 MB.
        assert reads_of(server.app).active == 1
    finally:
        stalled.close()
    await asyncio.to_thread(wait_until, lambda: reads_of(server.app).active == 0,
                            "the stalled read to end once its client left")  # fmt: skip


async def test_a_read_needs_the_token_when_the_service_has_tokens(server_factory):
    server = server_factory(auth_tokens=frozenset({"secret"}), change_stream_check_seconds=0)
    params = {"start_timestamp": "2026-01-31T12:00:00Z", "heartbeat_milliseconds": "1000"}
    async with aiohttp.ClientSession(base_url=server.url) as http:
        assert (await error_of(http, "CS", **params))[:2] == (401, "UNAUTHENTICATED")
    async with aiohttp.ClientSession(
        base_url=server.url, headers={"Authorization": "Bearer secret"}
    ) as http:  # past the door: no such stream
        assert (await error_of(http, "CS", **params))[:2] == (404, "CHANGE_STREAM_NOT_FOUND")
