"""The command line: ``python -m pipelines sql "statement"``, or a prompt without one.

Rows are printed as a table (``--format table``, the default), JSON lines or CSV. A SQL
mistake prints its code and message and exits 1 (the prompt carries on); the session
opens the same warehouse as the service (``--warehouse``, default ``$INGEST_WAREHOUSE``
or ``./warehouse``).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from typing import TYPE_CHECKING, TextIO

import orjson

from ingest_sdk.process_exit import run_entry_point
from pipelines.errors import SqlError, evaluation_errors

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.session import Session

PROMPT = "sql> "
MAX_ROWS = 10_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__)
    parser.add_argument(
        "--warehouse",
        default=os.environ.get("INGEST_WAREHOUSE", "warehouse"),
        help="the warehouse folder (default $INGEST_WAREHOUSE or ./warehouse)",
    )
    parser.add_argument("--database", default="DB", help="default database (default DB)")
    parser.add_argument("--schema", default="PUBLIC", help="default schema (default PUBLIC)")
    parser.add_argument(
        "--format", choices=("table", "json", "csv"), default="table", help="how rows print"
    )
    parser.add_argument(
        "--max-rows", type=int, default=MAX_ROWS, help=f"rows printed at most (default {MAX_ROWS})"
    )
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser("sql", help="run one statement and exit")
    run.add_argument("statement", help="one SQL statement")
    return parser.parse_args(argv)


def _value(value: object) -> str:
    return "NULL" if value is None else str(value)


def print_frame(frame: DataFrame, form: str, limit: int, out: TextIO) -> None:
    """Print a result's rows (at most ``limit``; a line says when more were left out)."""
    names = frame.columns
    fetched = [tuple(row) for row in frame.limit(limit + 1).collect()]
    shown = fetched[:limit]
    if form == "json":
        for row in shown:
            out.write(orjson.dumps(dict(zip(names, row, strict=True)), default=str).decode())
            out.write("\n")
    elif form == "csv":
        writer = csv.writer(out)
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


def run_one(session: Session, statement: str, args: argparse.Namespace) -> int:
    try:
        with evaluation_errors():
            print_frame(session.sql(statement), args.format, args.max_rows, sys.stdout)
    except SqlError as exc:
        print(f"error {exc.code}: {exc}", file=sys.stderr)
        return 1
    return 0


def prompt(session: Session, args: argparse.Namespace) -> int:
    """Read statements (ending with ``;`` or a blank line) until EOF or ``quit``."""
    lines: list[str] = []
    while True:
        try:
            line = input(PROMPT if not lines else "...> ")
        except EOFError:
            return 0
        if not lines and line.strip().lower() in ("quit", "exit", r"\q"):
            return 0
        lines.append(line)
        text = "\n".join(lines).strip()
        if text and (text.endswith(";") or not line.strip()):
            run_one(session, text.rstrip(";"), args)
            lines = []


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pipelines.session import Session

    with Session(args.warehouse, database=args.database, schema=args.schema) as session:
        session.spark.sparkContext.setLogLevel("ERROR")
        if args.command == "sql":
            return run_one(session, args.statement, args)
        return prompt(session, args)


if __name__ == "__main__":
    run_entry_point(main)
