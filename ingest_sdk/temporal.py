"""Parsing of date, time and timestamp inputs into exact integer instants.

Everything is computed in integers (days since 1970-01-01, nanoseconds of the
day, offset seconds), because Python's ``datetime`` stops at microseconds and at
year 1, while the seed system keeps nanoseconds and DATE reaches year -9999.

Rules that producers depend on (from the reference SDK):
- strings are trimmed; an integer string is an *integer-stored* epoch value in
  UTC whose unit follows its magnitude (:func:`epoch_to_nanos`);
- fractions beyond the column precision are truncated, never rounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo

from ingest_sdk.errors import InvalidValueError

__all__ = [
    "NANOS_PER_DAY",
    "ParsedMoment",
    "days_from_civil",
    "epoch_to_nanos",
    "moment_micros",
    "parse_moment",
    "parse_time_of_day",
    "truncate_fraction",
]

NANOS_PER_SECOND = 1_000_000_000
NANOS_PER_DAY = 86_400 * NANOS_PER_SECOND
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_UTC_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Magnitude bounds of integer-stored values (about year 2969 in each unit).
_SECONDS_BOUND = 31_536_000_000
_MILLIS_BOUND = 31_536_000_000_000
_MICROS_BOUND = 31_536_000_000_000_000

INTEGER_RE = re.compile(r"[+-]?\d+")
_OFFSET = r"(?P<tz>[Zz]|[+-]\d{2}(?::?\d{2})?)"
_TIME = r"(?P<h>\d{1,2}):(?P<mi>\d{2})(?::(?P<s>\d{2})(?:\.(?P<f>\d{1,9}))?)?"
_MOMENT_RE = re.compile(
    rf"(?P<y>[+-]?\d{{4,5}})-(?P<mo>\d{{1,2}})-(?P<d>\d{{1,2}})(?:[Tt ]\s*{_TIME})?\s*{_OFFSET}?"
)
_TIME_ONLY_RE = re.compile(rf"{_TIME}\s*{_OFFSET}?")

_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _is_leap(year: int) -> bool:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar (any year).

    Raises:
        InvalidValueError: the month or day does not exist (e.g. 2023-02-29).
    """
    if not 1 <= month <= 12:
        raise InvalidValueError(f"month {month} does not exist")
    last = 29 if month == 2 and _is_leap(year) else _DAYS_IN_MONTH[month - 1]
    if not 1 <= day <= last:
        raise InvalidValueError(f"day {day} does not exist in {year:04d}-{month:02d}")
    # Howard Hinnant's days_from_civil.
    y = year - (month <= 2)
    era = y // 400
    yoe = y - era * 400
    mp = (month + 9) % 12
    doy = (153 * mp + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def year_of_days(days: int) -> int:
    """The proleptic Gregorian year of a day count since 1970-01-01."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    mp = (5 * (doe - (365 * yoe + yoe // 4 - yoe // 100)) + 2) // 153
    return yoe + era * 400 + (1 if mp >= 10 else 0)


def truncate_fraction(nanos: int, precision: int) -> int:
    """Drop fractional-second digits beyond ``precision`` (toward the earlier instant)."""
    unit = 10 ** (9 - precision)
    return nanos - nanos % unit


def epoch_to_nanos(value: int) -> int:
    """Nanoseconds since the epoch (UTC) of an integer-stored value.

    The unit follows the magnitude, as in the reference SDK: below 31,536,000,000
    seconds, below 31,536,000,000,000 milliseconds, below 31,536,000,000,000,000
    microseconds, otherwise nanoseconds.
    """
    magnitude = abs(value)
    if magnitude < _SECONDS_BOUND:
        return value * NANOS_PER_SECOND
    if magnitude < _MILLIS_BOUND:
        return value * 1_000_000
    if magnitude < _MICROS_BOUND:
        return value * 1_000
    return value


@dataclass(frozen=True, slots=True)
class ParsedMoment:
    """A parsed date/time string: local calendar day, time of day, optional offset."""

    days: int
    nanos_of_day: int
    offset_seconds: int | None
    year: int
    has_time: bool


def _fraction_nanos(fraction: str | None) -> int:
    return int(fraction.ljust(9, "0")) if fraction else 0


def _nanos_of_day(match: re.Match[str]) -> int:
    hour, minute = int(match["h"]), int(match["mi"])
    second = int(match["s"] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise InvalidValueError(f"time {hour:02d}:{minute:02d}:{second:02d} does not exist")
    return (hour * 3600 + minute * 60 + second) * NANOS_PER_SECOND + _fraction_nanos(match["f"])


def _offset_seconds(text: str | None) -> int | None:
    if text is None:
        return None
    if text in ("Z", "z"):
        return 0
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:4] or 0)
    if hours > 18 or minutes > 59:
        raise InvalidValueError(f"time zone offset {text} does not exist")
    return sign * (hours * 3600 + minutes * 60)


def parse_moment(text: str) -> ParsedMoment | None:
    """Parse ``2013-04-28``, ``2013-04-28T20:57:01.123456789+07:00`` and their variants.

    A space may replace the ``T``; seconds and fraction are optional; the offset
    may be ``Z``, ``+07``, ``+0700`` or ``+07:00``. Returns ``None`` when the text
    has none of these layouts (the caller decides what else to try).

    Raises:
        InvalidValueError: the layout matches but the date or time does not exist.
    """
    match = _MOMENT_RE.fullmatch(text)
    if match is None:
        return None
    year = int(match["y"])
    days = days_from_civil(year, int(match["mo"]), int(match["d"]))
    has_time = match["h"] is not None
    nanos = _nanos_of_day(match) if has_time else 0
    return ParsedMoment(days, nanos, _offset_seconds(match["tz"]), year, has_time)


def moment_micros(text: str) -> int | None:
    """Microseconds since the epoch of a moment written as :func:`parse_moment` reads it
    (UTC when it has no offset; Snowflake's printed ``2026-12-01 10:00:00.000 -0800``
    too; a day alone is its midnight); None when it is not one.

    Raises:
        InvalidValueError: the layout matches but the date or time does not exist.
    """
    parsed = parse_moment(text.strip())
    if parsed is None:
        return None
    local = parsed.days * 86_400_000_000 + parsed.nanos_of_day // 1000
    return local - (parsed.offset_seconds or 0) * 1_000_000


def parse_time_of_day(text: str) -> int | None:
    """Nanoseconds of the day of ``20:57``, ``20:57:01``, ``20:57:01.123456789``.

    A trailing offset is accepted and ignored (TIME carries no zone). Returns
    ``None`` when the text is not a time of day.
    """
    match = _TIME_ONLY_RE.fullmatch(text)
    if match is None:
        return None
    _offset_seconds(match["tz"])  # validate, then ignore
    return _nanos_of_day(match)


def datetime_wall_nanos(value: datetime) -> int:
    """Nanoseconds since 1970-01-01T00:00 of the wall clock of a datetime (zone ignored)."""
    days = value.toordinal() - _EPOCH_ORDINAL
    seconds = value.hour * 3600 + value.minute * 60 + value.second
    return days * NANOS_PER_DAY + seconds * NANOS_PER_SECOND + value.microsecond * 1000


def datetime_instant_nanos(value: datetime) -> int:
    """Nanoseconds since the epoch of an aware datetime (exact, no float)."""
    return ((value - _UTC_EPOCH) // timedelta(microseconds=1)) * 1000


def local_to_utc_nanos(days: int, nanos_of_day: int, zone: tzinfo) -> int:
    """The UTC instant of a wall-clock time in ``zone`` (year 1..9999).

    On a daylight-saving gap or overlap the earlier offset (``fold=0``) is used.
    """
    seconds = nanos_of_day // NANOS_PER_SECOND
    wall = datetime.fromordinal(days + _EPOCH_ORDINAL) + timedelta(seconds=seconds)
    offset = wall.replace(tzinfo=zone).utcoffset() or timedelta(0)
    return days * NANOS_PER_DAY + nanos_of_day - (offset // timedelta(microseconds=1)) * 1000
