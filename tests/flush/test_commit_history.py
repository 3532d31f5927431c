"""``flush.tables.commit_history``: the right version on every commit, even when commits
land while the history is read (delta-rs 1.6 labels them from the handle's version)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from flush.tables import commit_history


def _append(uri: str, number: int) -> None:
    write_deltalake(
        uri,
        pa.table({"a": [number]}),
        mode="append",
        commit_properties=CommitProperties(custom_metadata={"n": str(number)}),
    )


@pytest.fixture
def table(tmp_path):
    uri = str(tmp_path / "t")
    for number in range(4):  # versions 0..3, commit n holds metadata n
        _append(uri, number)
    return uri


def test_versions_match_their_commits(table):
    loaded, entries = commit_history(table)
    assert loaded.version() == 3
    assert [(e["version"], e["n"]) for e in entries] == [(3, "3"), (2, "2"), (1, "1"), (0, "0")]
    _, newer = commit_history(table, since=1)
    assert [e["version"] for e in newer] == [3, 2]
    assert commit_history(table, since=3)[1] == []


def test_a_commit_landing_during_the_read_does_not_shift_the_labels(table, monkeypatch):
    original = DeltaTable.history
    numbers = iter(range(4, 100))
    disturb = [1]  # how many of the next reads see a commit land just before listing

    def history_with_a_commit_landing_first(self, limit=None):
        if disturb[0] > 0:
            disturb[0] -= 1
            _append(table, next(numbers))
        return original(self, limit)

    monkeypatch.setattr(DeltaTable, "history", history_with_a_commit_landing_first)
    # What delta-rs itself answers in that case: the newest commit labelled 3.
    newest = DeltaTable(table).history(1)[0]
    assert (newest["version"], newest["n"]) == (3, "4")

    disturb[0] = 2  # the first two attempts are disturbed; the third reads a still log
    loaded, entries = commit_history(table, since=2)
    assert loaded.version() == 6
    assert [(e["version"], e["n"]) for e in entries] == [
        (6, "6"), (5, "5"), (4, "4"), (3, "3"),
    ]  # fmt: skip
