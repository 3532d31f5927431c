"""The Kafka bridge against a real Kafka-protocol broker, a real server and real Delta tables."""

import random
import re
import time

from confluent_kafka import Consumer, TopicPartition

from ingest_sdk import StreamingIngestClient
from tests.examples.bridge_process import (
    COLUMNS,
    PARTITIONS,
    assert_exactly_once_in_order,
    produce,
    produce_in_background,
    table_rows,
    wait_rows,
)

#: A bridge restarted after SIGKILL must have its partitions back and deliver within this
#: many seconds. librdkafka's default session timeout (45 s) made it wait ~45-106 s.
RESUME_BOUND = 30


def setup(server, client_factory, name):
    client = client_factory(server.url)
    info = client.create_table(f"db.kafka.{name}", COLUMNS)
    return client, info["location"]


def test_records_arrive_exactly_once_in_order_with_tokens(kafka, server, client_factory,
                                                          bridge_factory):  # fmt: skip
    client, location = setup(server, client_factory, "t1")
    produce(kafka, "t1", [{"ID": n, "V": f"v{n}"} for n in range(400)])
    bridge = bridge_factory(kafka, server.url, "t1", "db.kafka.t1", "g1").start()
    try:
        wait_rows(location, 400, bridge=bridge)
    finally:
        bridge.stop()
    assert_exactly_once_in_order(location, 400)
    statuses = client.get_latest_committed_offset_tokens(
        [("db.kafka.t1", f"t1:P{p}") for p in range(PARTITIONS)]
    )
    assert [s.offset_token for s in statuses] == ["99"] * PARTITIONS  # the Kafka offsets
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": "g1"})
    committed = consumer.committed([TopicPartition("t1", p) for p in range(PARTITIONS)], 10)
    consumer.close()
    assert [tp.offset for tp in committed] == [100] * PARTITIONS  # group offsets follow tokens
    # A new channel and group start at the reset policy, said in words, not as librdkafka's
    # sentinel (-1001).
    log = bridge.log()
    assert len(re.findall(r"assigned t1\[\d\]: resume from the earliest offset", log)) == 4
    assert "-1001" not in log


def test_big_numbers_keep_every_digit(kafka, server, client_factory, bridge_factory):
    """Record values are parsed with ingest_sdk.wire.loads_exact: orjson.loads made a float of
    an integer beyond 64 bits, and the row got a rounded ID."""
    _, location = setup(server, client_factory, "t6")
    big = [10**28 + n for n in range(PARTITIONS)]  # fits INT (NUMBER(38,0)), not a float
    produce(kafka, "t6", [b'{"ID": %d, "V": "big"}' % n for n in big])
    bridge = bridge_factory(kafka, server.url, "t6", "db.kafka.t6", "g6").start()
    try:
        wait_rows(location, PARTITIONS, bridge=bridge)
    finally:
        bridge.stop()
    assert sorted(int(row["ID"]) for row in table_rows(location)) == big
    assert "bad record" not in bridge.log()


def test_sigkill_at_random_points_and_restart(kafka, server, client_factory, bridge_factory):
    """SIGKILL mid-stream, three times: every restart gets the partitions back within
    RESUME_BOUND (a killed member's group session outlives it; librdkafka's default 45 s
    session timeout made restarts wait ~45-106 s), and every record lands exactly once."""
    _, location = setup(server, client_factory, "t2")
    total = 3000
    sender = produce_in_background(kafka, "t2", total, rate=75)  # sends for ~40 s
    rng = random.Random(7)
    bridges = []
    for _ in range(3):
        bridge = bridge_factory(kafka, server.url, "t2", "db.kafka.t2", "g2").start()
        bridges.append(bridge)
        bridge.wait_log(r"assigned t2\[", timeout=RESUME_BOUND)
        time.sleep(rng.uniform(0.5, 2.0))  # delivering now: the sender is still sending
        bridge.kill()
    sender.join()
    restarted = bridge_factory(kafka, server.url, "t2", "db.kafka.t2", "g2").start()
    try:
        wait_rows(location, total, timeout=RESUME_BOUND, bridge=restarted)
        time.sleep(1.5)  # anything doubled would show up by now
    finally:
        restarted.stop()
    assert_exactly_once_in_order(location, total)
    # Started right after a kill, a bridge waits for the dead member's session to time out
    # (about 9 s on the mock cluster): it says why, not just metrics lines with "lag": {}.
    for bridge in bridges[1:]:
        assert "waiting for partition assignment from the group coordinator" in bridge.log()


def test_rebalance_between_two_instances(kafka, server, client_factory, bridge_factory):
    _, location = setup(server, client_factory, "t3")
    total = 1500
    sender = produce_in_background(kafka, "t3", total, rate=100)  # sends for ~15 s
    # Two instances of one group need their own static membership ids.
    first = bridge_factory(kafka, server.url, "t3", "db.kafka.t3", "g3",
                           "--instance-id", "g3-first").start()  # fmt: skip
    # All four opened (each a fence commit): a member busy in a rebalance callback when the
    # second joins rejoins late, and the mock broker then holds the group for rounds.
    first.wait_log(r"assigned t3\[3\]", timeout=RESUME_BOUND)
    second = bridge_factory(kafka, server.url, "t3", "db.kafka.t3", "g3",
                            "--instance-id", "g3-second").start()  # fmt: skip
    try:
        second.wait_log(r"assigned t3\[", timeout=RESUME_BOUND)  # the partitions are shared now
    except AssertionError as exc:  # the group waits on the first: say what it was doing
        raise AssertionError(f"{exc}\nthe first instance's log:\n{first.log()[-4000:]}") from None
    first.wait_log(r"revoked t3\[", timeout=RESUME_BOUND)
    first.stop()  # and move to the second once the first's session times out
    sender.join()
    try:
        wait_rows(location, total, bridge=second)
        time.sleep(1.5)
    finally:
        second.stop()
    assert_exactly_once_in_order(location, total)


def test_bad_records_go_to_the_dead_letter_topic(kafka, server, client_factory, bridge_factory):
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
    bridge = bridge_factory(kafka, server.url, "t4", "db.kafka.t4", "g4",
                            "--dlq-topic", "t4-dlq").start()  # fmt: skip
    try:
        wait_rows(location, 64, bridge=bridge)
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
    assert not any(e.startswith(b"Row ") for e in errors)  # a batch row number means nothing
    # Log lines name each bad record by topic, partition and offset, not by its row number
    # inside an insert batch.
    bad = [line for line in bridge.log().splitlines() if "bad record" in line]
    named = [re.search(r"bad record t4\[(\d)\]@(\d+): ", line) for line in bad]
    assert len(bad) == 16 and all(named)
    assert {(int(m[1]), int(m[2])) for m in named if m} == {
        (n % PARTITIONS, n // PARTITIONS) for n in range(80) if n % 10 in (3, 7)
    }  # record n went to partition n % 4 at offset n // 4
    assert not any(re.search(r"\bRow \d", line) for line in bad)


def test_server_restart_mid_stream(kafka, process_server_factory, bridge_factory):
    server = process_server_factory().start()
    with StreamingIngestClient("admin", url=server.url) as admin:
        location = admin.create_table("db.kafka.t5", COLUMNS)["location"]
    total = 1500
    sender = produce_in_background(kafka, "t5", total, rate=600)
    bridge = bridge_factory(kafka, server.url, "t5", "db.kafka.t5", "g5").start()
    time.sleep(1.5)
    server.kill()  # rows buffered in the server are lost with it
    time.sleep(0.5)
    server.start()
    sender.join()
    try:
        wait_rows(location, total, bridge=bridge)
        time.sleep(1.5)
    finally:
        bridge.stop()
    assert_exactly_once_in_order(location, total)
