"""Spark's special datetime values: ``'now'``, ``'today'``, ``'yesterday'`` and
``'tomorrow'`` (optionally followed by a time zone) in a typed literal
(``TIMESTAMP'now'``, ``DATE 'today'``) or in a cast of a constant string to a date or a
timestamp, written (``CAST('now' AS TIMESTAMP)``) or implied (``d = 'today'`` over a
DATE column). Spark replaces them by the time it parses or analyses the statement, so
the plan holds a constant: a query with one gives other rows at every refresh, as
``current_timestamp()`` does, but no function in its plan says so. ``'epoch'`` is
constant and not one of them.

A typed literal is gone from the plan once parsed, so it is found in the text (by
sqlglot's tokens: comments and quoting as Spark reads them); a cast is found in the
analyzed plan (its constant string evaluated). The functions of the current time
(:data:`TIME_FUNCTIONS`) are named here too, for the two readers of a plan that refuse
what depends on the time (dynamic tables' classifier, streams on views).
"""

from __future__ import annotations

import itertools
from typing import Any

from sqlglot.dialects.spark import Spark
from sqlglot.errors import TokenError
from sqlglot.tokens import TokenType

__all__ = ["TIME_FUNCTIONS", "special_cast", "special_literals"]

#: Expressions of the current time (by class): deterministic within one query, so Spark
#: reports them deterministic and folds them, but different at every refresh.
TIME_FUNCTIONS = frozenset({"CurrentTimestamp", "Now", "CurrentDate", "CurrentTime",
                            "LocalTimestamp", "CurrentTimeZone"})  # fmt: skip

_SPECIAL = frozenset({"now", "today", "yesterday", "tomorrow"})
#: The tokens of the type names a typed datetime literal starts with.
_DATETIME_TYPES = frozenset({TokenType.DATE, TokenType.TIMESTAMP, TokenType.TIMESTAMPTZ,
                             TokenType.TIMESTAMPLTZ, TokenType.TIMESTAMPNTZ,
                             TokenType.DATETIME})  # fmt: skip
_DATETIME_CLASSES = frozenset({"DateType$", "TimestampType$", "TimestampNTZType$", "DateType",
                               "TimestampType", "TimestampNTZType"})  # fmt: skip


def _special(value: str) -> bool:
    """Whether Spark reads the string as a special value (its first word, any case)."""
    words = value.strip().split(" ", 1)
    return words[0].lower() in _SPECIAL


def special_literals(text: str) -> list[str]:
    """The typed datetime literals of ``text`` that hold a special value, as written
    (type and string); a text the tokenizer cannot read gives none (Spark's parser
    then refuses it)."""
    try:
        tokens = Spark().tokenize(text)
    except TokenError:
        return []
    return [f"{kind.text.upper()} '{value.text}'" for kind, value in itertools.pairwise(tokens)
            if kind.token_type in _DATETIME_TYPES and value.token_type == TokenType.STRING
            and _special(value.text)]  # fmt: skip


def special_cast(node: Any) -> str | None:
    """For a ``Cast`` of the analyzed plan: ``CAST('now' AS TIMESTAMP)`` (its string and
    type) when it casts a constant string holding a special value to a date or a
    timestamp; None otherwise."""
    target = node.dataType()
    if target.getClass().getSimpleName() not in _DATETIME_CLASSES:
        return None
    child = node.child()
    if not child.foldable() or not str(child.dataType().typeName()).startswith("string"):
        return None  # (a collated string's type name is "string collate ...")
    value = child.eval(None)
    if value is None or not _special(str(value.toString())):
        return None
    return f"CAST('{value.toString()}' AS {target.sql()})"
