"""Reading requests at the door: every header, parameter and body field is checked here.

A request that breaks a rule raises :class:`InvalidRequestError` (400) with a
message naming the field and the fix, before anything reaches the service, so a
malformed request never changes a table, a channel or a file, and a value that
the commit path cannot carry (a ``batch_seq`` past 2^40, an offset token that is
not valid Unicode) is refused instead of breaking later flushes of the table.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from aiohttp import web

from ingest_sdk import ConversionOptions, OnErrorOption
from ingest_sdk.errors import IngestError, InvalidRequestError
from ingest_sdk.validation import check_offset_token
from ingest_sdk.wire import MAX_BATCH_SEQ, MAX_GENERATION, loads

__all__ = [
    "MAX_TIMEZONE_LENGTH",
    "arrow_names",
    "bounded_int",
    "check_token",
    "coordinate",
    "field",
    "json_body",
    "on_error",
    "read_body",
    "timeout",
    "timezone",
]

MAX_TIMEZONE_LENGTH = 64
#: JSON bodies this large are parsed off the event loop.
THREAD_PARSE_BYTES = 256 * 1024
_TIMEZONE_RE = re.compile(r"[A-Za-z0-9_+\-/]+")
_DIGITS_RE = re.compile(r"[0-9]{1,20}")
#: Ranges of the integer fields that name a channel position.
_RANGES = {"generation": (1, MAX_GENERATION), "batch_seq": (0, MAX_BATCH_SEQ)}


async def read_body(request: web.Request) -> bytes:
    """The whole body, decompressed as its ``Content-Encoding`` says.

    Raises:
        InvalidRequestError: the body could not be read or decoded (e.g. ``gzip`` named
            but the bytes are not gzip).
    """
    try:
        return await request.read()
    except web.HTTPException:
        raise  # 413 and friends already say what is wrong
    except Exception as exc:
        encoding = request.headers.get("Content-Encoding")
        hint = (
            f"; the body must be compressed as its Content-Encoding ({encoding}) says"
            if encoding
            else ""
        )
        detail = " ".join(str(exc).split())  # aiohttp's messages span lines
        raise InvalidRequestError(
            f"the request body could not be read ({type(exc).__name__}: {detail}){hint}"
        ) from exc


async def json_body(
    request: web.Request, parse: Callable[[bytes], Any] = loads
) -> dict[str, Any]:
    """The body as a JSON object."""
    raw = await read_body(request)
    try:
        # A large body (the exact number parser can take tens of ms on megabytes of long
        # numbers) is parsed in a worker thread, so other requests are not held up.
        big = len(raw) >= THREAD_PARSE_BYTES
        body = await asyncio.to_thread(parse, raw) if big else parse(raw)
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return body


def field(
    body: dict[str, Any] | Any, key: str, kind: type | tuple[type, ...], required: bool = True
) -> Any:
    """``body[key]`` if it has the expected type; None if absent and not required."""
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidRequestError(f'the field "{key}" is required')
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidRequestError(f'the field "{key}" must be a {names}, got {_shown(value)}')
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"


def bounded_int(value: int, key: str) -> int:
    """A channel position field (``generation``, ``batch_seq``) within what a commit holds."""
    low, high = _RANGES[key]
    if not low <= value <= high:
        raise InvalidRequestError(f'"{key}" must be between {low} and {high}, got {value}')
    return value


def coordinate(request: web.Request, key: str, header: str) -> int:
    """A channel position from the query string, or else from its header."""
    raw = request.rel_url.query.get(key, request.headers.get(header))
    if raw is None:
        raise InvalidRequestError(f'the parameter "{key}" is required')
    if not _DIGITS_RE.fullmatch(raw.strip()):
        raise InvalidRequestError(
            f'the parameter "{key}" must be a whole number, got {_shown(raw)}'
        )
    return bounded_int(int(raw), key)


def arrow_names(schema: pa.Schema) -> None:
    """Refuse an Arrow schema with a field name, nested ones too, that is not UTF-8.

    The IPC reader takes any bytes as a name; pyarrow then fails at the first Python use
    of it, deep inside the batch check.
    """
    pending = [(f"column {i}", schema.field(i)) for i in range(len(schema))]
    while pending:
        where, field = pending.pop()
        try:
            name = field.name
        except UnicodeDecodeError as exc:
            raise InvalidRequestError(
                f"the Arrow IPC stream names {where} with bytes that are not UTF-8 ({exc}); "
                "name every field in UTF-8"
            ) from exc
        kind = field.type
        while pa.types.is_dictionary(kind):
            kind = kind.value_type
        pending += [(f"field {j} of {name!r}", kind.field(j)) for j in range(kind.num_fields)]


def check_token(value: Any, key: str) -> str | None:
    """An offset token the commit path can carry (the SDK's own check, as a 400)."""
    try:
        return check_offset_token(value, f'"{key}"')
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc


def on_error(value: Any) -> OnErrorOption:
    try:
        return OnErrorOption.parse(value)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from exc


def timezone(value: Any) -> str:
    """A channel's default time zone: an IANA name such as ``America/Los_Angeles``."""
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f'"default_timezone" must be a string, got {_shown(value)}')
    if len(value) > MAX_TIMEZONE_LENGTH or not _TIMEZONE_RE.fullmatch(value):
        raise InvalidRequestError(
            f'"default_timezone" must be an IANA time zone name such as '
            f'"America/Los_Angeles" or "UTC", got {_shown(value)}'
        )
    try:
        ConversionOptions(default_timezone=value)
    except (IngestError, OSError, ValueError) as exc:
        raise InvalidRequestError(str(exc)) from exc
    return value


def timeout(body: dict[str, Any], default: float) -> float:
    """A wait's timeout in seconds: a finite, non-negative number."""
    value = field(body, "timeout", (int, float), required=False)
    if value is None:
        return default
    if not math.isfinite(value) or value < 0:
        raise InvalidRequestError(f'"timeout" must be a non-negative number, got {value}')
    return float(value)
