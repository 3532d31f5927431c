"""What the records of ``SELECT * FROM READ_<cs>(...)`` hold: the reference's
AccountBalance records for the four value capture types, the shapes of INSERT, UPDATE
and DELETE (key changes, copy-on-write noise), tables without a primary key, values
against what ``SELECT`` returns, and who wrote a transaction (channels, SQL, dynamic
table refreshes, compaction). How a read proceeds (partitions, heartbeats, retention,
arguments) is in ``test_partitions.py``; its helpers are here."""

from __future__ import annotations

import base64
import copy
import json
import math
import re
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from flush import ChannelProgress, TableWriter
from flush.commit_clock import now_us
from flush.compaction import CompactionPolicy, compact_table
from ingest_sdk import convert_rows
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
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


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
    s = session
    s.sql("CREATE TABLE N (V VARCHAR, W NUMBER)")
    s.sql("CREATE CHANGE STREAM CS FOR N OPTIONS (value_capture_type = 'NEW_ROW_AND_OLD_VALUES')")
    s.sql("INSERT INTO N VALUES ('x', 1), ('y', 2), ('x', 1)")  # a duplicate row too
    rows = rows_by_id(s, "N")
    (y_id,) = [i for i, row in rows.items() if row["V"] == "y"]
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
    capture = "NEW_ROW_AND_OLD_VALUES"

    def record(kind, *mods):
        made = [expected_mod(capture, kind, {"METADATA$ROW_ID": i}, b, a) for i, b, a in mods]
        return expected_record(capture, kind, made, ["METADATA$ROW_ID"], types)

    expected = [
        [record("INSERT", *[(i, None, rows[i]) for i in sorted(rows)])],
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


@pytest.mark.parametrize(("action", "query"), [
    ("INCREMENTAL", "SELECT ID, V, QTY * 10 AS Q FROM SRC WHERE V <> 'x'"),
    ("FULL", "SELECT ID, V, count(*) OVER (PARTITION BY V) AS Q FROM SRC"),
])  # fmt: skip
def test_a_dynamic_table_refresh_is_a_system_transaction_of_its_net_change(session, action, query):
    s = session
    s.sql("CREATE TABLE SRC (ID NUMBER PRIMARY KEY, V VARCHAR, QTY NUMBER)")
    s.sql("INSERT INTO SRC VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
    mode = "REFRESH_MODE = FULL " if action == "FULL" else ""  # AUTO: ADAPTIVE, incremental
    s.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' {mode}AS {query}")
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


# Known gaps (strict: a fix makes these pass, and then the marker goes)
def test_a_record_keeps_the_value_capture_type_of_its_change(watched):
    s, token = watched
    start = now()
    s.sql("INSERT INTO T VALUES (1, 'a')")
    s.sql("UPDATE T SET V = 'b'")
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'NEW_VALUES')")
    s.sql("UPDATE T SET V = 'c'")
    found = changes(read(s, "CS", start, token))
    assert [(c["value_capture_type"], c["mods"][0]["old_values"]) for c in found[1:]] == [
        ("OLD_AND_NEW_VALUES", {"V": "a"}),
        ("NEW_VALUES", {}),
    ]


def test_a_transaction_writing_two_tables_is_one_transaction(watched):
    """One SQL transaction is one transaction in the records of every stream: one id and
    commit timestamp, numbered and counted across its tables (a stream watching one of
    them counts that one's records); a statement alone is a transaction of its own."""
    s, token = watched
    s.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("ALTER CHANGE STREAM CS SET FOR T, U")
    s.sql("CREATE CHANGE STREAM CU FOR U")
    (only_u,) = s.catalog.list_partitions(s.catalog.get_change_stream("DB", "PUBLIC", "CU").uid)
    start = now()
    with s.transaction():
        s.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
        s.sql("INSERT INTO U VALUES (1, 'a')")
        s.sql("UPDATE U SET V = 'c'")
    s.sql("INSERT INTO U VALUES (2, 'x')")
    found = changes(read(s, "CS", start, token))
    first, alone = found[:2], found[2:]
    assert sorted(c["table_name"] for c in first) == ["T", "U"]
    assert [c["table_name"] for c in alone] == ["U"]
    assert len({c["server_transaction_id"] for c in first}) == 1
    assert len({c["commit_timestamp"] for c in first}) == 1
    assert {c["number_of_records_in_transaction"] for c in first} == {2}
    assert sorted(c["record_sequence"] for c in first) == ["00000000", "00000001"]
    assert [c["is_last_record_in_transaction_in_partition"] for c in first] == [False, True]
    assert alone[0]["server_transaction_id"] != first[0]["server_transaction_id"]
    assert micros(alone[0]["commit_timestamp"]) > micros(first[0]["commit_timestamp"])
    in_u = changes(read(s, "CU", start, only_u.token))
    assert [(c["server_transaction_id"], c["commit_timestamp"], c["mods"][0]["new_values"],
             c["number_of_records_in_transaction"]) for c in in_u] == [
        (first[0]["server_transaction_id"], first[0]["commit_timestamp"], {"V": "c"}, 1),
        (alone[0]["server_transaction_id"], alone[0]["commit_timestamp"], {"V": "x"}, 1),
    ]  # fmt: skip


def test_a_transaction_of_two_tables_is_numbered_across_its_partitions(session):
    """Records of one transaction over two tables and four partitions: one id and time,
    numbered 0..n-1 across tables and partitions, counted over all of them, the last of
    each partition marked."""
    from tests.pipelines.change_streams.test_exclusions import (
        assert_numbered,
        by_transaction,
        read_partitions,
    )

    s = session
    s.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("CREATE CHANGE STREAM CS FOR T, U OPTIONS (partitions = 4)")
    with s.transaction():
        s.sql("INSERT INTO T SELECT id, 't' FROM range(12)")
        s.sql("INSERT INTO U SELECT id, 'u' FROM range(12)")
    tree = read_partitions(s, "CS")
    (transaction,) = by_transaction(tree).values()
    assert len({token for token, _ in transaction}) == 4
    assert {c["table_name"] for _, c in transaction} == {"T", "U"}
    assert len({c["commit_timestamp"] for _, c in transaction}) == 1
    assert sorted((c["table_name"], m["keys"]["ID"]) for _, c in transaction for m in c["mods"]) \
        == sorted((t, i) for t in "TU" for i in range(12))
    assert_numbered(tree)


def test_a_renamed_table_is_named_by_its_new_name(watched):
    """A table keeps its identity through ALTER TABLE ... RENAME TO; its records, the
    ones read before too, carry the name it has when they are read."""
    s, token = watched
    start = now()
    s.sql("INSERT INTO T VALUES (1, 'a')")
    assert [c["table_name"] for c in changes(read(s, "CS", start, token))] == ["T"]
    s.sql("ALTER TABLE T RENAME TO T2")
    s.sql("INSERT INTO T2 VALUES (2, 'b')")
    assert [c["table_name"] for c in changes(read(s, "CS", start, token))] == ["T2", "T2"]


def test_records_are_filtered_and_projected_in_sql(watched):
    s, token = watched
    start = now()
    s.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    s.sql("DELETE FROM T WHERE ID = 1")
    found = s.sql(
        "SELECT get_json_object(ChangeRecord, '$.data_change_record.mod_type') AS kind, "
        "get_json_object(ChangeRecord, '$.data_change_record.mods[0].keys.ID') AS id "
        f"FROM READ_CS(start_timestamp => '{start}', partition_token => '{token}', "
        "heartbeat_milliseconds => 1000) "
        "WHERE get_json_object(ChangeRecord, '$.data_change_record') IS NOT NULL"
    ).collect()
    assert [(r["KIND"], r["ID"]) for r in found] == [("INSERT", "1"), ("DELETE", "1")]
