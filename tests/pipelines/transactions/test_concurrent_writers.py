"""SQL DML racing the service's own writers on one table.

The service ingests rows through channels (a flush commit every ~100-200 ms), a SQL
session runs INSERT/UPDATE/DELETE on the same table, a child process runs another
session, and the Spark worker rewrites the files under them. Row ids come from
one sequence in the catalog: nothing may be lost, doubled, or given a row id twice.

Three bugs showed up under this load, all fixed; each has a deterministic test below:

- A: a merge (UPDATE/DELETE) conflicts with every flush that commits while it runs
  ("a concurrent transactions added new data"); ``commit_staged`` gives up when its
  retry window (``MERGE_RETRY_SECONDS``) ends, so under steady ingestion UPDATE/DELETE
  fail with COMMIT_PENDING, and the recovery that should complete them starves the
  same way and makes ``Session()`` itself raise delta-rs' ``CommitFailedError``.
- B: ``landed_version`` loaded ``DeltaTable(uri)`` and then read ``history(limit)``;
  delta-rs labels the newest commits with versions counted down from the loaded one,
  so a flush landing in between hides the statement's own commit: the statement fails
  ("the commit landed but is not in the log") though its change was applied.

- C: compaction fails ("array_take has no kernel matching input types (string_view,
  uint64)") when the last file of a bin (the oldest live one) was written by a delta-rs
  merge, i.e. after an UPDATE/DELETE of a table's oldest rows, and keeps failing.

The load tests allow a statement one outcome besides success: a conflict that says it
changed nothing (``TransactionConflictError``). Any other error fails them; then they
check no loss, no doubles, unique row ids, the updates and the stream.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from channel_server import CompactionTrigger
from flush import ROW_ID_COLUMN, read_table
from ingest_sdk import OpenChannelRequest
from pipelines import SqlError, TransactionConflictError
from tests.servers import ROOT

TABLE = "DB.PUBLIC.T"
COLUMNS = {"ID": "NUMBER(38,0)", "V": "VARCHAR(20)"}

COMPACTION_FAILURES = {
    "a concurrent transaction deleted data this operation read": "commit refused (race)",
}


def channel_request(name: str) -> OpenChannelRequest:
    return OpenChannelRequest(name, "DB", "PUBLIC", "T")


def snapshot(uri: str) -> pa.Table:
    return read_table(uri, columns=["ID", "V", ROW_ID_COLUMN])


def ids_of(table: pa.Table) -> Counter[int]:
    return Counter(int(v) for v in table.column("ID").to_pylist())


def values_of(table: pa.Table) -> dict[int, str]:
    ids, values = table.column("ID").to_pylist(), table.column("V").to_pylist()
    return {int(i): v for i, v in zip(ids, values, strict=True)}


def check_unique_row_ids(table: pa.Table) -> None:
    counts = Counter(table.column(ROW_ID_COLUMN).to_pylist())
    doubled = {rid: n for rid, n in counts.items() if n > 1}
    assert not doubled, f"{len(doubled)} row ids appear more than once: {list(doubled)[:10]}"


def check_no_doubled_ids(counts: Counter[int]) -> None:
    doubled = sorted(n for n, c in counts.items() if c > 1)
    assert not doubled, f"{len(doubled)} ids present more than once: {doubled[:20]}"


def warm_up(session: Any) -> None:
    """Run each kind of statement once on a scratch table: the first runs in a Spark
    session take many seconds (JIT, Python workers), which would starve the races."""
    session.sql("CREATE TABLE WARM(ID NUMBER(38,0), V VARCHAR(20))")
    session.sql("INSERT INTO WARM VALUES (1, 'a'), (7, 'b')")
    session.sql("UPDATE WARM SET V = 'c' WHERE ID % 7 = 0")
    session.sql("DELETE FROM WARM WHERE ID BETWEEN 0 AND 1")
    session.sql("SELECT COUNT(*) FROM WARM").collect()


@dataclass
class Producer:
    """One channel inserting ``ids`` in small batches spread evenly over ``duration``
    seconds; each batch's token is its last id."""

    client: Any
    name: str
    ids: range
    duration: float = 20.0
    batch: int = 50
    value: str = "ingested"
    error: BaseException | None = None
    thread: threading.Thread | None = None
    channel: Any = None

    def start(self) -> Producer:
        self.channel = self.client.open_channel(channel_request(self.name))
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        firsts = range(self.ids.start, self.ids.stop, self.batch)
        started = time.monotonic()
        try:
            for index, first in enumerate(firsts):
                last = min(first + self.batch, self.ids.stop) - 1
                self.channel.insert_rows(
                    [{"ID": n, "V": self.value} for n in range(first, last + 1)],
                    end_offset_token=str(last),
                )
                due = started + self.duration * (index + 1) / len(firsts)
                time.sleep(max(0.0, due - time.monotonic()))
        except BaseException as exc:  # raised by finish()
            self.error = exc

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def committed(self) -> int:
        """The highest id whose row is committed (ids.start - 1: none yet)."""
        token = self.channel.get_latest_committed_offset_token()
        return self.ids.start - 1 if token is None else int(token)

    def finish(self, timeout: float = 120) -> None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} is stuck"
        if self.error is not None:
            raise self.error
        assert self.channel.wait_for_commit(timeout=timeout) == str(self.ids.stop - 1)


@dataclass
class SqlLog:
    """What the SQL side did, to compute the expected final state."""

    inserted: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    done: Counter[str] = field(default_factory=Counter)
    done_while_ingesting: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)
    #: For the last UPDATE that succeeded: each producer's committed id before it began.
    committed_before_last_update: dict[str, int] = field(default_factory=dict)
    last_update_value: str | None = None

    def run(self, session: Any, kind: str, text: str, ids: set[int] = frozenset(),
            ingesting: bool = False) -> bool:  # fmt: skip
        """Run one autocommit statement that inserts or deletes ``ids``."""
        began = time.monotonic()
        try:
            session.sql(text).collect()
        except TransactionConflictError:  # changed nothing, says so
            self.failed[f"{kind} conflict"] += 1
            return False
        finally:
            self.seconds[kind] += time.monotonic() - began
        self.done[kind] += 1
        self.done_while_ingesting[kind] += ingesting
        if kind == "insert":
            self.inserted |= set(ids)
        elif kind == "delete":
            self.deleted |= set(ids)
        return True

    def summary(self) -> str:
        return (f"done {dict(self.done)}, while ingesting {dict(self.done_while_ingesting)}, "
                f"failed {dict(self.failed)}, seconds {dict(self.seconds)}")  # fmt: skip


def check_ids(counts: Counter[int], expected: set[int]) -> None:
    """Every expected id once, nothing else."""
    check_no_doubled_ids(counts)
    present = set(counts)
    extra = sorted(present - expected)
    lost = sorted(expected - present)
    assert not extra, f"{len(extra)} rows that should not be there: {extra[:20]}"
    assert not lost, f"{len(lost)} rows lost: {lost[:20]}"


def check_updates(values: dict[int, str], log: SqlLog, producers: list[Producer]) -> None:
    """Only the UPDATEs write 'updated...' values, only on ID % 7 = 0, and the last one
    that succeeded reached every such row committed before it began."""
    wrong = [n for n, v in values.items() if v.startswith("updated") and n % 7 != 0]
    assert not wrong, f"rows updated that the WHERE does not match: {wrong[:10]}"
    wrong = [n for n, v in values.items()
             if not v.startswith("updated") and v != ("sql" if n < 0 else "ingested")]  # fmt: skip
    assert not wrong, f"rows with a value nobody wrote: {[(n, values[n]) for n in wrong[:10]]}"
    existed = set()
    for producer in producers:
        upto = log.committed_before_last_update.get(producer.name, producer.ids.start - 1)
        existed |= {n for n in producer.ids if n <= upto}
    missed = sorted(n for n in existed if n % 7 == 0 and n in values
                    and values[n] < (log.last_update_value or ""))  # fmt: skip
    assert not missed, f"{len(missed)} rows the last UPDATE should have updated: {missed[:10]}"


# 1. DML while channels keep inserting, and a stream over all of it.
def test_dml_while_channels_insert(server_factory, client_factory, session_factory):
    server = server_factory()
    client = client_factory(server.url, max_client_lag=0.15)
    info = client.create_table(TABLE, COLUMNS)
    session = session_factory(server.config.warehouse)
    warm_up(session)
    session.sql("CREATE TABLE TGT(ID NUMBER(38,0), V VARCHAR(20))")
    session.sql("CREATE STREAM S ON TABLE T")

    per_channel, channels = 7_000, 3
    producers = [
        Producer(client, f"p{i}", range(i * per_channel, (i + 1) * per_channel)).start()
        for i in range(channels)
    ]
    log = SqlLog()
    started = time.monotonic()
    round_ = 0
    # Until ingestion ends; then on until each kind ran a few times, for at most a minute.
    while time.monotonic() - started < 60:
        ingesting = any(p.running for p in producers)
        if not ingesting and log.done["update"] >= 2 and log.done["delete"] >= 2:
            break
        round_ += 1
        new = {-(round_ * 10 + j) for j in range(1, 11)}
        values = ", ".join(f"({n}, 'sql')" for n in sorted(new))
        log.run(session, "insert", f"INSERT INTO T VALUES {values}", new, ingesting)
        before = {p.name: p.committed() for p in producers}
        value = f"updated{round_:04d}"  # later UPDATEs write larger values
        if log.run(session, "update", f"UPDATE T SET V = '{value}' WHERE ID % 7 = 0",
                   ingesting=ingesting):  # fmt: skip
            log.committed_before_last_update, log.last_update_value = before, value
        if round_ > 1:  # half of the previous round's SQL rows
            low, high = -((round_ - 1) * 10 + 5), -((round_ - 1) * 10 + 1)
            log.run(session, "delete", f"DELETE FROM T WHERE ID BETWEEN {low} AND {high}",
                    set(range(low, high + 1)) & log.inserted, ingesting)  # fmt: skip
    for producer in producers:
        producer.finish()
    print(f"{round_} rounds in {time.monotonic() - started:.1f}s: {log.summary()}")
    # How many statements fit while the channels ingest depends on the machine's load
    # (an UPDATE took 18 s on a loaded one); one is the interleaving this test needs.
    assert log.done_while_ingesting["insert"] >= 1, log.summary()
    assert log.done["update"] >= 2 and log.done["delete"] >= 2, log.summary()

    table = snapshot(info["location"])
    check_unique_row_ids(table)
    ingested = set(range(channels * per_channel))
    check_ids(ids_of(table), ingested | (log.inserted - log.deleted))
    check_updates(values_of(table), log, producers)

    # The stream shows the net change since it was created (on an empty table): every
    # row now in the table, as an INSERT; consuming it copies exactly those rows.
    changes = session.sql(
        "SELECT ID, V, METADATA$ACTION, METADATA$ISUPDATE, METADATA$ROW_ID FROM S"
    ).toArrow()
    actions = Counter(zip(changes.column(2).to_pylist(), changes.column(3).to_pylist(),
                          strict=True))  # fmt: skip
    assert actions == Counter({("INSERT", False): table.num_rows}), actions
    seen = sorted(zip(*(changes.column(i).to_pylist() for i in (4, 0, 1)), strict=True))
    now = sorted(zip(*(table.column(c).to_pylist() for c in (ROW_ID_COLUMN, "ID", "V")),
                     strict=True))  # fmt: skip
    assert seen == now, "the stream's rows differ from the table's"
    inserted = session.sql("INSERT INTO TGT SELECT ID, V FROM S").collect()
    assert inserted[0][0] == table.num_rows
    target = session.sql("SELECT ID, V FROM TGT").toArrow()
    assert sorted(zip(target.column(0).to_pylist(), target.column(1).to_pylist(),
                      strict=True)) == sorted((i, v) for _, i, v in now)  # fmt: skip
    assert session.sql("SELECT COUNT(*) FROM S").collect()[0][0] == 0  # consumed


# 2. A session in another process reserves row ids from the same catalog sequence.
CHILD = r"""
import sys
from pathlib import Path

from flush.spark_tables import spark_session
from ingest_sdk.process_exit import run_entry_point
from pipelines import Session


def main():
    warehouse, statements, rows, first = Path(sys.argv[1]), *map(int, sys.argv[2:5])
    spark = spark_session("local[1]", app_name="concurrent-writers-child")
    spark.sparkContext.setLogLevel("ERROR")
    with Session(warehouse, spark=spark) as session:
        session.sql("CREATE TABLE CHILD_WARM(ID NUMBER(38,0), V VARCHAR(20))")
        session.sql("INSERT INTO CHILD_WARM VALUES (1, 'a')")
        print("ready", flush=True)
        sys.stdin.readline()  # "go": the producers are running
        for number in range(statements):
            start = first + number * rows
            values = ", ".join(f"({n}, 'child')" for n in range(start, start + rows))
            session.sql(f"INSERT INTO T VALUES {values}")
        print("done", flush=True)
    spark.stop()


run_entry_point(main)
"""


def test_row_ids_stay_unique_with_a_session_in_another_process(
    server_factory, client_factory, tmp_path
):
    server = server_factory()
    client = client_factory(server.url, max_client_lag=0.1)
    # The child's INSERTs start once the producers run (12 s, told by a line on its stdin),
    # so each reserves row ids while flushes reserve theirs: 8 of them test that as 20 did.
    statements, rows, first = 8, 100, 1_000_000
    child_log = tmp_path / "child.log"
    with open(child_log, "wb") as log_file:  # the child's JVM starts while we set up
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(server.config.warehouse), str(statements),
             str(rows), str(first)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file, cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    producers: list[Producer] = []
    try:
        info = client.create_table(TABLE, COLUMNS)
        ready, _, _ = select.select([child.stdout], [], [], 240)
        line = child.stdout.readline() if ready else b""
        assert line.strip() == b"ready", f"child did not start: {child_log.read_text()[-3000:]}"
        per_channel = 3_000
        producers = [
            Producer(client, f"p{i}", range(i * per_channel, (i + 1) * per_channel),
                     duration=12.0).start()
            for i in range(3)
        ]  # fmt: skip
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.wait(timeout=240) == 0, child_log.read_text()[-3000:]
        assert child.stdout.read().decode().splitlines() == ["done"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdin.close()
        child.stdout.close()
    for producer in producers:
        producer.finish()

    table = snapshot(info["location"])
    check_unique_row_ids(table)
    from_sql = set(range(first, first + statements * rows))
    check_ids(ids_of(table), set(range(3 * per_channel)) | from_sql)
    # Both writers really took ids from the sequence at the same time.
    ids, rids = table.column("ID").to_pylist(), table.column(ROW_ID_COLUMN).to_pylist()
    child_rids = sorted(r for i, r in zip(ids, rids, strict=True) if int(i) >= first)
    inside = sum(child_rids[0] < r < child_rids[-1]
                 for i, r in zip(ids, rids, strict=True) if int(i) < first)  # fmt: skip
    print(f"flushed rows with row ids inside the child's range: {inside}")
    assert inside > 0, "the child ran before or after the ingestion, not during it"


# 3. The service's Spark worker rewrites files while UPDATEs and DELETEs run.
def test_compaction_races_updates(server_factory, client_factory, session_factory):
    server = server_factory(compaction=CompactionTrigger(enabled=False, spark_master="local[1]"))
    client = client_factory(server.url, max_client_lag=0.3)
    info = client.create_table(TABLE, COLUMNS)
    triggered = int(client.compact(TABLE))  # starts the worker's JVM while we warm up
    session = session_factory(server.config.warehouse)
    warm_up(session)
    registry = server.service.metrics.registry
    statuses = ("SUCCEEDED", "ABANDONED", "FAILED", "NOTHING_TO_DO")

    def counted() -> dict[str, int]:
        labels = {"table": TABLE}
        found = {s: registry.get_sample_value("ingest_compactions_total", {**labels, "status": s})
                 for s in statuses}  # fmt: skip
        return {s: int(v) for s, v in found.items() if v}

    # Flushes go on during the race, so compaction always has files to take; the race
    # goes on until it saw 3 UPDATEs and compaction runs (one a success), however slow.
    producer = Producer(client, "p0", range(0, 12_000), duration=15.0).start()
    log = SqlLog()
    #: Per row: the value of the last UPDATE that succeeded on it (a failed one, a
    #: conflict, changed nothing).
    updated: dict[int, str] = {}
    started = time.monotonic()
    round_ = 0
    while time.monotonic() - started < 90:
        runs_so_far = counted()
        if (not producer.running and sum(runs_so_far.values()) >= 3
                and runs_so_far.get("SUCCEEDED", 0) >= 1 and log.done["update"] >= 3):  # fmt: skip
            break
        upto = producer.committed()
        if upto < 500:
            time.sleep(0.1)
            continue
        round_ += 1
        triggered += client.compact(TABLE)
        # A window of committed rows: the newest ones (still in intermediate files, which
        # the compaction is about to take) or older ones (in files it may have written).
        low = upto - 400 if round_ % 2 else (round_ * 397) % (upto - 400)
        window = range(low, low + 300)
        value = f"updated{round_:04d}"
        text = f"UPDATE T SET V = '{value}' WHERE ID % 7 = 0 AND ID BETWEEN {low} AND {low + 299}"
        matched = [n for n in window if n % 7 == 0 and n not in log.deleted]
        if log.run(session, "update", text, ingesting=producer.running):
            updated.update(dict.fromkeys(matched, value))
        triggered += client.compact(TABLE)
        gone = {n for n in range(low + 1, low + 4) if n % 7 != 0}
        text = f"DELETE FROM T WHERE ID IN ({', '.join(map(str, sorted(gone)))})"
        log.run(session, "delete", text, gone - log.deleted, producer.running)
    producer.finish()
    deadline = time.monotonic() + 120
    while sum(counted().values()) < triggered:
        assert time.monotonic() < deadline, f"{triggered} runs, counted {counted()}"
        time.sleep(0.5)
    if not counted().get("SUCCEEDED"):  # a slow machine: every run lost its race to DML
        triggered += client.compact(TABLE)  # with nothing racing it, it must succeed
    while sum(counted().values()) < triggered:
        assert time.monotonic() < deadline, f"{triggered} runs, counted {counted()}"
        time.sleep(0.5)
    runs = client.get_migration_history(TABLE)
    seen = Counter(run["status"] for run in runs)
    print(f"{round_} rounds: {log.summary()}; compactions {dict(seen)}, metrics {counted()}")
    for run in runs:
        print({k: run.get(k) for k in ("status", "files_in", "files_out", "rows_in", "error")})
    assert sum(counted().values()) == triggered  # every run answered (none lost)
    assert set(seen) <= set(statuses), seen
    assert seen["SUCCEEDED"] >= 1 and log.done["update"] >= 3, (seen, log.summary())
    for run in runs:
        if run["status"] == "SUCCEEDED":
            assert run["rows_in"] == run["rows_out"] and run["version"] is not None, run
        elif run["status"] == "ABANDONED":
            assert "removed concurrently" in run["error"], run
        elif run["status"] == "FAILED":  # known causes only; the rows are checked below
            causes = [c for text, c in COMPACTION_FAILURES.items() if text in run["error"]]
            assert causes, f"compaction failed for an unknown reason: {run['error']}"
            print(f"FAILED run: {causes[0]}")

    table = snapshot(info["location"])
    check_unique_row_ids(table)
    check_ids(ids_of(table), set(range(12_000)) - log.deleted)
    values = values_of(table)
    wrong = {n: (v, updated.get(n, "ingested")) for n, v in values.items()
             if v != updated.get(n, "ingested")}  # fmt: skip
    assert not wrong, f"{len(wrong)} rows with the wrong value: {list(wrong.items())[:10]}"


# Bug A, deterministically: a flush lands inside each attempt of a merge.
def land_flushes_during_merges(monkeypatch, channel, first_id: int, attempts: int) -> list[int]:
    """Make a flush commit land (through the service) inside each of the first
    ``attempts`` merge attempts: after the attempt loaded the table, before it commits,
    as continuous ingestion does when a merge takes longer than the flush interval.
    Returns the ids ingested that way (it grows as merges run)."""
    from flush import change_commit

    original = change_commit._merge
    landed: list[int] = []

    def merge_while_a_flush_lands(table, source, properties):
        if len(landed) < attempts * 10:
            first = first_id + len(landed)
            channel.insert_rows([{"ID": n, "V": "ingested"} for n in range(first, first + 10)],
                                end_offset_token=str(first + 9))  # fmt: skip
            channel.wait_for_commit(timeout=30)
            landed.extend(range(first, first + 10))
        original(table, source, properties)

    monkeypatch.setattr(change_commit, "_merge", merge_while_a_flush_lands)
    return landed


def small_table(server_factory, client_factory, session_factory):
    """A service table with rows 0..99 committed, its channel, and a session on it."""
    server = server_factory()
    client = client_factory(server.url, max_client_lag=0.05)
    info = client.create_table(TABLE, COLUMNS)
    channel = client.open_channel(channel_request("p0"))
    channel.insert_rows([{"ID": n, "V": "ingested"} for n in range(100)], end_offset_token="99")
    assert channel.wait_for_commit(timeout=30) == "99"
    session = session_factory(server.config.warehouse)
    return info, channel, session


def test_an_update_is_not_starved_by_flush_commits(
    server_factory, client_factory, session_factory, monkeypatch
):
    info, channel, session = small_table(server_factory, client_factory, session_factory)
    landed = land_flushes_during_merges(monkeypatch, channel, 1000, attempts=12)
    result = session.sql("UPDATE T SET V = 'updated' WHERE ID % 7 = 0").collect()
    assert result[0][0] == len(range(0, 100, 7))
    values = values_of(snapshot(info["location"]))
    assert sorted(values) == sorted([*range(100), *landed])
    assert all((v == "updated") == (n < 100 and n % 7 == 0) for n, v in values.items())
    assert session.catalog.pending_commits() == []


def test_a_starved_update_is_completed_once_and_sessions_still_open(
    server_factory, client_factory, session_factory, monkeypatch
):
    from flush import change_commit

    info, channel, session = small_table(server_factory, client_factory, session_factory)
    original = change_commit._merge
    # Every attempt starves, so the statement and each recovery give up when the retry
    # window ends: 5 s of attempts (dozens) instead of the 60 s default, twice.
    monkeypatch.setattr(change_commit, "MERGE_RETRY_SECONDS", 5.0)
    land_flushes_during_merges(monkeypatch, channel, 1000, attempts=1000)  # every attempt
    error: SqlError | None = None
    try:
        session.sql("UPDATE T SET V = 'updated' WHERE ID % 7 = 0")
    except SqlError as exc:
        error = exc
    expected = len(range(0, 100, 7))
    if error is not None and error.code == "COMMIT_PENDING":  # decided: completed later
        assert len(session.catalog.pending_commits()) == 1
        # Ingestion goes on; someone opens a session on the warehouse.
        session_factory(session.warehouse)
    elif error is not None:  # a failure that changed nothing
        assert session.catalog.pending_commits() == [], error
        expected = 0
    monkeypatch.setattr(change_commit, "_merge", original)  # ingestion pauses
    later = session_factory(session.warehouse)
    assert later.catalog.pending_commits() == []
    values = values_of(snapshot(info["location"]))
    assert Counter(values.values())["updated"] == expected
    check_no_doubled_ids(ids_of(snapshot(info["location"])))


# Bug B, deterministically: flushes land between loading the table and reading its log.
def land_flushes_in_landed_version(monkeypatch, channel, first_id: int) -> list[int]:
    """Before each ``landed_version`` reads the history of the table it was given, make
    as many flushes land as there are versions after ``after_version`` in that table."""
    from flush import change_commit

    original = change_commit.landed_version
    landed: list[int] = []

    def landed_version_while_flushes_land(table, commit_app, after_version):
        for _ in range(max(1, table.version() - after_version)):
            first = first_id + len(landed)
            channel.insert_rows([{"ID": n, "V": "ingested"} for n in range(first, first + 10)],
                                end_offset_token=str(first + 9))  # fmt: skip
            channel.wait_for_commit(timeout=30)
            landed.extend(range(first, first + 10))
        return original(table, commit_app, after_version)

    monkeypatch.setattr(change_commit, "landed_version", landed_version_while_flushes_land)
    return landed


def test_an_insert_whose_commit_landed_succeeds(
    server_factory, client_factory, session_factory, monkeypatch
):
    info, channel, session = small_table(server_factory, client_factory, session_factory)
    landed = land_flushes_in_landed_version(monkeypatch, channel, 1000)
    error: BaseException | None = None
    try:
        session.sql("INSERT INTO T VALUES (-1, 'sql'), (-2, 'sql')")
    except Exception as exc:
        error = exc
    counts = ids_of(snapshot(info["location"]))
    check_no_doubled_ids(counts)
    assert set(counts) >= {*range(100), *landed}
    assert error is None, (
        f"the INSERT raised {type(error).__name__}: {error}; its rows are in the table: "
        f"{counts[-1] == counts[-2] == 1}; pending commits: "
        f"{[p.id for p in session.catalog.pending_commits()]}"
    )
    assert counts[-1] == counts[-2] == 1
    assert session.catalog.pending_commits() == []


# Compaction against a merge, each committing inside the other's window (both safe).
def flushes(channel, first: int, count: int = 3, rows: int = 100) -> None:
    for number in range(count):
        start = first + number * rows
        channel.insert_rows([{"ID": n, "V": "ingested"} for n in range(start, start + rows)],
                            end_offset_token=str(start + rows - 1))  # fmt: skip
        assert channel.wait_for_commit(timeout=30) == str(start + rows - 1)


def check_updated_once(uri: str, rows: int) -> None:
    table = snapshot(uri)
    check_unique_row_ids(table)
    counts = ids_of(table)
    check_no_doubled_ids(counts)
    assert sorted(counts) == list(range(rows))
    values = values_of(table)
    assert all((v == "updated") == (n % 7 == 0) for n, v in values.items())


def test_an_update_committing_in_compactions_window_stops_the_run(
    server_factory, client_factory, session_factory, spark, monkeypatch
):
    """The compaction re-checks its inputs, then commits; an UPDATE rewriting those
    files in between must not come back as the old rows (delta-rs refuses the commit)."""
    from flush import compaction

    info, channel, session = small_table(server_factory, client_factory, session_factory)
    flushes(channel, 100)
    original = compaction.live_files
    calls: list[int] = []

    def live_files_then_update(table):
        files = original(table)
        calls.append(len(files))
        if len(calls) == 2:  # the check right before the commit
            session.sql("UPDATE T SET V = 'updated' WHERE ID % 7 = 0")
        return files

    monkeypatch.setattr(compaction, "live_files", live_files_then_update)
    try:
        result = compaction.compact_table(spark, info["location"])
        status, error = result.status, result.error
    except Exception as exc:  # compact_and_record records this run as FAILED
        status, error = "FAILED", f"{type(exc).__name__}: {exc}"
    print(f"compaction in the window: {status}: {error}")
    assert len(calls) >= 2  # a refused commit checks its inputs again, finds them gone
    assert status == "ABANDONED", (status, error)
    check_updated_once(info["location"], 400)
    assert not list((Path(info["location"]) / "_compacted").glob("*/*"))  # outputs removed


def test_a_compaction_committing_in_an_updates_window(
    server_factory, client_factory, session_factory, spark, monkeypatch
):
    """The merge loaded the table, then a compaction rewrote its files: the merge's
    commit is refused and retried on the compacted files."""
    from flush import change_commit, compaction

    info, channel, session = small_table(server_factory, client_factory, session_factory)
    flushes(channel, 100)
    original = change_commit._merge
    runs: list[str] = []

    def compact_then_merge(table, source, properties):
        if not runs:
            runs.append(compaction.compact_table(spark, info["location"]).status)
        original(table, source, properties)

    monkeypatch.setattr(change_commit, "_merge", compact_then_merge)
    result = session.sql("UPDATE T SET V = 'updated' WHERE ID % 7 = 0").collect()
    assert runs == ["SUCCEEDED"]
    assert result[0][0] == len(range(0, 400, 7))
    check_updated_once(info["location"], 400)


def test_compaction_after_an_update_of_the_oldest_rows(
    server_factory, client_factory, session_factory, spark
):
    from flush import compaction

    info, channel, session = small_table(server_factory, client_factory, session_factory)
    session.sql("UPDATE T SET V = 'updated' WHERE ID % 7 = 0")  # delta-rs rewrites file 1
    flushes(channel, 100)  # three more flush files, newer than the merge's output
    result = compaction.compact_table(spark, info["location"])
    assert result.status == "SUCCEEDED", result.error
    table = snapshot(info["location"])
    check_unique_row_ids(table)
    values = values_of(table)
    assert sorted(values) == list(range(400))
    assert all((v == "updated") == (n < 100 and n % 7 == 0) for n, v in values.items())
