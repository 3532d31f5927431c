"""Change sets: what changed in a table between two versions, as one Spark plan.

The events come from the table's change data feed (delta-rs ``load_cdf``): inserts,
deletes and update pre/post images of each commit, never compaction (its commits do
not change data). The net change of one row between the versions is its state before
the first event against its state after the last one, compared by row id; equal
states are dropped, which removes copy-on-write noise (an UPDATE that changed no value)
for free. The modes are parameters of the one builder:

- ``DEFAULT`` (standard streams): net changes; an update is a DELETE + INSERT pair with
  ``METADATA$ISUPDATE`` true and the same row id.
- ``APPEND_ONLY`` (the reference's meaning): every row inserted in the range, as
  inserted, even if it was updated or deleted later. Reads only the inserts.
- ``APPEND_ONLY_FINAL`` (Databend's meaning): the final state of the rows inserted in
  the range that still exist.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import DeltaTable

from flush.tables import ROW_ID_COLUMN, delta_schema
from ingest_sdk import TableSchema
from pipelines.errors import StreamStaleError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ACTION", "CHANGE_COLUMNS", "ISUPDATE", "ROW_ID", "ChangeMode", "read_changes"]

ACTION, ISUPDATE, ROW_ID = "METADATA$ACTION", "METADATA$ISUPDATE", "METADATA$ROW_ID"
CHANGE_COLUMNS = (ACTION, ISUPDATE, ROW_ID)
_BEFORE_KINDS = ["delete", "update_preimage"]
_AFTER_KINDS = ["insert", "update_postimage"]


class ChangeMode(StrEnum):
    DEFAULT = "DEFAULT"
    APPEND_ONLY = "APPEND_ONLY"
    APPEND_ONLY_FINAL = "APPEND_ONLY_FINAL"


def change_events(table_uri: str, schema: TableSchema, after: int, to: int) -> pa.Table:
    """The change data feed of versions ``(after, to]`` with the row id, the kind of each
    event and its version, typed as the table is.

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
        events = pa.table(
            DeltaTable(table_uri).load_cdf(starting_version=after + 1, ending_version=to)
        )
    except Exception as exc:  # delta-rs reports missing log entries and files variously
        raise StreamStaleError(
            f"the changes after version {after} are no longer retained (log cleanup or "
            f"vacuum removed them: {str(exc)[:200]}); recreate the stream with CREATE OR "
            "REPLACE STREAM"
        ) from exc
    return events.select([f.name for f in fields]).cast(pa.schema(fields))


def read_changes(
    spark: SparkSession,
    table_uri: str,
    schema: TableSchema,
    after: int,
    to: int,
    mode: ChangeMode = ChangeMode.DEFAULT,
) -> DataFrame:
    """The changes of versions ``(after, to]`` as a DataFrame: the table's columns, then
    ``METADATA$ACTION``, ``METADATA$ISUPDATE`` and ``METADATA$ROW_ID``.

    One plan: group the events by row id; the state before the range is the first
    event's if it is a delete or pre-image, the state after is the last event's if it is
    an insert or post-image; rows whose two states are equal (or both absent) drop out,
    a state only after is an INSERT, only before a DELETE, both an update pair.
    """
    from pyspark.sql import functions as F

    events = change_events(table_uri, schema, after, to)
    columns = schema.names
    frame = spark.createDataFrame(events)
    kind = F.col("_change_type")
    if mode is ChangeMode.APPEND_ONLY:  # inserts only: the cheap read on insert-only history
        frame = frame.where(kind == "insert")
    order = F.col("_commit_version") * 2 + F.when(kind.isin(_BEFORE_KINDS), 0).otherwise(1)
    event = F.struct(kind.alias("kind"), F.struct(*[F.col(f"`{c}`") for c in columns]).alias("v"))
    grouped = frame.groupBy(ROW_ID_COLUMN).agg(
        F.min_by(event, order).alias("first"), F.max_by(event, order).alias("last")
    )
    before = F.when(F.col("first.kind").isin(_BEFORE_KINDS), F.col("first.v"))
    after_state = F.when(F.col("last.kind").isin(_AFTER_KINDS), F.col("last.v"))
    if mode is ChangeMode.APPEND_ONLY:
        before, after_state = F.lit(None), F.col("first.v")
    states = grouped.select(
        F.col(ROW_ID_COLUMN), before.alias("before"), after_state.alias("after")
    ).where(~F.col("before").eqNullSafe(F.col("after")))
    if mode is ChangeMode.APPEND_ONLY_FINAL:
        states = states.where(F.col("before").isNull())
    is_update = F.col("before").isNotNull() & F.col("after").isNotNull()
    labelled = states.select(
        F.col(ROW_ID_COLUMN),
        F.explode(
            F.filter(
                F.array(
                    F.when(F.col("before").isNotNull(),
                           F.struct(F.lit("DELETE").alias("a"), is_update.alias("u"),
                                    F.col("before").alias("v"))),
                    F.when(F.col("after").isNotNull(),
                           F.struct(F.lit("INSERT").alias("a"), is_update.alias("u"),
                                    F.col("after").alias("v"))),
                ),
                lambda change: change.isNotNull(),
            )
        ).alias("c"),
    )  # fmt: skip
    return labelled.select(
        *[F.col("c.v").getField(c).alias(c) for c in columns],
        F.col("c.a").alias(ACTION),
        F.col("c.u").alias(ISUPDATE),
        F.col(ROW_ID_COLUMN).alias(ROW_ID),
    )
