"""The HTTP API with a plain HTTP client: JSON rows, retries, malformed requests, auth, 429."""

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from ingest_sdk import (
    BackpressureError,
    OpenChannelRequest,
    RetryPolicy,
    StreamingIngestClient,
)
from ingest_sdk.wire import (
    ARROW_CONTENT_TYPE,
    HEADER_BATCH_SEQ,
    HEADER_END_OFFSET_TOKEN,
    HEADER_GENERATION,
    encode_arrow,
)
from tests.http_calls import call

COLUMNS = {"ID": "INT NOT NULL", "S": "VARCHAR(3)"}




async def open_table_channel(http, channel="c1", **extra):
    status, body, _ = await call(http, "POST", "/v1/tables",
                                 json={"name": "db.s.t", "columns": COLUMNS, "if_not_exists": True})  # fmt: skip
    assert status in (200, 201), body
    status, opened, _ = await call(http, "POST", "/v1/channels/open",
                                   json={"table": "db.s.t", "channel": channel, **extra})  # fmt: skip
    assert status == 200, opened
    return body["location"], opened


def rows_path(generation, seq, channel="c1"):
    return (
        f"/v1/channels/rows?table=db.s.t&channel={channel}&generation={generation}&batch_seq={seq}"
    )


async def wait(http, generation, seq, channel="c1"):
    status, body, _ = await call(http, "POST", "/v1/channels/wait", json={
        "table": "db.s.t", "channel": channel, "generation": generation, "batch_seq": seq,
        "timeout": 30})  # fmt: skip
    assert status == 200 and body["committed"], body
    return body["offset_token"]


def ids(location):
    table = DeltaTable(location).to_pyarrow_table()
    return sorted(int(v) for v in table.column("ID").to_pylist())


async def test_json_rows_with_each_on_error_mode(http):
    location, opened = await open_table_channel(http)
    generation = opened["generation"]
    rows = [{"id": 1, "s": "ok"}, {"id": 2, "s": "toolong"}]
    status, body, _ = await call(http, "POST", rows_path(generation, 1),
                                 json={"rows": rows, "on_error": "CONTINUE", "end_offset_token": "2"})  # fmt: skip
    assert status == 200 and body["accepted_rows"] == 1
    assert body["insert_errors"][0]["row_index"] == 1
    assert 'column "S"' in body["insert_errors"][0]["message"]
    status, body, _ = await call(http, "POST", rows_path(generation, 2),
                                 json={"rows": [{"id": 3}, rows[1]], "on_error": "SKIP_BATCH",
                                       "end_offset_token": "4"})  # fmt: skip
    assert status == 200 and body["accepted_rows"] == 0 and len(body["insert_errors"]) == 1
    status, body, _ = await call(http, "POST", rows_path(generation, 3),
                                 json={"rows": [{"id": 5}, {"s": "x"}], "end_offset_token": "6"})  # fmt: skip
    assert status == 400 and body["error"]["code"] == "INSERT_VALIDATION"  # channel default ABORT
    assert body["error"]["insert_errors"][0]["missing_not_null_col_names"] == ["ID"]
    assert await wait(http, generation, 1) == "2"
    assert ids(location) == [1]


async def test_a_repeated_batch_is_acknowledged_and_ignored(http):
    location, opened = await open_table_channel(http)
    generation = opened["generation"]
    payload = {"rows": [{"id": 7}], "end_offset_token": "7"}
    first = await call(http, "POST", rows_path(generation, 1), json=payload)
    again = await call(http, "POST", rows_path(generation, 1), json=payload)
    assert first[1]["duplicate"] is False and again[1]["duplicate"] is True
    older = await call(http, "POST", rows_path(generation, 0), json=payload)
    assert older[1]["duplicate"] is True
    assert await wait(http, generation, 1) == "7"
    assert ids(location) == [7]


async def test_arrow_batches_are_checked_never_trusted(http):
    location, opened = await open_table_channel(http)
    generation = opened["generation"]
    schema = pa.schema([pa.field("ID", pa.decimal128(38, 0)), pa.field("S", pa.string())])

    def arrow(table, seq, token=None):
        headers = {"Content-Type": ARROW_CONTENT_TYPE, HEADER_GENERATION: str(generation),
                   HEADER_BATCH_SEQ: str(seq)}  # fmt: skip
        if token:
            headers[HEADER_END_OFFSET_TOKEN] = token
        body = encode_arrow(table.to_batches(), table.schema)
        return call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=c1", data=body,
                    headers=headers)  # fmt: skip

    too_long = pa.table({"ID": pa.array([1], pa.decimal128(38, 0)), "S": ["abcd"]}, schema=schema)
    status, body, _ = await arrow(too_long, 1)
    assert status == 400 and "longer than 3 characters" in body["error"]["message"]
    null_id = pa.table({"ID": pa.array([None], pa.decimal128(38, 0)), "S": ["a"]}, schema=schema)
    status, body, _ = await arrow(null_id, 1)
    assert status == 400 and "NULL given for NOT NULL" in body["error"]["message"]
    extra = pa.table({"ID": [1], "HACK": ["x"]})
    status, body, _ = await arrow(extra, 1)
    assert status == 400 and 'unknown column "HACK"' in body["error"]["message"]
    good = pa.table({"ID": pa.array([9], pa.decimal128(38, 0)), "S": ["ok"]}, schema=schema)
    status, body, _ = await arrow(good, 1, token="9")  # seq 1 was never accepted: still free
    assert status == 200 and body["accepted_rows"] == 1
    assert await wait(http, generation, 1) == "9"
    assert ids(location) == [9]


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "code"),
    [
        ("POST", "/v1/tables", {"data": b"{not json"}, 400, "BAD_REQUEST"),
        ("POST", "/v1/tables", {"json": [1, 2]}, 400, "BAD_REQUEST"),
        ("POST", "/v1/tables", {"json": {"name": "db.s.x"}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/tables", {"json": {"name": "db.s.x", "columns": {"A": "BLOB"}}}, 400, "SCHEMA_ERROR"),
        ("POST", "/v1/tables", {"json": {"name": "db.s.x", "columns": {"G": "GEOMETRY"}}}, 400, "UNSUPPORTED_FEATURE"),
        ("POST", "/v1/tables", {"json": {"name": 5, "columns": {}}}, 400, "BAD_REQUEST"),
        ("GET", "/v1/tables/db.s.missing", {}, 404, "TABLE_NOT_FOUND"),
        ("POST", "/v1/channels/open", {"json": {"table": "db.s.t"}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/open", {"json": {"table": "db.s.t", "channel": ""}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/open", {"json": {"table": "db.s.t", "channel": "c", "max_client_lag": 0}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/open", {"json": {"table": "db.s.t", "channel": "c", "default_timezone": "Nowhere/X"}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/open", {"json": {"table": "db.s.t", "channel": "c", "on_error": "LATER"}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1", {"json": {"rows": []}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=-1", {"json": {"rows": []}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=1", {"json": {"rows": "x"}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=1", {"json": {"rows": [], "end_offset_token": "x" * 3000}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=1", {"data": b"\x00garbage", "headers": {"Content-Type": ARROW_CONTENT_TYPE}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=1", {"json": {"rows": [1, None, "x"], "on_error": "CONTINUE"}}, 200, None),
        ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=99&batch_seq=1", {"json": {"rows": []}}, 409, "CHANNEL_INVALIDATED"),
        ("POST", "/v1/channels/rows?table=db.s.nope&channel=c1&generation=1&batch_seq=1", {"json": {"rows": []}}, 404, "TABLE_NOT_FOUND"),
            ("POST", "/v1/channels/rows?table=db.s.t&channel=never&generation=1&batch_seq=1", {"json": {"rows": []}}, 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/v1/channels/wait", {"json": {"table": "db.s.t", "channel": "c1", "generation": 1, "batch_seq": 50}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/status", {"json": {"channels": [5]}}, 400, "BAD_REQUEST"),
        ("POST", "/v1/channels/drop", {"json": {"table": "db.s.t", "channel": "missing"}}, 404, "CHANNEL_NOT_FOUND"),
        ("DELETE", "/v1/tables/db.s.missing", {}, 404, "TABLE_NOT_FOUND"),
        ("GET", "/v1/nothing-here", {}, 404, "HTTP_404"),
    ],
)  # fmt: skip
async def test_malformed_requests_get_4xx_and_change_nothing(
    http, method, path, kwargs, status, code
):
    location, opened = await open_table_channel(http)
    assert opened["generation"] == 1
    answer_status, body, _ = await call(http, method, path, **kwargs)
    assert answer_status == status, body
    if code is not None:
        assert body["error"]["code"] == code and body["error"]["message"]
    # The server is healthy, the channel still works, the table holds exactly what was sent.
    health = await call(http, "GET", "/health")
    assert health[0] == 200
    seq = 2 if answer_status == 200 else 1
    ok = await call(
        http, "POST", rows_path(1, seq), json={"rows": [{"id": 1}], "end_offset_token": "ok"}
    )
    assert ok[0] == 200, ok[1]
    assert await wait(http, 1, seq) == "ok"
    assert ids(location) == [1]


def test_auth_tokens_are_required_when_configured(server_factory):
    server = server_factory(auth_tokens=frozenset({"s3cret"}))
    from ingest_sdk import AuthenticationError

    with (
        pytest.raises(AuthenticationError, match="missing or wrong token"),
        StreamingIngestClient("x", url=server.url, retry=RetryPolicy(deadline=2)) as client,
    ):
        client.list_tables()
    with StreamingIngestClient("x", url=server.url, token="s3cret") as client:
        assert client.list_tables() == []


def test_backpressure_answers_429_and_the_sdk_waits_and_retries(server_factory):
    from channel_server import Limits
    from ingest_sdk import ClientLimits

    server = server_factory(limits=Limits(max_buffer_bytes=40_000))
    limits = ClientLimits(max_request_bytes=16_000)
    with StreamingIngestClient("bp", url=server.url, max_client_lag=0.2, limits=limits) as client:
        info = client.create_table("db.s.t", {"ID": "INT NOT NULL", "S": "VARCHAR"})
        channel = client.open_channel(OpenChannelRequest("c1", "DB", "S", "T"))
        for start in range(0, 2000, 100):
            channel.insert_rows([{"ID": n, "S": "x" * 100} for n in range(start, start + 100)],
                                end_offset_token=str(start + 99))  # fmt: skip
        assert channel.wait_for_commit(timeout=60) == "1999"
    assert ids(info["location"]) == list(range(2000))
    # Bounded by the limit plus one request (an empty buffer always admits one, so a
    # request larger than the limit cannot wait forever).
    assert 0 < server.service.channels.budget.peak <= 40_000 + 16_000
    registry = server.service.metrics.registry
    refused = registry.get_sample_value("ingest_rejected_requests_total", {"code": "BACKPRESSURE"})
    assert refused and refused > 0  # 429s happened and were retried


def test_backpressure_error_carries_retry_after(server_factory):
    from channel_server import Limits

    server = server_factory(limits=Limits(max_buffer_bytes=1))
    budget = server.service.channels.budget
    budget.used = 1  # something is buffered already
    with pytest.raises(BackpressureError) as info:
        budget.reserve(10, retry_after=0.25)
    assert info.value.details["retry_after"] == 0.25 and info.value.retriable
    budget.used = 0
