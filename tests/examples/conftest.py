"""Fixtures of the Kafka bridge tests: a Kafka-protocol broker and bridge processes."""

import itertools
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.examples.bridge_process import ROOT, Bridge


@pytest.fixture(scope="module")
def kafka():
    """librdkafka's mock cluster (3 brokers) in a child process; yields its bootstrap servers."""
    process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "kafka_mock.py")],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)  # fmt: skip
    line = process.stdout.readline()
    try:
        yield orjson.loads(line)["bootstrap_servers"]
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()


@pytest.fixture
def bridge_factory(tmp_path):
    """``bridge_factory(kafka, server_url, topic, table, group, *extra)``: a (not yet started)
    bridge with the tests' usual flags; ``bridge_factory.raw(args)`` takes a whole command
    line. Bridges still running at the end of the test are killed."""
    made = []
    numbers = itertools.count()

    def log_path():
        return tmp_path / f"bridge-{next(numbers)}.log"

    def make(kafka, server_url, topic, table, group, *extra):
        bridge = Bridge.for_topic(kafka, server_url, topic, table, group, *extra,
                                  log_path=log_path())  # fmt: skip
        made.append(bridge)
        return bridge

    def raw(args):
        bridge = Bridge(args, log_path())
        made.append(bridge)
        return bridge

    make.raw = raw
    yield make
    for bridge in made:
        bridge.kill()
