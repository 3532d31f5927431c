"""A split or merge SIGKILLed inside its catalog transaction changes nothing: the seals it
wrote and the partitions it ended or started roll back together, readers keep their
tree, and the next split goes through. (A read keeps no state of its own: a reader
killed mid-stream is the SDK reader's test.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from catalog import SqliteCatalog
from flush.commit_clock import clock
from tests.pipelines.change_streams.test_balance import _every_change

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
