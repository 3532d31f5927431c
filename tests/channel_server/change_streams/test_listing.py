"""``GET /v1/change-streams`` and ``GET /v1/change-streams/{name}``: the streams a
warehouse holds, as SHOW CHANGE STREAMS lists them, over HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest

from ingest_sdk.errors import ChangeStreamNotFoundError


def get(server, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=60) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_the_list_and_one_stream_say_what_show_change_streams_says(server, session):
    assert get(server, "/v1/change-streams") == (200, {"change_streams": []})
    session.sql("CREATE TABLE ACCOUNTS (ID NUMBER, BALANCE NUMBER)")
    session.sql("CREATE TABLE ORDERS (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM BALANCES FOR ACCOUNTS(BALANCE) "
                "OPTIONS (value_capture_type = 'NEW_VALUES', retention_period = '36h', "
                "exclude_delete = true)")
    session.sql("CREATE CHANGE STREAM EVERYTHING FOR ALL")
    session.sql('CREATE CHANGE STREAM "lower" FOR ACCOUNTS, ORDERS')

    status, body = get(server, "/v1/change-streams")
    assert status == 200
    listed = {s["name"]: s for s in body["change_streams"]}
    # A part that is not upper case is quoted, so a name can be typed back as listed.
    assert list(listed) == ["DB.PUBLIC.BALANCES", "DB.PUBLIC.EVERYTHING", 'DB.PUBLIC."lower"']
    balances = listed["DB.PUBLIC.BALANCES"]
    assert {k: v for k, v in balances.items() if k != "created_at"} == {
        "name": "DB.PUBLIC.BALANCES", "database": "DB", "schema": "PUBLIC",
        "change_stream": "BALANCES", "for": ["DB.PUBLIC.ACCOUNTS"],
        "columns": {"DB.PUBLIC.ACCOUNTS": ["BALANCE"]},
        "value_capture_type": "NEW_VALUES", "retention_period": "36h", "open_partitions": 1,
        "exclude_insert": False, "exclude_update": False, "exclude_delete": True,
        "exclude_ttl_deletes": False,
    }  # fmt: skip
    assert listed["DB.PUBLIC.EVERYTHING"]["for"] == "ALL"
    assert listed['DB.PUBLIC."lower"']["for"] == ["DB.PUBLIC.ACCOUNTS", "DB.PUBLIC.ORDERS"]
    # The same values SHOW CHANGE STREAMS answers.
    shown = {r["name"]: r for r in session.sql("SHOW CHANGE STREAMS").collect()}
    assert shown["BALANCES"]["retention_period"] == "36h"
    assert shown["BALANCES"]["for"] == "DB.PUBLIC.ACCOUNTS(BALANCE)"
    assert [shown["BALANCES"][f"exclude_{kind}"] for kind in
            ("insert", "update", "delete", "ttl_deletes")] == [False, False, True, False]
    assert shown["BALANCES"]["created_on"].timestamp() == pytest.approx(
        balances["created_at"], abs=1e-3)

    # One stream, by the names the read route takes; a dropped table drops out.
    assert get(server, "/v1/change-streams/balances") == (200, balances)
    assert get(server, "/v1/change-streams/PUBLIC.BALANCES")[1] == balances
    assert get(server, '/v1/change-streams/"lower"')[1]["change_stream"] == "lower"
    session.sql("DROP TABLE ORDERS")
    assert get(server, '/v1/change-streams/"lower"')[1]["for"] == ["DB.PUBLIC.ACCOUNTS"]


def test_the_sdk_lists_and_describes_them(server, session, client_factory):
    session.sql("CREATE TABLE ACCOUNTS (ID NUMBER)")
    session.sql("CREATE CHANGE STREAM BALANCES FOR ACCOUNTS")
    client = client_factory(server.url)
    listed = client.list_change_streams()
    assert [s["name"] for s in listed] == ["DB.PUBLIC.BALANCES"]
    assert client.describe_change_stream("balances") == listed[0] == get(
        server, "/v1/change-streams/BALANCES")[1]  # fmt: skip
    with pytest.raises(ChangeStreamNotFoundError, match="or GET /v1/change-streams lists them"):
        client.describe_change_stream("NOPE")
    with pytest.raises(ChangeStreamNotFoundError, match=r"did you mean DB\.PUBLIC\.BALANCES"):
        client.describe_change_stream("BALANCSE")


def test_a_missing_or_malformed_name_is_a_4xx_that_says_what_to_do(server, session):
    status, body = get(server, "/v1/change-streams/NOPE")
    assert status == 404
    assert body["error"]["code"] == "CHANGE_STREAM_NOT_FOUND"
    assert "or GET /v1/change-streams lists them" in body["error"]["message"]
    status, body = get(server, "/v1/change-streams/a.b.c.d")
    assert status == 400
    assert "is not a change stream name" in body["error"]["message"]
