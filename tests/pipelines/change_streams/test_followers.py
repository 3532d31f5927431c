"""A change stream on a dynamic table is one of its followers: a FULL refresh then
applies its difference, so the stream's records are the real change, not every row
deleted and inserted again."""

import json

from flush.commit_clock import clock
from pipelines.change_streams.records import rfc3339
from pipelines.dynamic_tables.refresh_change import has_followers


def _changes(session, start_us):
    """Every data change record of change stream CS since ``start_us`` (one partition)."""
    start = rfc3339(start_us)
    first = session.sql(f"SELECT * FROM READ_CS('{start}', NULL, NULL, 1000)").collect()
    tokens = [
        child["token"]
        for row in first
        for child in json.loads(row[0])["child_partitions_record"]["child_partitions"]
    ]
    found = []
    for token in tokens:
        rows = session.sql(f"SELECT * FROM READ_CS('{start}', NULL, '{token}', 1000)").collect()
        found += [json.loads(r[0])["data_change_record"] for r in rows
                  if "data_change_record" in json.loads(r[0])]  # fmt: skip
    return found


def test_a_change_stream_makes_a_full_refresh_a_difference(windowed):
    session = windowed
    dt = session.require_table("D")
    assert not has_followers(session.catalog, dt.id)
    session.sql("CREATE CHANGE STREAM CS FOR D")
    assert has_followers(session.catalog, dt.id)
    start = clock()
    session.sql("UPDATE T SET V = 'c' WHERE ID = 3")  # b's only row joins c's
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    records = _changes(session, start)
    assert records and all(r["table_name"] == "D" for r in records)
    assert {r["is_system_transaction"] for r in records} == {True}
    assert {r["transaction_tag"] for r in records} == {"dynamic_table=DB.PUBLIC.D"}
    mods = sorted(
        (r["mod_type"], tuple(sorted((m["old_values"] or m["new_values"]).items())))
        for r in records
        for m in r["mods"]
    )
    # A FULL refresh's difference is by value: rows 1 and 2 (V = 'a', K = 2) are kept;
    # the rows whose values changed go and come back (an overwrite would replace all 4).
    assert mods == [
        ("DELETE", (("ID", 3), ("K", 1), ("V", "b"))),
        ("DELETE", (("ID", 4), ("K", 1), ("V", "c"))),
        ("INSERT", (("ID", 3), ("K", 2), ("V", "c"))),
        ("INSERT", (("ID", 4), ("K", 2), ("V", "c"))),
    ]


def test_for_all_counts_and_dropping_the_stream_ends_it(windowed):
    session = windowed
    dt = session.require_table("D")
    session.sql("CREATE CHANGE STREAM CS FOR ALL")
    assert has_followers(session.catalog, dt.id)
    session.sql("DROP CHANGE STREAM CS")
    assert not has_followers(session.catalog, dt.id)
