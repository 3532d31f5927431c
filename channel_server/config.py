"""Service configuration: frozen, typed values with defaults that work on a fresh machine."""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from catalog import CATALOG_FILE, is_postgres
from channel_server.sql_sessions import SqlLimits
from flush.storage import is_object_store
from ingest_sdk.errors import ConfigurationError
from pipelines.change_streams.partitions import BalancePolicy

__all__ = [
    "CompactionTrigger",
    "FlushPolicy",
    "Limits",
    "ServerConfig",
    "SqlLimits",
    "advertised_url",
]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class FlushPolicy:
    """When a table flushes: at the earliest deadline of its pending batches (arrival
    + the channel's max_client_lag), or at once when its buffer passes ``max_bytes``."""

    max_bytes: int = 64 * MiB
    default_max_client_lag: float = 1.0
    retry_initial: float = 0.05
    retry_max: float = 5.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds that protect the service."""

    #: Total bytes of rows buffered in the server, across tables; past it inserts get 429.
    max_buffer_bytes: int = 512 * MiB
    #: Largest request body.
    max_request_bytes: int = 256 * MiB
    #: Longest a wait-for-commit request is held open.
    max_wait_seconds: float = 60.0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value is None or not value.strip() else int(value)
    except ValueError:
        raise ConfigurationError(f"${name} must be an integer, got {value!r}") from None


@dataclass(frozen=True, slots=True)
class CompactionTrigger:
    """When the service starts a background compaction of a table, and where it runs:
    a separate, long-lived worker process (``python -m flush.compact --serve``), so
    ingestion latency does not suffer and its Spark session stays warm between runs."""

    enabled: bool = True
    max_intermediate_files: int = 32
    max_intermediate_bytes: int = 256 * MiB
    spark_master: str | None = None  # default: $SPARK_MASTER or local[*]
    target_file_mb: float = 128
    extra_args: tuple[str, ...] = ()
    #: The worker (and its JVM) is stopped after this long without a compaction.
    worker_idle_seconds: float = 600.0
    #: The worker's niceness (0 to 19; 0: the service's own priority), by default
    #: ``$INGEST_SPARK_WORKER_NICE`` or 10. Its compactions, statements and refreshes then
    #: take the CPU the flushes and producers leave, so a compaction on a busy machine does
    #: not hold commits up; on an idle one it changes nothing.
    worker_nice: int = field(default_factory=lambda: _env_int("INGEST_SPARK_WORKER_NICE", 10))

    def __post_init__(self) -> None:
        if not 0 <= self.worker_nice <= 19:
            raise ConfigurationError(
                f"the Spark worker's niceness must be 0 to 19, got {self.worker_nice}"
            )


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``python -m channel_server`` takes."""

    host: str = "127.0.0.1"
    port: int = 8080
    #: The tables' home: a local folder, or ``s3://bucket/prefix`` (settings from the
    #: standard AWS environment variables).
    warehouse: str | Path = Path("warehouse")
    #: A local folder for the service's own files (the Spark worker's log, the SQL
    #: transaction journal, the default SQLite catalog) when the warehouse is in a bucket.
    state_dir: Path = Path("ingest-state")
    #: The catalog: a SQLite file (default ``<warehouse>/catalog.sqlite``) or a PostgreSQL
    #: URL (``postgresql://user@host:port/database``), for several services on one warehouse.
    catalog: str | Path | None = None
    auth_tokens: frozenset[str] = frozenset()
    channel_retention_seconds: float = 30 * 86400.0
    retention_check_seconds: float = 3600.0
    flush: FlushPolicy = field(default_factory=FlushPolicy)
    limits: Limits = field(default_factory=Limits)
    compaction: CompactionTrigger = field(default_factory=CompactionTrigger)
    sql: SqlLimits = field(default_factory=SqlLimits)
    #: Dynamic tables refresh on their schedule in the Spark worker, which then stays up
    #: while any table has a schedule.
    refresh_scheduler: bool = True
    #: Change stream partitions are split and merged by their change rate, checked this
    #: often (0: never; ALTER CHANGE STREAM ... SPLIT/MERGE still work).
    change_stream_check_seconds: float = 5.0
    change_stream_balance: BalancePolicy = field(default_factory=BalancePolicy)
    #: The URL clients reach this server by, when several serve one warehouse: a channel's
    #: open answers it, and the SDK sends the channel's calls there (None: clients keep
    #: the URL they used; the catalog then names the server by its id).
    advertise_url: str | None = None

    def __post_init__(self) -> None:
        if self.advertise_url is not None:
            object.__setattr__(self, "advertise_url", advertised_url(self.advertise_url))
        if self.limits.max_buffer_bytes <= 0:
            raise ConfigurationError("max_buffer_bytes must be positive")
        if not self.channel_retention_seconds > 0:  # NaN too: it would compare as no time
            raise ConfigurationError("channel retention must be positive")
        if min(self.sql.max_sessions, self.sql.max_transactions) < 1 or self.sql.idle_seconds <= 0:
            raise ConfigurationError(
                "SQL limits must be positive: sessions, transactions and the idle time"
            )

    @property
    def in_object_store(self) -> bool:
        """Whether the warehouse lies in a bucket (``s3://``), not a local folder."""
        return is_object_store(self.warehouse)

    @property
    def local_folder(self) -> Path:
        """Where the service keeps its own files: the warehouse itself when it is a local
        folder, else :attr:`state_dir`."""
        return self.state_dir if self.in_object_store else Path(self.warehouse)

    @property
    def catalog_location(self) -> str | Path:
        """What :func:`catalog.open_catalog` opens: the URL or the file."""
        if self.catalog is None:
            return self.local_folder / CATALOG_FILE
        return self.catalog if is_postgres(self.catalog) else Path(self.catalog)


def advertised_url(url: str) -> str:
    """An advertised URL as clients will use it: ``http(s)://host[:port][/path]``, no
    trailing slash.

    Raises:
        ConfigurationError: anything else (a typo here sends every channel's calls to a
            server that is not there).
    """
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ConfigurationError(
            f"advertise URL {url!r} is not a URL clients can use: write it as "
            "http://host:port (or https://...), the address producers reach this server by"
        )
    try:
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise ConfigurationError(f"advertise URL {url!r}: {exc}") from None
    return urllib.parse.urlunsplit(parts).rstrip("/")
