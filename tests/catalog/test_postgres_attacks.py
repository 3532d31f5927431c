"""Adversarial tests of the catalog on PostgreSQL against the same calls on SQLite: the
values one stores and the other may not, order, out-of-range numbers, locks, many
processes at once, and a SQLite catalog laid out by the code before positions were kept.

A test marked ``xfail(strict=True, reason="DEFECT: ...")`` shows a defect: it asserts
what should happen and fails until the defect is fixed."""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from catalog import open_catalog
from catalog.records import ChannelProgress, CommitRecord
from ingest_sdk import TableSchema
from tests.catalog.older_code import older_code

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = TableSchema.parse({"ID": "INT"})
#: The commit before the PostgreSQL catalog (and committed positions): its catalog layout
#: has no ``channels.committed_position`` and its apply_commit skips versions at or
#: below the table's applied version.
BEFORE_POSITIONS = "78a6e16"


def record(version, *channels, next_row_id=10):
    return CommitRecord(version, tuple(ChannelProgress(*c) for c in channels), next_row_id, 1)


@pytest.fixture
def pair(tmp_path, postgres_dsn):
    """The same fresh catalog twice: on SQLite and on PostgreSQL."""
    made = {
        "sqlite": open_catalog(tmp_path / "catalog.sqlite"),
        "postgres": open_catalog(postgres_dsn),
    }
    yield made
    for catalog in made.values():
        catalog.close()


def outcome(call):
    """What a call gives: ("ok", value) or ("error", the exception's class name)."""
    try:
        return ("ok", call())
    except Exception as exc:  # the class is what a caller catches
        return ("error", f"{type(exc).__module__}.{type(exc).__name__}")


# --- 1. Values SQLite stores and PostgreSQL may not ----------------------------------------

#: Writes that carry user text (names, comments, query text) or text from data (an error
#: message quoting a value): each gets a NUL character.
NUL_WRITES = {
    "database name": lambda c, t: c.create_database("a\x00b")[0].name,
    "table name": lambda c, t: c.create_table("D", "S", "t\x00", "/w", SCHEMA).name,
    "view query text": lambda c, t: c.create_view("D", "S", "V", "SELECT 'a\x00b'", ("D", "S")).query,
    "view comment": lambda c, t: c.create_view("D", "S", "V", "SELECT 1", ("D", "S"), "c\x00").comment,
    "stream comment": lambda c, t: c.create_stream("D", "S", "ST", t.id, "DEFAULT", 0, "c\x00").comment,
    "refresh error": lambda c, t: _fail_refresh(c, t, "The value 'a\x00b' cannot be cast"),
}  # fmt: skip


def _fail_refresh(catalog, table, error):
    """Record a refresh of ``table`` that failed with ``error``; the error as recorded."""
    refresh_id = catalog.add_refresh({
        "dt_table_id": table.id, "name": "D.S.T", "refresh_uid": "u", "trigger": "MANUAL",
        "state": "EXECUTING", "data_timestamp_us": 1, "started_at": time.time()})  # fmt: skip
    catalog.update_refresh(refresh_id, state="FAILED", error=error)
    refresh = catalog.get_refresh(refresh_id)
    return refresh.state, refresh.error


@pytest.mark.parametrize("what", sorted(NUL_WRITES))
def test_text_with_a_nul_is_refused_alike(pair, what):
    """No catalog keeps text holding a NUL (PostgreSQL's text cannot): both refuse it with
    one error, except in a report (a refresh's error quoting a value), kept with U+FFFD
    for each NUL so that the failure is recorded."""
    outcomes = {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        outcomes[kind] = outcome(lambda c=catalog, t=table: NUL_WRITES[what](c, t))
    expected = (
        ("ok", ("FAILED", "The value 'a\ufffdb' cannot be cast"))
        if what == "refresh error"
        else ("error", "catalog.base.UnstorableValueError")
    )
    assert outcomes["sqlite"] == outcomes["postgres"] == expected


NUL_LOOKUPS = {
    "get_table": lambda c, t: c.get_table("D", "S", "T\x00"),
    "get_channel": lambda c, t: c.get_channel(t.id, "c\x00"),
    "drop_channel": lambda c, t: c.drop_channel(t.id, "c\x00"),
    "get_view": lambda c, t: c.get_view("D", "S", "V\x00"),
    "get_stream": lambda c, t: c.get_stream("D", "S", "S\x00"),
    "get_database": lambda c, t: c.get_database("D\x00"),
    "drop_schema": lambda c, t: c.drop_schema("D", "S\x00"),
}


@pytest.mark.parametrize("what", sorted(NUL_LOOKUPS))
def test_a_name_with_a_nul_is_not_found_alike(pair, what):
    outcomes = {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        outcomes[kind] = outcome(lambda c=catalog, t=table: NUL_LOOKUPS[what](c, t))
    assert outcomes["postgres"] == outcomes["sqlite"]


@pytest.mark.parametrize("text", [
    "", "x" * 2_000_000, "\u202eRTL\u200f", "😀🏳️‍🌈", "a'b\"c;--", "?%s%(x)s%%", "\\x00", "\ufeff",
])  # fmt: skip
def test_other_text_round_trips_alike(pair, text):
    """Empty, very long, bidi, emoji, quotes, placeholders (``to_postgres`` rewrites ``?``
    and ``%`` in statements, never in values) in query text, comments and offset tokens."""
    seen = {}
    short = text if len(text) < 100 else "long"  # a name: key columns (see the name tests)
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        view = catalog.create_view("D", "S", short or "V", text, ("D", "S"), comment=text)
        channel = catalog.open_channel(table.id, short)
        catalog.apply_commit(table.id, record(1, (short, channel.generation, 1, text, 1)))
        got = catalog.get_channel(table.id, short)
        seen[kind] = (view.name, view.query, view.comment, got.name, got.offset_token)
    assert seen["postgres"] == seen["sqlite"]
    assert seen["sqlite"][1:3] == (text, text) and seen["sqlite"][4] == text


def _long_name(seed, length=255):
    """A name of ``length`` characters the service accepts (MAX_NAME_LENGTH is 255), each
    four bytes in UTF-8 and random, so PostgreSQL cannot compress it in an index."""
    import random

    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x20000, 0x2A6DF)) for _ in range(length))  # CJK ext. B


@pytest.mark.parametrize("what", ["table", "view", "stream"])
def test_names_within_the_limit_are_recorded_alike(pair, what):
    from ingest_sdk.schema import check_object_name

    names = [check_object_name(_long_name(seed)) for seed in range(3)]
    outcomes = {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        make = {
            "table": lambda c=catalog: c.create_table(*names, "/w2", SCHEMA).name,
            "view": lambda c=catalog: c.create_view(*names, "SELECT 1", ("D", "S")).name,
            "stream": lambda c=catalog, t=table: c.create_stream(*names, t.id, "DEFAULT", 0).name,
        }[what]
        outcomes[kind] = outcome(make)
    assert outcomes["sqlite"] == ("ok", names[2])
    assert outcomes["postgres"] == outcomes["sqlite"]


def test_a_lone_surrogate_is_refused_alike(pair):
    outcomes = {kind: outcome(lambda c=c: c.create_database("a\ud800")) for kind, c in pair.items()}
    assert outcomes["sqlite"] == outcomes["postgres"] == ("error", "builtins.UnicodeEncodeError")


@pytest.mark.parametrize("table_id", [2**63, -(2**63) - 1, 2**64])
def test_an_id_past_64_bits_gives_one_answer(pair, table_id):
    outcomes = {kind: outcome(lambda c=c: c.get_table_by_id(table_id)) for kind, c in pair.items()}
    assert outcomes["sqlite"] == outcomes["postgres"] == ("ok", None)  # no table has it


@pytest.mark.parametrize("table_id", [2**63, -(2**63) - 1])
def test_an_id_past_64_bits_is_refused_alike_where_it_would_be_stored(pair, table_id):
    outcomes = {}
    for kind, catalog in pair.items():
        outcomes[kind] = outcome(lambda c=catalog: c.open_channel(table_id, "c"))
        assert catalog.list_channels() == []
    assert outcomes["sqlite"] == outcomes["postgres"] == (
        "error", "catalog.base.UnstorableValueError")  # fmt: skip


def test_negative_and_odd_ids_find_nothing_alike(pair):
    for table_id in (-1, 0, True, 1.5, "1"):
        outcomes = {
            kind: outcome(lambda c=c, i=table_id: c.get_table_by_id(i)) for kind, c in pair.items()
        }
        assert outcomes["sqlite"] == outcomes["postgres"] == ("ok", None), table_id


def test_the_row_id_sequence_refuses_to_pass_64_bits_alike(pair):
    outcomes, stored = {}, {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        catalog.reserve_row_ids(table.id, 2**63 - 10)
        outcomes[kind] = outcome(lambda c=catalog, t=table: c.reserve_row_ids(t.id, 100))
        stored[kind] = catalog.get_table_by_id(table.id).next_row_id
    assert outcomes["sqlite"][0] == "error"  # not ids past 2**63
    assert outcomes["sqlite"] == outcomes["postgres"]
    assert outcomes["sqlite"][1] == "catalog.base.RowIdsExhaustedError"
    assert all(isinstance(value, int) for value in stored.values()), stored
    assert stored["sqlite"] == stored["postgres"] == 2**63 - 10  # nothing reserved


def test_the_row_id_sequence_hands_out_its_last_id_alike(pair):
    firsts = {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        catalog.reserve_row_ids(table.id, 2**63 - 10)
        firsts[kind] = catalog.reserve_row_ids(table.id, 9)  # ids up to 2**63 - 2
        assert catalog.get_table_by_id(table.id).next_row_id == 2**63 - 1
    assert firsts["sqlite"] == firsts["postgres"] == 2**63 - 10


def test_a_nan_cutoff_removes_the_same_channels(pair):
    removed = {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
        catalog.open_channel(table.id, "c")
        removed[kind] = catalog.remove_inactive_channels(math.nan, set())
    assert removed["sqlite"] == removed["postgres"]


def test_nan_and_infinite_properties_read_back_alike(pair):
    seen = {}
    for kind, catalog in pair.items():
        table = catalog.create_table("D", "S", "T", "/w", SCHEMA, {"x": math.nan})
        seen[kind] = catalog.set_table_properties(table.id, {"y": math.inf, "z": True}).properties
    assert seen["sqlite"] == seen["postgres"]


# --- 2. Order and collation -----------------------------------------------------------

NAMES = ["a", "B", "b", "é", "e", "_x", "Z", "a b", "a-b", "ab", "A", "ä", "😀", "\u202eR",
         "\u03a9", "\uff5a", "10", "9", "a.b", '"q"']  # fmt: skip


def _lists(catalog):
    for name in NAMES:
        table = catalog.create_table(name, name, name, "/w", SCHEMA)
        catalog.create_view("V", "S", name, "SELECT 1", ("V", "S"))
        catalog.create_stream("W", "S", name, table.id, "DEFAULT", 0)
        catalog.open_channel(1, name)
    return (
        [t.full_name for t in catalog.list_tables()],
        [d.name for d in catalog.list_databases()],
        [s.full_name for s in catalog.list_schemas()],
        [v.name for v in catalog.list_views()],
        [s.name for s in catalog.list_streams()],
        [c.name for c in catalog.list_channels(1)],
        [c.name for c in catalog.list_channels()],
    )


def test_lists_are_in_byte_order_even_on_a_database_of_another_collation(
    pair, postgres_server, postgres_dsn
):
    """The test cluster is made with --locale=C; a real one may collate by language. The
    catalog's columns are COLLATE "C", so a database whose default is ICU en-US (which
    sorts "a" before "B") still lists as SQLite does."""
    import psycopg

    name = f"icu_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(postgres_server.dsn, autocommit=True) as connection:
        try:
            connection.execute(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu "
                               "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")  # fmt: skip
        except psycopg.Error as exc:
            pytest.skip(f"no ICU collation on this server: {exc}")
    icu = open_catalog(postgres_server.database_dsn(name))
    try:
        expected = _lists(pair["sqlite"])
        assert _lists(icu) == expected
        assert _lists(pair["postgres"]) == expected
        assert expected[5] == sorted(NAMES, key=lambda n: n.encode())
    finally:
        icu.close()
        with psycopg.connect(postgres_server.dsn, autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_unordered_lists_come_back_in_the_same_order(pair):
    """pending_commits and the refresh history after updates and deletes (PostgreSQL
    rewrites updated rows elsewhere in its heap: an order that depends on it would differ)."""
    from catalog import CommitIntent

    seen = {}
    for kind, catalog in pair.items():
        tables = [catalog.create_table("D", "S", f"T{i}", "/w", SCHEMA) for i in range(6)]
        commits = [catalog.reserve_commit(f"o{i}", {}, [CommitIntent(t.id, "append")])
                   for i, t in enumerate(tables)]  # fmt: skip
        for commit in commits[::2]:
            catalog.take_over_commit(commit.id, commit.owner, "moved")
        catalog.abandon_commit(commits[1].id)
        seen[kind] = [(p.id, p.owner) for p in catalog.pending_commits()]
    assert seen["sqlite"] == seen["postgres"]


# --- 3. Locks: a catalog open must not stall the readers of running services -----------


def test_opening_the_catalog_does_not_stall_the_readers_of_running_services(postgres_dsn):
    import psycopg

    running = open_catalog(postgres_dsn)
    table = running.create_table("D", "S", "T", "/w", SCHEMA)
    running.open_channel(table.id, "c")
    backup = psycopg.connect(postgres_dsn)  # as pg_dump: one transaction reading the tables
    backup.execute("SELECT count(*) FROM channels").fetchall()
    done: dict[str, float] = {}

    def start_another_service():
        began = time.monotonic()
        open_catalog(postgres_dsn).close()
        done["open"] = time.monotonic() - began

    def read():
        began = time.monotonic()
        running.list_channels(table.id)
        done["read"] = time.monotonic() - began

    opener = threading.Thread(target=start_another_service, daemon=True)
    opener.start()
    time.sleep(0.5)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(3)
    opener.join(3)
    stalled = dict(done)
    backup.rollback()  # the "backup" ends: everything goes on
    backup.close()
    reader.join(30)
    opener.join(30)
    running.close()
    assert "read" in stalled, "a running service's read of channels waited for the open"
    assert "open" in stalled, "a catalog open waited for a reader of the catalog"


# --- 4. Many processes at once -----------------------------------------------------------

_CHILD = r"""
import json, sys, time
from pathlib import Path
from catalog import open_catalog
from ingest_sdk import TableSchema
from ingest_sdk.errors import TableAlreadyExistsError
location, gate, index, table_id, rounds = sys.argv[1:]
location = location if location.startswith("postgres") else Path(location)
catalog = open_catalog(location)
(Path(gate) / f"ready-{index}").touch()
while not (Path(gate) / "go").exists():
    time.sleep(0.001)
out = {"generations": [], "created": [], "lost": [], "ids": []}
for n in range(int(rounds)):
    out["generations"].append(catalog.open_channel(int(table_id), "shared").generation)
    try:
        catalog.create_table("D", "S", f"X{n}", f"/w/{index}", TableSchema.parse({"ID": "INT"}))
        out["created"].append(n)
    except TableAlreadyExistsError:
        out["lost"].append(n)
    count = n % 7 + 1
    out["ids"].append((catalog.reserve_row_ids(int(table_id), count), count))
catalog.close()
print(json.dumps(out))
"""


def test_many_processes_open_create_and_reserve_without_loss_or_duplicates(
    catalog_location, tmp_path
):
    """Six processes at once on one catalog (each test on SQLite and on PostgreSQL):
    reopening one channel, creating the same tables, reserving row ids: every open counts,
    each table is created once (the others told it exists), the row ids tile."""
    catalog = open_catalog(catalog_location)
    table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
    gate = tmp_path / "gate"
    gate.mkdir()
    processes, rounds = 6, 40
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(catalog_location), str(gate),
                                  str(i), str(table.id), str(rounds)], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(processes)]  # fmt: skip
    deadline = time.monotonic() + 60
    while len(list(gate.glob("ready-*"))) < processes and time.monotonic() < deadline:
        time.sleep(0.01)
    (gate / "go").touch()
    outputs = []
    for child in children:
        stdout, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr[-3000:]
        outputs.append(json.loads(stdout))
    # Every open bumped the generation once (that each open is told its own generation is
    # test_concurrent_opens_of_one_channel_each_get_their_own_generation).
    for n in range(rounds):  # each table created once; the others told it exists
        assert sum(n in o["created"] for o in outputs) == 1
        assert sum(n in o["lost"] for o in outputs) == processes - 1
    ranges = sorted(r for o in outputs for r in o["ids"])
    assert ranges[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(ranges))
    end = ranges[-1][0] + ranges[-1][1]
    assert catalog.get_table_by_id(table.id).next_row_id == end
    assert catalog.get_channel(table.id, "shared").generation == processes * rounds
    catalog.close()


_OPEN_CHILD = r"""
import json, sys, time
from pathlib import Path
from catalog import open_catalog
location, gate, table_id, rounds = sys.argv[1:]
catalog = open_catalog(location)
(Path(gate) / f"ready-{time.monotonic_ns()}").touch()
while not (Path(gate) / "go").exists():
    time.sleep(0.001)
print(json.dumps([catalog.open_channel(int(table_id), "shared").generation
                  for _ in range(int(rounds))]))
catalog.close()
"""


def test_concurrent_opens_of_one_channel_each_get_their_own_generation(postgres_dsn, tmp_path):
    catalog = open_catalog(postgres_dsn)
    table = catalog.create_table("D", "S", "T", "/w", SCHEMA)
    gate = tmp_path / "gate"
    gate.mkdir()
    processes, rounds = 6, 100
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = [subprocess.Popen([sys.executable, "-c", _OPEN_CHILD, postgres_dsn, str(gate),
                                  str(table.id), str(rounds)], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(processes)]  # fmt: skip
    deadline = time.monotonic() + 60
    while len(list(gate.glob("ready-*"))) < processes and time.monotonic() < deadline:
        time.sleep(0.01)
    (gate / "go").touch()
    told = []
    for child in children:
        stdout, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr[-3000:]
        told += json.loads(stdout)
    catalog.close()
    duplicated = sorted(g for g in set(told) if told.count(g) > 1)
    assert not duplicated, f"generations handed to two opens at once: {duplicated}"


# --- 7. A SQLite catalog laid out before committed positions, opened by this code ---------

_OLD_CHILD = r"""
import sys
from catalog import SqliteCatalog
from catalog.records import ChannelProgress, CommitRecord
from ingest_sdk import TableSchema
catalog = SqliteCatalog(sys.argv[1])
table = catalog.create_table("D", "S", "T", "/w", TableSchema.parse({"ID": "INT"}))
for name in ("a", "b"):
    catalog.open_channel(table.id, name)
catalog.apply_commit(table.id, CommitRecord(1, (ChannelProgress("a", 1, 1, "a1", 2),), 2, 2))
catalog.apply_commit(table.id, CommitRecord(2, (ChannelProgress("b", 1, 1, "b1", 3),), 5, 3))
catalog.close()
"""


@pytest.fixture
def old_catalog(tmp_path):
    """A SQLite catalog made by the code of :data:`BEFORE_POSITIONS` (its layout has no
    committed_position): table D.S.T, channel a at token a1 (version 1), b at b1 (2)."""
    path = tmp_path / "catalog.sqlite"
    older_code(BEFORE_POSITIONS, tmp_path / "old-code")(_OLD_CHILD, str(path))
    import sqlite3

    with sqlite3.connect(path) as db:
        columns = {row[1] for row in db.execute("PRAGMA table_info(channels)")}
    assert "committed_position" not in columns  # the old layout indeed
    return path


def test_an_upgraded_catalog_replays_without_counting_twice(old_catalog):
    catalog = open_catalog(old_catalog)
    table = catalog.get_table("D", "S", "T")
    # Start-up replay of commits the old code applied already: nothing moves.
    catalog.apply_commit(table.id, record(1, ("a", 1, 1, "a1", 2), next_row_id=2))
    catalog.apply_commit(table.id, record(2, ("b", 1, 1, "b1", 3), next_row_id=5))
    a, b = catalog.get_channel(table.id, "a"), catalog.get_channel(table.id, "b")
    assert (a.offset_token, a.rows_committed, b.offset_token, b.rows_committed) == (
        "a1",
        2,
        "b1",
        3,
    )
    # A newer commit moves its channel, once.
    catalog.apply_commit(table.id, record(3, ("a", 1, 2, "a2", 4), next_row_id=9))
    catalog.apply_commit(table.id, record(3, ("a", 1, 2, "a2", 4), next_row_id=9))
    a = catalog.get_channel(table.id, "a")
    assert (a.offset_token, a.rows_committed) == ("a2", 6)
    reopened = catalog.open_channel(table.id, "a")
    assert reopened.generation == 2 and reopened.offset_token == "a2"
    catalog.close()


def test_an_upgraded_channel_records_a_commit_recorded_after_a_newer_one(old_catalog):
    """A channel from before committed positions moves with any commit above the applied
    version of the upgrade, so its commit recorded after another writer's newer one
    still counts (two services on one table)."""
    catalog = open_catalog(old_catalog)
    table = catalog.get_table("D", "S", "T")
    catalog.apply_commit(table.id, record(4, ("b", 1, 2, "b2", 1), next_row_id=12))  # B's, first
    catalog.apply_commit(table.id, record(3, ("a", 1, 2, "a2", 4), next_row_id=9))  # A's, after
    a = catalog.get_channel(table.id, "a")
    catalog.close()
    assert (a.offset_token, a.rows_committed) == ("a2", 6)


def test_the_upgraded_catalog_is_still_readable_by_its_old_layout_columns(old_catalog, tmp_path):
    """The upgrade only adds columns: a copy opened twice keeps its rows and tokens."""
    copy = Path(tempfile.mkdtemp(dir=tmp_path)) / "catalog.sqlite"
    shutil.copy(old_catalog, copy)
    for _ in range(2):
        catalog = open_catalog(copy)
        table = catalog.get_table("D", "S", "T")
        assert [(c.name, c.offset_token, c.generation) for c in catalog.list_channels(table.id)] == [
            ("a", "a1", 1), ("b", "b1", 1)]  # fmt: skip
        assert catalog.get_table_by_id(table.id).applied_version == 2
        catalog.close()
