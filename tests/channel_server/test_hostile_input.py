"""Hostile input at the door: each case found by an attack on a live server, now refused.

Nothing a request says may delete data, reach outside the warehouse, or stop a table
from committing; every user mistake is a 4xx that names the cause.
"""

import gzip
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

from flush import drop_table
from ingest_sdk import OpenChannelRequest, StreamingIngestClient
from ingest_sdk.wire import HEADER_BATCH_SEQ, HEADER_END_OFFSET_TOKEN, HEADER_GENERATION
from tests.http_calls import call_json as call

COLUMNS = {"ID": "INT NOT NULL", "S": "VARCHAR(20)"}




def tree(root: Path) -> set[str]:
    """Every path below ``root`` (files and folders), relative to it."""
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def row_count(location: str) -> int:
    return DeltaTable(location).to_pyarrow_dataset().count_rows()


def fill(url: str, table: str, channel: str, count: int) -> str:
    """Commit rows 0..count-1 through the SDK; returns the table's location."""
    with StreamingIngestClient("t", url=url, max_client_lag=0.1) as client:
        info = client.create_table(table, COLUMNS, if_not_exists=True)
        # Parts come back in their stored (exact) form: quoted, they name exactly that.
        parts = ['"' + info[k].replace('"', '""') + '"' for k in ("database", "schema", "table")]
        handle = client.open_channel(OpenChannelRequest(channel, *parts))
        handle.insert_rows([{"ID": n} for n in range(count)], end_offset_token=str(count - 1))
        assert handle.wait_for_commit(timeout=30) == str(count - 1)
        return info["location"]


async def test_creating_an_existing_table_changes_nothing(server, http):
    location = fill(server.url, "db.s.t", "c1", 1000)
    before = tree(Path(location))
    status, body = await call(http, "POST", "/v1/tables", json={"name": "db.s.t", "columns": COLUMNS})
    assert status == 409 and body["error"]["code"] == "TABLE_EXISTS", body
    assert "if_not_exists" in body["error"]["message"]
    assert row_count(location) == 1000
    assert tree(Path(location)) == before
    status, body = await call(http, "POST", "/v1/channels/status",
                              json={"channels": [{"table": "db.s.t", "channel": "c1"}]})  # fmt: skip
    assert body["channels"][0]["offset_token"] == "999"
    # A create with other columns is refused the same way, and if_not_exists keeps the table.
    status, body = await call(http, "POST", "/v1/tables", json={
        "name": "db.s.t", "columns": {"X": "INT"}, "if_not_exists": True})  # fmt: skip
    assert status == 200 and body["created"] is False and "ID" in body["columns"]
    assert row_count(location) == 1000


@pytest.mark.parametrize(
    "name",
    ['"..".".."."X"', '"."."."."."', 'DB.PUBLIC."."', '"X"."..".".."', '"..".S.T', 'a.b.".."',
     'a.b."x\x00y"', 'a.b."line\nbreak"', 'a.b."cr\rx"', 'a.b."\u202eevil"', 'a.b."zero\u200bwidth"',
     f'a.b."{"x" * 256}"', 'a.b.""', 'a.b."   "', "a.b", "a.b.c.d", "", "...", 'a.b."\ud800"'],
)  # fmt: skip
async def test_names_that_cannot_be_table_names_are_refused_and_touch_nothing(
    server, http, tmp_path, name
):
    fill(server.url, "x.s.t", "c1", 3)  # a table with neighbours a bad name could reach
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    before = tree(tmp_path)
    body = {"name": name, "columns": COLUMNS}
    status, answer = await call(http, "POST", "/v1/tables", data=_json(body),
                                headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 400, answer
    assert answer["error"]["code"] in ("SCHEMA_ERROR", "BAD_REQUEST"), answer
    for method, path in (("DELETE", f"/v1/tables/{_quote(name)}"),
                         ("GET", f"/v1/tables/{_quote(name)}")):  # fmt: skip
        status, answer = await call(http, method, path)
        assert 400 <= status < 500, answer
    assert tree(tmp_path) == before


def _json(value) -> bytes:
    import json

    return json.dumps(value).encode("utf-8", "surrogatepass")


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name.encode("utf-8", "surrogatepass"), safe="")


@pytest.mark.parametrize(
    "part",
    ["with space", "slash/inside", "back\\slash", 'quote""d', "emoji 😀🚀", "дані", "x" * 255,
     "dots.in.the.middle", "..hidden", "%2e%2e", "CON", "nul"],
)  # fmt: skip
async def test_unusual_names_are_working_tables_inside_the_warehouse(server, http, part):
    name = f'db.s."{part}"'
    location = fill(server.url, name, "c1", 5)
    warehouse = Path(server.config.warehouse).resolve()
    assert Path(location).resolve().parent.parent.parent == warehouse
    assert row_count(location) == 5
    status, body = await call(http, "GET", f"/v1/tables/{_quote(name)}")
    assert status == 200 and body["table"] == part.replace('""', '"')
    status, body = await call(http, "DELETE", f"/v1/tables/{_quote(name)}")
    assert status == 200, body
    assert not Path(location).exists()
    assert warehouse.exists() and (warehouse / "catalog.sqlite").exists()


async def test_drop_deletes_only_a_table_folder_of_the_warehouse(server, tmp_path):
    """A catalog entry pointing elsewhere (made by an older version from a name like
    '"..".".."."X"') is dropped from the catalog, but its folder is left alone."""
    service = server.service
    victim = tmp_path / "victim"
    (victim / "_delta_log").mkdir(parents=True)
    (victim / "data.parquet").write_text("not ours")
    warehouse = Path(server.config.warehouse)
    from ingest_sdk import TableSchema

    server.call(service.catalog.create_table, "OLD", "S", "T", str(warehouse / ".." / "victim"),
                TableSchema.parse(COLUMNS))  # fmt: skip
    server.run(service.drop_table("old.s.t"))
    assert (victim / "data.parquet").read_text() == "not ours"
    assert not drop_table(str(warehouse / "DB"), warehouse)  # a schema-level folder: refused
    assert not drop_table(str(warehouse), warehouse)
    assert warehouse.exists()


async def test_a_failed_create_leaves_nothing_behind(server, http):
    warehouse = Path(server.config.warehouse)
    before = tree(warehouse)
    reserved = {"name": "db.s.t", "columns": {"_INGEST_ROW_ID": "INT"}}
    status, body = await call(http, "POST", "/v1/tables", json=reserved)
    assert status == 400, body
    assert {p for p in tree(warehouse) if "_delta_log" in p} == {
        p for p in before if "_delta_log" in p
    }


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [("batch_seq", str(2**40), "batch_seq"), ("batch_seq", str(2**64), "batch_seq"),
     ("batch_seq", "-1", "batch_seq"), ("batch_seq", "1e3", "batch_seq"), ("batch_seq", "٣", "batch_seq"),
     ("generation", str(2**23), "generation"), ("generation", "0", "generation"),
     ("batch_seq", "9" * 5000, "batch_seq")],
)  # fmt: skip
async def test_channel_positions_out_of_range_are_refused(server, http, where, value, message):
    location = fill(server.url, "db.s.t", "c1", 3)
    query = {"table": "db.s.t", "channel": "c1", "generation": "2", "batch_seq": "1", where: value}
    status, body = await call(http, "POST", "/v1/channels/rows", params=query,
                              json={"rows": [{"ID": 7}]})  # fmt: skip
    assert status == 400 and message in body["error"]["message"], body
    assert row_count(location) == 3


@pytest.mark.parametrize("seq", [2**40, 2**64, -5])
async def test_wait_with_a_position_out_of_range_is_a_400(server, http, seq):
    fill(server.url, "db.s.t", "c1", 3)
    status, body = await call(http, "POST", "/v1/channels/wait", json={
        "table": "db.s.t", "channel": "c1", "generation": 1, "batch_seq": seq})  # fmt: skip
    assert status == 400, body


async def raw_request(url: str, head: bytes, body: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 request written byte for byte (aiohttp would re-encode headers)."""
    import asyncio
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def test_an_offset_token_that_is_not_utf8_is_refused_and_the_table_keeps_committing(
    server, http
):
    location = fill(server.url, "db.s.t", "c1", 3)
    status, opened = await call(http, "POST", "/v1/channels/open",
                                json={"table": "db.s.t", "channel": "bad"})  # fmt: skip
    head = (b"POST /v1/channels/rows?table=db.s.t&channel=bad HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/vnd.apache.arrow.stream\r\n"
            b"%s: %d\r\n%s: 1\r\n%s: tok\xff\r\n" % (
                HEADER_GENERATION.encode(), opened["generation"], HEADER_BATCH_SEQ.encode(),
                HEADER_END_OFFSET_TOKEN.encode()))  # fmt: skip
    status, body = await raw_request(server.url, head, b"")
    assert status == 400 and b"UTF-8" in body, body
    # The same token in a JSON body (as an escaped lone surrogate) is refused too.
    status, answer = await call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=bad&generation=1&batch_seq=1",
                                data=b'{"rows": [], "end_offset_token": "tok\\udcff"}',
                                headers={"Content-Type": "application/json"})  # fmt: skip
    assert status == 400, answer
    # The table still commits for everyone.
    fill(server.url, "db.s.t", "c2", 4)
    assert row_count(location) == 7


async def test_one_channel_that_cannot_commit_does_not_stop_the_others(server):
    """Defence in depth behind the door: a position the commit cannot carry, put straight
    into the service, invalidates that channel and the table goes on committing."""
    import pyarrow as pa

    location = fill(server.url, "db.s.t", "good", 2)
    service = server.service
    bad = server.run(service.channels.open("db.s.t", "bad"))
    data = pa.table({"ID": pa.array([100], pa.int64()), "S": pa.array(["x"])})
    schema = bad.table.info.schema.to_arrow()
    server.call(service.channels.insert, "db.s.t", "bad", bad.generation, 2**41, data.cast(schema), "t")
    with StreamingIngestClient("t", url=server.url, max_client_lag=0.1) as client:
        handle = client.open_channel(OpenChannelRequest("good", "DB", "S", "T"))
        handle.insert_rows([{"ID": 2}], end_offset_token="2")
        assert handle.wait_for_commit(timeout=30) == "2"
    assert row_count(location) == 3
    assert not bad.valid and "cannot be committed" in bad.invalid_reason


GZIP_ENDPOINTS = [
    ("POST", "/v1/tables"), ("POST", "/v1/channels/open"), ("POST", "/v1/channels/wait"),
    ("POST", "/v1/channels/close"), ("POST", "/v1/channels/status"), ("POST", "/v1/channels/drop"),
    ("POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=2"),
    ("PUT", "/v1/tables/db.s.t/clustering"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path"), GZIP_ENDPOINTS)
async def test_a_body_that_is_not_what_its_content_encoding_says_is_a_400(
    server, http, method, path
):
    location = fill(server.url, "db.s.t", "c0", 3)
    status, opened = await call(http, "POST", "/v1/channels/open",
                                json={"table": "db.s.t", "channel": "c1"})  # fmt: skip
    assert opened["generation"] == 1
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    status, body = await call(http, method, path, data=b"this is not gzip", headers=headers)
    assert status == 400 and "Content-Encoding" in body["error"]["message"], body
    # A real gzip body is read as JSON.
    status, body = await call(http, "POST", "/v1/channels/status", headers=headers,
                              data=gzip.compress(b'{"channels": []}'))  # fmt: skip
    assert status == 200 and body == {"channels": []}
    assert row_count(location) == 3


@pytest.mark.parametrize("zone", ["x" * 300, "../../etc/passwd", "Europe/Nowhere", "\x00", "", 5])
async def test_bad_default_timezones_are_a_400(server, http, zone):
    fill(server.url, "db.s.t", "c1", 1)
    status, body = await call(http, "POST", "/v1/channels/open",
                              json={"table": "db.s.t", "channel": "z", "default_timezone": zone})  # fmt: skip
    assert status == 400, body
    assert "default_timezone" in body["error"]["message"] or "zone" in body["error"]["message"]


@pytest.mark.parametrize(
    "name", ["", " ", "x" * 513, "tab\x00", "new\nline", "\u202eltr", "\udc80"]
)
async def test_bad_channel_names_are_a_400(server, http, name):
    fill(server.url, "db.s.t", "c1", 1)
    status, body = await call(http, "POST", "/v1/channels/open", headers={"Content-Type": "application/json"},
                              data=_json({"table": "db.s.t", "channel": name}))  # fmt: skip
    assert status == 400, body


async def test_error_codes_say_what_happened(server, http):
    fill(server.url, "db.s.t", "c1", 1)
    rows = {"json": {"rows": []}}
    status, body = await call(http, "POST", "/v1/channels/rows?table=db.s.never&channel=c1&generation=1&batch_seq=1", **rows)
    assert (status, body["error"]["code"]) == (404, "TABLE_NOT_FOUND")
    assert "dropped" not in body["error"]["message"]
    status, body = await call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=nobody&generation=1&batch_seq=1", **rows)
    assert (status, body["error"]["code"]) == (404, "CHANNEL_NOT_FOUND")
    status, body = await call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=7&batch_seq=1", **rows)
    assert (status, body["error"]["code"]) == (409, "CHANNEL_INVALIDATED")
    assert "generation 7 was never opened" in body["error"]["message"]
    assert "was reopened" not in body["error"]["message"]
    # Dropped: now the message says so.
    await call(http, "POST", "/v1/channels/drop", json={"table": "db.s.t", "channel": "c1"})
    status, body = await call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=1", **rows)
    assert (status, body["error"]["code"]) == (409, "CHANNEL_INVALIDATED")
    assert "was dropped" in body["error"]["message"]
    await call(http, "DELETE", "/v1/tables/db.s.t")
    status, body = await call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=c1&generation=1&batch_seq=1", **rows)
    assert (status, body["error"]["code"]) == (409, "CHANNEL_INVALIDATED")
    assert "was dropped" in body["error"]["message"]


def test_the_table_folder_name_is_safe_for_any_name(tmp_path):
    from flush import new_table_folder

    for part in ["..", "a/b", "x" * 1000, "😀", "\\", "."]:
        folder = Path(new_table_folder(tmp_path, part, part, part))
        assert folder.parent.parent.parent == tmp_path.resolve()
        assert all(len(p.encode()) <= 64 for p in folder.relative_to(tmp_path.resolve()).parts)
        key = new_table_folder("s3://bucket/wh", part, part, part)  # a prefix of the same shape
        below = key.removeprefix("s3://bucket/wh/").split("/")
        assert len(below) == 3 and not {"", ".", ".."} & set(below), key
        assert all(len(p.encode()) <= 64 for p in below)
    assert new_table_folder(tmp_path, "a", "b", "c") != new_table_folder(tmp_path, "a", "b", "c")
    assert os.sep not in Path(new_table_folder(tmp_path, "a", "b", "c/d")).name


@pytest.mark.parametrize("uri", [
    "s3://bucket/wh/a/b/c-1", "s3://bucket/wh/a/b/c-1/", "s3://bucket/wh/a/b", "s3://bucket/wh/a/b/c/d",
    "s3://bucket/wh/../b/c", "s3://bucket/whx/a/b/c", "s3://other/wh/a/b/c", "/tmp/wh/a/b/c",
])  # fmt: skip
def test_only_a_table_prefix_of_the_bucket_warehouse_is_ever_deleted(uri):
    from flush.tables import _is_table_folder

    assert _is_table_folder(uri, "s3://bucket/wh") == (uri == "s3://bucket/wh/a/b/c-1")


@pytest.mark.parametrize(
    "declaration",
    ["VARCHAR(" + "9" * 5000 + ")", "NUMBER(" + "9" * 5000 + ", 2)", "NUMBER(38, " + "1" * 4400 + ")",
     "TIMESTAMP_NTZ(" + "7" * 20 + ")", "VARCHAR(٣)", "VARCHAR(" + "(" * 1000 + ")"],
)  # fmt: skip
async def test_absurd_type_parameters_are_a_400(server, http, declaration):
    status, body = await call(http, "POST", "/v1/tables",
                              json={"name": "db.s.t", "columns": {"C": declaration}})  # fmt: skip
    assert status == 400, body
    assert len(body["error"]["message"]) < 500  # the message does not echo 5,000 digits
    assert not list(Path(server.config.warehouse).rglob("_delta_log"))


@pytest.mark.parametrize("column", ['"a\x00b"', '"a\nb"', '"\u202eabc"', '" "', '"' + "x" * 256 + '"', '"."'])
async def test_column_names_follow_the_rules_of_table_names(server, http, column):
    status, body = await call(http, "POST", "/v1/tables",
                              json={"name": "db.s.t", "columns": {column: "INT"}})  # fmt: skip
    assert status == 400 and "column name" in body["error"]["message"], body
    assert not list(Path(server.config.warehouse).rglob("_delta_log"))


async def test_column_names_with_punctuation_and_spaces_work(server, http, spark):
    columns = {'"a b"': "INT", '"x,y;z{}()="': "VARCHAR", '"ünï😀"': "INT"}
    status, body = await call(http, "POST", "/v1/tables", json={"name": "db.s.t", "columns": columns})
    assert status == 201, body
    status, _ = await call(http, "POST", "/v1/channels/open", json={"table": "db.s.t", "channel": "c"})
    assert status == 200
    status, answer = await call(http, "POST", "/v1/channels/rows?table=db.s.t&channel=c&generation=1&batch_seq=1",
                                json={"rows": [{'"a b"': 1, '"x,y;z{}()="': "v", '"ünï😀"': 2}]})  # fmt: skip
    assert status == 200 and answer["accepted_rows"] == 1, answer
    status, answer = await call(http, "POST", "/v1/channels/close", json={"table": "db.s.t", "channel": "c", "generation": 1})
    assert answer["closed"], answer
    from flush.spark_tables import read_delta

    (row,) = read_delta(spark, body["location"]).collect()
    assert (row["a b"], row["x,y;z{}()="], row["ünï😀"]) == (1, "v", 2)
