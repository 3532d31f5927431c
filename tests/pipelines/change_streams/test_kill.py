"""A split or merge SIGKILLed inside its catalog transaction changes nothing: the seals it
wrote and the partitions it ended or started roll back together, readers keep their
tree, and the next split goes through. A SQL transaction of two tables SIGKILLed between
its tables' commits reaches readers whole, after recovery, or not at all. (A read keeps
no state of its own: a reader killed mid-stream is the SDK reader's test.)"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading

from catalog import SqliteCatalog
from flush.commit_clock import clock
from pipelines.change_streams.read import ReadArgs, read
from pipelines.change_streams.records import rfc3339
from pipelines.change_streams.timeline import newest_version
from pipelines.transactions.commit import recover_pending
from tests.pipelines.change_streams.test_balance import _every_change
from tests.pipelines.change_streams.test_read import changes, micros
from tests.pipelines.change_streams.test_read import read as read_once

CHILD = """
import sys
from catalog import SqliteCatalog
from pipelines.change_streams.partitions import merge, open_partitions, split
catalog = SqliteCatalog(sys.argv[1])
stream = catalog.get_change_stream("DB", "PUBLIC", "CS")
tokens = [p.token for p in open_partitions(catalog, stream)]
if sys.argv[2] == "split":
    split(catalog, stream, tokens[0])
else:
    merge(catalog, stream, tokens[:2])
print("not killed")
"""


def _run_killed(catalog_file, action):
    env = {**os.environ, "INGEST_FAILPOINTS": "change_stream_repartition=kill"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), str(catalog_file), action],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert "not killed" not in done.stdout


def test_a_split_or_merge_killed_mid_transaction_changes_nothing(session):
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T OPTIONS (partitions = 2)")
    start = clock()
    session.sql("INSERT INTO T SELECT id, 'a' FROM range(20)")
    catalog_file = session.warehouse / "catalog.sqlite"
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    table = session.require_table("T")
    for action in ("split", "merge"):
        before = session.catalog.list_partitions(stream.uid)
        seals = session.catalog.latest_seals([table.id])
        _run_killed(catalog_file, action)
        reopened = SqliteCatalog(catalog_file)  # another connection: what is on disk
        try:
            assert reopened.list_partitions(stream.uid) == before
            assert reopened.latest_seals([table.id]) == seals
        finally:
            reopened.close()
    session.sql("UPDATE T SET V = 'b' WHERE ID < 3")
    open_now = [p.token for p in session.catalog.list_partitions(stream.uid) if p.end_us is None]
    session.sql(f"ALTER CHANGE STREAM CS MERGE PARTITIONS '{open_now[0]}', '{open_now[1]}'")
    session.sql("DELETE FROM T WHERE ID >= 18")
    mods, read = _every_change(session, start)
    assert len(read) == 3
    assert sorted(mods) == sorted([*range(20), *range(3), 18, 19])


def transaction_script(*statements: str) -> str:
    """A child's script: one transaction of ``statements`` on the warehouse ``argv[1]``."""
    body = "".join(f"    session.sql({statement!r})\n" for statement in statements)
    return ("import sys\nfrom pipelines import Session\nsession = Session(sys.argv[1])\n"
            f"with session.transaction():\n{body}print('not killed')\n")  # fmt: skip


TRANSACTION = transaction_script("INSERT INTO T VALUES (1, 'a')", "INSERT INTO U VALUES (1, 'a')")


def killed_at(session, point, script=TRANSACTION):
    """Run ``script`` in a child SIGKILLed at failpoint ``point``; returns the commit it
    left pending, decided."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(session.warehouse)],
        env={**os.environ, "INGEST_FAILPOINTS": f"{point}=kill"}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    (pending,) = session.catalog.pending_commits()
    assert pending.state == "decided"
    return pending


def two_tables_watched(session):
    """Tables T and U watched by change stream CS (one partition) and T's row 0 read once
    (the tables sealed past it): the stream, its partition, the start and that record."""
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T, U")
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    (partition,) = session.catalog.list_partitions(stream.uid)
    start = clock()
    session.sql("INSERT INTO T VALUES (0, 'z')")
    (before,) = changes(
        read_once(session, "CS", rfc3339(start), partition.token, end=rfc3339(clock()))
    )
    return stream, partition, start, before


def reading(catalog_file, stream, token, start, heartbeat_ms=1000):
    """A read of one partition in a thread: its records arrive on the returned queue (an
    error as ``{"error": ...}``)."""
    records: queue.Queue = queue.Queue()
    stop = threading.Event()

    def run():
        catalog = SqliteCatalog(catalog_file)
        try:
            for record in read(catalog, stream, ReadArgs(start, None, token, heartbeat_ms), stop):
                records.put(record)
        except BaseException as exc:  # surfaced to the test through the queue
            records.put({"error": repr(exc)})
        finally:
            catalog.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return records, stop, thread


def _next(records, kind):
    """The next record of ``kind``, the ones before it (of other kinds) dropped."""
    while True:
        record = records.get(timeout=120)
        assert "error" not in record, record
        if kind in record:
            return record[kind]
        assert "data_change_record" not in record, record


def test_a_transaction_killed_between_its_tables_reaches_readers_whole(session):
    """SIGKILLed after its first table's Delta commit, a transaction of two tables is
    decided but half written: a reader meanwhile returns what came before it and none
    of it (its heartbeats stay before the transaction's moment), and once recovery rolls
    it forward both tables' records come, once, with one id and timestamp."""
    stream, partition, start, before = two_tables_watched(session)
    catalog_file = session.warehouse / "catalog.sqlite"
    killed_at(session, "pipeline_between_tables")
    t, u = session.require_table("T"), session.require_table("U")
    assert [newest_version(t.uri), newest_version(u.uri)] == [2, 0]  # T written, U not
    records, stop, thread = reading(catalog_file, stream, partition.token, start)
    try:
        assert _next(records, "data_change_record") == before
        beats = [_next(records, "heartbeat_record")]  # and nothing of the transaction
        assert recover_pending(session.catalog) == 1
        found = [_next(records, "data_change_record") for _ in range(2)]
        beats.append(_next(records, "heartbeat_record"))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert sorted(c["table_name"] for c in found) == ["T", "U"]
    assert len({(c["server_transaction_id"], c["commit_timestamp"]) for c in found}) == 1
    assert {c["number_of_records_in_transaction"] for c in found} == {2}
    moment = micros(found[0]["commit_timestamp"])
    assert [micros(b["timestamp"]) < moment for b in beats] == [True, False]
    again = changes(read_once(session, "CS", rfc3339(start), partition.token))
    assert again == [before, *found]
