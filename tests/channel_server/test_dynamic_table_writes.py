"""Only its refreshes write a dynamic table: the service refuses a channel on one and a
drop of one (409 ``DYNAMIC_TABLE_READ_ONLY``), and the Spark sink refuses to append to
one, each at the door, naming the cause and the fix, with nothing changed; the service
goes on serving the tables it may write.

(SQL DML into a dynamic table is refused by the session: ``tests/pipelines``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from catalog import SqliteCatalog
from flush import read_table
from pipelines import Session
from pipelines.errors import InvalidOptionError
from pipelines.spark_sources.source_options import source_errors
from tests.http_calls import call

T, D = "DB.PUBLIC.T", "DB.PUBLIC.D"
#: A streaming query that has not finished after this long has hung.
STREAM_TIMEOUT = 180


@pytest.fixture
def warehouse(tmp_path, spark):
    """A warehouse where a session made T (rows 1, 2, 3) and the dynamic table D over it.

    D is suspended once made, so no scheduled refresh moves it while a test watches it
    (the rows the tests stream into T would give a refresh something to write).
    """
    path = tmp_path / "warehouse"
    session = Session(path, spark=spark)
    try:
        session.sql("CREATE TABLE T (ID NUMBER)")
        session.sql("INSERT INTO T VALUES (1), (2), (3)")
        session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS SELECT ID FROM T")
        session.sql("ALTER DYNAMIC TABLE D SUSPEND")
    finally:
        session.close()
    return path


@pytest.fixture
def server(server_factory, warehouse):
    """The service on that warehouse (the ``http`` fixture talks to it)."""
    return server_factory(warehouse=warehouse)


def snapshot(warehouse: Path, name: str = "D") -> tuple:
    """Everything a write could change of a table: its catalog rows (table, dynamic
    definition and refresh state, channels, refresh history), its Delta version, its
    rows (row ids included) and its folder's files."""
    catalog = SqliteCatalog(warehouse / "catalog.sqlite")
    try:
        info = catalog.get_table("DB", "PUBLIC", name)
        catalog_rows = (
            info,
            catalog.get_dynamic_table(info.id),
            catalog.list_channels(info.id),
            catalog.list_refreshes(info.id),
        )
    finally:
        catalog.close()
    table = DeltaTable(info.uri)
    rows = sorted(tuple(row.values()) for row in read_table(table).to_pylist())
    files = sorted(str(p.relative_to(info.uri)) for p in Path(info.uri).rglob("*"))
    return catalog_rows, table.version(), rows, files


def ids(warehouse: Path, name: str) -> list[int]:
    uri = snapshot(warehouse, name)[0][0].uri
    return sorted(int(v) for v in read_table(DeltaTable(uri)).column("ID").to_pylist())


async def open_channel(http, table: str, channel: str) -> int:
    status, body, _ = await call(http, "POST", "/v1/channels/open",
                                 json={"table": table, "channel": channel})  # fmt: skip
    assert status == 200, body
    return int(body["generation"])


async def insert_and_wait(http, channel: str, generation: int, seq: int, ids: list[int]) -> None:
    """Rows into T through a channel batch, waited for until committed."""
    token = str(ids[-1])
    status, body, _ = await call(
        http, "POST",
        f"/v1/channels/rows?table={T}&channel={channel}&generation={generation}&batch_seq={seq}",
        json={"rows": [{"id": i} for i in ids], "end_offset_token": token},
    )  # fmt: skip
    assert status == 200 and body["accepted_rows"] == len(ids), body
    status, body, _ = await call(http, "POST", "/v1/channels/wait", json={
        "table": T, "channel": channel, "generation": generation, "batch_seq": seq,
        "timeout": 30})  # fmt: skip
    assert status == 200 and body["committed"] and body["offset_token"] == token, body


def assert_refused(status: int, body: dict) -> str:
    assert status == 409, body
    assert body["error"]["code"] == "DYNAMIC_TABLE_READ_ONLY", body
    message = str(body["error"]["message"])
    assert message.startswith(f"{D} is a dynamic table: "), message
    assert "nothing was changed" in message
    return message


async def test_a_channel_on_a_dynamic_table_is_refused_and_other_channels_go_on(
    http, server, warehouse
):
    before = snapshot(warehouse)
    generation = await open_channel(http, T, "c1")
    await insert_and_wait(http, "c1", generation, 1, [4])
    # Any spelling of the name; extra open fields change nothing.
    for request in ({"table": D, "channel": "c1"},
                    {"table": "db.public.d", "channel": "p0", "on_error": "CONTINUE",
                     "max_client_lag": "1 second"}):  # fmt: skip
        message = assert_refused(*(await call(http, "POST", "/v1/channels/open", json=request))[:2])
        assert "only its refreshes write it, so no channel can be opened on it" in message
        # The fix: its source, and the refresh that brings the rows over.
        assert f"Insert the rows into the tables its query reads ({T})" in message
        assert f"ALTER DYNAMIC TABLE {D} REFRESH through POST /v1/sql" in message
    # With no handle, rows cannot reach it either.
    status, body, _ = await call(
        http, "POST", f"/v1/channels/rows?table={D}&channel=c1&generation=1&batch_seq=1",
        json={"rows": [{"id": 9}], "end_offset_token": "9"},
    )  # fmt: skip
    assert status == 404 and body["error"]["code"] == "CHANNEL_NOT_FOUND", body
    status, body, _ = await call(http, "GET", f"/v1/channels?table={D}")
    assert status == 200 and body["channels"] == [], body
    assert before[0][0].id not in server.service.channels.live_tables  # no table state, no flusher
    # T's open handle was not disturbed, and a new channel opens and commits.
    await insert_and_wait(http, "c1", generation, 2, [5])
    await insert_and_wait(http, "c2", await open_channel(http, T, "c2"), 1, [6, 7])
    assert ids(warehouse, "T") == [1, 2, 3, 4, 5, 6, 7]
    assert snapshot(warehouse) == before
    assert ids(warehouse, "D") == [1, 2, 3]


async def test_dropping_a_dynamic_table_over_http_is_refused(http, warehouse):
    before = snapshot(warehouse)
    for name in (D, "db.public.d"):
        message = assert_refused(*(await call(http, "DELETE", f"/v1/tables/{name}"))[:2])
        assert "DELETE /v1/tables refuses it, as SQL's DROP TABLE does" in message
        assert f"DROP DYNAMIC TABLE {D} through POST /v1/sql" in message
    assert snapshot(warehouse) == before  # the definition and the history stay too
    status, body, _ = await call(http, "GET", f"/v1/tables/{D}")
    assert status == 200 and body["name"] == D, body
    # The next drop, of a plain table, goes through.
    status, body, _ = await call(http, "POST", "/v1/tables",
                                 json={"name": "DB.PUBLIC.X", "columns": {"ID": "INT"}})  # fmt: skip
    assert status == 201, body
    status, body, _ = await call(http, "DELETE", "/v1/tables/DB.PUBLIC.X")
    assert status == 200 and body == {"dropped": "DB.PUBLIC.X"}, body
    assert snapshot(warehouse) == before


def test_the_spark_sink_refuses_a_dynamic_table_before_any_task(spark, warehouse, tmp_path):
    before = snapshot(warehouse)
    before_t = snapshot(warehouse, "T")
    frame = spark.createDataFrame([(9,)], "ID long")
    batch = (frame.write.format("ingest").option("warehouse", str(warehouse))
             .option("table", "D").mode("append"))  # fmt: skip
    stream = (
        spark.readStream.format("ingest-changes").option("warehouse", str(warehouse))
        .option("table", "T").load().select("ID").writeStream.format("ingest")
        .option("warehouse", str(warehouse)).option("table", "db.public.d")
        .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True)
    )  # fmt: skip

    def run_stream() -> None:
        query = stream.start()
        try:
            assert query.awaitTermination(STREAM_TIMEOUT), "the streaming query hung"
        finally:
            query.stop()

    for write in (batch.save, run_stream):
        with pytest.raises(InvalidOptionError) as refused, source_errors():
            write()
        message = str(refused.value)
        assert message.startswith(
            f"ingest: {D} is a dynamic table: only its refreshes write it, so the sink cannot "
            "append to it, and nothing was written"
        ), message
        assert f"ALTER DYNAMIC TABLE {D} REFRESH" in message
        assert "name a table that is not dynamic in the option table" in message
        assert refused.value.code == "INVALID_OPTION"
    assert snapshot(warehouse) == before
    assert snapshot(warehouse, "T") == before_t
