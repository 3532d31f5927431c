"""Parsing JSON rows so that every number keeps the digits it was written with.

Row values sent as JSON (the HTTP rows endpoint, the Kafka bridge) are data: a
30-digit amount must not come back rounded through a float. Control calls keep
plain ``orjson.loads`` (``ingest_sdk.wire.loads``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

__all__ = ["loads_exact"]


def loads_exact(body: bytes | str) -> Any:
    """JSON whose numbers keep every digit as written (rows of data, not control calls).

    orjson turns integers beyond 64 bits and every number with a fraction or an
    exponent into a ``float``, which silently drops digits. Here a number comes
    back as orjson gives it when that is exact (an ``int`` in the 64-bit range, a
    ``float`` whose shortest text has the value written), and otherwise as an
    exact ``int`` of any size or a ``decimal.Decimal``. So a body without such
    numbers parses exactly as with ``orjson.loads``.

    Most bodies hold only short numbers and are parsed by orjson alone: a scan of
    the raw bytes finds the few numbers that could lose digits, and only when
    one of them really would does the slower exact parser run.

    Raises:
        ValueError: the body is not valid JSON (``orjson.JSONDecodeError`` with
            orjson's message, as for ``orjson.loads``), an integer has more digits
            than Python parses (4300 by default), or an exponent is beyond what
            ``Decimal`` holds (about 10^18).
    """
    # A str is only scanned as bytes (orjson refuses its surrogates); bytearray and
    # memoryview are taken as orjson takes them.
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    exact_source = body if isinstance(body, str) else data
    if _may_lose_digits(data):
        return _loads_exact_slow(exact_source)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        # orjson refuses numbers beyond the double range ("1E400"): valid JSON, kept exact.
        if not _UNSIGNED_WIDE_EXPONENT_RE.search(data):
            raise
        try:
            return _loads_exact_slow(exact_source)
        except ValueError:
            raise exc from None


# -- exact JSON numbers (loads_exact) -------------------------------------------------------
#
# Which numbers can orjson get wrong? An integer outside [-2^63, 2^64) (it has 19+
# digits), and a number with a fraction or exponent whose double does not have the
# value written. A number with at most 15 significant digits and an exponent of at
# most two digits lies in the normal double range, so its double's shortest text
# has its value (DBL_DIG = 15). What is left has a run of 16+ characters of [0-9.]
# or an exponent of 3+ digits. A negative exponent always carries its "-"; an
# unsigned one can only overflow, which orjson refuses, and then the exact parser runs.
#
# The scan maps digits and "." to \x01 (a byte valid JSON never holds raw), "+" to
# "-" and "E" to "e"; it counts long runs with a substring search and finds wide
# exponents that end where a number ends (not inside a UUID like "04ad-330e-998a")
# with a regular expression whose literal prefix keeps it at C speed. Each hit is
# then checked: one inside a string is not a JSON number token. Past _MAX_CHECKED
# hits (a body full of 17-digit doubles), checking them one by one costs more than
# the exact parser.

_MARK = bytes.maketrans(b"0123456789.+E", b"\x01" * 11 + b"-e")
_LONG_RUN = b"\x01" * 16
_SIGNED_WIDE_EXPONENT_RE = re.compile(rb"e-\x01{3,}(?=[,\]} \t\r\n]|\Z)")
_UNSIGNED_WIDE_EXPONENT_RE = re.compile(rb"[0-9][eE][0-9]{3}")
_MAX_CHECKED = 1024
_MAX_TOKEN = 64  # characters scanned around a hit; a longer number goes to the exact parser
_NUMBER_CHARS = frozenset(b"0123456789.eE+-")
_BEFORE_NUMBER = frozenset(b":,[ \t\r\n")  # what may precede a JSON number
_AFTER_NUMBER = frozenset(b",]} \t\r\n")
_JSON_NUMBER_RE = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# orjson returns these integers as int, larger ones as float.
_ORJSON_INT_MIN, _ORJSON_INT_MAX = -(2**63), 2**64 - 1
_MAX_NUMBER_SHOWN = 100  # characters of a number repeated in an error message


def _exact_float(text: str) -> float | None:
    """The float of a JSON number with a fraction or exponent when it is exact, else None.

    Exact means the float's shortest text (``repr``, which every converter reads)
    has the value written, so keeping the float loses nothing.
    """
    value = float(text)
    if not math.isfinite(value):
        return None
    shortest = repr(value)
    if shortest == text:
        return value
    try:
        return value if Decimal(shortest) == Decimal(text) else None
    except InvalidOperation:  # an exponent beyond Decimal: certainly not exact
        return None


def _token_loses_digits(data: bytes, start: int, end: int) -> tuple[bool, int]:
    """Whether the run of number characters around ``data[start:end]`` is a JSON number
    that orjson would not return exactly (also when the run is too long to judge), and
    where the run ends."""
    low, high = max(0, start - _MAX_TOKEN), min(len(data), end + _MAX_TOKEN)
    while start > low and data[start - 1] in _NUMBER_CHARS:
        start -= 1
    while end < high and data[end] in _NUMBER_CHARS:
        end += 1
    if (start == low and low) or (end == high and high < len(data)):
        return True, end  # a very long run: let the exact parser judge it
    token = data[start:end]
    if (
        (start and data[start - 1] not in _BEFORE_NUMBER)
        or (end < len(data) and data[end] not in _AFTER_NUMBER)
        or not _JSON_NUMBER_RE.fullmatch(token)
    ):
        return False, end  # text inside a string (or invalid JSON, which orjson refuses)
    if b"." in token or b"e" in token or b"E" in token:
        return _exact_float(token.decode()) is None, end
    return not _ORJSON_INT_MIN <= int(token) <= _ORJSON_INT_MAX, end


def _may_lose_digits(data: bytes) -> bool:
    """Whether orjson could round a number of this JSON text (false alarms cost only time)."""
    marked = data.translate(_MARK)
    long_runs = marked.count(_LONG_RUN)  # fast: the pattern skips 17 bytes at a miss
    if long_runs > _MAX_CHECKED:
        return True
    budget = _MAX_CHECKED
    position = marked.find(_LONG_RUN) if long_runs else -1
    while position >= 0:
        budget -= 1
        loses, end = _token_loses_digits(data, position, position + len(_LONG_RUN))
        if loses:
            return True
        position = marked.find(_LONG_RUN, end)
    for match in _SIGNED_WIDE_EXPONENT_RE.finditer(marked):  # usually none
        budget -= 1
        if budget < 0 or _token_loses_digits(data, *match.span())[0]:
            return True
    return False


class _Refused(ValueError):
    """A number or constant the exact parser refuses; the message says why."""


def _too_long_integer(text: str) -> ValueError | None:
    """The error for an integer longer than Python parses, if ``text`` holds one."""
    limit = sys.get_int_max_str_digits()
    found = limit and re.search(rf"(?<![0-9.eE+-])-?([0-9]{{{limit + 1},}})(?![0-9.eE])", text)
    if not found:
        return None
    digits = len(found.group(1))
    return ValueError(f"a JSON integer has {digits} digits; at most {limit} are accepted")


def _parse_float(text: str) -> float | Decimal:
    """A float when it holds the number exactly (the very value orjson returns), else a Decimal."""
    value = float(text)
    shortest = repr(value)
    if shortest == text:
        return value  # the common case, kept short: this runs for every number
    try:
        number = Decimal(text)
    except InvalidOperation as exc:
        shown = text if len(text) <= _MAX_NUMBER_SHOWN else text[:_MAX_NUMBER_SHOWN] + "..."
        raise _Refused(f"the JSON number {shown} has an exponent out of range") from exc
    return value if math.isfinite(value) and Decimal(shortest) == number else number


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON")


def _refuse_lone_surrogates(value: Any) -> None:
    """Refuse strings with an unpaired surrogate (``"\\ud800"``), as orjson does."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ValueError("a JSON string holds an unpaired surrogate escape") from exc
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _loads_exact_slow(body: bytes | str) -> Any:
    """The exact parser: the stdlib's, with exact number hooks and orjson's refusals."""
    text = body.decode("utf-8") if isinstance(body, bytes) else body
    try:
        # Integers stay on the C fast path; int() refuses the over-long ones.
        value = json.loads(text, parse_float=_parse_float, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise ValueError("the JSON is nested too deeply") from exc
    except (json.JSONDecodeError, _Refused):
        raise
    except ValueError as exc:  # int()'s refusal: say so plainly, not "use sys.set_int_max..."
        too_long = _too_long_integer(text)
        if too_long is None:
            raise
        raise too_long from exc
    if "\\u" in text or isinstance(body, str):  # decoded bytes hold no raw surrogate
        _refuse_lone_surrogates(value)
    return value
