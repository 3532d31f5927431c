"""A change stream's history: an ALTER applies to the changes committed from then on,
as in Spanner. The same range read before and after an ALTER returns the same records;
a read resumed across an ALTER returns every record once, each under the definition of
its moment; a table removed and added again reports only what it did while watched; a
writer whose clock is behind, committing after the ALTER, is still after it; and a
stream whose catalog kept no history reads under its current definition."""

from __future__ import annotations

import sqlite3
import threading

import flush.commit_clock as commit_clock
from flush.commit_clock import now_us
from pipelines.change_streams.history import definition_at
from pipelines.change_streams.records import rfc3339
from tests.pipelines.change_streams.test_partitions import check_progress, reader
from tests.pipelines.change_streams.test_read import changes, flush_rows, micros, read

#: A wait for the writer thread that takes longer than this has hung (seconds).
TIMEOUT = 60


def keys(found):
    """``(table, mod_type, ID, capture)`` of every mod, in order."""
    return [(c["table_name"], c["mod_type"], m["keys"]["ID"], c["value_capture_type"])
            for c in changes(found) for m in c["mods"]]  # fmt: skip


def test_an_alter_between_two_reads_of_a_range_changes_neither(watched):
    s, token = watched
    s.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    start = rfc3339(now_us())
    s.sql("INSERT INTO T VALUES (1, 'a')")
    s.sql("INSERT INTO U VALUES (1, 'a')")
    s.sql("UPDATE T SET V = 'b'")
    s.sql("DELETE FROM T")
    end = rfc3339(now_us())
    first = read(s, "CS", start, token, end=end)
    assert keys(first) == [("T", kind, 1, "OLD_AND_NEW_VALUES")
                           for kind in ("INSERT", "UPDATE", "DELETE")]  # fmt: skip
    s.sql("ALTER CHANGE STREAM CS SET FOR U, T()")
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'NEW_ROW', "
          "exclude_delete = TRUE)")  # fmt: skip
    assert read(s, "CS", start, token, end=end) == first
    # The changes after it follow the new definition.
    s.sql("INSERT INTO U VALUES (2, 'b')")
    s.sql("INSERT INTO T VALUES (2, 'b')")
    s.sql("DELETE FROM T")
    later = read(s, "CS", start, token)
    assert keys(later) == [*keys(first), ("U", "INSERT", 2, "NEW_ROW"),
                           ("T", "INSERT", 2, "NEW_ROW")]  # fmt: skip
    (insert_t,) = [c for c in changes(later) if c["table_name"] == "T" and
                   c["mods"][0]["keys"]["ID"] == 2]  # fmt: skip
    assert insert_t["mods"][0]["new_values"] == {}  # T(): its keys only


def test_a_read_resumed_across_an_alter_returns_each_record_once(watched):
    s, token = watched
    start = now_us()
    s.sql("INSERT INTO T VALUES (1, 'a')")
    first = read(s, "CS", rfc3339(start), token)  # ends with a heartbeat: where to resume
    resume = micros(first[-1]["heartbeat_record"]["timestamp"]) + 1
    s.sql("UPDATE T SET V = 'b'")
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'NEW_VALUES')")
    s.sql("UPDATE T SET V = 'c'")
    rest = read(s, "CS", rfc3339(resume), token)
    whole = read(s, "CS", rfc3339(start), token)
    assert changes(first) + changes(rest) == changes(whole)
    assert [(c["mod_type"], c["value_capture_type"], c["mods"][0]["old_values"])
            for c in changes(whole)] == [
        ("INSERT", "OLD_AND_NEW_VALUES", {}), ("UPDATE", "OLD_AND_NEW_VALUES", {"V": "a"}),
        ("UPDATE", "NEW_VALUES", {})]  # fmt: skip
    # Each record's definition is the one in force at its timestamp.
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    history = s.catalog.change_stream_history(stream.uid)
    assert [definition_at(history, micros(c["commit_timestamp"])).value_capture_type
            for c in changes(whole)] == [c["value_capture_type"] for c in changes(whole)]  # fmt: skip


def test_a_table_removed_and_added_again_reports_only_what_it_did_while_watched(watched):
    s, token = watched
    s.sql("CREATE TABLE U (ID NUMBER PRIMARY KEY, V VARCHAR)")
    start = now_us()
    records = reader(s, "CS", start, token)  # an open read, across both ALTERs
    found = [next(records)]
    s.sql("INSERT INTO T VALUES (1, 'watched')")
    s.sql("ALTER CHANGE STREAM CS SET FOR U")
    s.sql("INSERT INTO T VALUES (2, 'not watched')")
    s.sql("INSERT INTO U VALUES (1, 'watched')")
    s.sql("ALTER CHANGE STREAM CS SET FOR T, U")
    s.sql("INSERT INTO T VALUES (3, 'watched again')")
    expected = [("T", "INSERT", 1), ("U", "INSERT", 1), ("T", "INSERT", 3)]
    while len(changes(found)) < 3 or "heartbeat_record" not in found[-1]:
        found.append(next(records))
    check_progress(found)
    assert [k[:3] for k in keys(found)] == expected
    # A read started later, and one resumed from the open read's heartbeat, agree.
    assert [k[:3] for k in keys(read(s, "CS", rfc3339(start), token))] == expected
    beat = micros(found[-1]["heartbeat_record"]["timestamp"])
    s.sql("INSERT INTO T VALUES (4, 'later')")
    assert [k[:3] for k in keys(read(s, "CS", rfc3339(beat + 1), token))] == [("T", "INSERT", 4)]


def test_a_writer_whose_clock_is_behind_commits_after_the_alter(watched, monkeypatch):
    """The ALTER's moment comes from the seals: a commit after it, stamped a minute
    before it by a writer whose clock is behind, is under the new definition."""
    s, token = watched
    start = now_us()
    s.sql("INSERT INTO T VALUES (1, 'a')")
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'NEW_ROW')")
    monkeypatch.setattr(commit_clock, "clock", lambda: now_us() - 60_000_000)
    s.sql("INSERT INTO T VALUES (2, 'b')")
    monkeypatch.undo()
    found = read(s, "CS", rfc3339(start), token)
    assert [(k[2], k[3]) for k in keys(found)] == [(1, "OLD_AND_NEW_VALUES"), (2, "NEW_ROW")]
    stream = s.catalog.get_change_stream("DB", "PUBLIC", "CS")
    moment = s.catalog.change_stream_history(stream.uid)[-1].from_us
    late = micros(changes(found)[-1]["commit_timestamp"])
    assert late >= moment


def test_commits_racing_an_alter_fall_on_the_side_their_commit_is_on(watched):
    """A writer commits one key after another while the ALTER runs: every key comes
    once; one committed before the ALTER began is under the old definition, one whose
    commit began after it returned under the new one (those in between: either)."""
    s, token = watched
    start = now_us()
    altering, altered = threading.Event(), threading.Event()
    some_before, some_after = threading.Event(), threading.Event()
    sides: dict[int, str] = {}
    failed: list[BaseException] = []

    def write() -> None:
        key = 0
        try:
            while sum(side == "after" for side in sides.values()) < 3:
                key += 1
                begun_after = altered.is_set()
                flush_rows(s, "T", [{"ID": key, "V": "x"}])
                done_before = not altering.is_set()
                sides[key] = "before" if done_before else "after" if begun_after else "either"
                if key >= 3 and done_before:
                    some_before.set()
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)
        finally:
            some_before.set()
            some_after.set()

    writer = threading.Thread(target=write)
    writer.start()
    assert some_before.wait(TIMEOUT)
    altering.set()
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'NEW_ROW')")
    altered.set()
    assert some_after.wait(TIMEOUT)
    writer.join(TIMEOUT)
    assert not failed, failed
    found = read(s, "CS", rfc3339(start), token)
    check_progress(found)
    captured = [(k[2], k[3]) for k in keys(found)]
    assert sorted(key for key, _ in captured) == sorted(sides)  # each key once
    expected = {"before": {"OLD_AND_NEW_VALUES"}, "after": {"NEW_ROW"},
                "either": {"OLD_AND_NEW_VALUES", "NEW_ROW"}}  # fmt: skip
    assert all(capture in expected[sides[key]] for key, capture in captured), (captured, sides)
    # In commit order, the old definition's records all come before the new one's.
    order = [capture for _, capture in captured]
    assert order == sorted(order, key=lambda c: c == "NEW_ROW")


def test_a_stream_without_history_reads_under_its_current_definition(watched):
    """A catalog made before histories were kept: the stream's definition holds from its
    creation; an ALTER then keeps it for the changes before."""
    s, token = watched
    start = now_us()
    s.sql("INSERT INTO T VALUES (1, 'a')")
    with sqlite3.connect(s.warehouse / "catalog.sqlite") as db:
        db.execute("DELETE FROM change_stream_history")
    s.sql("ALTER CHANGE STREAM CS SET OPTIONS (value_capture_type = 'NEW_ROW')")
    s.sql("INSERT INTO T VALUES (2, 'b')")
    found = read(s, "CS", rfc3339(start), token)
    assert [(k[2], k[3]) for k in keys(found)] == [(1, "OLD_AND_NEW_VALUES"), (2, "NEW_ROW")]
