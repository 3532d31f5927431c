"""JSON rows keep every digit of their numbers, from the HTTP body to the Delta table (issue 9).

A plain HTTP client posts JSON; the table is read back with delta-rs. A number is
stored exactly as written, or the request is refused with a 400 that says why.
"""

from decimal import Decimal

import pytest
from deltalake import DeltaTable

from ingest_sdk.wire import JSON_CONTENT_TYPE
from tests.http_calls import call_json as call

COLUMNS = {
    "N": "NUMBER(38,0)",
    "S": "NUMBER(38,2)",
    "W": "NUMBER(38,4)",
    "T": "VARCHAR",
    "V": "VARIANT",
    "F": "FLOAT",
    "B": "BOOLEAN",
}
#: The body of the issue, byte for byte: orjson alone stores 123456789012345680000000000000
#: and 12345678901234567000.00.
ISSUE_BODY = b'{"rows":[{"N": 123456789012345678901234567890, "S": 12345678901234567890.12}]}'




async def open_channel(http):
    status, created = await call(http, "POST", "/v1/tables",
                                 json={"name": "db.s.numbers", "columns": COLUMNS})  # fmt: skip
    assert status in (200, 201), created
    status, opened = await call(http, "POST", "/v1/channels/open",
                                json={"table": "db.s.numbers", "channel": "c1"})  # fmt: skip
    assert status == 200, opened
    return created["location"], opened["generation"]


async def post_rows(http, generation, seq, body: bytes):
    path = (
        f"/v1/channels/rows?table=db.s.numbers&channel=c1&generation={generation}&batch_seq={seq}"
    )
    return await call(http, "POST", path, data=body, headers={"Content-Type": JSON_CONTENT_TYPE})


async def wait(http, generation, seq):
    status, body = await call(http, "POST", "/v1/channels/wait", json={
        "table": "db.s.numbers", "channel": "c1", "generation": generation, "batch_seq": seq,
        "timeout": 30})  # fmt: skip
    assert status == 200 and body["committed"], body


def read_rows(location):
    return DeltaTable(location).to_pyarrow_dataset().to_table().to_pylist()


async def test_the_issue_body_is_stored_with_every_digit(http):
    location, generation = await open_channel(http)
    status, answer = await post_rows(http, generation, 1, ISSUE_BODY)
    assert status == 200 and answer["accepted_rows"] == 1, answer
    await wait(http, generation, 1)
    [row] = read_rows(location)
    assert str(row["N"]) == "123456789012345678901234567890"
    assert str(row["S"]) == "12345678901234567890.12"
    assert row["N"] == 123456789012345678901234567890
    assert row["S"] == Decimal("12345678901234567890.12")


async def test_a_large_body_parsed_off_the_event_loop_keeps_every_digit(http):
    from channel_server.requests import THREAD_PARSE_BYTES

    location, generation = await open_channel(http)
    rows = b",".join(b'{"N": %d, "S": %d.25}' % (10**29 + i, 10**19 + i) for i in range(12_000))
    body = b'{"rows":[' + rows + b"]}"
    assert len(body) > THREAD_PARSE_BYTES
    status, answer = await post_rows(http, generation, 1, body)
    assert status == 200 and answer["accepted_rows"] == 12_000, answer
    await wait(http, generation, 1)
    stored = sorted((row["N"], row["S"]) for row in read_rows(location))
    assert stored[0] == (10**29, Decimal(10**19) + Decimal("0.25"))
    assert stored[-1] == (10**29 + 11_999, Decimal(10**19 + 11_999) + Decimal("0.25"))


async def test_every_numeric_column_type_keeps_the_digits_sent(http):
    location, generation = await open_channel(http)
    body = (
        b'{"rows":[{"N": -99999999999999999999999999999999999999,'
        b' "W": 9999999999999999999999999999999999.9999,'
        b' "S": 0.12499999999999999999,'  # a float would make it 0.125, then 0.13
        b' "T": 12345678901234567890.12,'
        b' "V": {"big": 123456789012345678901234567890, "dec": 0.30000000000000001},'
        b' "F": 123456789012345678901234567890,'
        b' "B": 1e-400}]}'  # a float would make it 0.0: false
    )
    status, answer = await post_rows(http, generation, 1, body)
    assert status == 200 and answer["accepted_rows"] == 1, answer
    await wait(http, generation, 1)
    [row] = read_rows(location)
    assert row["N"] == Decimal("-99999999999999999999999999999999999999")
    assert str(row["W"]) == "9999999999999999999999999999999999.9999"
    assert str(row["S"]) == "0.12"
    assert row["T"] == "12345678901234567890.12"
    assert row["V"] == '{"big":123456789012345678901234567890,"dec":0.30000000000000001}'
    assert row["F"] == 1.2345678901234568e29  # FLOAT is a double: the nearest one
    assert row["B"] is True


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        # Too many digits for NUMBER(38,0): refused, echoing the value as sent.
        (b'{"rows":[{"N": 1234567890123456789012345678901234567890}]}', "INSERT_VALIDATION",
         "got 1234567890123456789012345678901234567890"),
        (b'{"rows":[{"S": 12345678901234567890123456789012345678.5}]}', "INSERT_VALIDATION",
         "got 12345678901234567890123456789012345678.5. Fix"),
        (b'{"rows":[{"N": 1e400}]}', "INSERT_VALIDATION", "out of range for NUMBER(38,0)"),
        (b'{"rows":[{"N": NaN}]}', "BAD_REQUEST", "not valid JSON"),
        (b'{"rows":[{"N": 1' + b"0" * 4300 + b"}]}", "BAD_REQUEST",
         "a JSON integer has 4301 digits; at most 4300 are accepted"),
        (b'{"rows":[{"N": 1e99999999999999999999}]}', "BAD_REQUEST", "exponent out of range"),
    ],
)  # fmt: skip
async def test_numbers_that_cannot_be_stored_exactly_are_a_400_that_says_why(
    http, body, code, fragment
):
    location, generation = await open_channel(http)
    status, answer = await post_rows(http, generation, 1, body)
    assert status == 400, answer
    assert answer["error"]["code"] == code and fragment in answer["error"]["message"], answer
    assert "e+" not in answer["error"]["message"]  # never a float's rendering of the value
    assert read_rows(location) == []
