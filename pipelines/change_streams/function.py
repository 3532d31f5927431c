"""``READ_<name>(...)``: a change stream's read function in a SQL query.

The binder hands every table-valued call of a query here (through the session's
``table_function``); the call becomes a view of one column, ``ChangeRecord``, holding
each record as JSON text, which the query may filter and project like any table
(``get_json_object(ChangeRecord, '$.data_change_record.mod_type')``). Arguments are
named (``start_timestamp => '...'``) or positional in the reference's order, with an
optional fifth ``NULL`` (reserved); timestamps are text or ``TIMESTAMP '...'``.

A query returns a result, so in SQL a read is bounded: with ``end_timestamp`` NULL it
reads up to the moment the statement started and ends with a heartbeat at that
moment. The HTTP route and the SDK hold a read open instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
from sqlglot import exp

from catalog import did_you_mean, full_name
from flush.commit_clock import clock
from flush.spark_tables import rows_frame
from pipelines.change_streams.read import ARGUMENTS, read, read_args
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.binding import function_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["PREFIX", "read_frame"]

PREFIX = "READ_"
#: A read in SQL returns at most this many records (a longer range: read it in parts,
#: or over HTTP).
MAX_RECORDS = 100_000


def _value(name: str, node: exp.Expression) -> Any:
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Literal):
        return node.name if node.is_string else node.to_py()
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string:
        return node.this.name  # TIMESTAMP '...' (timestamps without an offset are UTC)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal):
        return f"-{node.this.name}"
    raise SqlError(f"{name} must be a literal (text, a number, TIMESTAMP '...' or NULL), "
                   f"not {node.sql()[:60]!r}", "INVALID_ARGUMENT")  # fmt: skip


def _arguments(call: exp.Anonymous) -> dict[str, Any]:
    values: dict[str, Any] = {}
    positional = [a for a in call.expressions if not isinstance(a, exp.Kwarg)]
    named = [a for a in call.expressions if isinstance(a, exp.Kwarg)]
    if positional and named:
        raise SqlError("pass the arguments all by name (start_timestamp => ...) or all by "
                       "position, not both", "INVALID_ARGUMENT")  # fmt: skip
    if len(positional) > len(ARGUMENTS) + 1:
        raise SqlError(f"a read function takes at most {len(ARGUMENTS) + 1} arguments: "
                       f"{', '.join(ARGUMENTS)}, NULL", "INVALID_ARGUMENT")  # fmt: skip
    for name, node in zip((*ARGUMENTS, "read_options"), positional, strict=False):
        values[name] = _value(name, node)
    for kwarg in named:
        name = kwarg.this.name.lower()
        if name in values:
            raise SqlError(f"the argument {name[:40]} is given twice", "INVALID_ARGUMENT")
        values[name] = _value(name, kwarg.expression)
    return values


def read_frame(session: StatementContext, table: exp.Table, defaults: tuple[str, str]) -> DataFrame:
    """The records a ``READ_<name>(...)`` call in a query returns, as a DataFrame."""
    call = table.this
    assert isinstance(call, exp.Anonymous)
    function = function_name(call)
    quoted = isinstance(call.this, exp.Identifier) and call.this.quoted
    if not function.upper().startswith(PREFIX) or len(function) == len(PREFIX):
        raise SqlError(f"unknown table function {function[:60]!r}; a change stream is read "
                       "with READ_<change stream name>(start_timestamp => ..., "
                       "heartbeat_milliseconds => ...)", "SQL_COMPILATION_ERROR")  # fmt: skip
    name = function[len(PREFIX) :]
    name = name if quoted else name.upper()
    database = table.args["catalog"].name if table.args.get("catalog") else defaults[0]
    schema = table.args["db"].name if table.args.get("db") else defaults[1]
    stream = session.catalog.get_change_stream(database, schema, name)
    if stream is None:
        hint = did_you_mean(session.catalog, database, schema, name, ["change stream"])
        raise ObjectNotFoundError(
            f"change stream {full_name(database, schema, name)} does not exist{hint} (READ_<name> "
            "reads the change stream <name>; SHOW CHANGE STREAMS lists them)"
        )
    partitions = session.catalog.list_partitions(stream.uid)
    args = read_args(_arguments(call), stream, partitions)
    rows = []
    for record in read(session.catalog, stream, args, until_us=clock()):
        rows.append((orjson.dumps(record).decode(),))
        if len(rows) > MAX_RECORDS:
            raise SqlError(f"the read returns more than {MAX_RECORDS:,} records; give an "
                           "earlier end_timestamp, or read over HTTP "
                           "(GET /v1/change-streams/{name}/read)", "INVALID_ARGUMENT")  # fmt: skip
    return rows_frame(session.spark, rows, "ChangeRecord STRING")
