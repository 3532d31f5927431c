"""A dynamic table's sources checked before a refresh reads them.

Every refresh binds the definition's query again by name (its views too), so a name
that now names something else than the definition was checked against would make the
refresh read another table, or fail half-way through. Each source is therefore checked
by identity and by name, directly and through every view the query reads:

- a table: the one recorded (by id), still under the name it was read by, with the
  same columns. Dropped: ``SOURCE_DROPPED``; renamed away with nothing under its name:
  ``SOURCE_RENAMED``; another table (or a view) now under its name, whether the old one
  was dropped or renamed: ``SOURCE_REPLACED``; columns changed: ``SOURCE_CHANGED``.
- a view: still under its name and not replaced (its uid). Dropped: ``VIEW_DROPPED``;
  replaced, or a table now under its name: ``VIEW_REPLACED``.

A failed check fails the refresh before any Spark work, changing nothing, until the
source is back as it was (renamed back) or ``CREATE OR REPLACE DYNAMIC TABLE`` defines
the table again over what exists now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from catalog import DynamicSource, DynamicTableRecord, TableInfo, ViewRecord
from pipelines.dynamic_tables.refresh_change import PinnedSource, RefreshFailed

if TYPE_CHECKING:
    from pipelines.sql.context import StatementContext

__all__ = ["check_sources"]

_FIX = "; CREATE OR REPLACE DYNAMIC TABLE defines it again over what exists now"
#: In the name ``CREATE OR REPLACE TABLE`` gives the table it replaces while it makes
#: the new one (:mod:`pipelines.sql.ddl_queries`): that table is being replaced.
_REPLACED_ASIDE = "$REPLACED$"


def check_sources(session: StatementContext, dt: DynamicTableRecord) -> list[PinnedSource]:
    """The table sources as recorded, each still the table the definition was checked
    against and still under the name the query (or a view) reads it by, with its columns
    unchanged; views neither dropped nor replaced. Versions are pinned later (``to`` is
    -1 here).

    Raises:
        RefreshFailed: SOURCE_DROPPED, SOURCE_RENAMED, SOURCE_REPLACED, SOURCE_CHANGED,
            VIEW_DROPPED or VIEW_REPLACED, naming the source and the fix.
    """
    pinned: list[PinnedSource] = []
    for position, source in enumerate(dt.sources):
        if source.kind == "view":
            _check_view(session, source)
        else:
            info = _check_table(session, source)
            pinned.append(PinnedSource(position, info, source.version, -1))
    return pinned


def _check_table(session: StatementContext, source: DynamicSource) -> TableInfo:
    info = session.catalog.get_table_by_id(source.source_id)
    if info is not None and info.full_name == source.name:
        if orjson.dumps(info.schema.declarations()).decode() != source.marker:
            raise RefreshFailed(f"the columns of {info.full_name}, which the query reads, "
                                "changed" + _FIX, "SOURCE_CHANGED")  # fmt: skip
        return info
    what = f"table {source.name}, which the query reads,"
    now = _named(session, source.name)
    if info is None and now is None:
        raise RefreshFailed(f"{what} was dropped" + _FIX, "SOURCE_DROPPED")
    if info is None:
        raise RefreshFailed(f"{what} was replaced: {_describe(now)} now has its name" + _FIX,
                            "SOURCE_REPLACED")  # fmt: skip
    if now is not None or _REPLACED_ASIDE in info.name:
        held = f"{_describe(now)} now has its name" if now is not None else "it is being replaced"
        raise RefreshFailed(f"{what} was renamed to {info.full_name} and {held}" + _FIX,
                            "SOURCE_REPLACED")  # fmt: skip
    raise RefreshFailed(
        f"{what} was renamed to {info.full_name}, and the query reads it by its old name; "
        f"rename it back, or CREATE OR REPLACE DYNAMIC TABLE defines it again over what "
        "exists now", "SOURCE_RENAMED",
    )  # fmt: skip


def _check_view(session: StatementContext, source: DynamicSource) -> None:
    view = session.catalog.get_view(*_split(source.name))
    what = f"view {source.name}, which the query reads,"
    if view is None:
        table = session.find_table(*_split(source.name))
        if table is not None:
            raise RefreshFailed(f"{what} was dropped, and {_describe(table)} now has its name"
                                + _FIX, "VIEW_REPLACED")  # fmt: skip
        raise RefreshFailed(f"{what} was dropped" + _FIX, "VIEW_DROPPED")
    if view.uid != source.marker:
        raise RefreshFailed(f"{what} was replaced" + _FIX, "VIEW_REPLACED")


def _named(session: StatementContext, name: str) -> TableInfo | ViewRecord | None:
    """The table or view a recorded full name names now (None: nothing)."""
    parts = _split(name)
    return session.find_table(*parts) or session.catalog.get_view(*parts)


def _describe(found: TableInfo | ViewRecord | None) -> str:
    return "a view" if isinstance(found, ViewRecord) else "another table"


def _split(name: str) -> tuple[str, str, str]:
    from pipelines.sql.statements import split_name

    database, schema, table = split_name(name)
    return database, schema, table
