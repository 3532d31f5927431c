"""Failpoints: named places in the durability path where tests make the process fail.

Set ``INGEST_FAILPOINTS`` to a comma-separated list of ``name=action`` before
the process starts. Actions: ``kill`` (SIGKILL this process, as a power cut
would) and ``error`` (raise :class:`InjectedFailure`, as a full disk would).
``error*N`` raises only the first N times. Production never sets the variable,
so every failpoint is a dictionary lookup that finds nothing.
"""

from __future__ import annotations

import os
import signal

__all__ = ["InjectedFailure", "failpoint"]

ENV_VAR = "INGEST_FAILPOINTS"


class InjectedFailure(RuntimeError):
    """Raised by an ``error`` failpoint."""


def _parse(spec: str) -> dict[str, list[object]]:
    points: dict[str, list[object]] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        kind, _, count = (action or "kill").partition("*")
        points[name] = [kind, int(count) if count else None]
    return points


_POINTS = _parse(os.environ.get(ENV_VAR, ""))


def failpoint(name: str) -> None:
    """Fail here if the environment asked for it."""
    point = _POINTS.get(name)
    if point is None:
        return
    kind, remaining = point
    if remaining is not None:
        if remaining <= 0:  # type: ignore[operator]
            return
        point[1] = remaining - 1  # type: ignore[operator]
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFailure(f"failpoint {name}")
