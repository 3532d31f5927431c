"""Spark access to Delta tables without Delta jars, and to Arrow tables we hold.

Spark here has no Delta connector, so a table version is read as the Parquet
files that delta-rs resolves for it (see docs/architecture.md, "Key decisions").
Rows computed on the driver (netted changes) reach Spark by :func:`arrow_frame`.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import DeltaTable

from flush import jvm_lookups
from flush.tables import live_paths, state_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["arrow_frame", "byte_size", "read_delta", "rows_frame", "spark_session"]

# Spark (since 3.4) turns a small Arrow table into a LocalRelation, whose scan ships the
# rows inside the tasks as Java-serialized rows; above this size it reads the Arrow batches.
_LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"
_CONF_LOCK = threading.Lock()
_SIZE = re.compile(r"(-?\d+)\s*([bkmgtp]?)b?")


def spark_session(
    master: str | None = None, app_name: str = "streaming-ingest", **config: str
) -> SparkSession:
    """A Spark session configured for our tables (UTC session zone, proleptic dates).

    ``master`` defaults to ``$SPARK_MASTER`` or ``local[*]``; ``config`` adds Spark
    settings (``{"spark.driver.memory": "4g"}``). Python tasks (compaction's bin
    rewrites) run on ``$PYSPARK_PYTHON``, by default this interpreter; on a cluster,
    point it at a Python that has this package and pyarrow installed.
    """
    from pyspark.sql import SparkSession

    # Keep the driver on loopback unless told otherwise: no traffic off this machine.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master or os.environ.get("SPARK_MASTER", "local[*]"))
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # our jobs report their own progress
        # List input files on the driver: compaction passes thousands of explicit paths.
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        # No Python call site recorded on each Column built (PySpark's DataFrame error
        # context: a JVM round trip or more per function; our own code's lines, of no
        # use to a user): a refresh builds hundreds of Columns.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # No row group skipped by a filter on its Parquet statistics: Arrow's writers
        # (delta-rs, pyarrow) leave NaN out of a float column's min/max, as the format
        # says, and Spark's reader trusts them, so `V > 5` or `V != 1` lost every NaN
        # row (NaN is above every number in Spark) of a row group whose numbers fail.
        .config("spark.sql.parquet.filterPushdown", "false")
        # Files are written by Arrow in the proleptic Gregorian calendar: never rebase.
        .config("spark.sql.parquet.datetimeRebaseModeInRead", "CORRECTED")
        .config("spark.sql.parquet.int96RebaseModeInRead", "CORRECTED")
        # Write timestamps as Delta expects them (INT64 micros), never legacy INT96.
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.parquet.datetimeRebaseModeInWrite", "CORRECTED")
        # Spark's own walls under the SQL boundary (pipelines.sql.plan_guard is the first):
        # no files read by path in SQL, no reflection or script transforms, no SQL scripts.
        .config("spark.sql.runSQLOnFiles", "false")
        .config("spark.sql.restrictedMode.enabled", "true")  # Spark >= 4.3; ignored before
        .config("spark.sql.reflect.allowList", "$^")  # matches no method
        .config("spark.sql.scripting.enabled", "false")
        # No ${...} substitution in SQL text: ${env:X}, ${system:x} and ${spark.x} would
        # read the environment, JVM properties and settings before any plan exists.
        .config("spark.sql.variable.substitute", "false")
    )
    for key, value in config.items():
        builder = builder.config(key, value)
    jvm_lookups.install()  # a refresh's column and frame building: a third fewer trips
    return builder.getOrCreate()


def read_delta(
    spark: SparkSession, table_uri: str, version: int | None = None,
    loaded: DeltaTable | None = None, state: bool = False,
    files: Sequence[dict[str, Any]] | None = None,
) -> DataFrame:
    """A DataFrame over one version of a Delta table (the newest by default): its
    columns and the row id, and with ``state`` the aggregation state a dynamic table
    keeps in hidden columns too (only its refresh reads those).

    ``loaded``: a handle on this table the caller already holds; used when it is at
    ``version`` (given), which saves loading the log again. ``files``: only these of
    the version's data files (``live_files``' add actions) are read.
    """
    if loaded is not None and version is not None and loaded.version() == version:
        table = loaded
    else:
        table = DeltaTable(table_uri, version=version)
    from pyspark.sql.pandas.types import from_arrow_schema

    schema = pa.schema(table.schema())
    paths = (live_paths(table_uri, table) if files is None
             else [os.path.join(table_uri, f["path"]) for f in files])  # fmt: skip
    # The log's schema, given: Spark reads no file's footer to infer one (0.15 s a read).
    spark_schema = from_arrow_schema(schema)
    if not paths:
        frame = rows_frame(spark, [], spark_schema)
    else:
        frame = spark.read.schema(spark_schema).parquet(*paths)
    hidden = [] if state else state_columns(schema)
    return frame.drop(*hidden) if hidden else frame


def rows_frame(
    spark: SparkSession, rows: Iterable[Sequence[Any]], schema: str | StructType
) -> DataFrame:
    """Rows made on the driver (a statement's status, SHOW's rows) as a DataFrame of
    ``schema`` (a ``StructType`` or DDL text such as ``"name STRING, n BIGINT"``).

    ``spark.createDataFrame(rows, schema)`` ships Python rows through a Python RDD, so
    collecting even a one-row status started a job on Python workers (116 ms on a quiet
    machine). As Arrow, a small table becomes a LocalRelation, collected without a job
    (21 ms; docs/benchmarks.md).
    Timestamps are naive UTC or aware; naive ones are read as UTC, whatever the
    process's time zone (the row path read them in the local zone).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = schema if not isinstance(schema, str) else _ddl_schema(schema)
    arrow_schema = to_arrow_schema(struct, timezone="UTC")
    width, rows = len(arrow_schema), list(rows)  # (a generator is read once)
    if any(len(row) != width for row in rows):
        raise ValueError(f"every row must have the schema's {width} values")
    columns = list(zip(*rows, strict=True)) if rows else [()] * width
    arrays = [pa.array(list(values), type=field.type)
              for values, field in zip(columns, arrow_schema, strict=True)]  # fmt: skip
    return spark.createDataFrame(pa.Table.from_arrays(arrays, schema=arrow_schema), struct)


@functools.lru_cache(maxsize=256)
def _ddl_schema(text: str) -> StructType:
    """DDL text parsed by Spark's parser once per text (the schemas are constants)."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    parsed = _parse_datatype_string(text)
    assert isinstance(parsed, StructType), text
    return parsed


def arrow_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` as a DataFrame over its Arrow batches, whatever its size.

    Spark makes a small table a LocalRelation, whose scan ships the rows inside the
    tasks as Java-serialized rows: a query over 20,000 change rows into Arrow took
    107 ms that way against 61 ms over the batches. Over the batches, though, Spark
    knows no size for the frame and would never broadcast it in a join (it broadcast
    the other side, or shuffled both), so a frame small enough for a broadcast join
    gets the broadcast hint, which is what the LocalRelation's size gave it. Where
    the frame is the side an outer join keeps (MERGE's source), Spark cannot follow
    the hint and logs a warning (``HintErrorLogger``); the plan is what it was.

    The threshold is a setting of the whole Spark session: while this call runs,
    another thread's ``createDataFrame`` on the same session takes the batch path
    too (speed only), and a change another thread makes to that one setting in
    that moment is undone.
    """
    conf = spark.conf
    with _CONF_LOCK:  # our own calls never interleave their save and restore
        before = conf.get(_LOCAL_RELATION_THRESHOLD, None)
        conf.set(_LOCAL_RELATION_THRESHOLD, "0")
        try:
            frame = spark.createDataFrame(table)
        finally:
            if before is None:
                conf.unset(_LOCAL_RELATION_THRESHOLD)
            else:
                conf.set(_LOCAL_RELATION_THRESHOLD, before)
    limit = byte_size(conf.get("spark.sql.autoBroadcastJoinThreshold", "10MB") or "10MB")
    return frame.hint("broadcast") if table.nbytes <= limit else frame


def byte_size(text: str) -> int:
    """A Spark size setting in bytes (``10485760``, ``10485760b``, ``10MB``, ``1g``;
    ``-1`` = disabled); an unreadable value counts as disabled."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        return -1
    number, unit = int(match.group(1)), match.group(2)
    return number if number < 0 else number * 1024 ** "bkmgtp".index(unit or "b")
