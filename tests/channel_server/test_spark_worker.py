"""The service's side of the Spark worker protocol, against small real processes.

The worker's own side (``python -m flush.compact --serve``) is tested in
tests/flush/test_compaction.py and end to end in test_compaction_service.py; these
tests cover what the service does when a worker misbehaves, without starting Spark.
"""

import asyncio
import sys

import pytest

from channel_server.spark_worker import SparkWorker, SparkWorkerDied

ECHO = """
import json, sys
for line in sys.stdin:
    table = json.loads(line)["table"]
    if table == "GARBAGE":
        print("this is not JSON", flush=True)
    elif table == "DIE":
        print("dying on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    else:
        print(json.dumps({"table": table, "status": "SUCCEEDED"}), flush=True)
"""


@pytest.fixture
def worker(tmp_path):
    return SparkWorker([sys.executable, "-c", ECHO], tmp_path / "worker.log", 60)


async def test_answers_come_back_in_turn_from_one_process(worker):
    answers = await asyncio.gather(*(worker.compact(f"DB.S.T{n}") for n in range(5)))
    assert [a["table"] for a in answers] == [f"DB.S.T{n}" for n in range(5)]
    assert worker.starts == 1 and worker.pid is not None
    await worker.stop()
    assert worker.pid is None


@pytest.mark.parametrize(
    ("request_name", "reported"),
    [("DIE", "dying on purpose"), ("GARBAGE", "this is not JSON")],
    ids=["died-log-tail", "unreadable-answer"],
)
async def test_a_failed_worker_is_reported_and_replaced(worker, request_name, reported):
    with pytest.raises(SparkWorkerDied, match=reported):
        await worker.compact(request_name)
    assert worker.pid is None
    assert await worker.compact("DB.S.T") == {"table": "DB.S.T", "status": "SUCCEEDED"}
    assert worker.starts == 2
    await worker.stop()


async def test_the_worker_stops_after_its_idle_time(tmp_path):
    worker = SparkWorker([sys.executable, "-c", ECHO], tmp_path / "worker.log", 0.2)
    await worker.compact("DB.S.T")
    assert worker.pid is not None
    for _ in range(100):
        if worker.pid is None:
            break
        await asyncio.sleep(0.05)
    assert worker.pid is None
    await worker.compact("DB.S.T")
    assert worker.starts == 2
    await worker.stop()


# A worker that answers frames: "size:N" answers N payload bytes (0, 1, 2, ... mod 256),
# "slow:S:N" first sleeps S seconds; each header carries the request's own tag.
FRAMES = """
import json, sys, time
out = sys.stdout.buffer
for line in sys.stdin:
    request = json.loads(line)
    tag = request["tag"]
    if tag.startswith("slow:"):
        _, seconds, tag = tag.split(":", 2)
        time.sleep(float(seconds))
    size = int(tag.split(":")[1]) if tag.startswith("size:") else 0
    out.write(json.dumps({"tag": tag, "bytes": size}).encode() + b"\\n")
    out.write(bytes(i % 256 for i in range(size)))
    out.flush()
"""


@pytest.fixture
def framed(tmp_path):
    deaths = []
    worker = SparkWorker([sys.executable, "-c", FRAMES], tmp_path / "worker.log", 60,
                              on_death=lambda: deaths.append(1))  # fmt: skip
    worker.deaths = deaths
    return worker


async def test_answers_of_any_size_come_back_whole_and_in_step(framed):
    """Answers far past the old 64 KiB line limit, interleaved with small ones, each to
    its own caller (the 1 MB answer once left its tail for the next request to read)."""
    sizes = [0, 10, 70_000, 1, 3_000_000, 5, 65_536, 0]
    answers = await asyncio.gather(*(framed.exchange({"tag": f"size:{n}"}) for n in sizes))
    for n, (header, payload) in zip(sizes, answers, strict=True):
        assert header["tag"] == f"size:{n}" and header["bytes"] == n
        assert payload == bytes(i % 256 for i in range(n))
    assert framed.starts == 1 and framed.deaths == []
    await framed.stop()


async def test_a_caller_that_stops_waiting_leaves_the_worker_in_step(framed):
    """A client that hangs up after its request was sent: the answer is still read in full,
    so the next request gets its own answer, and the worker is not killed."""
    first = asyncio.create_task(framed.exchange({"tag": "slow:0.5:size:200000"}))
    await asyncio.sleep(0.2)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    header, payload = await framed.exchange({"tag": "size:7"})
    assert header["tag"] == "size:7" and payload == bytes(range(7))
    assert framed.starts == 1 and framed.deaths == []
    await framed.stop()


async def test_a_queued_request_withdrawn_before_its_turn_is_never_sent(framed):
    slow = asyncio.create_task(framed.exchange({"tag": "slow:0.5:first"}))
    await asyncio.sleep(0.1)
    queued = asyncio.create_task(framed.exchange({"tag": "never"}))
    await asyncio.sleep(0.05)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert (await slow)[0]["tag"] == "first"
    assert (await framed.exchange({"tag": "next"}))[0]["tag"] == "next"  # not "never"
    await framed.stop()


async def test_a_worker_that_does_not_answer_in_time_is_killed_and_replaced(framed):
    with pytest.raises(SparkWorkerDied, match="did not answer within"):
        await framed.exchange({"tag": "slow:30:x"}, answer_within=0.5)
    assert framed.pid is None and framed.deaths == [1]
    assert (await framed.exchange({"tag": "after"}))[0]["tag"] == "after"
    assert framed.starts == 2
    await framed.stop()


@pytest.mark.parametrize(
    "answer",
    ['{"bytes": -1}', '{"bytes": "x"}', "[1, 2]", '{"bytes": 100}'],
    ids=["negative", "not-a-number", "not-an-object", "payload-cut-short"],
)
async def test_a_malformed_frame_is_reported_and_the_worker_replaced(tmp_path, answer):
    script = f"import sys\nfor line in sys.stdin:\n    print({answer!r}, flush=True)\n    sys.exit(0)\n"
    worker = SparkWorker([sys.executable, "-c", script], tmp_path / "worker.log", 60)
    with pytest.raises(SparkWorkerDied):
        await worker.exchange({"tag": "x"})
    assert worker.pid is None
