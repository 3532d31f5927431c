"""One reading of a moment everywhere a user writes one: a statement's ``AT(TIMESTAMP =>
...)``, a change stream read's ``start_timestamp``/``end_timestamp`` and a Spark source's
``startingTimestamp`` option read the same texts as the same instant
(:func:`ingest_sdk.temporal.moment_micros`): Snowflake's printed form
(``2026-12-01 10:00:00.000 -0800``), RFC 3339, a fraction past microseconds truncated;
and refuse the same texts, each with its own error (a day that does not exist, an epoch
number, an ISO week date, a moment before year 1).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flush.commit_clock import now_us
from pipelines.change_streams.records import rfc3339
from pipelines.errors import InvalidOptionError
from pipelines.spark_sources.source_options import SourceOptions
from tests.pipelines.change_streams.test_read import changes, read
from tests.pipelines.refusals import assert_refused

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
REFUSED = ("2026-02-30 10:00:00", "1700000000", "2026-W48-1", "0000-12-31 23:00:00", "now")


def spellings(micros: int) -> list[str]:
    """One instant written four ways a user may copy it."""
    moment = EPOCH + timedelta(microseconds=micros)
    pacific = moment - timedelta(hours=8)
    return [
        rfc3339(micros),
        moment.strftime("%Y-%m-%d %H:%M:%S.%f"),  # UTC, no offset
        pacific.strftime("%Y-%m-%d %H:%M:%S.%f -0800"),  # Snowflake's printed form
        moment.strftime("%Y-%m-%dT%H:%M:%S.%f") + "999+00:00",  # nanoseconds, truncated
    ]


def test_time_travel_reads_every_spelling_of_a_moment_alike(session):
    session.sql("CREATE TABLE T (ID NUMBER)")
    session.sql("INSERT INTO T VALUES (1)")
    between = now_us()
    session.sql("INSERT INTO T VALUES (2)")
    for text in spellings(between):
        rows = session.sql(f"SELECT ID FROM T AT(TIMESTAMP => '{text}')").collect()
        assert [r.ID for r in rows] == [1], text
    for text in REFUSED:  # year 0 is a moment (proleptic), before every version
        why = "has no version at or before" if text.startswith("0000") else "cannot read"
        assert_refused(session, f"SELECT ID FROM T AT(TIMESTAMP => '{text}')",
                       "SQL_COMPILATION_ERROR", why)  # fmt: skip


def test_a_change_stream_read_takes_every_spelling_of_its_start(watched):
    s, token = watched
    start = now_us()
    s.sql("INSERT INTO T VALUES (1, 'a')")
    found = [changes(read(s, "CS", text, token)) for text in spellings(start)]
    assert [len(f) for f in found] == [1, 1, 1, 1]
    for text in REFUSED:
        assert_refused(s, f"SELECT * FROM READ_CS(start_timestamp => '{text}', "
                          f"partition_token => '{token}', heartbeat_milliseconds => 1000)",
                       "INVALID_ARGUMENT", "start_timestamp")  # fmt: skip


def test_a_spark_source_option_takes_every_spelling_of_a_moment():
    micros = 1_796_148_000_123_456
    for text in spellings(micros):
        options = SourceOptions(
            {"startingTimestamp": text}, "ingest-changes", ["startingTimestamp"]
        )
        assert options.timestamp("startingTimestamp") == EPOCH + timedelta(microseconds=micros)
    for text in REFUSED:
        options = SourceOptions(
            {"startingTimestamp": text}, "ingest-changes", ["startingTimestamp"]
        )
        with pytest.raises(InvalidOptionError, match="startingTimestamp"):
            options.timestamp("startingTimestamp")
