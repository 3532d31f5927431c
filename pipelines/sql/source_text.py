"""A statement's own text, and edits spliced into it at the places a parser reports.

Spark runs the text the user wrote. What the product must change in it (a table's name
becomes the view of what the transaction sees, a clause of ours becomes its answer) is
replaced at its exact character positions, and every other character is kept, so no
parser's regeneration of the text can change what a statement means.

Two readers report positions. Spark's own parser reads plain queries
(:mod:`pipelines.sql.spark_reading`). sqlglot reads what Spark's grammar lacks: the
structure of Snowflake's DML (``UPDATE ... FROM``, ``DELETE ... USING``) and our clauses
(``AT``/``BEFORE``, ``CHANGES``, ``SYSTEM$STREAM_HAS_DATA``, ``READ_<name>(...)``,
``TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...))``). :func:`parse_with_spans` records, for every
node of sqlglot's tree, the characters it was read from.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable
from typing import Any

from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

from pipelines.errors import SqlError
from pipelines.sql.statements import LITERALS

__all__ = [
    "Splice", "blanked", "check_one_statement", "extent", "has_extensions", "parse_with_spans",
    "quoted_names", "span", "writes_watermark",
]  # fmt: skip

_SPAN = "span"


class Splice:
    """A text and the replacements of some of its character ranges (never overlapping)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._edits: list[tuple[int, int, str]] = []

    def replace(self, start: int, end: int, text: str) -> None:
        """Replace ``self.text[start:end]`` by ``text`` (``start == end``: insert)."""
        for other_start, other_end, _ in self._edits:
            if start < other_end and other_start < end:
                raise SqlError("two parts of the statement overlap where the binder replaces "
                               "them; simplify the statement", "SQL_COMPILATION_ERROR")  # fmt: skip
        self._edits.append((start, end, text))

    def render(self) -> str:
        """The text with the replacements made."""
        out, position = [], 0
        for edit_start, edit_end, text in sorted(self._edits):
            out.append(self.text[position:edit_start])
            out.append(text)
            position = edit_end
        out.append(self.text[position:])
        return "".join(out)


def _spanning(method: Callable[..., Any]) -> Callable[..., Any]:
    """Record on the node a parse method returns the tokens it consumed, widened to the
    widest of every method that returned it (an outer method often consumed the keyword
    that introduced it: ``CASE``, a table's qualifier)."""

    @functools.wraps(method)
    def parse(self: Any, *args: Any, **kwargs: Any) -> Any:
        first = self._index
        node = method(self, *args, **kwargs)
        if isinstance(node, exp.Expression) and self._index > first:
            start = self._tokens[first].start
            end = self._tokens[self._index - 1].end + 1
            known = node.meta.get(_SPAN)
            if known is not None:
                start, end = min(start, known[0]), max(end, known[1])
            node.meta[_SPAN] = (start, end)
        return node

    return parse


class _SpanningParser(Spark.Parser):  # type: ignore[misc,name-defined]
    def _parse_csv(self, parse_method: Callable[[], Any], sep: Any = TokenType.COMMA) -> Any:
        """A ``SET`` list (UPDATE's, MERGE's) as Spark reads it: ``column = <expression>``
        each (sqlglot reads ``SET v = a OR b`` as ``(v = a)`` and stops, and ``SET v = a
        = b`` as ``(v = a) = b``)."""
        if self._prev is not None and self._prev.token_type == TokenType.SET:
            parse_method = self._parse_spark_assignment
        return super()._parse_csv(parse_method, sep)

    def _parse_spark_assignment(self) -> exp.Expression | None:
        column = self._parse_column()
        if column is None or not self._match(TokenType.EQ):
            self.raise_error("Expected SET column = value")
        return self.expression(exp.EQ, this=column, expression=self._parse_disjunction())


for _name in dir(Spark.Parser):
    if _name.startswith("_parse") and callable(getattr(Spark.Parser, _name)):
        method = vars(_SpanningParser).get(_name) or getattr(Spark.Parser, _name)
        setattr(_SpanningParser, _name, _spanning(method))
_SpanningParser._parse_spark_assignment = _spanning(  # type: ignore[method-assign]
    _SpanningParser._parse_spark_assignment
)

#: Spark's spellings sqlglot cannot read, outside literals and comments: ``a >>> b`` (an
#: unsigned shift) and ``v:path`` (a VARIANT's path; not ``::``, nor inside a type:
#: ``STRUCT<name: TYPE>``, ``ARRAY<ARRAY<ARRAY<INT>>>``). sqlglot reads a stand-in of the
#: same length with the same structure (``a >>  b``, ``v.path``, ``v [0]``), so every
#: position it reports is the position in the text as written, which is what is carried.
_UNREADABLE = re.compile(r"(?P<shift>>>>)|(?<!:):(?![:=])(?P<bracket>\s*\[)?")
_TYPE = re.compile(r"\b(?:STRUCT|ARRAY|MAP)\s*<", re.I)
_ANGLES = re.compile(r"[<>]")


def blanked(text: str) -> str:
    """``text`` with its literals, quoted names and comments made spaces, every other
    character in its place."""
    return LITERALS.sub(lambda m: " " * len(m.group(0)), text)


def readable(text: str) -> str:
    """``text`` as sqlglot can read it, every character in its place (:data:`_UNREADABLE`)."""
    code = blanked(text)
    types = _types(code)  # in order, apart
    starts = [start for start, _ in types]
    out, position = [], 0
    for match in _UNREADABLE.finditer(code):
        inside = bisect.bisect_right(starts, match.start()) - 1
        if inside >= 0 and match.start() < types[inside][1]:
            continue
        bracket = match.group("bracket")
        stand_in = ">> " if match.group("shift") else f" {bracket}" if bracket else "."
        out += [text[position : match.start()], stand_in]
        position = match.end()
    out.append(text[position:])
    return "".join(out)


def _types(code: str) -> list[tuple[int, int]]:
    """Where the text writes a ``STRUCT<...>``, ``ARRAY<...>`` or ``MAP<...>`` type."""
    found: list[tuple[int, int]] = []
    for struct in _TYPE.finditer(code):
        if found and struct.start() < found[-1][1]:
            continue  # inside the one before
        depth, end = 0, len(code)
        for angle in _ANGLES.finditer(code, struct.end() - 1):
            depth += 1 if angle.group(0) == "<" else -1
            if depth == 0:
                end = angle.end()
                break
        found.append((struct.start(), end))
    return found


_DIALECT = Spark()


def parse_with_spans(text: str) -> exp.Expression:
    """One statement as sqlglot's Spark dialect reads it, each node knowing its span.

    Raises:
        SqlError: a syntax error (SQL_COMPILATION_ERROR), or not exactly one statement.
    """
    try:
        tokens = _DIALECT.tokenize(readable(text))
        trees = _SpanningParser(dialect=_DIALECT).parse(tokens, text)
    except SqlglotError as exc:
        raise SqlError(syntax_error(exc), "SQL_COMPILATION_ERROR") from None
    except RecursionError:
        raise SqlError("the statement is too complex to read; split it or flatten it",
                       "STATEMENT_TOO_COMPLEX") from None  # fmt: skip
    found = [t for t in trees if t is not None]
    if len(found) != 1:
        raise SqlError(f"expected one statement, got {len(found)}; send statements one at a "
                       "time", "SQL_COMPILATION_ERROR")  # fmt: skip
    return found[0]


def syntax_error(exc: Exception) -> str:
    """A parser's error in plain words: what was expected, where, and the text there (no
    parser class names, no terminal escape codes)."""
    errors = getattr(exc, "errors", None) or []
    if not errors:
        return "syntax error: the statement cannot be read; check it against the SQL reference"
    first = errors[0]
    near = _PRINTABLE.sub("", f"{first.get('start_context') or ''}{first.get('highlight') or ''}")
    description = _PRINTABLE.sub("", str(first.get("description") or "unexpected text"))
    description = _PARSER_CLASS.sub("this expression", description)
    return (
        f"syntax error at line {first.get('line')}, column {first.get('col')}: "
        f"{description[:200]} (near {near[-60:]!r})"
    )


_PARSER_CLASS = re.compile(r"<class '[\w.]+'>")
_PRINTABLE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def span(node: exp.Expression) -> tuple[int, int]:
    """The characters ``node`` was read from, ``[start, end)``.

    Raises:
        SqlError: the parser did not report them: the statement is refused rather than
            carried inexactly.
    """
    found = node.meta.get(_SPAN)
    if found is None:
        raise SqlError(f"cannot carry {type(node).__name__} {node.sql('spark')[:60]!r} exactly "
                       "as written; rewrite that part of the statement",
                       "SQL_COMPILATION_ERROR")  # fmt: skip
    return found  # type: ignore[no-any-return]


def extent(node: exp.Expression) -> tuple[int, int]:
    """The characters of ``node`` and everything read as part of it, ``[start, end)``
    (an argument list, joins attached to a table).

    Raises:
        SqlError: no part of it has a known span (see :func:`span`).
    """
    spans = [n.meta[_SPAN] for n in node.walk() if _SPAN in n.meta]
    if not spans:
        span(node)  # raises, naming the node
    return min(s for s, _ in spans), max(e for _, e in spans)


#: One of our clauses or functions where a ``(`` follows: AT/BEFORE/CHANGES (unquoted),
#: our functions, a change stream's READ_<name> (quoted or not); or a time travel.
_OURS = re.compile(
    r"(?<![\w$`])(?:AT|BEFORE|CHANGES)\s*\("
    r"|`(?:SYSTEM\$STREAM_HAS_DATA|DYNAMIC_TABLE(?:_(?:REFRESH|GRAPH)_HISTORY|S)|READ_(?:[^`]|``)*)`\s*\("
    r"|(?<![\w$`])(?:SYSTEM\$STREAM_HAS_DATA|DYNAMIC_TABLE(?:_(?:REFRESH|GRAPH)_HISTORY|S)|READ_[\w$]*)\s*\("
    r"|\bAS\s+OF\b"
    # TABLE(<name>) without a call: a built-in's name written without its parentheses is
    # answered with its form, not with Spark's unresolved column.
    r"|(?<![\w$`])TABLE\s*\((?=[\w$`.\s]*\))",
    re.I,
)


def _code(text: str) -> tuple[str, list[str]]:
    """The text with its string literals and comments blanked, and the names it writes in
    backquotes (one linear pass: a hostile megabyte costs milliseconds)."""
    out, names, position = [], [], 0
    for literal in LITERALS.finditer(text):
        token = literal.group(0)
        out.append(text[position : literal.start()])
        if token.startswith("`"):
            out.append(token)
            if len(token) > 1 and token.endswith("`"):
                names.append(token[1:-1].replace("``", "`"))
        else:
            out.append(" ")
        position = literal.end()
    out.append(text[position:])
    return "".join(out), names


def has_extensions(text: str) -> bool:
    """Whether the text holds one of our clauses or functions (outside strings and
    comments), or a time travel (``VERSION AS OF``): only then is sqlglot's reading of a
    query needed."""
    return _OURS.search(_code(text)[0]) is not None


def writes_watermark(text: str) -> bool:
    """Whether the text holds a ``WATERMARK`` clause (outside strings and comments)."""
    return re.search(r"(?<![\w$`])WATERMARK\s", _code(text)[0], re.I) is not None


def check_one_statement(text: str) -> None:
    """Refuse a text of several statements (a ``;`` between two).

    Raises:
        SqlError: naming how many there are.
    """
    count = sum(1 for part in _code(text)[0].split(";") if part.strip())
    if count > 1:
        raise SqlError(f"expected one statement, got {count}; send statements one at a time",
                       "SQL_COMPILATION_ERROR")  # fmt: skip


def quoted_names(text: str) -> set[str]:
    """The identifiers the text writes in backquotes (a result column so named keeps its
    case)."""
    return set(_code(text)[1])
