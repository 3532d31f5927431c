"""The catalog boundary: what every layer above needs, one contract suite for all
implementations (``tests/catalog/test_catalog_behaviors.py``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from catalog.records import (
    AlterSeal,
    ChangeStreamDefinition,
    ChangeStreamRecord,
    ChannelRecord,
    CommitIntent,
    CommitRecord,
    DatabaseRecord,
    DynamicSource,
    DynamicTableRecord,
    PartitionRecord,
    PendingCommit,
    RefreshRecord,
    SchemaRecord,
    Seal,
    StreamClaim,
    StreamRecord,
    TableInfo,
    ViewRecord,
)
from ingest_sdk import TableSchema
from ingest_sdk.errors import InvalidRequestError

__all__ = [
    "Catalog",
    "CommitGoneError",
    "IntentConflict",
    "ObjectAlreadyExistsError",
    "ObjectNotEmptyError",
    "RefreshClaimConflict",
    "RowIdsExhaustedError",
    "StreamClaimConflict",
    "TableBusyError",
    "UnstorableValueError",
]


class ObjectAlreadyExistsError(ValueError):
    """A stream (or other pipeline object) of that name already exists."""


class ObjectNotEmptyError(ValueError):
    """A database or schema to drop still holds tables, streams, views or change streams
    (and CASCADE was not asked for); nothing was dropped.

    Attributes:
        tables: full names of the tables it holds.
        streams: full names of the streams it holds.
        views: full names of the views it holds.
        change_streams: full names of the change streams it holds.
    """

    def __init__(
        self, what: str, tables: list[str], streams: list[str], views: Sequence[str] = (),
        change_streams: Sequence[str] = (),
    ) -> None:  # fmt: skip
        held = [f"table(s) {', '.join(tables)}" if tables else "",
                f"stream(s) {', '.join(streams)}" if streams else "",
                f"view(s) {', '.join(views)}" if views else "",
                f"change stream(s) {', '.join(change_streams)}" if change_streams
                else ""]  # fmt: skip
        super().__init__(f"{what}: it still holds {' and '.join(h for h in held if h)}")
        self.tables = tables
        self.streams = streams
        self.views = list(views)
        self.change_streams = list(change_streams)


class UnstorableValueError(InvalidRequestError, ValueError):
    """A value no catalog may store: text holding a NUL character (U+0000), which
    PostgreSQL's text cannot hold, or an integer past 64 bits, which SQLite's cannot (see
    :mod:`catalog.sql_values`); nothing was written.

    An :class:`ingest_sdk.errors.InvalidRequestError`: the service answers it 400, a SQL
    session raises it as a ``SqlError``, each with the message naming the value.
    """


class RowIdsExhaustedError(OverflowError):
    """A table's row-id sequence would pass 2**63 - 1, the largest id a catalog stores;
    nothing was reserved (SQLite would otherwise go on in floating point)."""


class StreamClaimConflict(RuntimeError):
    """A consuming transaction lost the race for a stream (another one moved or holds it).

    Attributes:
        stream_ids: the streams it could not claim.
    """

    def __init__(self, stream_ids: list[int]) -> None:
        super().__init__(f"stream(s) {stream_ids} moved or are being consumed")
        self.stream_ids = stream_ids


class RefreshClaimConflict(RuntimeError):
    """A refresh of the dynamic table was applied or claimed by another process since
    this one read its state (or the table was dropped or replaced): this refresh wrote
    nothing."""

    def __init__(self, table_id: int) -> None:
        super().__init__(f"dynamic table {table_id} was refreshed by another process meanwhile")
        self.table_id = table_id


class IntentConflict(RuntimeError):
    """Another pending commit holds a conflicting write intent on a table (see
    :meth:`Catalog.reserve_commit`); nothing was recorded.

    Attributes:
        holders: ids of the pending commits in the way.
    """

    def __init__(self, holders: list[int]) -> None:
        super().__init__(f"pending commit(s) {holders} write the same rows' tables")
        self.holders = holders


class TablesGoneError(RuntimeError):
    """Tables a commit names were dropped after its transaction read them (see
    :meth:`Catalog.reserve_commit`); nothing was recorded.

    Attributes:
        table_ids: the tables no longer in the catalog.
    """

    def __init__(self, table_ids: list[int]) -> None:
        super().__init__(f"table(s) {table_ids} were dropped")
        self.table_ids = table_ids


class CommitGoneError(RuntimeError):
    """A pending commit is no longer recorded (abandoned by recovery, or finished)."""


class TableBusyError(RuntimeError):
    """A table named by a pending pipeline commit cannot be dropped or replaced until
    that commit ends (its roll-forward must find the table).

    Attributes:
        table_ids: the busy tables; commit_ids: the commits naming them.
    """

    def __init__(self, table_ids: list[int], commit_ids: list[int]) -> None:
        super().__init__(f"table(s) {table_ids} are written by pending commit(s) {commit_ids}")
        self.table_ids = table_ids
        self.commit_ids = commit_ids


class Catalog(ABC):
    """What the service and the pipeline layer need from a catalog; SQLite is the default.

    The catalog is an index of the Delta logs plus what only it holds: databases and
    schemas, table definitions, channel generations, row-id reservations, streams and
    pending pipeline commits.
    """

    # Databases and schemas. One exists once created, or while a schema, table or stream
    # names it (tables could be made in any schema before these were objects, and still
    # can be: creating a table, stream or schema creates its schema and database).
    @abstractmethod
    def create_database(self, name: str) -> tuple[DatabaseRecord, bool]:
        """Create a database; returns it and whether it was created (False: it existed)."""

    @abstractmethod
    def create_schema(self, database: str, name: str) -> tuple[SchemaRecord, bool]:
        """Create a schema (and its database); returns it and whether it was created."""

    @abstractmethod
    def get_database(self, name: str) -> DatabaseRecord | None: ...

    @abstractmethod
    def get_schema(self, database: str, name: str) -> SchemaRecord | None: ...

    @abstractmethod
    def list_databases(self) -> list[DatabaseRecord]:
        """Every database, created or named by a schema, table or stream, by name."""

    @abstractmethod
    def list_schemas(self, database: str | None = None) -> list[SchemaRecord]:
        """The schemas of ``database`` (default: of every database), by database and name."""

    @abstractmethod
    def drop_database(self, name: str, cascade: bool = False) -> list[TableInfo] | None:
        """Drop a database and its schemas, atomically; with ``cascade`` also the tables
        and streams in it (a table's channels and compaction history go with it; streams
        elsewhere on its tables stay, stale). Returns the tables dropped, whose folders
        the caller deletes; None if no such database exists.

        Raises:
            ObjectNotEmptyError: it holds tables or streams and ``cascade`` is false;
                nothing was dropped.
        """

    @abstractmethod
    def drop_schema(
        self, database: str, name: str, cascade: bool = False
    ) -> list[TableInfo] | None:
        """Drop a schema as :meth:`drop_database` drops a database (its database stays)."""

    # Tables
    @abstractmethod
    def create_table(
        self, database: str, schema_name: str, name: str, uri: str, schema: TableSchema,
        properties: dict[str, Any] | None = None,
    ) -> TableInfo:  # fmt: skip
        """Record a new table (its database and schema too), with ``properties`` over the
        defaults (e.g. its declared ``primary_key``), in one write."""

    @abstractmethod
    def get_table(self, database: str, schema_name: str, name: str) -> TableInfo: ...

    @abstractmethod
    def get_table_by_id(self, table_id: int) -> TableInfo | None: ...

    @abstractmethod
    def list_tables(self) -> list[TableInfo]: ...

    @abstractmethod
    def drop_table(self, table_id: int, name: str | None = None) -> None:
        """Drop a table; it is kept among the dropped tables (as ``name``, if given) as
        long as the change streams that watch it keep their records, or until
        :meth:`expired_dropped_tables` lists it at once (none watches it)."""

    @abstractmethod
    def list_dropped_tables(self) -> list[tuple[TableInfo, int]]:
        """The dropped tables still kept, each with the moment (µs) it was dropped."""

    @abstractmethod
    def expired_dropped_tables(self, now_us: int) -> list[TableInfo]:
        """The dropped tables kept until ``now_us`` or earlier: their folders may go."""

    @abstractmethod
    def forget_dropped_table(self, table_id: int) -> None:
        """Forget a dropped table whose folder is gone (and its change stream seals)."""

    @abstractmethod
    def rename_table(self, table_id: int, database: str, schema_name: str, name: str) -> None:
        """Give a table a new name; its id, and so its streams, stay."""

    @abstractmethod
    def set_table_properties(self, table_id: int, properties: dict[str, Any]) -> TableInfo:
        """Merge ``properties`` (change tracking, retention days) into the table's."""

    @abstractmethod
    def reserve_row_ids(self, table_id: int, count: int) -> int:
        """Reserve ``count`` row ids of the table's sequence; returns the first.

        Atomic for every process sharing the catalog, so ids stay unique per table
        whoever inserts (flushes, SQL sessions). Unused reservations leave gaps.

        Raises:
            TableNotFoundError: no table has the id.
            RowIdsExhaustedError: the sequence would pass 2**63 - 1.
        """

    # Channels
    @abstractmethod
    def open_channel(
        self, table_id: int, name: str, min_generation: int = 1, server: str = ""
    ) -> ChannelRecord:
        """Open or reopen a channel: its generation becomes one more than before, and at
        least ``min_generation`` (the service passes one more than the generation the
        table's Delta log holds, since a dropped or retired channel's row is gone); the
        channel's server becomes ``server`` (the one opening it)."""

    @abstractmethod
    def get_channel(self, table_id: int, name: str) -> ChannelRecord | None: ...

    @abstractmethod
    def list_channels(self, table_id: int | None = None) -> list[ChannelRecord]: ...

    @abstractmethod
    def drop_channel(self, table_id: int, name: str) -> bool: ...

    @abstractmethod
    def apply_commit(self, table_id: int, record: CommitRecord) -> bool: ...

    @abstractmethod
    def remove_inactive_channels(self, before: float, keep: set[tuple[int, str]]) -> int: ...

    # Leases
    @abstractmethod
    def take_lease(self, name: str, holder: str, seconds: float, now: float | None = None) -> bool:
        """Take or renew the lease ``name`` for ``seconds`` from ``now`` (default the
        clock): True if ``holder`` holds it now, False if another holder's has not
        expired. Work that one service of several must do alone (partition balancing,
        channel retention) runs only while its service holds the lease."""

    @abstractmethod
    def release_lease(self, name: str, holder: str) -> None:
        """Give a lease up (another service may take it at once); nothing if not held."""

    @abstractmethod
    def lease_holder(self, name: str) -> tuple[str, float] | None:
        """Who holds the lease and until when (epoch seconds); None: no one ever did."""

    # Compaction
    @abstractmethod
    def set_clustering(self, table_id: int, columns: tuple[str, ...]) -> None: ...

    @abstractmethod
    def record_migration(self, table_id: int, run: dict[str, Any]) -> int: ...

    @abstractmethod
    def list_migrations(self, table_id: int) -> list[dict[str, Any]]: ...

    # Streams
    @abstractmethod
    def create_stream(
        self,
        database: str,
        schema_name: str,
        name: str,
        table_id: int,
        mode: str,
        offset_version: int,
        comment: str = "",
        replace: bool = False,
        view: tuple[int, Sequence[str], Mapping[int, int]] | None = None,
    ) -> StreamRecord:
        """Create a stream (``replace``: in place of one of that name, with a new id).
        A stream on a view passes ``view``: the view's id, the uids of the views its body
        expands, and the offset version of each base table (by table id).

        Raises:
            ObjectAlreadyExistsError: the name is taken and ``replace`` is false.
        """

    @abstractmethod
    def get_stream(self, database: str, schema_name: str, name: str) -> StreamRecord | None: ...

    @abstractmethod
    def get_stream_by_id(self, stream_id: int) -> StreamRecord | None: ...

    @abstractmethod
    def list_streams(self, table_id: int | None = None) -> list[StreamRecord]: ...

    @abstractmethod
    def drop_stream(self, stream_id: int) -> bool: ...

    # Views
    @abstractmethod
    def create_view(
        self,
        database: str,
        schema_name: str,
        name: str,
        query: str,
        defaults: tuple[str, str],
        comment: str = "",
        replace: bool = False,
    ) -> ViewRecord:
        """Record a view (``defaults``: the database and schema its unqualified names
        mean); ``replace`` replaces a view of that name.

        Raises:
            ObjectAlreadyExistsError: a view (without ``replace``), table or stream has
                the name; nothing changed.
        """

    @abstractmethod
    def get_view(self, database: str, schema_name: str, name: str) -> ViewRecord | None: ...

    def get_view_by_id(self, view_id: int) -> ViewRecord | None:
        """The view of that id (ids are never reused: a replaced view has a new one)."""
        return next((v for v in self.list_views() if v.id == view_id), None)

    @abstractmethod
    def list_views(self) -> list[ViewRecord]: ...

    @abstractmethod
    def drop_view(self, view_id: int) -> bool: ...

    # Change streams (their own namespace per schema)
    @abstractmethod
    def create_change_stream(
        self, database: str, schema_name: str, name: str, *, for_all: bool,
        table_ids: tuple[int, ...], value_capture_type: str, retention_s: int,
        created_us: int, replace: bool = False, partitions: int = 1,
        column_lists: Sequence[tuple[int, Sequence[str]]] = (),
        exclusions: Mapping[str, bool] | None = None,
    ) -> ChangeStreamRecord:  # fmt: skip
        """Record a change stream (replacing one of that name if ``replace``) and its first
        ``partitions`` partitions (equal key ranges, starting at ``created_us``);
        ``column_lists``: the listed tables' watched columns, ``exclusions``: the
        ``exclude_*`` options given (see :class:`ChangeStreamRecord`).

        Raises:
            ObjectAlreadyExistsError: the name is taken and ``replace`` is false.
        """

    @abstractmethod
    def get_change_stream(
        self, database: str, schema_name: str, name: str
    ) -> ChangeStreamRecord | None: ...

    @abstractmethod
    def list_change_streams(self) -> list[ChangeStreamRecord]: ...

    @abstractmethod
    def alter_change_stream(
        self, stream_id: int, *, for_all: bool | None = None,
        table_ids: tuple[int, ...] | None = None, value_capture_type: str | None = None,
        retention_s: int | None = None,
        column_lists: Sequence[tuple[int, Sequence[str]]] | None = None,
        exclusions: Mapping[str, bool] | None = None, at_seal: AlterSeal | None = None,
    ) -> bool:  # fmt: skip
        """Change what the stream watches (``table_ids`` with their ``column_lists``,
        replaced together) or its options (``exclusions`` merged into those given
        before), in one transaction; False if it is gone. With ``at_seal``, the new
        definition joins the stream's history at the seal's moment (:class:`AlterSeal`).

        Raises:
            ValueError: the stream was altered since ``at_seal.expected`` was read.
        """

    @abstractmethod
    def change_stream_history(self, stream_uid: str) -> list[ChangeStreamDefinition]:
        """The stream's definitions, oldest first, each in force from its ``from_us`` to
        the next one's (a stream made before histories were kept: its current one, from
        its creation)."""

    @abstractmethod
    def drop_change_stream(self, stream_id: int) -> bool: ...

    @abstractmethod
    def list_partitions(self, stream_uid: str) -> list[PartitionRecord]:
        """Every partition a change stream has had (its lineage), oldest first."""

    @abstractmethod
    def latest_seals(self, table_ids: Iterable[int]) -> dict[int, Seal]:
        """The newest seal of each table (tables never sealed are left out)."""

    @abstractmethod
    def seals_between(self, table_id: int, after: int, to: int) -> list[Seal]:
        """The seals of versions in ``[after, to]``, the last one before ``after`` and the
        first one at or after ``to``, oldest first."""

    @abstractmethod
    def seal_tables(
        self, table_ids: Iterable[int], compute: Callable[[dict[int, Seal]], dict[int, Seal]],
        stream_uid: str | None = None,
        repartition: Callable[
            [int, list[PartitionRecord]], tuple[Sequence[str], Sequence[PartitionRecord]]
        ] | None = None,
        floor_us: int = 0,
    ) -> tuple[dict[int, Seal], list[PartitionRecord]]:  # fmt: skip
        """Seal tables (and repartition a change stream at the new heartbeat) in one
        write transaction; see :meth:`catalog.sqlite.SqliteCatalog.seal_tables`."""

    # Pipeline commits (the consumer commit protocol, see pipelines' commit)
    @abstractmethod
    def catalog_id(self) -> str:
        """A random id made when the catalog was created; a restored backup keeps it."""

    @abstractmethod
    def reserve_commit(
        self, owner: str, plan: dict[str, Any], intents: Sequence[CommitIntent]
    ) -> PendingCommit:
        """Record a commit in state ``preparing`` holding write intents on its tables.

        Raises:
            IntentConflict: another pending commit holds a conflicting intent (two
                ``rows`` intents on one table); nothing was recorded.
            TablesGoneError: a table of ``intents`` is no longer in the catalog.
        """

    @abstractmethod
    def decide_commit(self, commit_id: int, claims: Sequence[StreamClaim]) -> PendingCommit:
        """Claim the streams and mark the commit ``decided``, atomically.

        Raises:
            StreamClaimConflict: a stream's offset is no longer ``expected`` or another
                pending commit holds it; nothing changed (the caller abandons).
            CommitGoneError: the commit is no longer recorded.
        """

    def begin_commit(
        self,
        owner: str,
        plan: dict[str, Any],
        claims: Sequence[StreamClaim],
        intents: Sequence[CommitIntent] = (),
    ) -> PendingCommit:
        """:meth:`reserve_commit` then :meth:`decide_commit`; nothing recorded on failure."""
        pending = self.reserve_commit(owner, plan, intents)
        try:
            return self.decide_commit(pending.id, claims)
        except BaseException:
            self.abandon_commit(pending.id)
            raise

    @abstractmethod
    def finish_commit(
        self, commit_id: int, versions: Mapping[int, int] | None = None, floor_us: int = 0
    ) -> None:
        """Move the claimed streams to their new offsets and forget the commit and its
        intents, atomically; a refresh's commit (``versions``: each table's new version)
        also records the refresh, and a commit of several tables seals them at one change
        stream timestamp, at least ``floor_us`` (the caller's clock)."""

    @abstractmethod
    def abandon_commit(self, commit_id: int) -> None:
        """Release the claims and intents of a commit that wrote nothing, and forget it."""

    # Dynamic tables (their rows are a table's; see DynamicTableRecord)
    @abstractmethod
    def create_dynamic_table(
        self,
        names: tuple[str, str, str],
        uri: str,
        schema: TableSchema,
        definition: Mapping[str, Any],
        sources: Sequence[DynamicSource],
    ) -> tuple[TableInfo, DynamicTableRecord]:
        """Record a new dynamic table, INITIALIZING, with its table row and sources.

        Raises:
            TableAlreadyExistsError: a table has the name; nothing was recorded.
        """

    @abstractmethod
    def get_dynamic_table(self, table_id: int) -> DynamicTableRecord | None: ...

    @abstractmethod
    def list_dynamic_tables(self) -> list[DynamicTableRecord]: ...

    @abstractmethod
    def set_dynamic_table(self, table_id: int, **values: Any) -> bool:
        """Set ``target_lag_us``, ``state``, ``state_reason``, ``last_tick_us`` or
        ``owner``; returns whether the dynamic table is still recorded."""

    @abstractmethod
    def swap_dynamic_table(self, old_id: int, new_id: int) -> None:
        """Drop ``old_id`` and give ``new_id`` its name, atomically (CREATE OR REPLACE).

        Raises:
            TableBusyError: a pending commit writes the old table; nothing changed.
        """

    @abstractmethod
    def add_refresh(self, record: Mapping[str, Any]) -> int:
        """Record a refresh history row; returns its id (old rows past retention go)."""

    @abstractmethod
    def update_refresh(self, refresh_id: int, **values: Any) -> None: ...

    @abstractmethod
    def fold_refresh(self, refresh_id: int, into_id: int, **values: Any) -> bool:
        """Fold history row ``refresh_id`` into the earlier row ``into_id`` of the same
        table, atomically: set ``values`` on ``into_id`` and remove ``refresh_id`` (a
        failure repeated tick after tick keeps one row). False (nothing changed) if
        either row is gone or they are rows of different tables."""

    @abstractmethod
    def list_refreshes(
        self, dt_table_id: int | None = None, limit: int = 20_000, executing: bool = False
    ) -> list[RefreshRecord]:
        """The newest refreshes first, of one dynamic table or of all (``executing``:
        only those still running, or left running by a process that died)."""

    @abstractmethod
    def get_refresh(self, refresh_id: int) -> RefreshRecord | None:
        """One refresh's history row, however many came after it (None: gone with its
        table)."""

    @abstractmethod
    def record_no_data(
        self, table_id: int, expected_seq: int, data_timestamp_us: int,
        source_versions: Mapping[int, int], refresh_id: int,
        shown: Mapping[str, Any] | None = None,
    ) -> bool:  # fmt: skip
        """Record a refresh that found nothing to change, by compare-and-swap on the
        table's refresh sequence; False if another refresh came first."""

    @abstractmethod
    def add_no_data_refresh(
        self, record: Mapping[str, Any], expected_seq: int, source_versions: Mapping[int, int]
    ) -> int | None:
        """Add the history row of a refresh that found nothing to change and move the
        table's data timestamp in one write, by compare-and-swap as ``record_no_data``;
        the row's id, or None if another refresh came first."""

    @abstractmethod
    def take_over_commit(self, commit_id: int, owner: str, new_owner: str) -> bool:
        """Make ``new_owner`` the commit's owner if ``owner`` still is (compare-and-swap);
        returns whether it did."""

    @abstractmethod
    def release_commit(self, commit_id: int, owner: str) -> None:
        """Hand a commit its owner cannot finish to recovery (owner ``""``)."""

    @abstractmethod
    def pending_commits(self) -> list[PendingCommit]: ...

    def commits_holding(self, table_ids: Iterable[int], decided_only: bool = False) -> list[int]:
        """Ids of the pending commits (``decided_only``: the decided ones) holding a write
        intent on any of ``table_ids``."""
        wanted = set(table_ids)
        return [p.id for p in self.pending_commits()
                if (p.decided or not decided_only)
                and any(i.table_id in wanted for i in p.intents)]  # fmt: skip

    @abstractmethod
    def close(self) -> None: ...

    def unreachable(self) -> str | None:
        """Why the catalog cannot be reached now, None when it can (``GET /health``). Cheap
        to ask often; a file on this machine is always there."""
        return None
