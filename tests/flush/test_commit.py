"""The commit protocol module on its own: files, stats, app transactions, recovery, failpoints."""

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flush import ChannelProgress, TableWriter, commits_after, create_table, table_schema_of
from flush.commit import ChannelFencedError, app_id
from flush.failpoints import _parse
from ingest_sdk import SchemaError, TableSchema, convert_rows
from ingest_sdk.wire import pack_txn_version

SCHEMA = TableSchema.parse({"ID": "INT NOT NULL", "S": "VARCHAR(10)", "TS": "TIMESTAMP_NTZ"})


def part(*ids):
    batch, _ = convert_rows(SCHEMA, [{"ID": i, "S": f"s{i}", "TS": "2024-01-01"} for i in ids])
    return pa.Table.from_batches([batch])


@pytest.fixture
def writer(tmp_path):
    create_table(str(tmp_path), SCHEMA)
    return TableWriter(str(tmp_path), SCHEMA)


def test_one_commit_holds_files_tokens_and_app_transactions(writer):
    channels = [ChannelProgress("a", 1, 3, "t-a", 2), ChannelProgress("b", 2, 1, None, 1)]
    record = writer.commit_flush([part(1, 2), part(3)], channels, first_row_id=100)
    table = DeltaTable(writer.table_uri)
    assert record.version == table.version() == 1
    assert record.next_row_id == 103 and record.rows == 3
    assert table.transaction_version(app_id("a")) == pack_txn_version(1, 3)
    assert table.transaction_version(app_id("b")) == pack_txn_version(2, 1)
    data = table.to_pyarrow_table()
    assert data.column("_INGEST_ROW_ID").to_pylist() == [100, 101, 102]
    (add,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert add["path"].startswith("_ingest/") and add["num_records"] == 3
    stats = orjson.loads(table.history(1)[0]["ingest"])
    assert stats["channels"][0]["offset_token"] == "t-a"
    assert commits_after(writer.table_uri, 0) == [record]
    assert table_schema_of(table) == SCHEMA  # the row id stays hidden


def test_file_stats_let_delta_rs_skip_files(writer):
    writer.commit_flush([part(1, 2)], [ChannelProgress("a", 1, 1, "1", 2)], 0)
    writer.commit_flush([part(50, 60)], [ChannelProgress("a", 1, 2, "2", 2)], 2)
    table = DeltaTable(writer.table_uri)
    assert len(table.file_uris()) == 2
    assert len(table.file_uris(partition_filters=None)) == 2
    dataset = table.to_pyarrow_dataset()
    from decimal import Decimal

    import pyarrow.compute as pc

    fragments = list(dataset.get_fragments(filter=pc.field("ID") > pa.scalar(Decimal(10))))
    assert len(fragments) == 1  # min/max statistics exclude the first file


def test_a_retried_flush_whose_commit_landed_is_not_committed_twice(writer):
    channels = [ChannelProgress("a", 1, 1, "1", 2)]
    first = writer.commit_flush([part(1, 2)], channels, 0)
    again = writer.commit_flush([part(1, 2)], channels, 0)  # the answer was "lost"
    assert again.version == first.version
    assert DeltaTable(writer.table_uri).to_pyarrow_table().num_rows == 2


def test_a_stale_writer_is_fenced_by_its_app_transaction(writer):
    stale = TableWriter(writer.table_uri, SCHEMA)
    writer.commit_flush([part(1)], [ChannelProgress("a", 2, 1, "new", 1)], 0)
    with pytest.raises(ChannelFencedError, match="newer generation") as info:
        stale.commit_flush([part(9)], [ChannelProgress("a", 1, 5, "old", 1)], 1)
    assert info.value.channels == ["a"]
    assert DeltaTable(writer.table_uri).to_pyarrow_table().column("ID").to_pylist() == [1]


def test_a_writer_that_committed_before_is_fenced_after_another_writers_commit(writer):
    """The writer knows the positions it committed; a commit by anyone else makes it look
    them up again, so a newer generation landed meanwhile still fences it."""
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0)
    TableWriter(writer.table_uri, SCHEMA).commit_flush(
        [part(2)], [ChannelProgress("a", 2, 1, "new", 1)], 1
    )
    with pytest.raises(ChannelFencedError):
        writer.commit_flush([part(3)], [ChannelProgress("a", 1, 2, "2", 1)], 2)
    assert sorted(DeltaTable(writer.table_uri).to_pyarrow_table().column("ID").to_pylist()) == [
        1,
        2,
    ]


def test_positions_the_writer_committed_itself_are_not_looked_up_again(writer, monkeypatch):
    looked_up = []
    lookup = DeltaTable.transaction_version
    monkeypatch.setattr(DeltaTable, "transaction_version",
                        lambda table, app: looked_up.append(app) or lookup(table, app))  # fmt: skip
    for seq in range(1, 4):
        channels = [
            ChannelProgress("a", 1, seq, str(seq), 1),
            ChannelProgress("b", 1, seq, None, 1),
        ]
        record = writer.commit_flush([part(seq)], channels, seq)
        assert record.version == seq  # landed right above the version it was made on
    assert sorted(looked_up) == [app_id("a"), app_id("b")]  # the first flush only
    # The same flush again (its answer was lost): found landed from what the writer knows.
    assert writer.commit_flush([part(3)], channels, 3).version == 3
    assert DeltaTable(writer.table_uri).to_pyarrow_table().num_rows == 3


def test_a_commit_refused_for_a_concurrent_one_checks_the_channels_again(writer, monkeypatch):
    """A newer generation committed between the check and the commit: the refused commit
    goes again only after the channels are checked on the newest version, and is fenced."""
    import flush.commit as commit_module

    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0)
    write = commit_module.write_parquet_file

    def write_while_another_writer_commits(*args, **kwargs):
        monkeypatch.setattr(commit_module, "write_parquet_file", write)  # once
        other = TableWriter(writer.table_uri, SCHEMA)
        other.commit_flush([part(9)], [ChannelProgress("a", 2, 1, "new", 1)], 9)
        return write(*args, **kwargs)

    monkeypatch.setattr(commit_module, "write_parquet_file", write_while_another_writer_commits)
    with pytest.raises(ChannelFencedError):
        writer.commit_flush([part(2)], [ChannelProgress("a", 1, 2, "2", 1)], 1)
    assert sorted(DeltaTable(writer.table_uri).to_pyarrow_table().column("ID").to_pylist()) == [
        1,
        9,
    ]


def test_a_flush_reports_the_time_of_its_phases(writer):
    timings = {}
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "1", 1)], 0, timings)
    assert set(timings) == {"landed_check", "parquet", "delta_commit"}
    assert all(seconds >= 0 for seconds in timings.values())


def test_token_only_flush_commits_metadata_without_files(writer):
    record = writer.commit_flush([], [ChannelProgress("a", 1, 1, "99", 0)], 0)
    table = DeltaTable(writer.table_uri)
    assert record.rows == 0 and table.file_uris() == []
    assert commits_after(writer.table_uri, 0)[0].channels[0].offset_token == "99"


def test_reserved_row_id_name_is_refused(tmp_path):
    with pytest.raises(SchemaError, match="reserved"):
        create_table(str(tmp_path), TableSchema.parse({"_ingest_row_id": "INT"}))


def test_failpoint_spec_parsing():
    assert _parse("a=kill, b=error*2,c") == {
        "a": ["kill", None],
        "b": ["error", 2],
        "c": ["kill", None],
    }
    assert _parse("") == {}


# Fences: an open's empty commit at (generation, 0)


def channel_commits(uri, channel):
    """(version, generation, batch_seq, token, rows) of every commit naming ``channel``."""
    return [
        (r.version, c.generation, c.batch_seq, c.offset_token, c.rows)
        for r in commits_after(uri, -1)
        for c in r.channels
        if c.channel == channel
    ]


def test_a_fence_is_an_empty_commit_carrying_the_channels_newest_token(writer):
    writer.commit_flush([part(1, 2)], [ChannelProgress("a", 1, 1, "t1", 2)], 0)
    writer.commit_flush([part(3)], [ChannelProgress("a", 1, 2, "t2", 1)], 2)
    files = DeltaTable(writer.table_uri).file_uris()
    record = writer.fence("a", 2, 3, resume=True, fallback_token="stale catalog token")
    table = DeltaTable(writer.table_uri)
    assert record.version == table.version() == 3
    assert record.channels == (ChannelProgress("a", 2, 0, "t2", 0),)
    assert (record.rows, record.next_row_id) == (0, 3)
    assert table.file_uris() == files  # no file added
    assert table.transaction_version(app_id("a")) == pack_txn_version(2, 0)
    assert commits_after(writer.table_uri, 2) == [record]  # recovery replays it as a flush
    # Every later commit of generation 1 is refused, and nothing of it lands.
    with pytest.raises(ChannelFencedError):
        writer.commit_flush([part(9)], [ChannelProgress("a", 1, 3, "t3", 1)], 4)
    stale = TableWriter(writer.table_uri, SCHEMA)
    with pytest.raises(ChannelFencedError):
        stale.commit_flush([part(9)], [ChannelProgress("a", 1, 3, "t3", 1)], 4)
    assert sorted(DeltaTable(writer.table_uri).to_pyarrow_table().column("ID").to_pylist()) == [
        1, 2, 3,
    ]  # fmt: skip
    # The new generation commits after its fence.
    writer.commit_flush([part(4)], [ChannelProgress("a", 2, 1, "t4", 1)], 4)
    assert channel_commits(writer.table_uri, "a")[-2:] == [(3, 2, 0, "t2", 0), (4, 2, 1, "t4", 1)]


def test_the_token_of_a_fence_is_read_from_the_log_by_any_writer(writer, monkeypatch):
    """A writer that never committed the channel finds its token in the commit files (its
    catalog may be stale); a channel the catalog did not hold starts with none."""
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "t1", 1),
                                    ChannelProgress("b", 1, 1, "b1", 0)], 0)  # fmt: skip
    writer.commit_flush([part(2)], [ChannelProgress("b", 1, 2, "b2", 1)], 1)
    other = TableWriter(writer.table_uri, SCHEMA)
    assert other.fence("a", 2, 2, resume=True, fallback_token=None).channels[0].offset_token == "t1"
    # b was met on the way down and remembered: its fence reads no commit file.
    import flush.commit as commit_module

    read = []
    info = commit_module.commit_info
    monkeypatch.setattr(commit_module, "commit_info", lambda uri, v: read.append(v) or info(uri, v))
    fence = other.fence("b", 2, 2, resume=True, fallback_token=None)
    assert fence.channels[0].offset_token == "b2" and read == []
    dropped = other.fence("a", 3, 2, resume=False, fallback_token="t1")  # dropped, opened again
    assert dropped.channels[0].offset_token is None
    assert other.fence("a", 4, 2, resume=True, fallback_token="x").channels[0].offset_token is None


def test_a_fence_falls_back_to_the_catalogs_token_when_the_log_lost_the_commit(writer):
    from pathlib import Path

    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "t1", 1)], 0)
    writer.commit_flush([part(2)], [ChannelProgress("b", 1, 1, "b1", 1)], 1)
    DeltaTable(writer.table_uri).create_checkpoint()  # covers version 2
    for version in (0, 1):  # as log cleanup removes commit files a checkpoint covers
        Path(writer.table_uri, "_delta_log", f"{version:020d}.json").unlink()
    other = TableWriter(writer.table_uri, SCHEMA)
    fence = other.fence("a", 2, 2, resume=True, fallback_token="catalog's")
    assert fence.channels[0].offset_token == "catalog's"
    assert other.fence("b", 2, 2, resume=True, fallback_token="x").channels[0].offset_token == "b1"


def test_a_flush_landing_while_a_fence_is_made_is_in_the_fences_token(writer, monkeypatch):
    """The old handle's flush takes the version the fence was about to take: the fence is
    refused, made again on the newest version, and reads the token again there."""
    import flush.commit as commit_module

    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "t1", 1)], 0)
    old_server = TableWriter(writer.table_uri, SCHEMA)
    fired = []

    def flush_of_the_old_handle(name):
        if name == "before_fence_commit" and not fired:
            fired.append(name)
            old_server.commit_flush([part(2)], [ChannelProgress("a", 1, 2, "t2", 1)], 1)

    monkeypatch.setattr(commit_module, "failpoint", flush_of_the_old_handle)
    fence = writer.fence("a", 2, 2, resume=True, fallback_token=None)
    assert fired and fence.channels[0].offset_token == "t2"
    assert channel_commits(writer.table_uri, "a") == [
        (1, 1, 1, "t1", 1), (2, 1, 2, "t2", 1), (3, 2, 0, "t2", 0),
    ]  # fmt: skip


def test_a_flush_made_on_a_version_before_the_fence_is_refused_and_fenced(writer, monkeypatch):
    """The old handle's flush checked the channel before the fence landed: its commit is
    refused (the version is taken), and the check on the newest version fences it."""
    import flush.commit as commit_module

    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "t1", 1),
                                    ChannelProgress("b", 1, 1, "b1", 1)], 0)  # fmt: skip
    new_server = TableWriter(writer.table_uri, SCHEMA)
    write = commit_module.write_parquet_file

    def write_while_the_channel_is_opened_elsewhere(*args, **kwargs):
        monkeypatch.setattr(commit_module, "write_parquet_file", write)  # once
        new_server.fence("a", 2, 2, resume=True, fallback_token=None)
        return write(*args, **kwargs)

    monkeypatch.setattr(commit_module, "write_parquet_file", write_while_the_channel_is_opened_elsewhere)
    with pytest.raises(ChannelFencedError) as fenced:
        writer.commit_flush([part(2, 3)], [ChannelProgress("a", 1, 2, "t2", 1),
                                           ChannelProgress("b", 1, 2, "b2", 1)], 2)  # fmt: skip
    assert fenced.value.channels == ["a"]
    assert sorted(DeltaTable(writer.table_uri).to_pyarrow_table().column("ID").to_pylist()) == [1]
    assert channel_commits(writer.table_uri, "a")[-1] == (2, 2, 0, "t1", 0)


def test_an_older_open_whose_fence_comes_second_is_fenced(writer):
    """Two opens racing on two servers: the newer generation fenced first, so the older
    open's fence is refused (it answers CHANNEL_INVALIDATED)."""
    writer.commit_flush([part(1)], [ChannelProgress("a", 1, 1, "t1", 1)], 0)
    TableWriter(writer.table_uri, SCHEMA).fence("a", 3, 1, resume=True, fallback_token=None)
    with pytest.raises(ChannelFencedError):
        writer.fence("a", 2, 1, resume=True, fallback_token=None)
    assert DeltaTable(writer.table_uri).transaction_version(app_id("a")) == pack_txn_version(3, 0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["flush", "fence"]),
                                st.sets(st.sampled_from("abcd"), min_size=1)),
                      min_size=1, max_size=12))  # fmt: skip
def test_positions_followed_through_other_writers_commits_equal_the_logs(tmp_path_factory, steps):
    """Two writers on one table take turns (flushes of some channels, fences): each one's
    positions, followed commit by commit through the other's, equal a fresh lookup in
    the log after every step, and a flush of a fenced generation is refused."""
    uri = str(tmp_path_factory.mktemp("moved"))
    create_table(uri, SCHEMA)
    writers = [TableWriter(uri, SCHEMA), TableWriter(uri, SCHEMA)]
    generation, seq, row = dict.fromkeys("abcd", 1), dict.fromkeys("abcd", 0), 0
    for who, kind, names in steps:
        channels = sorted(names)
        if kind == "fence":
            generation[channels[0]] += 1
            seq[channels[0]] = 0
            writers[who].fence(channels[0], generation[channels[0]], row, resume=True,
                               fallback_token=None)  # fmt: skip
        else:
            for name in channels:
                seq[name] += 1
            progress = [ChannelProgress(n, generation[n], seq[n], str(seq[n]), 1) for n in channels]
            writers[who].commit_flush([part(row + i) for i in range(len(channels))], progress, row)
            row += len(channels)
        fresh = DeltaTable(uri)
        expected = {n: fresh.transaction_version(app_id(n)) for n in "abcd"}
        probe = [ChannelProgress(n, 1, 1, None, 0) for n in "abcd"]
        for writer in writers:
            assert writer.landed_positions(probe) == expected
    stale = [ChannelProgress("a", 1, 99, "x", 1)]  # generation 1 after any fence of a: refused
    if generation["a"] > 1:
        with pytest.raises(ChannelFencedError):
            writers[0].commit_flush([part(10_000)], stale, 10_000)
