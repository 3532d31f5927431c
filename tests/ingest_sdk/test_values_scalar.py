"""NUMBER, FLOAT, VARCHAR, BINARY and BOOLEAN conversion rules, table-driven."""

import math
from decimal import Decimal

import pytest

from ingest_sdk import InvalidTypeError, InvalidValueError, convert_value

from .conftest import check_case

T = InvalidTypeError
V = InvalidValueError

NUMBER_CASES = [
    # NUMBER(38,0) is stored as decimal(38,0)
    ("NUMBER(38,0)", 12, Decimal(12)),
    ("NUMBER(38,0)", -(10**38) + 1, Decimal(-(10**38) + 1)),
    ("NUMBER(38,0)", 10**38, (V, "out of range for NUMBER(38,0)")),
    ("NUMBER(38,0)", "  42  ", Decimal(42)),
    ("NUMBER(38,0)", "1e3", Decimal(1000)),
    ("NUMBER(38,0)", "1234E-5", Decimal(0)),
    ("NUMBER(38,0)", "2.5", Decimal(3)),  # HALF_UP
    ("NUMBER(38,0)", "-2.5", Decimal(-3)),  # HALF_UP is away from zero
    ("NUMBER(38,0)", 2.5, Decimal(3)),
    ("NUMBER(38,0)", Decimal("7.49"), Decimal(7)),
    ("NUMBER(38,0)", "abc", (V, "the text is not a number")),
    ("NUMBER(38,0)", "1_000", (V, "the text is not a number")),
    ("NUMBER(38,0)", "NaN", (V, "the text is not a number")),
    ("NUMBER(38,0)", float("nan"), (V, "NaN and infinity")),
    ("NUMBER(38,0)", float("inf"), (V, "NaN and infinity")),
    ("NUMBER(38,0)", Decimal("NaN"), (V, "NaN and infinity")),
    ("NUMBER(38,0)", True, (T, "a bool cannot be converted to NUMBER(38,0)")),
    ("NUMBER(38,0)", b"1", (T, "a bytes cannot be converted")),
    ("NUMBER(38,0)", "1e100000", (V, "out of range")),
    # small integer NUMBERs are stored as int64
    ("NUMBER(18,0)", 10**18 - 1, 10**18 - 1),
    ("NUMBER(18,0)", 10**18, (V, "below 10^18")),
    ("NUMBER(3,0)", 999, 999),
    ("NUMBER(3,0)", -999, -999),
    ("NUMBER(3,0)", 1000, (V, "at most 3 digit(s) before the decimal point")),
    ("NUMBER(3,0)", "999.5", (V, "out of range")),  # rounds up past the limit
    ("NUMBER(3,0)", "999.4", 999),
    # scaled NUMBERs
    ("NUMBER(10,2)", "12.345", Decimal("12.35")),
    ("NUMBER(10,2)", "12.344", Decimal("12.34")),
    ("NUMBER(10,2)", "-0.005", Decimal("-0.01")),
    ("NUMBER(10,2)", 0.1, Decimal("0.10")),
    ("NUMBER(10,2)", 5, Decimal("5.00")),
    ("NUMBER(10,2)", "99999999.994", Decimal("99999999.99")),
    ("NUMBER(10,2)", "99999999.995", (V, "below 10^8")),
    ("NUMBER(10,2)", ".5", Decimal("0.50")),
    ("NUMBER(10,2)", "+3.", Decimal("3.00")),
    ("NUMBER(38,38)", "0.5", Decimal("0.5" + "0" * 37)),
    ("NUMBER(38,38)", 1, (V, "below 10^0")),
    # the widest values: p significant digits, past the 28 of Decimal's default context
    (
        "NUMBER(38,4)",
        Decimal("9999999999999999999999999999999999.9999"),
        Decimal("9999999999999999999999999999999999.9999"),
    ),
    (
        "NUMBER(38,4)",
        "-9999999999999999999999999999999999.99994",
        Decimal("-9999999999999999999999999999999999.9999"),
    ),
    ("NUMBER(38,4)", "9999999999999999999999999999999999.99995", (V, "below 10^34")),
    ("NUMBER(38,2)", 123456789012345678901234567890, Decimal("123456789012345678901234567890.00")),
    (
        "NUMBER(38,37)",
        "9.9999999999999999999999999999999999999",
        Decimal("9.9999999999999999999999999999999999999"),
    ),
    ("NUMBER(38,0)", Decimal("99999999999999999999999999999999999999.4"), Decimal("9" * 38)),
    (
        "NUMBER(38,0)",
        123456789012345678901234567890123456789,
        (V, "got 123456789012345678901234567890123456789"),
    ),
]

FLOAT_CASES = [
    ("FLOAT", 1.5, 1.5),
    ("FLOAT", 3, 3.0),
    ("FLOAT", Decimal("2.25"), 2.25),
    ("FLOAT", " 1e3 ", 1000.0),
    ("FLOAT", "-0.5", -0.5),
    ("FLOAT", "inf", math.inf),
    ("FLOAT", "-INF", -math.inf),
    ("FLOAT", "Infinity", math.inf),
    ("FLOAT", 2**60, float(2**60)),
    ("FLOAT", "abc", (V, "the text is not a number")),
    ("FLOAT", "1e400", (V, "too large for a 64-bit FLOAT")),
    ("FLOAT", 10**400, (V, "too large for a 64-bit FLOAT")),
    ("FLOAT", Decimal("1E+400"), (V, "too large for a 64-bit FLOAT")),
    ("FLOAT", Decimal("0.30000000000000001"), 0.3),
    ("FLOAT", True, (T, "a bool cannot be converted to FLOAT")),
    ("FLOAT", [1.0], (T, "a list cannot be converted")),
]

TEXT_CASES = [
    ("VARCHAR(5)", "hello", "hello"),
    ("VARCHAR(5)", "héllo", "héllo"),
    ("VARCHAR(2)", "😀😀", "😀😀"),  # code points, not bytes or UTF-16 units
    ("VARCHAR(5)", "  a  ", "  a  "),  # text is kept as given
    ("VARCHAR(5)", "hello!", (V, "too long: 6 characters, at most 5")),
    ("VARCHAR(10)", 42, "42"),
    ("VARCHAR(10)", -7, "-7"),
    ("VARCHAR(10)", True, "true"),
    ("VARCHAR(10)", False, "false"),
    ("VARCHAR(10)", 1.50, "1.5"),
    ("VARCHAR(10)", 1.0, "1"),
    ("VARCHAR(30)", 1e20, "100000000000000000000"),
    ("VARCHAR(10)", 1e-7, "0.0000001"),
    ("VARCHAR(10)", Decimal("1.500"), "1.5"),
    ("VARCHAR(10)", Decimal("1.5E+3"), "1500"),
    ("VARCHAR(10)", Decimal("0.00"), "0"),
    ("VARCHAR(10)", Decimal("-0E+5"), "0"),
    ("VARCHAR(130)", Decimal("1" * 120 + ".5"), "1" * 120 + ".5"),  # every digit, past 100
    ("VARCHAR(30)", Decimal("1E+20"), "100000000000000000000"),
    ("VARCHAR(30)", Decimal("-1.2E-7"), "-0.00000012"),
    ("VARCHAR(10)", Decimal("1E+999999999"), (V, "too long: 1000000000 characters")),
    ("VARCHAR", Decimal("1E+99999999"), (V, "too long: 100000000 characters, at most 16777216")),
    ("VARCHAR(3)", 1234, (V, "too long: 4 characters")),
    ("VARCHAR(10)", "a\ud800b", (V, "lone surrogate at position 1")),
    ("VARCHAR(10)", b"abc", (T, "a bytes cannot be converted to VARCHAR(10)")),
    ("VARCHAR(10)", {"a": 1}, (T, "a dict cannot be converted")),
    ("CHAR", "ab", (V, "at most 1 allowed")),
]

BINARY_CASES = [
    ("BINARY(4)", b"\x00\x01", b"\x00\x01"),
    ("BINARY(4)", bytearray(b"ab"), b"ab"),
    ("BINARY(4)", memoryview(b"xy"), b"xy"),
    ("BINARY(4)", "CAFEbabe", b"\xca\xfe\xba\xbe"),
    ("BINARY(4)", " 00ff ", b"\x00\xff"),
    ("BINARY(4)", "", b""),
    ("BINARY(4)", "abc", (V, "even number of the digits")),
    ("BINARY(4)", "zz", (V, "the text is not hex")),
    ("BINARY(4)", "00 11", (V, "the text is not hex")),
    ("BINARY(4)", b"12345", (V, "too long: 5 bytes, at most 4")),
    ("BINARY(2)", "001122", (V, "too long: 3 bytes")),
    ("BINARY(4)", 12, (T, "a int cannot be converted to BINARY(4)")),
]

BOOLEAN_CASES = [
    ("BOOLEAN", True, True),
    ("BOOLEAN", False, False),
    *[("BOOLEAN", word, True) for word in ("true", "T", "Yes", "y", "ON", "1", " true ")],
    *[("BOOLEAN", word, False) for word in ("false", "F", "NO", "n", "off", "0")],
    ("BOOLEAN", 0, False),
    ("BOOLEAN", 2, True),
    ("BOOLEAN", -0.5, True),
    ("BOOLEAN", 0.0, False),
    ("BOOLEAN", Decimal("0"), False),
    ("BOOLEAN", Decimal("1E-400"), True),
    ("BOOLEAN", 10**100, True),
    ("BOOLEAN", Decimal("sNaN"), (V, "NaN is neither true nor false")),
    ("BOOLEAN", "2", (V, "not a boolean word")),
    ("BOOLEAN", "maybe", (V, "not a boolean word")),
    ("BOOLEAN", "", (V, "not a boolean word")),
    ("BOOLEAN", float("nan"), (V, "NaN is neither true nor false")),
    ("BOOLEAN", b"1", (T, "a bytes cannot be converted to BOOLEAN")),
]


@pytest.mark.parametrize(
    ("column_type", "value", "expected"),
    NUMBER_CASES + FLOAT_CASES + TEXT_CASES + BINARY_CASES + BOOLEAN_CASES,
)
def test_scalar_conversion(column_type, value, expected):
    check_case(column_type, value, expected)


def test_float_nan_text_is_nan():
    assert math.isnan(convert_value("FLOAT", "NaN"))
    assert math.isnan(convert_value("FLOAT", " nan "))
    assert math.isnan(convert_value("FLOAT", float("nan")))


def test_long_values_are_truncated_in_messages():
    with pytest.raises(InvalidValueError) as info:
        convert_value("VARCHAR(3)", "x" * 10_000)
    assert "... (10002 characters)" in str(info.value)
    assert len(str(info.value)) < 600


def test_a_broken_user_object_is_a_clear_error_not_a_crash():
    class Weird(float):
        def __repr__(self):
            raise RuntimeError("boom")

    with pytest.raises(InvalidValueError, match="cannot be converted"):
        convert_value("NUMBER(10,2)", Weird(1.0))


def test_an_int_longer_than_str_allows_is_still_text():
    # str() refuses ints of more than 4300 digits; the text keeps every digit anyway.
    assert convert_value("VARCHAR", 10**5000) == "1" + "0" * 5000
    with pytest.raises(InvalidValueError, match="too long: 5003 characters, at most 10"):
        convert_value("VARCHAR(10)", -(10**5001))
