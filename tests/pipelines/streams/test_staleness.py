"""Stale streams: log cleanup and vacuum, STALE_AFTER, and the retention extension.

A stream is stale when its table no longer holds the history after its offset: log
cleanup removed the commits, or vacuum removed files those commits added. Time passes
here by ageing files (``os.utime``) and by moving maintenance's clock; the Delta log,
the vacuum and the sessions are the real ones.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from deltalake import DeltaTable

import flush.maintenance as maintenance
from flush.maintenance import maintain_catalog_table, vacuum_data_folders
from pipelines import StreamStaleError
from tests.pipelines.conftest import rows

DAY = 86_400


def _age(paths, seconds: float) -> None:
    moment = time.time() - seconds
    for path in paths:
        os.utime(path, (moment, moment))


def _stream(session, name="S"):
    return session.sql(f"DESCRIBE STREAM {name}").collect()[0]


def _refuses_rows(session, target_rows):
    with pytest.raises(StreamStaleError, match="stale"):
        session.sql("SELECT * FROM S")
    with pytest.raises(StreamStaleError):
        session.sql("INSERT INTO TGT SELECT A FROM S")
    assert rows(session.sql("SELECT * FROM TGT")) == target_rows


@pytest.fixture
def tracked(session):
    """T with a stream S created on its first version, then three commits after it."""
    session.sql("CREATE TABLE T (A INT NOT NULL)")
    session.sql("CREATE TABLE TGT (A INT)")
    session.sql("INSERT INTO T VALUES (1)")
    session.sql("CREATE STREAM S ON TABLE T")
    session.sql("INSERT INTO T VALUES (2)")
    session.sql("UPDATE T SET A = 20 WHERE A = 2")
    session.sql("INSERT INTO T VALUES (3)")
    return session


def test_log_cleanup_past_the_offset_makes_the_stream_stale(tracked):
    session = tracked
    info = session.require_table("T")
    assert not _stream(session).stale
    assert rows(session.sql("SELECT A, METADATA$ACTION FROM S")) == [(3, "INSERT"), (20, "INSERT")]
    log = Path(info.uri) / "_delta_log"
    _age(log.glob("*.json"), 60 * DAY)  # older than the log retention (30 days)
    table = DeltaTable(info.uri)
    table.create_checkpoint()
    removed = table.cleanup_metadata()
    assert not (log / f"{_stream(session).offset_version + 1:020d}.json").exists(), removed

    assert _stream(session).stale
    assert [r.stale for r in session.sql("SHOW STREAMS").collect()] == [True]
    _refuses_rows(session, [])
    # The table itself is fine, and a recreated stream starts at the current version.
    assert rows(session.sql("SELECT A FROM T")) == [(1,), (3,), (20,)]
    session.sql("CREATE OR REPLACE STREAM S ON TABLE T")
    assert not _stream(session).stale
    assert session.sql("SELECT * FROM S").collect() == []
    session.sql("INSERT INTO T VALUES (4)")
    session.sql("INSERT INTO TGT SELECT A FROM S")
    assert rows(session.sql("SELECT * FROM TGT")) == [(4,)]


def test_a_forced_vacuum_of_files_after_the_offset_refuses_rows(tracked):
    """Vacuum with a retention under the extension (forced) removes the file of the
    INSERT the UPDATE replaced; the stream's read needs it and says the stream is stale
    rather than returning part of the changes."""
    session = tracked
    info = session.require_table("T")
    _age((p for p in Path(info.uri, "_ingest").rglob("*") if p.is_file()), 2 * DAY)
    time.sleep(1.5)  # the UPDATE's commit must be older than the forced retention
    deleted = vacuum_data_folders(info.uri, retention_hours=0.0001, allow_short_retention=True)
    assert deleted, "the vacuum removed nothing: the test would prove nothing"
    assert rows(session.sql("SELECT A FROM T")) == [(1,), (3,), (20,)]  # the table is fine
    _refuses_rows(session, [])


def test_maintenance_extends_retention_for_an_unconsumed_stream(tracked, monkeypatch):
    """Two days later (maintenance's clock), a 1-day retention would remove the replaced
    INSERT's file; the stream, unconsumed since it was made, keeps it (extension up to
    MAX_DATA_EXTENSION_TIME_IN_DAYS), so its changes still read. Past the extension
    (20 days later) the file goes."""
    session = tracked
    info = session.require_table("T")
    files = [p for p in Path(info.uri, "_ingest").rglob("*") if p.is_file()]
    _age(files, 30 * DAY)
    expected = rows(session.sql("SELECT A, METADATA$ACTION FROM S"))
    real_time = time.time

    monkeypatch.setattr(maintenance.time, "time", lambda: real_time() + 2 * DAY)
    # (What it may delete: the UPDATE's staged merge source, which no version references.)
    kept_by_extension = maintain_catalog_table(session.catalog, info, retention_hours=24)
    assert rows(session.sql("SELECT A, METADATA$ACTION FROM S")) == expected
    # The control: without the extension the same vacuum deletes the replaced file.
    without = vacuum_data_folders(info.uri, retention_hours=24, dry_run=True)
    assert without and not set(without) & set(kept_by_extension.deleted_files)

    monkeypatch.setattr(maintenance.time, "time", lambda: real_time() + 20 * DAY)
    assert set(without) <= set(
        maintain_catalog_table(session.catalog, info, retention_hours=24).deleted_files
    )
    _refuses_rows(session, [])


def test_stale_after_is_the_offset_move_plus_the_longer_retention(tracked):
    session = tracked
    session.sql("ALTER TABLE T SET DATA_RETENTION_TIME_IN_DAYS = 1")
    session.sql("ALTER TABLE T SET MAX_DATA_EXTENSION_TIME_IN_DAYS = 3")
    record = session.require_stream("S")
    stale_after = _stream(session).stale_after.replace(tzinfo=UTC)
    expected = datetime.fromtimestamp(record.offset_moved_at + 3 * DAY, UTC)
    assert abs((stale_after - expected).total_seconds()) < 1

    session.sql("ALTER TABLE T SET DATA_RETENTION_TIME_IN_DAYS = 5")
    stale_after = _stream(session).stale_after.replace(tzinfo=UTC)
    expected = datetime.fromtimestamp(record.offset_moved_at + 5 * DAY, UTC)
    assert abs((stale_after - expected).total_seconds()) < 1

    # Consuming moves the offset, and STALE_AFTER with it.
    time.sleep(1.1)
    session.sql("INSERT INTO TGT SELECT A FROM S")
    moved = session.require_stream("S").offset_moved_at
    assert moved > record.offset_moved_at
    stale_after = _stream(session).stale_after.replace(tzinfo=UTC)
    assert abs((stale_after - datetime.fromtimestamp(moved + 5 * DAY, UTC)).total_seconds()) < 1
