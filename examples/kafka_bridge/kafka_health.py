"""Kafka client health: a few lines that say what is wrong, instead of librdkafka's stream.

Why: with no broker reachable, librdkafka reports every failed connection attempt through
both ``error_cb`` and its log, about 20 a second with default settings, forever; the one
fact that matters ("the broker is unreachable") drowns. Here each kind of report is said
once, then at most once per :data:`REMINDER_INTERVAL` with a count of what was held back,
and a fatal client error is kept for the run loop to stop on.

librdkafka hands errors and log lines to Python only while the application polls, so
these callbacks run on the bridge's own thread; no locking is needed.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

__all__ = ["CLIENT_SETTINGS", "REMINDER_INTERVAL", "KafkaHealth", "RepeatFilter"]

#: Seconds between two reports of the same kind (the first is said at once).
REMINDER_INTERVAL = 60.0

#: librdkafka settings shared by the consumer and the dead-letter producer.
CLIENT_SETTINGS: dict[str, Any] = {
    # The consumer group asks for its coordinator every ~50 ms while it has none, and each
    # ask expedites a reconnect, so librdkafka's exponential back-off never grows and a
    # missing broker is dialled ~20 times a second. A 1 s floor makes that ~2 a second;
    # a broker that comes back is still found within a second or two.
    "reconnect.backoff.ms": 1000,
    "reconnect.backoff.max.ms": 10000,
}

#: Errors that mean "no broker answers" (before the first connection, any of them).
UNREACHABLE = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})

_NUMBERS = re.compile(r"\d+")


class _Throttle:
    """Decides whether a report of some kind is said now, and how many were held back."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self.clock = clock
        self._said: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> tuple[bool, int, float]:
        """(say it now?, reports held back since it was last said, seconds since then)."""
        now = self.clock()
        last = self._said.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return False, 0, 0.0
        self._said[key] = now
        return True, self._held.pop(key, 0), (now - last) if last is not None else 0.0


def _held_note(held: int, seconds: float) -> str:
    return f" ({held} more like this in the last {seconds:.0f} s)" if held else ""


class RepeatFilter(logging.Filter):
    """Lets a log line through once per ``interval`` per text (numbers ignored, so
    "after 0ms" and "after 3ms" are the same line), noting how many were held back."""

    def __init__(
        self, interval: float = REMINDER_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._throttle = _Throttle(interval, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        say, held, seconds = self._throttle.allow(_NUMBERS.sub("#", message))
        if say and held:
            record.msg, record.args = message + _held_note(held, seconds), ()
        return say


class KafkaHealth:
    """The ``error_cb`` of the bridge's Kafka clients.

    Args:
        bootstrap_servers: named in the messages, so the reader sees what was dialled.
        logger: where the reports go.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        logger: logging.Logger,
        interval: float = REMINDER_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.log = logger
        #: The first fatal error; the client is unusable after it and the bridge must stop.
        self.fatal: KafkaError | None = None
        #: Set once a broker answered; until then every connection error means unreachable.
        self.connected = False
        self._throttle = _Throttle(interval, clock)

    def on_error(self, error: KafkaError) -> None:
        """Say what ``error`` means, once per kind and interval."""
        if error.fatal():
            if self.fatal is None:
                self.fatal = error
                self.log.error("fatal Kafka client error %s: %s", error.name(), error.str())
            return
        code = error.code()
        # After the first connection a single dropped connection is routine (idle brokers
        # close them); only "all brokers are down" then means unreachable.
        if code == KafkaError._ALL_BROKERS_DOWN or (not self.connected and code in UNREACHABLE):
            say, held, seconds = self._throttle.allow("unreachable")
            if say and not held:
                self.log.warning(
                    "Kafka broker(s) at %s unreachable: %s; retrying with back-off (this is "
                    "said once, then reminded every %.0f s)",
                    self.bootstrap_servers, error.str(), self._throttle.interval,
                )  # fmt: skip
            elif say:
                self.log.warning(
                    "Kafka broker(s) at %s still unreachable: %s%s",
                    self.bootstrap_servers, error.str(), _held_note(held, seconds),
                )  # fmt: skip
            return
        say, held, seconds = self._throttle.allow(_NUMBERS.sub("#", f"{code} {error.str()}"))
        if say:
            self.log.warning(
                "Kafka client error %s: %s%s", error.name(), error.str(), _held_note(held, seconds)
            )
