"""Backpressure: the buffer bound holds, room goes to waiting producers in turn, a refused
body is never read, and the SDK's retries are jittered."""

import time

import aiohttp
import pytest

from channel_server.state import BufferBudget
from ingest_sdk import BackpressureError
from ingest_sdk.transport import RetryPolicy, _Wait


def refused(budget, size, who):
    try:
        budget.reserve(size, retry_after=0.5, who=who)
    except BackpressureError:
        return True
    return False


def test_room_goes_to_waiting_producers_first_come_first_served():
    budget = BufferBudget(100)
    budget.reserve(90, 0.5, "a")
    assert refused(budget, 30, "b") and refused(budget, 30, "c")
    assert budget.waiting == 2
    budget.release(90)  # a flush frees everything
    assert not refused(budget, 30, "c")  # room for b (ahead of c) and c: c may go
    assert refused(budget, 80, "d")  # a newcomer must leave room for b, still waiting
    assert not refused(budget, 30, "b")
    assert budget.waiting == 1  # d waits its turn
    assert refused(budget, 80, "d")
    budget.release(60)
    assert not refused(budget, 80, "d")
    assert budget.waiting == 0 and budget.used == 80


def test_a_newcomer_cannot_jump_the_queue():
    budget = BufferBudget(100)
    budget.reserve(80, 0.5, "a")
    assert refused(budget, 50, "waiter")
    budget.release(60)  # used 20: 50 would fit for the newcomer alone
    assert refused(budget, 50, "newcomer")  # but the waiter's 50 comes first: 20+50+50 > 100
    assert not refused(budget, 50, "waiter")
    budget.release(70)
    assert not refused(budget, 50, "newcomer")


def test_a_waiter_that_stops_asking_leaves_the_queue(monkeypatch):
    import channel_server.state as state

    now = [1000.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: now[0])
    budget = BufferBudget(100, patience=5.0)
    budget.reserve(100, 0.5, "a")
    assert refused(budget, 50, "gone")
    budget.release(100)
    assert refused(budget, 60, "newcomer")  # "gone" is still ahead: 50 + 60 > 100
    now[0] += 6  # "gone" has not asked again for longer than the patience
    assert not refused(budget, 60, "newcomer")


def test_a_request_larger_than_the_limit_gets_in_when_the_buffer_is_empty():
    budget = BufferBudget(100)
    assert not refused(budget, 500, "big")
    assert refused(budget, 1, "small")
    budget.release(500)
    assert not refused(budget, 1, "small")


def test_no_producer_starves_when_some_always_ask_first():
    """The starvation the attack found: after each flush the same quick producers ask
    first and take all the room. With turns, every producer gets an equal share."""
    budget = BufferBudget(300, patience=1e9)
    admitted = dict.fromkeys(range(16), 0)
    for _ in range(160):  # rounds: everyone asks in the same order, then a flush
        for who in range(16):
            if not refused(budget, 100, who):
                admitted[who] += 1
        budget.release(budget.used)
    counts = list(admitted.values())
    assert sum(counts) == 160 * 3  # the buffer was used in full every round
    assert min(counts) >= 0.75 * max(counts), counts  # without turns: 160 for three, 0 for 13


def test_retry_after_is_jittered():
    wait = _Wait(RetryPolicy())

    class State:
        class outcome:
            @staticmethod
            def exception():
                return BackpressureError("full", retry_after=1.0)

    waits = {round(wait(State), 6) for _ in range(50)}
    assert len(waits) > 40  # not the same instant for everyone
    assert all(0.5 <= w <= 1.5 for w in waits)


@pytest.mark.parametrize("kind", ["arrow", "json"])
async def test_a_refused_body_is_never_read(server_factory, client_factory, kind):
    """With the buffer full, an insert whose body is garbage gets 429, not 400: the
    server decided before reading, decoding or checking the body."""
    from channel_server import Limits
    from ingest_sdk.wire import ARROW_CONTENT_TYPE

    server = server_factory(limits=Limits(max_buffer_bytes=1000))
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    async with aiohttp.ClientSession(base_url=server.url) as http:
        async with http.post("/v1/channels/open", json={"table": "db.s.t", "channel": "c"}) as r:
            assert r.status == 200
        server.call(server.service.channels.budget.reserve, 1000, 0.5, "someone else")
        content_type = ARROW_CONTENT_TYPE if kind == "arrow" else "application/json"
        async with http.post("/v1/channels/rows?table=db.s.t&channel=c&generation=1&batch_seq=1",
                             data=b"\x00garbage" * 1000,
                             headers={"Content-Type": content_type}) as response:  # fmt: skip
            body = await response.json()
            assert response.status == 429, body
            assert float(response.headers["Retry-After"]) > 0
        server.call(server.service.channels.budget.release, 1000)
        # The same producer is now first in line; its garbage is read and refused.
        async with http.post("/v1/channels/rows?table=db.s.t&channel=c&generation=1&batch_seq=1",
                             data=b"\x00garbage" * 10,
                             headers={"Content-Type": content_type}) as response:  # fmt: skip
            assert response.status == 400
    assert server.service.channels.budget.used == 0  # what the refused request held was given back


def test_a_full_buffer_flushes_before_the_deadlines_and_clients_build_smaller_requests(
    server_factory, client_factory
):
    """When a producer is refused, buffered batches are flushed at once instead of at
    their max_client_lag (60 s here): room comes back as fast as commits can make it.
    The server also tells clients to build requests of at most an eighth of its buffer."""
    from channel_server import Limits
    from ingest_sdk import OpenChannelRequest

    server = server_factory(limits=Limits(max_buffer_bytes=400_000))
    first = client_factory(server.url, max_client_lag=60.0)
    info = first.create_table("db.s.t", {"ID": "INT", "S": "VARCHAR"})
    slow = first.open_channel(OpenChannelRequest("slow", "DB", "S", "T"))
    assert slow._channel.max_request_bytes == max(64 * 1024, 400_000 // 8)
    slow.insert_rows([{"ID": n, "S": "x" * 300} for n in range(1000)], end_offset_token="a")
    deadline = time.monotonic() + 30
    while server.service.channels.budget.used < 300_000:  # the slow producer's rows are buffered
        assert time.monotonic() < deadline
        time.sleep(0.05)
    other = client_factory(server.url, max_client_lag=60.0)
    pushy = other.open_channel(OpenChannelRequest("pushy", "DB", "S", "T"))
    pushy.insert_rows([{"ID": -n, "S": "y" * 300} for n in range(1000)], end_offset_token="b")
    # Far sooner than the 60 s lag: the refusal of "pushy" flushed the table.
    assert slow.wait_for_commit(timeout=20) == "a"
    pushy.close()  # its own batch waits for its lag, or a close, as usual
    assert len(ids_of(info["location"])) == 2000


def ids_of(location):
    from deltalake import DeltaTable

    return DeltaTable(location).to_pyarrow_dataset().to_table(columns=["ID"]).column(0).to_pylist()
