"""Rows and errors as the command prints them.

CSV follows RFC 4180 (fields with a comma, quote or line break quoted, quotes doubled)
except that lines end with LF, not CRLF: the output is read by Unix tools and scripts
(``diff``, ``grep``, ``wc -l``), where a CR would stick to the last field.
"""

from __future__ import annotations

import csv
import sys
from typing import Any, Protocol, TextIO

import orjson

from pipelines.errors import SqlError

__all__ = ["Rows", "Runner", "print_rows", "report", "short"]

Rows = tuple[list[str], list[tuple[Any, ...]]]

#: An error message longer than this prints cut (``--verbose`` prints it whole).
SHORT_CHARS = 300


class Runner(Protocol):
    """Where statements run: a local Spark session, or the service."""

    #: Named in "does not exist" errors: which warehouse the statement looked in.
    where: str

    def rows(self, statement: str, limit: int) -> Rows:
        """The statement's column names and at most ``limit`` rows (raises SqlError)."""
        ...

    def close(self) -> None: ...


def _value(value: object) -> str:
    return "NULL" if value is None else str(value)


def print_rows(names: list[str], fetched: list[tuple[Any, ...]], form: str, limit: int,
               out: TextIO) -> None:  # fmt: skip
    """Print a result's rows (at most ``limit`` of ``fetched``; a line says when more were
    left out, which the caller shows by fetching ``limit + 1``)."""
    shown = fetched[:limit]
    if form == "json":
        for row in shown:
            out.write(orjson.dumps(dict(zip(names, row, strict=True)), default=str).decode())
            out.write("\n")
    elif form == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows([_value(v) for v in values] for values in shown)
    else:
        cells = [[_value(v) for v in row] for row in shown]
        widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
        out.write(" | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)) + "\n")
        out.write("-+-".join("-" * w for w in widths) + "\n")
        for line in cells:
            out.write(" | ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)) + "\n")
        out.write(f"({len(shown)} row{'s' if len(shown) != 1 else ''})\n")
    if len(fetched) > limit:
        out.write(f"... more rows left out (--max-rows {limit})\n")


def short(message: str) -> str:
    """The cause of an error on a line or two: the first line, without the list of every
    supported statement, cut at :data:`SHORT_CHARS`, and a hint when anything was left."""
    first = message.strip().split("\n", 1)[0]
    first = first.split("; supported: ", 1)[0]
    if len(first) > SHORT_CHARS:
        first = first[: SHORT_CHARS - 3].rstrip() + "..."
    if first == message:
        return message
    return f"{first} (--verbose prints the whole message)"


def report(runner: Runner, exc: SqlError, verbose: bool = False) -> None:
    """``error CODE: message`` on stderr; a "does not exist" names the warehouse looked in."""
    message = str(exc) if verbose else short(str(exc))
    if exc.code == "OBJECT_NOT_FOUND" or "does not exist" in message:
        message = f"{message} ({runner.where})"
    print(f"error {exc.code}: {message}", file=sys.stderr)
