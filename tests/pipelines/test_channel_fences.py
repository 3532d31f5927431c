"""Every channel open leaves a fence in its table's log: a commit without files holding
the channel's app transaction and token. The readers of the log take it for what it is,
no change: a stream over the table, a dynamic table (whose refresh after fences alone is
NO_DATA), a change stream (no record for a fence), compaction and DESCRIBE HISTORY. Each
answer is compared with the same query run fresh on the table."""

from __future__ import annotations

import json

from deltalake import DeltaTable

from flush.commit import COMMIT_METADATA_KEY
from flush.commit_clock import clock
from flush.compaction import CompactionPolicy, compact_table
from flush.tables import read_table
from ingest_sdk import OpenChannelRequest
from pipelines.change_streams.records import rfc3339
from tests.pipelines.dynamic_tables.checks import assert_consistent, assert_same_as_query

QUERY = "SELECT V, count(*) AS N, sum(ID) AS TOTAL FROM T GROUP BY V"


def request(name):
    return OpenChannelRequest(name, "DB", "PUBLIC", "T")


def answer(session, text):
    return sorted(tuple(row) for row in session.sql(text).collect())


def inserted(session, cs, start_us):
    """The INSERT mods of change stream ``cs`` since ``start_us``, as (ID, V), and the
    versions of T its records came from (by their transaction ids, ``<table>.<version>``)."""
    start = rfc3339(start_us)
    first = session.sql(f"SELECT * FROM READ_{cs}('{start}', NULL, NULL, 1000)").collect()
    tokens = [
        child["token"]
        for row in first
        for child in json.loads(row[0])["child_partitions_record"]["child_partitions"]
    ]
    mods, transactions = [], set()
    for token in tokens:
        for row in session.sql(
            f"SELECT * FROM READ_{cs}('{start}', NULL, '{token}', 1000)"
        ).collect():
            record = json.loads(row[0]).get("data_change_record")
            if record is None:
                continue
            transactions.add(record["server_transaction_id"])
            assert record["mod_type"] == "INSERT"
            mods += [(int(m["new_values"]["ID"]), m["new_values"]["V"]) for m in record["mods"]]
    return sorted(mods), transactions


def refresh_actions(session, name):
    """The actions of the dynamic table's refreshes, oldest first."""
    info = session.require_table(name)
    return [r.action for r in sorted(session.catalog.list_refreshes(info.id), key=lambda r: r.id)]


def fences_only(client, uri, times=3):
    """Open channels a and b ``times`` times each without a row; returns the versions."""
    before = DeltaTable(uri).version()
    for _ in range(times):
        for name in ("a", "b"):
            client.open_channel(request(name))
    after = DeltaTable(uri).version()
    assert after == before + 2 * times  # one fence per open
    return before, after


def test_readers_of_the_log_take_fences_for_no_change(
    server_factory, session_factory, client_factory, spark
):
    server = server_factory()
    session = session_factory(warehouse=server.config.warehouse)
    client = client_factory(server.url)
    client.create_table("DB.PUBLIC.T", {"ID": "NUMBER NOT NULL", "V": "VARCHAR"})
    uri = session.require_table("T").uri
    session.sql("CREATE STREAM S ON TABLE T")
    session.sql("CREATE TABLE SINK (ID NUMBER, V VARCHAR)")
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 hour' AS {QUERY}")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    start = clock()
    # Rows through channels, with reopens between them (each a fence).
    a = client.open_channel(request("a"))
    a.insert_rows([{"ID": n, "V": "x" if n % 2 else "y"} for n in range(10)],
                  end_offset_token="9")  # fmt: skip
    assert a.wait_for_commit(timeout=60) == "9"
    b = client.open_channel(request("b"))
    b.insert_rows([{"ID": n, "V": "z"} for n in range(100, 105)], end_offset_token="b4")
    b.wait_for_commit(timeout=60)
    a = client.open_channel(request("a"))
    assert a.get_latest_committed_offset_token() == "9"
    a.insert_rows([{"ID": 10, "V": "x"}], end_offset_token="10")
    a.wait_for_commit(timeout=60)
    fences_only(client, uri, times=2)
    everything = answer(session, "SELECT ID, V FROM T")
    assert len(everything) == 16
    # The stream holds every row inserted, once, as the table does.
    assert answer(session, "SELECT ID, V, METADATA$ACTION FROM S") == [
        (i, v, "INSERT") for i, v in everything
    ]
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert refresh_actions(session, "D")[-1] in ("INCREMENTAL", "FULL")
    assert_same_as_query(session, "D", QUERY)
    session.sql("INSERT INTO SINK SELECT ID, V FROM S")  # consumes S
    assert answer(session, "SELECT ID, V FROM SINK") == everything

    # Fences alone: no data for any reader.
    before, after = fences_only(client, uri)
    assert answer(session, "SELECT SYSTEM$STREAM_HAS_DATA('S')") == [(False,)]
    assert answer(session, "SELECT count(*) FROM S") == [(0,)]
    data = session.require_table("D").uri
    version = DeltaTable(data).version()
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert refresh_actions(session, "D")[-1] == "NO_DATA"
    assert DeltaTable(data).version() == version  # nothing written
    assert_same_as_query(session, "D", QUERY)
    assert_consistent(session, "D")
    history = session.sql("DESCRIBE HISTORY T").collect()
    fences = [r for r in history if before < r["version"] <= after]
    assert {r["source"] for r in fences} == {"INGEST"}
    assert all(json.loads(r["metadata"])["rows"] == 0 for r in fences)
    # The change stream's records are the rows inserted, none from a fence.
    mods, transactions = inserted(session, "CS", start)
    assert mods == everything
    table_id = session.require_table("T").id
    versions = {int(t.split(".")[1]) for t in transactions}
    assert len(versions) == 3 and all(str(table_id) == t.split(".")[0] for t in transactions)
    for v in versions:  # each a flush with rows
        info = DeltaTable(uri).history()
        (entry,) = [e for e in info if e["version"] == v]
        assert json.loads(entry[COMMIT_METADATA_KEY])["rows"] > 0

    # Compaction over a log full of fences keeps every row; later changes read right.
    rows_before = sorted(read_table(uri).column("ID").to_pylist())
    result = compact_table(spark, uri, CompactionPolicy())
    assert result.status == "SUCCEEDED"
    assert sorted(read_table(uri).column("ID").to_pylist()) == rows_before
    a = client.open_channel(request("a"))
    a.insert_rows([{"ID": 11, "V": "y"}], end_offset_token="11")
    a.wait_for_commit(timeout=60)
    fences_only(client, uri, times=1)
    assert answer(session, "SELECT ID, V, METADATA$ACTION FROM S") == [(11, "y", "INSERT")]
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert refresh_actions(session, "D")[-1] in ("INCREMENTAL", "FULL")
    assert_same_as_query(session, "D", QUERY)
    assert_consistent(session, "D")
    assert inserted(session, "CS", start)[0] == sorted([*everything, (11, "y")])
