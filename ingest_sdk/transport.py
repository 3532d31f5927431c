"""The one HTTP boundary of the SDK.

All requests go through :class:`Transport`. It translates every aiohttp error
into :class:`TransportError` and every error answer into the class the wire
code names (:data:`ERRORS_BY_CODE`), and retries what is safe to repeat:
retriable errors only, with jittered exponential backoff, or the server's
``Retry-After`` for backpressure (429). Data calls carry ``(generation,
batch_seq)``, so repeating one never duplicates rows.
"""

from __future__ import annotations

import io
import random
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_exponential_jitter,
)

from ingest_sdk.errors import (
    ERRORS_BY_CODE,
    BackpressureError,
    IngestError,
    ServerError,
    ServiceError,
    ServiceUnreachableError,
    TransportError,
)
from ingest_sdk.wire import dumps, loads

__all__ = ["RetryPolicy", "Timeouts", "Transport"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long and how fast retriable calls are repeated."""

    initial: float = 0.05
    maximum: float = 2.0
    #: Give up (and fail the channel) after this many seconds of retrying one call.
    deadline: float = 120.0


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 10.0
    #: Per request; long waits (wait_for_commit, close) add their own timeout to this.
    request: float = 60.0


DEFAULT_TIMEOUTS = Timeouts()
DEFAULT_RETRY = RetryPolicy()
#: Longest line of a streamed answer (one change stream record); a longer one is a broken
#: stream.
MAX_LINE_BYTES = 1 << 30


def _is_retriable(exc: BaseException) -> bool:
    return isinstance(exc, IngestError) and exc.retriable


def _refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a refused connection (nothing listens at the address)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return isinstance(exc.os_error, ConnectionRefusedError)
    return isinstance(exc, ConnectionRefusedError)


class _Wait:
    """Backoff: the server's Retry-After for 429, else jittered exponential.

    Retry-After is jittered too (0.5x to 1.5x): producers refused together must not all
    come back in the same instant, again and again.
    """

    def __init__(self, policy: RetryPolicy) -> None:
        self._backoff = wait_exponential_jitter(
            multiplier=policy.initial, max=policy.maximum, jitter=policy.initial
        )

    def __call__(self, state: RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        if isinstance(error, BackpressureError):
            return float(error.details.get("retry_after", 0.5)) * random.uniform(0.5, 1.5)
        return float(self._backoff(state))


def error_from_answer(status: int, body: bytes) -> ServiceError:
    """The SDK error for an error answer of the server."""
    try:
        error = loads(body)["error"]
        code, message = str(error["code"]), str(error["message"])
        details = {k: v for k, v in error.items() if k not in ("code", "message")}
    except (ValueError, KeyError, TypeError):
        code, message, details = "", body[:500].decode(errors="replace"), {}
    cls = ERRORS_BY_CODE.get(code)
    if cls is None:
        cls = ServerError if status >= 500 else ERRORS_BY_CODE["BAD_REQUEST"]
    return cls(message or f"HTTP {status}", **details)


class Transport:
    """One aiohttp session per client; create and use it inside one event loop."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self.url = url.rstrip("/")
        self.retry = retry
        self.timeouts = timeouts
        #: Whether the service has answered this transport once (any status). Before
        #: that, a refused connection is a wrong URL or a service not started: it fails
        #: at once. After, it is a restart: retried up to the deadline.
        self.answered = False
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect),
            json_serialize=lambda value: dumps(value).decode(),
        )

    async def close(self) -> None:
        await self._session.close()

    async def _once(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        data: bytes | None,
        headers: Mapping[str, str] | None,
        params: Mapping[str, str] | None,
        timeout: float,
        server: str | None = None,
    ) -> Any:
        try:
            async with self._session.request(
                method,
                (server or self.url) + path,
                json=json,
                # A stream over a copy for each attempt: aiohttp warns of raw bytes over
                # 1 MiB (a ResourceWarning, an error where warnings are), and a retry
                # must send the whole body again.
                data=io.BytesIO(data) if data is not None else None,
                headers=headers,
                params=params,
                timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=self.timeouts.connect),
            ) as response:
                self.answered = True
                body = await response.read()
                if response.status >= 400:
                    raise error_from_answer(response.status, body)
                return loads(body) if body else None
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            failure = self._failure(method, path, exc)
            raise failure from failure.__cause__

    def _failure(self, method: str, path: str, exc: BaseException) -> TransportError:
        """The error for a request that got no answer: :class:`ServiceUnreachableError`
        for a refused connection before the service ever answered, else the retriable
        :class:`TransportError`."""
        if not self.answered and _refused(exc):
            # No cause: the message says it all, without aiohttp's frames.
            return ServiceUnreachableError(
                f"cannot connect to {self.url} ({method} {path}): connection refused, and no "
                "service has answered this client there yet; check that the service is "
                "running and that the URL's host and port are the ones it listens on"
            )
        failure = TransportError(
            f"{method} {path} to {self.url} failed: {type(exc).__name__}: {exc}"
        )
        failure.__cause__ = exc
        return failure

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        extra_timeout: float = 0.0,
        retry: bool = True,
        server: str | None = None,
    ) -> Any:
        """Send one request (to ``server``, a channel's, instead of the client's URL);
        retry it while the error says that is safe.

        Raises:
            ServiceError: the server's answer, as its class (after retries, if retriable).
            TransportError: the server stayed unreachable.
        """
        timeout = self.timeouts.request + extra_timeout
        if not retry:
            return await self._once(method, path, json=json, data=data, headers=headers,
                                    params=params, timeout=timeout, server=server)  # fmt: skip
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_is_retriable),
            wait=_Wait(self.retry),
            stop=stop_after_delay(self.retry.deadline),
            reraise=True,
        ):
            with attempt:
                return await self._once(method, path, json=json, data=data, headers=headers,
                                        params=params, timeout=timeout, server=server)  # fmt: skip
        raise AssertionError("unreachable")  # pragma: no cover

    async def stream_lines(
        self, path: str, *, params: Mapping[str, str], idle_timeout: float
    ) -> AsyncGenerator[bytes, None]:
        """``GET`` an answer streamed as lines (NDJSON), and yield its lines as they come,
        without their newline. Opening it is retried while the error says that is safe
        (nothing was received yet); once it began, nothing is retried.

        Close the generator (``aclose``) to end the request early: that closes the
        connection, which tells the server to stop.

        Args:
            idle_timeout: seconds the answer may stay silent before it counts as broken.

        Raises:
            ServiceError: the server's error answer, as its class (after retries).
            TransportError: the server stayed unreachable, or the connection broke or went
                silent after the answer began (the caller resumes where it got to).
        """
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_is_retriable),
            wait=_Wait(self.retry),
            stop=stop_after_delay(self.retry.deadline),
            reraise=True,
        ):
            with attempt:
                response = await self._open_stream(path, params, idle_timeout)
        try:
            async for line in _lines(response.content):
                yield line
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            raise TransportError(
                f"GET {path} to {self.url} broke after the answer began: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        finally:
            if response.content.at_eof():
                response.release()
            else:
                response.close()  # the connection goes: the server stops the request

    async def _open_stream(
        self, path: str, params: Mapping[str, str], idle_timeout: float
    ) -> aiohttp.ClientResponse:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeouts.connect, sock_read=idle_timeout
        )
        try:
            response = await self._session.get(self.url + path, params=params, timeout=timeout)
            self.answered = True
            if response.status < 400:
                return response
            try:
                body = await response.read()
            finally:
                response.release()
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            failure = self._failure("GET", path, exc)
            raise failure from failure.__cause__
        raise error_from_answer(response.status, body)


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The lines of a streamed body as they arrive (each newline is looked for once; a
    line may span many chunks)."""
    pending = bytearray()
    async for chunk in content.iter_any():
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if pending:
                pending += chunk[start:end]
                line = bytes(pending)
                pending.clear()
            else:
                line = chunk[start:end]
            if line:
                yield line
            start = end + 1
        pending += chunk[start:]
        if len(pending) > MAX_LINE_BYTES:
            raise TransportError(f"a line of the answer is longer than {MAX_LINE_BYTES} bytes")
    if pending:
        yield bytes(pending)
