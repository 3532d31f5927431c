"""Converters for DATE, TIME and TIMESTAMP_NTZ/LTZ/TZ columns.

Storage (see docs/types.md): DATE as Arrow date32; TIME as fixed-width
text ``HH:MM:SS[.f]`` with exactly the column's fraction digits; TIMESTAMP_NTZ as
a wall-clock microsecond timestamp (Delta ``timestamp_ntz``); TIMESTAMP_LTZ and
TIMESTAMP_TZ as UTC microsecond instants (Delta ``timestamp``). Digits beyond
microseconds are truncated by storage; TIMESTAMP_TZ does not keep the offset.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime, time, tzinfo
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ingest_sdk.column_types import ColumnType, TypeKind
from ingest_sdk.errors import InvalidValueError
from ingest_sdk.temporal import (
    INTEGER_RE,
    NANOS_PER_DAY,
    NANOS_PER_SECOND,
    datetime_instant_nanos,
    datetime_wall_nanos,
    days_from_civil,
    epoch_to_nanos,
    local_to_utc_nanos,
    parse_moment,
    parse_time_of_day,
    truncate_fraction,
    year_of_days,
)
from ingest_sdk.values import NoneType, ValueConverter

__all__ = ["DateConverter", "TimeConverter", "TimestampConverter"]

_INTEGER_STORED = (
    "an integer epoch value in UTC (seconds, milliseconds, microseconds or nanoseconds, "
    "inferred from its magnitude)"
)
_MIN_TIMESTAMP_NANOS = days_from_civil(1, 1, 1) * NANOS_PER_DAY
_MAX_TIMESTAMP_NANOS = days_from_civil(10000, 1, 1) * NANOS_PER_DAY


def _integer_input(value: Any) -> int | None:
    """The integer of an integer-stored input (``int`` or integer string), else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER_RE.fullmatch(value):
        return int(value)
    return None


def _unparsable(column_type: ColumnType) -> InvalidValueError:
    return InvalidValueError(f"the text is not a valid {column_type.kind.value} layout")


class DateConverter(ValueConverter):
    """DATE: the local date of the input; offsets are not applied (no shift to UTC)."""

    accepted = (
        "a date, a datetime, an ISO date string such as '2013-04-28' (a time and offset may "
        f"follow), or {_INTEGER_STORED}; years -9999..9999"
    )
    fast_types = frozenset({date, NoneType})

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        return pa.array(values, pa.date32())

    def build(self, storage_values: list[Any]) -> pa.Array:
        return pa.array(storage_values, pa.int32()).cast(pa.date32())

    def convert(self, value: Any) -> Any:
        if isinstance(value, datetime):
            return datetime_wall_nanos(value) // NANOS_PER_DAY
        if isinstance(value, date):
            return (
                datetime_wall_nanos(datetime(value.year, value.month, value.day)) // NANOS_PER_DAY
            )
        if isinstance(value, str):
            value = value.strip()
        elif isinstance(value, bool) or not isinstance(value, int):
            raise self.type_error(value)
        integer = _integer_input(value)
        if integer is not None:
            days = epoch_to_nanos(integer) // NANOS_PER_DAY
            year = year_of_days(days)
        else:
            parsed = parse_moment(value)
            if parsed is None:
                raise _unparsable(self.column_type)
            days, year = parsed.days, parsed.year
        if not -9999 <= year <= 9999:
            raise InvalidValueError(f"year {year} is outside the DATE range -9999..9999")
        return days


class TimeConverter(ValueConverter):
    """TIME(p): the time of day; a given offset is ignored; stored as fixed-width text."""

    accepted = (
        "a time, a datetime, a string such as '20:57', '20:57:01' or '20:57:01.123456789' "
        f"(a full timestamp string gives its time), or {_INTEGER_STORED}"
    )

    def __init__(self, column_type: ColumnType) -> None:
        super().__init__(column_type)
        assert column_type.precision is not None
        self.precision = column_type.precision

    def convert(self, value: Any) -> Any:
        if isinstance(value, (time, datetime)):
            nanos = (
                value.hour * 3600 + value.minute * 60 + value.second
            ) * NANOS_PER_SECOND + value.microsecond * 1000
        elif isinstance(value, (date, bool)):
            raise self.type_error(value)
        elif isinstance(value, (str, int)):
            text = value.strip() if isinstance(value, str) else value
            integer = _integer_input(text)
            if integer is not None:
                nanos = epoch_to_nanos(integer) % NANOS_PER_DAY
            else:
                assert isinstance(text, str)
                found = parse_time_of_day(text)
                if found is None:
                    parsed = parse_moment(text)
                    if parsed is None or not parsed.has_time:
                        raise _unparsable(self.column_type)
                    found = parsed.nanos_of_day
                nanos = found
        else:
            raise self.type_error(value)
        return self._format(truncate_fraction(nanos, self.precision))

    def _format(self, nanos: int) -> str:
        seconds, fraction = divmod(nanos, NANOS_PER_SECOND)
        hours, rest = divmod(seconds, 3600)
        text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        if self.precision:
            text += "." + f"{fraction:09d}"[: self.precision]
        return text


class TimestampConverter(ValueConverter):
    """TIMESTAMP_NTZ keeps the wall clock; LTZ/TZ store the UTC instant.

    Inputs without an offset are wall-clock times in the channel's default time
    zone for LTZ/TZ. Integer-stored inputs are UTC instants for every kind.
    """

    accepted = (
        "a datetime (naive or aware), a date, an ISO string such as "
        f"'2013-04-28T20:57:01.123456789+07:00' (a space may replace the T), or {_INTEGER_STORED}; "
        "years 1..9999"
    )
    fast_types = frozenset({datetime, NoneType})

    def __init__(self, column_type: ColumnType, default_zone: tzinfo) -> None:
        super().__init__(column_type)
        assert column_type.precision is not None
        self.precision = column_type.precision
        self.wall_clock = column_type.kind is TypeKind.TIMESTAMP_NTZ
        self.zone = default_zone
        self.micro_unit = 10 ** max(0, 6 - self.precision)

    def fast_array(self, values: Sequence[Any]) -> pa.Array | None:
        # pyarrow shifts aware datetimes to UTC and reads naive ones as UTC; only
        # the case that matches the column's meaning is taken here.
        want_aware = not self.wall_clock
        for value in values:
            if value is not None and (value.tzinfo is not None) is not want_aware:
                return None
        array = pa.array(values, self.arrow_type)
        if self.micro_unit > 1:  # truncate the fraction to the column precision (toward -inf)
            return pc.floor_temporal(array, multiple=self.micro_unit, unit="microsecond")
        return array

    def build(self, storage_values: list[Any]) -> pa.Array:
        return pa.array(storage_values, pa.int64()).cast(self.arrow_type)

    def convert(self, value: Any) -> Any:
        if isinstance(value, datetime):
            if self.wall_clock or value.tzinfo is None:
                nanos = datetime_wall_nanos(value)
                if not self.wall_clock:
                    days, of_day = divmod(nanos, NANOS_PER_DAY)
                    nanos = local_to_utc_nanos(days, of_day, self.zone)
            else:
                nanos = datetime_instant_nanos(value)
        elif isinstance(value, date):
            nanos = datetime_wall_nanos(datetime(value.year, value.month, value.day))
            if not self.wall_clock:
                nanos = local_to_utc_nanos(nanos // NANOS_PER_DAY, 0, self.zone)
        elif isinstance(value, (str, int)) and not isinstance(value, bool):
            nanos = self._from_text_or_epoch(value.strip() if isinstance(value, str) else value)
        else:
            raise self.type_error(value)
        nanos = truncate_fraction(nanos, self.precision)
        return nanos // 1000  # storage keeps microseconds

    def _from_text_or_epoch(self, value: str | int) -> int:
        integer = _integer_input(value)
        if integer is not None:
            nanos = epoch_to_nanos(integer)
            if not _MIN_TIMESTAMP_NANOS <= nanos < _MAX_TIMESTAMP_NANOS:
                raise InvalidValueError("the epoch value is outside years 1..9999")
            return nanos
        assert isinstance(value, str)
        parsed = parse_moment(value)
        if parsed is None:
            raise _unparsable(self.column_type)
        if not 1 <= parsed.year <= 9999:
            raise InvalidValueError(f"year {parsed.year} is outside the TIMESTAMP range 1..9999")
        wall = parsed.days * NANOS_PER_DAY + parsed.nanos_of_day
        if self.wall_clock:
            return wall
        if parsed.offset_seconds is not None:
            return wall - parsed.offset_seconds * NANOS_PER_SECOND
        return local_to_utc_nanos(parsed.days, parsed.nanos_of_day, self.zone)
