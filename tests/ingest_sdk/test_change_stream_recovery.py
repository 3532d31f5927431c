"""ChangeStreamReader recovers from a bad start: the checkpoint is written only once the
first read succeeded, a checkpoint that does not fit the reader's arguments says what to
do (naming the file and the fix), and ``reset()`` forgets a stream's progress.

Against real change streams: a warehouse written through a session, read in process
(``local_query``) or over HTTP from a real service on a loopback port.
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime

import pytest

from flush.commit_clock import clock
from ingest_sdk import ChangeStreamReader, ConfigurationError, InvalidRequestError
from ingest_sdk.change_stream_checkpoint import SCHEMA
from ingest_sdk.change_stream_reader import rfc3339, to_micros
from pipelines import Session
from pipelines.__main__ import local_query
from tests.ingest_sdk.test_change_stream_reader import KEYS, NAME, bump, make_stream

#: Long before any stream of the tests existed.
BEFORE = "2020-01-01T00:00:00Z"


@pytest.fixture
def session(tmp_path, spark):
    made = Session(tmp_path / "warehouse", spark=spark)
    yield made
    made.close()


def keys_and_values(handed):
    return sorted(
        (mod["keys"]["ID"], mod["new_values"]["V"])
        for record in handed
        for mod in record["data_change_record"]["mods"]
    )


def test_a_refused_start_leaves_nothing_behind_and_the_fixed_start_reads(
    session, tmp_path, server_factory, client_factory
):
    """The newcomer's path over HTTP: the docs' start is refused (before the stream
    existed); the file is not created; the start fixed in code reads, with an end too."""
    start = make_stream(session)
    end = rfc3339(clock())
    server = server_factory()
    client = client_factory(server.url)
    checkpoint = tmp_path / "cp.sqlite"
    handed = []

    def reader(start_timestamp, end_timestamp=None):
        return ChangeStreamReader(
            client, "CS", start_timestamp=start_timestamp, end_timestamp=end_timestamp,
            checkpoint_path=checkpoint, callback=lambda r, db: handed.append(r),
        )  # fmt: skip

    with pytest.raises(InvalidRequestError, match="before"):
        reader(BEFORE).run()
    assert not checkpoint.exists()
    with pytest.raises(InvalidRequestError, match="before"):
        reader(BEFORE, end).run()  # with an end: the same refusal, nothing about the end
    assert not checkpoint.exists()
    reader(start, end).run()
    assert keys_and_values(handed) == [(k, 0) for k in range(KEYS)]

    # In a file that holds other streams' progress, a refused start adds nothing either.
    other = ChangeStreamReader(client, "DB.PUBLIC.CS", start_timestamp=BEFORE,
                               checkpoint_path=checkpoint, callback=lambda r, db: None)  # fmt: skip
    with pytest.raises(InvalidRequestError):
        other.run()
    with sqlite3.connect(checkpoint) as db:
        streams = db.execute("SELECT stream FROM change_stream_reader").fetchall()
        tokens = db.execute("SELECT DISTINCT stream FROM change_stream_reader_partitions")
        assert streams == [("CS",)] and tokens.fetchall() in ([], [("CS",)])


def test_a_checkpoint_left_unstarted_by_an_earlier_version_is_dropped(session, tmp_path):
    """Earlier versions wrote the stream's row before the first query; a refused start
    left it behind, and every later run failed quoting the old start."""
    start = make_stream(session)
    end = rfc3339(clock())
    checkpoint = tmp_path / "cp.sqlite"
    with sqlite3.connect(checkpoint) as db:
        db.executescript(SCHEMA)
        db.execute(
            "INSERT INTO change_stream_reader (stream, start_us, end_us, initialized) "
            "VALUES ('CS', ?, NULL, 0)",
            (to_micros(BEFORE),),
        )
    handed = []
    ChangeStreamReader(local_query(session.catalog, NAME), "CS", start_timestamp=start,
                       end_timestamp=end, checkpoint_path=checkpoint,
                       callback=lambda r, db: handed.append(r)).run()  # fmt: skip
    assert keys_and_values(handed) == [(k, 0) for k in range(KEYS)]


def test_a_checkpoint_that_does_not_fit_says_what_to_do_and_reset_starts_over(session, tmp_path):
    start = make_stream(session)
    bump(session, 1)
    middle = rfc3339(clock())
    bump(session, 1)
    end = rfc3339(clock())
    checkpoint = tmp_path / "cp.sqlite"
    handed = []

    def reader(start_timestamp, end_timestamp):
        return ChangeStreamReader(
            local_query(session.catalog, NAME), "CS", start_timestamp=start_timestamp,
            end_timestamp=end_timestamp, checkpoint_path=checkpoint,
            callback=lambda r, db: handed.append(r),
        )  # fmt: skip

    reader(start, end).run()
    assert keys_and_values(handed) == sorted((k, v) for k in range(KEYS) for v in range(3))

    # Another start: refused, naming the file, the start to resume with, and the reset.
    with pytest.raises(ConfigurationError) as moved:
        reader(middle, None).run()
    message = str(moved.value)
    assert str(checkpoint) in message
    assert f"start_timestamp='{rfc3339(to_micros(start))}'" in message
    assert "reset()" in message and "delete" in message
    # An earlier end: refused the same way.
    with pytest.raises(ConfigurationError, match="cannot stop earlier") as earlier:
        reader(start, middle).run()
    assert str(checkpoint) in str(earlier.value) and "reset()" in str(earlier.value)
    # Resuming with its own arguments reads nothing again.
    handed.clear()
    reader(start, end).run()
    assert handed == []

    # reset() forgets the progress: the new start reads from there.
    fresh = reader(middle, end)
    assert fresh.reset() is True
    assert fresh.reset() is False  # nothing left to forget
    fresh.run()
    assert keys_and_values(handed) == sorted((k, 2) for k in range(KEYS))


def test_a_file_that_is_not_a_checkpoint_is_refused_naming_it(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"not a database, but something the user wants to keep" * 100)
    reader = ChangeStreamReader(lambda *args: iter(()), "CS", start_timestamp=BEFORE,
                                checkpoint_path=path, callback=lambda r, db: None)  # fmt: skip
    with pytest.raises(ConfigurationError, match="is not a ChangeStreamReader checkpoint") as bad:
        reader.run()
    assert str(path) in str(bad.value)
    assert path.read_bytes().startswith(b"not a database")


def test_a_resumed_read_of_a_stream_made_again_notes_the_checkpoint(session, tmp_path):
    start = make_stream(session)
    end = rfc3339(clock())
    checkpoint = tmp_path / "cp.sqlite"

    def reader(end_timestamp):
        return ChangeStreamReader(local_query(session.catalog, NAME), "CS",
                                  start_timestamp=start, end_timestamp=end_timestamp,
                                  checkpoint_path=checkpoint, callback=lambda r, db: None)  # fmt: skip

    reader(end).run()
    session.sql("DROP CHANGE STREAM CS")
    session.sql("CREATE CHANGE STREAM CS FOR T OPTIONS (partitions = '2')")
    failure = []
    stop = threading.Event()

    def target():
        try:
            reader(None).run(stop)
        except Exception as exc:  # the test reads it
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(120)
    stop.set()
    thread.join(30)
    (error,) = failure
    notes = " ".join(getattr(error, "__notes__", []))
    assert str(checkpoint) in notes and "reset()" in notes


def test_a_number_is_a_timestamp_in_seconds_since_the_epoch():
    assert to_micros(1_769_860_800) == to_micros("2026-01-31T12:00:00Z")
    assert to_micros(1_769_860_800.25) == to_micros("2026-01-31T12:00:00.25Z")
    assert to_micros(0) == 0
    assert to_micros(datetime(2026, 1, 31, 12, tzinfo=UTC)) == to_micros(1_769_860_800)
    for wrong in (-1, float("nan"), float("inf"), 1_769_860_800_000):  # ms: refused
        with pytest.raises(ConfigurationError, match="seconds since 1970-01-01T00:00:00Z"):
            to_micros(wrong, "start_timestamp")
    for wrong in (True, b"2026", None):
        with pytest.raises(ConfigurationError, match="must be a timestamp: RFC 3339 text"):
            to_micros(wrong, "start_timestamp")
    with pytest.raises(ConfigurationError, match="is not a timestamp") as text:
        to_micros("31/01/2026", "start_timestamp")
    assert "1769860800" in str(text.value)
    reader = ChangeStreamReader(lambda *args: iter(()), "CS", start_timestamp=1_769_860_800,
                                end_timestamp=1_769_860_860.5, checkpoint_path="unused.sqlite",
                                callback=lambda r, db: None)  # fmt: skip
    assert reader._start_us == to_micros("2026-01-31T12:00:00Z")
    assert reader._end_us == to_micros("2026-01-31T12:01:00.5Z")
