"""A change stream's history: which definition (tables and column lists, value capture
type, excluded mod types) a change is reported under.

As in Spanner, an ALTER applies to the changes committed from then on: a change keeps
the definition in force at its change stream timestamp (:mod:`.timeline`), so a re-read
of a range, or a read resumed from a heartbeat, returns the same records after an ALTER
as before it. The catalog keeps the definitions, each in force from a moment.

**The ALTER's moment.** An ALTER seals the tables watched before or after it (at least
one microsecond after every seal of them, as a seal always is) and takes the new
heartbeat + 1 as its moment, in the same catalog transaction that changes the
definition. A version that seal covers was committed before the ALTER and has a
timestamp at or before the heartbeat, so it keeps the old definition; a version
committed after it has a later timestamp (the seal's rule), so it takes the new one,
whatever the writers' clocks say. A heartbeat a read returned came from a seal of the
tables it watched, which the ALTER sealed again: a table the ALTER adds reports nothing
at or before a heartbeat already returned.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from catalog import AlterSeal, Catalog, ChangeStreamDefinition, ChangeStreamRecord, TableInfo
from pipelines.change_streams.timeline import sealing
from pipelines.errors import SqlError
from pipelines.transactions.commit import when_free

__all__ = ["ReadTables", "alter", "definition_at", "read_tables", "tables_of"]

#: How many times an ALTER is tried again when another ALTER of the stream came first.
_ATTEMPTS = 5


def tables_of(catalog: Catalog, definition: ChangeStreamDefinition) -> list[TableInfo]:
    """The tables a definition watches that exist (``FOR ALL``: every table, now)."""
    if definition.for_all:
        return catalog.list_tables()
    found = (catalog.get_table_by_id(table_id) for table_id in definition.table_ids)
    return [t for t in found if t is not None]


def definition_at(
    history: Sequence[ChangeStreamDefinition], moment: int
) -> ChangeStreamDefinition | None:
    """The definition in force at ``moment`` (µs): the last one from at or before it."""
    index = bisect.bisect_right([d.from_us for d in history], moment)
    return history[index - 1] if index else None


@dataclass(frozen=True, slots=True)
class ReadTables:
    """The tables a read from ``start`` needs: ``current`` ones (the newest definition's:
    the read seals them as it goes), ``past`` ones, watched by an earlier definition
    only, each with the last moment it was watched (the ALTER that left them sealed them
    up to it), and ``dropped`` ones, watched by a definition in force at or after
    ``start`` and dropped since, each with the moment of its drop (kept for as long as
    the streams that watched it keep records, see :func:`catalog.Catalog.drop_table`)."""

    current: list[TableInfo]
    past: list[tuple[TableInfo, int]]
    dropped: list[tuple[TableInfo, int]] = field(default_factory=list)


def read_tables(
    catalog: Catalog, history: Sequence[ChangeStreamDefinition], start: int
) -> ReadTables:
    """The tables of the definitions in force at or after ``start`` (see
    :class:`ReadTables`)."""
    current = tables_of(catalog, history[-1])
    known = {t.id for t in current}
    past: dict[int, tuple[TableInfo, int]] = {}
    for index, definition in enumerate(history[:-1]):
        until = history[index + 1].from_us - 1
        if until < start:
            continue
        for table in tables_of(catalog, definition):
            if table.id not in known:
                past[table.id] = (table, max(until, past.get(table.id, (table, until))[1]))
    in_force = [d for i, d in enumerate(history)
                if i + 1 == len(history) or history[i + 1].from_us > start]  # fmt: skip
    dropped = [
        (table, moment) for table, moment in catalog.list_dropped_tables()
        if moment >= start and any(d.watches(table.id) for d in in_force)
    ]  # fmt: skip
    return ReadTables(current, list(past.values()), dropped)


def _tables_around(
    catalog: Catalog, before: ChangeStreamDefinition, for_all: bool | None,
    table_ids: tuple[int, ...] | None,
) -> list[TableInfo]:  # fmt: skip
    """The tables watched before or after an ALTER (the ones whose records it changes)."""
    after = ChangeStreamDefinition(
        0, before.for_all if for_all is None else for_all,
        before.table_ids if table_ids is None else table_ids, before.value_capture_type,
    )  # fmt: skip
    if before.for_all or after.for_all:
        return catalog.list_tables()
    return tables_of(catalog, before) + [
        t for t in tables_of(catalog, after) if t.id not in before.table_ids
    ]


def alter(
    catalog: Catalog, stream: ChangeStreamRecord, *, for_all: bool | None = None,
    table_ids: tuple[int, ...] | None = None, value_capture_type: str | None = None,
    retention_s: int | None = None, column_lists: Sequence[tuple[int, Sequence[str]]] = (),
    exclusions: dict[str, bool] | None = None,
) -> bool:  # fmt: skip
    """Change a stream's definition from a moment after every version committed before
    (see the module docstring), in one catalog transaction; a retention change alone
    takes none. False if the stream is gone.

    Raises:
        SqlError: other ALTERs of the stream kept coming first.
    """
    defines = for_all is not None or value_capture_type is not None or bool(exclusions)
    if not defines:
        return catalog.alter_change_stream(stream.id, retention_s=retention_s)
    for _ in range(_ATTEMPTS):
        history = catalog.change_stream_history(stream.uid)
        if not history:
            return False  # dropped
        tables = _tables_around(catalog, history[-1], for_all, table_ids)

        def attempt(tables: list[TableInfo] = tables, last: ChangeStreamDefinition = history[-1]
                    ) -> bool:  # fmt: skip
            now, compute = sealing(tables)
            at_seal = AlterSeal(tuple(t.id for t in tables), compute, last, now)
            return catalog.alter_change_stream(
                stream.id, for_all=for_all, table_ids=table_ids,
                value_capture_type=value_capture_type, retention_s=retention_s,
                column_lists=column_lists if table_ids is not None else None,
                exclusions=exclusions, at_seal=at_seal,
            )  # fmt: skip

        try:  # every table sealed: after a commit of several tables that holds one ends
            return when_free(catalog, attempt, [t.id for t in tables], decided_only=True)
        except ValueError:
            continue  # another ALTER came first: choose the tables to seal again
    raise SqlError(f"change stream {stream.full_name} is being altered by other sessions; "
                   "try the statement again", "SQL_COMPILATION_ERROR")  # fmt: skip
