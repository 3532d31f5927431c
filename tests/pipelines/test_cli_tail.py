"""``python -m pipelines tail``, run as an operator runs it: a child process on a real
warehouse (the in-process read, no Spark in the child) or against a live service
(``--url``), stopped with SIGTERM or Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import orjson
import pytest

from flush.commit_clock import clock
from ingest_sdk.change_stream_reader import rfc3339, to_micros
from pipelines.__main__ import parse_args
from tests.servers import ROOT


class Tail:
    """``python -m pipelines tail *args`` in the background; its output lines as they come."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
        env["PYTHONPATH"] = str(ROOT)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines", "tail", *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        )  # fmt: skip
        self.lines: list[str] = []
        self._stderr: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def records(self) -> list[dict]:
        return [orjson.loads(line) for line in list(self.lines)]

    def changes(self) -> list[tuple[str, int]]:
        """(mod_type, key) of every mod printed, in order."""
        return [
            (r["data_change_record"]["mod_type"], mod["keys"]["ID"])
            for r in self.records()
            if "data_change_record" in r
            for mod in r["data_change_record"]["mods"]
        ]

    def wait_for(self, condition, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(f"tail exited with {self.process.returncode}: {self.stderr()}")
            assert time.monotonic() < deadline, f"tail printed {self.lines[-5:]}"
            time.sleep(0.05)

    def finish(self, timeout: float = 60.0) -> int:
        code = self.process.wait(timeout)
        self._reader.join(10)
        return code

    def stderr(self) -> str:
        """What it wrote on stderr, once it has exited."""
        if self._stderr is None and self.process.poll() is not None:
            assert self.process.stderr is not None
            self._stderr = self.process.stderr.read()
        return self._stderr or ""

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
        self._reader.join(10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def tails():
    made: list[Tail] = []

    def start(*args: str) -> Tail:
        made.append(Tail(*args))
        return made[-1]

    yield start
    for tail in made:
        tail.close()


@pytest.fixture
def watched(session):
    """T (ID primary key, V) watched by CS in two partitions; the moment before writes."""
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V NUMBER)")
    session.sql("CREATE CHANGE STREAM CS FOR T OPTIONS (partitions = '2')")
    return session, rfc3339(clock())


def write(session) -> list[tuple[str, int]]:
    """Changes in three transactions; the (mod_type, key) they make, in order per key."""
    session.sql("INSERT INTO T VALUES (1, 10), (2, 20), (3, 30)")
    session.sql("UPDATE T SET V = 11 WHERE ID = 1")
    session.sql("DELETE FROM T WHERE ID = 2")
    return [("INSERT", 1), ("INSERT", 2), ("INSERT", 3), ("UPDATE", 1), ("DELETE", 2)]


def per_key(changes: list[tuple[str, int]]) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for kind, key in changes:
        found.setdefault(key, []).append(kind)
    return found


def test_tail_prints_changes_as_they_are_written_and_exits_0_on_sigterm(watched, tmp_path, tails):
    session, start = watched
    tail = tails("CS", "--warehouse", str(tmp_path / "warehouse"), "--start-timestamp", start)
    expected = write(session)
    tail.wait_for(lambda: len(tail.changes()) >= len(expected))
    time.sleep(1.5)  # more would come now (a duplicate): none may
    tail.process.send_signal(signal.SIGTERM)
    assert tail.finish() == 0, tail.stderr()
    assert tail.stderr() == ""
    assert sorted(tail.changes()) == sorted(expected)
    assert per_key(tail.changes()) == per_key(expected)
    records = tail.records()
    assert all(set(r) == {"data_change_record", "partition_token"} for r in records)
    assert all(r["data_change_record"]["table_name"] == "T" for r in records)


def test_tail_from_now_with_heartbeats_and_an_end_exits_by_itself(watched, tmp_path, tails):
    """Without --start-timestamp it starts now (changes before are not printed); with
    --heartbeats it prints the partitions' heartbeats; with --end-timestamp it ends there."""
    session, _ = watched
    session.sql("INSERT INTO T VALUES (100, 0)")  # before the tail starts: not printed
    tail = tails("CS", "--warehouse", str(tmp_path / "warehouse"), "--heartbeats",
                 "--heartbeat-ms", "1000")  # fmt: skip
    tail.wait_for(lambda: len(tail.records()) >= 2)  # one heartbeat per partition: running
    expected = write(session)
    tail.wait_for(lambda: len(tail.changes()) >= len(expected))
    end = rfc3339(clock())
    tail.process.send_signal(signal.SIGINT)  # Ctrl-C
    assert tail.finish() == 0, tail.stderr()
    assert per_key(tail.changes()) == per_key(expected)
    beats = [r for r in tail.records() if "heartbeat_record" in r]
    assert len({r["partition_token"] for r in beats}) == 2

    # A bounded tail from the start of these writes: the same changes, then it ends at end.
    first = min(to_micros(r["heartbeat_record"]["timestamp"]) for r in beats)
    bounded = tails("CS", "--warehouse", str(tmp_path / "warehouse"), "--heartbeats",
                    "--start-timestamp", rfc3339(first), "--end-timestamp", end)  # fmt: skip
    assert bounded.finish(120) == 0, bounded.stderr()
    assert per_key(bounded.changes()) == per_key(expected)
    moments = [
        to_micros(r["heartbeat_record"]["timestamp"] if "heartbeat_record" in r
                  else r["data_change_record"]["commit_timestamp"])
        for r in bounded.records()
    ]  # fmt: skip
    assert max(moments) == to_micros(end)


def test_tail_of_a_stream_that_does_not_exist_exits_1(watched, tmp_path):
    warehouse = str(tmp_path / "warehouse")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("INGEST_")},
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pipelines", "tail", "NOPE", "--warehouse", warehouse],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("error OBJECT_NOT_FOUND: change stream DB.PUBLIC.NOPE does "
                                  "not exist (warehouse ")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "pipelines", "tail", '"cs"', "--warehouse", warehouse],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith('error OBJECT_NOT_FOUND: change stream DB.PUBLIC."cs" does not '
                                  "exist (did you mean DB.PUBLIC.CS?) (warehouse ")  # fmt: skip
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pipelines", "tail", "CS", "--warehouse", str(empty)],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "holds no warehouse" in done.stderr
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["tail", "CS", "--create"],
        ["tail", "CS", "--heartbeat-ms", "999"],
        ["tail", "CS", "--format", "csv"],
        ["tail"],
    ],
)
def test_tail_option_mistakes_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as caught:
        parse_args(argv)
    assert caught.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_tail_over_url_prints_changes_and_stops_on_sigterm(watched, server_factory, tails):
    session, start = watched
    server = server_factory()
    tail = tails("CS", "--url", server.url, "--start-timestamp", start)
    expected = write(session)
    tail.wait_for(lambda: len(tail.changes()) >= len(expected))
    tail.process.send_signal(signal.SIGTERM)
    assert tail.finish() == 0, tail.stderr()
    assert per_key(tail.changes()) == per_key(expected)
    missing = tails("NOPE", "--url", server.url)
    assert missing.finish() == 1
    message = missing.stderr()
    assert message.startswith("error ") and "change stream DB.PUBLIC.NOPE does not exist" in message
    assert message.rstrip().endswith(f"(the service at {server.url})")


def test_tail_runs_without_spark(watched, tmp_path):
    """The embedded tail reads the catalog and the Delta logs in its own process: no
    pyspark module is ever imported (so no JVM starts)."""
    session, start = watched
    expected = write(session)
    end = rfc3339(clock())
    script = (
        "import sys\n"
        "from ingest_sdk.process_exit import exit_process\n"
        "from pipelines.__main__ import main\n"
        "code = main(sys.argv[1:])\n"
        "print('spark imported:', any(m.startswith('pyspark') for m in sys.modules), "
        "file=sys.stderr)\n"
        "exit_process(code)\n"
    )
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("INGEST_")},
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, "tail", "CS", "--warehouse", str(tmp_path / "warehouse"),
         "--start-timestamp", start, "--end-timestamp", end],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "spark imported: False"
    printed = [orjson.loads(line) for line in done.stdout.splitlines()]
    changes = [(r["data_change_record"]["mod_type"], m["keys"]["ID"])
               for r in printed for m in r["data_change_record"]["mods"]]  # fmt: skip
    assert per_key(changes) == per_key(expected)
