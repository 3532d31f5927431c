"""Change stream statements: CREATE, ALTER, DROP and SHOW CHANGE STREAM(S).

A change stream names the tables whose changes it reports (``FOR t, u``, ``FOR ALL``
tables, those created later too, or none; a table may carry a column list,
:mod:`.watch_list`), the shape of its records (``value_capture_type``), the mod types it
leaves out (``exclude_insert``, ``exclude_update``, ``exclude_delete``; and
``exclude_ttl_deletes``, accepted as in Spanner but a no-op: nothing here deletes by a
time to live) and how long they stay readable (``retention_period``). Its records are
read through ``READ_<name>(...)``; the stream itself holds no data.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from catalog import EXCLUDE_OPTIONS, ChangeStreamRecord, did_you_mean, full_name
from catalog.base import ObjectAlreadyExistsError
from flush.commit_clock import clock
from flush.spark_tables import rows_frame
from flush.table_locks import table_lock
from ingest_sdk.durations import DURATION_FORMS, read_duration
from ingest_sdk.schema import check_object_name
from pipelines.change_streams.history import alter
from pipelines.change_streams.partitions import merge, split
from pipelines.change_streams.watch_list import read_watched, watched_text
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.ddl_common import (
    drop_named,
    in_scope,
    like,
    literal,
    reserved,
    status_frame,
    utc,
)
from pipelines.sql.statements import OPTION, Statement

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = [
    "CAPTURE_TYPES", "DEFAULT_RETENTION_S", "HANDLERS", "exclusion_flags", "retention_text",
    "watched_names",
]  # fmt: skip

CAPTURE_TYPES = ("OLD_AND_NEW_VALUES", "NEW_ROW", "NEW_VALUES", "NEW_ROW_AND_OLD_VALUES")
DEFAULT_CAPTURE = "OLD_AND_NEW_VALUES"
DEFAULT_RETENTION_S = 86_400
#: Retention bounds: a minute (short-lived test and staging streams) to 30 days.
MIN_RETENTION_S, MAX_RETENTION_S = 60, 30 * 86_400
#: The most partitions a change stream starts with (the service may split further).
MAX_PARTITIONS = 64
_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}


def retention_text(seconds: int) -> str:
    """A retention period as written in OPTIONS: in the largest whole unit."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


#: Every option OPTIONS takes (``partitions`` at CREATE only).
_OPTION_NAMES = ("value_capture_type", "retention_period", *EXCLUDE_OPTIONS, "partitions")


def _exclusions(found: dict[str, str]) -> dict[str, bool]:
    """The ``exclude_*`` options among ``found``, each TRUE or FALSE (unquoted)."""
    flags: dict[str, bool] = {}
    for key in EXCLUDE_OPTIONS:
        if key in found:
            value = found.pop(key)
            if value.upper() not in ("TRUE", "FALSE"):
                raise SqlError(f"{key} must be TRUE or FALSE, got {value[:40]!r}; write "
                               f"OPTIONS ({key} = TRUE)", "SQL_COMPILATION_ERROR")  # fmt: skip
            flags[key] = value.upper() == "TRUE"
    return flags


def _options(text: str | None) -> tuple[dict[str, str], dict[str, bool]]:
    """``OPTIONS (key = 'value', ...)``: known keys, valid values, each once; the
    ``exclude_*`` options apart, as booleans."""
    if text is None:
        return {}, {}
    found: dict[str, str] = {}
    rest = text
    for match in OPTION.finditer(text):
        rest = rest.replace(match.group(0), "", 1)
        key = match.group(1).lower()
        quoted = match.group(2).startswith("'")
        value = literal(match.group(2)) if quoted else match.group(2)
        if key not in _OPTION_NAMES:
            raise SqlError(
                f"unknown change stream option {key[:40]!r}; the options are "
                f"{', '.join(_OPTION_NAMES)} (at CREATE)", "SQL_COMPILATION_ERROR",
            )  # fmt: skip
        if key in EXCLUDE_OPTIONS and quoted:
            value = f"'{value}'"  # a string, not a boolean: refused by _exclusions
        if key in found:
            raise SqlError(f"the option {key} is given twice", "SQL_COMPILATION_ERROR")
        found[key] = value
    if rest.replace(",", "").strip():
        raise SqlError(f"cannot read OPTIONS ({text.strip()[:80]}); write OPTIONS "
                       "(value_capture_type = 'NEW_ROW', retention_period = '7d')",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    capture = found.get("value_capture_type")
    if capture is not None and capture.upper() not in CAPTURE_TYPES:
        raise SqlError(f"value_capture_type {capture[:40]!r} is not one of "
                       f"{', '.join(CAPTURE_TYPES)}", "SQL_COMPILATION_ERROR")  # fmt: skip
    if capture is not None:
        found["value_capture_type"] = capture.upper()
    if "retention_period" in found:
        found["retention_period"] = str(_retention(found["retention_period"]))
    if "partitions" in found and not (
        found["partitions"].isdigit() and 1 <= int(found["partitions"]) <= MAX_PARTITIONS
    ):
        raise SqlError(f"partitions must be a whole number from 1 to {MAX_PARTITIONS}, got "
                       f"{found['partitions'][:20]!r}", "SQL_COMPILATION_ERROR")  # fmt: skip
    return found, _exclusions(found)


def _retention(text: str) -> int:
    """``retention_period``'s seconds: a duration (``'7d'``, ``'36 hours'``) in whole
    seconds, from 1 minute to 30 days."""
    try:
        seconds = read_duration(text, "retention_period")
    except ValueError as exc:
        raise SqlError(f"{exc}; from 1 minute to 30 days", "SQL_COMPILATION_ERROR") from None
    if seconds.denominator != 1 or not MIN_RETENTION_S <= seconds <= MAX_RETENTION_S:
        raise SqlError(f"retention_period {text[:40]!r} must be a whole number of seconds from "
                       f"1 minute to 30 days ('90m', '36 hours', '7d'); a duration is "
                       f"{DURATION_FORMS}", "SQL_COMPILATION_ERROR")  # fmt: skip
    return int(seconds)


def _dynamic_locks(
    session: StatementContext, for_all: bool, table_ids: tuple[int, ...]
) -> contextlib.ExitStack:
    """The locks of the dynamic tables a stream is about to watch, taken in path order: a
    FULL refresh decides under its table's lock whether the table has followers (a change
    stream is one), so none can appear between that check and its commit."""
    catalog = session.catalog
    uris = sorted(
        info.uri
        for dt in catalog.list_dynamic_tables()
        if (for_all or dt.table_id in table_ids)
        and (info := catalog.get_table_by_id(dt.table_id)) is not None
    )
    stack = contextlib.ExitStack()
    try:
        for uri in uris:
            stack.enter_context(table_lock(uri))
    except BaseException:
        stack.close()
        raise
    return stack


def _find(session: StatementContext, name: str) -> ChangeStreamRecord:
    database, schema_name, short = session.qualify(name)
    found = session.catalog.get_change_stream(database, schema_name, short)
    if found is None:
        raise ObjectNotFoundError(
            f"change stream {full_name(database, schema_name, short)} does not exist"
            + did_you_mean(session.catalog, database, schema_name, short, ["change stream"])
        )
    return found


def create_change_stream(session: StatementContext, statement: Statement) -> DataFrame:
    parts = statement.parts
    database, schema_name, name = session.qualify(parts["name"] or "")
    check_object_name(name, "the change stream name")
    reserved(schema_name)
    if parts["replace"] and parts["if_not_exists"]:
        raise SqlError("OR REPLACE and IF NOT EXISTS cannot be used together",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    options, exclusions = _options(parts["options"])
    watched = read_watched(session, parts["target"])
    if parts["if_not_exists"] and session.catalog.get_change_stream(database, schema_name, name):
        return status_frame(session, f"{name} already exists, statement succeeded.")
    try:
        with _dynamic_locks(session, watched.for_all, watched.table_ids):
            session.catalog.create_change_stream(
                database, schema_name, name, for_all=watched.for_all,
                table_ids=watched.table_ids,
                value_capture_type=options.get("value_capture_type", DEFAULT_CAPTURE),
                retention_s=int(options.get("retention_period", DEFAULT_RETENTION_S)),
                created_us=clock(), replace=bool(parts["replace"]),
                partitions=int(options.get("partitions", 1)),
                column_lists=watched.column_lists, exclusions=exclusions,
            )  # fmt: skip
    except ObjectAlreadyExistsError as exc:
        raise SqlError(str(exc), "OBJECT_ALREADY_EXISTS") from None
    return status_frame(session, f"Change stream {name} successfully created.")


def alter_change_stream(session: StatementContext, statement: Statement) -> DataFrame:
    parts = statement.parts
    stream = _find(session, parts["name"] or "")
    if parts["drop_all"]:
        changed = alter(session.catalog, stream, for_all=False, table_ids=())
    elif parts["target"] is not None:
        watched = read_watched(session, parts["target"])
        with _dynamic_locks(session, watched.for_all, watched.table_ids):
            changed = alter(session.catalog, stream, for_all=watched.for_all,
                            table_ids=watched.table_ids,
                            column_lists=watched.column_lists)  # fmt: skip
    elif parts["split"] is not None:
        split(session.catalog, stream, parts["split"].strip("'").lower(),
              int(parts["parts"] or 2))  # fmt: skip
        changed = True
    elif parts["merge"] is not None:
        tokens = [t.strip().strip("'").lower() for t in parts["merge"].split(",")]
        merge(session.catalog, stream, tokens)
        changed = True
    else:
        options, exclusions = _options(parts["options"])
        if "partitions" in options:
            raise SqlError("partitions is set at CREATE only; split or merge partitions with "
                           "ALTER CHANGE STREAM ... SPLIT PARTITION / MERGE PARTITIONS",
                           "SQL_COMPILATION_ERROR")  # fmt: skip
        retention = options.get("retention_period")
        changed = alter(
            session.catalog, stream, value_capture_type=options.get("value_capture_type"),
            retention_s=int(retention) if retention is not None else None,
            exclusions=exclusions,
        )  # fmt: skip
    if not changed:  # dropped meanwhile
        raise ObjectNotFoundError(f"change stream {stream.full_name} does not exist")
    return status_frame(session, "Statement executed successfully.")


def drop_change_stream(session: StatementContext, statement: Statement) -> DataFrame:
    catalog = session.catalog
    return drop_named(session, statement, "change stream", catalog.get_change_stream,
                      lambda stream: catalog.drop_change_stream(stream.id))  # fmt: skip


_SHOW_SCHEMA = (
    "created_on TIMESTAMP, name STRING, database_name STRING, schema_name STRING, "
    "`for` STRING, value_capture_type STRING, retention_period STRING, "
    + ", ".join(f"{option} BOOLEAN" for option in EXCLUDE_OPTIONS)
)


def exclusion_flags(stream: ChangeStreamRecord) -> dict[str, bool]:
    """Every ``exclude_*`` option of the stream: as given, else false (the default)."""
    given = dict(stream.exclusions)
    return {option: given.get(option, False) for option in EXCLUDE_OPTIONS}


def watched_names(stream: ChangeStreamRecord, tables: dict[int, str]) -> str | list[str]:
    """What ``stream`` watches: ``"ALL"``, or the full names of its tables that exist
    (``tables``: id -> full name; a dropped table drops out)."""
    return "ALL" if stream.for_all else [tables[i] for i in stream.table_ids if i in tables]


def show_change_streams(session: StatementContext, statement: Statement) -> DataFrame:
    pattern, scope = like(statement.parts.get("like")), in_scope(session, statement)
    tables = {t.id: t.full_name for t in session.catalog.list_tables()}
    rows = []
    for stream in session.catalog.list_change_streams():
        if not pattern(stream.name) or not scope(stream.database, stream.schema_name):
            continue
        rows.append((utc(stream.created_at), stream.name, stream.database, stream.schema_name,
                     watched_text(stream, tables), stream.value_capture_type,
                     retention_text(stream.retention_s),
                     *exclusion_flags(stream).values()))  # fmt: skip
    return rows_frame(session.spark, rows, _SHOW_SCHEMA)


_PARTITIONS_SCHEMA = (
    "token STRING, parent_tokens STRING, key_range_start BIGINT, key_range_end BIGINT, "
    "start_timestamp TIMESTAMP, end_timestamp TIMESTAMP, state STRING"
)


def show_partitions(session: StatementContext, statement: Statement) -> DataFrame:
    """``SHOW CHANGE STREAM PARTITIONS cs``: the stream's partition tree, oldest first."""
    stream = _find(session, statement.parts["name"] or "")
    rows = [
        (p.token, ",".join(p.parents), p.lo, p.hi, utc(p.start_us / 1e6),
         utc(p.end_us / 1e6) if p.end_us is not None else None,
         "OPEN" if p.end_us is None else "ENDED")
        for p in session.catalog.list_partitions(stream.uid)
    ]  # fmt: skip
    return rows_frame(session.spark, rows, _PARTITIONS_SCHEMA)


HANDLERS: dict[str, Callable[[StatementContext, Statement], DataFrame]] = {
    "create_change_stream": create_change_stream,
    "alter_change_stream": alter_change_stream,
    "drop_change_stream": drop_change_stream,
    "show_change_streams": show_change_streams,
    "show_change_stream_partitions": show_partitions,
}
