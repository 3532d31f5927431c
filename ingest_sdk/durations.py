"""Durations: one grammar for every duration the system reads.

A duration is a number and a unit, with or without a space between them, in any case:
``'5 seconds'``, ``'5 second'``, ``'5 sec'``, ``'5 s'``, ``'5s'``, ``'1.5 hours'``. The
units are milliseconds (``ms``, ``msec``, ``millisecond``), seconds (``s``, ``sec``,
``second``), minutes (``m``, ``min``, ``minute``), hours (``h``, ``hr``, ``hour``) and days
(``d``, ``day``), the words also in the plural. :func:`read_duration` reads it; every place
that takes a duration calls it and adds its own limits: ``TARGET_LAG`` of dynamic tables,
``retention_period`` of change streams, ``max_client_lag`` of the SDK and the service, and
the service's command-line durations. Where a value may also be a plain number (the SDK
and the service's flags, :func:`parse_duration`), the number is seconds.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ingest_sdk.errors import ConfigurationError

__all__ = [
    "DURATION_FORMS", "MAX_CLIENT_LAG", "MIN_CLIENT_LAG", "parse_duration",
    "parse_max_client_lag", "read_duration",
]  # fmt: skip

MIN_CLIENT_LAG = 0.05
MAX_CLIENT_LAG = 600.0
_SIZES = {
    Fraction(1, 1000): ("ms", "msec", "msecs", "millisecond", "milliseconds"),
    Fraction(1): ("s", "sec", "secs", "second", "seconds"),
    Fraction(60): ("m", "min", "mins", "minute", "minutes"),
    Fraction(3_600): ("h", "hr", "hrs", "hour", "hours"),
    Fraction(86_400): ("d", "day", "days"),
}
_UNITS = {word: size for size, words in _SIZES.items() for word in words}
#: What every error about a duration lists.
DURATION_FORMS = (
    "a number and a unit, such as '5 seconds', '5 second', '5 sec', '5 s' or '5s'; the units "
    "are ms, seconds (sec, s), minutes (min, m), hours (hr, h) and days (d), in any case"
)
# re.ASCII: otherwise IGNORECASE takes the long s for 's' and \s any Unicode space. Matched
# after the ends are stripped: the digits, the spaces and the letters are then disjoint runs
# with one way to split them, so hostile text costs time linear in its length.
_DURATION = re.compile(r"(?:([0-9]+)(?:\.([0-9]*))?|\.([0-9]+))\s*([A-Za-z]+)", re.ASCII)
_SPACES = " \t\n\r\f\v"
#: More digits than any limit needs: refused before they are read (int()'s digit limit).
_MAX_DIGITS = 18


def read_duration(text: str, what: str) -> Fraction:
    """The seconds ``text`` names, exactly (``'1.5 hours'`` is 5400; ``'250 ms'`` is 1/4).

    Args:
        text: the duration as written (in SQL, the string literal's content).
        what: the clause or option it was given to, named in the error.

    Raises:
        ValueError: ``text`` is not a duration; the message names ``what`` and lists the
            accepted forms.
    """
    matched = _DURATION.fullmatch(text.strip(_SPACES)) if isinstance(text, str) else None
    if matched is None:
        raise ValueError(f"{what} {_shown(text)} is not a duration: write {DURATION_FORMS}")
    size = _UNITS.get(matched.group(4).lower())
    if size is None:
        raise ValueError(f"{what} {_shown(text)} has an unknown unit "
                         f"{_shown(matched.group(4))}: write {DURATION_FORMS}")  # fmt: skip
    whole = (matched.group(1) or "").lstrip("0")
    fraction = (matched.group(2) or matched.group(3) or "").rstrip("0")  # 1.50 is 1.5
    if len(whole) + len(fraction) > _MAX_DIGITS:
        raise ValueError(f"{what} {_shown(text)} is out of range")
    return Fraction(f"{whole or 0}.{fraction or 0}") * size


def _shown(text: object) -> str:
    if not isinstance(text, str):
        return repr(text)
    return repr(text if len(text) <= 40 else text[:40] + "...")


def parse_duration(value: float | int | str, what: str = "duration") -> float:
    """Seconds of ``1.5`` or ``"1.5"`` (a plain number is seconds), or of a duration such
    as ``"250 ms"``, ``"1 second"`` or ``"2 minutes"`` (:func:`read_duration`).

    Raises:
        ConfigurationError: the value is not a non-negative duration.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not value >= 0:
            raise ConfigurationError(f"{what} must not be negative, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # an int past the largest float: too long by far
            raise ConfigurationError(f"{what} {str(value)[:20]}... is out of range") from None
    text = value.strip(_SPACES) if isinstance(value, str) else ""
    # A plain number is seconds: the grammar with the unit left out.
    plain = text[-1:].isdigit() or text.endswith(".")
    try:
        return float(read_duration(f"{text} s" if plain else text, what))
    except ValueError as exc:
        message = str(exc)
        if plain or not isinstance(value, str):  # not the text read: say what was given
            message = f"{what} {_shown(value)} is not a duration: write {DURATION_FORMS}"
        raise ConfigurationError(f"{message}; or a plain number of seconds (1.5)") from None


def parse_max_client_lag(value: float | int | str) -> float:
    """``max_client_lag`` in seconds, within 0.05 s .. 10 minutes."""
    seconds = parse_duration(value, "max_client_lag")
    if not MIN_CLIENT_LAG <= seconds <= MAX_CLIENT_LAG:
        raise ConfigurationError(
            f"max_client_lag must be between 0.05 seconds and 10 minutes, got {value!r}"
        )
    return seconds
