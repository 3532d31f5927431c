"""The service's side of the compaction worker protocol, against small real processes.

The worker's own side (``python -m flush.compact --serve``) is tested in
tests/flush/test_compaction.py and end to end in test_compaction_service.py; these
tests cover what the service does when a worker misbehaves, without starting Spark.
"""

import asyncio
import sys

import pytest

from channel_server.compaction_worker import CompactionWorker, CompactionWorkerDied

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
    return CompactionWorker([sys.executable, "-c", ECHO], tmp_path / "worker.log", 60)


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
    with pytest.raises(CompactionWorkerDied, match=reported):
        await worker.compact(request_name)
    assert worker.pid is None
    assert await worker.compact("DB.S.T") == {"table": "DB.S.T", "status": "SUCCEEDED"}
    assert worker.starts == 2
    await worker.stop()


async def test_the_worker_stops_after_its_idle_time(tmp_path):
    worker = CompactionWorker([sys.executable, "-c", ECHO], tmp_path / "worker.log", 0.2)
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


async def test_a_cancelled_request_kills_the_worker(tmp_path):
    hang = "import sys\nfor line in sys.stdin:\n    import time; time.sleep(60)\n"
    worker = CompactionWorker([sys.executable, "-c", hang], tmp_path / "worker.log", 60)
    request = asyncio.create_task(worker.compact("DB.S.T"))
    for _ in range(100):
        if worker.pid is not None:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    assert worker.pid is None  # killed and reaped, not left running
