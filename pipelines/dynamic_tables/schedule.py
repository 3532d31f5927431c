"""When dynamic tables refresh: target lags, periods, the graph rules and the due ticks.

Pure functions of their arguments (no clock, catalog or Spark), so the rules are tested with
plain integers, and the service, ``session.refresh_due()`` and SHOW get one answer. Times
are integers in microseconds since the Unix epoch (UTC). The alignment rule (reference 004:
lag 1 min -> every 48 s, 2 min -> every 96 s): a time lag refreshes every ``period(lag)``,
the largest ``48 s * 2**k`` (k >= -6) at most 0.8 * lag (the 20 % margin is for the refresh
itself), at the multiples of that period since the epoch. The doubling ladder makes every
slower period a multiple of every faster one, so tables refreshed together share one data
timestamp. A DOWNSTREAM table refreshes only for the active time-lag tables reading it.
No lag is shorter than that of a time-lag table it reads, so a reader's tick is always a
tick of its upstreams too.
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ingest_sdk.durations import DURATION_FORMS, read_duration

__all__ = [
    "BASE_PERIOD_US", "MAX_TARGET_LAG_US", "MIN_PERIOD_US", "MIN_TARGET_LAG_US", "Node",
    "Refresh", "TargetLag", "check_graph", "due", "effective_periods", "format_target_lag",
    "parse_target_lag", "period", "topological",
]  # fmt: skip

SECOND_US = 1_000_000
_UNITS = {"day": 86_400 * SECOND_US, "hour": 3_600 * SECOND_US, "minute": 60 * SECOND_US,
          "second": SECOND_US}  # fmt: skip
MIN_TARGET_LAG_US = SECOND_US
# Refresh history is kept 7 days, so with at most 7 days of lag (a period of at most
# 4.6 days) every table that refreshes has a refresh in its retained history.
MAX_TARGET_LAG_US = 7 * 86_400 * SECOND_US
BASE_PERIOD_US = 48 * SECOND_US  # reference 004: a 1 minute lag refreshes every 48 s
MIN_PERIOD_US = BASE_PERIOD_US // 64  # 0.75 s, k = -6: the period of a 1 second lag

ACCEPTED = (f"a quoted duration from 1 second to 7 days, in whole seconds, or DOWNSTREAM; "
            f"a duration is {DURATION_FORMS}")  # fmt: skip
# re.ASCII: otherwise IGNORECASE takes the long s for 's' and \s any Unicode space.
_DOWNSTREAM = re.compile(r"\s*downstream\s*", re.IGNORECASE | re.ASCII)


def _valid(lag_us: int) -> bool:
    return lag_us % SECOND_US == 0 and MIN_TARGET_LAG_US <= lag_us <= MAX_TARGET_LAG_US


@dataclass(frozen=True)
class TargetLag:
    """How stale a dynamic table may get: ``lag_us``, or None for DOWNSTREAM (refreshed
    only when a reader with a time lag needs it). Whole seconds, 1 second to 7 days, else
    ValueError."""

    lag_us: int | None

    def __post_init__(self) -> None:
        if self.lag_us is not None and not _valid(self.lag_us):
            raise ValueError(f"target lag of {self.lag_us} µs is out of range: {ACCEPTED}")

    def __str__(self) -> str:
        return format_target_lag(self)


def parse_target_lag(text: str) -> TargetLag:
    """Read TARGET_LAG as written: the string literal's content (a duration of
    :func:`ingest_sdk.durations.read_duration`'s grammar), or the keyword DOWNSTREAM.

    Raises:
        ValueError: anything else, with a message naming TARGET_LAG and the accepted forms.
    """
    if _DOWNSTREAM.fullmatch(text):
        return TargetLag(None)
    shown = repr(text if len(text) <= 40 else text[:40] + "...")
    try:
        lag_us = read_duration(text, "TARGET_LAG") * SECOND_US
    except ValueError:
        raise ValueError(f"TARGET_LAG {shown} is not valid: write {ACCEPTED}") from None
    if lag_us.denominator != 1 or not _valid(int(lag_us)):
        raise ValueError(f"TARGET_LAG {shown} is out of range: write {ACCEPTED}")
    return TargetLag(int(lag_us))


def format_target_lag(lag: TargetLag) -> str:
    """The canonical text of ``lag`` (largest whole unit: '2 minutes', not '120 seconds'),
    which :func:`parse_target_lag` reads back to the same value."""
    return "DOWNSTREAM" if lag.lag_us is None else _lag_text(lag.lag_us)


def _lag_text(lag_us: int) -> str:
    for unit, size in _UNITS.items():
        if lag_us % size == 0:
            n = lag_us // size
            return f"{n} {unit}" if n == 1 else f"{n} {unit}s"
    return f"{lag_us} µs"  # not a valid lag; only for messages about one


def period(lag_us: int) -> int:
    """The refresh period of a time lag: the largest ``48 s * 2**k`` (k >= -6) that is at
    most 0.8 * ``lag_us``.

    Raises:
        ValueError: a lag under 1 second.
    """
    if lag_us < MIN_TARGET_LAG_US:
        raise ValueError(f"target lag of {lag_us} µs is under the minimum of 1 second")
    result = MIN_PERIOD_US
    while 2 * result * 5 <= lag_us * 4:  # 2p <= 0.8 * lag, in integers
        result *= 2
    return result


@dataclass(frozen=True)
class Node:
    """A dynamic table as the scheduler sees it.

    ``upstream`` names the dynamic tables it reads; names not among the nodes given (base
    tables) are ignored, as they have no schedule. ``lag_us`` None is DOWNSTREAM;
    ``active`` False is SUSPENDED (or not yet initialized).
    """

    name: str
    lag_us: int | None
    upstream: tuple[str, ...] = ()
    active: bool = True


@dataclass(frozen=True)
class Refresh:
    """Refresh ``name`` for data timestamp ``tick_us``.

    ``skipped_ticks`` counts the table's ticks after its previously handled tick and before
    this one: they will never run (one SKIPPED history row, ``last_skipped_us`` the latest),
    so a scheduler that fell behind catches up at once instead of working off a backlog.
    """

    name: str
    tick_us: int
    skipped_ticks: int = 0
    last_skipped_us: int | None = None


_Graph = dict[str, Node]


def _index(nodes: Iterable[Node]) -> _Graph:
    index: _Graph = {}
    for node in nodes:
        if node.name in index:
            raise ValueError(f"dynamic table {node.name} is given twice")
        index[node.name] = node
    return index


def _upstream(index: _Graph, name: str) -> list[str]:
    return sorted({up for up in index[name].upstream if up in index})


def _readers(index: _Graph) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {name: [] for name in index}
    for name in sorted(index):
        for up in _upstream(index, name):
            readers[up].append(name)
    return readers


def _order(index: _Graph) -> list[str]:
    waiting = {name: len(_upstream(index, name)) for name in index}
    readers = _readers(index)
    ready = [name for name, count in waiting.items() if count == 0]
    heapq.heapify(ready)  # the smallest name first among the ready: a stable order
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for reader in readers[name]:
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, reader)
    if len(order) < len(index):
        # Every table left waits on another one left: following the smallest of those from
        # the smallest name must come back to a table already on the path.
        left = set(index) - set(order)
        path = [min(left)]
        while (up := min(set(_upstream(index, path[-1])) & left)) not in path:
            path.append(up)
        cycle = [*path[path.index(up) :], up]
        raise ValueError(
            f"dynamic tables may not read each other in a cycle: {' reads '.join(cycle)}"
        )
    return order


def topological(nodes: Iterable[Node]) -> list[str]:
    """Names upstream first, the order of the refreshes of one tick; ties by name, so the
    order never depends on the order of ``nodes``.

    Raises:
        ValueError: a cycle (named) or a name given twice.
    """
    return _order(_index(nodes))


def _slowest_upstream(index: _Graph, name: str) -> tuple[str, list[str]] | None:
    """The time-lag table with the longest lag upstream of ``name`` (through any tables),
    with the tables between; None when there is none."""
    via: dict[str, str] = {}
    queue: deque[str] = deque([name])
    best, best_lag = None, 0
    while queue:  # breadth-first: the path reported is a shortest one
        current = queue.popleft()
        for up in _upstream(index, current):
            if up in via:
                continue
            via[up] = current
            queue.append(up)
            lag = index[up].lag_us
            if lag is not None and (best is None or (-lag, up) < (-best_lag, best)):
                best, best_lag = up, lag
    if best is None:
        return None
    path, step = [], via[best]
    while step != name:
        path.append(step)
        step = via[step]
    return best, path[::-1]


def check_graph(nodes: Iterable[Node]) -> None:
    """Refuse a graph the scheduler could not keep aligned (CREATE, ALTER and RESUME check
    the whole graph they change). No time lag may be shorter than one upstream of it, also
    through DOWNSTREAM tables (U 10 min <- X DOWNSTREAM <- D 1 min: X would read U every
    48 s, U refreshes every 384 s). Suspended tables count, so RESUME needs no other rule.

    Raises:
        ValueError: a cycle, a lag out of range, or a lag shorter than an upstream's; the
            message names the tables and the lag to set.
    """
    index = _index(nodes)
    for name in _order(index):
        lag, slowest = index[name].lag_us, _slowest_upstream(index, name)
        if lag is not None and not _valid(lag):
            raise ValueError(f"{name}'s target lag of {lag} µs is out of range: {ACCEPTED}")
        if lag is None or slowest is None:
            continue
        upstream, path = slowest
        upstream_lag = index[upstream].lag_us
        if upstream_lag is not None and upstream_lag > lag:
            through = f" through {', '.join(path)}" if path else ""
            need = _lag_text(upstream_lag)
            raise ValueError(
                f"{name}'s target lag {_lag_text(lag)} is shorter than {need} of {upstream}, "
                f"which {name} reads{through}; set TARGET_LAG to at least {need}"
            )


def _periods(index: _Graph, order: list[str]) -> dict[str, int | None]:
    readers, periods = _readers(index), dict[str, int | None]()
    for name in reversed(order):  # readers first
        node = index[name]
        if not node.active:
            periods[name] = None  # nor does it pull its upstreams: its period is None to them
        elif node.lag_us is not None:
            periods[name] = period(node.lag_us)
        else:  # an active DOWNSTREAM reader passes on what its own readers need
            needed = (periods[reader] for reader in readers[name])
            periods[name] = min((p for p in needed if p is not None), default=None)
    return periods


def effective_periods(nodes: Iterable[Node]) -> dict[str, int | None]:
    """Each table's refresh period in µs, None when it is not refreshed on a schedule.

    A time-lag table: ``period(lag)``. A DOWNSTREAM table: the shortest period of the active
    time-lag tables reading it, directly or through active DOWNSTREAM tables (None when
    there are none: DOWNSTREAM means "when a reader needs it"). A suspended table: None,
    and it pulls no upstream, so a DOWNSTREAM table read only by it stops too.

    Raises:
        ValueError: a cycle, a name given twice, or a lag under 1 second.
    """
    index = _index(nodes)
    return _periods(index, _order(index))


def due(nodes: Iterable[Node], last_ticks: Mapping[str, int | None], now_us: int) -> list[Refresh]:
    """The refreshes due at ``now_us``, by data timestamp, upstream first within one.

    A table with period p runs its latest tick ``now_us // p * p`` if that is after its last
    handled tick (``last_ticks``, absent or None: none); the ticks between are reported
    skipped in that entry, never run. It also runs each tick a reader runs at here, if not
    handled yet: a reader for T reads its upstreams' refreshes for T, and after a stall their
    latest ticks can differ (B 48 s, A 96 s, stalled to 0:02:30: A's 0:01:36 needs B's
    0:01:36, B's latest is 0:02:24). At most one run per distinct period downstream.

    Callers record the largest tick run as the last tick (a skipped one is handled too);
    after an initial refresh, its data timestamp. A suspended table keeps its last tick, so
    its first refresh after RESUME reports the ticks it missed as skipped.

    Raises:
        ValueError: a cycle, a name given twice, or a lag under 1 second.
    """
    index = _index(nodes)
    order, readers = _order(index), _readers(index)
    periods = _periods(index, order)
    runs: dict[str, list[int]] = {}
    result: list[Refresh] = []
    for name in reversed(order):  # readers first: their ticks are wanted upstream
        p = periods[name]
        if p is None:
            continue
        previous = last_ticks.get(name)
        wanted = {now_us // p * p}
        for reader in readers[name]:
            # A tick off this table's grid only comes from a graph breaking the lag rule;
            # running there would break alignment, so the reader's refresh skips instead.
            wanted.update(tick for tick in runs.get(reader, ()) if tick % p == 0)
        runs[name] = sorted(tick for tick in wanted if previous is None or tick > previous)
        for tick in runs[name]:
            skipped = 0 if previous is None else (tick - (previous // p + 1) * p) // p
            result.append(Refresh(name, tick, skipped, tick - p if skipped else None))
            previous = tick
    position = {name: i for i, name in enumerate(order)}
    result.sort(key=lambda refresh: (refresh.tick_us, position[refresh.name]))
    return result
