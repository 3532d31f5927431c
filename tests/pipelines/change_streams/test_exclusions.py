"""``exclude_insert``, ``exclude_update``, ``exclude_delete`` and ``exclude_ttl_deletes``:
records of an excluded mod type are not emitted, the others keep their count and
sequence numbers within the transaction across partitions, every other mod is read
exactly once (across partitions and by a resumed read), ALTER ... SET OPTIONS turns them
on and off, INFORMATION_SCHEMA.CHANGE_STREAM_OPTIONS lists those given, and hostile
values are refused with nothing changed."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from flush.commit_clock import now_us
from pipelines.change_streams.records import rfc3339
from tests.pipelines.change_streams.test_read import changes, created, micros, read
from tests.pipelines.refusals import assert_refused

#: Inserts of keys 0..29 (spread over both partitions), then one MERGE that deletes,
#: updates and inserts in one transaction.
WRITES = (
    "INSERT INTO K SELECT id, 0 FROM range(30)",
    "MERGE INTO K USING (SELECT id FROM range(10, 40)) s ON K.ID = s.id "
    "WHEN MATCHED AND s.id < 15 THEN DELETE WHEN MATCHED THEN UPDATE SET V = 2 "
    "WHEN NOT MATCHED THEN INSERT VALUES (s.id, 3)",
)


def read_partitions(session, cs) -> dict[str, list[dict[str, Any]]]:
    """Each of the stream's partitions (none ended) read from the stream's creation."""
    stream = session.catalog.get_change_stream("DB", "PUBLIC", cs)
    start = created(session, cs)
    return {p.token: read(session, cs, start, p.token)
            for p in session.catalog.list_partitions(stream.uid)}  # fmt: skip


def by_transaction(tree: dict[str, list[dict[str, Any]]]) -> dict[str, list[tuple[str, Any]]]:
    found: dict[str, list[tuple[str, Any]]] = {}
    for token, records in tree.items():
        for change in changes(records):
            found.setdefault(change["server_transaction_id"], []).append((token, change))
    return found


def mod_keys(tree) -> Counter:
    """Each (transaction, mod type, key) the tree returned, with how often."""
    return Counter((c["server_transaction_id"], c["mod_type"], m["keys"]["ID"])
                   for records in tree.values() for c in changes(records)
                   for m in c["mods"])  # fmt: skip


def assert_numbered(tree) -> None:
    """Within each transaction: sequences 0..n-1, n records, the partitions counted, one
    last record per partition: of the records emitted."""
    for found in by_transaction(tree).values():
        assert sorted(int(c["record_sequence"]) for _, c in found) == list(range(len(found)))
        assert {c["number_of_records_in_transaction"] for _, c in found} == {len(found)}
        tokens = {t for t, _ in found}
        assert {c["number_of_partitions_in_transaction"] for _, c in found} == {len(tokens)}
        for token in tokens:
            mine = sorted((int(c["record_sequence"]), c) for t, c in found if t == token)
            flags = [c["is_last_record_in_transaction_in_partition"] for _, c in mine]
            assert flags == [False] * (len(flags) - 1) + [True]


def test_excluded_mod_types_are_not_emitted_and_the_rest_are_numbered(session):
    s = session
    s.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    s.sql("CREATE CHANGE STREAM ALL_KINDS FOR K OPTIONS (partitions = 2)")
    # exclude_ttl_deletes excludes nothing: no delete here is a time to live's.
    s.sql("CREATE CHANGE STREAM NO_UPDATES FOR K OPTIONS (partitions = 2, exclude_update = TRUE, "
          "exclude_ttl_deletes = TRUE)")  # fmt: skip
    s.sql("CREATE CHANGE STREAM UPDATES FOR K OPTIONS (exclude_insert = true, partitions = 2, "
          "exclude_delete = true, exclude_update = false)")  # fmt: skip
    # A column list of no column: the keys only, so inserts and deletes, never an update.
    s.sql("CREATE CHANGE STREAM KEYS FOR K() OPTIONS (partitions = 2)")
    for text in WRITES:
        s.sql(text)
    trees = {cs: read_partitions(s, cs) for cs in ("ALL_KINDS", "NO_UPDATES", "UPDATES", "KEYS")}
    every = mod_keys(trees["ALL_KINDS"])
    assert set(every.values()) == {1}
    assert Counter(kind for _, kind, _ in every) == {"INSERT": 40, "UPDATE": 15, "DELETE": 5}
    assert len(trees["ALL_KINDS"]) == 2 and all(map(changes, trees["ALL_KINDS"].values()))
    assert mod_keys(trees["NO_UPDATES"]) == Counter(
        {k: n for k, n in every.items() if k[1] != "UPDATE"})  # fmt: skip
    assert mod_keys(trees["UPDATES"]) == Counter(
        {k: n for k, n in every.items() if k[1] == "UPDATE"}
    )
    assert mod_keys(trees["KEYS"]) == mod_keys(trees["NO_UPDATES"])
    # The MERGE: the newest transaction.
    found = by_transaction(trees["ALL_KINDS"])
    merge = max(found, key=lambda t: found[t][0][1]["commit_timestamp"])
    assert {c["mod_type"] for _, c in by_transaction(trees["NO_UPDATES"])[merge]} == {
        "INSERT", "DELETE"}  # fmt: skip
    for tree in trees.values():
        assert_numbered(tree)


def test_alter_turns_exclusions_on_and_off_and_a_resumed_read_returns_each_once(session):
    s = session
    s.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY, V NUMBER)")
    s.sql("CREATE CHANGE STREAM CS FOR K")
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    (partition,) = s.catalog.list_partitions(stream.uid)
    start = created(s, "CS")
    s.sql("INSERT INTO K VALUES (1, 0), (2, 0)")
    s.sql("UPDATE K SET V = 1")
    middle = now_us()
    s.sql("DELETE FROM K WHERE ID = 1")
    s.sql("INSERT INTO K VALUES (3, 0)")

    def kinds(start_at=start, end=None):
        found = changes(read(s, "CS", start_at, partition.token, end=end))
        return [(c["mod_type"], sorted(m["keys"]["ID"] for m in c["mods"])) for c in found]

    def options():
        return sorted(tuple(r) for r in s.sql(
            "SELECT OPTION_NAME, OPTION_TYPE, OPTION_VALUE FROM "
            "INFORMATION_SCHEMA.CHANGE_STREAM_OPTIONS WHERE OPTION_NAME LIKE 'exclude%'"
        ).collect())  # fmt: skip

    everything = [("INSERT", [1, 2]), ("UPDATE", [1, 2]), ("DELETE", [1]), ("INSERT", [3])]
    assert kinds() == everything and options() == []
    # The exclusions apply to the changes from the ALTER on; earlier ones keep theirs.
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (exclude_insert = TRUE, exclude_delete = true)")
    assert kinds() == everything
    assert options() == [("exclude_delete", "BOOL", "TRUE"), ("exclude_insert", "BOOL", "TRUE")]
    s.sql("INSERT INTO K VALUES (4, 0)")
    s.sql("UPDATE K SET V = 2")
    s.sql("DELETE FROM K WHERE ID = 2")
    excluded = [*everything, ("UPDATE", [2, 3, 4])]
    assert kinds() == excluded
    # A read resumed from where the first one ended returns the rest, once, across ALTERs.
    first = read(s, "CS", start, partition.token, end=rfc3339(middle))
    resume = rfc3339(micros(first[-1]["heartbeat_record"]["timestamp"]) + 1)
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (exclude_insert = false, retention_period = '2d')")
    s.sql("INSERT INTO K VALUES (5, 0)")
    s.sql("DELETE FROM K WHERE ID = 5")
    assert kinds(start, rfc3339(middle)) + kinds(resume) == kinds() == [
        *excluded, ("INSERT", [5])]  # fmt: skip
    assert options() == [("exclude_delete", "BOOL", "TRUE"), ("exclude_insert", "BOOL", "FALSE")]
    shown = s.sql("SHOW CHANGE STREAMS LIKE 'CS'").collect()[0]
    assert (shown["exclude_insert"], shown["exclude_delete"], shown["retention_period"]) == (
        False, True, "2d")  # fmt: skip
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (exclude_delete = false)")
    s.sql("DELETE FROM K WHERE ID = 4")
    assert kinds() == [*excluded, ("INSERT", [5]), ("DELETE", [4])]


@pytest.mark.parametrize(("options", "fragments"), [
    ("exclude_insert = 'true'", ("exclude_insert must be TRUE or FALSE, got \"'true'\"",)),
    ("exclude_update = 1", ("exclude_update must be TRUE or FALSE, got '1'",)),
    ("exclude_delete = yes", ("exclude_delete must be TRUE or FALSE, got 'yes'",)),
    ("exclude_ttl_deletes = NULL", ("exclude_ttl_deletes must be TRUE or FALSE",)),
    ("exclude_inserts = true", ("unknown change stream option 'exclude_inserts'",
                                "exclude_insert, exclude_update, exclude_delete")),
    ("allow_txn_exclusion = true", ("unknown change stream option 'allow_txn_exclusion'",)),
    ("exclude_insert = true, exclude_insert = false", ("the option exclude_insert is given twice",)),
    ("exclude_insert true", ("cannot read OPTIONS",)),
])  # fmt: skip
def test_bad_exclude_options_are_refused_and_change_nothing(session, options, fragments):
    session.sql("CREATE TABLE K (ID NUMBER PRIMARY KEY)")
    session.sql("CREATE CHANGE STREAM CS FOR K OPTIONS (exclude_update = true)")
    for statement in (f"CREATE CHANGE STREAM X FOR K OPTIONS ({options})",
                      f"ALTER CHANGE STREAM CS SET OPTIONS ({options})"):  # fmt: skip
        assert_refused(session, statement, "SQL_COMPILATION_ERROR", *fragments, collect=False,
                       unchanged=lambda s: s.catalog.list_change_streams())  # fmt: skip
