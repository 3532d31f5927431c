"""The SDK against a real server on a loopback port, with real Delta tables."""

import threading
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flush import ROW_ID_COLUMN
from flush.spark_tables import read_delta
from ingest_sdk import (
    AsyncStreamingIngestClient,
    ChannelClosedError,
    ChannelInvalidatedError,
    CommitTimeoutError,
    InsertValidationError,
    InvalidValueError,
    OnErrorOption,
    OpenChannelRequest,
    SchemaError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnsupportedFeatureError,
)

ALL_TYPES = {
    "ID": "NUMBER(18,0) NOT NULL", "BIG": "INT", "AMOUNT": "NUMBER(10,2)", "F": "FLOAT",
    "S": "VARCHAR(20)", "BIN": "BINARY", "OK": "BOOLEAN", "D": "DATE", "T": "TIME(6)",
    "NTZ": "TIMESTAMP_NTZ(6)", "LTZ": "TIMESTAMP_LTZ(6)", "TZ": "TIMESTAMP_TZ(3)",
    "V": "VARIANT", "O": "OBJECT", "A": "ARRAY",
}  # fmt: skip
ROW = {
    "ID": 1, "BIG": 10**30, "AMOUNT": "12.345", "F": 0.5, "S": "héllo", "BIN": "cafe",
    "OK": "yes", "D": "2013-04-28", "T": "20:57:01.123456", "NTZ": "2013-04-28 20:57:01.5",
    "LTZ": "2013-04-28T20:57:01+07:00", "TZ": "2013-04-28 20:57:01.1239", "V": {"k": [1, 2]},
    "O": '{"b": 1}', "A": 7,
}  # fmt: skip
EXPECTED = {
    "ID": 1, "BIG": Decimal(10**30), "AMOUNT": Decimal("12.35"), "F": 0.5, "S": "héllo",
    "BIN": b"\xca\xfe", "OK": True, "D": date(2013, 4, 28), "T": "20:57:01.123456",
    "NTZ": datetime(2013, 4, 28, 20, 57, 1, 500000),
    "LTZ": datetime(2013, 4, 28, 13, 57, 1, tzinfo=UTC),
    "TZ": datetime(2013, 4, 29, 3, 57, 1, 123000, tzinfo=UTC),
    "V": '{"k":[1,2]}', "O": '{"b":1}', "A": "[7]",
}  # fmt: skip


def table_rows(uri, *columns):
    table = DeltaTable(uri).to_pyarrow_table()
    rows = table.sort_by(ROW_ID_COLUMN).to_pylist()
    return [tuple(row[c] for c in columns) if columns else row for row in rows]


def request(channel="c1", table="T", **kwargs):
    return OpenChannelRequest(channel, "DB", "S", table, **kwargs)


def test_every_type_round_trips_through_delta_rs_and_spark(server, client_factory, spark):
    client = client_factory(server.url)
    info = client.create_table("db.s.t", ALL_TYPES)
    channel = client.open_channel(request())
    channel.insert_rows([ROW, {"ID": 2}], end_offset_token="2")
    assert channel.wait_for_commit(timeout=30) == "2"
    rows = table_rows(info["location"])
    assert [r[ROW_ID_COLUMN] for r in rows] == [0, 1]  # stable row ids in insert order
    assert {k: v for k, v in rows[0].items() if k != ROW_ID_COLUMN} == EXPECTED
    assert rows[1]["ID"] == 2 and rows[1]["V"] is None
    frame = read_delta(spark, info["location"]).orderBy("ID")
    spark_row = frame.collect()[0].asDict()
    assert spark_row["BIG"] == Decimal(10**30) and spark_row["D"] == date(2013, 4, 28)
    assert spark_row["NTZ"] == datetime(2013, 4, 28, 20, 57, 1, 500000)
    assert spark_row["LTZ"] == datetime(2013, 4, 28, 13, 57, 1)  # session zone is UTC
    assert dict(frame.dtypes)["TZ"] == "timestamp" and dict(frame.dtypes)["NTZ"] == "timestamp_ntz"


def test_table_ddl(server, client_factory):
    client = client_factory(server.url)
    created = client.create_table("Db.New.Tab", {"ID": "INT"})
    assert created["name"] == "DB.NEW.TAB" and created["created"] is True
    again = client.create_table("db.new.tab", {"ID": "INT"}, if_not_exists=True)
    assert again["created"] is False
    with pytest.raises(TableAlreadyExistsError, match="already exists"):
        client.create_table("db.new.tab", {"ID": "INT"})
    assert client.describe_table("DB.NEW.TAB")["columns"] == {"ID": "NUMBER(38,0)"}
    assert [t["name"] for t in client.list_tables()] == ["DB.NEW.TAB"]
    typo = r"table DB\.NEW\.TBA does not exist \(did you mean DB\.NEW\.TAB\?\); create it"
    with pytest.raises(TableNotFoundError, match=typo):
        client.describe_table("db.new.tba")
    with pytest.raises(TableNotFoundError, match=typo):
        client.open_channel(OpenChannelRequest("c", "DB", "NEW", "TBA"))
    with pytest.raises(TableNotFoundError) as elsewhere:  # never a table of another schema
        client.describe_table("db.old.tab")
    assert "did you mean" not in str(elsewhere.value)
    with pytest.raises(UnsupportedFeatureError, match="GEOGRAPHY"):
        client.create_table("db.new.geo", {"G": "GEOGRAPHY"})
    with pytest.raises(SchemaError, match=r"DATABASE\.SCHEMA\.TABLE"):
        client.create_table("notqualified", {"ID": "INT"})
    client.drop_table("db.new.tab")
    with pytest.raises(TableNotFoundError, match="does not exist"):
        client.describe_table("db.new.tab")
    with pytest.raises(TableNotFoundError):
        client.open_channel(OpenChannelRequest("c", "DB", "NEW", "TAB"))


def test_offset_tokens_advance_only_after_commit(server, client_factory):
    client = client_factory(server.url, max_client_lag=3.0)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    assert channel.get_latest_committed_offset_token() is None  # NULL on a new channel
    channel.insert_rows([{"ID": 1}], end_offset_token="t1")
    # Buffered for up to 3 s: not committed, so not reported.
    assert channel.get_latest_committed_offset_token() is None
    assert channel.wait_for_commit("t1", timeout=30) == "t1"
    assert channel.get_latest_committed_offset_token() == "t1"


async def test_wait_for_commit_finds_every_token_of_a_coalesced_request(server):
    async with AsyncStreamingIngestClient("c", url=server.url, max_client_lag=0.2) as client:
        await client.create_table("db.s.t", {"ID": "INT"})
        channel = await client.open_channel(request())
        # No await yields between these, so the sender sends all 200 in one request.
        for i in range(200):
            await channel.insert_rows([{"ID": i}], end_offset_token=str(i))
        assert await channel.wait_for_commit("17", timeout=30) == "199"
        assert channel._acked_seq == 1  # one request carried every token


async def test_a_request_body_over_a_mebibyte_is_sent_without_a_warning(server):
    """aiohttp warns (ResourceWarning, an error under this suite's filterwarnings) when
    handed raw bytes over 1 MiB; the transport sends a stream instead."""
    async with AsyncStreamingIngestClient("c", url=server.url, max_client_lag=0.2) as client:
        await client.create_table("db.s.big", {"ID": "INT", "S": "VARCHAR"})
        channel = await client.open_channel(request(table="BIG"))
        rows = [{"ID": i, "S": "x" * 1000} for i in range(3000)]  # ~3 MB in one request
        await channel.insert_rows(rows, end_offset_token="last")
        assert await channel.wait_for_commit("last", timeout=60) == "last"
        assert channel._acked_seq == 1


def test_wait_for_commit_times_out_clearly(server, client_factory):
    client = client_factory(server.url, max_client_lag=10.0)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    channel.insert_rows([{"ID": 1}], end_offset_token="t1")
    with pytest.raises(CommitTimeoutError, match=r"not committed within 0\.3"):
        channel.wait_for_commit(timeout=0.3)
    with pytest.raises(ValueError, match="never inserted"):
        channel.wait_for_commit("unknown-token", timeout=5)


@pytest.mark.parametrize(
    ("token", "message"),
    [("tok\udcff", "UTF-8"), ("a\x00b", "NUL"), ("x" * 2049, "at most 2048"), (5, "must be a str")],
)
def test_offset_tokens_the_commit_cannot_carry_are_refused_before_sending(
    server, client_factory, token, message
):
    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    with pytest.raises(ValueError, match=message):
        channel.insert_rows([{"ID": 1}], end_offset_token=token)
    channel.insert_rows([{"ID": 2}], end_offset_token="2")  # the channel is still usable
    assert channel.wait_for_commit(timeout=30) == "2"
    assert table_rows(info["location"], "ID") == [(Decimal(2),)]


def test_empty_insert_commits_its_token(server, client_factory):
    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    channel.insert_rows([{"ID": 1}], end_offset_token="1")
    channel.insert_rows([], end_offset_token="5")  # records 2..5 were filtered out
    assert channel.wait_for_commit(timeout=30) == "5"
    assert table_rows(info["location"], "ID") == [(Decimal(1),)]


def test_on_error_modes_through_the_whole_path(server, client_factory):
    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"ID": "INT NOT NULL", "S": "VARCHAR(3)"})
    good, bad = {"ID": 1, "S": "ok"}, {"ID": 2, "S": "toolong"}

    cont = client.open_channel(request("cont", on_error=OnErrorOption.CONTINUE))
    response = cont.insert_rows([good, bad], end_offset_token="a")
    assert [e.row_index for e in response.insert_errors] == [1]
    assert cont.wait_for_commit(timeout=30) == "a"  # CONTINUE advances the token

    skip = client.open_channel(request("skip", on_error="SKIP_BATCH"))
    response = skip.insert_rows([{"ID": 3, "S": "x"}, bad], end_offset_token="b")
    assert response.error_row_count == 1 and response.inserted_row_count == 0
    assert skip.wait_for_commit(timeout=30) is None  # nothing queued, no token

    abort = client.open_channel(request("abort"))
    with pytest.raises(InsertValidationError) as info_error:
        abort.insert_rows([{"ID": 4, "S": "y"}, bad], end_offset_token="c")
    assert info_error.value.row_index == 1
    abort.insert_rows([{"ID": 5, "S": "z"}], end_offset_token="d")  # the channel still works
    assert abort.wait_for_commit(timeout=30) == "d"
    assert sorted(table_rows(info["location"], "ID")) == [(Decimal(1),), (Decimal(5),)]


def test_insert_batch_takes_arrow_and_pandas(server, client_factory):
    import pandas as pd

    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"ID": "INT NOT NULL", "S": "VARCHAR(3)", "X": "FLOAT"})
    channel = client.open_channel(request())
    channel.insert_batch(pa.record_batch({"id": [1, 2], "s": ["a", "b"]}), end_offset_token="1")
    channel.insert_batch(pa.table({"ID": [3], "X": [0.5]}))
    channel.insert_batch(pd.DataFrame({"Id": [4], "S": ["c"]}), end_offset_token="4")
    with pytest.raises(InvalidValueError, match=r'Row 1, column "S".*longer than 3'):
        channel.insert_batch(pa.table({"ID": [5, 6], "S": ["ok", "long"]}))
    assert channel.wait_for_commit(timeout=30) == "4"
    assert table_rows(info["location"], "ID", "S") == [
        (Decimal(1), "a"),
        (Decimal(2), "b"),
        (Decimal(3), None),
        (Decimal(4), "c"),
    ]


def test_reopen_invalidates_the_old_handle_and_discards_its_buffer(server, client_factory):
    slow = client_factory(server.url, max_client_lag=30.0)
    info = slow.create_table("db.s.t", {"ID": "INT"})
    old = slow.open_channel(request())
    old.insert_rows([{"ID": 1}, {"ID": 2}], end_offset_token="2")
    server_channel = server.call(lambda: dict(server.service.channels.live_tables))  # wait until the server has them
    assert server_channel
    fast = client_factory(server.url)
    new = fast.open_channel(request())
    assert new.generation == old.generation + 1
    assert new.get_latest_committed_offset_token() is None  # the old rows never committed
    new.insert_rows([{"ID": 10}], end_offset_token="10")
    assert new.wait_for_commit(timeout=30) == "10"
    with pytest.raises(ChannelInvalidatedError, match="reopened"):
        old.insert_rows([{"ID": 3}])
        old.wait_for_commit(timeout=30)
    assert not old.is_valid()
    assert table_rows(info["location"], "ID") == [(Decimal(10),)]


def test_a_wait_an_earlier_answer_already_covered_asks_the_server_nothing(server, client_factory):
    """Each batch of a handle commits in order, so one answer that batch_seq N is committed
    answers every later wait up to N: a producer waiting for each batch in turn makes one
    round trip per commit."""
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    transport = channel._channel._client.transport
    asked = []
    send = transport.request

    async def counted(method, path, **kwargs):
        asked.append(path)
        return await send(method, path, **kwargs)

    transport.request = counted
    for n in range(3):
        channel.insert_rows([{"ID": n}], end_offset_token=str(n))
    assert channel.wait_for_commit(timeout=30) == "2"
    waits = asked.count("/v1/channels/wait")
    assert channel.wait_for_commit("0", timeout=30) == "2"  # committed with "2", answered then
    assert channel.wait_for_commit("1", timeout=30) == "2"
    assert asked.count("/v1/channels/wait") == waits
    channel.insert_rows([{"ID": 3}], end_offset_token="3")
    assert channel.wait_for_commit("3", timeout=30) == "3"  # a new position: the server says
    assert asked.count("/v1/channels/wait") > waits


def test_close_flushes_and_returns_once_committed(server, client_factory):
    client = client_factory(server.url, max_client_lag=30.0)
    info = client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    channel.insert_rows([{"ID": 1}], end_offset_token="1")
    channel.close()  # does not wait 30 s: close flushes now
    assert channel.is_closed()
    assert table_rows(info["location"], "ID") == [(Decimal(1),)]
    with pytest.raises(ChannelClosedError):
        channel.insert_rows([{"ID": 2}])
    status = client.get_latest_committed_offset_tokens([("db.s.t", "c1")])[0]
    assert (status.status, status.offset_token) == ("OK", "1")


def test_two_producers_on_two_channels_of_one_table(server, client_factory):
    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"P": "INT", "N": "INT"})

    def produce(name):
        channel = client.open_channel(request(name))
        for start in range(0, 500, 50):
            channel.insert_rows([{"P": int(name[-1]), "N": n} for n in range(start, start + 50)],
                                end_offset_token=str(start + 49))  # fmt: skip
        assert channel.wait_for_commit(timeout=60) == "499"

    threads = [threading.Thread(target=produce, args=(f"p{i}",)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = table_rows(info["location"], "P", "N")
    for producer in (1, 2):
        numbers = [n for p, n in rows if p == producer]
        assert numbers == [Decimal(n) for n in range(500)]  # all, once, in order per channel


def test_hundred_channels_on_one_table_and_batch_lookup(server, client_factory):
    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"C": "INT", "N": "INT"})
    channels = [client.open_channel(request(f"ch{i:03d}")) for i in range(100)]
    for i, channel in enumerate(channels):
        channel.insert_rows([{"C": i, "N": n} for n in range(10)], end_offset_token=f"{i}-9")
    for channel in channels:
        channel.wait_for_commit(timeout=60)
    statuses = client.get_latest_committed_offset_tokens([*channels, ("db.s.t", "missing")])
    assert [s.offset_token for s in statuses[:100]] == [f"{i}-9" for i in range(100)]
    assert all(s.ok for s in statuses[:100])
    assert statuses[100].status == "CHANNEL_NOT_FOUND"
    assert len(table_rows(info["location"])) == 1000
    shown = client.show_channels("db.s.t")
    assert len(shown) == 100 and {row["rows_committed"] for row in shown} == {10}


def test_batch_lookup_reports_invalidated_handles_explicitly(server, client_factory):
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    old = client.open_channel(request())
    old.insert_rows([{"ID": 1}], end_offset_token="1")
    old.wait_for_commit(timeout=30)
    new = client.open_channel(request())
    old_status, new_status = client.get_latest_committed_offset_tokens([old, new])
    assert (old_status.status, old_status.offset_token) == ("INVALIDATED", "1")
    assert "generation 1 is not the open generation" in old_status.message
    assert (new_status.status, new_status.offset_token) == ("OK", "1")


def test_a_failed_channel_does_not_affect_other_channels_or_tables(server, client_factory):
    client = client_factory(server.url)
    first = client.create_table("db.s.t", {"ID": "INT"})
    second = client.create_table("db.s.u", {"ID": "INT"})
    a = client.open_channel(request("a"))
    b = client.open_channel(request("b"))
    c = client.open_channel(request("c", table="U"))
    client.open_channel(request("a"))  # invalidates a only
    with pytest.raises(ChannelInvalidatedError):
        a.insert_rows([{"ID": 1}])
        a.wait_for_commit(timeout=30)
    b.insert_rows([{"ID": 2}], end_offset_token="b")
    c.insert_rows([{"ID": 3}], end_offset_token="c")
    assert b.wait_for_commit(timeout=30) == "b" and c.wait_for_commit(timeout=30) == "c"
    assert table_rows(first["location"], "ID") == [(Decimal(2),)]
    assert table_rows(second["location"], "ID") == [(Decimal(3),)]


def test_drop_and_recreate_table_makes_channels_new(server, client_factory):
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    channel.insert_rows([{"ID": 1}], end_offset_token="1")
    channel.wait_for_commit(timeout=30)
    client.drop_table("db.s.t")
    with pytest.raises(ChannelInvalidatedError):
        channel.insert_rows([{"ID": 2}])
        channel.wait_for_commit(timeout=30)
    info = client.create_table("db.s.t", {"ID": "INT"})
    fresh = client.open_channel(request())
    assert fresh.get_latest_committed_offset_token() is None
    assert fresh.generation == 1
    assert table_rows(info["location"]) == []


def test_drop_channel_removes_its_token(server, client_factory):
    client = client_factory(server.url)
    client.create_table("db.s.t", {"ID": "INT"})
    channel = client.open_channel(request())
    channel.insert_rows([{"ID": 1}], end_offset_token="1")
    channel.wait_for_commit(timeout=30)
    client.drop_channel(request())
    (status,) = client.get_latest_committed_offset_tokens([("db.s.t", "c1")])
    assert status.status == "CHANNEL_NOT_FOUND"
    assert client.open_channel(request()).get_latest_committed_offset_token() is None


async def test_async_client_round_trip(server):
    async with AsyncStreamingIngestClient(
        "async", url=server.url, max_client_lag="100 ms"
    ) as client:
        info = await client.create_table("db.s.t", {"ID": "INT"})
        channel = await client.open_channel(request())
        for i in range(5):
            await channel.insert_row({"ID": i}, offset_token=str(i))
        assert await channel.wait_for_commit("4", timeout=30) == "4"
        assert await channel.get_latest_committed_offset_token() == "4"
    assert table_rows(info["location"], "ID") == [(Decimal(i),) for i in range(5)]


def test_max_client_lag_is_validated():
    from ingest_sdk import ConfigurationError, StreamingIngestClient

    with pytest.raises(ConfigurationError, match=r"between 0\.05 seconds and 10 minutes"):
        StreamingIngestClient("x", max_client_lag="11 minutes")
    with pytest.raises(ConfigurationError, match="unknown unit 'fortnights': write a number"):
        StreamingIngestClient("x", max_client_lag="2 fortnights")
