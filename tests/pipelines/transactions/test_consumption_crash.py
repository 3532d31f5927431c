"""Stream consumption under crashes and races: all or nothing, and exactly once.

A consuming transaction commits through ``pipelines.transactions.commit``: stage the change sets,
decide in the catalog (record a pending commit and claim the streams: the first
consumer wins), one Delta commit per target table, finish in the catalog. These tests
run consumers in child processes, each with its own local Spark, so that one can fail
inside that path and live on, or race another process for a stream; this process then
checks what a new Session on the warehouse sees (opening one recovers the pending
commits of dead owners). The consumer SIGKILLed at every failpoint of that path is
tested in ``test_multi_table_kill`` (its children die there with that file's), with
this module's helpers and :data:`CONSUME_BOTH`.

Child processes start a JVM each: the one-shot child starts with the module (fixture
``consumers``), and the two racing children run every round in one process each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
from deltalake import DeltaTable

import flush.failpoints as failpoints
import pipelines.transactions.commit as pipeline_commit
from catalog import PendingCommit, SqliteCatalog, StreamRecord
from flush import read_table
from flush.change_commit import PIPELINE_METADATA_KEY
from flush.maintenance import maintain_catalog_table, vacuum_data_folders
from pipelines import Session, SqlError, StreamConflictError
from pipelines.transactions.commit import recover_pending
from tests.pipelines.conftest import rows
from tests.servers import ROOT

CHILD_TIMEOUT = 600  # a loaded 2-core machine takes a minute to start a JVM
FIRST = list(range(1, 9))  # the rows in SRC when a consumer starts
MORE = [101, 102, 103]  # rows added after recovery, to consume a second time

# Children

_PREAMBLE = """
import json, os, sys, time
from pathlib import Path
from pipelines import Session, SqlError, StreamConflictError
from ingest_sdk.process_exit import exit_process

session = Session({warehouse!r})
session.spark.sparkContext.setLogLevel("ERROR")


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def wait_for(*paths, timeout={timeout}):
    deadline = time.monotonic() + timeout
    while not all(Path(p).exists() for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {{timeout}} s for {{paths}}")
        time.sleep(0.002)


def touch(path, text=""):
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees half a file

"""

_EPILOGUE = """
session.close()
exit_process(0)  # no interpreter finalization (see ingest_sdk.process_exit)
"""


def child_script(warehouse: Path, body: str) -> str:
    """The ``python -c`` program of a child: open a Session (its own local Spark) on the
    warehouse, run ``body``, exit 0 without finalization. ``body`` may use ``session``,
    ``report(**fields)`` (a ``RESULT {json}`` line on stdout), ``wait_for(*paths)`` and
    ``touch(path, text)``."""
    preamble = _PREAMBLE.format(warehouse=str(warehouse), timeout=CHILD_TIMEOUT)
    return preamble + textwrap.dedent(body).strip() + "\n" + _EPILOGUE


@dataclass
class Child:
    """A child process whose output goes to files (Spark's log would fill a pipe)."""

    proc: subprocess.Popen
    out: Path
    err: Path

    @classmethod
    def start(
        cls, warehouse: Path, body: str, failpoints: str = "", name: str = "child",
        out_dir: Path | None = None,
    ):  # fmt: skip
        env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_MASTER": "local[2]"}
        env.pop("INGEST_FAILPOINTS", None)
        if failpoints:
            env["INGEST_FAILPOINTS"] = failpoints
        out_dir = out_dir or warehouse.parent
        out, err = out_dir / f"{name}.out", out_dir / f"{name}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-c", child_script(warehouse, body)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        return cls(proc, out, err)

    def wait(self) -> int:
        """Reap the child (a dead owner's pending commit is recoverable only then)."""
        try:
            return self.proc.wait(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def results(self) -> list[dict]:
        lines = self.out.read_text().splitlines()
        return [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]

    def describe(self) -> str:
        return (
            f"exit {self.proc.returncode}\nstdout:\n{self.out.read_text()[-3000:]}\n"
            f"stderr:\n{self.err.read_text()[-3000:]}"
        )


# The warehouse and what to check in it


def setup_warehouse(session: Session, first_rows: list[int]) -> None:
    for statement in (
        "CREATE TABLE src (a INT)",
        "CREATE TABLE t1 (a INT)",
        "CREATE TABLE t2 (a INT)",
        "CREATE STREAM s ON TABLE src",
    ):
        session.sql(statement)
    if first_rows:  # two commits, so the stream spans more than one version of SRC
        half = len(first_rows) // 2
        for chunk in (first_rows[:half], first_rows[half:]):
            insert(session, chunk)


def insert(session: Session, values_: list[int]) -> None:
    session.sql(f"INSERT INTO src VALUES {', '.join(f'({v})' for v in values_)}")


def values(session: Session, name: str) -> list[int]:
    """Column A of a table or stream, sorted, as ints (INT comes back as Decimal)."""
    found = [row[0] for row in rows(session.sql(f"SELECT a FROM {name}"))]
    assert all(isinstance(v, Decimal) for v in found)
    return sorted(int(v) for v in found)


def catalog_of(warehouse: Path) -> SqliteCatalog:
    """The warehouse's catalog without a Session (opening one recovers pending commits)."""
    return SqliteCatalog(warehouse / "catalog.sqlite")


def uri_of(warehouse: Path, name: str) -> str:
    catalog = catalog_of(warehouse)
    try:
        return catalog.get_table("DB", "PUBLIC", name.upper()).uri
    finally:
        catalog.close()


def pending_of(warehouse: Path) -> list:
    catalog = catalog_of(warehouse)
    try:
        return catalog.pending_commits()
    finally:
        catalog.close()


def pipeline_commits(uri: str) -> list[int]:
    """The pipeline commit ids of a table's Delta log entries, oldest first."""
    entries = sorted(DeltaTable(uri).history(), key=lambda e: e["version"])
    return [
        orjson.loads(e[PIPELINE_METADATA_KEY])["commit"]
        for e in entries
        if PIPELINE_METADATA_KEY in e
    ]


def delta_values(uri: str) -> list[int]:
    """Column A of a table's newest version, read by delta-rs (not Spark)."""
    return sorted(int(v) for v in read_table(uri).column("A").to_pylist())


def check_consistent(session: Session, consumed: list[int], pending: list[int]) -> None:
    """T1 and T2 each hold ``consumed`` once (Spark and delta-rs agree), the stream
    shows ``pending``, no commit is pending, and no pipeline commit landed twice."""
    assert values(session, "t1") == consumed
    assert values(session, "t2") == consumed
    assert values(session, "s") == pending
    assert session.catalog.pending_commits() == []
    assert session.catalog.get_stream("DB", "PUBLIC", "S").claimed_by is None
    for name in ("T1", "T2"):
        uri = session.catalog.get_table("DB", "PUBLIC", name).uri
        assert delta_values(uri) == consumed
        ids = pipeline_commits(uri)
        assert len(ids) == len(set(ids)), f"{name}: a pipeline commit landed twice: {ids}"


# The one-shot children: CONSUME_BOTH killed (test_multi_table_kill), or observed

CONSUME_BOTH = """
session.sql("BEGIN")
session.sql("INSERT INTO t1 SELECT a FROM s")
session.sql("INSERT INTO t2 SELECT a FROM s")
session.sql("COMMIT")
report(outcome="committed")
"""

#: A consumer whose commit fails once after T1's Delta commit (not killed: the process
#: lives on), then reports what it sees, in a new Session too, and what a retry does.
CONSUME_BOTH_OBSERVED = """
from flush import read_table

def vals(sess, name):
    if name == "s":  # a stream needs Spark; the tables are read by delta-rs (cheaper)
        return sorted(int(r[0]) for r in sess.sql("SELECT a FROM s").collect())
    uri = sess.catalog.get_table("DB", "PUBLIC", name.upper()).uri
    return sorted(int(v) for v in read_table(uri).column("A").to_pylist())

def state(step, sess):
    report(step=step, t1=vals(sess, "t1"), t2=vals(sess, "t2"), s=vals(sess, "s"),
           pending=len(sess.catalog.pending_commits()))

def consume(sess):
    try:
        sess.sql("BEGIN")
        sess.sql("INSERT INTO t1 SELECT a FROM s")
        sess.sql("INSERT INTO t2 SELECT a FROM s")
        sess.sql("COMMIT")
        return dict(outcome="committed")
    except BaseException as exc:
        if sess._transaction is not None:
            sess.sql("ROLLBACK")
        return dict(outcome=type(exc).__name__, sql_error=isinstance(exc, SqlError),
                    code=getattr(exc, "code", None), message=str(exc)[:500])

report(step="commit", **consume(session))
state("after-commit", session)
reopened = Session(session.warehouse, spark=session.spark)  # recovery runs here
state("reopened", reopened)
report(step="retry", **consume(reopened))
state("after-retry", reopened)
reopened.close()
"""

#: Failpoint -> whether the commit was decided (recorded in the catalog) when it fires.
KILL_POINTS = {
    "pipeline_after_stage": False,
    "pipeline_after_reserve": False,  # intents held, nothing validated
    "pipeline_after_validate": False,  # validated, the streams not claimed
    "pipeline_after_decide": True,
    "pipeline_between_tables": True,  # after T1's Delta commit, before T2's
    "pipeline_before_finish": True,  # both Delta commits done, the catalog not finished
}

SCENARIOS = {
    "table_commit_fails_once": (CONSUME_BOTH_OBSERVED, "pipeline_between_tables=error*1"),
}


@dataclass
class Scenario:
    warehouse: Path
    child: Child
    src_version: int
    stream: StreamRecord

    def finished(self) -> Child:
        self.child.wait()
        return self.child


@pytest.fixture(scope="module")
def consumers(tmp_path_factory, spark):
    """Scenario name -> a warehouse (SRC holding FIRST, stream S, empty T1 and T2) and the
    child consuming S into T1 and T2 there, with the scenario's failpoints; started when
    the module starts, waited for by its tests."""
    started: dict[str, Scenario] = {}
    try:
        for name, (body, failpoints) in SCENARIOS.items():
            warehouse = tmp_path_factory.mktemp(name) / "warehouse"
            with Session(warehouse, spark=spark) as session:
                setup_warehouse(session, FIRST)
                src = session.catalog.get_table("DB", "PUBLIC", "SRC")
                stream = session.catalog.get_stream("DB", "PUBLIC", "S")
                src_version = DeltaTable(src.uri).version()
            child = Child.start(warehouse, body, failpoints, name=name)
            started[name] = Scenario(warehouse, child, src_version, stream)
        yield started
    finally:
        for scenario in started.values():
            scenario.child.stop()


# 1. SIGKILL at every failpoint of the commit path: in ``test_multi_table_kill``, whose
# children, one per failpoint, kill these consumers (CONSUME_BOTH) with its own.


def decided_but_not_committed(session: Session, monkeypatch) -> PendingCommit:
    """In-process stand-in for a consumer that gave up right after deciding: the
    failpoint raises there, and the owner hands the decided commit to recovery (owner
    released). The real SIGKILL is in ``test_multi_table_kill``; this costs no child JVM."""
    monkeypatch.setitem(failpoints._POINTS, "pipeline_after_decide", ["error", 1])
    with pytest.raises(SqlError) as failed, session.transaction():
        session.sql("INSERT INTO t1 SELECT a FROM s")
        session.sql("INSERT INTO t2 SELECT a FROM s")
    assert failed.value.code == "COMMIT_PENDING"
    assert isinstance(failed.value.__cause__, failpoints.InjectedFailure)
    (pending,) = session.catalog.pending_commits()
    assert pending.decided and pending.owner == ""  # released to recovery
    return pending


def test_two_sessions_recovering_a_dead_consumer_at_once_apply_it_once(
    tmp_path, session_factory, monkeypatch
):
    """Two processes may open the warehouse at the same moment after a crash: both see
    the dead owner's commit; one takes it over and rolls it forward, the other leaves
    it; each table gets it once. (Two threads here, each with its own catalog
    connection; a barrier makes both decide that the owner is dead together.)"""
    warehouse = tmp_path / "warehouse"
    setup = session_factory(warehouse)
    setup_warehouse(setup, FIRST)
    pending = decided_but_not_committed(setup, monkeypatch)

    barrier = threading.Barrier(2, timeout=60)
    real_owner_alive = pipeline_commit.owner_alive

    def owner_alive_together(*args, **kwargs):
        barrier.wait()
        return real_owner_alive(*args, **kwargs)

    monkeypatch.setattr(pipeline_commit, "owner_alive", owner_alive_together)
    done: list[int] = []
    errors: list[BaseException] = []

    def recover() -> None:
        catalog = catalog_of(warehouse)
        try:
            done.append(recover_pending(catalog))
        except BaseException as exc:
            errors.append(exc)
        finally:
            catalog.close()

    threads = [threading.Thread(target=recover) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(done) == [0, 1]  # one took it over and rolled it forward ...
    monkeypatch.setattr(pipeline_commit, "owner_alive", real_owner_alive)

    session = session_factory(warehouse)
    check_consistent(session, consumed=FIRST, pending=[])  # ... and it landed once
    for name in ("T1", "T2"):
        assert pipeline_commits(uri_of(warehouse, name)) == [pending.id]


# 3. One table's commit fails (the process lives on)


def observed(consumers) -> dict[str, dict]:
    child = consumers["table_commit_fails_once"].finished()
    assert child.proc.returncode == 0, child.describe()
    return {result.pop("step"): result for result in child.results()}


def test_a_failed_table_commit_is_completed_once_its_owner_exits(consumers, session_factory):
    """``pipeline_between_tables=error*1``: T1's Delta commit lands, then the commit
    fails before T2's. What the owner process itself sees is checked by the two
    tests below (COMMIT answers COMMIT_PENDING; a new Session in that process completes
    the commit). Once the owner has exited, the next Session finds nothing or rolls the
    commit forward: each table then holds each row once."""
    steps = observed(consumers)
    assert steps["commit"]["outcome"] != "committed"
    # Never duplicated, never lost, whatever the owner saw.
    for step in ("after-commit", "reopened", "after-retry"):
        assert steps[step]["t1"] in ([], FIRST)
        assert steps[step]["t2"] in ([], FIRST)
    assert steps["after-retry"]["pending"] <= 1

    warehouse = consumers["table_commit_fails_once"].warehouse
    session = session_factory(warehouse)
    check_consistent(session, consumed=FIRST, pending=[])
    for name in ("T1", "T2"):
        # The commit with the rows, and at most the retry's zero-row consumption.
        commits = pipeline_commits(uri_of(warehouse, name))
        assert 1 <= len(commits) <= 2 and len(set(commits)) == len(commits), commits

    insert(session, MORE)
    with session.transaction():
        session.sql("INSERT INTO t1 SELECT a FROM s")
        session.sql("INSERT INTO t2 SELECT a FROM s")
    check_consistent(session, consumed=sorted(FIRST + MORE), pending=[])


def test_a_failed_table_commit_is_reported_as_a_pending_commit(consumers):
    commit = observed(consumers)["commit"]
    assert commit["sql_error"], commit
    assert commit["code"] == "COMMIT_PENDING", commit


def test_a_failed_table_commit_is_completed_while_its_owner_lives(consumers):
    steps = observed(consumers)
    # A new Session in the owner process (recovery runs when it opens) ...
    assert steps["reopened"]["pending"] == 0, steps
    assert steps["reopened"]["t1"] == steps["reopened"]["t2"] == FIRST, steps
    assert steps["reopened"]["s"] == [], steps
    # ... and a retry then finds nothing left to consume.
    assert steps["retry"]["outcome"] == "committed", steps
    assert steps["after-retry"]["t1"] == steps["after-retry"]["t2"] == FIRST, steps


# 2. Racing consumers

#: Per round: (A's target, B's target, forced overlap). With forced overlap both
#: children have read the stream before either decides (a barrier before the catalog's
#: decide_commit); otherwise they race freely from the same start signal.
ROUNDS = [
    ("t1", "t2", True),
    ("t1", "t2", False),
    ("t1", "t1", True),
    ("t1", "t1", False),
    ("t2", "t1", True),
    ("t2", "t2", True),
]

RACER = """
sync = Path(SYNC)
real_decide_commit = session.catalog.decide_commit
current = {"round": None}

def decide_commit(commit_id, claims):
    number = current["round"]
    if ROUNDS[number][2]:  # forced overlap: both have read the stream; decide together
        touch(sync / f"decide-{number}-{NAME}")
        wait_for(*(sync / f"decide-{number}-{peer}" for peer in ("A", "B")))
    return real_decide_commit(commit_id, claims)

session.catalog.decide_commit = decide_commit
session.sql("SELECT COUNT(*) FROM src").collect()  # warm up before the first round
touch(sync / f"ready-{NAME}")
for number, (target_a, target_b, _forced) in enumerate(ROUNDS):
    current["round"] = number
    target = target_a if NAME == "A" else target_b
    wait_for(sync / f"go-{number}")
    try:
        row = session.sql(f"INSERT INTO {target} SELECT a FROM s").collect()[0]
        result = dict(outcome="ok", target=target, inserted=int(row[0]))
    except StreamConflictError as exc:
        result = dict(outcome="conflict", target=target, message=str(exc)[:300])
    except SqlError as exc:
        result = dict(outcome="error", target=target, code=exc.code, message=str(exc)[:500])
    touch(sync / f"done-{number}-{NAME}", json.dumps(result))
"""


def _wait_files(paths: list[Path], children: list[Child], timeout: float = CHILD_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        for child in children:  # a racer exits 0 once its last round is done
            assert child.proc.poll() in (None, 0), child.describe()
        assert time.monotonic() < deadline, f"timed out waiting for {paths}"
        time.sleep(0.01)


def test_racing_consumers_consume_each_change_exactly_once(tmp_path, session_factory):
    warehouse, sync = tmp_path / "warehouse", tmp_path / "sync"
    sync.mkdir()
    session = session_factory(warehouse)
    setup_warehouse(session, [])
    children = []
    try:
        for name in ("A", "B"):
            header = f"NAME = {name!r}\nSYNC = {str(sync)!r}\nROUNDS = {ROUNDS!r}\n"
            children.append(Child.start(warehouse, header + RACER, name=f"racer-{name}"))
        _wait_files([sync / "ready-A", sync / "ready-B"], children)

        all_rows: list[int] = []
        oks = 0
        for number, (_a, _b, forced) in enumerate(ROUNDS):
            new = [number * 100 + i for i in range(1, 4 + number % 2)]
            insert(session, new)
            all_rows += new
            (sync / f"go-{number}").touch()
            done = [sync / f"done-{number}-{name}" for name in ("A", "B")]
            _wait_files(done, children)
            results = [json.loads(path.read_text()) for path in done]
            outcomes = sorted(r["outcome"] for r in results)
            winners = [r for r in results if r["outcome"] == "ok"]
            oks += len(winners)
            assert outcomes in (["conflict", "ok"], ["ok", "ok"]), (number, results)
            if forced:  # both read the stream before either decided: exactly one wins
                assert outcomes == ["conflict", "ok"], (number, results)
            # Either one consumer took this round's rows, or they split them (the later
            # one finding what the earlier one left: here, nothing).
            assert sum(r["inserted"] for r in winners) == len(new), (number, results)
            assert values(session, "s") == [], number

        for child in children:
            assert child.wait() == 0, child.describe()
    finally:
        for child in children:
            child.stop()

    # Every SRC row is in exactly one target, once.
    t1, t2 = values(session, "t1"), values(session, "t2")
    assert sorted(t1 + t2) == sorted(all_rows)
    assert session.catalog.pending_commits() == []
    # One Delta commit per successful consumption, none twice.
    ids = pipeline_commits(uri_of(warehouse, "T1")) + pipeline_commits(uri_of(warehouse, "T2"))
    assert len(ids) == len(set(ids)) == oks


def test_racing_sessions_in_one_process_consume_each_change_exactly_once(tmp_path, session_factory):
    """The same race between two threads, each with its own Session (and catalog
    connection) on the shared Spark: both pending commits have this process as owner."""
    warehouse = tmp_path / "warehouse"
    writer = session_factory(warehouse)  # its own commits must not wait at the barrier
    setup_warehouse(writer, [])
    racers = {name: session_factory(warehouse) for name in ("A", "B")}
    barrier = threading.Barrier(2, timeout=120)
    for racer in racers.values():
        real = racer.catalog.decide_commit

        def decide_commit(commit_id, claims, real=real):
            barrier.wait()  # both have read the stream: decide together
            return real(commit_id, claims)

        racer.catalog.decide_commit = decide_commit

    def consume(name: str, target: str, results: dict) -> None:
        try:
            row = racers[name].sql(f"INSERT INTO {target} SELECT a FROM s").collect()[0]
            results[name] = ("ok", int(row[0]))
        except StreamConflictError:
            results[name] = ("conflict", 0)
        except BaseException as exc:
            results[name] = (repr(exc), 0)
            barrier.abort()

    all_rows: list[int] = []
    for number, (target_a, target_b) in enumerate([("t1", "t2"), ("t1", "t1")] * 2):
        new = [1000 + number * 10 + i for i in range(1, 4)]
        insert(writer, new)
        all_rows += new
        results: dict[str, tuple[str, int]] = {}
        threads = [
            threading.Thread(target=consume, args=("A", target_a, results)),
            threading.Thread(target=consume, args=("B", target_b, results)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert sorted(outcome for outcome, _ in results.values()) == ["conflict", "ok"], results
        assert sum(count for _, count in results.values()) == len(new), results

    assert sorted(values(writer, "t1") + values(writer, "t2")) == sorted(all_rows)
    assert values(writer, "s") == []
    assert writer.catalog.pending_commits() == []


# A pending commit outlives the vacuum retention of its staged files


def test_a_pending_commit_survives_the_vacuum_of_its_tables(tmp_path, session_factory, monkeypatch):
    """The commit of a consumer that died after deciding waits longer than the vacuum
    retention (an hour at least) for the next Session to open the warehouse."""
    warehouse = tmp_path / "warehouse"
    session = session_factory(warehouse)
    setup_warehouse(session, FIRST)
    pending = decided_but_not_committed(session, monkeypatch)

    two_hours_ago = time.time() - 7200
    for table in pending.plan["tables"]:
        staged = Path(table["uri"]) / table["staged"]["path"]
        os.utime(staged, (two_hours_ago, two_hours_ago))
        info = session.catalog.get_table_by_id(table["table_id"])
        # As compaction's maintenance runs it, with the shortest retention allowed.
        maintain_catalog_table(session.catalog, info, retention_hours=1)
        assert staged.exists()
        # The same file once no commit is pending would go (the keep is what saves it).
        assert vacuum_data_folders(table["uri"], retention_hours=1, dry_run=True) == [
            table["staged"]["path"]
        ]

    recovered = session_factory(warehouse)
    state = (values(recovered, "t1"), values(recovered, "t2"), values(recovered, "s"))
    assert state in [(FIRST, FIRST, []), ([], [], FIRST)]
