"""Before the bridge consumes: the mapping check, the wait for a broker, the README example."""

import re
import shlex
import socket
from pathlib import Path

import orjson
from confluent_kafka import Consumer, TopicPartition

from examples.kafka_bridge.__main__ import parse_args
from examples.kafka_bridge.table_check import check_tables
from tests.examples.bridge_process import COLUMNS, PARTITIONS, produce, table_rows, wait_rows

README = Path(__file__).resolve().parents[2] / "examples" / "kafka_bridge" / "README.md"
#: The quick-start table of the top-level README, which the bridge README's --config uses.
QUICK_START_COLUMNS = {"ID": "NUMBER(38,0) NOT NULL", "ITEM": "VARCHAR(100)"}


def test_a_mapping_that_does_not_fit_its_table_is_refused(kafka, server, client_factory,
                                                          bridge_factory, tmp_path):  # fmt: skip
    """Missing metadata columns used to send every record to the DLQ while the tokens moved
    past them; now the bridge refuses to start and names the columns, table and fix."""
    client = client_factory(server.url)
    client.create_table("db.kafka.s1", {"ID": "INT NOT NULL", "V": "VARCHAR(20)"})
    produce(kafka, "s1", [{"ID": n, "V": "x"} for n in range(8)])
    bridge = bridge_factory(kafka, server.url, "s1", "db.kafka.s1", "gs1").start()
    assert bridge.wait_exit(60) == 2
    message = bridge.log()
    assert "db.kafka.s1" in message and "KAFKA_PARTITION" in message
    assert "KAFKA_OFFSET" in message and "Fix:" in message
    # Nothing was consumed: no channel opened, so no token moved; no group offset either.
    assert client.show_channels("db.kafka.s1") == []
    consumer = Consumer({"bootstrap.servers": kafka, "group.id": "gs1"})
    committed = consumer.committed([TopicPartition("s1", p) for p in range(PARTITIONS)], 10)
    consumer.close()
    assert all(tp.offset < 0 for tp in committed)

    # A missing table and a metadata column of the wrong type: one message names both.
    client.create_table("db.kafka.s1b", {**COLUMNS, "H": "VARCHAR(100)"})
    path = tmp_path / "bridge.json"
    path.write_bytes(orjson.dumps({
        "bootstrap_servers": kafka, "group_id": "gs1b", "server_url": server.url,
        "mappings": [{"topic": "s1", "table": "db.kafka.nowhere"},
                     {"topic": "s1b", "table": "db.kafka.s1b", "metadata_columns": {"headers": "H"}}],
    }))  # fmt: skip
    bridge = bridge_factory.raw(["--config", str(path)]).start()
    assert bridge.wait_exit(60) == 2
    message = bridge.log()
    assert "db.kafka.nowhere" in message and "does not exist" in message
    assert "column H (VARCHAR(100))" in message and "OBJECT" in message


def test_an_unreachable_broker_is_reported_once_then_the_bridge_gives_up(
    server, client_factory, bridge_factory
):
    """It used to log ~20 connection errors a second, forever."""
    client_factory(server.url).create_table("db.kafka.s2", COLUMNS)
    with socket.socket() as unused:  # bound, not listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        kafka = f"127.0.0.1:{unused.getsockname()[1]}"
        bridge = bridge_factory(kafka, server.url, "s2", "db.kafka.s2", "gs2",
                                "--broker-timeout", "6").start()  # fmt: skip
        status = bridge.wait_exit(90)  # generous: the timeout is 6 s
    lines = bridge.log().splitlines()
    assert status == 1
    assert sum("unreachable" in line for line in lines) == 1, lines
    assert sum("Connection refused" in line for line in lines) <= 3, lines
    assert any("--broker-timeout" in line and "gave up" in line for line in lines), lines


def readme_blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def test_the_readme_example_runs_as_written(kafka, server, client_factory, bridge_factory,
                                            tmp_path):  # fmt: skip
    """The README's commands, with only the broker and service addresses replaced."""

    def local(text):
        return text.replace("localhost:9092", kafka).replace("http://127.0.0.1:8080", server.url)

    setup, send = (local(block) for block in readme_blocks("python"))
    exec(setup, {})  # creates the table
    exec(send, {})  # sends three records to "orders"
    (command,) = [b for b in readme_blocks("sh") if "-m examples.kafka_bridge" in b]
    argv = shlex.split(local(command).replace("\\\n", " "))  # the shell's line continuations
    assert argv[0].endswith("python") and argv[1:3] == ["-m", "examples.kafka_bridge"]
    bridge = bridge_factory.raw(argv[3:]).start()  # run by this test's interpreter
    client = client_factory(server.url)
    location = client.describe_table("SHOP.PUBLIC.ORDER_EVENTS")["location"]
    try:
        wait_rows(location, 3, bridge=bridge)
    finally:
        bridge.stop()
    assert bridge.process.returncode == 0
    rows = table_rows(location)
    assert sorted((int(r["ID"]), r["ITEM"]) for r in rows) == [(n, "pen") for n in range(3)]
    assert all(r["KAFKA_PARTITION"] is not None and r["KAFKA_OFFSET"] is not None for r in rows)
    assert "bad record" not in bridge.log()

    # The --config example fits its tables too (the second is the top-level quick start's).
    client.create_table("SHOP.PUBLIC.ORDERS", QUICK_START_COLUMNS, if_not_exists=True)
    (example,) = readme_blocks("json")
    path = tmp_path / "bridge.json"
    path.write_text(local(example))
    check_tables(client, parse_args(["--config", str(path)]).mappings)  # raises if not
