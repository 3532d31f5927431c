"""What an operator sees: JSON log lines on stderr and Prometheus metrics."""

import io
import logging
import urllib.error
import urllib.request

import orjson
from prometheus_client.parser import text_string_to_metric_families

from ingest_sdk import OpenChannelRequest
from ingest_sdk.logs import JsonLogFormatter, configure_logging


def scrape(url):
    with urllib.request.urlopen(url + "/metrics") as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return text, {family.name: family for family in text_string_to_metric_families(text)}


def sample(families, name, **labels):
    for family in families.values():
        for item in family.samples:
            if item.name == name and all(item.labels.get(k) == v for k, v in labels.items()):
                return item.value
    return None


def test_metrics_have_help_types_table_labels_and_live_buffer_gauges(server, client_factory):
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(OpenChannelRequest("c", "DB", "S", "T"))
    channel.insert_rows([{"ID": n} for n in range(10)], end_offset_token="9")
    assert channel.wait_for_commit(timeout=30) == "9"
    text, families = scrape(server.url)
    for name in ("ingest_rows_inserted", "ingest_rows_committed", "ingest_flush_duration_seconds",
                 "ingest_insert_to_commit_seconds", "ingest_buffer_bytes_used",
                 "ingest_rejected_requests", "ingest_compactions",
                 "ingest_flush_phase_seconds"):  # fmt: skip
        assert f"# HELP {name}" in text and f"# TYPE {name}" in text, name
    assert sample(families, "ingest_rows_inserted_total", table="DB.S.T") == 10
    assert sample(families, "ingest_rows_committed_total", table="DB.S.T") == 10
    assert sample(families, "ingest_flush_duration_seconds_count", table="DB.S.T") >= 1
    assert sample(families, "ingest_insert_to_commit_seconds_count", table="DB.S.T") == 1
    assert families["ingest_insert_to_commit_seconds"].type == "histogram"
    for phase in ("lag_wait", "row_ids", "parquet", "delta_commit", "catalog", "flush"):
        assert sample(families, "ingest_flush_phase_seconds_count", phase=phase) >= 1, phase
    # Everything is flushed: the buffer gauge says 0 (it used to keep the last insert's size).
    assert sample(families, "ingest_buffer_bytes_used") == 0
    assert sample(families, "ingest_buffer_bytes_peak") > 0
    assert sample(families, "ingest_open_channels") == 1
    channel.close()
    _, families = scrape(server.url)
    assert sample(families, "ingest_open_channels") == 0  # a closed handle is not open
    # A dropped table's series go away.
    client.drop_table("db.s.t")
    _, families = scrape(server.url)
    assert sample(families, "ingest_rows_inserted_total", table="DB.S.T") is None


def test_rejected_requests_are_counted_by_code(server):
    for path in ("/v1/tables/db.s.missing", "/v1/tables/a.b"):
        try:
            urllib.request.urlopen(server.url + path)
        except urllib.error.HTTPError as exc:
            assert exc.code in (400, 404)
    _, families = scrape(server.url)
    assert sample(families, "ingest_rejected_requests_total", code="TABLE_NOT_FOUND") == 1
    assert sample(families, "ingest_rejected_requests_total", code="SCHEMA_ERROR") == 1


def test_log_lines_are_json_with_the_fields_passed_as_extra():
    stream = io.StringIO()
    configure_logging("DEBUG", stream)
    try:
        log = logging.getLogger("test.logs")
        log.warning("flush of %s failed", "DB.S.T", extra={"table": "DB.S.T", "attempt": 2})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it broke")
        logging.getLogger("test.logs").debug("quiet")
    finally:
        logging.getLogger().handlers.clear()
    # Other threads of this worker (servers, py4j) may log to the root at DEBUG meanwhile.
    lines = (orjson.loads(line) for line in stream.getvalue().splitlines())
    first, second, third = (line for line in lines if line["logger"] == "test.logs")
    assert first["message"] == "flush of DB.S.T failed" and first["level"] == "WARNING"
    assert first["table"] == "DB.S.T" and first["attempt"] == 2 and first["logger"] == "test.logs"
    assert "ValueError: boom" in second["error"]
    assert third["level"] == "DEBUG"


def test_unknown_log_levels_are_refused():
    import pytest

    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("LOUD")


def test_formatter_survives_values_json_cannot_hold():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    record.thing = object()
    assert "object" in orjson.loads(JsonLogFormatter().format(record))["thing"]


def test_the_server_process_logs_json_lines_for_failures_and_its_lifecycle(
    process_server_factory,
):
    server = process_server_factory().start()
    try:
        urllib.request.urlopen(server.url + "/v1/tables/db.s.nothing")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404
    server.stop()
    assert server.process.returncode == 0
    lines = [orjson.loads(line) for line in server.log.read_text().splitlines() if line.strip()]
    messages = [line["message"] for line in lines]
    assert any(m.startswith("listening on http://127.0.0.1:") for m in messages)
    (failure,) = [line for line in lines if line.get("status") == 404]
    assert failure["code"] == "TABLE_NOT_FOUND" and failure["method"] == "GET"
    assert failure["path"] == "/v1/tables/db.s.nothing" and failure["table"] == "db.s.nothing"
    assert failure["duration_ms"] >= 0 and failure["level"] == "WARNING"
    assert messages[-1] == "stopped"
