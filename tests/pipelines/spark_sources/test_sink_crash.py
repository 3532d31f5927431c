"""A streaming pipeline killed around its sink's commit: every row once, no orphan file.

The pipeline reads the inserts of table SRC with ``format("ingest-changes")`` (one
version per micro-batch) and appends them to DST with ``format("ingest")``. Each run
is a child process with its own Spark (a new process group); a failpoint in the sink's
commit SIGKILLs the whole group (driver, JVM, Python workers) as a power cut would:

- before the Delta commit (the batch's files are staged and renamed, nothing landed):
  the restarted query replays the batch and commits it once;
- after the Delta commit, before Spark records the batch as done: the restarted query
  replays the batch, finds its app transaction in DST's log and adds nothing.

Afterwards DST holds every inserted row of SRC exactly once, with unique row ids, and
every data file under DST's folder is referenced by its log.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from deltalake import DeltaTable

from flush import read_table
from flush.tables import ROW_ID_COLUMN, live_files
from tests.servers import ROOT

CHILD_TIMEOUT = 600
#: Spark gives a Python worker it starts for a data source's planning 10 s to connect
#: back, a wait it hard-codes (PythonWorkerFactory.createSimpleWorker); on a loaded
#: machine the query fails with this before any batch. Such a run is one more crash of
#: the pipeline: it is run again, up to twice, and must then reach its failpoint.
_SLOW_WORKER = "Python worker failed to connect back"

_CHILD = """
import sys
from pipelines import Session
from ingest_sdk.process_exit import exit_process

warehouse, checkpoint = sys.argv[1], sys.argv[2]
session = Session(warehouse)
session.spark.sparkContext.setLogLevel("ERROR")
query = (
    session.spark.readStream.format("ingest-changes")
    .option("warehouse", warehouse).option("table", "SRC")
    .option("startingVersion", 1).option("maxVersionsPerTrigger", 1).load()
    .where("_change_type = 'insert'").select("ID", "NAME")
    .writeStream.format("ingest").option("warehouse", warehouse).option("table", "DST")
    .option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
)
query.awaitTermination()
print("DONE", query.lastProgress["batchId"], flush=True)
session.close()
exit_process(0)
"""


def _run(warehouse: Path, checkpoint: Path, failpoint: str | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("INGEST_FAILPOINTS", None)
    if failpoint:
        env["INGEST_FAILPOINTS"] = f"{failpoint}=killsession"
    for _attempt in range(3):
        run = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_CHILD), str(warehouse), str(checkpoint)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT,
            start_new_session=True,  # its own process group: the failpoint kills only it
        )
        if run.returncode != 1 or _SLOW_WORKER not in run.stderr:
            break
    return run


def _insert(session, first: int, count: int) -> None:
    values = ", ".join(f"({i}, 'n{i}')" for i in range(first, first + count))
    session.sql(f"INSERT INTO SRC VALUES {values}")


def _data_files(uri: str) -> set[str]:
    root = Path(uri)
    return {
        str(p.relative_to(root)) for p in root.rglob("*.parquet") if "_delta_log" not in p.parts
    }


def test_sink_replays_batches_killed_around_the_commit(session, tmp_path):
    session.sql("CREATE TABLE SRC (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    session.sql("CREATE TABLE DST (ID NUMBER(10,0) NOT NULL, NAME VARCHAR)")
    session.sql("INSERT INTO DST VALUES (0, 'before')")  # the sink's ids must not reuse it
    _insert(session, 1, 5)  # batch 0
    _insert(session, 6, 5)  # batch 1
    _insert(session, 11, 5)  # batch 2
    _insert(session, 16, 5)  # batch 3
    warehouse, checkpoint = session.warehouse, tmp_path / "checkpoint"
    dst = session.catalog.get_table("DB", "PUBLIC", "DST")

    before = DeltaTable(dst.uri).version()
    killed = _run(warehouse, checkpoint, "sink_before_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert DeltaTable(dst.uri).version() == before  # nothing of batch 0 landed
    app_id = "query:" + json.loads((checkpoint / "metadata").read_text())["id"]

    killed = _run(warehouse, checkpoint, "sink_after_commit")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert DeltaTable(dst.uri).transaction_version(app_id) == 0  # landed, Spark not told

    last = _run(warehouse, checkpoint, None)
    assert last.returncode == 0, last.stderr[-3000:]

    table = DeltaTable(dst.uri)
    assert table.transaction_version(app_id) == 3
    data = read_table(table).to_pydict()
    assert sorted(data["ID"]) == list(range(0, 21))  # every row once, the earlier one kept
    assert len(set(data[ROW_ID_COLUMN])) == 21
    assert {n for i, n in zip(data["ID"], data["NAME"], strict=True) if i} == {
        f"n{i}" for i in range(1, 21)
    }
    live = {f["path"] for f in live_files(table)}
    assert _data_files(dst.uri) == live  # no orphan: the killed attempts' files are gone
