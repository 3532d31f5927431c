"""A watched table dropped or replaced: what the change streams recorded of it before
stays readable for the longest retention period of the streams that watched it, then
its folder goes. A table no stream watches goes at once, as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import flush.catalog_tables as catalog_tables
from flush import purge_dropped
from tests.pipelines.change_streams.test_read import changes, created, now, read


def _kinds(session, cs, start, token, end=None):
    return [(c["table_name"], c["mod_type"], c["mods"][0]["keys"]["ID"])
            for c in changes(read(session, cs, start, token, end=end))]  # fmt: skip


def test_a_dropped_table_stays_readable_for_its_streams_retention(session, monkeypatch):
    s = session
    s.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    s.sql("CREATE TABLE LONE (ID NUMBER)")
    s.sql("CREATE SCHEMA DB.OTHER")
    s.sql("USE SCHEMA DB.PUBLIC")  # CREATE SCHEMA made OTHER the current one
    s.sql("CREATE TABLE DB.OTHER.W (ID NUMBER PRIMARY KEY)")
    s.sql("CREATE CHANGE STREAM CS FOR T, DB.OTHER.W OPTIONS (retention_period = '2h')")
    s.sql("CREATE CHANGE STREAM SHORT FOR T OPTIONS (retention_period = '1h')")
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    (token,) = [p.token for p in s.catalog.list_partitions(stream.uid)]
    start = created(s, "CS")
    s.sql("INSERT INTO T VALUES (1, 'a')")
    s.sql("INSERT INTO DB.OTHER.W VALUES (7)")
    s.sql("UPDATE T SET V = 'b'")
    t, lone, w = (s.require_table(n) for n in ("T", "LONE", "DB.OTHER.W"))
    before = _kinds(s, "CS", start, token)
    assert before == [("T", "INSERT", 1), ("DB.OTHER.W", "INSERT", 7), ("T", "UPDATE", 1)]
    s.sql("DROP TABLE LONE")
    assert not Path(lone.uri).exists()  # no stream watches it: gone at once
    # Dropped: by DROP TABLE, by CREATE OR REPLACE TABLE (of T) and by DROP SCHEMA CASCADE.
    s.sql("DROP SCHEMA DB.OTHER CASCADE")
    s.sql("CREATE OR REPLACE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    replaced = now()
    s.sql("INSERT INTO T VALUES (2, 'c')")  # the new T: not watched (another table)
    assert Path(t.uri).exists() and Path(w.uri).exists()
    assert _kinds(s, "CS", start, token) == before
    assert _kinds(s, "CS", replaced, token, end=now()) == []
    kept = {info.id: moment for info, moment in s.catalog.list_dropped_tables()}
    assert set(kept) == {t.id, w.id}
    # The retention of the longest stream that watched each: 2 h, then the folder goes.
    monkeypatch.setattr(catalog_tables, "now_us", lambda: max(kept.values()) + 3_600_000_000)
    assert purge_dropped(s.catalog, s.warehouse) == 0
    monkeypatch.setattr(catalog_tables, "now_us", lambda: max(kept.values()) + 7_200_000_000)
    assert purge_dropped(s.catalog, s.warehouse) == 2
    assert not Path(t.uri).exists() and not Path(w.uri).exists()
    assert s.catalog.list_dropped_tables() == []


PURGE = """
import sys
import flush.catalog_tables as catalog_tables
from catalog import SqliteCatalog
catalog = SqliteCatalog(sys.argv[1] + "/catalog.sqlite")
catalog_tables.now_us = lambda: int(sys.argv[2])  # the retention has passed
catalog_tables.purge_dropped(catalog, sys.argv[1])
print("not killed")
"""


def test_a_purge_killed_between_folder_and_row_is_finished_next_time(session):
    """SIGKILLed after deleting a kept table's folder and before forgetting it, a purge
    leaves a row whose folder is gone; the next purge forgets it."""
    s = session
    s.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY)")
    s.sql("CREATE CHANGE STREAM CS FOR T OPTIONS (retention_period = '1h')")
    s.sql("INSERT INTO T VALUES (1)")
    t = s.require_table("T")
    s.sql("DROP TABLE T")
    ((kept, dropped_us),) = s.catalog.list_dropped_tables()
    later = dropped_us + 3_600_000_000
    env = {**os.environ, "INGEST_FAILPOINTS": "dropped_table_purge=kill"}
    done = subprocess.run(
        [sys.executable, "-c", PURGE, str(s.warehouse), str(later)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not Path(t.uri).exists()
    assert [info.id for info, _ in s.catalog.list_dropped_tables()] == [kept.id] == [t.id]
    done = subprocess.run(
        [sys.executable, "-c", PURGE, str(s.warehouse), str(later)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "not killed" in done.stdout, done.stderr[-2000:]
    assert s.catalog.list_dropped_tables() == []
