"""Stream consumption under crashes and races: all or nothing, and exactly once.

A consuming transaction commits through ``pipelines.commit``: stage the change sets,
decide in the catalog (record a pending commit, claim the streams: first consumer
wins), one Delta commit per target table, finish in the catalog. These tests run the
consumer in child processes (each with its own local Spark) so that it can be
SIGKILLed at every failpoint of that path, or race another process for the stream,
and then check, from this process, what a new Session on the warehouse sees.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
from deltalake import DeltaTable

from flush import read_table
from flush.change_commit import PIPELINE_METADATA_KEY
from pipelines.commit import stream_app_id
from tests.pipelines.conftest import rows

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 180

_PREAMBLE = """
import json, os, sys, time
from pathlib import Path
from pipelines import Session, SqlError, StreamConflictError
from ingest_sdk.process_exit import exit_process

session = Session({warehouse!r})
session.spark.sparkContext.setLogLevel("ERROR")


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def wait_for(*paths, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not all(Path(p).exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {{timeout}} s for {{paths}}")
        time.sleep(0.002)


def touch(path, text=""):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees a half-written file

"""

_EPILOGUE = """
session.close()
exit_process(0)  # no interpreter finalization (see ingest_sdk.process_exit)
"""


def child_script(warehouse: Path, body: str) -> str:
    """The ``python -c`` program of a child: open a Session (own local Spark) on the
    warehouse, run ``body`` (which may use ``session``, ``report(**fields)``,
    ``wait_for(*paths)`` and ``touch(path, text)``), then exit 0 without finalization."""
    return (
        _PREAMBLE.format(warehouse=str(warehouse))
        + textwrap.dedent(body).strip()
        + "\n"
        + _EPILOGUE
    )


def child_env(failpoints: str = "") -> dict[str, str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER": "local[2]"}
    env.pop("INGEST_FAILPOINTS", None)
    if failpoints:
        env["INGEST_FAILPOINTS"] = failpoints
    return env


def run_child(warehouse: Path, body: str, failpoints: str = "") -> subprocess.CompletedProcess:
    """Run a child to its end (reaped: a dead owner's pending commit is recoverable)."""
    return subprocess.run(
        [sys.executable, "-c", child_script(warehouse, body)],
        cwd=ROOT,
        env=child_env(failpoints),
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )


def results(output: str) -> list[dict]:
    return [json.loads(line[7:]) for line in output.splitlines() if line.startswith("RESULT ")]


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def values(session, name: str) -> list[int]:
    """Column A of a table or stream, sorted, as ints (INT comes back as Decimal)."""
    found = [row[0] for row in rows(session.sql(f"SELECT a FROM {name}"))]
    assert all(isinstance(v, Decimal) for v in found)
    return sorted(int(v) for v in found)


def table_uri(session, name: str) -> str:
    return session.catalog.get_table("DB", "PUBLIC", name.upper()).uri


def pipeline_commits(uri: str) -> list[dict]:
    """The Delta log entries of a table that a pipeline commit wrote."""
    return [e for e in DeltaTable(uri).history() if PIPELINE_METADATA_KEY in e]


def delta_values(uri: str) -> list[int]:
    """Column A of a table's newest version, read by delta-rs (not Spark)."""
    return sorted(int(v) for v in read_table(uri).column("A").to_pylist())


def setup_warehouse(session, first_rows: list[int]) -> None:
    for statement in (
        "CREATE TABLE src (a INT)",
        "CREATE TABLE t1 (a INT)",
        "CREATE TABLE t2 (a INT)",
        "CREATE STREAM s ON TABLE src",
    ):
        session.sql(statement)
    # Two commits, so the stream spans more than one version of src.
    half = len(first_rows) // 2
    for chunk in (first_rows[:half], first_rows[half:]):
        session.sql(f"INSERT INTO src VALUES {', '.join(f'({v})' for v in chunk)}")


CONSUME_BOTH = """
session.sql("BEGIN")
session.sql("INSERT INTO t1 SELECT a FROM s")
session.sql("INSERT INTO t2 SELECT a FROM s")
session.sql("COMMIT")
report(outcome="committed")
"""


def check_consistent(session, consumed: list[int], pending: list[int]) -> None:
    """t1 and t2 each hold ``consumed`` exactly once (Spark and delta-rs agree), the
    stream shows ``pending``, no commit is pending, and each target's log names every
    pipeline commit once."""
    assert values(session, "t1") == consumed
    assert values(session, "t2") == consumed
    assert values(session, "s") == pending
    assert session.catalog.pending_commits() == []
    stream = session.catalog.get_stream("DB", "PUBLIC", "S")
    assert stream.claimed_by is None
    for name in ("t1", "t2"):
        uri = table_uri(session, name)
        assert delta_values(uri) == consumed
        ids = [orjson.loads(e[PIPELINE_METADATA_KEY])["commit"] for e in pipeline_commits(uri)]
        assert len(ids) == len(set(ids)), f"{name}: a pipeline commit landed twice: {ids}"


# 1. SIGKILL at every failpoint of the commit path

#: Failpoint -> whether the commit was decided (recorded in the catalog) when it fires.
KILL_POINTS = {
    "pipeline_after_stage": False,
    "pipeline_after_decide": True,
    "pipeline_between_tables": True,  # after T1's Delta commit, before T2's
    "pipeline_before_finish": True,  # both Delta commits done, catalog not finished
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_consumer_killed_at_any_point_commits_all_or_nothing(point, tmp_path, session_factory):
    warehouse = tmp_path / "warehouse"
    first = list(range(1, 9))
    setup = session_factory(warehouse)
    setup_warehouse(setup, first)
    src_version = DeltaTable(table_uri(setup, "src")).version()
    stream_id = setup.catalog.get_stream("DB", "PUBLIC", "S").id
    setup.close()

    child = run_child(warehouse, CONSUME_BOTH, failpoints=f"{point}=kill")
    assert child.returncode == -9, describe(child)  # died by SIGKILL, at the failpoint
    assert results(child.stdout) == []

    # What the dead consumer left, before anyone recovers it.
    decided = KILL_POINTS[point]
    left = setup_catalog_pending(warehouse)
    assert len(left) == (1 if decided else 0)
    uris = {name: table_uri_from_catalog(warehouse, name) for name in ("T1", "T2")}
    if point == "pipeline_between_tables":
        assert len(pipeline_commits(uris["T1"])) == 1
        assert pipeline_commits(uris["T2"]) == []
    if point == "pipeline_before_finish":
        assert all(len(pipeline_commits(u)) == 1 for u in uris.values())

    # A new session recovers: a decided commit rolls forward, an undecided one never was.
    recovered = session_factory(warehouse)
    if decided:
        check_consistent(recovered, consumed=first, pending=[])
        for uri in uris.values():
            assert DeltaTable(uri).transaction_version(stream_app_id(stream_id)) == src_version
    else:
        check_consistent(recovered, consumed=[], pending=first)
        for uri in uris.values():
            assert DeltaTable(uri).transaction_version(stream_app_id(stream_id)) is None

    # Recovering again changes nothing (the roll-forward is never applied twice).
    logs = {name: DeltaTable(uri).version() for name, uri in uris.items()}
    again = session_factory(warehouse)
    assert {name: DeltaTable(uri).version() for name, uri in uris.items()} == logs
    check_consistent(again, consumed=first if decided else [], pending=[] if decided else first)
    for uri in uris.values():
        assert len(pipeline_commits(uri)) == (1 if decided else 0)

    # The stream keeps working: new rows, consumed again into both tables.
    more = [101, 102, 103]
    again.sql(f"INSERT INTO src VALUES {', '.join(f'({v})' for v in more)}")
    with again.transaction():
        again.sql("INSERT INTO t1 SELECT a FROM s")
        again.sql("INSERT INTO t2 SELECT a FROM s")
    check_consistent(again, consumed=first + more, pending=[])
    for uri in uris.values():
        assert len(pipeline_commits(uri)) == (2 if decided else 1)
        assert DeltaTable(uri).transaction_version(stream_app_id(stream_id)) == src_version + 1


def _catalog(warehouse: Path):
    from catalog import SqliteCatalog

    return SqliteCatalog(warehouse / "catalog.sqlite")


def setup_catalog_pending(warehouse: Path) -> list:
    """Pending commits, read without opening a Session (which would recover them)."""
    catalog = _catalog(warehouse)
    try:
        return catalog.pending_commits()
    finally:
        catalog.close()


def table_uri_from_catalog(warehouse: Path, name: str) -> str:
    catalog = _catalog(warehouse)
    try:
        return catalog.get_table("DB", "PUBLIC", name).uri
    finally:
        catalog.close()
