"""Positions in a change stream, as the SDK's reader keeps them: timestamps in µs since
the epoch, a data change record's position in its partition, and a partition's state."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from ingest_sdk.change_records import DataChangeRecord
from ingest_sdk.errors import ConfigurationError

__all__ = ["Partition", "Position", "after", "position", "rfc3339", "to_datetime", "to_micros"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The latest epoch second a timestamp may be given as (9999-12-31T23:59:59Z).
_LATEST_S = 253_402_300_799
ACCEPTED = (
    "RFC 3339 text ('2026-01-31T12:00:00Z', UTC unless an offset is given), a datetime "
    "(naive: UTC), or a number of seconds since 1970-01-01T00:00:00Z (1769860800)"
)


def to_micros(value: str | datetime | int | float, name: str = "timestamp") -> int:
    """A timestamp in µs since the epoch: RFC 3339 text, a datetime (naive means UTC), or
    a number, read as seconds since the epoch (an int or float; a bool is refused)."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("z", "Z"))
        except ValueError:
            raise ConfigurationError(
                f"{name} {value[:60]!r} is not a timestamp; write it as {ACCEPTED}"
            ) from None
    elif isinstance(value, datetime):
        moment = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        return _epoch_seconds(value, name)
    else:
        raise ConfigurationError(
            f"{name} must be a timestamp: {ACCEPTED}; got {type(value).__name__}"
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _epoch_seconds(value: int | float, name: str) -> int:
    """Seconds since the epoch in µs, exactly (a float by its shortest decimal form)."""
    if not (math.isfinite(value) and 0 <= value <= _LATEST_S):
        raise ConfigurationError(
            f"{name} {value!r} is not a timestamp: a number is read as seconds since "
            f"1970-01-01T00:00:00Z, from 0 to {_LATEST_S} (milliseconds are not read); "
            f"write it as {ACCEPTED}"
        )
    return int((Decimal(repr(value)) * 1_000_000).to_integral_value())


def to_datetime(micros: int) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def rfc3339(micros: int) -> str:
    """µs since the epoch as ``2026-01-31T12:00:00.123456Z`` (exact: no float)."""
    return to_datetime(micros).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: (commit µs, table_name, record_sequence, server_transaction_id); compared on the
#: first three, the order records of one partition come in.
Position = tuple[int, str, str, str]


def position(change: DataChangeRecord | dict[str, Any]) -> Position:
    """A data change record's position: the record, or its body as JSON."""
    if isinstance(change, DataChangeRecord):
        return (
            to_micros(change.commit_timestamp),
            change.table_name,
            change.record_sequence,
            change.server_transaction_id,
        )
    return (
        to_micros(change["commit_timestamp"]),
        str(change["table_name"]),
        str(change["record_sequence"]),
        str(change.get("server_transaction_id", "")),
    )


def after(pos: Position, last: Position | None) -> bool:
    return last is None or pos[:3] > last[:3]


@dataclass(slots=True)
class Partition:
    """One partition as the reader knows it. ``watermark``/``last`` are what was handed
    to the callback (delivery loop only); ``read_watermark``/``read_last`` what the
    partition's thread queued (its own), from which a retried query resumes."""

    token: str
    parents: tuple[str, ...]
    start_us: int
    watermark: int
    last: Position | None = None
    state: str = "open"  # open | finished (its child record handed) | ended (end_timestamp)
    started: bool = False
    read_watermark: int = 0
    read_last: Position | None = None
    dirty: bool = False
