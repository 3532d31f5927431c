"""The command line: ``python -m pipelines sql "statement"``, or a prompt without one;
``python -m pipelines tail CS`` prints a change stream's records as they come.

Rows are printed as a table (``--format table``, the default), JSON lines or CSV. A SQL
mistake prints its code and message and exits 1 (the prompt carries on). Statements run
in a session on the warehouse (``--warehouse``, default ``$INGEST_WAREHOUSE`` or
``./warehouse``), which must already hold one (``--create`` makes one); or, with
``--url``, in the running service (``POST /v1/sql``), which answers without starting
Spark here.

``tail`` reads every partition of a change stream, parents before children
(:class:`ingest_sdk.ChangeStreamReader` with a throwaway checkpoint), and prints each
data change record (with ``--heartbeats``, each heartbeat too) as one JSON line. It reads
the warehouse's catalog and tables in this process (no Spark), or, with ``--url``, the
service's ``GET /v1/change-streams/{name}/read``. Ctrl-C or SIGTERM ends it (status 0).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import secrets
import signal
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import orjson

from ingest_sdk.process_exit import run_entry_point
from pipelines.errors import ObjectNotFoundError, SqlError, evaluation_errors
from pipelines.spark_sources.source_options import CATALOG_FILE, is_warehouse
from pipelines.sql.statements import classify, qualified, split_name

if TYPE_CHECKING:
    from catalog import Catalog
    from ingest_sdk import IngestError
    from ingest_sdk.change_stream_reader import Query
    from pipelines.session import Session

PROMPT = "sql> "
MAX_ROWS = 10_000
DEFAULT_DATABASE, DEFAULT_SCHEMA = "DB", "PUBLIC"
#: Rows the service answers at most (``max_rows`` of ``POST /v1/sql``).
SERVICE_MAX_ROWS = 1_000_000
#: Seconds to wait for the service's answer: its own statement timeout (300 s) and some.
SERVICE_WAIT = 330.0
ARROW_STREAM = "application/vnd.apache.arrow.stream"
_QUIT = ("quit", "exit", r"\q")

Rows = tuple[list[str], list[tuple[Any, ...]]]


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


class Runner(Protocol):
    """Where statements run: a local Spark session, or the service."""

    #: Named in "does not exist" errors: which warehouse the statement looked in.
    where: str

    def rows(self, statement: str, limit: int) -> Rows:
        """The statement's column names and at most ``limit`` rows (raises SqlError)."""
        ...

    def close(self) -> None: ...


class LocalRunner:
    """A :class:`Session` on the warehouse folder, with Spark in this process."""

    def __init__(self, warehouse: Path, session: Session | None = None) -> None:
        from pipelines.session import Session

        self.where = f"warehouse {warehouse}"
        self.session: Session = session or Session(warehouse)
        self.session.spark.sparkContext.setLogLevel("ERROR")

    def rows(self, statement: str, limit: int) -> Rows:
        with evaluation_errors():
            frame = self.session.sql(statement)
            return frame.columns, [tuple(row) for row in frame.limit(limit).collect()]

    def close(self) -> None:
        self.session.close()


class ServiceRunner:
    """``POST /v1/sql`` of a running service, in one service session per CLI process
    (``cli-<random hex>``), so a transaction opened on one prompt line is the one the
    next lines run in. Answers are Arrow IPC: the same Python values, and so the same
    printed text, as the local session's rows."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.session = f"cli-{secrets.token_hex(8)}"
        self.where = f"warehouse of the service at {self.url}"
        self.in_transaction = False  # a BEGIN went through and no COMMIT/ROLLBACK since
        # No proxy from the environment, as the SDK (aiohttp) does not use one either.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def rows(self, statement: str, limit: int, wait: float = SERVICE_WAIT) -> Rows:
        import pyarrow as pa

        body = {"statement": statement, "session": self.session,
                "max_rows": min(limit, SERVICE_MAX_ROWS)}  # fmt: skip
        headers = {"Content-Type": "application/json", "Accept": ARROW_STREAM}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            f"{self.url}/v1/sql", data=orjson.dumps(body), headers=headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=wait) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            raise _service_error(error.code, error.read()) from None
        except OSError as error:  # refused, unknown host, timed out (URLError included)
            reason = getattr(error, "reason", None) or error
            raise SqlError(f"cannot reach the service at {self.url}: {reason}",
                           "SERVICE_UNREACHABLE") from None  # fmt: skip
        self._track(statement)
        try:
            table = pa.ipc.open_stream(data).read_all()
        except pa.ArrowException:
            raise SqlError(f"{self.url}/v1/sql did not answer with rows: is it the ingest "
                           "service?", "BAD_ANSWER") from None  # fmt: skip
        if limit > SERVICE_MAX_ROWS and table.num_rows == SERVICE_MAX_ROWS:
            print(f"note: the service answers at most {SERVICE_MAX_ROWS} rows; more may "
                  "have been left out", file=sys.stderr)  # fmt: skip
        columns = [_as_spark_collects(column.to_pylist()) for column in table.columns]
        return table.column_names, list(zip(*columns, strict=True))

    def _track(self, statement: str) -> None:
        """Follow the session's transaction from the statements that succeeded."""
        with contextlib.suppress(SqlError):  # not a transaction statement
            kind = classify(statement).kind
            if kind in ("begin", "commit", "rollback"):
                self.in_transaction = kind == "begin"

    def close(self) -> None:
        """Roll back a transaction left open, as closing a local session does (the
        service would otherwise keep it until it evicts the session)."""
        if self.in_transaction:
            with contextlib.suppress(SqlError):
                self.rows("ROLLBACK", 1, wait=30.0)


def _as_spark_collects(values: list[Any]) -> list[Any]:
    """Time zone aware timestamps as naive local times, as Spark's ``collect()`` gives them
    to the local runner (Arrow carries them in UTC), so both print the same text."""
    return [
        v.astimezone().replace(tzinfo=None)
        if isinstance(v, datetime) and v.tzinfo is not None
        else v
        for v in values
    ]


def _service_error(status: int, body: bytes) -> SqlError:
    """The service's error answer as a SqlError with the statement's own code."""
    try:
        error = orjson.loads(body)["error"]
        code = str(error.get("sql_code") or error.get("code") or f"HTTP_{status}")
        return SqlError(str(error.get("message", "")), code)
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()[:300]
        return SqlError(f"the service answered {status}: {text}", f"HTTP_{status}")


def report(runner: Runner, exc: SqlError) -> None:
    """``error CODE: message`` on stderr; a "does not exist" names the warehouse looked in."""
    message = str(exc)
    if exc.code == "OBJECT_NOT_FOUND" or "does not exist" in message:
        message = f"{message} ({runner.where})"
    print(f"error {exc.code}: {message}", file=sys.stderr)


def run_one(runner: Runner, statement: str, args: argparse.Namespace) -> int:
    """Run one statement and print its rows (0), or its error (1)."""
    try:
        names, fetched = runner.rows(statement, args.max_rows + 1)
    except SqlError as exc:
        report(runner, exc)
        return 1
    print_rows(names, fetched, args.format, args.max_rows, sys.stdout)
    return 0


def prompt(runner: Runner, args: argparse.Namespace) -> int:
    """Read statements (ending with ``;`` or a blank line) until EOF or ``quit``; a last
    statement without ``;`` runs at EOF. 1 if any statement failed (for scripts piped
    in), else 0. The prompt is shown only to a terminal."""
    shown = sys.stdin.isatty()
    lines: list[str] = []
    failed = False
    while True:
        try:
            line = input((PROMPT if not lines else "...> ") if shown else "")
        except EOFError:
            text = "\n".join(lines).strip().rstrip(";").strip()
            if text:
                failed = run_one(runner, text, args) != 0 or failed
            return 1 if failed else 0
        if not lines and line.strip().lower() in _QUIT:
            return 1 if failed else 0
        lines.append(line)
        text = "\n".join(lines).strip()
        if not text:
            lines = []
        elif text.endswith(";") or not line.strip():
            failed = run_one(runner, text.rstrip(";").strip(), args) != 0 or failed
            lines = []


def open_runner(args: argparse.Namespace) -> Runner:
    """The runner the options ask for. A local warehouse is checked before the Session
    exists: opening one creates the folder and its catalog, which only ``--create`` may.

    Raises:
        UsageError: the folder holds no warehouse and ``--create`` was not given.
    """
    if args.url is not None:
        return ServiceRunner(args.url, args.token or os.environ.get("INGEST_TOKEN"))
    given = args.warehouse or os.environ.get("INGEST_WAREHOUSE") or "warehouse"
    folder = Path(given).expanduser().resolve()
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--warehouse {folder} is a file, not a folder")
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
    return LocalRunner(folder)


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
            from catalog import full_name

            raise ObjectNotFoundError(
                f"change stream {full_name(*name)} does not exist (SHOW CHANGE STREAMS lists "
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
    from catalog import SqliteCatalog, full_name
    from ingest_sdk import (
        ChangeStreamReader,
        ConfigurationError,
        IngestError,
        RetryPolicy,
        StreamingIngestClient,
    )

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
        if not is_warehouse(folder):
            print(f"error: {folder} holds no warehouse (no {CATALOG_FILE}); pass --warehouse "
                  "the folder the service uses, or --url", file=sys.stderr)  # fmt: skip
            return 2
        catalog = SqliteCatalog(folder / CATALOG_FILE)
        if catalog.get_change_stream(*name) is None:
            print(f"error OBJECT_NOT_FOUND: change stream {full_name(*name)} does not exist "
                  f"({where})", file=sys.stderr)  # fmt: skip
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "tail":
        return tail(args)
    try:
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
                report(runner, exc)
                return 2
        if args.command == "sql":
            return run_one(runner, args.statement.strip().rstrip(";").strip(), args)
        return prompt(runner, args)
    finally:
        runner.close()


if __name__ == "__main__":
    run_entry_point(main)
