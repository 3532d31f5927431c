"""JSON numbers keep every digit: loads_exact, and each column type's use of what it returns.

orjson turns integers beyond 64 bits and every number with a fraction or exponent
into a float; rows of data are parsed with ``loads_exact`` instead (issue 9).
"""

import math
from datetime import datetime
from decimal import Decimal

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ingest_sdk import InvalidTypeError, InvalidValueError, convert_value, exact_json
from ingest_sdk.wire import loads_exact

ISSUE_BODY = b'{"rows":[{"N": 123456789012345678901234567890, "S": 12345678901234567890.12}]}'


def same(left, right):
    """Equal values of identical types all the way down (and -0.0 is not 0.0)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return list(left) == list(right) and all(same(left[k], right[k]) for k in left)
    if isinstance(left, list):
        return len(left) == len(right) and all(map(same, left, right))
    if isinstance(left, float):
        return left == right and math.copysign(1, left) == math.copysign(1, right)
    return left == right


# -- loads_exact -----------------------------------------------------------------------------


def test_the_issue_body_keeps_every_digit():
    row = loads_exact(ISSUE_BODY)["rows"][0]
    assert row["N"] == 123456789012345678901234567890 and type(row["N"]) is int
    assert row["S"] == Decimal("12345678901234567890.12") and type(row["S"]) is Decimal
    assert str(row["S"]) == "12345678901234567890.12"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123456789012345678901234567890", 123456789012345678901234567890),
        ("-123456789012345678901234567890", -123456789012345678901234567890),
        ("18446744073709551616", 2**64),  # one past what orjson keeps as int
        ("-9223372036854775809", -(2**63) - 1),
        ("0.30000000000000001", Decimal("0.30000000000000001")),  # float: 0.3
        ("12345678901234567890.12", Decimal("12345678901234567890.12")),
        ("1.00000000000000000000001", Decimal("1.00000000000000000000001")),
        ("1e400", Decimal("1E+400")),  # orjson refuses: "number is infinity"
        ("1E400", Decimal("1E+400")),
        ("-1e+400", Decimal("-1E+400")),
        ("1e-400", Decimal("1E-400")),  # float: 0.0
        ("1.2345678901234567e-310", Decimal("1.2345678901234567E-310")),  # float: subnormal
        ("1.23e-322", Decimal("1.23E-322")),  # float: 1.24e-322
        ("4e-324", Decimal("4E-324")),  # float: 5e-324
        ("9007199254740993.0", Decimal("9007199254740993.0")),  # float: 2**53
    ],
)
def test_numbers_a_float_would_round_come_back_exact(text, expected):
    shapes = [(f"[{text}]", 0), (f'{{"V": {text}}}', "V"), (text, None), (f" {text}\n", None)]
    for body, key in shapes:
        value = loads_exact(body.encode())
        got = value if key is None else value[key]
        assert got == expected and type(got) is type(expected), (body, got)
        if isinstance(expected, Decimal):
            assert got.as_tuple() == Decimal(text).as_tuple()  # the digits as written


@pytest.mark.parametrize(
    "text",
    ["1.5", "0.1", "-0.0", "0", "-0", "1e5", "1E+300", "1e-300", "9007199254740992.0",
     "650.9344730398537", "0.07243628666754276", "1.7976931348623157e308",
     "5e-324", "9223372036854775807", "-9223372036854775808", "18446744073709551615",
     "1.50000000000000000000", "100000000000000000000.0", "0.000000000000000001"],
)  # fmt: skip
def test_numbers_orjson_keeps_exactly_come_back_as_orjson_gives_them(text):
    expected = orjson.loads(text)
    if isinstance(expected, float):
        assert Decimal(repr(expected)) == Decimal(text)  # the case is exact in a float
    assert same(loads_exact(text.encode()), expected)
    long_body = f"[{text}, 123456789012345678901234567890]".encode()  # exact parser path
    assert same(loads_exact(long_body)[0], expected)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


@given(JSON_VALUES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_bodies_orjson_parses_exactly_give_the_same_result(value):
    # orjson.dumps writes each float as its shortest text, so every number is exact.
    body = orjson.dumps(value)
    assert same(loads_exact(body), orjson.loads(body))
    padded = b"[" + body + b", 123456789012345678901234567890]"  # forces the exact parser
    assert same(loads_exact(padded)[0], orjson.loads(body))


@st.composite
def json_number_texts(draw):
    """Any JSON number: up to 45 integer and fraction digits, exponents up to 400."""
    integer = draw(
        st.sampled_from(["0", "1", "9"]) | st.from_regex(r"[1-9][0-9]{0,44}", fullmatch=True)
    )
    text = draw(st.sampled_from(["", "-"])) + integer
    if draw(st.booleans()):
        text += "." + draw(st.from_regex(r"[0-9]{1,45}", fullmatch=True))
    if draw(st.booleans()):
        exponent = draw(st.integers(-400, 400))
        text += draw(st.sampled_from(["e", "E"])) + draw(
            st.sampled_from([str(exponent), f"{exponent:+d}"])
        )
    return text


@given(json_number_texts())
@example("123456789012345678901234567890")
@example("9.995")
@example("0.12499999999999999999")
@settings(max_examples=500, deadline=None)
def test_every_json_number_is_exact_and_orjson_equal_when_orjson_is_exact(text):
    value = loads_exact(f"[{text}]".encode())[0]
    if any(c in text for c in ".eE"):
        if isinstance(value, float):
            assert Decimal(repr(value)) == Decimal(text)  # a float only when it holds the value
        else:
            assert type(value) is Decimal and value.as_tuple() == Decimal(text).as_tuple()
    else:
        assert type(value) is int and value == int(text)
    try:
        fast = orjson.loads(text)
    except orjson.JSONDecodeError:
        return  # beyond the double range: orjson refuses what loads_exact keeps
    fast_is_exact = Decimal(repr(fast)) == Decimal(text) if isinstance(fast, float) else True
    if fast_is_exact:
        assert same(value, fast)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[NaN, 123456789012345678901234567890]", "NaN is not valid JSON"),
        (b"[-Infinity, 123456789012345678901234567890]", "-Infinity is not valid JSON"),
        (b"[NaN]", "unexpected character"),  # orjson's own refusal on the fast path
        (b"[1" + b"0" * 4300 + b"]", "a JSON integer has 4301 digits; at most 4300 are accepted"),
        (b"[-" + b"9" * 5000 + b"]", "a JSON integer has 5000 digits; at most 4300"),
        (b"[1e99999999999999999999999]", "has an exponent out of range"),
        (b"[123456789012345678901234567890,]", "line 1 column 33"),  # the stdlib's message
        (b"[123456789012345678901234567890", "Expecting ',' delimiter"),
        (b'["\\ud800", 123456789012345678901234567890]', "unpaired surrogate escape"),
        (b'["\xff", 123456789012345678901234567890]', "can't decode byte 0xff"),
        (b"[" * 3000 + b"123456789012345678901234567890" + b"]" * 3000, "nested too deeply"),
        (b"[1e400,]", "number is infinity"),  # orjson's message stands if both refuse
    ],
)
def test_bad_bodies_are_a_clean_value_error(body, message):
    with pytest.raises(ValueError) as info:
        loads_exact(body)
    assert message in str(info.value)


def test_str_bytearray_and_memoryview_bodies_parse_like_bytes():
    expected = loads_exact(ISSUE_BODY)
    for body in (ISSUE_BODY.decode(), bytearray(ISSUE_BODY), memoryview(ISSUE_BODY)):
        assert same(loads_exact(body), expected)
    with pytest.raises(ValueError):
        loads_exact('["\ud800", 123456789012345678901234567890]')  # a raw lone surrogate


def test_typical_bodies_never_reach_the_exact_parser(monkeypatch):
    def refuse(body):
        raise AssertionError("the exact parser ran on a body orjson parses exactly")

    monkeypatch.setattr(exact_json, "_loads_exact_slow", refuse)
    rows = [
        {
            "ID": i,
            "UUID": f"{i:08d}-330e-998a-4e12-{i:012d}",  # a 3-digit "exponent" in a string
            "TRACE": f"04ad-330e-{i:03d}",
            "ORDER": f"ord-{10**25 + i}",  # long digit runs inside strings
            "PRICE": 650.9344730398537 + i,  # 17 significant digits, exact as floats
            "SMALL": 1.5e-200 * (i + 1),
            "NANOS": 1_700_000_000_123_456_789 + i,  # 19-digit int64
        }
        for i in range(150)  # 900 spots to check; past 1024 the exact parser runs anyway
    ]
    body = orjson.dumps({"rows": rows})
    assert same(loads_exact(body), orjson.loads(body))


def test_a_body_full_of_exact_doubles_gives_orjson_values_whichever_parser_runs():
    body = orjson.dumps([i / 7 for i in range(3000)])  # too many spots to check one by one
    assert same(loads_exact(body), orjson.loads(body))
    with_long = body[:-1] + b",12345678901234567890123]"
    assert same(loads_exact(with_long), [*orjson.loads(body), 12345678901234567890123])


# -- what the converters make of exact numbers ----------------------------------------------

T, V = InvalidTypeError, InvalidValueError


@pytest.mark.parametrize(
    ("column_type", "text", "expected"),
    [
        ("NUMBER(38,0)", "123456789012345678901234567890", Decimal("123456789012345678901234567890")),
        ("NUMBER(38,2)", "12345678901234567890.12", Decimal("12345678901234567890.12")),
        ("NUMBER(38,2)", "123456789012345678901234567890", Decimal("123456789012345678901234567890.00")),
        ("NUMBER(38,2)", "-12345678901234567890.125", Decimal("-12345678901234567890.13")),
        ("NUMBER(38,0)", "9" * 38, Decimal("9" * 38)),
        ("NUMBER(38,0)", "1" + "0" * 38, (V, "got 1" + "0" * 38)),  # echoes the value sent
        ("NUMBER(10,2)", "12345678901234567890.12", (V, "12345678901234567890.12")),
        ("NUMBER(10,2)", "0.12499999999999999999", Decimal("0.12")),  # as a float: 0.13
        ("NUMBER(10,2)", "1e-400", Decimal("0.00")),
        ("NUMBER(10,2)", "1e400", (V, "below 10^8")),
        ("NUMBER(18,0)", "999999999999999999", 999999999999999999),
        ("NUMBER(18,0)", "9223372036854775807", (V, "got 9223372036854775807")),
        ("NUMBER(18,0)", "123456789012345678901234567890", (V, "got 123456789012345678901234567890")),
        ("FLOAT", "123456789012345678901234567890", 1.2345678901234568e29),
        ("FLOAT", "0.30000000000000001", 0.3),
        ("FLOAT", "1e-400", 0.0),
        ("FLOAT", "1e400", (V, "too large for a 64-bit FLOAT")),
        ("VARCHAR", "123456789012345678901234567890", "123456789012345678901234567890"),
        ("VARCHAR", "12345678901234567890.12", "12345678901234567890.12"),
        ("VARCHAR", "0.30000000000000001", "0.30000000000000001"),
        ("VARCHAR", "1.50000000000000000000", "1.5"),  # like the float 1.50 -> "1.5"
        ("VARCHAR", "1" + "0" * 120 + ".5", "1" + "0" * 120 + ".5"),  # past Decimal's 100 digits
        ("VARCHAR", "1e400", "1" + "0" * 400),
        ("VARCHAR", "-1e-400", "-0." + "0" * 399 + "1"),
        ("VARCHAR(5)", "1e400", (V, "too long: 401 characters, at most 5")),
        ("VARCHAR", "1e999999999", (V, "too long: 1000000000 characters")),
        ("BOOLEAN", "123456789012345678901234567890", True),
        ("BOOLEAN", "1e-400", True),  # as a float: 0.0, false
        ("BOOLEAN", "0e-400", False),
        ("VARIANT", "123456789012345678901234567890", "123456789012345678901234567890"),
        ("VARIANT", "0.30000000000000001", "0.30000000000000001"),
        ("OBJECT", '{"b": 12345678901234567890.12, "a": 123456789012345678901234567890}',
         '{"a":123456789012345678901234567890,"b":12345678901234567890.12}'),
        ("ARRAY", "[0.30000000000000001, 1e400]", "[0.30000000000000001," + "1" + "0" * 400 + "]"),
        ("TIMESTAMP_NTZ", "1700000000", datetime(2023, 11, 14, 22, 13, 20)),
        ("TIMESTAMP_NTZ", "123456789012345678901234567890", (V, "epoch value is outside years")),
        ("TIMESTAMP_LTZ", "-123456789012345678901234567890", (V, "epoch value is outside years")),
        ("DATE", "123456789012345678901234567890", (V, "outside the DATE range")),
        ("TIMESTAMP_NTZ", "12345678901234567890.12", (T, "a Decimal cannot be converted")),
    ],
)  # fmt: skip
def test_each_column_type_stores_json_numbers_exactly(column_type, text, expected):
    value = loads_exact(f'{{"V": {text}}}'.encode())["V"]
    if isinstance(expected, tuple):
        error, fragment = expected
        with pytest.raises(error) as info:
            convert_value(column_type, value)
        assert fragment in str(info.value)
    else:
        result = convert_value(column_type, value)
        assert result == expected and type(result) is type(expected), (result, expected)
