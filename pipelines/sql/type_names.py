"""Snowflake's ``VARCHAR`` without a length, where Spark's parser wants one.

In Snowflake ``VARCHAR`` (``CAST(x AS VARCHAR)``, ``x::VARCHAR``) is a string of the
largest length, which is Spark's ``STRING``; Spark's parser refuses the type without a
length (``DATATYPE_MISSING_SIZE``). Rather than guess from the text where a type is (a
column or an alias may be named ``varchar``), the text is parsed by Spark, and each type
Spark's error points at is replaced by ``STRING `` (the same length, so every position
found in the text before still holds) and parsed again. ``CHAR`` without a length is
left to Spark's error: it is ``CHAR(1)`` in Snowflake, which Spark does not enforce in a
cast.
"""

from __future__ import annotations

from typing import Any

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
    for _ in range(text.upper().count(_VARCHAR) + 1):
        try:
            return parser.parsePlan(text), text
        except ParseException as exc:
            start = _varchar_at(exc, text)
            if start is None:
                raise
            text = text[:start] + _STRING + text[start + len(_VARCHAR) :]
    return parser.parsePlan(text), text  # (unreachable: each pass removes one VARCHAR)


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

