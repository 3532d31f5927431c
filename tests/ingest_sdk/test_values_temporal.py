"""DATE, TIME and TIMESTAMP_NTZ/LTZ/TZ conversion rules, table-driven."""

from datetime import UTC, date, datetime, time, timedelta, timezone

import pytest

from ingest_sdk import ColumnType, InvalidTypeError, InvalidValueError
from ingest_sdk.rows import converter_for
from ingest_sdk.temporal import days_from_civil, epoch_to_nanos, year_of_days

from .conftest import check_case

T = InvalidTypeError
V = InvalidValueError
UTC = UTC
PLUS7 = timezone(timedelta(hours=7))

DATE_CASES = [
    ("DATE", date(2013, 4, 28), date(2013, 4, 28)),
    ("DATE", datetime(2013, 4, 28, 23, 0, tzinfo=PLUS7), date(2013, 4, 28)),  # local date
    ("DATE", datetime(2013, 4, 28, 1, 0), date(2013, 4, 28)),
    ("DATE", "2013-04-28", date(2013, 4, 28)),
    ("DATE", "  2013-04-28 ", date(2013, 4, 28)),
    ("DATE", "2013-04-28T20:57:01+07:00", date(2013, 4, 28)),
    ("DATE", "2013-04-28 23:59:59.999-08:00", date(2013, 4, 28)),  # no shift to UTC
    ("DATE", "2024-02-29", date(2024, 2, 29)),
    ("DATE", "1365638400", date(2013, 4, 11)),  # seconds
    ("DATE", 1365638400000, date(2013, 4, 11)),  # milliseconds
    ("DATE", "1365638400000000", date(2013, 4, 11)),  # microseconds
    ("DATE", 1365638400000000000, date(2013, 4, 11)),  # nanoseconds
    ("DATE", 0, date(1970, 1, 1)),
    ("DATE", "-86400", date(1969, 12, 31)),
    ("DATE", "2023-02-29", (V, "day 29 does not exist in 2023-02")),
    ("DATE", "2013-13-01", (V, "month 13 does not exist")),
    ("DATE", "10000-01-01", (V, "outside the DATE range -9999..9999")),
    ("DATE", "28/04/2013", (V, "not a valid DATE layout")),
    ("DATE", "hello", (V, "not a valid DATE layout")),
    ("DATE", True, (T, "a bool cannot be converted to DATE")),
    ("DATE", time(1, 2), (T, "a time cannot be converted to DATE")),
    ("DATE", 1.5, (T, "a float cannot be converted to DATE")),
]

TIME_CASES = [
    ("TIME", "20:57", "20:57:00.000000000"),
    ("TIME", "20:57:01", "20:57:01.000000000"),
    ("TIME", " 20:57:01.123456789 ", "20:57:01.123456789"),
    ("TIME", "20:57:01.123456789+07:00", "20:57:01.123456789"),  # offset ignored
    ("TIME", "2013-04-28T20:57:01.5", "20:57:01.500000000"),
    ("TIME", time(20, 57, 1, 123456), "20:57:01.123456000"),
    ("TIME", time(20, 57, 1, tzinfo=PLUS7), "20:57:01.000000000"),
    ("TIME", datetime(2013, 4, 28, 20, 57, 1), "20:57:01.000000000"),
    ("TIME", 1365642061, "01:01:01.000000000"),  # epoch seconds, UTC
    ("TIME", "1365642061000", "01:01:01.000000000"),
    ("TIME(3)", "20:57:01.123999", "20:57:01.123"),  # truncated, not rounded
    ("TIME(0)", "20:57:01.9", "20:57:01"),
    ("TIME(6)", time(0, 0, 0, 999999), "00:00:00.999999"),
    ("TIME", "24:00:00", (V, "does not exist")),
    ("TIME", "20:60", (V, "does not exist")),
    ("TIME", "2013-04-28", (V, "not a valid TIME layout")),
    ("TIME", "noon", (V, "not a valid TIME layout")),
    ("TIME", date(2013, 4, 28), (T, "a date cannot be converted to TIME(9)")),
    ("TIME", False, (T, "a bool cannot be converted")),
]

NTZ_CASES = [
    (
        "TIMESTAMP_NTZ",
        "2013-04-28T20:57:01.123456789+07:00",
        datetime(2013, 4, 28, 20, 57, 1, 123456),
    ),
    ("TIMESTAMP_NTZ", "2013-04-28 20:57", datetime(2013, 4, 28, 20, 57)),
    ("TIMESTAMP_NTZ", "2013-04-28", datetime(2013, 4, 28)),
    ("TIMESTAMP_NTZ", datetime(2020, 1, 1, 12, 0, 0, 7), datetime(2020, 1, 1, 12, 0, 0, 7)),
    (
        "TIMESTAMP_NTZ",
        datetime(2020, 1, 1, 12, tzinfo=PLUS7),
        datetime(2020, 1, 1, 12),
    ),  # wall clock
    ("TIMESTAMP_NTZ", date(2020, 1, 1), datetime(2020, 1, 1)),
    ("TIMESTAMP_NTZ", 1365638400, datetime(2013, 4, 11)),
    ("TIMESTAMP_NTZ", "1365638400123", datetime(2013, 4, 11, 0, 0, 0, 123000)),
    ("TIMESTAMP_NTZ", "1365638400123456", datetime(2013, 4, 11, 0, 0, 0, 123456)),
    ("TIMESTAMP_NTZ", 1365638400123456789, datetime(2013, 4, 11, 0, 0, 0, 123456)),
    ("TIMESTAMP_NTZ", -1, datetime(1969, 12, 31, 23, 59, 59)),
    ("TIMESTAMP_NTZ(0)", "2013-04-28 20:57:01.999", datetime(2013, 4, 28, 20, 57, 1)),
    (
        "TIMESTAMP_NTZ(3)",
        datetime(2013, 4, 28, 0, 0, 0, 123999),
        datetime(2013, 4, 28, 0, 0, 0, 123000),
    ),
    ("TIMESTAMP_NTZ(1)", "1969-12-31 23:59:59.99", datetime(1969, 12, 31, 23, 59, 59, 900000)),
    ("TIMESTAMP_NTZ", "0001-01-01 00:00:00", datetime(1, 1, 1)),
    ("TIMESTAMP_NTZ", "9999-12-31 23:59:59.999999", datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ("TIMESTAMP_NTZ", "0000-01-01", (V, "year 0 is outside the TIMESTAMP range 1..9999")),
    ("TIMESTAMP_NTZ", "10000-01-01", (V, "outside the TIMESTAMP range")),
    ("TIMESTAMP_NTZ", "2013-02-30 00:00", (V, "day 30 does not exist")),
    ("TIMESTAMP_NTZ", "2013-04-28T25:00", (V, "does not exist")),
    ("TIMESTAMP_NTZ", "2013-04-28X20:00", (V, "not a valid TIMESTAMP_NTZ layout")),
    ("TIMESTAMP_NTZ", "99999999999999999999999", (V, "outside years 1..9999")),
    ("TIMESTAMP_NTZ", time(1, 2), (T, "a time cannot be converted to TIMESTAMP_NTZ(9)")),
    ("TIMESTAMP_NTZ", True, (T, "a bool cannot be converted")),
    ("TIMESTAMP_NTZ", 1.5, (T, "a float cannot be converted")),
]

LTZ_CASES = [
    # No offset: the channel's default zone (America/Los_Angeles, PDT in April).
    ("TIMESTAMP_LTZ", "2013-04-28 20:57:01", datetime(2013, 4, 29, 3, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_LTZ", "2013-01-28 20:57:01", datetime(2013, 1, 29, 4, 57, 1, tzinfo=UTC)),  # PST
    ("TIMESTAMP_LTZ", "2013-04-28T20:57:01+07:00", datetime(2013, 4, 28, 13, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_LTZ", "2013-04-28T20:57:01+0700", datetime(2013, 4, 28, 13, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_LTZ", "2013-04-28T20:57:01+07", datetime(2013, 4, 28, 13, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_LTZ", "2013-04-28T20:57:01Z", datetime(2013, 4, 28, 20, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_LTZ", "2013-04-28 20:57:01 -05:30", datetime(2013, 4, 29, 2, 27, 1, tzinfo=UTC)),
    (
        "TIMESTAMP_LTZ",
        datetime(2013, 4, 28, 20, 57, 1),
        datetime(2013, 4, 29, 3, 57, 1, tzinfo=UTC),
    ),
    (
        "TIMESTAMP_LTZ",
        datetime(2013, 4, 28, 20, tzinfo=PLUS7),
        datetime(2013, 4, 28, 13, tzinfo=UTC),
    ),
    ("TIMESTAMP_LTZ", date(2013, 4, 28), datetime(2013, 4, 28, 7, tzinfo=UTC)),
    ("TIMESTAMP_LTZ", 1365638400, datetime(2013, 4, 11, tzinfo=UTC)),  # epochs are UTC
    (
        "TIMESTAMP_LTZ(2)",
        "2013-04-28T20:57:01.129Z",
        datetime(2013, 4, 28, 20, 57, 1, 120000, tzinfo=UTC),
    ),
    ("TIMESTAMP_LTZ", "2013-04-28T20:57:01+25:00", (V, "offset +25:00 does not exist")),
    ("TIMESTAMP_TZ", "2013-04-28T20:57:01+07:00", datetime(2013, 4, 28, 13, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_TZ", "2013-04-28 20:57:01", datetime(2013, 4, 29, 3, 57, 1, tzinfo=UTC)),
    ("TIMESTAMP_TZ", time(1), (T, "a time cannot be converted to TIMESTAMP_TZ(9)")),
]


@pytest.mark.parametrize(
    ("column_type", "value", "expected"), DATE_CASES + TIME_CASES + NTZ_CASES + LTZ_CASES
)
def test_temporal_conversion(column_type, value, expected):
    check_case(column_type, value, expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2013-04-28 20:57:01", datetime(2013, 4, 28, 20, 57, 1, tzinfo=UTC)),
        (datetime(2013, 4, 28, 20, 57, 1), datetime(2013, 4, 28, 20, 57, 1, tzinfo=UTC)),
    ],
)
def test_default_timezone_is_settable(value, expected):
    check_case("TIMESTAMP_LTZ", value, expected, default_timezone="UTC")
    check_case(
        "TIMESTAMP_LTZ",
        value,
        expected - timedelta(hours=9),
        default_timezone="Asia/Tokyo",
    )


def test_unknown_timezone_is_a_configuration_error():
    from ingest_sdk import ConfigurationError, ConversionOptions

    with pytest.raises(ConfigurationError, match="unknown time zone 'Mars/Base'"):
        ConversionOptions(default_timezone="Mars/Base")


@pytest.mark.parametrize(
    ("text", "days"),
    [
        ("-9999-01-01", days_from_civil(-9999, 1, 1)),
        ("9999-12-31", 2932896),
        ("0000-02-29", -719162 - 307),
    ],
)
def test_date_reaches_years_beyond_python(text, days):
    # Python's date stops at year 1; storage days are exact for the whole DATE range.
    converter = converter_for(ColumnType.parse("DATE"))
    assert converter.convert(text) == days
    assert year_of_days(days) == int(text[: text.index("-", 1)])


def test_calendar_helpers_agree_with_python():
    for day in (date(1, 1, 1), date(1600, 2, 29), date(1970, 1, 1), date(2024, 12, 31)):
        days = day.toordinal() - date(1970, 1, 1).toordinal()
        assert days_from_civil(day.year, day.month, day.day) == days
        assert year_of_days(days) == day.year


@pytest.mark.parametrize(
    ("value", "nanos"),
    [
        (31_535_999_999, 31_535_999_999 * 10**9),  # last value read as seconds
        (31_536_000_000, 31_536_000_000 * 10**6),  # first value read as milliseconds
        (31_536_000_000_000, 31_536_000_000_000 * 10**3),  # first microseconds
        (31_536_000_000_000_000, 31_536_000_000_000_000),  # first nanoseconds
        (-31_535_999_999, -31_535_999_999 * 10**9),
    ],
)
def test_integer_stored_unit_follows_magnitude(value, nanos):
    assert epoch_to_nanos(value) == nanos
