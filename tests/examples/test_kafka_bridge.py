"""The Kafka bridge against a real Kafka-protocol broker, a real server and real Delta tables."""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from deltalake import DeltaTable

from flush import ROW_ID_COLUMN
from ingest_sdk import StreamingIngestClient

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4  # the mock cluster creates topics with 4 partitions
COLUMNS = {"ID": "INT NOT NULL", "V": "VARCHAR(20)", "KAFKA_PARTITION": "NUMBER(9,0)",
           "KAFKA_OFFSET": "NUMBER(18,0)"}  # fmt: skip


@pytest.fixture(scope="module")
def kafka():
    process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "kafka_mock.py")],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)  # fmt: skip
    line = process.stdout.readline()
    try:
        yield orjson.loads(line)["bootstrap_servers"]
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()


class Bridge:
    """``python -m examples.kafka_bridge`` as a child process."""

    def __init__(self, kafka, server_url, topic, table, group, *extra):
        self.args = [sys.executable, "-m", "examples.kafka_bridge", "--bootstrap-servers", kafka,
                     "--topic", topic, "--table", table, "--server-url", server_url,
                     "--group-id", group, "--max-client-lag", "0.1", "--commit-interval", "1",
                     "--metadata-column", "partition=KAFKA_PARTITION",
                     "--metadata-column", "offset=KAFKA_OFFSET", *extra]  # fmt: skip
        self.process = None

    def start(self):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(self.args, env=env, cwd=ROOT,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        return self

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def produce(kafka, topic, records, rate=None):
    """Send ``records`` (bytes or dicts) round-robin over the partitions, optionally paced."""
    producer = Producer({"bootstrap.servers": kafka})
    for n, record in enumerate(records):
        value = record if isinstance(record, bytes) else orjson.dumps(record)
        producer.produce(topic, value=value, partition=n % PARTITIONS)
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


def wait_rows(location, count, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(table_rows(location)) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"only {len(table_rows(location))} of {count} rows arrived")


def assert_exactly_once_in_order(location, total):
    rows = table_rows(location)
    ids = [int(r["ID"]) for r in rows]
    assert len(ids) == len(set(ids)) == total and set(ids) == set(range(total))
    per_partition = defaultdict(list)
    for row in rows:
        per_partition[int(row["KAFKA_PARTITION"])].append(int(row["KAFKA_OFFSET"]))
    for offsets in per_partition.values():
        assert offsets == list(range(len(offsets)))  # in order, none skipped or repeated


def setup(server, client_factory, name):
    client = client_factory(server.url)
    info = client.create_table(f"db.kafka.{name}", COLUMNS)
    return client, info["location"]


def test_records_arrive_exactly_once_in_order_with_tokens(kafka, server, client_factory):
    client, location = setup(server, client_factory, "t1")
    produce(kafka, "t1", [{"ID": n, "V": f"v{n}"} for n in range(400)])
    bridge = Bridge(kafka, server.url, "t1", "db.kafka.t1", "g1").start()
    try:
        wait_rows(location, 400)
    finally:
        bridge.stop()
    assert_exactly_once_in_order(location, 400)
    statuses = client.get_latest_committed_offset_tokens(
        [("db.kafka.t1", f"t1:P{p}") for p in range(PARTITIONS)]
    )
    assert [s.offset_token for s in statuses] == ["99"] * PARTITIONS  # the Kafka offsets
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": "g1"})
    from confluent_kafka import TopicPartition

    committed = consumer.committed([TopicPartition("t1", p) for p in range(PARTITIONS)], 10)
    consumer.close()
    assert [tp.offset for tp in committed] == [100] * PARTITIONS  # group offsets follow tokens


def test_sigkill_at_random_points_and_restart(kafka, server, client_factory):
    _, location = setup(server, client_factory, "t2")
    total = 2000
    sender = produce_in_background(kafka, "t2", total, rate=800)
    rng = random.Random(7)
    for _ in range(3):
        bridge = Bridge(kafka, server.url, "t2", "db.kafka.t2", "g2").start()
        time.sleep(rng.uniform(1.0, 2.5))
        bridge.kill()
    sender.join()
    bridge = Bridge(kafka, server.url, "t2", "db.kafka.t2", "g2").start()
    try:
        wait_rows(location, total)
        time.sleep(1.5)  # anything doubled would show up by now
    finally:
        bridge.stop()
    assert_exactly_once_in_order(location, total)


def test_rebalance_between_two_instances(kafka, server, client_factory):
    _, location = setup(server, client_factory, "t3")
    total = 1500
    sender = produce_in_background(kafka, "t3", total, rate=600)
    first = Bridge(kafka, server.url, "t3", "db.kafka.t3", "g3").start()
    time.sleep(1.5)
    second = Bridge(kafka, server.url, "t3", "db.kafka.t3", "g3").start()  # partitions move
    time.sleep(2.0)
    first.stop()  # and move back to the second
    sender.join()
    try:
        wait_rows(location, total)
        time.sleep(1.5)
    finally:
        second.stop()
    assert_exactly_once_in_order(location, total)


def test_bad_records_go_to_the_dead_letter_topic(kafka, server, client_factory):
    client, location = setup(server, client_factory, "t4")
    records = []
    for n in range(80):
        if n % 10 == 3:
            records.append(b"not json")
        elif n % 10 == 7:
            records.append({"ID": "abc", "V": "bad id"})
        else:
            records.append({"ID": n, "V": "ok"})
    produce(kafka, "t4", records)
    bridge = Bridge(kafka, server.url, "t4", "db.kafka.t4", "g4", "--dlq-topic", "t4-dlq").start()
    try:
        wait_rows(location, 64)
        time.sleep(1.0)
    finally:
        bridge.stop()
    assert sorted(int(r["ID"]) for r in table_rows(location)) == [
        n for n in range(80) if n % 10 not in (3, 7)
    ]
    statuses = client.get_latest_committed_offset_tokens(
        [("db.kafka.t4", f"t4:P{p}") for p in range(PARTITIONS)]
    )
    assert [s.offset_token for s in statuses] == ["19"] * PARTITIONS  # bad records consumed too
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": "dlq-reader",
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe(["t4-dlq"])
    dead, deadline = [], time.monotonic() + 30
    while len(dead) < 16 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and not message.error():
            dead.append(dict(message.headers()))
    consumer.close()
    assert len(dead) == 16
    assert all("ingest.error" in h and "ingest.source" in h for h in dead)
    errors = [h["ingest.error"] for h in dead]
    assert sum(b"not valid JSON" in e for e in errors) == 8
    assert sum(b'column "ID"' in e and b"not a number" in e for e in errors) == 8


def test_server_restart_mid_stream(kafka, process_server_factory):
    server = process_server_factory().start()
    with StreamingIngestClient("admin", url=server.url) as admin:
        location = admin.create_table("db.kafka.t5", COLUMNS)["location"]
    total = 1500
    sender = produce_in_background(kafka, "t5", total, rate=600)
    bridge = Bridge(kafka, server.url, "t5", "db.kafka.t5", "g5").start()
    time.sleep(1.5)
    server.kill()  # rows buffered in the server are lost with it
    time.sleep(0.5)
    server.start()
    sender.join()
    try:
        wait_rows(location, total)
        time.sleep(1.5)
    finally:
        bridge.stop()
    assert_exactly_once_in_order(location, total)
