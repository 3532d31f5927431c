"""Why the bridge stops: one root, each class carrying the exit status of the process.

::

    BridgeError                  exit 1: the bridge cannot go on (the message says why and the fix)
    ├── ConfigurationError       exit 2: the mapping does not fit the tables (checked at start-up,
    │                                    before anything is consumed), like a bad flag
    └── KafkaUnavailableError    exit 1: no broker answered within --broker-timeout, or the
                                         Kafka client hit a fatal error (e.g. another bridge
                                         joined with the same --instance-id)

``python -m examples.kafka_bridge`` logs the message of any of these and exits with
``exit_code``, so supervisors can tell a configuration mistake (do not restart) from an
outage (restart later).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = ["BridgeError", "ConfigurationError", "KafkaUnavailableError"]


class BridgeError(Exception):
    """The bridge cannot go on; the message names the cause and the fix."""

    exit_code: ClassVar[int] = 1


class ConfigurationError(BridgeError):
    """The mapping does not fit the tables: a missing table or column, a column of a type
    that cannot hold the Kafka metadata stored in it."""

    exit_code: ClassVar[int] = 2


class KafkaUnavailableError(BridgeError):
    """No broker answered in time, or the Kafka client reported a fatal error."""
