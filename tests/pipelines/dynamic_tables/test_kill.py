"""A dynamic table's refresh, and its CREATE, SIGKILLed at every step of the commit.

A refresh is one consumer commit (``pipelines.transactions.commit.commit_consumer``)
whose plan carries the refresh claim. The child process runs ``ALTER DYNAMIC TABLE ...
REFRESH`` (an incremental refresh that deletes and inserts rows; in the ``overwrite_``
scenarios a FULL refresh of a table nothing follows, which overwrites it) or a CREATE
(the initial refresh) and is killed at one failpoint; the ``join_`` scenarios refresh a
join incrementally through the query-delta engine; the ``extremes_`` scenarios refresh a
MIN/MAX aggregation whose change took one group's MIN and another group's MAX (so those
two groups are aggregated again from their rows) and inserted into a third; the
``subquery_`` scenarios refresh a filter by an uncorrelated scalar subquery (``V > (SELECT
avg(V) ...)``) whose change moves the subquery's value, so the filter is evaluated whole
at both versions (some untouched rows leave); the ``replace_`` scenarios kill a CREATE
OR REPLACE DYNAMIC TABLE, and the ``union_`` one an INCREMENTAL_STRICT refresh of a
UNION ALL with a stream on the table, after its Delta commit (these three came from the
review in ``test_refresh_exactly_once``). A new session on the warehouse (whose opening
recovers) must then find the refresh applied once or not at all: the table holds the
query's result at the data timestamp recorded (the new one if the commit was decided,
the old one otherwise), the history row says SUCCEEDED or FAILED (INTERRUPTED), no
pending commit is left, the table's log holds the refresh at most once, and the next
refresh brings the table to the query's result.

The scenarios killed at one point die together in one child (a JVM each, started in
the module fixture; see ``killed_together``); helpers come from ``test_consumption_crash``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from flush.change_commit import PIPELINE_METADATA_KEY
from flush.tables import state_columns
from pipelines import Session, SqlError
from tests.pipelines.conftest import rows
from tests.pipelines.dynamic_tables.checks import (
    assert_consistent,
    assert_same_as_query,
    bag,
    history_rows,
    orphan_folders,
)
from tests.pipelines.dynamic_tables.test_refresh_exactly_once import UNION
from tests.pipelines.transactions.killed_together import Member, start_group
from tests.pipelines.transactions.test_consumption_crash import (
    KILL_POINTS,
    catalog_of,
    pending_of,
)

DEFINITION = "SELECT ID, V FROM T WHERE ID <> 2"
#: The same rows through a join, which the query-delta engine refreshes incrementally.
JOIN_DEFINITION = "REFRESH_MODE = INCREMENTAL AS SELECT T.ID, T.V FROM T JOIN T AS S ON T.ID = S.ID WHERE T.ID <> 2"
#: The same rows as groups of an aggregation whose state the table keeps (a hidden row
#: count per group, pipelines/incremental/algebraic.py): maintained from the change alone.
AGGREGATE_DEFINITION = ("REFRESH_MODE = INCREMENTAL AS SELECT ID, V FROM (SELECT ID, V, "
                        "count(*) AS N FROM T WHERE ID <> 2 GROUP BY ID, V)")
REFRESH = """
session.sql("ALTER DYNAMIC TABLE D REFRESH")
report(outcome="refreshed")
"""
#: MIN and MAX kept as state beside a count and a sum, over groups G of E.
EXTREMES_QUERY = ("SELECT G, min(X) AS LO, max(X) AS HI, count(*) AS N, sum(X) AS S "
                  "FROM E GROUP BY G")  # fmt: skip
EXTREMES_ROWS = ("(1, 'a', 1), (2, 'a', 5), (3, 'b', 2), (4, 'b', 9), (5, 'c', 4), "
                 "(6, 'c', 6), (7, NULL, 8), (8, 'c', NULL)")  # fmt: skip
#: The change the killed refresh applies: a's MIN (1) updated away, b's MAX (9) deleted
#: (both groups aggregated again from their rows), c given a new MIN by an insert.
EXTREMES_CHANGE = ("UPDATE E SET X = 7 WHERE ID = 1", "DELETE FROM E WHERE ID = 4",
                   "INSERT INTO E VALUES (9, 'c', 3)")  # fmt: skip
#: The refresh of EXTREMES_CHANGE, reporting the groups whose rows it reads again.
EXTREMES_REFRESH = """
import pipelines.incremental.delta as delta

restricted = delta.Deltas.restricted


def recording(self, rows, keys, touched):
    report(recomputed=sorted(str(row[0]) for row in touched.select("_INGEST_K0").collect()))
    return restricted(self, rows, keys, touched)


delta.Deltas.restricted = recording
session.sql("ALTER DYNAMIC TABLE D REFRESH")
report(outcome="refreshed")
"""
#: A filter by an uncorrelated scalar subquery over its own table.
SUBQUERY_QUERY = "SELECT ID, V FROM Q WHERE V > (SELECT avg(V) FROM Q)"
SUBQUERY_ROWS = "(1, 1), (2, 4), (3, 6), (4, 8), (5, 10)"  # avg 5.8: ids 3, 4, 5
#: The change the killed refresh applies: avg 5.8 -> 8.5, so id 1 (updated) enters, id 5
#: (deleted) leaves and so do ids 3 and 4, which the change did not touch.
SUBQUERY_CHANGE = ("UPDATE Q SET V = 16 WHERE ID = 1", "DELETE FROM Q WHERE ID = 5")
#: The refresh of SUBQUERY_CHANGE, reporting what subqueries.changed said of each operator
#: holding a subquery, and each operator subqueries.recomputed evaluated whole.
SUBQUERY_REFRESH = """
import pipelines.incremental.subqueries as subqueries

changed, recomputed = subqueries.changed, subqueries.recomputed


def recording_changed(deltas, node):
    found = changed(deltas, node)
    report(changed=[node.kind, found])
    return found


def recording_recomputed(deltas, node):
    report(recomputed=node.kind)
    return recomputed(deltas, node)


subqueries.changed, subqueries.recomputed = recording_changed, recording_recomputed
session.sql("ALTER DYNAMIC TABLE D REFRESH")
report(outcome="refreshed")
"""
CREATE = f"""
session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {DEFINITION}")
report(outcome="created")
"""
#: CREATE OR REPLACE of a dynamic table, whose new table is built beside the old one.
NEW_DEFINITION = "SELECT ID * 10 AS X, V FROM T"
REPLACE = f"""
session.sql("CREATE OR REPLACE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {NEW_DEFINITION}")
report(outcome="replaced")
"""
#: Scenario -> (what the child runs, the failpoint it is killed at).
SCENARIOS = {
    **{f"refresh_{point}": (REFRESH, point) for point in KILL_POINTS},
    **{f"overwrite_{point}": (REFRESH, point) for point in
       ("pipeline_after_validate", "pipeline_after_decide", "pipeline_before_finish")},
    **{f"join_{point}": (REFRESH, point) for point in
       ("pipeline_after_validate", "pipeline_after_decide", "pipeline_before_finish")},
    **{f"aggregate_{point}": (REFRESH, point) for point in
       ("pipeline_after_validate", "pipeline_after_decide")},
    **{f"extremes_{point}": (EXTREMES_REFRESH, point) for point in
       ("pipeline_after_validate", "pipeline_after_decide")},
    **{f"subquery_{point}": (SUBQUERY_REFRESH, point) for point in
       ("pipeline_after_validate", "pipeline_after_decide")},
    "create_pipeline_after_validate": (CREATE, "pipeline_after_validate"),
    "create_pipeline_after_decide": (CREATE, "pipeline_after_decide"),
    "replace_pipeline_after_validate": (REPLACE, "pipeline_after_validate"),
    "replace_pipeline_after_decide": (REPLACE, "pipeline_after_decide"),
    "union_pipeline_between_tables": (REFRESH, "pipeline_between_tables"),
}  # fmt: skip


def setup_warehouse(
    session: Session, create: bool, full: bool = False, definition: str = DEFINITION
) -> None:
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    if create:
        return
    mode = "REFRESH_MODE = FULL " if full else ""
    if not definition.startswith("REFRESH_MODE"):
        definition = f"{mode}AS {definition}"
    session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' {definition}")
    session.sql("UPDATE T SET V = 'x' WHERE ID = 3")  # the refresh deletes one, inserts one
    session.sql("INSERT INTO T VALUES (5, 'e')")


def setup_extremes(session: Session) -> None:
    session.sql("CREATE TABLE E (ID NUMBER, G VARCHAR, X INT)")
    session.sql(f"INSERT INTO E VALUES {EXTREMES_ROWS}")
    session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL "
                f"AS {EXTREMES_QUERY}")  # fmt: skip
    for statement in EXTREMES_CHANGE:
        session.sql(statement)


def setup_subquery(session: Session) -> Counter:
    """Q and D over SUBQUERY_QUERY, then SUBQUERY_CHANGE; returns D's rows before it."""
    session.sql("CREATE TABLE Q (ID NUMBER, V NUMBER(10, 0))")  # V a bigint: 6 > 5.8
    session.sql(f"INSERT INTO Q VALUES {SUBQUERY_ROWS}")
    session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = INCREMENTAL "
                f"AS {SUBQUERY_QUERY}")  # fmt: skip
    before = bag(session, "SELECT * FROM D")
    assert before == bag(session, SUBQUERY_QUERY)
    for statement in SUBQUERY_CHANGE:
        session.sql(statement)
    return before


def setup_replace_or_union(session: Session, name: str) -> int:
    """T, and D over it: for ``union_``, an INCREMENTAL_STRICT D of UNION with a stream
    on it and a change to refresh; for ``replace_``, D of DEFINITION and a stream on T
    (another object, to outlive the replace). Returns D's id."""
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')")
    if name.startswith("union_"):
        session.sql("CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' REFRESH_MODE = "
                    f"INCREMENTAL_STRICT AS {UNION}")  # fmt: skip
        session.sql("CREATE STREAM S ON TABLE D AT(VERSION => 0)")
        session.sql("UPDATE T SET V = 'x' WHERE ID IN (2, 3)")
        session.sql("DELETE FROM T WHERE ID = 1")
        session.sql("INSERT INTO T VALUES (6, 'f')")
    else:
        session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {DEFINITION}")
        session.sql("CREATE STREAM S ON TABLE T")
    return session.require_table("D").id


def hidden_state(session: Session, name: str) -> dict:
    """Each group's (G's) hidden state columns, by name."""
    table = DeltaTable(session.require_table(name).uri)
    names = state_columns(pa.schema(table.schema()))
    assert names, f"{name} keeps no state"
    found = table.to_pyarrow_table(columns=["G", *names]).to_pylist()
    return {row.pop("G"): row for row in found}


def fresh_state(session: Session) -> dict:
    """The hidden state of a table of EXTREMES_QUERY created now (its initial refresh)."""
    session.sql("CREATE OR REPLACE DYNAMIC TABLE D_FRESH TARGET_LAG = '1 hour' "
                f"REFRESH_MODE = INCREMENTAL AS {EXTREMES_QUERY}")  # fmt: skip
    state = hidden_state(session, "D_FRESH")
    counts = {g: n for g, n in session.sql("SELECT G, count(*) FROM E GROUP BY G").collect()}
    assert {g: s["_INGEST_STATE_ROWS"] for g, s in state.items()} == counts
    return state


def content(session: Session, name: str) -> list[tuple[int, str]]:
    return sorted((int(i), v) for i, v in rows(session.sql(f"SELECT ID, V FROM {name}")))


def refresh_commits(uri: str) -> list[int]:
    """The refresh history ids in the table's log, oldest first (one per refresh commit)."""
    entries = sorted(DeltaTable(uri).history(), key=lambda e: e["version"])
    found = []
    for entry in entries:
        if PIPELINE_METADATA_KEY in entry:
            metadata = orjson.loads(entry[PIPELINE_METADATA_KEY])
            found.append(metadata["dynamic_table"]["refresh"])
    return found


_DEFINITIONS = {"join": JOIN_DEFINITION, "aggregate": AGGREGATE_DEFINITION}


@dataclass
class Scenario:
    warehouse: Path
    child: Member
    before: object = None  # D's content before the child ran ([] for CREATE; a bag for some)
    state: dict | None = None  # extremes_: D's hidden state before the child ran
    old_id: int | None = None  # replace_, union_: D's id before the child ran


def prepare(session: Session, name: str, body: str) -> dict:
    """Set up the scenario's warehouse; what its Scenario records of it before the kill."""
    if name.startswith("extremes_"):
        setup_extremes(session)
        return {"before": bag(session, "SELECT * FROM D"), "state": hidden_state(session, "D")}
    if name.startswith("subquery_"):
        return {"before": setup_subquery(session)}
    if name.startswith(("replace_", "union_")):
        return {"old_id": setup_replace_or_union(session, name)}
    setup_warehouse(session, create=body is CREATE, full=name.startswith("overwrite_"),
                    definition=_DEFINITIONS.get(name.split("_")[0], DEFINITION))  # fmt: skip
    return {"before": [] if body is CREATE else content(session, "D")}


@pytest.fixture(scope="module")
def kills(tmp_path_factory, spark):
    """Scenario name -> its warehouse and the child that ran it. One child per kill
    point runs every scenario killed there (:mod:`killed_together`), each on its own
    warehouse: 6 JVMs, not one per scenario; each starts once its scenarios are set up."""
    started: dict[str, Scenario] = {}
    try:
        for point in KILL_POINTS:
            names = [name for name, (_, at) in SCENARIOS.items() if at == point]
            prepared, bodies = {}, {}
            for name in names:
                body = SCENARIOS[name][0]
                warehouse = tmp_path_factory.mktemp(name) / "warehouse"
                with Session(warehouse, spark=spark) as session:
                    prepared[name] = prepare(session, name, body)
                bodies[name] = (warehouse, body)
            folder = tmp_path_factory.mktemp(f"group-{point}")
            for name, member in start_group(point, bodies, folder).items():
                started[name] = Scenario(bodies[name][0], member, **prepared[name])
        yield started
    finally:
        for scenario in started.values():
            scenario.child.stop()


_REFRESHES = ("refresh_", "overwrite_", "join_", "aggregate_")


def recorded_once(session, info, decided: bool):
    """The killed refresh's record after recovery: applied once (``decided``) or not at
    all, its claim released, its history row, one commit of each refresh; D's catalog
    record and history."""
    dt = session.catalog.get_dynamic_table(info.id)
    assert dt.claimed_by is None and dt.refresh_seq == (2 if decided else 1)
    history = session.catalog.list_refreshes(info.id)
    assert [(r.trigger, r.state, r.reason) for r in history] == [
        ("MANUAL", "SUCCEEDED" if decided else "FAILED", "" if decided else "INTERRUPTED"),
        ("INITIAL", "SUCCEEDED", ""),
    ]
    commits = refresh_commits(info.uri)
    assert len(commits) == len(set(commits)) == (2 if decided else 1)
    return dt, history


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith(_REFRESHES)])
def test_a_killed_refresh_is_applied_once_or_not_at_all(kills, session_factory, name):
    scenario = kills[name]
    scenario.child.wait()
    assert scenario.child.proc.returncode == -9, scenario.child.describe()
    point = SCENARIOS[name][1]
    decided = KILL_POINTS[point]
    assert len(pending_of(scenario.warehouse)) == (0 if point == "pipeline_after_stage" else 1)
    session = session_factory(scenario.warehouse)  # opening it recovers
    assert pending_of(scenario.warehouse) == []
    fresh = content(session, "T WHERE ID <> 2")
    expected = fresh if decided else scenario.before
    assert content(session, "D") == expected
    info = session.require_table("D")
    dt, history = recorded_once(session, info, decided)
    if decided:
        assert dt.data_timestamp_us == history[0].data_timestamp_us
        assert history[0].table_version == DeltaTable(info.uri).version()
    if name.startswith("overwrite_") and decided:  # one overwrite: every row replaced once
        assert history[0].action == "FULL" and history[0].rows_deleted == len(scenario.before)
        assert DeltaTable(info.uri).history(1)[0]["operation"] == "WRITE"
    if name.startswith("join_") and decided:  # the engine's refresh: the two changed rows
        assert (history[0].action, history[0].rows_inserted, history[0].rows_updated) == (
            "INCREMENTAL", 1, 1)
    if name.startswith("aggregate_"):  # each group's hidden row count: 1, once each
        counts = DeltaTable(info.uri).to_pyarrow_table(columns=["_INGEST_STATE_ROWS"])
        assert counts.column(0).to_pylist() == [1] * len(expected)
    # The next refresh brings it to the query's result, once.
    session.sql("INSERT INTO T VALUES (6, 'f')")
    if name.startswith("aggregate_"):  # a group whose state says it is gone
        session.sql("DELETE FROM T WHERE ID = 1")
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    if name.startswith("aggregate_"):
        assert "INCREMENTAL" in session.catalog.list_refreshes(info.id)[0].action
    assert content(session, "D") == content(session, "T WHERE ID <> 2")
    assert len(set(refresh_commits(info.uri))) == len(refresh_commits(info.uri))


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("extremes_")])
def test_a_killed_refresh_that_recomputes_lost_extremes(kills, session_factory, name):
    scenario = kills[name]
    scenario.child.wait()
    assert scenario.child.proc.returncode == -9, scenario.child.describe()
    # The killed refresh read again the rows of a (its MIN gone) and b (its MAX gone) only.
    reported = [r["recomputed"] for r in scenario.child.results() if "recomputed" in r]
    assert reported and set().union(*reported) == {"a", "b"}, scenario.child.describe()
    decided = KILL_POINTS[SCENARIOS[name][1]]
    assert len(pending_of(scenario.warehouse)) == 1
    session = session_factory(scenario.warehouse)  # opening it recovers
    assert pending_of(scenario.warehouse) == []
    expected = bag(session, EXTREMES_QUERY) if decided else scenario.before
    assert bag(session, "SELECT * FROM D") == expected
    assert hidden_state(session, "D") == (fresh_state(session) if decided else scenario.state)
    info = session.require_table("D")
    _, history = recorded_once(session, info, decided)
    if decided:
        assert history[0].action == "INCREMENTAL"
        assert history[0].table_version == DeltaTable(info.uri).version()
    # The next refresh (c's new MIN deleted, the NULL group's MAX moved, a new group) is
    # INCREMENTAL, exact, and leaves the state a fresh table has.
    for statement in ("DELETE FROM E WHERE ID = 9", "UPDATE E SET X = 100 WHERE ID = 7",
                      "INSERT INTO E VALUES (10, 'd', 0), (11, 'a', NULL)"):  # fmt: skip
        session.sql(statement)
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert session.catalog.list_refreshes(info.id)[0].action == "INCREMENTAL"
    assert bag(session, "SELECT * FROM D") == bag(session, EXTREMES_QUERY)
    assert hidden_state(session, "D") == fresh_state(session)
    assert len(set(refresh_commits(info.uri))) == len(refresh_commits(info.uri))


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("subquery_")])
def test_a_killed_refresh_that_evaluates_a_filter_whose_subquery_moved(
    kills, session_factory, name
):  # fmt: skip
    scenario = kills[name]
    scenario.child.wait()
    assert scenario.child.proc.returncode == -9, scenario.child.describe()
    # The killed refresh found the subquery's value changed and evaluated the filter whole.
    results = scenario.child.results()
    assert {tuple(r["changed"]) for r in results if "changed" in r} == {("Filter", True)}, (
        scenario.child.describe())  # fmt: skip
    assert {r["recomputed"] for r in results if "recomputed" in r} == {"Filter"}
    decided = KILL_POINTS[SCENARIOS[name][1]]
    assert len(pending_of(scenario.warehouse)) == 1
    session = session_factory(scenario.warehouse)  # opening it recovers
    assert pending_of(scenario.warehouse) == []
    new = bag(session, SUBQUERY_QUERY)  # untouched ids 3 and 4 left, updated id 1 entered
    assert {r[0] for r in scenario.before} == {"#3", "#4", "#5"} and {r[0] for r in new} == {"#1"}
    assert bag(session, "SELECT * FROM D") == (new if decided else scenario.before)
    info = session.require_table("D")
    dt, history = recorded_once(session, info, decided)
    if decided:
        assert history[0].action == "INCREMENTAL"
        assert dt.data_timestamp_us == history[0].data_timestamp_us
        assert history[0].table_version == DeltaTable(info.uri).version()
    # The next refreshes are INCREMENTAL and exact: one moves the average back (8.5 ->
    # 5.67: ids 3 and 4 return), one keeps it (34 / 6) while id 3 leaves by its own change.
    for change in (("INSERT INTO Q VALUES (6, 0), (7, 0)",),
                   ("UPDATE Q SET V = 5 WHERE ID = 3", "UPDATE Q SET V = 9 WHERE ID = 4")):
        for statement in change:
            session.sql(statement)
        session.sql("ALTER DYNAMIC TABLE D REFRESH")
        assert session.catalog.list_refreshes(info.id)[0].action == "INCREMENTAL"
        assert_same_as_query(session, "D", SUBQUERY_QUERY)
    assert_consistent(session, "D")


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith("create_")])
def test_a_killed_create_leaves_the_table_whole_or_nothing(kills, session_factory, name):
    scenario = kills[name]
    scenario.child.wait()
    assert scenario.child.proc.returncode == -9, scenario.child.describe()
    decided = KILL_POINTS[SCENARIOS[name][1]]
    catalog = catalog_of(scenario.warehouse)
    try:  # before recovery: the half-made table is there, INITIALIZING
        assert [dt.state for dt in catalog.list_dynamic_tables()] == ["INITIALIZING"]
    finally:
        catalog.close()
    session = session_factory(scenario.warehouse)
    if decided:
        assert content(session, "D") == content(session, "T WHERE ID <> 2")
        (dt,) = session.catalog.list_dynamic_tables()
        assert dt.state == "ACTIVE" and dt.data_timestamp_us is not None
        assert [r.state for r in session.catalog.list_refreshes()] == ["SUCCEEDED"]
    else:
        assert session.catalog.list_dynamic_tables() == []
        assert [t.name for t in session.catalog.list_tables()] == ["T"]
        assert list(scenario.warehouse.rglob("D*/_delta_log")) == []
        with pytest.raises(SqlError, match="does not exist"):
            session.sql("SELECT * FROM D")
        session.sql(f"CREATE DYNAMIC TABLE D TARGET_LAG = '1 minute' AS {DEFINITION}")
        assert content(session, "D") == content(session, "T WHERE ID <> 2")


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n.startswith(("replace_", "union_"))])
def test_a_killed_refresh_or_replace_is_whole_or_nothing(kills, session_factory, name):
    """CREATE OR REPLACE killed before and after its decision, and an INCREMENTAL_STRICT
    refresh of a UNION ALL with a stream on it killed after its Delta commit: after
    recovery one table D, the old or (decided) the new, equal to its query, no table
    being built, no folder left over; the stream on D shows D's rows once."""
    scenario = kills[name]
    decided = KILL_POINTS[SCENARIOS[name][1]]
    assert scenario.child.wait() == -9, scenario.child.describe()
    assert len(pending_of(scenario.warehouse)) == 1
    session = session_factory(scenario.warehouse)  # opening it recovers
    assert session.catalog.pending_commits() == []
    names = sorted(t.name for t in session.catalog.list_tables())
    assert not [n for n in names if "$BUILDING$" in n], names
    assert orphan_folders(session) == set()
    assert [r.name for r in session.sql("SHOW DYNAMIC TABLES").collect()] == ["D"]
    assert len(session.catalog.list_dynamic_tables()) == 1
    if name.startswith("union_"):
        assert_same_as_query(session, "D", UNION)
        assert_consistent(session, "D")
        assert history_rows(session, "D")[0][1:3] == ("SUCCEEDED", "INCREMENTAL")
        stream = bag(session, 'SELECT ID, V, "METADATA$ACTION" FROM S')
        assert stream == Counter(
            {(*row, "INSERT"): n for row, n in bag(session, "SELECT * FROM D").items()}
        )
        session.sql("INSERT INTO T VALUES (7, 'g')")
        session.sql("ALTER DYNAMIC TABLE D REFRESH")
        assert_same_as_query(session, "D", UNION)
        assert_consistent(session, "D")
        return
    replaced = session.require_table("D").id != scenario.old_id
    if not decided:
        assert not replaced
    assert_same_as_query(session, "D", NEW_DEFINITION if replaced else DEFINITION)
    assert_consistent(session, "D")
    session.sql("INSERT INTO T VALUES (7, 'g')")
    session.sql("ALTER DYNAMIC TABLE D REFRESH")
    assert_same_as_query(session, "D", NEW_DEFINITION if replaced else DEFINITION)
    catalog = catalog_of(scenario.warehouse)
    try:
        assert catalog.pending_commits() == []
    finally:
        catalog.close()
