"""Helpers for the Kafka bridge tests: the bridge as a child process, producers, table reads."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson
from confluent_kafka import Producer
from deltalake import DeltaTable

from flush import ROW_ID_COLUMN

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4  # the mock cluster creates topics with 4 partitions
COLUMNS = {"ID": "INT NOT NULL", "V": "VARCHAR(20)", "KAFKA_PARTITION": "NUMBER(9,0)",
           "KAFKA_OFFSET": "NUMBER(18,0)"}  # fmt: skip
METADATA_FLAGS = ("--metadata-column", "partition=KAFKA_PARTITION",
                  "--metadata-column", "offset=KAFKA_OFFSET")  # fmt: skip


class Bridge:
    """``python -m examples.kafka_bridge`` as a child process; its stderr goes to ``log_path``."""

    def __init__(self, args, log_path):
        self.args = [sys.executable, "-m", "examples.kafka_bridge", *args]
        self.log_path = Path(log_path)
        self.process = None

    @classmethod
    def for_topic(cls, kafka, server_url, topic, table, group, *extra, log_path):
        """The tests' usual command line: fast commits, partition and offset columns."""
        args = ["--bootstrap-servers", kafka, "--topic", topic, "--table", table,
                "--server-url", server_url, "--group-id", group, "--max-client-lag", "0.1",
                "--commit-interval", "1", *METADATA_FLAGS, *extra]  # fmt: skip
        return cls(args, log_path)

    def start(self):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the handle
            self.process = subprocess.Popen(self.args, env=env, cwd=ROOT,
                                            stdout=subprocess.DEVNULL, stderr=log)  # fmt: skip
        return self

    def log(self):
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_log(self, pattern, timeout):
        """Wait until a log line matches ``pattern``; returns the seconds it took."""
        started = time.monotonic()
        while not re.search(pattern, self.log()):
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"no log line matched {pattern!r} within {timeout} s; log:\n{self.log()[-3000:]}"
                )
            if self.process.poll() is not None:
                raise AssertionError(f"the bridge exited; log:\n{self.log()[-3000:]}")
            time.sleep(0.2)
        return time.monotonic() - started

    def wait_exit(self, timeout):
        """The exit status once the bridge ends by itself; fails the test after ``timeout``."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the bridge still runs after {timeout} s; log:\n{self.log()[-3000:]}"
            ) from None

    def kill(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def produce(kafka, topic, records, rate=None, first_partition=0):
    """Send ``records`` (bytes or dicts) round-robin over the partitions, optionally paced."""
    producer = Producer({"bootstrap.servers": kafka})
    for n, record in enumerate(records):
        value = record if isinstance(record, bytes) else orjson.dumps(record)
        producer.produce(topic, value=value, partition=(first_partition + n) % PARTITIONS)
        if rate:
            producer.poll(0)
            time.sleep(1 / rate)
    assert producer.flush(30) == 0


def produce_in_background(kafka, topic, total, rate):
    """Records {"ID": 0..total-1} sent at ``rate`` per second by a started thread."""
    records = [{"ID": n, "V": "x"} for n in range(total)]
    sender = threading.Thread(target=produce, args=(kafka, topic, records, rate))
    sender.start()
    return sender


def table_rows(location):
    return DeltaTable(location).to_pyarrow_table().sort_by(ROW_ID_COLUMN).to_pylist()


def wait_rows(location, count, timeout=120, bridge=None):
    """Wait for ``count`` rows; fails at once if ``bridge`` (a Bridge) exited meanwhile."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(table_rows(location)) >= count:
            return
        if bridge is not None and bridge.process.poll() is not None:
            raise AssertionError(f"the bridge exited; log:\n{bridge.log()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"only {len(table_rows(location))} of {count} rows arrived in {timeout} s")


def assert_exactly_once_in_order(location, total):
    rows = table_rows(location)
    ids = [int(r["ID"]) for r in rows]
    assert len(ids) == len(set(ids)) == total and set(ids) == set(range(total))
    per_partition = defaultdict(list)
    for row in rows:
        per_partition[int(row["KAFKA_PARTITION"])].append(int(row["KAFKA_OFFSET"]))
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))  # in order, none skipped or repeated
