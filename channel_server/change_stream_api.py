"""``GET /v1/change-streams/{name}/read``: one query of a change stream, held open and
answered as NDJSON (one record per line) while its records come.

Parameters (the query string): ``start_timestamp`` (required), ``end_timestamp``,
``partition_token`` (none: the first query, which returns the partitions to read) and
``heartbeat_milliseconds`` (required, 1,000 to 300,000), checked by
:func:`pipelines.change_streams.read.read_args` before anything is answered: a mistake is
a 4xx JSON error as on every route, never a 500. The answer is streamed until the
partition ends (its last line is the child partitions record), ``end_timestamp`` is
reached (a heartbeat at it), or the client leaves. An error after the answer began is
its last line, ``{"error": {"code", "message"}}``; a service that shuts down breaks the
connection instead (no clean end), so a client resumes from its last record.

Each read runs the blocking generator :func:`~pipelines.change_streams.read.read` in a
thread of its own, which hands lines to the event loop through a :class:`_Pipe` bounded
in bytes: a client that reads slowly makes its thread wait, never the service buffer.
The thread stops when the client leaves, the service shuts down, or the client takes
nothing for :attr:`ReadLimits.stall_seconds`; at most :attr:`ReadLimits.max_reads` run
at once (then 429).

State: the reads of a service (their count, the catalog connection they poll) live in
:class:`ChangeStreamReads`, made at start-up by :func:`setup`'s context and found by
:func:`reads_of`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson
from aiohttp import web

from catalog import (
    Catalog,
    CatalogUnavailableError,
    ChangeStreamRecord,
    did_you_mean,
    full_name,
    open_catalog,
)
from channel_server.http_common import SERVICE, Routes
from ingest_sdk.errors import (
    BackpressureError,
    ChangeStreamNotFoundError,
    IngestError,
    InvalidRequestError,
    SchemaError,
    ServiceError,
    error_code_of,
)
from ingest_sdk.schema import split_table_name
from pipelines.change_streams.read import ARGUMENTS, ReadArgs, read, read_args
from pipelines.errors import ObjectNotFoundError, SqlError
from pipelines.sql.statements import DEFAULT_DATABASE, DEFAULT_SCHEMA

__all__ = [
    "LIMITS", "NDJSON", "READS", "ChangeStreamNotFoundError", "ChangeStreamReads",
    "InvalidArgumentError", "ReadLimits", "change_stream_name", "query_arguments",
    "read_change_stream", "reads_of", "setup", "stream_named",
]  # fmt: skip

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"
#: How often a waiting read looks whether its client left or the service is stopping (s).
CHECK_SECONDS = 0.25
#: Lines waiting in the pipe are sent in writes of up to this many bytes.
WRITE_BYTES = 1 << 20
#: How long a finished request waits for its read thread to end (it ends within one poll
#: of the read unless a read of the Delta log is in progress; it then ends by itself).
JOIN_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds of the change stream reads of one service."""

    #: Reads open at once (each holds a thread); past it a new read gets 429.
    max_reads: int = 256
    #: Bytes of records a read may have made but not yet handed to its connection (one
    #: record always fits): past it the read's thread waits for the client.
    queued_bytes: int = 4 * 1024 * 1024
    #: A client that takes nothing for this long while records wait for it is
    #: disconnected, and its read ends.
    stall_seconds: float = 300.0


#: The limits a service's reads get (read when its first read arrives).
LIMITS = ReadLimits()


class InvalidArgumentError(ServiceError):
    """A read's parameters are wrong (400), with the code and message of
    :func:`~pipelines.change_streams.read.read_args` (``INVALID_ARGUMENT``)."""

    status, code = 400, "INVALID_ARGUMENT"


class ChangeStreamReads:
    """The change stream reads of one service: which run, their limit, and the catalog
    connection they poll.

    The reads poll the catalog every 50 ms each; on a connection of their own, their
    polls never wait for the lock of the service's connection, which the flushers use.
    """

    def __init__(self, catalog_location: str | Path, limits: ReadLimits) -> None:
        self.limits = limits
        self._catalog_location = catalog_location
        self._catalog: Catalog | None = None
        self._opening = threading.Lock()
        self._lock = threading.Lock()
        self._running: set[threading.Event] = set()

    @property
    def active(self) -> int:
        """Reads running now (a read counts until its thread has ended)."""
        with self._lock:
            return len(self._running)

    def admit(self) -> threading.Event:
        """Room for one more read: its stop event.

        Raises:
            BackpressureError: :attr:`ReadLimits.max_reads` reads run already (429).
        """
        with self._lock:
            if len(self._running) >= self.limits.max_reads:
                raise BackpressureError(
                    f"{self.limits.max_reads} change stream reads are open on this service, "
                    "its limit; end a read you no longer need, or retry later",
                    retry_after=1.0,
                )
            stop = threading.Event()
            self._running.add(stop)
            return stop

    def release(self, stop: threading.Event) -> None:
        with self._lock:
            self._running.discard(stop)

    def close(self) -> None:
        """Close the reads' catalog connection, unless a read's thread still runs (a read
        releases its place only after its last use of the connection)."""
        with self._opening, self._lock:
            if self._catalog is not None and not self._running:
                self._catalog.close()
                self._catalog = None

    def catalog(self) -> Catalog:
        """The reads' catalog connection, opened on first use (blocking: call it in a
        thread)."""
        with self._opening:
            if self._catalog is None:
                self._catalog = open_catalog(self._catalog_location)
            return self._catalog


READS = web.AppKey("change_stream_reads", ChangeStreamReads)
routes = Routes()


def setup(app: web.Application) -> None:
    """Add the read route and its state; call it after the service's context is added."""
    app.add_routes(routes)
    app.cleanup_ctx.append(_reads_context)


async def _reads_context(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    reads = app[READS] = ChangeStreamReads(service.config.catalog_location, LIMITS)
    service.metrics.watch(
        "ingest_change_stream_reads",
        "Change stream reads open now (GET /v1/change-streams/{name}/read), each with "
        "a thread of its own.",
        lambda: reads.active,
    )
    yield
    reads.close()


def reads_of(app: web.Application) -> ChangeStreamReads:
    """The change stream reads of a running application (with :data:`LIMITS` as they
    were at its start)."""
    return app[READS]


# -- the request ------------------------------------------------------------------------


def change_stream_name(text: str) -> tuple[str, str, str]:
    """``(database, schema, name)`` of a change stream named ``NAME``, ``SCHEMA.NAME`` or
    ``DATABASE.SCHEMA.NAME``: unquoted parts upper-cased, quoted parts exact, the missing
    parts those ``POST /v1/sql`` starts from (``DB``, ``PUBLIC``).

    Raises:
        InvalidRequestError: not one to three parts, or a part no name may be.
    """
    reasons = []
    for prefix in ("", f"{DEFAULT_DATABASE}.", f"{DEFAULT_DATABASE}.{DEFAULT_SCHEMA}."):
        try:
            return split_table_name(prefix + text)
        except SchemaError as exc:  # the attempt with the right number of parts says why
            if not str(exc).startswith("a table name must be"):
                reason = str(exc).replace("the table name", "the change stream name")
                reasons.append(reason.replace("a column name", "each part"))
    why = f" ({reasons[0]})" if reasons else ""
    raise InvalidRequestError(
        f"{text[:300]!r} is not a change stream name{why}; name it NAME, SCHEMA.NAME or "
        f"DATABASE.SCHEMA.NAME (missing parts are {DEFAULT_DATABASE} and {DEFAULT_SCHEMA}; "
        'unquoted parts are upper-cased, so quote a part to keep its case or dots: "my.cs")'
    )


#: A timestamp whose offset's + a URL query turned into a space (``...:00 01:00``).
_LOST_PLUS = re.compile(r"\d \d\d(:?\d\d)?$")
_REQUIRED = {
    "start_timestamp": "2026-01-31T12:00:00Z (RFC 3339, UTC unless an offset is given; "
    "write + as %2B in a URL)",
    "heartbeat_milliseconds": "10000 (1,000 to 300,000)",
}


def query_arguments(query: Mapping[str, str]) -> dict[str, str]:
    """The read's arguments from a query string (an aiohttp ``MultiDictProxy``): known
    names only, each once, the two required ones present. Their values are checked by
    :func:`~pipelines.change_streams.read.read_args`.

    Raises:
        InvalidArgumentError: an unknown, repeated or missing parameter.
    """
    counts = Counter(name for name, _ in query.items())  # a multidict: one item per value
    unknown = sorted(set(counts) - set(ARGUMENTS))
    if unknown:
        raise InvalidArgumentError(f"unknown parameter {unknown[0][:40]!r}; the parameters are "
                                   f"{', '.join(ARGUMENTS)}")  # fmt: skip
    repeated = sorted(name for name, count in counts.items() if count > 1)
    if repeated:
        raise InvalidArgumentError(f"the parameter {repeated[0]} is given twice; give it once")
    for name, example in _REQUIRED.items():
        if name not in counts:
            raise InvalidArgumentError(f"{name} is required, e.g. {name}={example}")
    return {name: query[name] for name in counts}


def stream_named(catalog: Catalog, names: tuple[str, str, str]) -> ChangeStreamRecord:
    """The change stream of that name (blocking: a catalog read).

    Raises:
        ChangeStreamNotFoundError: there is none; the message says where they are listed.
    """
    stream = catalog.get_change_stream(*names)
    if stream is None:
        hint = did_you_mean(catalog, *names, ["change stream"])
        raise ChangeStreamNotFoundError(
            f"change stream {full_name(*names)} does not exist{hint}; SHOW CHANGE STREAMS (through "
            "POST /v1/sql) or GET /v1/change-streams lists them. Unquoted parts of a name are "
            'upper-cased: quote a part to keep its case ("my_cs")'
        )
    return stream


def _checked(
    catalog: Catalog, names: tuple[str, str, str], values: Mapping[str, str]
) -> tuple[ChangeStreamRecord, ReadArgs]:
    """The stream and the read's checked arguments (blocking: catalog reads)."""
    stream = stream_named(catalog, names)
    try:
        return stream, read_args(values, stream, catalog.list_partitions(stream.uid))
    except SqlError as exc:
        if exc.code == InvalidArgumentError.code:
            lost = [n for n in ("start_timestamp", "end_timestamp")
                    if _LOST_PLUS.search(values.get(n) or "")]  # fmt: skip
            hint = (f"; {lost[0]} holds a space where an offset's + was: a + in a URL's "
                    "query reads as a space, write it as %2B") if lost else ""  # fmt: skip
            raise InvalidArgumentError(f"{exc}{hint}") from exc
        raise InvalidRequestError(f"{exc.code}: {exc}") from exc


@routes.get("/v1/change-streams/{name:[^/]+}/read", allow_head=False)  # a HEAD would hold a read
async def read_change_stream(request: web.Request) -> web.StreamResponse:
    """Check the read at the door, then stream its records as NDJSON until it ends."""
    reads = reads_of(request.app)
    names = change_stream_name(request.match_info["name"])
    values = query_arguments(request.rel_url.query)
    catalog = await asyncio.to_thread(reads.catalog)
    stream, args = await asyncio.to_thread(_checked, catalog, names, values)
    stop = reads.admit()
    loop = asyncio.get_running_loop()
    pipe = _Pipe(loop, reads.limits.queued_bytes)
    thread = threading.Thread(
        target=_run_read, args=(catalog, stream, args, stop, pipe, reads),
        name=f"change-stream-read {stream.full_name}", daemon=True,
    )  # fmt: skip
    try:
        thread.start()
    except BaseException:
        reads.release(stop)
        raise
    log.debug("change stream read of %s started", stream.full_name,
              extra={"change_stream": stream.full_name, "partition_token": args.token})  # fmt: skip
    response = web.StreamResponse(headers={"Cache-Control": "no-store"})
    response.content_type = NDJSON
    try:
        await response.prepare(request)
        if not await _pump(request, response, pipe, reads.limits):
            # The client left, the service is stopping, or the client stalled: break the
            # connection, so that no client takes the answer for a complete one.
            response.force_close()
            if request.transport is not None:
                request.transport.abort()
    finally:
        stop.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(pipe.finished), JOIN_SECONDS)
    return response


# -- the read's thread and its pipe ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _End:
    """The read ended; ``line``: its last line (an error), if any."""

    line: bytes | None


class _Pipe:
    """Lines from a read's thread to its connection, at most ``max_bytes`` waiting (one
    line always fits), so a slow client makes the thread wait, not the service buffer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_bytes: int) -> None:
        self.items: asyncio.Queue[bytes | _End] = asyncio.Queue()
        #: Done once the thread has ended.
        self.finished: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._max = max_bytes
        self._queued = 0
        self._room = threading.Condition()

    def put(self, line: bytes, stop: threading.Event) -> bool:
        """Hand a line over (read thread); False if the read was stopped meanwhile."""
        with self._room:
            while self._queued and self._queued + len(line) > self._max:
                if stop.is_set():
                    return False
                self._room.wait(CHECK_SECONDS)
            if stop.is_set():
                return False
            self._queued += len(line)
        return self._deliver(line)

    def sent(self, nbytes: int) -> None:
        """Lines of ``nbytes`` went to the connection (event loop): room for more."""
        with self._room:
            self._queued -= nbytes
            self._room.notify()

    def finish(self, line: bytes | None) -> None:
        """The thread ends (read thread), after ``line`` if one is given."""
        if self._deliver(_End(line)):
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._set_finished)

    def _set_finished(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def _deliver(self, item: bytes | _End) -> bool:
        try:
            self._loop.call_soon_threadsafe(self.items.put_nowait, item)
        except RuntimeError:  # the loop is closed: the service is gone
            return False
        return True


def _error_line(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}}) + b"\n"


def _run_read(
    catalog: Catalog, stream: ChangeStreamRecord, args: ReadArgs, stop: threading.Event,
    pipe: _Pipe, reads: ChangeStreamReads,
) -> None:  # fmt: skip
    """The read's thread: its records into the pipe until it ends or is stopped."""
    end: bytes | None = None
    try:
        for record in read(catalog, stream, args, stop):
            if not pipe.put(orjson.dumps(record) + b"\n", stop):
                return
    except ObjectNotFoundError as exc:  # the stream was dropped or replaced meanwhile
        end = _error_line(ChangeStreamNotFoundError.code, str(exc))
    except SqlError as exc:
        end = _error_line(exc.code, str(exc))
    except IngestError as exc:
        end = _error_line(error_code_of(exc)[1], str(exc))
    except CatalogUnavailableError as exc:  # resumed from the last record's timestamp
        end = _error_line("CATALOG_UNAVAILABLE", str(exc))
    except Exception:
        log.exception("change stream read of %s failed", stream.full_name,
                      extra={"change_stream": stream.full_name})  # fmt: skip
        end = _error_line("INTERNAL", "the read failed in the service; its log has the "
                          "details. Resume it from the last record's timestamp")  # fmt: skip
    finally:
        reads.release(stop)
        pipe.finish(None if stop.is_set() else end)


def _ending(request: web.Request) -> bool:
    """Whether the connection is ending: the client left, or the service shuts down.

    aiohttp has no public flag for the second: its connection handler sets ``_close``
    (pre-shutdown) and ``_force_close`` (shutdown, lost connection). Without them a read
    would hold the shutdown for the runner's whole ``shutdown_timeout`` (60 s) before
    aiohttp cancels it (which ends the read too).
    """
    transport = request.transport
    if transport is None or transport.is_closing():
        return True
    protocol = request.protocol
    return bool(getattr(protocol, "_close", False) or getattr(protocol, "_force_close", False))


async def _pump(
    request: web.Request, response: web.StreamResponse, pipe: _Pipe, limits: ReadLimits
) -> bool:
    """Send the read's lines as they come. True: the read ended and its answer is
    complete; False: the connection is ending or the client stalled."""
    while True:
        try:
            item = await asyncio.wait_for(pipe.items.get(), CHECK_SECONDS)
        except TimeoutError:
            if _ending(request):
                return False
            continue
        lines: list[bytes] = []
        size = 0
        while isinstance(item, bytes):
            lines.append(item)
            size += len(item)
            if size >= WRITE_BYTES or pipe.items.empty():
                break
            item = pipe.items.get_nowait()
        if lines:
            sent = await _send(request, response, b"".join(lines), limits.stall_seconds)
            pipe.sent(size)
            if not sent:
                return False
        if isinstance(item, _End):
            return item.line is None or await _send(
                request, response, item.line, limits.stall_seconds
            )


async def _send(
    request: web.Request, response: web.StreamResponse, data: bytes, stall_seconds: float
) -> bool:
    """Write ``data``; False if the connection ended or the client took nothing for
    ``stall_seconds`` (a write waits while the client's buffers are full)."""
    loop = asyncio.get_running_loop()
    write = asyncio.ensure_future(response.write(data))
    deadline = loop.time() + stall_seconds
    try:
        while True:
            done, _ = await asyncio.wait({write}, timeout=CHECK_SECONDS)
            if done:
                write.result()
                return True
            if loop.time() >= deadline or _ending(request):
                return False
    except ConnectionError:  # aiohttp's ClientConnectionResetError is one
        return False
    finally:
        if not write.done():
            write.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await write
