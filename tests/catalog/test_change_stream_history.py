"""A change stream's history in the catalog: CREATE starts it, an ALTER that changes the
definition appends one entry from its seal's moment (the seal and the entry in one
transaction), an ALTER raced by another is refused whole, a retention change appends
nothing, old entries are pruned, dropping the stream forgets it, and a stream made
before histories were kept has its current definition from its creation."""

from __future__ import annotations

import pytest

from catalog import AlterSeal, ChangeStreamDefinition, Seal
from ingest_sdk import TableSchema

SCHEMA = TableSchema.parse({"ID": "NUMBER", "V": "VARCHAR"})
DAY_US = 86_400 * 1_000_000


def _stream(catalog, tmp_path, created_us=1_000):
    t = catalog.create_table("DB", "S", "T", str(tmp_path / "t"), SCHEMA)
    made = catalog.create_change_stream(
        "DB", "S", "CS", for_all=False, table_ids=(t.id,), value_capture_type="NEW_ROW",
        retention_s=60, created_us=created_us,
    )  # fmt: skip
    return t, made


def _at(table_id, version, heartbeat, expected, floor=0):
    """An AlterSeal that seals one table at ``(version, heartbeat)``."""
    return AlterSeal((table_id,), lambda latest: {table_id: Seal(version, heartbeat)},
                     expected, floor)  # fmt: skip


def test_an_alter_appends_its_definition_from_just_after_its_seal(catalog, tmp_path):
    t, made = _stream(catalog, tmp_path)
    (first,) = catalog.change_stream_history(made.uid)
    assert first == ChangeStreamDefinition(1_000, False, (t.id,), "NEW_ROW")
    assert catalog.alter_change_stream(made.id, value_capture_type="NEW_VALUES",
                                       exclusions={"exclude_delete": True},
                                       at_seal=_at(t.id, 4, 5_000, first))  # fmt: skip
    # The seal and the entry landed together; the entry starts 1 µs after the heartbeat.
    assert catalog.latest_seals([t.id]) == {t.id: Seal(4, 5_000)}
    assert catalog.change_stream_history(made.uid) == [
        first,
        ChangeStreamDefinition(5_001, False, (t.id,), "NEW_VALUES", (),
                               (("exclude_delete", True),)),
    ]  # fmt: skip
    # A retention change alone appends nothing.
    assert catalog.alter_change_stream(made.id, retention_s=120)
    assert len(catalog.change_stream_history(made.uid)) == 2


def test_an_alter_raced_by_another_changes_nothing(catalog, tmp_path):
    t, made = _stream(catalog, tmp_path)
    (first,) = catalog.change_stream_history(made.uid)
    assert catalog.alter_change_stream(made.id, for_all=False, table_ids=(),
                                       at_seal=_at(t.id, 1, 2_000, first))  # fmt: skip
    with pytest.raises(ValueError, match="altered meanwhile"):
        catalog.alter_change_stream(made.id, value_capture_type="NEW_VALUES",
                                    at_seal=_at(t.id, 2, 3_000, first))  # fmt: skip
    assert catalog.get_change_stream("DB", "S", "CS").value_capture_type == "NEW_ROW"
    assert catalog.latest_seals([t.id]) == {t.id: Seal(1, 2_000)}
    assert [d.from_us for d in catalog.change_stream_history(made.uid)] == [1_000, 2_001]


def test_entries_superseded_long_ago_are_pruned_and_dropping_forgets_them(catalog, tmp_path):
    t, made = _stream(catalog, tmp_path)
    moments = [1_000, 10 * DAY_US, 20 * DAY_US, 60 * DAY_US]
    for index, heartbeat in enumerate(moments[1:]):
        last = catalog.change_stream_history(made.uid)[-1]
        capture = ("NEW_VALUES", "NEW_ROW")[index % 2]
        catalog.alter_change_stream(made.id, value_capture_type=capture,
                                    at_seal=_at(t.id, index + 1, heartbeat, last))  # fmt: skip
    # At 60 days, the entry in force 31 days before (from 20 days) and the newer stay.
    assert [d.from_us for d in catalog.change_stream_history(made.uid)] == [
        20 * DAY_US + 1, 60 * DAY_US + 1]  # fmt: skip
    assert catalog.drop_change_stream(made.id)
    assert catalog.change_stream_history(made.uid) == []


def test_a_stream_made_before_histories_has_its_definition_since_its_creation(catalog, tmp_path):
    t, made = _stream(catalog, tmp_path)
    catalog._db.execute("DELETE FROM change_stream_history")  # as an older version left it
    (legacy,) = catalog.change_stream_history(made.uid)
    assert legacy == ChangeStreamDefinition(1_000, False, (t.id,), "NEW_ROW")
    assert catalog.alter_change_stream(made.id, value_capture_type="NEW_VALUES",
                                       at_seal=_at(t.id, 1, 7_000, legacy))  # fmt: skip
    assert [(d.from_us, d.value_capture_type) for d in catalog.change_stream_history(made.uid)] == [
        (1_000, "NEW_ROW"), (7_001, "NEW_VALUES")]  # fmt: skip
