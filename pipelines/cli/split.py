"""Statements out of a script: ``;`` ends one, except inside a comment (``--`` to the end
of the line, ``/* */``, nested as Spark reads them), a quoted string or name (``'...'``,
``"..."`` with backslash escapes, ``R'...'`` raw strings, `` `...` `` with a doubled
backtick) or a ``$$ ... $$`` body. A piece holding only comments and blanks is no
statement, so ``SELECT 1;  -- note`` is one statement, not two.

Cutting needs no grammar, only these tokens, so a script is checked whole before any of it
runs: an unterminated string, comment or body is an error naming where it began.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Split", "SplitError", "split", "split_all"]

#: What needs a look: everything else is copied in one step (linear on 1 MB scripts).
_SPECIAL = re.compile(r"--|/\*|\$\$|[;'\"`\n]|[rR](?=['\"])")
_WORD_CHAR = re.compile(r"\w")
_NAMES = {"'": "string", '"': "string", "`": "quoted name", "/*": "comment", "$$": "$$ body"}


class SplitError(ValueError):
    """Input that cannot be cut: something opened and never closed."""

    def __init__(self, what: str, text: str, at: int) -> None:
        line = text.count("\n", 0, at) + 1
        column = at - (text.rfind("\n", 0, at) + 1) + 1
        super().__init__(f"unterminated {what} starting at line {line}, column {column}: "
                         "nothing was run")  # fmt: skip
        self.position = at


@dataclass(frozen=True)
class Split:
    """The complete statements, the text after the last one, and what is still open at
    the end (``(kind, offset)``, or None) -- what a prompt needs to know to read on."""

    statements: list[str]
    rest: str
    open: tuple[str, int] | None


def _skip_quoted(text: str, at: int, quote: str, raw: bool) -> int:
    """The offset after the literal opened at ``at``, or -1 when it never closes."""
    i = at + 1
    while True:
        j = text.find(quote, i)
        if j < 0:
            return -1
        if quote != "`" and not raw:
            slash = j
            while slash > i and text[slash - 1] == "\\":
                slash -= 1
            if (j - slash) % 2:  # an odd run of backslashes escapes the quote
                i = j + 1
                continue
        if quote == "`" and text.startswith("``", j):  # doubled: one backtick
            i = j + 2
            continue
        return j + 1


def _skip_block_comment(text: str, at: int) -> int:
    depth, i = 0, at
    while True:
        opening, closing = text.find("/*", i), text.find("*/", i)
        if closing < 0:
            return -1
        if 0 <= opening < closing:
            depth, i = depth + 1, opening + 2
            continue
        depth, i = depth - 1, closing + 2
        if depth == 0:
            return i


def _skip(text: str, at: int, token: str) -> int:
    """Past the comment, literal or body ``token`` opens at ``at``; -1 if unterminated."""
    if token == "--":
        end = text.find("\n", at)
        return len(text) if end < 0 else end + 1
    if token == "/*":
        return _skip_block_comment(text, at)
    if token == "$$":
        end = text.find("$$", at + 2)
        return -1 if end < 0 else end + 2
    if token in "rR":  # R'...' is raw unless the R ends a longer word (a name)
        if at > 0 and _WORD_CHAR.match(text[at - 1]):
            return at + 1
        return _skip_quoted(text, at + 1, text[at + 1], raw=True)
    return _skip_quoted(text, at, token, raw=False)


class _Piece:
    """Where the code of the statement being read begins and ends (comments and blanks
    around it are left out)."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.last = 0

    def code(self, start: int, end: int) -> None:
        if self.first is None:
            self.first = start
        self.last = end

    def plain(self, text: str, start: int, end: int) -> None:
        segment = text[start:end]
        if segment.strip():
            lead = len(segment) - len(segment.lstrip())
            self.code(start + lead, start + len(segment.rstrip()))

    def take(self, text: str, into: list[str]) -> None:
        if self.first is not None:
            into.append(text[self.first : self.last])
        self.first, self.last = None, 0


def split(text: str, blank_line_ends: bool = False) -> Split:
    """Cut ``text`` at every ``;`` outside comments, literals and bodies (and, with
    ``blank_line_ends``, at a blank line outside them, as the prompt reads)."""
    statements: list[str] = []
    piece = _Piece()
    start = at = 0
    while True:
        match = _SPECIAL.search(text, at)
        where = len(text) if match is None else match.start()
        piece.plain(text, at, where)
        if match is None:
            rest = text[piece.first : piece.last] if piece.first is not None else ""
            return Split(statements, rest, None)
        token = match.group(0)
        if token == ";" or (token == "\n" and blank_line_ends and _blank_before(text, where)):
            piece.take(text, statements)
            start = at = where + 1
            continue
        if token == "\n":
            at = where + 1
            continue
        end = _skip(text, where, token)
        if end < 0:
            return Split(statements, text[start:], (_NAMES.get(token, "string"), where))
        if token not in ("--", "/*"):
            piece.code(where, end)
        at = max(end, match.end())


def _blank_before(text: str, newline: int) -> bool:
    """Whether the line that ``newline`` ends is blank (a blank line ends a statement)."""
    line_start = text.rfind("\n", 0, newline) + 1
    return line_start > 0 and not text[line_start:newline].strip()


def split_all(text: str, blank_line_ends: bool = False) -> list[str]:
    """Every statement of a whole script, the last one without ``;`` included.

    Raises:
        SplitError: a string, quoted name, comment or ``$$`` body is never closed.
    """
    cut = split(text, blank_line_ends)
    if cut.open is not None:
        raise SplitError(cut.open[0], text, cut.open[1])
    return [*cut.statements, cut.rest] if cut.rest else cut.statements
