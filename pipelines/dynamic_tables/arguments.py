"""The named arguments of the dynamic-table functions (``NAME => 'DT'``, ``RESULT_LIMIT =>
10``...), read one way for all of them: ``DYNAMIC_TABLE_REFRESH_HISTORY``,
``DYNAMIC_TABLE_GRAPH_HISTORY`` and ``DYNAMIC_TABLES``.

An argument is a literal of its kind; anything else (an expression, another kind of
literal, a positional argument, an unknown or repeated name) is refused with a
``SQL_COMPILATION_ERROR`` naming the function, the argument and the form to write.
A function names the Snowflake arguments it cannot honour with the reason, so they are
refused by name rather than as unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlglot import exp

from catalog import TableInfo, did_you_mean, full_name
from ingest_sdk.errors import InvalidValueError
from ingest_sdk.temporal import moment_micros
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.statements import NAME, qualified, split_name

if TYPE_CHECKING:
    from pipelines.sql.context import StatementContext

__all__ = [
    "boolean",
    "dynamic_table",
    "limit",
    "named_arguments",
    "text",
    "timestamp_us",
]

_CODE = "SQL_COMPILATION_ERROR"
#: More digits than any limit has: refused before Python reads the number (its int() of
#: thousands of digits is slow, and refused past 4,300).
_MAX_DIGITS = 12


def named_arguments(
    call: exp.Anonymous, function: str, known: tuple[str, ...],
    refused: Mapping[str, str] | None = None,
) -> dict[str, exp.Expression]:  # fmt: skip
    """The call's arguments by upper-case name.

    Args:
        call: the function's call as sqlglot read it.
        function: its name, for messages.
        known: the arguments it takes.
        refused: arguments it cannot honour -> why, and what to write instead.

    Raises:
        SqlError: a positional argument, an argument refused, unknown or repeated.
    """
    found: dict[str, exp.Expression] = {}
    for argument in call.expressions:
        if not isinstance(argument, exp.Kwarg):
            example = f"{function}({known[0]} => ...)" if known else f"{function}()"
            raise SqlError(f"{function} takes named arguments ({', '.join(known) or 'none'}), "
                           f"e.g. {example}", _CODE)  # fmt: skip
        key = argument.this.name.upper()
        if refused and key in refused:
            raise SqlError(f"{function}: {key} is not supported: {refused[key]}", _CODE)
        if key not in known or key in found:
            what = "repeated" if key in found else "unknown"
            raise SqlError(f"{function}: {what} argument {key[:40]}; the arguments are "
                           f"{', '.join(known) or 'none'}", _CODE)  # fmt: skip
        found[key] = argument.expression
    return found


def text(value: exp.Expression, function: str, key: str) -> str:
    """A string argument's text."""
    if not (isinstance(value, exp.Literal) and value.is_string):
        raise SqlError(f"{function}: {key} takes a string, e.g. {key} => 'MY_DT'", _CODE)
    return value.name


def boolean(value: exp.Expression, function: str, key: str) -> bool:
    if not isinstance(value, exp.Boolean):
        raise SqlError(f"{function}: {key} takes TRUE or FALSE", _CODE)
    return bool(value.this)


def limit(value: exp.Expression, function: str, maximum: int) -> int:
    """``RESULT_LIMIT``: a whole number from 1 to ``maximum``."""
    digits = value.name if isinstance(value, exp.Literal) and value.is_int else ""
    if not (0 < len(digits) <= _MAX_DIGITS and 1 <= int(digits) <= maximum):
        raise SqlError(f"{function}: RESULT_LIMIT takes a whole number from 1 to "
                       f"{maximum:,} (write RESULT_LIMIT => {maximum} for every row)",
                       _CODE)  # fmt: skip
    return int(digits)


def timestamp_us(value: exp.Expression, function: str, key: str) -> int:
    """A moment written as a string (``'2026-12-01 10:00:00'``, UTC unless it has an
    offset), as ``AT(TIMESTAMP => ...)`` reads one; microseconds since the epoch."""
    written = value.name if isinstance(value, exp.Literal) and value.is_string else None
    try:
        micros = moment_micros(written) if written is not None else None
    except InvalidValueError:
        micros = None
    if micros is None:
        raise SqlError(f"{function}: {key} takes a timestamp as a string, e.g. {key} => "
                       "'2026-12-01 10:00:00' (UTC unless it has an offset); an expression "
                       "such as DATEADD(...) is not evaluated here: write the moment it "
                       "gives", _CODE)  # fmt: skip
    return micros


def dynamic_table(
    session: StatementContext, value: exp.Expression, function: str, defaults: tuple[str, str]
) -> TableInfo:
    """The dynamic table ``NAME => '[db.][schema.]name'`` names (missing parts from
    ``defaults``; double quotes inside the string keep case: ``'"My Dt"'``).

    Raises:
        SqlError: not a name.
        ObjectNotFoundError: no dynamic table of that name, with a near miss if any.
    """
    written = text(value, function, "NAME").strip()
    if re.fullmatch(NAME, written) is None:
        raise SqlError(f"{function}: {written[:80]!r} is not a name; write NAME, SCHEMA.NAME "
                       "or DB.SCHEMA.NAME (double quotes inside the string keep case: "
                       "'\"My Dt\"')", _CODE)  # fmt: skip
    names = qualified(split_name(written), *defaults)
    info = session.find_table(*names)
    if info is None or session.catalog.get_dynamic_table(info.id) is None:
        hint = did_you_mean(session.catalog, *names, ["dynamic table"])
        raise ObjectNotFoundError(f"dynamic table {full_name(*names)} does not exist{hint} "
                                  f"({function}'s NAME names one)")  # fmt: skip
    return info
