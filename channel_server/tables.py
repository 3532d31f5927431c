"""Table definitions as the service sees them: created, looked up (read from the
catalog, and cached by the spelling a client used for the ingest path alone), clustered
and forgotten when dropped.

The live side of a table (its buffer, channels and flusher) is :mod:`channel_server.channels`;
dropping a table takes both, so :class:`channel_server.service.IngestService` does it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from catalog import Catalog, DynamicTableRecord, TableInfo, did_you_mean
from catalog import TableBusyError as CatalogTableBusy
from channel_server.config import ServerConfig
from channel_server.metrics import Metrics
from flush import create_catalog_table
from ingest_sdk import TableSchema
from ingest_sdk.errors import (
    InvalidRequestError,
    ServiceError,
    TableAlreadyExistsError,
    TableBusyError,
    TableNotFoundError,
)
from ingest_sdk.schema import split_table_name
from pipelines.transactions.commit import busy_message

__all__ = ["MAX_REMEMBERED", "DynamicTableReadOnlyError", "Tables"]

log = logging.getLogger(__name__)
#: The most spellings of names remembered (cached definitions, dropped tables): names are
#: client-chosen, so the sets are bounded; forgetting only costs a catalog read or softens
#: a later message.
MAX_REMEMBERED = 10_000
#: A create with if_not_exists that loses a race to another creator reads the winner's
#: table; if that one is dropped again before the read, it tries again, this many times.
_CREATE_ATTEMPTS = 3


class DynamicTableReadOnlyError(ServiceError):
    """A channel open or a table drop named a dynamic table (409): only its refreshes
    write it, and only ``DROP DYNAMIC TABLE`` drops it, as in SQL (``check_writable`` of
    :mod:`pipelines.sql.binding` answers the same code). Nothing was changed.

    The SDK has no class for this code yet (it belongs in :mod:`ingest_sdk.errors`'
    ``ERRORS_BY_CODE``); until it does, the SDK raises the 4xx fallback,
    :class:`InvalidRequestError`, with this message.
    """

    status, code = 409, "DYNAMIC_TABLE_READ_ONLY"


class Tables:
    """The tables of one warehouse through this service's eyes."""

    def __init__(self, config: ServerConfig, catalog: Catalog, metrics: Metrics) -> None:
        self.config = config
        self.catalog = catalog
        self.metrics = metrics
        # Table definitions by the spelling a client used, for the ingest path alone
        # (:meth:`cached`): every batch looks its table up. Another service or SQL may drop,
        # replace or change a table behind this one, so every other lookup reads the
        # catalog (:meth:`describe`), and refreshes the entry.
        self._definitions: dict[str, TableInfo] = {}
        # What this process dropped, or found dropped by others under its channels, so a
        # stale handle hears "dropped" only when it was.
        self._dropped: set[tuple[str, str, str]] = set()

    def create(
        self, name: str, columns: dict[str, str], if_not_exists: bool = False
    ) -> tuple[TableInfo, bool]:
        """Create a table (and its database and schema). Returns the table and whether it
        was created.

        Nothing is ever deleted here (:func:`flush.create_catalog_table`) but the folder
        this create made for a table another service named first.

        Raises:
            TableAlreadyExistsError: the name is taken and ``if_not_exists`` is false.
        """
        database, schema_name, table = split_table_name(name)
        schema = TableSchema.parse(columns)
        for _ in range(_CREATE_ATTEMPTS):
            try:
                info, created = create_catalog_table(self.catalog, self.config.warehouse,
                                                     database, schema_name, table, schema,
                                                     if_not_exists)  # fmt: skip
            except TableAlreadyExistsError:
                if not if_not_exists:
                    raise
                # Another service (or a SQL session) created it between our look and our
                # insert; our folder is gone already (create_catalog_table removes it).
                try:
                    return self.catalog.get_table(database, schema_name, table), False
                except TableNotFoundError:
                    continue  # and dropped it again at once: try once more
            break
        else:
            raise TableAlreadyExistsError(
                f"table {database}.{schema_name}.{table} was created and dropped by others "
                f"{_CREATE_ATTEMPTS} times while this create ran; try again"
            )
        if not created:
            return info, False
        log.info("created table %s", info.full_name, extra={"table": info.full_name,
                 "location": info.uri})  # fmt: skip
        return info, True

    def describe(self, name: str) -> TableInfo:
        """The table ``name`` names now, as the catalog holds it (one read): another
        service sharing the catalog, or SQL, may have dropped, replaced or changed it since
        this service last looked.

        Raises:
            TableNotFoundError: no such table (with a "did you mean" when one is near).
        """
        parts = split_table_name(name)
        try:
            info = self.catalog.get_table(*parts)
        except TableNotFoundError as exc:
            self._definitions.pop(name, None)
            hint = did_you_mean(self.catalog, *parts, ["table"])
            if not hint:
                raise
            text = str(exc).replace(" does not exist", f" does not exist{hint}", 1)
            raise TableNotFoundError(text) from exc
        cached = self._definitions.get(name)
        if cached is not None and cached.id != info.id:
            # Replaced behind this service: stale in every spelling, and a handle opened on
            # the old table hears that its table was dropped.
            self._definitions.clear()
            self._remember_dropped(info)
        elif len(self._definitions) > MAX_REMEMBERED:
            self._definitions.clear()
        self._definitions[name] = info
        return info

    def cached(self, name: str) -> TableInfo:
        """The table ``name`` named when this service last looked (:meth:`describe` if it
        never did), for the ingest path: an insert, a wait or a close of a channel handle
        reads no catalog. A handle names the table its channel was opened on, whose live
        state is kept by id; if that table was dropped since, the next flush finds out
        (:class:`channel_server.flusher.TableFlusher`), and then this service forgets it."""
        info = self._definitions.get(name)
        return info if info is not None else self.describe(name)

    def remembered(self, name: str) -> TableInfo | None:
        """The definition :meth:`describe` remembers for this spelling, without reading the
        catalog (None: it would read it)."""
        return self._definitions.get(name)

    def all(self) -> list[TableInfo]:
        return self.catalog.list_tables()

    def was_dropped(self, name: str) -> bool:
        """Whether this process dropped a table of that name (a spelling of it)."""
        return split_table_name(name) in self._dropped

    def dropped_here(self, info: TableInfo) -> bool:
        """Whether this process dropped a table of ``info``'s name before (it was created
        again since)."""
        return (info.database, info.schema_name, info.name) in self._dropped

    async def to_write(self, name: str) -> tuple[TableInfo, DynamicTableRecord | None]:
        """The table ``name`` names now, for a call that writes it, with its dynamic-table
        definition (None: not a dynamic table).

        Resolved in the catalog (:meth:`describe`). A table is dynamic from its creation
        on (ids are never reused), so a check by id holds for good. The definition is read
        in a thread: the catalog's read of it is a write transaction, which waits for other
        writers.

        Raises:
            TableNotFoundError: no such table.
            CatalogUnavailableError: the catalog cannot be reached (what was remembered of
                the table stays).
        """
        info = await asyncio.to_thread(self.describe, name)
        return info, await asyncio.to_thread(self.catalog.get_dynamic_table, info.id)

    def base_sources(self, dynamic: DynamicTableRecord) -> str:
        """The tables that are not dynamic among those a dynamic table's query read when it
        was defined, as ``" (A, B)"``: rows go there, and a refresh brings them over."""
        names = [
            source.name
            for source in dynamic.sources
            if source.kind == "table" and self.catalog.get_dynamic_table(source.source_id) is None
        ]
        return f" ({', '.join(names)})" if names else ""

    def check_droppable(self, info: TableInfo, dynamic: DynamicTableRecord | None) -> None:
        """Refuse a drop through the table API of a dynamic table or of a table a pending
        pipeline commit writes, before anything is stopped (the catalog checks again).

        Raises:
            DynamicTableReadOnlyError: a dynamic table: SQL's ``DROP DYNAMIC TABLE`` drops
                it, as SQL's ``DROP TABLE`` refuses it too.
            TableBusyError: a pending pipeline commit writes the table.
        """
        if dynamic is not None:
            raise DynamicTableReadOnlyError(
                f"{info.full_name} is a dynamic table: DELETE /v1/tables refuses it, as SQL's "
                "DROP TABLE does, and nothing was changed. Drop it with the statement DROP "
                f"DYNAMIC TABLE {info.full_name} through POST /v1/sql, which also forgets its "
                "definition and refresh history"
            )
        if holders := self.catalog.commits_holding([info.id]):
            busy = CatalogTableBusy([info.id], holders)
            raise TableBusyError(busy_message(self.catalog, busy))

    def forget(self, info: TableInfo) -> None:
        """Drop a table from the catalog (its live state already stopped) and from what
        this service remembers of it.

        Raises:
            TableBusyError: a pending pipeline commit reserved the table meanwhile.
        """
        try:
            self.catalog.drop_table(info.id)
        except CatalogTableBusy as exc:
            raise TableBusyError(busy_message(self.catalog, exc)) from None
        self.forget_dropped(info)
        log.info("dropped table %s", info.full_name, extra={"table": info.full_name})

    def forget_dropped(self, info: TableInfo) -> None:
        """Forget a table the catalog no longer holds (dropped by this service, another
        one, or SQL), and remember its name as dropped."""
        self._definitions.clear()
        self._remember_dropped(info)
        self.metrics.forget_table(info.full_name)

    def _remember_dropped(self, info: TableInfo) -> None:
        if len(self._dropped) > MAX_REMEMBERED:
            self._dropped.clear()
        self._dropped.add((info.database, info.schema_name, info.name))

    def set_clustering(self, table_name: str, columns: list[str]) -> TableInfo:
        """Columns compaction sorts by (empty: ingestion order); must be table columns."""
        info = self.describe(table_name)
        resolved = []
        for name in columns:
            column = info.schema.find(name) if isinstance(name, str) else None
            if column is None:
                raise InvalidRequestError(
                    f"clustering column {name!r} is not a column of {info.full_name} "
                    f"(columns: {', '.join(c.name for c in info.schema)})"
                )
            resolved.append(column.name)
        self.catalog.set_clustering(info.id, tuple(resolved))
        return self.describe(table_name)

    def migrations(self, table_name: str) -> list[dict[str, Any]]:
        return self.catalog.list_migrations(self.describe(table_name).id)
