"""Snowflake's ``VARCHAR`` without a length, where Spark's parser wants one.

In Snowflake ``VARCHAR`` (``CAST(x AS VARCHAR)``, ``x::VARCHAR``) is a string of the
largest length, which is Spark's ``STRING``; Spark's parser refuses the type without a
length (``DATATYPE_MISSING_SIZE``). Where the text alone says it is a type (after the
cast operator ``::``, in ``CAST(<name or number> AS VARCHAR)``) it is replaced by
``STRING `` (the same length, so every position found in the text before still holds);
elsewhere (a column or an alias may be named ``varchar``) the text is parsed by Spark,
and the type Spark's error points at is replaced and the text parsed again, at most
:data:`MAX_REPARSES` times. ``CHAR`` without a length is
left to Spark's error: it is ``CHAR(1)`` in Snowflake, which Spark does not enforce in a
cast.
"""

from __future__ import annotations

import re
from typing import Any

from pipelines.sql.statements import LITERALS

__all__ = ["parse_plan_text"]

_MISSING_SIZE = "DATATYPE_MISSING_SIZE"
_VARCHAR = "VARCHAR"
_STRING = "STRING "  # as long as VARCHAR


def parse_plan_text(jspark: Any, text: str) -> tuple[Any, str]:
    """Spark's unresolved plan of ``text`` and the text it parsed: ``text`` with each
    ``VARCHAR`` type written without a length made ``STRING``.

    Raises:
        pyspark.errors.ParseException: Spark's error for anything else it cannot parse.
    """
    from pyspark.errors import ParseException

    parser = jspark.sessionState().sqlParser()
    text = _sure_types(text)
    for _ in range(MAX_REPARSES):
        try:
            return parser.parsePlan(text), text
        except ParseException as exc:
            start = _varchar_at(exc, text)
            if start is None:
                raise
            text = text[:start] + _STRING + text[start + len(_VARCHAR) :]
    return parser.parsePlan(text), text  # Spark's DATATYPE_MISSING_SIZE, if any remain


#: Parses of the whole text spent on VARCHARs the scan below cannot place: each costs a
#: full parse, so a statement of thousands would hold the worker; past these, Spark's
#: error (write VARCHAR(n) or STRING) stands.
MAX_REPARSES = 8
#: Forms whose VARCHAR is a type whatever surrounds them: after Spark's cast operator
#: ``::``, and ``CAST(<a name or number> AS VARCHAR)`` whole.
_SURE = re.compile(
    r"(?P<cast>::\s*)VARCHAR(?![\w$]|\s*\()"
    r"|(?P<call>(?<![\w$])(?:TRY_)?CAST\s*\(\s*[\w.$]+\s+AS\s+)VARCHAR(?=\s*\))",
    re.IGNORECASE | re.ASCII,
)


def _sure_types(text: str) -> str:
    """``text`` with the VARCHARs of :data:`_SURE`, outside strings, quoted names and
    comments, made STRING (one scan, no parse)."""
    out, position = [], 0
    for literal in (*LITERALS.finditer(text), None):
        end = literal.start() if literal is not None else len(text)
        out.append(_SURE.sub(lambda m: (m.group("cast") or m.group("call")) + _STRING,
                             text[position:end]))  # fmt: skip
        if literal is not None:
            out.append(literal.group(0))
            position = literal.end()
    return "".join(out)


def _varchar_at(exc: Any, text: str) -> int | None:
    """Where in ``text`` the VARCHAR without a length that ``exc`` is about starts."""
    if exc.getCondition() != _MISSING_SIZE:
        return None
    contexts = exc.getQueryContext()
    if len(contexts) != 1:
        return None
    # In code points, as Python counts (ANTLR's stream); the context's fragment() is cut
    # from the JVM string in UTF-16 units, off after a character outside the BMP.
    start = contexts[0].startIndex()
    if text[start : start + len(_VARCHAR)].upper() != _VARCHAR:
        return None
    return start

