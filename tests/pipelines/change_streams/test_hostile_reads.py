"""Hostile reads of change streams: arguments outside the calendar, bad timestamps,
heartbeats and tokens (SQL in a token, another stream's token), reads inside views,
CTEs, inserts and other schemas, unicode and dotted stream names, tables whose labels
collide; and over HTTP, a 4xx for each and many concurrent reads.

Written by the adversarial review of change streams, with ``test_delivery_guarantees``.
Seven tests of that review found defects, fixed with them: a writer whose clock is
ahead held back heartbeats and gave timestamps a reader could not resume from; tables
whose labels collide were mixed up; a moment outside the calendar was a 500. The
others held.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import orjson
import pytest

from flush.commit_clock import now_us
from pipelines.change_streams.records import rfc3339
from pipelines.errors import ObjectNotFoundError
from tests.pipelines.change_streams.test_read import changes, created, partitions, read_tree
from tests.pipelines.refusals import assert_refused


def call(start="NULL", end="NULL", token="NULL", heartbeat="1000", name="READ_CS"):
    return (
        f"SELECT * FROM {name}(start_timestamp => {start}, end_timestamp => {end}, "
        f"partition_token => {token}, heartbeat_milliseconds => {heartbeat})"
    )


# Hostile arguments
@pytest.mark.parametrize(
    "which",
    [
        ("start", "'0001-01-01T00:00:00+01:00'"),
        ("start", "'9999-12-31T23:59:59-01:00'"),
        ("end", "'0001-01-01T00:00:00+01:00'"),
    ],
)
def test_a_timestamp_outside_the_calendar_is_refused_as_an_invalid_argument(watched, which):
    s, token = watched
    arg, value = which
    start = f"'{created(s, 'CS')}'"
    text = call(start=value, token=f"'{token}'") if arg == "start" else call(start, value)
    assert_refused(s, text, "INVALID_ARGUMENT")


def test_ordinary_bad_timestamps_and_heartbeats_are_refused(watched):
    s, token = watched
    start = f"'{created(s, 'CS')}'"
    for bad in ("'now'", "'0001-01-01'", "'9999-12-31'", "'1700000000'", "'NaN'", "''"):
        assert_refused(s, call(start=bad), "INVALID_ARGUMENT")
    for beat in ("1e400", "-1000", "'NaN'", "'Infinity'", "999", "300001", "1000.5", "NULL"):
        assert_refused(s, call(start=start, token=f"'{token}'", heartbeat=beat), "INVALID_ARGUMENT")
    assert_refused(
        s, call(start=start).replace("end_timestamp", "START_TIMESTAMP"), "INVALID_ARGUMENT"
    )
    # A token that is SQL, or another stream's token, is no partition of this stream.
    s.sql("CREATE CHANGE STREAM OTHER FOR T")
    (other,) = [p["token"] for p in partitions(s, "OTHER")]
    for bad in ("'''); DROP TABLE T; --'", f"'{other}'", f"'{token} '", f"'{token.upper()}'"):
        assert_refused(s, call(start=start, token=bad), "INVALID_ARGUMENT")
    assert s.sql("SELECT count(*) FROM T").collect()[0][0] == 0


def test_read_in_views_ctes_inserts_and_other_schemas(watched):
    s, token = watched
    s.sql("INSERT INTO T VALUES (1, 'a')")
    text = call(start=f"'{created(s, 'CS')}'", token=f"'{token}'")
    s.sql(f"CREATE VIEW VV AS {text}")
    assert s.sql("SELECT count(*) FROM VV").collect()[0][0] == 2  # the change, a heartbeat
    assert_refused(
        s,
        f"CREATE DYNAMIC TABLE DD TARGET_LAG = '1 minute' AS {text}",
        "SQL_COMPILATION_ERROR",
    )
    s.sql("CREATE TABLE SINK (C VARCHAR)")
    s.sql(f"INSERT INTO SINK {text}")
    assert s.sql("SELECT count(*) FROM SINK").collect()[0][0] == 2
    assert s.sql(f"WITH x AS ({text}) SELECT count(*) FROM x").collect()[0][0] == 2
    s.sql("CREATE SCHEMA S2")
    s.sql("CREATE TABLE DB.S2.U (ID NUMBER PRIMARY KEY)")
    s.sql("CREATE CHANGE STREAM DB.S2.CS FOR DB.S2.U")
    s.sql("INSERT INTO DB.S2.U VALUES (7)")
    stream = s.catalog.get_change_stream("DB", "S2", "CS")
    start = f"'{rfc3339(stream.created_us)}'"
    (first,) = [orjson.loads(r[0]) for r in s.sql(call(start, name="DB.S2.READ_CS")).collect()]
    other = first["child_partitions_record"]["child_partitions"][0]["token"]
    assert other != token
    found = [orjson.loads(r[0]) for r in s.sql(call(start, token=f"'{other}'", name="DB.S2.READ_CS")).collect()]  # fmt: skip
    assert [m["keys"] for c in changes(found) for m in c["mods"]] == [{"ID": 7}]
    s.sql("DROP SCHEMA DB.S2 CASCADE")
    assert_refused(
        s, call(start, name="DB.S2.READ_CS"), "OBJECT_NOT_FOUND", kind=ObjectNotFoundError
    )


def test_unicode_and_dotted_stream_names(watched):
    s, _ = watched
    for name in ("ström", "a.b", "x" * 200):
        s.sql(f'CREATE CHANGE STREAM "{name}" FOR T')
        stream = s.catalog.get_change_stream("DB", "PUBLIC", name)
        first = s.sql(call(f"'{rfc3339(stream.created_us)}'", name=f'"READ_{name}"')).collect()
        assert len(first) == 1


# Table names that collide in records
def test_a_for_all_stream_keeps_tables_with_the_same_label_apart(session):
    s = session
    s.sql("CREATE CHANGE STREAM ALLCS FOR ALL")
    s.sql('CREATE TABLE DB.PUBLIC."DB.S2.T" (ID NUMBER PRIMARY KEY, V VARCHAR)')
    s.sql("CREATE SCHEMA S2")
    s.sql("USE SCHEMA DB.PUBLIC")  # CREATE SCHEMA made S2 the current schema
    s.sql("CREATE TABLE DB.S2.T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("INSERT INTO DB.S2.T VALUES (1, 's2')")
    s.sql("INSERT INTO DB.S2.T VALUES (3, 's2 again')")
    s.sql("INSERT INTO DB.PUBLIC.\"DB.S2.T\" VALUES (2, 'public')")
    tree = read_tree(s, "ALLCS", created(s, "ALLCS"))
    found = sorted(
        (m["keys"]["ID"], m["new_values"]["V"]) for r in tree.values() for c in changes(r) for m in c["mods"]
    )  # fmt: skip
    assert found == [(1, "s2"), (2, "public"), (3, "s2 again")]


# HTTP
def http_get(url: str, timeout: float = 30.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def served(server_factory, spark):
    from pipelines import Session

    server = server_factory(change_stream_check_seconds=0)
    s = Session(server.config.warehouse, spark=spark)
    s.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("CREATE CHANGE STREAM CS FOR T")
    yield server, s
    s.close()


def url_of(server, start, **extra):
    query = {"start_timestamp": start, "heartbeat_milliseconds": "1000", **extra}
    return f"{server.url}/v1/change-streams/CS/read?{urllib.parse.urlencode(query)}"


def test_http_a_timestamp_outside_the_calendar_is_a_4xx(served):
    server, _ = served
    status, body = http_get(url_of(server, "0001-01-01T00:00:00+01:00"))
    assert 400 <= status < 500, (status, body[:300])


def test_http_hostile_tokens_and_many_concurrent_reads(served):
    server, s = served
    start = created(s, "CS")
    (token,) = [p["token"] for p in partitions(s, "CS")]
    for bad in ("'); DROP TABLE T; --", "../../catalog.db", "\x00", token + "x"):
        status, body = http_get(url_of(server, start, partition_token=bad))
        assert status == 400, (status, body[:300])
    s.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b')")
    end = rfc3339(now_us())
    results: list[Any] = []

    def one():
        results.append(http_get(url_of(server, start, partition_token=token, end_timestamp=end)))

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    bodies = {body for _, body in results}
    assert {status for status, _ in results} <= {200, 429}
    ok = [body for status, body in results if status == 200]
    assert ok and len({b for b in ok}) == 1, bodies
    lines = [orjson.loads(x) for x in ok[0].splitlines()]
    assert sorted(m["keys"]["ID"] for c in changes(lines) for m in c["mods"]) == [1, 2]
    assert s.sql("SELECT count(*) FROM T").collect()[0][0] == 2
