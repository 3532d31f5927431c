"""The service's Prometheus metrics, through ``prometheus-client``.

One registry per service (not the library's global one), so several servers in
one process (the tests) keep their own numbers. Counters and histograms carry a
``table`` label where a user asks "which table?"; the label's series go away
when the table is dropped. Buffer gauges read the live budget at scrape time,
so they can never go stale.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "FLUSH_PHASES", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: Seconds: a flush is milliseconds to seconds; insert-to-commit follows max_client_lag.
_SQL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_FLUSH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
#: Phases of a flush, from half a millisecond (a catalog write) to the longest lag waits;
#: fine enough that a median read from them (the benchmark's) is within a few percent.
_PHASE_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 60.0,
)  # fmt: skip
#: The phases ``ingest_flush_phase_seconds`` reports, in the order a row meets them.
FLUSH_PHASES = (
    "lag_wait", "lock", "row_ids", "landed_check", "parquet", "delta_commit", "catalog",
    "flush", "in_server",
)  # fmt: skip


def _flush_phase_histogram(registry: CollectorRegistry) -> Histogram:
    """Where flushes spend their time, by phase (:data:`FLUSH_PHASES`), all tables together."""
    return Histogram(
        "ingest_flush_phase_seconds",
        "Where a flush's time goes, all tables together: lag_wait (per batch, from its "
        "arrival to its flush's start), lock (the table's flush lock), row_ids (their "
        "reservation in the catalog), landed_check (the log refreshed, the channels' "
        "positions checked), parquet (the file written and fsynced), delta_commit, catalog "
        "(the commit recorded), flush (all of one flush), in_server (per batch, from its "
        "arrival to its acknowledgement).",
        ["phase"],
        buckets=_PHASE_BUCKETS,
        registry=registry,
    )


class Metrics:
    """Every number ``GET /metrics`` shows."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rows_inserted = Counter(
            "ingest_rows_inserted", "Rows accepted into the server buffer.", ["table"], registry=r
        )
        self.bytes_inserted = Counter(
            "ingest_bytes_inserted", "Bytes of rows accepted (Arrow size).", ["table"], registry=r
        )
        self.batches_inserted = Counter(
            "ingest_batches_inserted", "Insert requests accepted.", ["table"], registry=r
        )
        self.duplicate_batches = Counter(
            "ingest_duplicate_batches",
            "Insert requests acknowledged and ignored: a batch_seq already received (retries).",
            ["table"],
            registry=r,
        )
        self.rows_committed = Counter(
            "ingest_rows_committed", "Rows made durable in Delta commits.", ["table"], registry=r
        )
        self.flush_failures = Counter(
            "ingest_flush_failures",
            "Flush attempts that failed and will be retried.",
            ["table"],
            registry=r,
        )
        self.flush_duration = Histogram(
            "ingest_flush_duration_seconds",
            "Duration of one flush: Parquet write, Delta commit and catalog update.",
            ["table"],
            buckets=_FLUSH_BUCKETS,
            registry=r,
        )
        self.commit_latency = Histogram(
            "ingest_insert_to_commit_seconds",
            "From a batch's arrival in the server to its Delta commit.",
            ["table"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.flush_phase = _flush_phase_histogram(r)
        self.channels_opened = Counter(
            "ingest_channels_opened", "Channel opens (each a new generation).", ["table"],
            registry=r,
        )  # fmt: skip
        self.compactions = Counter(
            "ingest_compactions",
            "Background compaction runs by outcome (SUCCEEDED, NOTHING_TO_DO, FAILED, SKIPPED...).",
            ["table", "status"],
            registry=r,
        )
        self.rejected_requests = Counter(
            "ingest_rejected_requests",
            "Requests answered with an error, by error code (429 backpressure included).",
            ["code"],
            registry=r,
        )
        self.sql_statements = Counter(
            "ingest_sql_statements",
            "SQL statements answered, by outcome (OK, or the statement's error code).",
            ["outcome"],
            registry=r,
        )
        self.sql_duration = Histogram(
            "ingest_sql_statement_seconds",
            "From a SQL statement's arrival to its answer (its turn in the worker included).",
            buckets=_SQL_BUCKETS,
            registry=r,
        )
        self.worker_restarts = Counter(
            "ingest_spark_worker_restarts",
            "Times the Spark worker (compaction and SQL) died or was killed and had to start "
            "again (stops after an idle spell are not counted).",
            registry=r,
        )
        self._table_metrics = (
            self.rows_inserted, self.bytes_inserted, self.batches_inserted,
            self.duplicate_batches, self.rows_committed, self.flush_failures,
            self.flush_duration, self.commit_latency, self.channels_opened,
        )  # fmt: skip

    def watch(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        """A gauge whose value is ``read()`` at scrape time."""
        Gauge(name, help_text, registry=self.registry).set_function(read)

    def forget_table(self, table: str) -> None:
        """Remove a dropped table's series."""
        for metric in self._table_metrics:
            with contextlib.suppress(KeyError):  # the table never had this series
                metric.remove(table)
        for labels in list(self.compactions._metrics):  # no public way to list label values
            if labels[0] == table:
                self.compactions.remove(*labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
