"""The deadline of the statement running in this thread (or task), so that waits
outside Spark (another transaction's commit in the way) end with the statement's
timeout instead of holding the service's one SQL worker past it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["past_deadline", "seconds_left", "statement_deadline"]

_DEADLINE: ContextVar[float | None] = ContextVar("statement_deadline", default=None)


@contextmanager
def statement_deadline(seconds: float) -> Iterator[None]:
    """Statements run inside the block have ``seconds`` from now."""
    token = _DEADLINE.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def seconds_left() -> float | None:
    """Seconds until the running statement's deadline (never negative); None without one."""
    deadline = _DEADLINE.get()
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def past_deadline() -> bool:
    return seconds_left() == 0.0
