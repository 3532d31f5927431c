"""``POST /v1/sql`` of a running service, read as JSON with the standard library and
orjson: no Arrow here, so the command starts in a fraction of a second. The column
types the answer names turn the JSON values back into the Python values Spark's
``collect()`` gives a local session (decimals, timestamps, dates), so both print alike.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import orjson

from pipelines.cli.output import Rows
from pipelines.errors import SqlError

__all__ = ["ServiceRunner", "service_error", "transaction_kind"]

#: Rows the service answers at most (``max_rows`` of ``POST /v1/sql``).
SERVICE_MAX_ROWS = 1_000_000
#: Seconds to wait for the service's answer: its own statement timeout (300 s) and some.
SERVICE_WAIT = 330.0
#: How to give the token, named in the service's "missing or wrong token" answer.
TOKEN_HINT = "pass --token TOKEN or set $INGEST_TOKEN to a token the service was started with"


class ServiceRunner:
    """``POST /v1/sql`` of a running service, in one service session per CLI process
    (``cli-<random hex>``), so a transaction opened on one prompt line is the one the
    next lines run in."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.session = f"cli-{secrets.token_hex(8)}"
        self.where = f"warehouse of the service at {self.url}"
        self.in_transaction = False  # a BEGIN went through and no COMMIT/ROLLBACK since
        # No proxy from the environment, as the SDK (aiohttp) does not use one either.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def rows(self, statement: str, limit: int, wait: float = SERVICE_WAIT) -> Rows:
        body = {"statement": statement, "session": self.session,
                "max_rows": min(limit, SERVICE_MAX_ROWS)}  # fmt: skip
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            f"{self.url}/v1/sql", data=orjson.dumps(body), headers=headers, method="POST"
        )
        try:
            with self._opener.open(request, timeout=wait) as response:
                data = response.read()
        except urllib.error.HTTPError as error:
            raise service_error(error.code, error.read()) from None
        except OSError as error:  # refused, unknown host, timed out (URLError included)
            reason = getattr(error, "reason", None) or error
            message = f"cannot reach the service at {self.url}: {reason} (is it running?)"
            raise SqlError(message, "SERVICE_UNREACHABLE") from None
        self._track(statement)
        names, rows = self._decode(data)
        if limit > SERVICE_MAX_ROWS and len(rows) == SERVICE_MAX_ROWS:
            print(f"note: the service answers at most {SERVICE_MAX_ROWS} rows; more may "
                  "have been left out", file=sys.stderr)  # fmt: skip
        return names, rows

    def _decode(self, data: bytes) -> Rows:
        try:
            answer = orjson.loads(data)
            columns = answer["columns"]
            readers = [_reader(str(column["type"])) for column in columns]
            rows = [tuple(r(v) for r, v in zip(readers, row, strict=True))
                    for row in answer["rows"]]  # fmt: skip
            return [str(column["name"]) for column in columns], rows
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            raise SqlError(f"{self.url}/v1/sql did not answer with rows: is it the ingest "
                           "service?", "BAD_ANSWER") from None  # fmt: skip

    def _track(self, statement: str) -> None:
        """Follow the session's transaction from the statements that succeeded."""
        kind = transaction_kind(statement)
        if kind is not None:
            self.in_transaction = kind == "begin"

    def close(self) -> None:
        """Roll back a transaction left open, as closing a local session does (the
        service would otherwise keep it until it evicts the session)."""
        if self.in_transaction:
            with contextlib.suppress(SqlError):
                self.rows("ROLLBACK", 1, wait=30.0)


#: ``pipelines.sql.statements``' three transaction statements, matched here so the client
#: does not compile that module's hundred patterns (a test checks that both agree).
_TRANSACTION = re.compile(
    r"\s*(?:(?P<begin>(?:BEGIN|START)(?:\s+(?:TRANSACTION|WORK))?(?:\s+NAME\s+\S+)?)"
    r"|(?P<commit>COMMIT(?:\s+WORK)?)|(?P<rollback>ROLLBACK(?:\s+WORK)?))\s*;?\s*",
    re.IGNORECASE,
)


def transaction_kind(statement: str) -> str | None:
    """``begin``, ``commit`` or ``rollback`` for those statements, else None."""
    match = _TRANSACTION.fullmatch(statement)
    return None if match is None else match.lastgroup


def _local_time(text: str) -> datetime:
    """A zoned timestamp as a naive local time, as Spark's ``collect()`` gives it."""
    return datetime.fromisoformat(text).astimezone().replace(tzinfo=None)


_FLOAT_TEXT = {"NaN", "Infinity", "-Infinity"}
_READERS: list[tuple[re.Pattern[str], Callable[[Any], Any]]] = [
    (re.compile(r"decimal\d*\("), lambda v: Decimal(v) if isinstance(v, str) else v),
    (re.compile(r"timestamp\[\w+, tz="), _local_time),
    (re.compile(r"timestamp\["), datetime.fromisoformat),
    (re.compile(r"date\d+\["), date.fromisoformat),
    (re.compile(r"(?:double|float|halffloat)$"), lambda v: float(v) if v in _FLOAT_TEXT else v),
    (re.compile(r"(?:large_)?binary$"), bytes.fromhex),
]


def _reader(arrow_type: str) -> Callable[[Any], Any]:
    """How to turn one column's JSON values (named by their Arrow type) back into the
    Python values Arrow would give; None stays None."""
    for pattern, read in _READERS:
        if pattern.match(arrow_type):
            return lambda v, read=read: None if v is None else read(v)  # type: ignore[misc]
    return lambda v: v


def service_error(status: int, body: bytes) -> SqlError:
    """The service's error answer as a SqlError with the statement's own code; a missing
    or wrong token names this command's flags, not the HTTP header."""
    try:
        error = orjson.loads(body)["error"]
        code = str(error.get("sql_code") or error.get("code") or f"HTTP_{status}")
        message = str(error.get("message", ""))
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace").strip()[:300]
        return SqlError(f"the service answered {status}: {text}", f"HTTP_{status}")
    if status == 401:
        message = f"{message.split(':', 1)[0]}: {TOKEN_HINT}"
    return SqlError(message, code)
