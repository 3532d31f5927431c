"""Statements that are nearly one this system runs: the clause that is wrong, and its form.

:func:`pipelines.sql.statements.classify` asks :func:`near_miss` before it answers
UNSUPPORTED_STATEMENT with the list of every statement: a text whose header is
recognisably ``CREATE [OR REPLACE] DYNAMIC TABLE`` or ``ALTER DYNAMIC TABLE`` but one of
whose clauses cannot be read gets an error naming that clause and its accepted form
(``TARGET_LAG = 5`` answers "TARGET_LAG must be a quoted duration such as '5 minutes', or
DOWNSTREAM"). Only texts no header matched come here, so a statement added to the headers
later is never diagnosed as a near miss. Every pattern is matched at a position and each
character has one place to go in it: hostile text costs time linear in its length.
"""

from __future__ import annotations

import re

from ingest_sdk.durations import DURATION_FORMS
from pipelines.errors import SqlError, UnsupportedStatementError
from pipelines.sql.statements import NAME

__all__ = ["LAG_FORM", "near_miss"]

#: The accepted form of TARGET_LAG, first in every error about it.
LAG_FORM = "TARGET_LAG must be a quoted duration such as '5 minutes', or DOWNSTREAM"
_CREATE_FORM = ("CREATE [OR REPLACE] DYNAMIC TABLE [IF NOT EXISTS] <name> TARGET_LAG = "
                "'<duration>' | DOWNSTREAM [KEY = value ...] AS <query>")  # fmt: skip
_ALTER_FORM = ("ALTER DYNAMIC TABLE [IF EXISTS] <name> REFRESH | SUSPEND | RESUME | "
               "SET TARGET_LAG = '<duration>' | DOWNSTREAM")  # fmt: skip
_FLAGS = re.IGNORECASE | re.ASCII | re.DOTALL
_CREATE = re.compile(
    r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?DYNAMIC\s+TABLE\b\s*(?:IF\s+NOT\s+EXISTS\b\s*)?", _FLAGS
)
_ALTER = re.compile(r"\s*ALTER\s+DYNAMIC\s+TABLE\b\s*(?:IF\s+EXISTS\b\s*)?", _FLAGS)
_NAME = re.compile(NAME)
_STRING = r"'(?:[^']|'')*'"
#: One well-formed option, as the CREATE header reads it.
_OPTION = re.compile(
    rf"(?:\s+|(?<=[\'\"]))[A-Za-z_]+\s*=\s*(?:{_STRING}|[A-Za-z_][A-Za-z0-9_$]*(?![\w$']))", _FLAGS
)
_AS = re.compile(r"(?:\s+|(?<=[\'\"]))AS(?=[\s(])\s*\S", _FLAGS)
_WORD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_$]*)?", _FLAGS)
_EQUALS = re.compile(r"\s*=\s*", _FLAGS)
_LAG_VALUE = re.compile(rf"(?:{_STRING}|[A-Za-z]+(?![\w$']))", _FLAGS)
_SET_LAG = re.compile(r"\s+SET\s+TARGET_LAG\b", _FLAGS)
#: What to write instead of an ALTER action we do not run, where there is an equivalent.
_INSTEAD = {
    # As in Snowflake, the refresh mode is chosen at creation only.
    "SET REFRESH_MODE": (", since the refresh mode is set when the table is created (as in "
                         "Snowflake); write CREATE OR REPLACE DYNAMIC TABLE <name> "
                         "TARGET_LAG = '...' REFRESH_MODE = <mode> AS <query>, which "
                         "refreshes it anew"),
    "RENAME TO": (", since a dynamic table keeps its name here; create one of the new name "
                  "with the same query (SHOW DYNAMIC TABLES shows its text), then DROP "
                  "DYNAMIC TABLE the old one"),
}


def near_miss(text: str) -> SqlError | None:
    """The error of a statement that is nearly a dynamic table statement, naming the
    clause that cannot be read (SQL_COMPILATION_ERROR; an ALTER action we do not run is
    UNSUPPORTED_STATEMENT, with the actions we do); None when ``text`` is not one, or no
    clause is to blame."""
    message: str | SqlError | None = _create(text)
    if message is None:
        message = _alter(text)
    if message is None:
        message = _show(text)
    if message is None:
        message = _change_stream(text)
    if isinstance(message, str):
        return SqlError(message, "SQL_COMPILATION_ERROR")
    return message


#: A SHOW of a listing with its IN scope written before its LIKE pattern.
_SHOW_IN_BEFORE_LIKE = re.compile(
    r"\s*SHOW\s+(?:TERSE\s+)?(?P<what>TABLES|STREAMS|VIEWS|DYNAMIC\s+TABLES|CHANGE\s+STREAMS)"
    r"\s+IN\s+.*?\bLIKE\s+'", _FLAGS)


def _show(text: str) -> str | None:
    found = _SHOW_IN_BEFORE_LIKE.match(text)
    if found is None:
        return None
    what = " ".join(found.group("what").upper().split())
    return (f"SHOW {what}: LIKE goes before IN, as in Snowflake: write SHOW {what} "
            "[LIKE '<pattern>'] [IN ACCOUNT | IN DATABASE [<db>] | IN [SCHEMA] [<db>.]<schema>]")


#: The start of a CREATE or ALTER CHANGE STREAM whose FOR clause or OPTIONS follow.
_CHANGE_STREAM = re.compile(
    rf"\s*(?:(?P<create>CREATE)\s+(?:OR\s+REPLACE\s+)?|ALTER\s+)CHANGE\s+STREAM\s+"
    rf"(?:IF\s+NOT\s+EXISTS\s+)?{NAME}(?:\s+SET)?\s+(?P<clause>FOR|OPTIONS)\b", _FLAGS
)
_FOR_FORM = "FOR ALL, or FOR <table>[(<column>, ...)] [, <table>[(<column>, ...)] ...]"
#: Parentheses, and what they cannot be counted in: quoted names and strings.
_PARENTHESES = re.compile(r"\"(?:[^\"]|\"\")*\"?|'(?:[^']|'')*'?|[()]")


def _change_stream(text: str) -> str | None:
    """A change stream's FOR clause (or OPTIONS) that cannot be read: a parenthesis
    never closed or closing nothing, or a list of the wrong form."""
    head = _CHANGE_STREAM.match(text)
    if head is None:
        return None
    opened: list[int] = []
    for token in _PARENTHESES.finditer(text, head.start("clause")):
        if token.group(0) == "(":
            opened.append(token.start())
        elif token.group(0) == ")" and not opened:
            return (f"a ')' at {_shown(text, token.start())!r} closes no parenthesis; a column "
                    f"list is written {_FOR_FORM}")  # fmt: skip
        elif token.group(0) == ")":
            opened.pop()
    if opened:
        before = text[: opened[0]].split()
        near = (before[-1] if before else "")[-40:] + text[opened[0] : opened[0] + 20]
        return (f"the parenthesis opened at {near!r} is never closed; end it with ')': a "
                f"column list is written {_FOR_FORM}, options OPTIONS (<option> = <value>, "
                "...)")  # fmt: skip
    if head.group("clause").upper() == "FOR":
        return (f"cannot read what the change stream watches from "
                f"{_shown(text, head.end())!r} on; write {_FOR_FORM} [OPTIONS (...)]")
    return None


def _create(text: str) -> str | None:
    head = _CREATE.match(text)
    if head is None:
        return None
    name = _NAME.match(text, head.end())
    if name is None:
        return f"CREATE DYNAMIC TABLE needs a table name; write {_CREATE_FORM}"
    position = name.end()
    while (option := _OPTION.match(text, position)) is not None:
        position = option.end()
    if _AS.match(text, position):
        return None  # the clauses read: what is wrong lies elsewhere
    word = _WORD.match(text, position)
    key = (word.group(1) or "").upper() if word else ""
    after = word.end() if word else position
    if key == "TARGET_LAG":
        return _lag(text, after) or _unread(text, after, _CREATE_FORM)
    if key in ("SELECT", "WITH", "VALUES", "FROM"):
        return f"CREATE DYNAMIC TABLE needs AS before its query; write {_CREATE_FORM}"
    if key == "AS":
        return f"CREATE DYNAMIC TABLE needs a query after AS; write {_CREATE_FORM}"
    equals = _EQUALS.match(text, after) if key else None
    if equals is not None:
        if _opens_quote(text, equals.end()):
            return f"the quoted value of {key} is never closed; end it with a quote (')"
        return (
            f"{key} = {_shown(text, equals.end())} cannot be read: an option's value is "
            "a quoted string or a word (TARGET_LAG = '5 minutes', REFRESH_MODE = FULL); "
            f"write {_CREATE_FORM}"
        )
    return _unread(text, position, _CREATE_FORM)


def _alter(text: str) -> str | SqlError | None:
    head = _ALTER.match(text)
    if head is None:
        return None
    name = _NAME.match(text, head.end())
    if name is None:
        return f"ALTER DYNAMIC TABLE needs a table name; write {_ALTER_FORM}"
    set_lag = _SET_LAG.match(text, name.end())
    if set_lag is None and text[name.end() :].strip().rstrip(";").strip():
        # An action we do not run (SET REFRESH_MODE, RENAME): unsupported, said shortly.
        action = " ".join(text[name.end() :].split()[:2])[:60]
        words = text[name.end() :].replace("=", " = ").split()[:2]
        instead = _INSTEAD.get(" ".join(words).upper(), "")
        return UnsupportedStatementError(f"ALTER DYNAMIC TABLE ... {action} is not supported"
                                         f"{instead}; write {_ALTER_FORM}")  # fmt: skip
    if set_lag is None:
        return _unread(text, name.end(), _ALTER_FORM)
    wrong = _lag(text, set_lag.end())
    if wrong is not None:
        return wrong
    equals = _EQUALS.match(text, set_lag.end())
    value = _LAG_VALUE.match(text, equals.end()) if equals is not None else None
    return _unread(text, value.end() if value is not None else set_lag.end(), _ALTER_FORM)


def _lag(text: str, position: int) -> str | None:
    """What is wrong with ``= value`` after TARGET_LAG at ``position`` (None: nothing)."""
    equals = _EQUALS.match(text, position)
    if equals is None:
        return "TARGET_LAG needs '=': write TARGET_LAG = '5 minutes' or TARGET_LAG = DOWNSTREAM"
    if _LAG_VALUE.match(text, equals.end()) is not None:
        return None
    if _opens_quote(text, equals.end()):
        return f"the quoted value of TARGET_LAG is never closed: {LAG_FORM}"
    return f"{LAG_FORM}, got {_shown(text, equals.end())}; a duration is {DURATION_FORMS}"


def _opens_quote(text: str, position: int) -> bool:
    return text[position : position + 1] == "'"


def _unread(text: str, position: int, form: str) -> str:
    """The statement cannot be read from ``position`` on."""
    rest = text[position:].strip().rstrip(";").strip()
    if not rest:
        return f"the statement ends too soon; write {form}"
    return f"cannot read the statement from {_shown(text, position)!r} on; write {form}"


def _shown(text: str, position: int) -> str:
    """The text at ``position`` up to its first space (40 characters at most), for a
    message."""
    rest = text[position:].strip()
    if not rest:
        return "nothing"
    first = rest.split(maxsplit=1)[0]
    return first if len(first) <= 40 else first[:40] + "..."
