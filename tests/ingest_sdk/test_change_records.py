"""The change stream record classes: their JSON form round-trips both ways, byte for
byte as orjson writes it, and a malformed record is refused naming its field."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingest_sdk import (
    ChildPartition,
    ChildPartitionsRecord,
    DataChangeRecord,
    HeartbeatRecord,
    MalformedRecordError,
    record_from_json,
)
from ingest_sdk.change_records import MOD_TYPES, VALUE_CAPTURE_TYPES, record_kind

moments = st.datetimes(datetime(1970, 1, 1), datetime(9999, 12, 30), timezones=st.just(UTC))
stamps = moments.map(lambda m: m.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
texts = st.text(max_size=12)
counts = st.integers(0, 2**31)
scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | texts
scalars |= st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
row = st.dictionaries(texts, json_values, max_size=4)
mods = st.lists(st.fixed_dictionaries({"keys": row, "new_values": row, "old_values": row}),
                max_size=4)  # fmt: skip
column_types = st.lists(
    st.fixed_dictionaries(
        {"name": texts, "type": st.fixed_dictionaries({"code": texts}),
         "is_primary_key": st.booleans(), "ordinal_position": counts},
        optional={"is_row_id": st.just(True)},
    ),
    max_size=4,
)  # fmt: skip
data_changes = st.builds(
    DataChangeRecord, stamps, texts, texts, st.booleans(), texts, column_types, mods,
    st.sampled_from(MOD_TYPES), st.sampled_from(VALUE_CAPTURE_TYPES), counts, counts, texts,
    st.booleans(),
)  # fmt: skip
heartbeats = st.builds(HeartbeatRecord, stamps)
children = st.builds(ChildPartition, texts, st.lists(st.none() | texts, max_size=3).map(tuple))
child_records = st.builds(
    ChildPartitionsRecord, stamps, texts, st.lists(children, max_size=3).map(tuple)
)
records = data_changes | heartbeats | child_records


def wire(value: Any) -> bytes:
    return orjson.dumps(value)


@given(records)
def test_from_json_of_to_json_is_the_record(record):
    sent = wire(record.to_json())
    parsed = record_from_json(orjson.loads(sent))
    assert parsed == record
    assert type(parsed).from_json(orjson.loads(sent)) == record


@given(records)
def test_to_json_of_from_json_is_the_dict_as_sent(record):
    """The dict a reader receives (parsed JSON) comes back equal, key order included."""
    received = orjson.loads(wire(record.to_json()))
    again = record_from_json(received).to_json()
    assert again == received
    assert wire(again) == wire(received)


def test_the_reference_examples_round_trip():
    change = {"data_change_record": {
        "commit_timestamp": "2022-09-27T12:30:00.123456Z", "record_sequence": "00000000",
        "server_transaction_id": "6329047911",
        "is_last_record_in_transaction_in_partition": True, "table_name": "AccountBalance",
        "column_types": [{"name": "AccountId", "type": {"code": "STRING"},
                          "is_primary_key": True, "ordinal_position": 1}],
        "mods": [{"keys": {"AccountId": "Id1"}, "new_values": {"Balance": 1000},
                  "old_values": {}}],
        "mod_type": "UPDATE", "value_capture_type": "NEW_ROW",
        "number_of_records_in_transaction": 1, "number_of_partitions_in_transaction": 1,
        "transaction_tag": "app=banking,env=prod,action=update", "is_system_transaction": False,
    }}  # fmt: skip
    beat = {"heartbeat_record": {"timestamp": "2022-09-27T12:35:00.312486Z"}}
    child = {"child_partitions_record": {
        "start_timestamp": "2022-05-01T09:00:01Z", "record_sequence": "00000001",
        "child_partitions": [{"token": "child_token_1", "parent_partition_tokens": [None]},
                             {"token": "child_token_4",
                              "parent_partition_tokens": ["child_token_2", "child_token_3"]}],
    }}  # fmt: skip
    for raw in (change, beat, child):
        assert wire(record_from_json(raw).to_json()) == wire(raw)
    parsed = record_from_json(child)
    assert isinstance(parsed, ChildPartitionsRecord)
    assert parsed.child_partitions[1] == ChildPartition(
        "child_token_4", ("child_token_2", "child_token_3")
    )


def test_keys_beside_the_kind_and_newer_fields_are_ignored():
    raw = {"heartbeat_record": {"timestamp": "2026-01-31T12:00:00.000000Z", "new": 1},
           "partition_token": "p1"}  # fmt: skip
    assert record_from_json(raw) == HeartbeatRecord("2026-01-31T12:00:00.000000Z")


def _data_change() -> dict[str, Any]:
    record = DataChangeRecord(
        "2026-01-31T12:00:00.000000Z", "00000000", "7.3", True, "T",
        [{"name": "ID", "type": {"code": "INT"}, "is_primary_key": True, "ordinal_position": 1}],
        [{"keys": {"ID": 1}, "new_values": {}, "old_values": {}}], "INSERT",
        "OLD_AND_NEW_VALUES", 1, 1, "sql", False,
    )  # fmt: skip
    return record.to_json()


WRONG = {
    "commit_timestamp": [None, 5, "yesterday", "2026-01-31"],
    "record_sequence": [None, 7],
    "server_transaction_id": [None, 7],
    "is_last_record_in_transaction_in_partition": [None, 1, "true"],
    "table_name": [None, 1],
    "column_types": [None, {}, [1], [{"name": "ID"}],
                     [{"name": "ID", "type": {"code": "INT"}, "is_primary_key": 1,
                       "ordinal_position": 1}]],
    "mods": [None, "x", [[]], [{"keys": {}, "new_values": {}}],
             [{"keys": [], "new_values": {}, "old_values": {}}]],
    "mod_type": [None, "insert", "UPSERT"],
    "value_capture_type": [None, "ALL"],
    "number_of_records_in_transaction": [None, True, -1, 1.0, "1"],
    "number_of_partitions_in_transaction": [None, False, -3],
    "transaction_tag": [None, 3],
    "is_system_transaction": [None, 0],
}  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value"), [(f, v) for f, values in WRONG.items() for v in values]
)
def test_a_malformed_data_change_record_is_refused_naming_the_field(field, value):
    raw = _data_change()
    if value is None:
        del raw["data_change_record"][field]
    else:
        raw["data_change_record"][field] = copy.deepcopy(value)
    with pytest.raises(MalformedRecordError, match=f"data_change_record.{field}"):
        record_from_json(raw)


@pytest.mark.parametrize(
    "raw",
    [
        {"heartbeat_record": {}},
        {"heartbeat_record": {"timestamp": 1769860800}},
        {"heartbeat_record": None},
        {"heartbeat_record": "2026-01-31T12:00:00Z"},
        {"child_partitions_record": {"start_timestamp": "2026-01-31T12:00:00Z",
                                     "record_sequence": "0", "child_partitions": {}}},
        {"child_partitions_record": {"start_timestamp": "2026-01-31T12:00:00Z",
                                     "record_sequence": "0",
                                     "child_partitions": [{"token": 1,
                                                           "parent_partition_tokens": []}]}},
        {"child_partitions_record": {"start_timestamp": "2026-01-31T12:00:00Z",
                                     "record_sequence": "0",
                                     "child_partitions": [{"token": "a"}]}},
        {"child_partitions_record": {"start_timestamp": "2026-01-31T12:00:00Z",
                                     "child_partitions": []}},
        {"heartbeat_record": {"timestamp": "2026-01-31T12:00:00Z"},
         "data_change_record": {}},
        {"partition_token": "p"},
        [],
        "heartbeat_record",
    ],
)  # fmt: skip
def test_malformed_records_are_refused(raw):
    with pytest.raises(MalformedRecordError, match=r"record|partition"):
        record_from_json(raw)


def test_a_record_of_no_known_kind_is_none_for_readers_that_skip_it():
    assert record_kind({"future_record": {}}) is None
    assert record_kind({"heartbeat_record": {}}) is HeartbeatRecord
    with pytest.raises(MalformedRecordError, match="holds one of"):
        record_kind({"heartbeat_record": {}, "child_partitions_record": {}})
    with pytest.raises(MalformedRecordError, match="JSON object"):
        record_kind(None)


@given(st.sampled_from(sorted(WRONG)))
def test_any_field_missing_is_refused(field):
    raw = _data_change()
    del raw["data_change_record"][field]
    with pytest.raises(MalformedRecordError, match="it is missing"):
        DataChangeRecord.from_json(raw)


# The reader parses every record it receives, and hands the callback what it received.
START = "2026-01-31T12:00:00.000000Z"


def _query(partition_records):
    """A query callable: the first query names partition p0, whose query returns
    ``partition_records`` and then its (empty) child partitions record."""

    def query(token, start, end, heartbeat_ms):
        if token is None:
            yield ChildPartitionsRecord(START, "00000000", (ChildPartition("p0"),)).to_json()
            return
        yield from copy.deepcopy(partition_records)
        yield ChildPartitionsRecord("2026-02-01T00:00:00.000000Z", "00000000", ()).to_json()

    return query


def _run(tmp_path, partition_records, handed=None, **options):
    from ingest_sdk import ChangeStreamReader

    handed = [] if handed is None else handed
    reader = ChangeStreamReader(
        _query(partition_records), "CS", start_timestamp=START,
        checkpoint_path=tmp_path / "checkpoint.sqlite",
        callback=lambda record, db: handed.append(record), **options,
    )  # fmt: skip
    reader.run()
    return handed


def test_the_callback_gets_the_record_as_received_and_unknown_kinds_are_skipped(tmp_path):
    change = _data_change()
    change["data_change_record"]["commit_timestamp"] = "2026-01-31T12:00:01.000000Z"
    change["data_change_record"]["a_newer_field"] = [1, 2]
    beat = {"heartbeat_record": {"timestamp": "2026-01-31T12:00:02.000000Z"}}
    handed = _run(tmp_path, [change, {"future_record": {}}, beat], heartbeats=True)
    assert handed == [{**change, "partition_token": "p0"}, {**beat, "partition_token": "p0"}]
    parsed = record_from_json(handed[0])
    assert isinstance(parsed, DataChangeRecord)
    assert parsed.mods == change["data_change_record"]["mods"]


def test_a_malformed_record_stops_the_reader_naming_its_field(tmp_path):
    change = _data_change()
    change["data_change_record"]["commit_timestamp"] = "2026-01-31T12:00:01.000000Z"
    good = copy.deepcopy(change)
    del change["data_change_record"]["table_name"]
    handed: list[dict[str, Any]] = []
    with pytest.raises(MalformedRecordError, match=r"data_change_record\.table_name"):
        _run(tmp_path, [good, change], handed)
    assert handed == [{**good, "partition_token": "p0"}]  # the records before it: handed
