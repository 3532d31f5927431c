"""Wire helpers, durations and the error table."""

import pyarrow as pa
import pytest

from ingest_sdk import ConfigurationError
from ingest_sdk.durations import parse_duration, parse_max_client_lag
from ingest_sdk.errors import ERRORS_BY_CODE, ChannelInvalidatedError, SchemaError
from ingest_sdk.transport import error_from_answer
from ingest_sdk.wire import decode_arrow, encode_arrow, pack_txn_version, unpack_txn_version


@pytest.mark.parametrize(
    ("text", "seconds"),
    [(1, 1.0), (0.5, 0.5), ("1.5", 1.5), ("1 second", 1.0), ("2 minutes", 120.0),
     ("250 ms", 0.25), ("1h", 3600.0), ("30 days", 2_592_000.0), (" 3 Seconds ", 3.0)],
)  # fmt: skip
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "soon", "1 fortnight", "-1", True, None, [1]])
def test_bad_durations(bad):
    with pytest.raises(ConfigurationError):
        parse_duration(bad)


def test_max_client_lag_bounds():
    assert parse_max_client_lag("50 ms") == 0.05
    assert parse_max_client_lag("10 minutes") == 600
    for bad in ("49 ms", "601 s", 0):
        with pytest.raises(ConfigurationError):
            parse_max_client_lag(bad)


def test_txn_version_keeps_order():
    positions = [(1, 1), (1, 2), (1, 2**39), (2, 0), (2, 1), (500, 7)]
    versions = [pack_txn_version(*p) for p in positions]
    assert versions == sorted(versions)
    assert [unpack_txn_version(v) for v in versions] == positions
    with pytest.raises(ValueError):
        pack_txn_version(1, 2**40)


def test_arrow_stream_round_trip_including_empty():
    schema = pa.schema([("A", pa.int64())])
    batch = pa.record_batch([pa.array([1, 2])], schema=schema)
    assert decode_arrow(encode_arrow([batch, batch], schema)).num_rows == 4
    assert decode_arrow(encode_arrow([], schema)).num_rows == 0


def test_error_answers_map_to_classes():
    error = error_from_answer(409, b'{"error": {"code": "CHANNEL_INVALIDATED", "message": "m"}}')
    assert isinstance(error, ChannelInvalidatedError) and str(error) == "m"
    schema_error = error_from_answer(400, b'{"error": {"code": "SCHEMA_ERROR", "message": "bad"}}')
    assert isinstance(schema_error, SchemaError)
    server = error_from_answer(502, b"<html>proxy</html>")
    assert server.retriable and "proxy" in str(server)
    assert ERRORS_BY_CODE["BACKPRESSURE"].retriable
    assert not ERRORS_BY_CODE["TABLE_NOT_FOUND"].retriable
