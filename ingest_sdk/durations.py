"""Durations given as seconds or as text such as ``"1 second"`` or ``"2 minutes"``."""

from __future__ import annotations

import re

from ingest_sdk.errors import ConfigurationError

__all__ = ["MAX_CLIENT_LAG", "MIN_CLIENT_LAG", "parse_duration", "parse_max_client_lag"]

MIN_CLIENT_LAG = 0.05
MAX_CLIENT_LAG = 600.0
_UNITS = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
}  # fmt: skip
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_duration(value: float | int | str, what: str = "duration") -> float:
    """Seconds of ``1.5``, ``"1.5"``, ``"250 ms"``, ``"1 second"``, ``"2 minutes"``.

    Raises:
        ConfigurationError: the value is not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a number of seconds or text, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION_RE.fullmatch(value)):
        unit = match.group(2).lower() or "s"
        if unit not in _UNITS:
            raise ConfigurationError(
                f"{what}: unknown unit {match.group(2)!r} in {value!r}; use ms, seconds, "
                "minutes, hours or days"
            )
        seconds = float(match.group(1)) * _UNITS[unit]
    else:
        raise ConfigurationError(
            f"{what} must be seconds (1.5) or text such as '1 second' or '2 minutes', got {value!r}"
        )
    if not seconds >= 0:
        raise ConfigurationError(f"{what} must not be negative, got {value!r}")
    return seconds


def parse_max_client_lag(value: float | int | str) -> float:
    """``max_client_lag`` in seconds, within 0.05 s .. 10 minutes."""
    seconds = parse_duration(value, "max_client_lag")
    if not MIN_CLIENT_LAG <= seconds <= MAX_CLIENT_LAG:
        raise ConfigurationError(
            f"max_client_lag must be between 0.05 seconds and 10 minutes, got {value!r}"
        )
    return seconds
