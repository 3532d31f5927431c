"""The command line: ``python -m pipelines sql "statement"``, or a prompt without one;
``python -m pipelines tail CS`` prints a change stream's records as they come.

Rows are printed as a table (``--format table``, the default), JSON lines or CSV. A SQL
mistake prints its code and message and exits 1 (the prompt carries on). Statements run
in a session on the warehouse (``--warehouse``, default ``$INGEST_WAREHOUSE`` or
``./warehouse``), which must already hold one (``--create`` makes one); or, with
``--url``, in the running service (``POST /v1/sql``), which answers without starting
Spark here (and this command imports neither Spark nor Arrow: it answers at once).
Input is cut into statements at ``;`` outside comments, quotes and ``$$`` bodies
(:mod:`pipelines.cli.split`); a script piped in is checked whole before any of it runs.

``tail`` reads every partition of a change stream, parents before children
(:class:`ingest_sdk.ChangeStreamReader` with a throwaway checkpoint), and prints each
data change record (with ``--heartbeats``, each heartbeat too) as one JSON line. It reads
the warehouse's catalog and tables in this process (no Spark), or, with ``--url``, the
service's ``GET /v1/change-streams/{name}/read``. Ctrl-C or SIGTERM ends it (status 0).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from pipelines.cli.output import Rows, Runner, print_rows, report
from pipelines.cli.split import SplitError, split, split_all
from pipelines.errors import ObjectNotFoundError, SqlError, evaluation_errors

if TYPE_CHECKING:
    from catalog import Catalog
    from ingest_sdk import IngestError
    from ingest_sdk.change_stream_reader import Query
    from pipelines.session import Session

PROMPT = "sql> "
MAX_ROWS = 10_000
DEFAULT_DATABASE, DEFAULT_SCHEMA = "DB", "PUBLIC"
_QUIT = ("quit", "exit", r"\q")
#: A warehouse's catalog file (``source_options.CATALOG_FILE``, not imported: that module
#: imports the catalog and the SDK, which ``--help`` and ``--url`` do without).
CATALOG_FILE = "catalog.sqlite"
#: Said once on stderr when statements run in a Spark session started here.
LOCAL_NOTE = ("note: starting Spark in this command takes seconds; a running service "
              "answers at once: --url http://host:port (make run starts one)")  # fmt: skip


class UsageError(Exception):
    """The command line cannot run as given (exit status 2, as argparse's own errors)."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _options(defaults: bool, output: bool = True) -> argparse.ArgumentParser:
    """The options, for the main parser and again for ``sql`` and ``tail`` (so they may
    follow them); ``output``: with those of printing rows (not ``tail``'s).

    The sub-commands' copies have no defaults (``SUPPRESS``): argparse copies a
    sub-parser's values over the main parser's, so a default there would undo an option
    given before the sub-command.
    """

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--warehouse",
        default=default(None),
        help="the warehouse folder (default $INGEST_WAREHOUSE or ./warehouse); it must hold "
        f"a warehouse ({CATALOG_FILE}) unless --create is given",
    )
    options.add_argument(
        "--catalog",
        default=default(None),
        help="the warehouse's catalog when it is not the folder's SQLite file: a file, or a "
        "PostgreSQL URL postgresql://user@host:port/database (default $INGEST_CATALOG)",
    )
    options.add_argument(
        "--database", default=default(DEFAULT_DATABASE), help="default database (default DB)"
    )
    options.add_argument(
        "--schema", default=default(DEFAULT_SCHEMA), help="default schema (default PUBLIC)"
    )
    options.add_argument(
        "--url",
        default=default(None),
        help="a running service (http://host:port): statements go to its POST /v1/sql "
        "instead of a Spark session here; tail reads its GET /v1/change-streams/{name}/read",
    )
    options.add_argument(
        "--token",
        default=default(None),
        help="with --url: the service's bearer token (default $INGEST_TOKEN)",
    )
    if not output:
        return options
    options.add_argument(
        "--create",
        action="store_true",
        default=default(False),
        help="create the warehouse if the folder holds none",
    )
    options.add_argument(
        "--format",
        choices=("table", "json", "csv"),
        default=default("table"),
        help="how rows print",
    )
    options.add_argument(
        "--max-rows",
        type=_positive,
        default=default(MAX_ROWS),
        help=f"rows printed at most (default {MAX_ROWS})",
    )
    options.add_argument(
        "--verbose",
        action="store_true",
        default=default(False),
        help="print errors whole (by default a line or two: the cause, without the list "
        "of every supported statement)",
    )
    return options


def _heartbeat_ms(text: str) -> int:
    from pipelines.change_streams.read import MAX_HEARTBEAT_MS, MIN_HEARTBEAT_MS

    value = int(text)
    if not MIN_HEARTBEAT_MS <= value <= MAX_HEARTBEAT_MS:
        raise argparse.ArgumentTypeError(
            f"must be from {MIN_HEARTBEAT_MS} to {MAX_HEARTBEAT_MS} milliseconds, got {value}"
        )
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines", description=__doc__, parents=[_options(defaults=True)]
    )
    commands = parser.add_subparsers(dest="command")
    run = commands.add_parser(
        "sql", help="run one statement and exit", parents=[_options(defaults=False)]
    )
    run.add_argument("statement", help="one SQL statement")
    tail = commands.add_parser(
        "tail",
        help="print a change stream's data change records as JSON lines as they come, until "
        "Ctrl-C or SIGTERM",
        parents=[_options(defaults=False, output=False)],
    )
    tail.add_argument("stream", help="the change stream: NAME, SCHEMA.NAME or DB.SCHEMA.NAME")
    tail.add_argument(
        "--start-timestamp",
        help="where to start, RFC 3339 (default now; with --url one second before now, so a "
        "clock a little ahead of the service's is not refused)",
    )
    tail.add_argument("--end-timestamp", help="stop there (RFC 3339; default: run until stopped)")
    tail.add_argument(
        "--heartbeat-ms",
        type=_heartbeat_ms,
        default=1000,
        help="the partitions' heartbeat interval (default 1000, at most 300000)",
    )
    tail.add_argument(
        "--heartbeats", action="store_true", help="print the partitions' heartbeats too"
    )
    args = parser.parse_args(argv)
    if args.command == "tail" and args.create:
        parser.error("tail reads a change stream of an existing warehouse: leave out --create")
    if args.url is not None and (args.warehouse is not None or args.create):
        parser.error("--url runs statements in the service's own warehouse: leave out "
                     "--warehouse and --create")  # fmt: skip
    if args.url is not None and not args.url.startswith(("http://", "https://")):
        parser.error(f"--url must be http://host:port or https://host:port, got {args.url!r}")
    return args


class LocalRunner:
    """A :class:`Session` on the warehouse folder, with Spark in this process."""

    def __init__(
        self, warehouse: Path, session: Session | None = None, catalog: str | None = None
    ) -> None:
        from pipelines.session import Session

        self.where = f"warehouse {warehouse}"
        self.session: Session = session or Session(warehouse, catalog=catalog)
        self.session.spark.sparkContext.setLogLevel("ERROR")

    def rows(self, statement: str, limit: int) -> Rows:
        with evaluation_errors():
            frame = self.session.sql(statement)
            return frame.columns, [tuple(row) for row in frame.limit(limit).collect()]

    def close(self) -> None:
        self.session.close()


def run_one(runner: Runner, statement: str, args: argparse.Namespace) -> int:
    """Run one statement and print its rows (0), or its error (1)."""
    try:
        names, fetched = runner.rows(statement, args.max_rows + 1)
    except SqlError as exc:
        report(runner, exc, getattr(args, "verbose", False))
        return 1
    print_rows(names, fetched, args.format, args.max_rows, sys.stdout)
    return 0


def run_all(runner: Runner, statements: list[str], args: argparse.Namespace) -> int:
    """Run statements in order, every one even after a mistake: 1 if any failed."""
    failed = False
    for statement in statements:
        failed = run_one(runner, statement, args) != 0 or failed
    return 1 if failed else 0


def read_script(stream: Any) -> list[str]:
    """A script piped in, whole: its statements (each ending with ``;`` or a blank line,
    the last one also at the end), checked before any of them runs.

    Raises:
        UsageError: it is not UTF-8 text, or something in it is never closed.
    """
    data = stream.buffer.read() if hasattr(stream, "buffer") else stream.read().encode()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1]
        message = f"the input is not UTF-8 text (byte {exc.start}: {bad!r}); nothing was run"
        raise UsageError(message) from None
    try:
        return split_all(text, blank_line_ends=True)
    except SplitError as exc:
        raise UsageError(str(exc)) from None


def prompt(runner: Runner, args: argparse.Namespace) -> int:
    """Read statements from a terminal (each ending with ``;`` or a blank line outside
    comments, quotes and ``$$`` bodies) until EOF or ``quit``; a last statement without
    ``;`` runs at EOF. 1 if any statement failed, else 0."""
    text, failed = "", False
    while True:
        try:
            line = input(PROMPT if not text.strip() else "...> ")
        except EOFError:
            try:
                return max(run_all(runner, split_all(text), args), int(failed))
            except SplitError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        if not text.strip() and line.strip().lower() in _QUIT:
            return 1 if failed else 0
        text += line + "\n"
        cut = split(text, blank_line_ends=True)
        failed = run_all(runner, cut.statements, args) != 0 or failed
        text = cut.rest if cut.open else (cut.rest + "\n" if cut.rest else "")


def open_runner(args: argparse.Namespace) -> Runner:
    """The runner the options ask for. A local warehouse is checked before the Session
    exists: opening one creates the folder and its catalog, which only ``--create`` may.

    Raises:
        UsageError: the folder holds no warehouse and ``--create`` was not given.
    """
    if args.url is not None:
        from pipelines.cli.service import ServiceRunner

        return ServiceRunner(args.url, args.token or os.environ.get("INGEST_TOKEN"))
    given = args.warehouse or os.environ.get("INGEST_WAREHOUSE") or "warehouse"
    folder = Path(given).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--warehouse {folder} is a file, not a folder")
    location = given_catalog(args)
    if location is not None:
        if not _holds_catalog(location) and not args.create:
            raise UsageError(
                f"{describe_catalog(location)} holds no catalog; pass --catalog the catalog "
                "the service uses (its --catalog), or add --create to lay one out there"
            )
        print(LOCAL_NOTE, file=sys.stderr)
        return LocalRunner(folder, catalog=location)
    from pipelines.spark_sources.source_options import is_warehouse

    if not is_warehouse(folder):
        catalog = folder / CATALOG_FILE
        if catalog.exists():  # never overwrite a file that is not ours, even with --create
            raise UsageError(f"{folder} is not a warehouse: its {CATALOG_FILE} is not a catalog "
                             "database; pass --warehouse the folder the service uses")  # fmt: skip
        if not args.create:
            raise UsageError(
                f"{folder} holds no warehouse (no {CATALOG_FILE}); pass --warehouse the folder "
                "the service (make run) uses, or add --create to create a warehouse there"
            )
    print(LOCAL_NOTE, file=sys.stderr)
    return LocalRunner(folder)


def given_catalog(args: argparse.Namespace) -> str | None:
    """The catalog ``--catalog`` or ``$INGEST_CATALOG`` names; None: the folder's file."""
    given = (getattr(args, "catalog", None) or os.environ.get("INGEST_CATALOG") or "").strip()
    return given or None


def describe_catalog(location: str) -> str:
    """A catalog location for messages: a PostgreSQL URL without its password."""
    from catalog import is_postgres
    from catalog.postgres import where

    return f"the catalog in PostgreSQL ({where(location)})" if is_postgres(location) else \
        f"the catalog file {location[:200]}"  # fmt: skip


def _holds_catalog(location: str) -> bool:
    from catalog import holds_catalog
    from catalog.postgres import CatalogUnavailableError

    try:
        return holds_catalog(location)
    except CatalogUnavailableError as exc:
        raise UsageError(str(exc)) from None


def local_query(
    catalog: Catalog, name: tuple[str, str, str], stop: threading.Event | None = None
) -> Query:
    """The in-process read of change stream ``name`` as a :class:`ChangeStreamReader`'s
    ``query``: the stream looked up and the arguments checked on every call.

    Raises (when called):
        ObjectNotFoundError: the stream does not exist (any more).
        SqlError: ``INVALID_ARGUMENT``: the read's arguments (see ``read_args``).
    """
    from pipelines.change_streams.read import read, read_args

    def query(
        token: str | None, start: str, end: str | None, heartbeat_ms: int
    ) -> Iterator[dict[str, Any]]:
        stream = catalog.get_change_stream(*name)
        if stream is None:
            from catalog import did_you_mean, full_name

            hint = did_you_mean(catalog, *name, ["change stream"])
            raise ObjectNotFoundError(
                f"change stream {full_name(*name)} does not exist{hint} (SHOW CHANGE STREAMS lists "
                "them; unquoted parts of a name are upper-cased)"
            )
        values = {"start_timestamp": start, "end_timestamp": end, "partition_token": token,
                  "heartbeat_milliseconds": heartbeat_ms}  # fmt: skip
        args = read_args(values, stream, catalog.list_partitions(stream.uid))
        return read(catalog, stream, args, stop)

    return query


def _print_record(record: dict[str, Any], _db: object) -> None:
    sys.stdout.write(orjson.dumps(record).decode() + "\n")
    sys.stdout.flush()


def tail(args: argparse.Namespace) -> int:
    """``tail``: print the stream's records until it ends (``--end-timestamp``), Ctrl-C or
    SIGTERM (0); a stream that does not exist or a refused read: its error, 1."""
    from catalog import did_you_mean, full_name, open_catalog
    from ingest_sdk import (
        ChangeStreamReader,
        ConfigurationError,
        IngestError,
        RetryPolicy,
        StreamingIngestClient,
    )
    from pipelines.spark_sources.source_options import is_warehouse
    from pipelines.sql.statements import qualified, split_name

    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    parts = split_name(args.stream)
    if not 1 <= len(parts) <= 3:
        print(f"error: {args.stream!r} is not a change stream name (NAME, SCHEMA.NAME or "
              "DB.SCHEMA.NAME)", file=sys.stderr)  # fmt: skip
        return 2
    name = qualified(parts, args.database, args.schema)
    now = datetime.now(UTC)
    client: StreamingIngestClient | None = None
    if args.url is not None:
        # Each opening of a read retried briefly: the reader retries it again (for 2
        # minutes), and between its tries a Ctrl-C is seen.
        client = StreamingIngestClient(
            "pipelines-tail", url=args.url, token=args.token or os.environ.get("INGEST_TOKEN"),
            retry=RetryPolicy(deadline=5.0),
        )  # fmt: skip
        source: Any = client
        where = f"the service at {args.url}"
        now -= timedelta(seconds=1)
    else:
        folder = Path(args.warehouse or os.environ.get("INGEST_WAREHOUSE") or "warehouse")
        folder = folder.expanduser().resolve()
        where = f"warehouse {folder}"
        location = given_catalog(args)
        if location is not None:
            try:
                held = _holds_catalog(location)
            except UsageError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            if not held:
                print(f"error: {describe_catalog(location)} holds no catalog; pass --catalog "
                      "the catalog the service uses, or --url", file=sys.stderr)  # fmt: skip
                return 2
        elif not is_warehouse(folder):
            print(f"error: {folder} holds no warehouse (no {CATALOG_FILE}); pass --warehouse "
                  "the folder the service uses, or --url", file=sys.stderr)  # fmt: skip
            return 2
        catalog = open_catalog(location or folder / CATALOG_FILE)
        if catalog.get_change_stream(*name) is None:
            hint = did_you_mean(catalog, *name, ["change stream"])
            print(f"error OBJECT_NOT_FOUND: change stream {full_name(*name)} does not exist"
                  f"{hint} ({where})", file=sys.stderr)  # fmt: skip
            return 1
        source = local_query(catalog, name, stop)
    try:
        with tempfile.TemporaryDirectory(prefix="pipelines-tail-") as folder_name:
            reader = ChangeStreamReader(
                source,
                full_name(*name),
                start_timestamp=args.start_timestamp or now,
                end_timestamp=args.end_timestamp,
                checkpoint_path=Path(folder_name) / "checkpoint.sqlite",
                callback=_print_record,
                heartbeat_milliseconds=args.heartbeat_ms,
                heartbeats=args.heartbeats,
            )
            reader.run(stop)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SqlError as exc:
        print(f"error {exc.code}: {exc} ({where})", file=sys.stderr)
        return 1
    except IngestError as exc:
        print(f"error {_code(exc)}: {exc} ({where})", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of our output left (| head): done
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if client is not None:
            client.close()
    return 0


def _code(exc: IngestError) -> str:
    return str(getattr(exc, "code", type(exc).__name__))


def _statements(args: argparse.Namespace) -> list[str] | None:
    """The statements of ``sql`` or of a script piped in, checked before anything runs
    (None: a terminal's prompt reads them as they come).

    Raises:
        UsageError: they cannot be cut into statements.
    """
    if args.command == "sql":
        try:
            statement = args.statement.encode("utf-8").decode("utf-8")
            return split_all(statement)
        except UnicodeError:
            raise UsageError("the statement is not UTF-8 text; nothing was run") from None
        except SplitError as exc:
            raise UsageError(str(exc)) from None
    return None if sys.stdin.isatty() else read_script(sys.stdin)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "tail":
        return tail(args)
    try:
        statements = _statements(args)
        runner = open_runner(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if (args.database, args.schema) != (DEFAULT_DATABASE, DEFAULT_SCHEMA):
            # A statement, so both runners read the names alike (unquoted upper-cased).
            try:
                runner.rows(f"USE SCHEMA {args.database}.{args.schema}", 1)
            except SqlError as exc:
                report(runner, exc, args.verbose)
                return 2
        if statements is None:
            return prompt(runner, args)
        return run_all(runner, statements, args)
    finally:
        runner.close()


def run(entry: Callable[[], int]) -> NoReturn:
    """``sys.exit(entry())``, ended by :func:`ingest_sdk.process_exit.exit_process` once
    Arrow or Spark is loaded (the abort at exit it prevents needs them); the ``--url``
    path loads neither, and importing the SDK would cost it most of its start."""
    try:
        code: str | int | None = entry()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    if any(name in sys.modules for name in ("pyarrow", "pyspark")):
        from ingest_sdk.process_exit import exit_process, exit_status

        exit_process(exit_status(code))
    sys.exit(code)


if __name__ == "__main__":
    run(main)
