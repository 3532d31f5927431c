"""The one duration grammar (ingest_sdk.durations.read_duration): every spelling of a unit
reads to the same seconds, and any other text is a ValueError naming the clause and the
accepted forms, never another exception."""

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest_sdk import ConfigurationError
from ingest_sdk.durations import DURATION_FORMS, parse_duration, read_duration

SPELLINGS = {
    Fraction(1, 1000): ["ms", "msec", "msecs", "millisecond", "milliseconds"],
    Fraction(1): ["s", "sec", "secs", "second", "seconds"],
    Fraction(60): ["m", "min", "mins", "minute", "minutes"],
    Fraction(3600): ["h", "hr", "hrs", "hour", "hours"],
    Fraction(86400): ["d", "day", "days"],
}
UNITS = [(size, word) for size, words in SPELLINGS.items() for word in words]


@pytest.mark.parametrize(
    "text", ["5 seconds", "5 second", "5s", "5 s", "5 sec", "5 SECONDS", "5Sec", " 5 s ",
             "5\tseconds", "5000 ms", "05 s", "5.0 s", "5. s"],
)  # fmt: skip
def test_the_spellings_of_five_seconds(text):
    assert read_duration(text, "X") == 5


@given(
    st.integers(0, 10**9),
    st.sampled_from(UNITS),
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.sampled_from(["", " ", "\t", "  "]),
    st.sampled_from(["", " ", "\t"]),
)
def test_every_spelling_reads_to_the_same_seconds(n, unit, upper, pad, gap):
    size, word = unit
    cased = "".join(c.upper() if u else c for c, u in zip(word, upper, strict=False))
    assert read_duration(f"{pad}{n}{gap}{cased}{pad}", "X") == n * size
    # The canonical spelling of the same unit gives the same value.
    assert read_duration(f"{n} {SPELLINGS[size][-1]}", "X") == n * size


@given(st.integers(0, 10**6), st.integers(0, 999), st.sampled_from(UNITS))
def test_decimals_are_exact(whole, thousandths, unit):
    size, word = unit
    text = f"{whole}.{thousandths:03d} {word}"
    assert read_duration(text, "X") == (whole + Fraction(thousandths, 1000)) * size


PIECES = ["1", "5", "0", "9" * 30, ".", " ", "\t", "\n", "\u00a0", "-", "+", "e", "s", "ms",
          "min", "Hours", "d", "day", "weeks", "'", "\u017f", "\u0665", "\x00", "_"]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(), st.lists(st.sampled_from(PIECES), max_size=7).map("".join)))
def test_any_text_is_a_duration_or_a_value_error_naming_the_clause(text):
    try:
        seconds = read_duration(text, "RETENTION")
    except ValueError as exc:
        assert str(exc).startswith("RETENTION ")
        assert "out of range" in str(exc) or DURATION_FORMS in str(exc)
    else:
        assert isinstance(seconds, Fraction) and seconds >= 0


@pytest.mark.parametrize(
    "text", ["", "5", "s", "-5 s", "+5 s", "5 s s", "1e3 s", "5\u00a0s", "\u0665 s",
             "1 \u017fec", "5 minutes ago"],
)  # fmt: skip
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match=r"^TARGET_LAG .* is not a duration: write a number"):
        read_duration(text, "TARGET_LAG")


@pytest.mark.parametrize(("text", "unit"), [("5 weeks", "weeks"), ("2fortnights", "fortnights"),
                                             ("1 SECONDSS", "SECONDSS")])  # fmt: skip
def test_an_unknown_unit_is_named(text, unit):
    with pytest.raises(ValueError, match=f"has an unknown unit {unit!r}: write a number"):
        read_duration(text, "X")


def test_hostile_lengths_are_refused_in_linear_time():
    # A pattern that could split the runs two ways would take minutes of CPU here.
    started = time.process_time()
    for text in ("9" * 100_000 + " s", "9" * 50_000 + " " * 50_000 + "!",
                 " " * 100_000 + "!", "5" + " " * 100_000 + "x!"):  # fmt: skip
        with pytest.raises(ValueError):
            read_duration(text, "X")
    assert time.process_time() - started < 2.0


def test_the_sdk_also_takes_a_plain_number_of_seconds():
    assert parse_duration("1.5") == parse_duration(1.5) == parse_duration("1500 ms") == 1.5
    with pytest.raises(ConfigurationError, match="max_client_lag 'soon' is not a duration"):
        parse_duration("soon", "max_client_lag")
    with pytest.raises(ConfigurationError, match="max_client_lag '-1' is not a duration"):
        parse_duration("-1", "max_client_lag")
    with pytest.raises(ConfigurationError, match="must not be negative"):
        parse_duration(-1.0)
    with pytest.raises(ConfigurationError, match="duration None is not a duration"):
        parse_duration(None)  # type: ignore[arg-type]
