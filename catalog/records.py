"""What the catalog holds, as frozen records shared by every layer above it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest_sdk import TableSchema
from ingest_sdk.schema import quote_identifier

__all__ = [
    "APPEND_INTENT",
    "EXCLUDE_OPTIONS",
    "KEY_SPACE",
    "REFRESH_PLAN_KEY",
    "ROWS_INTENT",
    "AlterSeal",
    "ChangeStreamDefinition",
    "ChangeStreamRecord",
    "ChannelProgress",
    "ChannelRecord",
    "CommitIntent",
    "CommitRecord",
    "DatabaseRecord",
    "DynamicSource",
    "DynamicTableRecord",
    "PartitionRecord",
    "PendingCommit",
    "RefreshRecord",
    "SchemaRecord",
    "Seal",
    "StreamClaim",
    "StreamRecord",
    "TableInfo",
    "full_name",
    "held_tables",
]

#: The key of a pending commit's plan that makes it a dynamic table's refresh: the
#: catalog claims the table's refresh sequence when it decides the commit and records
#: the refresh when it finishes it (see :class:`DynamicTableRecord`).
REFRESH_PLAN_KEY = "refresh"

#: Retention defaults of a table (days), as the reference system names them.
DEFAULT_PROPERTIES: dict[str, Any] = {
    "change_tracking": False,
    "data_retention_time_in_days": 1,
    "max_data_extension_time_in_days": 14,
}


def full_name(database: str, schema_name: str, name: str) -> str:
    """``DB.SCHEMA.NAME``, parts quoted where needed, so the name reads back as the object."""
    return ".".join(quote_identifier(p) for p in (database, schema_name, name))


@dataclass(frozen=True, slots=True)
class DatabaseRecord:
    """A database. It exists once created, or while anything (a schema, table or stream)
    names it: tables made before databases were catalog objects keep their database."""

    name: str
    created_at: float


@dataclass(frozen=True, slots=True)
class SchemaRecord:
    """A schema of a database; it exists like a database does (created, or named by a
    table or stream)."""

    database: str
    name: str
    created_at: float

    @property
    def full_name(self) -> str:
        """``DB.SCHEMA``, parts quoted where needed."""
        return ".".join(quote_identifier(p) for p in (self.database, self.name))


@dataclass(frozen=True, slots=True)
class TableInfo:
    """A table as the catalog knows it. ``id`` is never reused, so a dropped and
    recreated table is a new table with new channels (and its old streams are stale)."""

    id: int
    database: str
    schema_name: str
    name: str
    uri: str
    schema: TableSchema
    created_at: float
    applied_version: int
    next_row_id: int
    clustering: tuple[str, ...] = ()
    properties: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PROPERTIES))

    @property
    def full_name(self) -> str:
        """``DB.SCHEMA.TABLE``, parts quoted where needed (``DB.S."with space"``)."""
        return full_name(self.database, self.schema_name, self.name)

    @property
    def primary_key(self) -> tuple[str, ...]:
        """The columns of the key declared at CREATE TABLE, in key order (none: empty).
        Not enforced: two rows may hold the same key."""
        return tuple(self.properties.get("primary_key", ()))


@dataclass(frozen=True, slots=True)
class ChannelRecord:
    """A channel's durable state: generation and what is committed."""

    table_id: int
    name: str
    generation: int
    offset_token: str | None
    rows_committed: int
    last_activity: float
    created_at: float
    #: The newest position recorded (``generation << 40 | batch_seq``); 0: none yet;
    #: None: recorded before positions were kept (a catalog upgraded from an older layout).
    committed_position: int | None = None
    #: The server holding its newest open (its advertised URL, or its id without one);
    #: empty: recorded before servers were.
    server: str = ""


@dataclass(frozen=True, slots=True)
class ChannelProgress:
    """Where one channel stands after a flush: its newest batch and offset token."""

    channel: str
    generation: int
    batch_seq: int
    offset_token: str | None
    rows: int


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """One committed flush as the Delta log records it."""

    version: int
    channels: tuple[ChannelProgress, ...]
    next_row_id: int
    rows: int
    # Size of the file this flush added: known to the writer, not kept in the log.
    file_bytes: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class ViewRecord:
    """A view: a named query, expanded where it is read.

    ``query`` is the body as written; its unqualified names resolve against
    ``default_database`` and ``default_schema`` (the creating session's, so a view
    reads the same objects from every session). ``uid`` is new for every CREATE [OR
    REPLACE], so a reader that recorded it notices a replacement.
    """

    id: int
    database: str
    schema_name: str
    name: str
    query: str
    default_database: str
    default_schema: str
    created_at: float
    comment: str = ""
    uid: str = ""

    @property
    def full_name(self) -> str:
        return full_name(self.database, self.schema_name, self.name)


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A stream: a bookmark (a table version) on one table.

    ``offset_moved_at`` is when the offset last moved (creation or consumption): the
    retention extension that keeps an unconsumed stream readable counts from there.
    """

    id: int
    database: str
    schema_name: str
    name: str
    table_id: int
    mode: str
    offset_version: int
    created_at: float
    offset_moved_at: float
    comment: str = ""
    claimed_by: int | None = None
    #: Unique to this stream (never reused, unlike ``id`` after a catalog restore): it
    #: names the stream's app transaction in the tables it is consumed into.
    uid: str = ""
    #: A stream on a view: the view's id (None: a stream on table ``table_id``), the
    #: uids of the view and every view its body expands, as checked at CREATE, and the
    #: offset per base table, ``(table_id, version)`` sorted by table id. Its
    #: ``offset_version`` then counts its consumptions (compared and swapped by a
    #: consuming commit, which moves every base offset with it) and ``table_id`` is 0.
    view_id: int | None = None
    view_uids: tuple[str, ...] = ()
    base_offsets: tuple[tuple[int, int], ...] = ()

    @property
    def full_name(self) -> str:
        return full_name(self.database, self.schema_name, self.name)

    @property
    def on_view(self) -> bool:
        return self.view_id is not None


@dataclass(frozen=True, slots=True)
class StreamClaim:
    """A consuming transaction's claim: move ``stream_id`` from ``expected`` to ``new``
    (a stream on a view: also each base table's offset to ``bases``' version)."""

    stream_id: int
    expected: int
    new: int
    bases: tuple[tuple[int, int], ...] = ()


#: A write intent on rows that exist (updates, deletes): two such intents on one table
#: never coexist. An ``append`` intent only inserts and conflicts with no writer.
ROWS_INTENT = "rows"
APPEND_INTENT = "append"


@dataclass(frozen=True, slots=True)
class CommitIntent:
    """What a pending commit will write to one table: ``rows`` or ``append``."""

    table_id: int
    kind: str

    def conflicts_with(self, other: CommitIntent) -> bool:
        return self.table_id == other.table_id and self.kind == other.kind == ROWS_INTENT


def held_tables(plan: Mapping[str, Any]) -> frozenset[int]:
    """The tables a pending commit's ``plan`` writes when it writes several (none for one
    table): once it is decided, change streams hold them until it ends, so that its
    versions share one moment (``catalog.sqlite_change_streams.seal_commit``)."""
    written = frozenset(entry["table_id"] for entry in plan.get("tables", ()))
    return written if len(written) > 1 else frozenset()


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A pipeline transaction from its reservation to its end (see pipelines' commit).

    ``state`` is ``preparing`` (intents held, being validated, nothing written: it may
    still be abandoned) or ``decided`` (streams claimed: it is rolled forward, never
    abandoned). ``plan`` says what to commit to which table, so recovery can roll it
    forward; ``owner`` names the process rolling it forward (see pipelines'
    commit_owner), ``""`` once released to recovery; ``intents`` the tables it writes;
    ``decided_seq`` the order of decisions among the pending commits (0: undecided, or
    decided by an older version).
    """

    id: int
    owner: str
    plan: dict[str, Any]
    claims: tuple[StreamClaim, ...]
    created_at: float
    state: str = "decided"
    intents: tuple[CommitIntent, ...] = ()
    decided_seq: int = 0

    @property
    def held(self) -> frozenset[int]:
        """The tables it holds once decided (:func:`held_tables`)."""
        return held_tables(self.plan)

    @property
    def decided(self) -> bool:
        return self.state == "decided"


@dataclass(frozen=True, slots=True)
class DynamicSource:
    """What a dynamic table reads, as recorded when it was defined.

    ``kind`` is ``table`` or ``dynamic_table`` (``source_id`` is its table id; catalogs
    written before the second kind say ``table`` for both) or ``view`` (``source_id`` its
    view id). ``marker`` tells a changed source from the one the
    definition was checked against: a table's column declarations (JSON), a view's uid.
    ``version`` is the table version the last applied refresh read (None: none yet).
    """

    source_id: int
    kind: str
    name: str
    marker: str
    version: int | None = None


@dataclass(frozen=True, slots=True)
class DynamicTableRecord:
    """A dynamic table's definition and refresh state; its rows live in the table
    ``table_id`` (a row of ``tables`` like any other).

    ``refresh_seq`` counts applied refreshes: a refresh claims the next one by
    compare-and-swap (``claimed_by`` holds the pending commit applying it), so two
    refreshes of one table never both apply. ``state`` is INITIALIZING (the initial
    refresh runs; ``owner`` is its process), ACTIVE or SUSPENDED. ``target_lag_us`` None
    is DOWNSTREAM. ``row_ids``: PACKED (stateless queries: derived from the source rows'
    ids), DERIVED (the query-delta engine's hashes of ids and group keys) or SEQUENCE
    (from the table's row-id sequence).
    """

    table_id: int
    uid: str
    query: str
    default_database: str
    default_schema: str
    target_lag_us: int | None
    refresh_mode: str
    mode_reason: str
    row_ids: str
    initialize: str
    state: str
    state_reason: str
    owner: str
    data_timestamp_us: int | None
    data_version: int | None
    refresh_seq: int
    claimed_by: int | None
    last_tick_us: int | None
    created_at: float
    comment: str = ""
    sources: tuple[DynamicSource, ...] = ()

    @property
    def incremental(self) -> bool:
        """Whether refreshes after the initial one may be incremental."""
        return self.refresh_mode != "FULL" and not self.mode_reason


@dataclass(frozen=True, slots=True)
class ChangeStreamRecord:
    """A partitioned change stream: the tables it watches (``for_all``: every table,
    those created later too; else ``table_ids``), what its records carry
    (``value_capture_type``) and how long they are kept (``retention_s``).

    ``created_us`` is the commit clock's time of its creation (microseconds since the
    epoch): no read may start before it. ``uid`` is new for every CREATE [OR REPLACE].
    ``column_lists`` holds, for each listed table written with a column list
    (``FOR t(a, b)``), the columns it watches (empty: keys only); a table without one is
    watched whole. ``exclusions`` holds the ``exclude_*`` options given explicitly, in
    :data:`EXCLUDE_OPTIONS` order (Spanner's ``CHANGE_STREAM_OPTIONS`` lists only those).
    """

    id: int
    database: str
    schema_name: str
    name: str
    for_all: bool
    table_ids: tuple[int, ...]
    value_capture_type: str
    retention_s: int
    created_at: float
    created_us: int
    uid: str
    column_lists: tuple[tuple[int, tuple[str, ...]], ...] = ()
    exclusions: tuple[tuple[str, bool], ...] = ()

    @property
    def full_name(self) -> str:
        return full_name(self.database, self.schema_name, self.name)

    @property
    def definition(self) -> ChangeStreamDefinition:
        """What the stream reports now, as one entry of its history (in force since its
        creation: an ALTER appends a later one)."""
        return ChangeStreamDefinition(self.created_us, self.for_all, self.table_ids,
                                      self.value_capture_type, self.column_lists,
                                      self.exclusions)  # fmt: skip

    def watched_columns(self, table_id: int) -> tuple[str, ...] | None:
        """The columns the stream watches of a table it lists; None: all of them."""
        return self.definition.watched_columns(table_id)

    @property
    def excluded_mod_types(self) -> frozenset[str]:
        """The mod types whose records are not emitted (see :class:`ChangeStreamDefinition`)."""
        return self.definition.excluded_mod_types


@dataclass(frozen=True, slots=True)
class ChangeStreamDefinition:
    """One entry of a change stream's history: what it reports of the changes whose
    change stream timestamp is at or after ``from_us`` (until the next entry's). As in
    Spanner, an ALTER applies to changes committed from then on; earlier ones keep the
    definition they were captured under, so a re-read returns the same records."""

    from_us: int
    for_all: bool
    table_ids: tuple[int, ...]
    value_capture_type: str
    column_lists: tuple[tuple[int, tuple[str, ...]], ...] = ()
    exclusions: tuple[tuple[str, bool], ...] = ()

    def watches(self, table_id: int) -> bool:
        """Whether the changes of that table are reported (``for_all``: every table's)."""
        return self.for_all or table_id in self.table_ids

    def watched_columns(self, table_id: int) -> tuple[str, ...] | None:
        """The columns watched of a listed table; None: all of them."""
        return next((columns for tid, columns in self.column_lists if tid == table_id), None)

    @property
    def excluded_mod_types(self) -> frozenset[str]:
        """The mod types (``INSERT``, ``UPDATE``, ``DELETE``) whose records are not
        emitted (``exclude_ttl_deletes`` excludes none: no delete here is a TTL's)."""
        kinds = (EXCLUDE_OPTIONS.get(option) for option, on in self.exclusions if on)
        return frozenset(kind for kind in kinds if kind)


@dataclass(frozen=True, slots=True)
class AlterSeal:
    """How an ALTER takes its moment: it seals ``table_ids`` (the tables watched before
    or after it) with ``compute`` in its own catalog transaction, and its definition is
    in force from the new heartbeat + 1 (at least ``floor_us`` + 1): every version that
    seal covers is before it, every later one after it (``compute``: given the tables'
    newest seals, their new ones). ``expected``: the definition the
    tables were chosen from; another ALTER since makes it raise :class:`ValueError`."""

    table_ids: tuple[int, ...]
    compute: Callable[[dict[int, Seal]], dict[int, Seal]]
    expected: ChangeStreamDefinition
    floor_us: int


#: The ``exclude_*`` options of a change stream and the mod type each one excludes
#: (None: deletes by a time-to-live policy, which this system never makes).
EXCLUDE_OPTIONS: dict[str, str | None] = {
    "exclude_insert": "INSERT",
    "exclude_update": "UPDATE",
    "exclude_delete": "DELETE",
    "exclude_ttl_deletes": None,
}


#: The key space of change stream partitions: a key's hash is in [0, KEY_SPACE).
KEY_SPACE = 1 << 32


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """One partition of a change stream: the keys whose hash is in ``[lo, hi)``, for the
    commit timestamps ``[start_us, end_us)`` (``end_us`` None: still open). ``parents``:
    the partitions it follows (none for the stream's first partitions)."""

    token: str
    stream_uid: str
    lo: int
    hi: int
    start_us: int
    end_us: int | None
    parents: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Seal:
    """A table's timeline mark for change streams: every version up to ``version`` has a
    change stream timestamp at most ``heartbeat_us``, every later one after it.
    ``covers_us``: the heartbeat of the first seal of ``version`` (later seals of the
    same version, on an idle table, raise ``heartbeat_us`` only), the bound of the
    versions it sealed."""

    version: int
    heartbeat_us: int
    covers_us: int = 0


@dataclass(frozen=True, slots=True)
class RefreshRecord:
    """One row of a dynamic table's refresh history.

    ``action``: INCREMENTAL, FULL, NO_DATA, SKIPPED or FAILED (None while it runs);
    ``state``: EXECUTING, SUCCEEDED, FAILED or SKIPPED; ``source_versions`` maps each
    source's name to the versions ``[after, to]`` read; ``took_s``: the seconds from its
    start to its commit, as the process that ran it measured them (None if recovery
    finished it: its ``ended_at`` then includes the wait for recovery).
    """

    id: int
    dt_table_id: int
    name: str
    refresh_uid: str
    trigger: str
    action: str | None
    state: str
    reason: str
    error: str
    data_timestamp_us: int
    source_versions: dict[str, Any]
    rows_inserted: int | None
    rows_deleted: int | None
    rows_updated: int | None
    table_version: int | None
    started_at: float
    ended_at: float | None
    owner: str
    skipped_ticks: int = 0
    took_s: float | None = None
