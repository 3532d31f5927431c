"""Bridge configuration, the start-up mapping check and what the bridge says, without Kafka."""

import logging
import re
import socket

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, KafkaError

from examples.kafka_bridge.__main__ import parse_args
from examples.kafka_bridge.bridge import METADATA, KafkaBridge, Metrics, TopicMapping
from examples.kafka_bridge.errors import KafkaUnavailableError
from examples.kafka_bridge.kafka_health import KafkaHealth, RepeatFilter
from examples.kafka_bridge.reporting import describe_offset, describe_resume, record_error
from examples.kafka_bridge.table_check import METADATA_KINDS, SUGGESTED_TYPES, mapping_problems
from ingest_sdk import TableSchema

ONE_TOPIC = ["--bootstrap-servers", "b:1", "--topic", "t", "--table", "D.S.T",
             "--server-url", "http://s", "--group-id", "g"]  # fmt: skip


def test_flags_for_one_topic():
    config = parse_args([*ONE_TOPIC, "--metadata-column", "offset=KAFKA_OFFSET"])
    assert config.mappings == (TopicMapping("t", "D.S.T", {"offset": "KAFKA_OFFSET"}),)
    assert (config.bootstrap_servers, config.group_id, config.dlq_topic) == ("b:1", "g", None)


def test_config_file_for_many_topics(tmp_path):
    path = tmp_path / "bridge.json"
    path.write_bytes(orjson.dumps({
        "bootstrap_servers": "b:1", "group_id": "g", "server_url": "http://s", "dlq_topic": "dead",
        "mappings": [{"topic": "a", "table": "D.S.A"},
                     {"topic": "b", "table": "D.S.B", "metadata_columns": {"key": "K"}}],
    }))  # fmt: skip
    config = parse_args(["--config", str(path)])
    assert [m.topic for m in config.mappings] == ["a", "b"] and config.dlq_topic == "dead"


def test_group_membership_options():
    """Static membership by default, with an id stable across restarts on one host."""
    config = parse_args(ONE_TOPIC)
    assert config.instance_id == f"g-{socket.gethostname()}"
    assert (config.session_timeout, config.broker_timeout) == (10.0, 300.0)
    config = parse_args([*ONE_TOPIC, "--instance-id", "", "--session-timeout", "6",
                         "--broker-timeout", "30"])  # fmt: skip
    assert (config.instance_id, config.session_timeout, config.broker_timeout) == (None, 6, 30)
    assert parse_args([*ONE_TOPIC, "--instance-id", "bridge-1"]).instance_id == "bridge-1"


@pytest.mark.parametrize(
    "argv",
    [
        ["--topic", "t", "--table", "D.S.T"],  # no servers, group or url
        ["--bootstrap-servers", "b", "--server-url", "u", "--group-id", "g"],  # no mapping
        [*ONE_TOPIC, "--metadata-column", "colour=C"],  # unknown metadata field
        [*ONE_TOPIC, "--broker-timeout", "0"],
    ],
)  # fmt: skip
def test_incomplete_configuration_is_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


@pytest.mark.parametrize(
    "mapping",
    [
        {"topic": "a", "table": "D.S.A", "metadata_columns": {"colour": "C"}},
        {"topic": "a", "table": "D.S.A", "partitions": 3},
    ],
)
def test_bad_mappings_in_the_config_file_are_refused(tmp_path, mapping):
    path = tmp_path / "bridge.json"
    path.write_bytes(orjson.dumps({"bootstrap_servers": "b", "group_id": "g",
                                   "server_url": "u", "mappings": [mapping]}))  # fmt: skip
    with pytest.raises(SystemExit):
        parse_args(["--config", str(path)])


# -- the start-up mapping check ----------------------------------------------------------------

SCHEMA = TableSchema.parse({"ID": "INT NOT NULL", "KAFKA_OFFSET": "NUMBER(18,0)",
                            "K": "VARCHAR", "H": "VARCHAR", "HEADERS": "OBJECT", "ON": "BOOLEAN"})  # fmt: skip


def test_a_fitting_mapping_has_no_problems():
    mapping = TopicMapping("t", "D.S.T", {"offset": "kafka_offset", "key": "K",
                                          "headers": "headers"})  # fmt: skip
    assert mapping_problems(mapping, SCHEMA) == []  # unquoted names match case-insensitively


def test_missing_metadata_columns_are_named_with_the_fix():
    mapping = TopicMapping("t", "D.S.T", {"partition": "KAFKA_PARTITION", "offset": "KAFKA_OFFSET",
                                          "timestamp": "KAFKA_TS"})  # fmt: skip
    (problem,) = mapping_problems(mapping, SCHEMA)
    assert "table D.S.T (topic t) has no columns KAFKA_PARTITION, KAFKA_TS" in problem
    assert "--metadata-column partition=KAFKA_PARTITION" in problem
    assert '"KAFKA_TS": "TIMESTAMP_LTZ(3)"' in problem and "Fix:" in problem


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"headers": "H"}, "column H (VARCHAR(16777216)) cannot hold the Kafka headers"),
        ({"offset": "ON"}, "column ON (BOOLEAN) cannot hold the Kafka offset"),
        ({"offset": "K", "key": "k"}, "metadata fields offset, key all go to column K"),
        ({"colour": "K"}, "unknown metadata field(s) colour"),
    ],
)
def test_metadata_columns_that_cannot_work_are_refused(metadata, expected):
    problems = mapping_problems(TopicMapping("t", "D.S.T", metadata), SCHEMA)
    assert any(expected in problem for problem in problems), problems


def test_every_metadata_field_has_kinds_and_a_suggested_type():
    assert set(METADATA_KINDS) == set(SUGGESTED_TYPES) == set(METADATA)


# -- what the bridge says -----------------------------------------------------------------------


def test_metrics_rates_cover_the_last_interval_not_the_whole_run():
    metrics = Metrics(_mark=(100.0, 0, 0))
    metrics.records, metrics.rows = 1000, 900
    first = metrics.snapshot(now=110.0)
    assert (first["records_per_s"], first["rows_per_s"], first["interval_s"]) == (100.0, 90.0, 10)
    metrics.records += 50  # a stall: since start this would still read 52.5/s
    second = metrics.snapshot(now=120.0)
    assert (second["records_per_s"], second["rows_per_s"], second["records"]) == (5.0, 0.0, 1050)


def test_metrics_snapshot():
    metrics = Metrics(records=10, rows=8, bad_records=2, dlq_records=2)
    snapshot = metrics.snapshot()
    assert (
        snapshot["records"] == 10 and snapshot["dlq_records"] == 2 and snapshot["records_per_s"] > 0
    )


@pytest.mark.parametrize(
    ("offset", "words"),
    [
        (OFFSET_BEGINNING, "from the earliest offset"),
        (OFFSET_END, "from the latest offset"),
        (OFFSET_STORED, "from the group's committed offset"),
        (OFFSET_INVALID, "from the latest offset (auto.offset.reset)"),
        (42, "at offset 42"),
    ],
)
def test_offsets_are_described_in_words_not_sentinels(offset, words):
    assert describe_offset(offset, "latest") == words
    for source in ("token", "group", "reset"):
        text = describe_resume(offset, source, "latest")
        assert words in text and not re.search(r"-\d", text)  # no -2, -1, -1000, -1001


def test_record_errors_lose_the_row_number_inside_the_batch():
    assert record_error('Row 5, column "ID" (NUMBER(38,0)): value error: x') == (
        'column "ID" (NUMBER(38,0)): value error: x'
    )
    assert record_error('Row 12: NOT NULL column "ID" is missing. Fix: add it') == (
        'NOT NULL column "ID" is missing. Fix: add it'
    )
    assert record_error("the record value is not valid JSON (x)") == (
        "the record value is not valid JSON (x)"
    )


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_an_unreachable_broker_is_said_once_then_reminded(caplog):
    clock = Clock()
    health = KafkaHealth("b:9092", logging.getLogger("test.health"), interval=60, clock=clock)
    refused = KafkaError(KafkaError._TRANSPORT, "b:9092/bootstrap: Connect failed (after 0ms)")
    with caplog.at_level(logging.INFO, "test.health"):
        for _ in range(100):  # ~5 s of librdkafka's default reconnect rate
            health.on_error(refused)
            clock.now += 0.05
        health.on_error(KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"))
        assert [r.getMessage().count("unreachable") for r in caplog.records] == [1]
        clock.now = 61
        health.on_error(refused)
    reminder = caplog.records[-1].getMessage()
    assert len(caplog.records) == 2 and "still unreachable" in reminder
    assert "100 more like this" in reminder  # 99 repeats and the "all brokers down"


def test_after_connecting_one_dropped_connection_is_not_unreachable(caplog):
    health = KafkaHealth("b:9092", logging.getLogger("test.health"), clock=Clock())
    health.connected = True
    with caplog.at_level(logging.INFO, "test.health"):
        health.on_error(KafkaError(KafkaError._TRANSPORT, "b:9092/1: Disconnected (after 9ms)"))
        health.on_error(KafkaError(KafkaError._TRANSPORT, "b:9092/1: Disconnected (after 7ms)"))
    (record,) = caplog.records
    assert "unreachable" not in record.getMessage() and "Disconnected" in record.getMessage()


def test_a_fatal_error_is_kept_for_the_run_loop():
    health = KafkaHealth("b:9092", logging.getLogger("test.health"))
    health.on_error(KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
    assert health.fatal is not None and health.fatal.code() == KafkaError.FENCED_INSTANCE_ID


def test_librdkafka_log_lines_are_let_through_once_per_interval():
    clock = Clock()
    repeats = RepeatFilter(interval=60, clock=clock)

    def line(text):
        return logging.LogRecord("kafka", logging.ERROR, __file__, 1, "%s", (text,), None)

    assert repeats.filter(line("Connect to ipv4#127.0.0.1:1 failed (after 0ms)"))
    assert not repeats.filter(line("Connect to ipv4#127.0.0.1:1 failed (after 3ms)"))
    assert repeats.filter(line("another problem"))
    clock.now = 60
    again = line("Connect to ipv4#127.0.0.1:1 failed (after 1ms)")
    assert repeats.filter(again) and "1 more like this" in again.getMessage()


def test_a_fenced_instance_stops_with_the_fix():
    """Two bridges with one --instance-id: the coordinator fences the older one (a fatal
    client error); it must stop with a message naming the fix, not spin."""
    config = parse_args([*ONE_TOPIC, "--bootstrap-servers", "127.0.0.1:1",
                         "--instance-id", "bridge-1"])  # fmt: skip
    bridge = KafkaBridge(config)
    try:
        bridge.health.on_error(KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True))
        with pytest.raises(KafkaUnavailableError, match="--instance-id bridge-1") as raised:
            bridge._raise_if_fatal()
        assert raised.value.exit_code == 1 and "Fix: give each bridge" in str(raised.value)
    finally:
        bridge.close()
