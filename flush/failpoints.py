"""Failpoints: named places in the durability path where tests make the process fail.

Set ``INGEST_FAILPOINTS`` to a comma-separated list of ``name=action`` before
the process starts. Actions: ``kill`` (SIGKILL this process, as a power cut
would), ``killsession`` (SIGKILL every process of its session: a Spark
application's driver, JVM and Python workers at once, when the failpoint runs in a
worker; start the application with ``start_new_session=True``)
and ``error`` (raise :class:`InjectedFailure`, as a full disk would).
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


def _kill_session() -> None:
    """SIGKILL every process in this process's session, this one last."""
    session, me = os.getsid(0), os.getpid()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != me:
            try:
                if os.getsid(int(entry)) == session:
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue  # gone already, or not ours
    os.kill(me, signal.SIGKILL)


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
    if kind == "killsession":
        _kill_session()
    raise InjectedFailure(f"failpoint {name}")
