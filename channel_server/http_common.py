"""What every route of the service shares: the application's keys, the route table
type (``Expect`` answered as JSON), JSON answers, and the middlewares that answer every
error as JSON with its wire code and check the bearer token.

Every error a client can cause is an :class:`ingest_sdk.errors.IngestError` that
:func:`error_middleware` turns into a 4xx JSON answer with the wire code the SDK maps back
to the same class; a catalog that cannot be reached (:class:`catalog.CatalogUnavailableError`)
is a 503 ``CATALOG_UNAVAILABLE`` the SDK retries; anything else is a 500 and is logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import HttpVersion11, hdrs, web

from catalog import CatalogUnavailableError
from channel_server.service import IngestService
from flush.storage import describe_store_error, is_store_error
from ingest_sdk.errors import AuthenticationError, IngestError, InsertValidationError, error_code_of
from ingest_sdk.wire import dumps

__all__ = [
    "AUTH_TOKENS", "REQUEST_CHANNEL", "REQUEST_TABLE", "SERVICE", "Routes", "auth_middleware",
    "error_middleware", "insert_error_json", "json_answer",
]  # fmt: skip

log = logging.getLogger(__name__)
SERVICE = web.AppKey("service", IngestService)
AUTH_TOKENS = web.AppKey("auth_tokens", frozenset)
#: Keys of the request for the failure log line: the error, and the table and channel a
#: JSON body named (query and path parameters are read directly).
_FAILURE = web.RequestKey("failure", tuple)
REQUEST_TABLE = web.RequestKey("table", str)
REQUEST_CHANNEL = web.RequestKey("channel", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Seconds a client is told to wait before it repeats a call the catalog's outage failed.
CATALOG_RETRY_AFTER = 1.0


class Routes(web.RouteTableDef):
    """Routes whose ``Expect`` header is answered by :func:`_expect`."""

    def route(self, method: str, path: str, **kwargs: Any) -> Any:
        return super().route(method, path, expect_handler=_expect, **kwargs)


def json_answer(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(payload), status=status, content_type="application/json")


def _error_body(code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **details}}


def _internal_error(request: web.Request) -> web.Response:
    """A fault of ours, in the ``except`` block handling it: its traceback goes to the
    log, the client gets 500 without details."""
    log.exception("internal error in %s %s", request.method, request.path)
    message = "internal server error; the service log has the details"
    return _failure(request, 500, "INTERNAL", message, {})


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every error as JSON with its wire code, and log one line per failed request."""
    started = time.monotonic()
    try:
        return await handler(request)
    except asyncio.CancelledError:
        raise
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _failure(request, exc.status, f"HTTP_{exc.status}", exc.reason or "error", {})
    except InsertValidationError as exc:
        errors = [insert_error_json(exc.insert_error)]
        response = _failure(request, 400, "INSERT_VALIDATION", str(exc), {"insert_errors": errors})
    except IngestError as exc:
        status, code = error_code_of(exc)
        response = _failure(request, status, code, str(exc), getattr(exc, "details", {}))
    except CatalogUnavailableError as exc:  # the catalog's server is down or unreachable
        details = {"retry_after": CATALOG_RETRY_AFTER}
        response = _failure(request, 503, "CATALOG_UNAVAILABLE", str(exc), details)
    except OSError as exc:
        if not is_store_error(exc):  # a local file's error: a fault of ours
            response = _internal_error(request)
        else:  # the object store is down, unreachable or refused the call
            message = (f"the table storage failed: {describe_store_error(exc, 400)}; the call "
                       "did not complete: try it again (the SDK does)")  # fmt: skip
            details = {"retry_after": CATALOG_RETRY_AFTER}
            response = _failure(request, 503, "STORE_UNAVAILABLE", message, details)
    except Exception:
        response = _internal_error(request)
    _log_failure(request, response, time.monotonic() - started)
    if request.content.exception() is not None:
        # The body's stream broke (e.g. bad gzip): answer, then end the connection, and
        # mark the stream finished so aiohttp does not try to drain it (and fail loudly).
        response.force_close()
        request.content.feed_eof()
    return response


def _failure(
    request: web.Request, status: int, code: str, message: str, details: dict[str, Any]
) -> web.Response:
    request.app[SERVICE].metrics.rejected_requests.labels(code).inc()
    request[_FAILURE] = (code, message)
    response = json_answer(_error_body(code, message, **details), status)
    if "retry_after" in details:
        response.headers["Retry-After"] = f"{details['retry_after']:.3f}"
    return response


def _log_failure(request: web.Request, response: web.Response, seconds: float) -> None:
    code, message = request[_FAILURE]
    if code == "BACKPRESSURE":
        level = logging.DEBUG  # expected under load, counted in the metrics, retried
    else:
        level = logging.ERROR if response.status >= 500 else logging.WARNING
    query = request.rel_url.query
    log.log(
        level,
        "%s %s -> %d %s: %s",
        request.method,
        request.path,
        response.status,
        code,
        message,
        extra={
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "code": code,
            "table": request.get(REQUEST_TABLE)
            or request.match_info.get("name")
            or query.get("table"),
            "channel": request.get(REQUEST_CHANNEL) or query.get("channel"),
            "duration_ms": round(seconds * 1000, 1),
        },
    )


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    tokens = request.app[AUTH_TOKENS]
    if tokens and request.path.startswith("/v1/"):
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bearer ") or header[7:] not in tokens:
            raise AuthenticationError(
                "missing or wrong token: send 'Authorization: Bearer <token>' with a token "
                "the server was started with (--auth-token)"
            )
    return await handler(request)


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` answered as aiohttp does; any other expectation a JSON 417.

    aiohttp handles the header before the middlewares run, so its own refusal is plain
    text, and a 500 when the value holds bytes that are not UTF-8.
    """
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim answer is not part of the response
        return None
    message = f"unknown Expect header {expect[:100]!r}; send 'Expect: 100-continue' or none"
    response = _failure(request, 417, "HTTP_417", message, {})
    _log_failure(request, response, 0.0)
    return response


def insert_error_json(error: Any) -> dict[str, Any]:
    return {
        "row_index": error.row_index,
        "message": error.message,
        "extra_col_names": error.extra_col_names,
        "missing_not_null_col_names": error.missing_not_null_col_names,
        "null_value_for_not_null_col_names": error.null_value_for_not_null_col_names,
    }
