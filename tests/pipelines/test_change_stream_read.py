"""Reading change streams through ``SELECT * FROM READ_<cs>(...)``: the reference's
AccountBalance records for the four value capture types, the shapes of INSERT, UPDATE
and DELETE, tables without a primary key, value conversion against ``SELECT``,
heartbeats (idle tables, writers with skewed clocks), retention and bad arguments, and
who wrote a transaction (tags, system transactions, compaction). The partition workflow
(splits and merges) is in ``test_change_stream_partitions.py``."""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import time
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

import flush.commit_clock as commit_clock
from flush import ChannelProgress, TableWriter
from flush.commit_clock import now_us
from flush.compaction import CompactionPolicy, compact_table
from ingest_sdk import convert_rows
from pipelines import SqlError
from pipelines.change_streams.records import key_hash, rfc3339

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
ACCOUNTS = (
    'CREATE TABLE "AccountBalance" ("AccountId" VARCHAR PRIMARY KEY, "LastUpdate" TIMESTAMP, '
    '"Balance" INT)'
)


# Reading
def micros(text: str) -> int:
    """An RFC 3339 timestamp of a record as µs since the epoch."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // _US


_US = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


def sql_value(value: Any) -> str:
    if value is None:
        return "NULL"
    return f"'{value}'" if isinstance(value, str) else str(value)


def read(session, cs, start, token=None, end=None, heartbeat=1000) -> list[dict[str, Any]]:
    """One query of change stream ``cs``, its records parsed."""
    text = (
        f"SELECT * FROM READ_{cs}(start_timestamp => {sql_value(start)}, "
        f"end_timestamp => {sql_value(end)}, partition_token => {sql_value(token)}, "
        f"heartbeat_milliseconds => {heartbeat})"
    )
    return [json.loads(row[0]) for row in session.sql(text).collect()]


def created(session, cs) -> str:
    """The moment change stream ``cs`` was created, as a start_timestamp."""
    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    return rfc3339(stream.created_us)


def now() -> str:
    return rfc3339(now_us())


def changes(records):
    return [r["data_change_record"] for r in records if "data_change_record" in r]


def read_tree(session, cs, start) -> dict[str, list[dict[str, Any]]]:
    """Every partition's records from ``start``, following the reference's workflow: the
    first query's partitions, then each child once, after all of its parents."""
    first = read(session, cs, start)
    assert all(list(r) == ["child_partitions_record"] for r in first), first
    queue = [
        (c["token"], start) for r in first for c in r["child_partitions_record"]["child_partitions"]
    ]
    done: dict[str, list[dict[str, Any]]] = {}
    children: dict[str, tuple[str, tuple[str, ...]]] = {}
    while queue:
        token, at = queue.pop(0)
        assert token not in done
        done[token] = read(session, cs, at, token)
        for record in done[token]:
            if "child_partitions_record" in record:
                child = record["child_partitions_record"]
                for item in child["child_partitions"]:
                    found = (child["start_timestamp"], tuple(item["parent_partition_tokens"]))
                    assert children.setdefault(item["token"], found) == found
        for token, (at, parents) in children.items():
            queued = {t for t, _ in queue}
            if token not in done and token not in queued and all(p in done for p in parents):
                queue.append((token, at))
    return done


def partitions(session, cs):
    """The stream's partitions, as SHOW CHANGE STREAM PARTITIONS lists them."""
    return session.sql(f"SHOW CHANGE STREAM PARTITIONS {cs}").collect()


def separate(session, cs, keys) -> dict[str, str]:
    """Split open partitions until every key of ``keys`` is in a partition of its own;
    returns each key's partition token."""
    while True:
        placed: dict[str, list[str]] = {}
        for p in partitions(session, cs):
            if p["state"] == "OPEN":
                for key in keys:
                    if p["key_range_start"] <= key_hash([key]) < p["key_range_end"]:
                        placed.setdefault(p["token"], []).append(key)
        crowded = [token for token, found in placed.items() if len(found) > 1]
        if not crowded:
            return {found[0]: token for token, found in placed.items()}
        session.sql(f"ALTER CHANGE STREAM {cs} SPLIT PARTITION '{crowded[0]}'")


# The reference's AccountBalance records (003), as transcribed from its examples; the
# commit timestamp, transaction id and tag differ by nature and are checked for form.
ID, LAST_UPDATE, BALANCE = (
    {"name": "AccountId", "type": {"code": "STRING"}, "is_primary_key": True, "ordinal_position": 1},
    {"name": "LastUpdate", "type": {"code": "TIMESTAMP"}, "is_primary_key": False,
     "ordinal_position": 2},
    {"name": "Balance", "type": {"code": "INT"}, "is_primary_key": False, "ordinal_position": 3},
)  # fmt: skip
TRANSFER = [
    {
        "commit_timestamp": "2022-09-27T12:30:00.123456Z",
        "record_sequence": "00000000",
        "server_transaction_id": "6329047911",
        "is_last_record_in_transaction_in_partition": True,
        "table_name": "AccountBalance",
        "column_types": [ID, LAST_UPDATE, BALANCE],
        "mods": [{
            "keys": {"AccountId": "Id1"},
            "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": 1000},
            "old_values": {"LastUpdate": "2022-09-26T11:28:00.189413Z", "Balance": 1500},
        }],
        "mod_type": "UPDATE",
        "value_capture_type": "OLD_AND_NEW_VALUES",
        "number_of_records_in_transaction": 2,
        "number_of_partitions_in_transaction": 2,
        "transaction_tag": "app=banking,env=prod,action=update",
        "is_system_transaction": False,
    },
    {
        "commit_timestamp": "2022-09-27T12:30:00.123456Z",
        "record_sequence": "00000001",
        "server_transaction_id": "6329047911",
        "is_last_record_in_transaction_in_partition": True,
        "table_name": "AccountBalance",
        "column_types": [ID, LAST_UPDATE, BALANCE],
        "mods": [{
            "keys": {"AccountId": "Id2"},
            "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": 2000},
            "old_values": {"LastUpdate": "2022-01-20T11:25:00.199915Z", "Balance": 1500},
        }],
        "mod_type": "UPDATE",
        "value_capture_type": "OLD_AND_NEW_VALUES",
        "number_of_records_in_transaction": 2,
        "number_of_partitions_in_transaction": 2,
        "transaction_tag": "app=banking,env=prod,action=update",
        "is_system_transaction": False,
    },
]  # fmt: skip


def one_update(capture, column_types, new_values, old_values):
    return {
        "commit_timestamp": "2022-09-27T12:30:00.123456Z",
        "record_sequence": "00000000",
        "server_transaction_id": "6329047911",
        "is_last_record_in_transaction_in_partition": True,
        "table_name": "AccountBalance",
        "column_types": column_types,
        "mods": [{"keys": {"AccountId": "Id1"}, "new_values": new_values,
                  "old_values": old_values}],
        "mod_type": "UPDATE",
        "value_capture_type": capture,
        "number_of_records_in_transaction": 1,
        "number_of_partitions_in_transaction": 1,
        "transaction_tag": "app=banking,env=prod,action=update",
        "is_system_transaction": False,
    }  # fmt: skip


#: The examples where only LastUpdate changed (the row's Balance was already 1000).
LAST_UPDATE_ONLY = {
    "NEW_VALUES": one_update(
        "NEW_VALUES", [ID, LAST_UPDATE], {"LastUpdate": "2022-09-27T12:30:00.123456Z"}, {}
    ),
    "NEW_ROW": one_update(
        "NEW_ROW", [ID, LAST_UPDATE, BALANCE],
        {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": 1000}, {},
    ),
    "NEW_ROW_AND_OLD_VALUES": one_update(
        "NEW_ROW_AND_OLD_VALUES", [ID, LAST_UPDATE, BALANCE],
        {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": 1000},
        {"LastUpdate": "2022-09-26T11:28:00.189413Z"},
    ),
}  # fmt: skip
NATURE = ("commit_timestamp", "server_transaction_id", "transaction_tag")


def without_nature(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in NATURE}


def check_nature(found: list[dict[str, Any]], tag: str = "sql") -> None:
    """The fields that differ by nature: one RFC 3339 timestamp and one transaction id
    for the records of one transaction, and the tag of its writer."""
    assert len({r["commit_timestamp"] for r in found}) == 1
    assert all(RFC3339.match(r["commit_timestamp"]) for r in found)
    ids = {r["server_transaction_id"] for r in found}
    assert len(ids) == 1 and all(isinstance(i, str) and i for i in ids)
    assert {r["transaction_tag"] for r in found} == {tag}


@pytest.fixture
def accounts(session):
    session.sql(ACCOUNTS)
    return session


def test_transfer_between_two_accounts_in_two_partitions_is_the_reference_example(accounts):
    s = accounts
    s.sql("""CREATE CHANGE STREAM CS FOR "AccountBalance" OPTIONS (partitions = 3)""")
    s.sql("""INSERT INTO "AccountBalance" VALUES ('Id1', '2022-09-26 11:28:00.189413', 1500),
             ('Id2', '2022-01-20 11:25:00.199915', 1500)""")
    placed = separate(s, "CS", ["Id1", "Id2"])
    start = now()
    with s.transaction():  # one transaction: 500 from Id1 to Id2
        s.sql("""UPDATE "AccountBalance" SET "Balance" = "Balance" - 500,
                 "LastUpdate" = '2022-09-27 12:30:00.123456' WHERE "AccountId" = 'Id1'""")
        s.sql("""UPDATE "AccountBalance" SET "Balance" = "Balance" + 500,
                 "LastUpdate" = '2022-09-27 12:30:00.123456' WHERE "AccountId" = 'Id2'""")
    tree = read_tree(s, "CS", start)
    by_token = {token: changes(found) for token, found in tree.items()}
    first, second = by_token[placed["Id1"]], by_token[placed["Id2"]]
    assert [without_nature(r) for r in first] == [without_nature(TRANSFER[0])]
    assert [without_nature(r) for r in second] == [without_nature(TRANSFER[1])]
    assert sum(len(found) for found in by_token.values()) == 2  # no other partition has any
    check_nature(first + second)
    # The commit timestamp is the commit's time, not the table's data.
    assert micros(start) <= micros(first[0]["commit_timestamp"]) <= now_us()


def test_both_accounts_in_one_partition_share_one_record(accounts):
    s = accounts
    s.sql("""CREATE CHANGE STREAM CS FOR "AccountBalance" """)
    s.sql("""INSERT INTO "AccountBalance" VALUES ('Id1', '2022-09-26 11:28:00.189413', 1500),
             ('Id2', '2022-01-20 11:25:00.199915', 1500)""")
    start = now()
    s.sql("""UPDATE "AccountBalance" SET "LastUpdate" = '2022-09-27 12:30:00.123456',
             "Balance" = CASE "AccountId" WHEN 'Id1' THEN 1000 ELSE 2000 END""")
    (record,) = changes(read_tree(s, "CS", start).popitem()[1])
    expected = copy.deepcopy(TRANSFER[0])
    expected["mods"] += TRANSFER[1]["mods"]
    expected["number_of_records_in_transaction"] = 1
    expected["number_of_partitions_in_transaction"] = 1
    assert without_nature(record) == without_nature(expected)
    check_nature([record])


@pytest.mark.parametrize("capture", sorted(LAST_UPDATE_ONLY))
def test_an_update_of_last_update_only_is_the_reference_example(accounts, capture):
    s = accounts
    s.sql(f"""CREATE CHANGE STREAM CS FOR "AccountBalance"
              OPTIONS (value_capture_type = '{capture}')""")
    s.sql("""INSERT INTO "AccountBalance" VALUES ('Id1', '2022-09-26 11:28:00.189413', 1000)""")
    start = now()
    s.sql("""UPDATE "AccountBalance" SET "LastUpdate" = '2022-09-27 12:30:00.123456'
             WHERE "AccountId" = 'Id1'""")
    (record,) = changes(read_tree(s, "CS", start).popitem()[1])
    assert without_nature(record) == without_nature(LAST_UPDATE_ONLY[capture])
    check_nature([record])


# The shapes of INSERT, UPDATE and DELETE
def expected_mod(capture, kind, keys, before, after):
    """A mod as the value capture types define it: ``before``/``after`` hold the non-key
    columns' JSON values (None: the row is absent). Returns (column names listed, mod)."""
    columns = list((after or before).keys())
    # an INSERT or a DELETE changes every column
    changed = [c for c in columns if before[c] != after[c]] if kind == "UPDATE" else columns
    full_row = capture in ("NEW_ROW", "NEW_ROW_AND_OLD_VALUES")
    new = {} if kind == "DELETE" else {c: after[c] for c in (columns if full_row else changed)}
    keeps_old = capture in ("OLD_AND_NEW_VALUES", "NEW_ROW_AND_OLD_VALUES")
    old = {c: before[c] for c in changed} if kind != "INSERT" and keeps_old else {}
    return (columns if full_row else changed), {"keys": keys, "new_values": new,
                                                "old_values": old}  # fmt: skip


T_TYPES = {
    "ID": {"name": "ID", "type": {"code": "INT"}, "is_primary_key": True, "ordinal_position": 1},
    "NAME": {"name": "NAME", "type": {"code": "STRING"}, "is_primary_key": False,
             "ordinal_position": 2},
    "PRICE": {"name": "PRICE", "type": {"code": "NUMERIC"}, "is_primary_key": False,
              "ordinal_position": 3},
}  # fmt: skip


def expected_record(capture, kind, mods, key_types, types):
    """The record of one transaction's ``mods`` of one kind (as :func:`expected_mod`
    gives them) without the fields of nature and sequence."""
    listed = {name for names, _ in mods for name in names}
    return {
        "table_name": "T" if "ID" in key_types else "N",
        "column_types": [t for name, t in types.items() if name in key_types or name in listed],
        "mods": [mod for _, mod in mods],
        "mod_type": kind,
        "value_capture_type": capture,
        "is_system_transaction": False,
    }


def transactions(found):
    """Data change records grouped by transaction, in commit order, each sorted by
    record_sequence; checks what holds for every transaction read from one partition."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in found:
        groups.setdefault(record["server_transaction_id"], []).append(record)
    out = list(groups.values())
    stamps = [micros(group[0]["commit_timestamp"]) for group in out]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    for group in out:
        assert [r["record_sequence"] for r in group] == [f"{i:08d}" for i in range(len(group))]
        assert [r["is_last_record_in_transaction_in_partition"] for r in group] == [
            i == len(group) - 1 for i in range(len(group))
        ]
        assert {r["number_of_records_in_transaction"] for r in group} == {len(group)}
        assert {r["number_of_partitions_in_transaction"] for r in group} == {1}
        check_nature(group)
    return out


def shape(record):
    return {k: v for k, v in record.items() if k not in (*NATURE, "record_sequence",
            "is_last_record_in_transaction_in_partition", "number_of_records_in_transaction",
            "number_of_partitions_in_transaction")}  # fmt: skip


CAPTURES = ("OLD_AND_NEW_VALUES", "NEW_VALUES", "NEW_ROW", "NEW_ROW_AND_OLD_VALUES")


@pytest.mark.parametrize("capture", CAPTURES)
def test_insert_update_delete_and_a_key_change_for_each_capture_type(session, capture):
    s = session
    s.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, NAME VARCHAR, PRICE NUMBER(10,2))")
    s.sql(f"CREATE CHANGE STREAM CS FOR T OPTIONS (value_capture_type = '{capture}')")
    s.sql("INSERT INTO T VALUES (1, 'a', 1.50), (2, 'b', NULL)")
    s.sql("UPDATE T SET PRICE = 2.25 WHERE ID = 1")
    s.sql("UPDATE T SET NAME = NAME, PRICE = PRICE")  # copy-on-write noise: no record
    s.sql("UPDATE T SET ID = 3 WHERE ID = 2")  # a key change: DELETE 2, INSERT 3
    s.sql("DELETE FROM T WHERE ID = 1")
    history = s.sql("DESCRIBE HISTORY T").collect()
    assert len([r for r in history if r["source"] == "SQL"]) == 5  # the noise is a version
    row1, row1b = {"NAME": "a", "PRICE": "1.50"}, {"NAME": "a", "PRICE": "2.25"}
    row2 = {"NAME": "b", "PRICE": None}

    def record(kind, *mods):
        return expected_record(capture, kind, [expected_mod(capture, kind, *m) for m in mods],
                               ["ID"], T_TYPES)  # fmt: skip

    expected = [
        [record("INSERT", ({"ID": 1}, None, row1), ({"ID": 2}, None, row2))],
        [record("UPDATE", ({"ID": 1}, row1, row1b))],
        [record("DELETE", ({"ID": 2}, row2, None)), record("INSERT", ({"ID": 3}, None, row2))],
        [record("DELETE", ({"ID": 1}, row1b, None))],
    ]
    (found,) = read_tree(s, "CS", created(s, "CS")).values()
    assert [[shape(r) for r in group] for group in transactions(changes(found))] == expected
    # The read ends with a heartbeat after every record.
    assert list(found[-1]) == ["heartbeat_record"]
    last = micros(found[-1]["heartbeat_record"]["timestamp"])
    assert all(micros(r["commit_timestamp"]) <= last for r in changes(found))


def test_a_table_without_a_primary_key_is_keyed_by_its_row_ids(session):
    from deltalake import DeltaTable

    from flush import read_table

    s = session
    s.sql("CREATE TABLE N (V VARCHAR, W NUMBER)")
    s.sql("CREATE CHANGE STREAM CS FOR N OPTIONS (value_capture_type = 'NEW_ROW_AND_OLD_VALUES')")
    s.sql("INSERT INTO N VALUES ('x', 1), ('y', 2), ('x', 1)")  # a duplicate row too
    table = read_table(DeltaTable(s.require_table("N").uri)).to_pylist()
    ids = sorted(r["_INGEST_ROW_ID"] for r in table)
    y_id = next(r["_INGEST_ROW_ID"] for r in table if r["V"] == "y")
    s.sql("UPDATE N SET W = 3 WHERE V = 'y'")
    s.sql("DELETE FROM N WHERE V = 'y'")
    types = {
        "METADATA$ROW_ID": {"name": "METADATA$ROW_ID", "type": {"code": "INT64"},
                            "is_primary_key": True, "ordinal_position": 0, "is_row_id": True},
        "V": {"name": "V", "type": {"code": "STRING"}, "is_primary_key": False,
              "ordinal_position": 1},
        "W": {"name": "W", "type": {"code": "INT"}, "is_primary_key": False,
              "ordinal_position": 2},
    }  # fmt: skip
    rows = {r["_INGEST_ROW_ID"]: {"V": r["V"], "W": r["W"]} for r in table}
    capture = "NEW_ROW_AND_OLD_VALUES"

    def record(kind, *mods):
        made = [expected_mod(capture, kind, {"METADATA$ROW_ID": i}, b, a) for i, b, a in mods]
        return expected_record(capture, kind, made, ["METADATA$ROW_ID"], types)

    expected = [
        [record("INSERT", *[(i, None, rows[i]) for i in ids])],
        [record("UPDATE", (y_id, rows[y_id], {"V": "y", "W": 3}))],
        [record("DELETE", (y_id, {"V": "y", "W": 3}, None))],
    ]
    (found,) = read_tree(s, "CS", created(s, "CS")).values()
    assert [[shape(r) for r in group] for group in transactions(changes(found))] == expected


# Value conversion: a record's values are what SELECT returns
_FLUSHES = iter(range(1, 1_000_000))


def flush_rows(session, table, rows, channel="orders-p0"):
    """Commit ``rows`` into ``table`` as a channel's flush does (one transaction)."""
    info = session.require_table(table)
    batch, _ = convert_rows(info.schema, rows)
    first = session.catalog.reserve_row_ids(info.id, len(rows))
    offset = next(_FLUSHES)
    TableWriter(info.uri, info.schema).commit_flush(
        [pa.Table.from_batches([batch])],
        [ChannelProgress(channel, 1, offset, str(offset), len(rows))],
        first,
    )


TYPES = {
    "N0": "NUMBER(38,0)", "N3": "NUMBER(12,3)", "F": "FLOAT", "S": "VARCHAR", "B": "BINARY",
    "BOOL": "BOOLEAN", "D": "DATE", "T": "TIME", "NTZ": "TIMESTAMP_NTZ",
    "LTZ": "TIMESTAMP_LTZ", "TZ": "TIMESTAMP_TZ", "V": "VARIANT", "A": "ARRAY", "O": "OBJECT",
}  # fmt: skip
_BIG = 10**38 - 1
_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_AWARE = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
    timezones=st.sampled_from([UTC, *(timezone(timedelta(hours=h)) for h in (-8, 5, 14))]),
)  # fmt: skip
VALUES = {
    "N0": st.integers(-_BIG, _BIG) | st.integers(-(2**63), 2**63),
    "N3": st.decimals(min_value=Decimal("-999999999.999"), max_value=Decimal("999999999.999"),
                      places=3, allow_nan=False, allow_infinity=False),
    "F": st.floats() | st.sampled_from([-0.0, math.inf, -math.inf, math.nan]),
    "S": st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    "B": st.binary(max_size=12),
    "BOOL": st.booleans(),
    "D": st.dates(),
    "T": st.times(),
    "NTZ": st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59)),
    "LTZ": _AWARE,
    "TZ": _AWARE,
    "V": _JSON.map(json.dumps),  # as text (a str is read as JSON text)
    "A": st.lists(_JSON, max_size=3),
    "O": st.dictionaries(st.text(max_size=4), _JSON, max_size=3),
}  # fmt: skip
ROW = st.fixed_dictionaries({name: st.none() | values for name, values in VALUES.items()})


def _instant(value: datetime) -> datetime:
    """An instant SELECT returned (naive datetimes are the driver's local time)."""
    return value.astimezone(UTC) if value.tzinfo is None else value


def same_value(name: str, found: Any, selected: Any) -> bool:
    """Whether a record's JSON value ``found`` stands for the value SELECT returned."""
    if name == "V" and selected == "null":  # JSON's null is a record's null, as SQL NULL
        return found is None
    if selected is None or found is None:
        return selected is None and found is None
    if name == "N0":  # an integer as a number; beyond 64 bits as exact text
        if isinstance(found, str):
            return not -(2**63) <= selected < 2**63 and Decimal(found) == selected
        return isinstance(found, int) and not isinstance(found, bool) and found == selected
    if name == "N3":  # a decimal as exact text with the column's scale
        return found == str(selected)
    if name == "F":
        if isinstance(found, str):
            text = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[found]
            return math.isnan(selected) if math.isnan(text) else text == selected
        return isinstance(found, float) and found == selected and (
            math.copysign(1, found) == math.copysign(1, selected))  # fmt: skip
    if name == "B":
        return base64.b64decode(found, validate=True) == bytes(selected)
    if name == "D":
        return date.fromisoformat(found) == selected
    if name == "NTZ":
        assert RFC3339.match(found), found
        return datetime.fromisoformat(found.removesuffix("Z")) == selected
    if name in ("LTZ", "TZ"):
        assert RFC3339.match(found), found
        return datetime.fromisoformat(found.replace("Z", "+00:00")) == _instant(selected)
    if name in ("V", "A", "O"):  # JSON as JSON (exact numbers), not as text
        return found == json.loads(selected) and type(found) is type(json.loads(selected))
    return found == selected and type(found) is type(selected)  # S, BOOL, T (text)


@pytest.fixture
def typed(session):
    columns = ", ".join(f"{name} {kind}" for name, kind in TYPES.items())
    session.sql(f"CREATE TABLE V (K NUMBER PRIMARY KEY, {columns})")
    session.sql("CREATE CHANGE STREAM CS FOR V OPTIONS (value_capture_type = 'NEW_ROW')")
    return session


_KEYS = iter(range(1, 1_000_000))


@settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=st.lists(ROW, min_size=1, max_size=4))
@example(
    rows=[  # a big integer beside a small one, in a number and in JSON
        {**dict.fromkeys(TYPES), "N0": 10**37, "V": {"n": 2**64 + 1}, "A": [0.1, 10**20]},
        {
            **dict.fromkeys(TYPES),
            "N0": -5,
            "O": {"n": Decimal("1.00000000000000000001")},
            "F": -0.0,
            "S": "\u00e4\U0001f600\x00",
            "NTZ": datetime(1, 1, 1),
        },
    ]
)
def test_values_are_what_select_returns(typed, rows):
    s = typed
    keyed = [{"K": next(_KEYS), **row} for row in rows]
    start = now()
    flush_rows(s, "V", keyed)
    (token,) = [p["token"] for p in partitions(s, "CS")]
    (record,) = changes(read(s, "CS", start, token))
    assert record["mod_type"] == "INSERT" and record["transaction_tag"] == "channels=orders-p0"
    listed = [t["name"] for t in record["column_types"]]
    assert listed == ["K", *TYPES]
    keys = ", ".join(str(row["K"]) for row in keyed)
    selected = {r["K"]: r for r in s.sql(f"SELECT * FROM V WHERE K IN ({keys})").collect()}
    assert sorted(m["keys"]["K"] for m in record["mods"]) == sorted(selected)
    for mod in record["mods"]:
        row = selected[mod["keys"]["K"]]
        assert list(mod["new_values"]) == list(TYPES)
        for name, found in mod["new_values"].items():
            assert same_value(name, found, row[name]), (name, found, row[name])


def test_copy_on_write_noise_of_every_type_is_no_record(typed):
    """An UPDATE that rewrites rows unchanged is none, whatever the types: NaN equals
    NaN, -0.0 stays -0.0, JSON with numbers beyond a double is compared exactly."""
    s = typed
    start = now()
    flush_rows(s, "V", [
        {"K": 1, "N0": 10**37, "N3": Decimal("-0.001"), "F": math.nan, "S": "\u00e4", "B": b"\0",
         "BOOL": False, "D": date(1, 1, 1), "T": "23:59:59.999999999",
         "NTZ": datetime(2022, 9, 27, 12, 30), "LTZ": datetime(2022, 9, 27, tzinfo=UTC),
         "TZ": datetime(2022, 9, 27, tzinfo=UTC), "V": {"n": 2**64 + 1}, "A": [10**30],
         "O": {"x": Decimal("0.10000000000000000001")}},
        {"K": 2, "F": -0.0},
    ])  # fmt: skip
    s.sql(f"UPDATE V SET {', '.join(f'{c} = {c}' for c in TYPES)}")
    assert s.sql("DESCRIBE HISTORY V").collect()[0]["operation"] == "MERGE"
    (token,) = [p["token"] for p in partitions(s, "CS")]
    assert [r["mod_type"] for r in changes(read(s, "CS", start, token))] == ["INSERT"]


# Heartbeats
def reader(session, cs, start_us, token, heartbeat_ms=1000, until_us=None):
    """The read generator every face runs (SQL bounds a read to the statement's start;
    this one runs until ``until_us``, or for as long as it is iterated)."""
    from pipelines.change_streams.read import ReadArgs
    from pipelines.change_streams.read import read as read_records

    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    args = ReadArgs(start_us, None, token, heartbeat_ms)
    return read_records(session.catalog, stream, args, until_us=until_us)


def moment(record) -> int:
    (body,) = record.values()
    return micros(body.get("commit_timestamp") or body.get("timestamp") or body["start_timestamp"])


def check_progress(found):
    """Heartbeats strictly increase, and every one is at or after every record before it
    and before every record after it; commit timestamps never go back."""
    beats = [moment(r) for r in found if "heartbeat_record" in r]
    assert beats == sorted(beats) and len(set(beats)) == len(beats), beats
    latest_beat = latest_change = -1
    for record in found:
        if "heartbeat_record" in record:
            assert moment(record) >= latest_change
            latest_beat = moment(record)
        elif "data_change_record" in record:
            assert moment(record) > latest_beat, "a record at or before a heartbeat"
            assert moment(record) >= latest_change
            latest_change = moment(record)


@pytest.fixture
def watched(session):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    (token,) = [p["token"] for p in partitions(session, "CS")]
    return session, token


def test_an_idle_table_gets_a_heartbeat_each_interval_and_a_bounded_read_ends_with_one(watched):
    s, token = watched
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    started = time.monotonic()
    until = now_us() + 3_500_000
    arrived = []
    found = []
    for record in reader(s, "CS", stream.created_us, token, until_us=until):
        arrived.append(time.monotonic() - started)
        found.append(record)
    assert all(list(r) == ["heartbeat_record"] for r in found)
    check_progress(found)
    assert 3 <= len(found) <= 5, found  # about one a second, then the end
    assert moment(found[-1]) == until
    assert all(b - a < 2.5 for a, b in zip([0.0, *arrived], arrived, strict=False))
    # In SQL: the read ends with a heartbeat at the statement's start.
    before = now_us()
    (last,) = read(s, "CS", rfc3339(stream.created_us), token)
    assert before <= moment(last) <= now_us()


def test_records_come_after_the_heartbeat_before_them(watched):
    s, token = watched
    start = now_us()
    records = reader(s, "CS", start, token)
    found = [next(records)]  # the first heartbeat: nothing up to it
    s.sql("INSERT INTO T VALUES (1, 'a')")
    s.sql("UPDATE T SET V = 'b'")
    while len(changes(found)) < 2 or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    check_progress(found)
    assert [c["mod_type"] for c in changes(found)] == ["INSERT", "UPDATE"]


@pytest.mark.parametrize("writer", ["sql", "flush"])
def test_a_writer_whose_clock_is_behind_commits_after_the_heartbeat(watched, monkeypatch, writer):
    """A writer 60 s behind commits after a reader said "everything up to H": its
    records still come after H, and commit timestamps strictly increase per table."""
    from flush.commit_clock import commit_ts

    s, token = watched
    start = now_us()
    records = reader(s, "CS", start, token)
    (beat,) = next(records).values()
    monkeypatch.setattr(commit_clock, "clock", lambda: now_us() - 60_000_000)
    keys = iter(range(1, 100))

    def write():
        if writer == "sql":
            s.sql(f"INSERT INTO T VALUES ({next(keys)}, 'late')")
        else:
            flush_rows(s, "T", [{"ID": next(keys), "V": "late"}])

    write()
    info = s.require_table("T")
    version = max(int(r["version"]) for r in s.sql("DESCRIBE HISTORY T").collect())
    assert commit_ts(info.uri, version) < micros(beat["timestamp"])  # stamped before H
    found = [{"heartbeat_record": beat}]
    while not changes(found) or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    write()  # a second late commit, after the next heartbeat too
    monkeypatch.undo()
    write()  # and one on time
    while len(changes(found)) < 3 or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    check_progress(found)
    stamps = [micros(c["commit_timestamp"]) for c in changes(found)]
    assert len(stamps) == 3 and stamps == sorted(set(stamps))
    # Every face agrees: a later read in SQL gives the same timestamps.
    again = changes(read(s, "CS", rfc3339(start), token))
    assert [micros(c["commit_timestamp"]) for c in again] == stamps


# Retention and bad arguments
def refused(session, text, code, *words, kind=SqlError):
    with pytest.raises(kind) as caught:
        session.sql(text).collect()
    assert caught.value.code == code, caught.value
    for word in words:
        assert word in str(caught.value), caught.value
    return caught.value


def test_a_start_outside_retention_before_creation_or_in_the_future_is_refused(watched):
    s, token = watched
    table = s.require_table("T")
    # A stream made two hours ago that keeps one hour (the catalog's own call: CREATE
    # stamps the present).
    old = s.catalog.create_change_stream(
        "DB", "PUBLIC", "OLD", for_all=False, table_ids=(table.id,),
        value_capture_type="NEW_ROW", retention_s=3600, created_us=now_us() - 7_200_000_000,
    )  # fmt: skip
    (old_token,) = [p.token for p in s.catalog.list_partitions(old.uid)]
    hour_ago = now_us() - 3_600_000_000
    message = refused(s, f"SELECT * FROM READ_OLD('{rfc3339(hour_ago - 5_000_000)}', NULL, "
                         f"'{old_token}', 1000)", "INVALID_ARGUMENT", "retention period")  # fmt: skip
    assert "3600 s" in str(message)
    # Just inside the retention period: read.
    (last,) = read(s, "OLD", rfc3339(hour_ago + 60_000_000), old_token)
    assert list(last) == ["heartbeat_record"]
    # Before the stream was created; at that moment; in the future.
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    refused(s, f"SELECT * FROM READ_CS('{rfc3339(stream.created_us - 1)}', NULL, '{token}', "
               "1000)", "INVALID_ARGUMENT", "the stream was created",
            rfc3339(stream.created_us))  # fmt: skip
    assert list(read(s, "CS", rfc3339(stream.created_us), token)[-1]) == ["heartbeat_record"]
    refused(s, f"SELECT * FROM READ_CS('{rfc3339(now_us() + 60_000_000)}', NULL, '{token}', "
               "1000)", "INVALID_ARGUMENT", "in the future")  # fmt: skip


@pytest.mark.parametrize(("arguments", "code", "words"), [
    ("start_timestamp => {start}, partition_token => '{token}', heartbeat_milliseconds => 999",
     "INVALID_ARGUMENT", ["heartbeat_milliseconds", "1,000", "300,000", "999"]),
    ("start_timestamp => {start}, partition_token => '{token}', "
     "heartbeat_milliseconds => 300001", "INVALID_ARGUMENT", ["heartbeat_milliseconds", "300001"]),
    ("start_timestamp => {start}, partition_token => '{token}', heartbeat_milliseconds => 'x'",
     "INVALID_ARGUMENT", ["heartbeat_milliseconds"]),
    ("start_timestamp => {start}, partition_token => '{token}', "
     "heartbeat_milliseconds => 1000.5", "INVALID_ARGUMENT", ["heartbeat_milliseconds", "1000.5"]),
    ("start_timestamp => {start}, partition_token => '{token}'", "INVALID_ARGUMENT",
     ["heartbeat_milliseconds"]),
    ("partition_token => '{token}', heartbeat_milliseconds => 1000", "INVALID_ARGUMENT",
     ["start_timestamp is required"]),
    ("start_timestamp => 'yesterday', heartbeat_milliseconds => 1000", "INVALID_ARGUMENT",
     ["not a timestamp", "yesterday"]),
    ("start_timestamp => {start}, end_timestamp => {before}, heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["end_timestamp", "before start_timestamp"]),
    ("start_timestamp => {start}, heartbeat_milliseconds => 1000, colour => 'red'",
     "INVALID_ARGUMENT", ["unknown argument 'colour'"]),
    ("{start}, NULL, partition_token => '{token}', heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["all by name", "position"]),
    ("start_timestamp => current_timestamp(), heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["start_timestamp must be a literal"]),
    ("{start}, NULL, (SELECT 'x'), 1000", "INVALID_ARGUMENT", ["partition_token must be a literal"]),
    ("{start}, NULL, NULL, 1000, 'options'", "INVALID_ARGUMENT", ["read_options"]),
    ("{start}, NULL, NULL, 1000, NULL, NULL", "INVALID_ARGUMENT", ["at most 5 arguments"]),
    ("start_timestamp => {start}, start_timestamp => {start}, heartbeat_milliseconds => 1000",
     "INVALID_ARGUMENT", ["given twice"]),
    ("{start}, NULL, 'nope', 1000", "INVALID_ARGUMENT", ["'nope' is not a partition", "DB.PUBLIC.CS"]),
    ("{start}, NULL, 42, 1000", "INVALID_ARGUMENT", ["partition_token must be text"]),
])  # fmt: skip
def test_bad_arguments_are_refused_with_what_to_pass(watched, arguments, code, words):
    s, token = watched
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    start = f"'{rfc3339(stream.created_us + 1)}'"
    text = arguments.format(start=start, token=token, before=f"'{rfc3339(stream.created_us)}'")
    refused(s, f"SELECT * FROM READ_CS({text})", code, *words)


def test_heartbeat_bounds_stream_names_and_tokens(watched):
    s, token = watched
    start = rfc3339(s.catalog.get_change_stream("DB", "PUBLIC", "CS").created_us)
    for beat in (1000, 300000, "1.5e3"):  # both bounds are accepted, and whole numbers
        assert list(read(s, "CS", start, token, heartbeat=beat)[-1]) == ["heartbeat_record"]
    # Positional arguments in the reference's order, TIMESTAMP literals, a reserved NULL.
    found = s.sql(f"SELECT * FROM READ_CS(TIMESTAMP '{start.replace('T', ' ')[:-1]}', NULL, "
                  f"'{token}', 1000, NULL)").collect()  # fmt: skip
    assert list(json.loads(found[-1][0])) == ["heartbeat_record"]
    refused(s, f"SELECT * FROM READ_NOPE('{start}', NULL, NULL, 1000)", "OBJECT_NOT_FOUND",
            "change stream DB.PUBLIC.NOPE does not exist")  # fmt: skip
    # A token of another stream is not one of this stream's.
    s.sql("CREATE CHANGE STREAM OTHER FOR T")
    (other,) = [p["token"] for p in partitions(s, "OTHER")]
    refused(
        s,
        f"SELECT * FROM READ_CS('{now()}', NULL, '{other}', 1000)",
        "INVALID_ARGUMENT",
        f"partition_token '{other}' is not a partition of change stream DB.PUBLIC.CS",
    )
    # A child's token before the child's start.
    s.sql(f"ALTER CHANGE STREAM CS SPLIT PARTITION '{token}'")
    child = next(p for p in partitions(s, "CS") if p["state"] == "OPEN")
    refused(
        s,
        f"SELECT * FROM READ_CS('{start}', NULL, '{child['token']}', 1000)",
        "INVALID_ARGUMENT",
        "before partition",
        "start at the start_timestamp",
    )


# Who wrote a transaction
def test_a_channel_flush_is_tagged_with_its_channels(watched):
    s, token = watched
    start = now()
    info = s.require_table("T")
    batch, _ = convert_rows(info.schema, [{"ID": 1, "V": "a"}, {"ID": 2, "V": "b"}])
    first = s.catalog.reserve_row_ids(info.id, 2)
    TableWriter(info.uri, info.schema).commit_flush(  # one flush of two channels
        [pa.Table.from_batches([batch])],
        [ChannelProgress("orders-p1", 1, 1, "7", 1), ChannelProgress("orders-p0", 2, 4, "9", 1)],
        first,
    )
    s.sql("UPDATE T SET V = 'c' WHERE ID = 1")
    found = changes(read(s, "CS", start, token))
    assert [(c["mod_type"], c["transaction_tag"], c["is_system_transaction"]) for c in found] == [
        ("INSERT", "channels=orders-p0,orders-p1", False),
        ("UPDATE", "sql", False),
    ]
    assert [m["keys"]["ID"] for m in found[0]["mods"]] == [1, 2]


def rows_by_id(session, table):
    """A table's rows by their row id, values as a record holds them (no Spark)."""
    from deltalake import DeltaTable

    from flush import read_table

    def as_json(value):
        if isinstance(value, Decimal):
            return int(value) if value == value.to_integral_value() else str(value)
        return value

    found = read_table(DeltaTable(session.require_table(table).uri)).to_pylist()
    return {r.pop("_INGEST_ROW_ID"): {c: as_json(v) for c, v in r.items()} for r in found}


@pytest.mark.parametrize(("action", "query"), [
    ("INCREMENTAL", "SELECT ID, V, QTY * 10 AS Q FROM SRC WHERE V <> 'x'"),
    ("FULL", "SELECT ID, V, count(*) OVER (PARTITION BY V) AS Q FROM SRC"),
])  # fmt: skip
def test_a_dynamic_table_refresh_is_a_system_transaction_of_its_net_change(session, action, query):
    s = session
    s.sql("CREATE TABLE SRC (ID NUMBER PRIMARY KEY, V VARCHAR, QTY NUMBER)")
    s.sql("INSERT INTO SRC VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
    s.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {query}")
    s.sql("CREATE CHANGE STREAM CS FOR D OPTIONS (value_capture_type = 'NEW_ROW_AND_OLD_VALUES')")
    before = rows_by_id(s, "D")
    start = now()
    s.sql("UPDATE SRC SET QTY = 20 WHERE ID = 2")
    s.sql("UPDATE SRC SET V = 'x' WHERE ID = 3")  # leaves D
    s.sql("INSERT INTO SRC VALUES (4, 'd', 4)")
    s.sql("UPDATE SRC SET QTY = 5 WHERE ID = 1")  # and back: no net change of row 1
    s.sql("UPDATE SRC SET QTY = 1 WHERE ID = 1")
    s.sql("ALTER DYNAMIC TABLE D REFRESH")
    history = s.sql("SELECT REFRESH_ACTION FROM TABLE(DYNAMIC_TABLE_REFRESH_HISTORY())")
    assert history.collect()[0]["REFRESH_ACTION"] == action
    after = rows_by_id(s, "D")
    assert after != before
    (token,) = [p["token"] for p in partitions(s, "CS")]
    found = changes(read(s, "CS", start, token))
    assert {(c["transaction_tag"], c["is_system_transaction"]) for c in found} == {
        ("dynamic_table=DB.PUBLIC.D", True)
    }
    assert len({c["server_transaction_id"] for c in found}) == 1  # one refresh, one commit
    # The records are D's net change: applied to D before, they give D after.
    state = dict(before)
    mods = [(c["mod_type"], mod) for c in found for mod in c["mods"]]
    for kind, mod in mods:
        row_id = mod["keys"]["METADATA$ROW_ID"]
        old = {c: state[row_id][c] for c in mod["old_values"]} if kind != "INSERT" else {}
        assert mod["old_values"] == old
        if kind == "DELETE":
            assert set(mod["old_values"]) == {"ID", "V", "Q"}
            del state[row_id]
        else:
            assert row_id not in state if kind == "INSERT" else row_id in state
            state[row_id] = mod["new_values"]
    assert state == after
    changed = {i for i in before.keys() | after.keys() if before.get(i) != after.get(i)}
    assert sorted(mod["keys"]["METADATA$ROW_ID"] for _, mod in mods) == sorted(changed)


def test_compaction_is_no_record(watched, spark):
    s, token = watched
    start = now()
    for key in (1, 2, 3):  # three files
        flush_rows(s, "T", [{"ID": key, "V": str(key)}])
    info = s.require_table("T")
    assert compact_table(spark, info.uri, CompactionPolicy()).status == "SUCCEEDED"
    assert s.sql("DESCRIBE HISTORY T").collect()[0]["source"] == "COMPACTION"
    s.sql("DELETE FROM T WHERE ID = 2")
    found = changes(read(s, "CS", start, token))
    assert [(c["mod_type"], [m["keys"]["ID"] for m in c["mods"]]) for c in found] == [
        ("INSERT", [1]),
        ("INSERT", [2]),
        ("INSERT", [3]),
        ("DELETE", [2]),
    ]
