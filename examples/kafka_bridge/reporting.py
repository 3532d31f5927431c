"""What the bridge says: its metrics line and how log lines name offsets and records.

Why a module of its own: these are the words an operator reads when something goes
wrong, so they are plain functions, tested without a broker. Rules: no librdkafka
sentinel numbers (-1001 means "no offset" only to librdkafka), rates over the last
interval, and records named ``topic[partition]@offset``, never by their row number
inside one insert batch.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, Message

__all__ = ["Metrics", "describe_offset", "describe_resume", "record_error", "record_name"]


@dataclass
class Metrics:
    """Counters since start; rates over the last interval (an average since start hides a
    stall behind hours of good throughput)."""

    records: int = 0
    rows: int = 0
    bad_records: int = 0
    dlq_records: int = 0
    reopens: int = 0
    partitions: int = 0
    lag: dict[str, int] = field(default_factory=dict)
    _mark: tuple[float, int, int] = field(
        default_factory=lambda: (time.monotonic(), 0, 0), repr=False
    )

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """The metrics line; starts the next rate interval."""
        now = time.monotonic() if now is None else now
        since, records, rows = self._mark
        seconds = max(now - since, 1e-9)
        self._mark = (now, self.records, self.rows)
        return {
            "records": self.records,
            "records_per_s": round((self.records - records) / seconds, 1),
            "rows": self.rows,
            "rows_per_s": round((self.rows - rows) / seconds, 1),
            "interval_s": round(seconds, 1),
            "bad_records": self.bad_records,
            "dlq_records": self.dlq_records,
            "reopens": self.reopens,
            "partitions": self.partitions,
            "lag": dict(self.lag),
        }


def describe_offset(offset: int, auto_offset_reset: str) -> str:
    """An offset in words: librdkafka's sentinels (-2, -1, -1000, -1001) mean nothing to a
    reader of the log."""
    if offset == OFFSET_BEGINNING:
        return "from the earliest offset"
    if offset == OFFSET_END:
        return "from the latest offset"
    if offset == OFFSET_STORED:
        return "from the group's committed offset"
    if offset == OFFSET_INVALID:
        return f"from the {auto_offset_reset} offset (auto.offset.reset)"
    return f"at offset {offset}"


def describe_resume(
    offset: int, source: Literal["token", "group", "reset"], auto_offset_reset: str
) -> str:
    """Where an assigned partition resumes and why, for the assignment log line."""
    where = describe_offset(offset, auto_offset_reset)
    if source == "token":
        return f"{where}, right after the channel's committed offset token"
    if source == "group":
        return f"{where}, the group's committed offset (the channel has no token yet)"
    return f"{where}: the channel has no token and the group no committed offset"


def record_name(message: Message) -> str:
    """``topic[partition]@offset``: how log lines name a Kafka record."""
    return f"{message.topic()}[{message.partition()}]@{message.offset()}"


_ROW_PREFIX = re.compile(r"^Row \d+(?:, |: | )?")


def record_error(error: str) -> str:
    """A conversion error without its "Row N" prefix: N counts rows inside one insert batch,
    which means nothing outside the bridge; the Kafka record is named beside it instead."""
    return _ROW_PREFIX.sub("", error, count=1)
