"""Transactions over two tables, killed at every step of their commit, then recovered.

Transaction A consumes stream S into T1 and updates a row of T2 (``BEGIN; INSERT INTO
T1 SELECT ... FROM S; UPDATE T2 ...; COMMIT``); its process is SIGKILLed at each
failpoint of ``pipelines.transactions.commit.commit_consumer``. Then writer B, in a Session opened
before the kill (so its open-time recovery never saw A's pending commit), writes one
of A's tables: B itself must roll A forward (decided) or abandon it (still preparing)
and then succeed. Afterwards A's commit is all or nothing (T1 holds the consumed rows
once and S is empty, or T1 is empty and S still shows them), B's write is the last
word on the row both changed, nothing stays pending, no pipeline commit landed twice,
and the stream keeps delivering every new row exactly once.

A consumer of one stream into two tables (``test_consumption_crash.CONSUME_BOTH``) is
killed at every step too: a new Session rolls it forward (decided) or finds it never
happened, recovering again changes nothing, and the stream keeps working.

The children run with their own local Spark (a JVM each, up to a minute to start on a
loaded 2-core machine), so all of them start at once in the module fixture ``kills``,
one per kill point (``killed_together``); the helpers come from ``test_consumption_crash``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable

import tests.pipelines.transactions.test_consumption_crash as consumption
from catalog import StreamRecord
from flush import read_table
from pipelines import Session, StreamConflictError
from pipelines.transactions.commit import stream_app_id
from tests.pipelines.conftest import rows
from tests.pipelines.transactions.killed_together import Member, start_group
from tests.pipelines.transactions.test_consumption_crash import (
    KILL_POINTS,
    catalog_of,
    pending_of,
    pipeline_commits,
    uri_of,
)

FIRST = [(10, "a"), (11, "b"), (12, "c")]  # SRC's rows when A consumes S
MORE = [(13, "d"), (14, "e")]  # added after B's write, consumed once more
T2_ROWS = [(1, "orig"), (2, "orig")]

#: Transaction A: consume S into T1 and update a row of T2, in one commit.
TXN_A = """
session.sql("BEGIN")
session.sql("INSERT INTO T1 SELECT ID, V FROM S")
session.sql("UPDATE T2 SET V = 'fromA' WHERE ID = 1")
session.sql("COMMIT")
report(outcome="committed")
"""

#: Scenario name -> (failpoint A is killed at, what writer B does afterwards); the
#: ``both_`` scenarios run consumption.CONSUME_BOTH instead, and B does nothing.
SCENARIOS = {point: (point, "update") for point in KILL_POINTS}
SCENARIOS["consume_between_tables"] = ("pipeline_between_tables", "consume")
SCENARIOS.update({f"both_{point}": (point, "recover") for point in KILL_POINTS})


def setup_warehouse(session: Session) -> None:
    for statement in (
        "CREATE TABLE SRC (ID NUMBER, V VARCHAR)",
        "CREATE TABLE T1 (ID NUMBER, V VARCHAR)",
        "CREATE TABLE T2 (ID NUMBER, V VARCHAR)",
        f"INSERT INTO T2 VALUES {literal(T2_ROWS)}",
        "CREATE STREAM S ON TABLE SRC",  # S starts at SRC's current version (empty) ...
        f"INSERT INTO SRC VALUES {literal(FIRST)}",  # ... so it shows these rows
    ):
        session.sql(statement)


def literal(pairs: list[tuple[int, str]]) -> str:
    return ", ".join(f"({i}, '{v}')" for i, v in pairs)


def pairs_of(session: Session, name: str) -> list[tuple[int, str]]:
    """(ID, V) of a table or stream through Spark, sorted, ID as int."""
    return sorted((int(i), v) for i, v in rows(session.sql(f"SELECT ID, V FROM {name}")))


def delta_pairs(uri: str) -> list[tuple[int, str]]:
    """(ID, V) of a table's newest version read by delta-rs (not Spark), sorted."""
    table = read_table(uri)
    ids, vs = table.column("ID").to_pylist(), table.column("V").to_pylist()
    return sorted((int(i), v) for i, v in zip(ids, vs, strict=True))


@dataclass
class Scenario:
    warehouse: Path
    child: Member
    writer: Session  # opened before A started, so its recovery never saw A's commit
    stream_rows: list[tuple[int, str]]  # what S showed before A ran
    t2_commits: list[int]  # the pipeline commits in T2's log before A ran (its INSERT)


@dataclass
class Consumed:
    """A ``both_`` scenario: SRC holding consumption.FIRST, stream S, empty T1 and T2."""

    warehouse: Path
    child: Member
    src_version: int
    stream: StreamRecord


def prepare_transaction(warehouse: Path, spark) -> tuple:
    """B's session (left open) on a warehouse set up for A, and what it saw before A."""
    writer = Session(warehouse, spark=spark)
    try:
        setup_warehouse(writer)
        stream_rows = pairs_of(writer, "S")
        assert pairs_of(writer, "T2") == T2_ROWS
        writer.release_views()
        return writer, stream_rows, pipeline_commits(uri_of(warehouse, "T2"))
    except BaseException:
        writer.close()
        raise


def prepare_consumer(warehouse: Path, spark) -> tuple:
    with Session(warehouse, spark=spark) as session:
        consumption.setup_warehouse(session, consumption.FIRST)
        src = session.catalog.get_table("DB", "PUBLIC", "SRC")
        stream = session.catalog.get_stream("DB", "PUBLIC", "S")
        return DeltaTable(src.uri).version(), stream


@pytest.fixture(scope="module")
def kills(tmp_path_factory, spark):
    """Scenario name -> a warehouse and the child running A or the consumer there, killed
    at the scenario's failpoint (and for A, B's session, opened before the child started).
    One child per failpoint runs every scenario killed there (:mod:`killed_together`);
    each starts once its warehouses are set up. A test waits for its own."""
    started: dict[str, Scenario | Consumed] = {}
    try:
        for point in KILL_POINTS:
            prepared, bodies = {}, {}
            for name in [name for name, (at, _b) in SCENARIOS.items() if at == point]:
                warehouse = tmp_path_factory.mktemp(name) / "warehouse"
                consumer = name.startswith("both_")
                prepare = prepare_consumer if consumer else prepare_transaction
                prepared[name] = prepare(warehouse, spark)
                bodies[name] = (warehouse, consumption.CONSUME_BOTH if consumer else TXN_A)
            folder = tmp_path_factory.mktemp(f"group-{point}")
            for name, member in start_group(point, bodies, folder).items():
                kind = Consumed if name.startswith("both_") else Scenario
                started[name] = kind(bodies[name][0], member, *prepared[name])
        yield started
    finally:
        for scenario in started.values():
            scenario.child.stop()
            if isinstance(scenario, Scenario):
                scenario.writer.close()


def killed(scenario: Scenario, point: str) -> list:
    """Wait for A's death; check and return what it left pending (no recovery ran)."""
    child = scenario.child
    child.wait()
    assert child.proc.returncode == -9, child.describe()  # SIGKILLed at the failpoint
    assert child.results() == []
    pending = pending_of(scenario.warehouse)
    if point == "pipeline_after_stage":
        assert pending == []
    else:
        state = "decided" if KILL_POINTS[point] else "preparing"
        assert [p.state for p in pending] == [state], pending
    before = {"T1": [], "T2": scenario.t2_commits}
    landed = {name: pipeline_commits(uri_of(scenario.warehouse, name)) for name in before}
    if point == "pipeline_between_tables":  # T1 is the first table of the plan
        assert landed == {"T1": [pending[0].id], "T2": before["T2"]}
    elif point == "pipeline_before_finish":
        assert landed == {"T1": [pending[0].id], "T2": [*before["T2"], pending[0].id]}
    else:
        assert landed == before
    return pending


def check_consistent(
    session: Session,
    warehouse: Path,
    t1: list[tuple[int, str]],
    t2: list[tuple[int, str]],
    stream: list[tuple[int, str]],
) -> None:
    """Spark and delta-rs agree on T1 and T2, S shows ``stream``, nothing is pending,
    S is not claimed, and no pipeline commit landed twice in any table."""
    assert pairs_of(session, "T1") == t1
    assert pairs_of(session, "T2") == t2
    assert pairs_of(session, "S") == stream
    assert session.catalog.pending_commits() == []
    assert session.catalog.get_stream("DB", "PUBLIC", "S").claimed_by is None
    for name, expected in (("T1", t1), ("T2", t2)):
        uri = uri_of(warehouse, name)
        assert delta_pairs(uri) == expected, name
        ids = pipeline_commits(uri)
        assert len(ids) == len(set(ids)), f"{name}: a pipeline commit landed twice: {ids}"
    catalog = catalog_of(warehouse)  # what the file holds, not this session's view
    try:
        assert catalog.pending_commits() == []
    finally:
        catalog.close()


def consume_again(session: Session, warehouse: Path, t2: list[tuple[int, str]]) -> None:
    """New rows in SRC reach T1 through S: every SRC row is in T1 exactly once."""
    session.sql(f"INSERT INTO SRC VALUES {literal(MORE)}")
    session.sql("INSERT INTO T1 SELECT ID, V FROM S")
    assert pairs_of(session, "SRC") == sorted(FIRST + MORE)
    check_consistent(session, warehouse, t1=sorted(FIRST + MORE), t2=t2, stream=[])


# 1. A killed at every step; B updates the row A updated


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_writer_after_a_killed_multi_table_commit_sees_all_or_nothing(
    point, kills, session_factory
):
    scenario = kills[point]
    warehouse, writer = scenario.warehouse, scenario.writer
    assert scenario.stream_rows == FIRST
    pending = killed(scenario, point)
    decided = KILL_POINTS[point]

    # B, whose session opened before A's commit existed, writes a row A changed: it
    # rolls A forward or abandons it first (A's "rows" intent on T2 is in its way).
    updated = writer.sql("UPDATE T2 SET V = 'fromB' WHERE ID = 1").collect()
    assert updated[0]["number of rows updated"] == 1, updated
    t2 = [(1, "fromB"), (2, "orig")]
    consumed = FIRST if decided else []
    remaining = [] if decided else FIRST
    check_consistent(writer, warehouse, t1=consumed, t2=t2, stream=remaining)

    t1_commits = pipeline_commits(uri_of(warehouse, "T1"))
    t2_commits = pipeline_commits(uri_of(warehouse, "T2"))
    before = scenario.t2_commits
    assert t2_commits[: len(before)] == before
    b_commit = t2_commits[-1]
    if decided:  # A's commit landed once in each table; B's came after it in T2
        assert t1_commits == [pending[0].id]
        assert t2_commits == [*before, pending[0].id, b_commit] and b_commit != pending[0].id
    else:  # A never landed anywhere; B's commit is T2's only new one
        assert t1_commits == [] and t2_commits == [*before, b_commit]
        assert not pending or pending[0].id != b_commit

    # A new session (its recovery finds nothing left) sees the same.
    fresh = session_factory(warehouse)
    check_consistent(fresh, warehouse, t1=consumed, t2=t2, stream=remaining)
    fresh.release_views()

    # The stream stays usable, from the writer that recovered A.
    consume_again(writer, warehouse, t2)
    writer.release_views()
    check_consistent(session_factory(warehouse), warehouse, sorted(FIRST + MORE), t2, [])


# 2. A killed between its tables; B consumes the same stream


def test_a_consumer_after_a_killed_multi_table_commit_consumes_each_row_once(
    kills, session_factory
):
    """A died after its Delta commit to T1 and before T2's: its claim on S is decided,
    and T1's log already carries S's app transaction past S's offset in the catalog.
    B consumes S into T1 (new rows were added meanwhile): it may roll A forward and
    take only the new rows, or answer StreamConflictError saying to run it again; run
    again, it must succeed. Either way every SRC row ends in T1 exactly once."""
    scenario = kills["consume_between_tables"]
    warehouse, writer = scenario.warehouse, scenario.writer
    pending = killed(scenario, "pipeline_between_tables")

    writer.sql(f"INSERT INTO SRC VALUES {literal(MORE)}")  # SRC is not in A's commit
    outcomes = []
    for _attempt in range(2):
        try:
            inserted = writer.sql("INSERT INTO T1 SELECT ID, V FROM S").collect()
        except StreamConflictError as exc:
            assert "run it again" in str(exc).lower(), str(exc)
            outcomes.append(("conflict", str(exc)))
            continue
        outcomes.append(("ok", inserted[0]["number of rows inserted"]))
        break
    assert outcomes[-1][0] == "ok", outcomes
    assert outcomes[-1][1] == len(MORE), outcomes  # A's rows came by A's roll-forward

    all_rows = sorted(FIRST + MORE)
    t2 = [(1, "fromA"), (2, "orig")]  # A rolled forward in full
    check_consistent(writer, warehouse, t1=all_rows, t2=t2, stream=[])
    assert pipeline_commits(uri_of(warehouse, "T2")) == [*scenario.t2_commits, pending[0].id]
    assert pipeline_commits(uri_of(warehouse, "T1"))[0] == pending[0].id
    writer.release_views()
    check_consistent(session_factory(warehouse), warehouse, all_rows, t2, [])


# 3. A consumer of one stream into two tables, killed at every step, then recovered


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_consumer_killed_at_any_point_commits_all_or_nothing(point, kills, session_factory):
    scenario = kills[f"both_{point}"]
    warehouse, app_id = scenario.warehouse, stream_app_id(scenario.stream)
    child = scenario.child
    child.wait()
    assert child.proc.returncode == -9, child.describe()  # SIGKILLed at the failpoint
    assert child.results() == []

    # What the dead consumer left, before anyone recovers it.
    decided = KILL_POINTS[point]
    uris = {name: uri_of(warehouse, name) for name in ("T1", "T2")}
    pending = pending_of(warehouse)
    # Reserved (intents held) from the reservation on; decided from the decision on.
    assert len(pending) == (0 if point == "pipeline_after_stage" else 1)
    assert [p.state for p in pending] == [] if not pending else [
        "decided" if decided else "preparing"
    ]
    landed = {name: pipeline_commits(uri) for name, uri in uris.items()}
    if point == "pipeline_between_tables":
        assert landed == {"T1": [pending[0].id], "T2": []}
    elif point == "pipeline_before_finish":
        assert landed == {"T1": [pending[0].id], "T2": [pending[0].id]}
    else:
        assert landed == {"T1": [], "T2": []}

    # A new session recovers: a decided commit rolls forward, an undecided one never was.
    recovered = session_factory(warehouse)
    if decided:
        consumption.check_consistent(recovered, consumed=consumption.FIRST, pending=[])
        for uri in uris.values():
            assert pipeline_commits(uri) == [pending[0].id]
            assert DeltaTable(uri).transaction_version(app_id) == scenario.src_version
    else:
        consumption.check_consistent(recovered, consumed=[], pending=consumption.FIRST)
        for uri in uris.values():
            assert pipeline_commits(uri) == []
            assert DeltaTable(uri).transaction_version(app_id) is None

    # Recovering again changes nothing: the roll-forward is never applied twice.
    versions = {name: DeltaTable(uri).version() for name, uri in uris.items()}
    again = session_factory(warehouse)
    assert {name: DeltaTable(uri).version() for name, uri in uris.items()} == versions
    assert again.catalog.pending_commits() == []

    # The stream keeps working: new rows, consumed again into both tables.
    consumption.insert(again, consumption.MORE)
    with again.transaction():
        again.sql("INSERT INTO t1 SELECT a FROM s")
        again.sql("INSERT INTO t2 SELECT a FROM s")
    consumption.check_consistent(again, consumed=sorted(consumption.FIRST + consumption.MORE), pending=[])
    for uri in uris.values():
        assert len(pipeline_commits(uri)) == (2 if decided else 1)
        assert DeltaTable(uri).transaction_version(app_id) == scenario.src_version + 1
