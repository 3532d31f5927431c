"""Bridge configuration from flags and from a JSON file."""

import orjson
import pytest

from examples.kafka_bridge.__main__ import parse_args
from examples.kafka_bridge.bridge import Metrics, TopicMapping


def test_flags_for_one_topic():
    config = parse_args(["--bootstrap-servers", "b:1", "--topic", "t", "--table", "D.S.T",
                         "--server-url", "http://s", "--group-id", "g",
                         "--metadata-column", "offset=KAFKA_OFFSET"])  # fmt: skip
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


@pytest.mark.parametrize(
    "argv",
    [
        ["--topic", "t", "--table", "D.S.T"],  # no servers, group or url
        ["--bootstrap-servers", "b", "--server-url", "u", "--group-id", "g"],  # no mapping
        ["--bootstrap-servers", "b", "--server-url", "u", "--group-id", "g", "--topic", "t",
         "--table", "D.S.T", "--metadata-column", "colour=C"],  # unknown metadata field
    ],
)  # fmt: skip
def test_incomplete_configuration_is_refused(argv):
    with pytest.raises(SystemExit):
        parse_args(argv)


def test_metrics_snapshot():
    metrics = Metrics(records=10, rows=8, bad_records=2, dlq_records=2)
    snapshot = metrics.snapshot()
    assert (
        snapshot["records"] == 10 and snapshot["dlq_records"] == 2 and snapshot["records_per_s"] > 0
    )
