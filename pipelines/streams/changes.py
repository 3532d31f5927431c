"""A table's changes between two versions: its change data feed, netted, as a DataFrame.

The events come from the table's change data feed (delta-rs ``load_cdf``): inserts,
deletes and update pre/post images of each commit, never compaction (its commits do
not change data). The net change of one row between the versions is its state before
the first event against its state after the last one, compared by row id; equal
states are dropped, which removes copy-on-write noise (an UPDATE that changed no value)
for free. The netting (:func:`pipelines.change_sets.net_events`, whose modes are
parameters) is Arrow compute on the events delta-rs returns; Spark gets the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from flush.spark_tables import arrow_frame
from flush.tables import delta_schema
from ingest_sdk import TableSchema
from pipelines.change_sets import ChangeMode, net_events
from pipelines.errors import StreamStaleError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["change_events", "read_changes"]


def change_events(
    table: str | DeltaTable, schema: TableSchema, after: int, to: int
) -> pa.Table:
    """The change data feed of versions ``(after, to]`` with the row id, the kind of each
    event and its version, typed as the table is. ``table``: its URI, or a handle on it
    at version ``to`` or later (saves loading the log again).

    Raises:
        StreamStaleError: part of that history is gone (log cleanup or vacuum).
    """
    target = delta_schema(schema).remove_metadata()
    fields = [
        *target,
        pa.field("_change_type", pa.string()),
        pa.field("_commit_version", pa.int64()),
    ]
    if to <= after:
        return pa.schema(fields).empty_table()
    try:
        handle = DeltaTable(table) if isinstance(table, str) else table
        events = pa.table(handle.load_cdf(starting_version=after + 1, ending_version=to))
    except Exception as exc:  # delta-rs reports missing log entries and files variously
        raise StreamStaleError(
            f"the changes after version {after} are no longer retained (log cleanup or "
            f"vacuum removed them: {str(exc)[:200]}); a stream reading them is stale: "
            "recreate it with CREATE OR REPLACE STREAM"
        ) from exc
    return events.select([f.name for f in fields]).cast(pa.schema(fields))


def read_changes(
    spark: SparkSession,
    table: str | DeltaTable,
    schema: TableSchema,
    after: int,
    to: int,
    mode: ChangeMode = ChangeMode.DEFAULT,
) -> DataFrame:
    """The changes of versions ``(after, to]`` as a DataFrame: the table's columns, then
    ``METADATA$ACTION``, ``METADATA$ISUPDATE`` and ``METADATA$ROW_ID``. ``table`` as
    :func:`change_events` takes it.

    The events are netted in Arrow (:func:`net_events`) where delta-rs left them, on
    the driver: a Spark plan grouping them by row id cost seconds even for a few
    thousand changes (two shuffles and a sort aggregate).
    """
    events = change_events(table, schema, after, to)
    return arrow_frame(spark, net_events(events, schema.names, mode))
