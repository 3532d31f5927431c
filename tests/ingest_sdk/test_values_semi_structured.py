"""VARIANT, OBJECT and ARRAY conversion rules, table-driven."""

from datetime import date, datetime, time
from decimal import Decimal

import pytest

from ingest_sdk import InvalidTypeError, InvalidValueError, convert_value

from .conftest import check_case

T = InvalidTypeError
V = InvalidValueError

CASES = [
    ("VARIANT", '{"b": 1, "a": [1, 2.50, "x"]}', '{"a":[1,2.5,"x"],"b":1}'),  # canonical
    ("VARIANT", "  [1, 2] ", "[1,2]"),
    ("VARIANT", '"text"', '"text"'),
    ("VARIANT", "12345678901234567890123", "12345678901234567890123"),  # exact digits
    ("VARIANT", "0.1000000000000000000001", "0.1000000000000000000001"),
    ("VARIANT", "null", "null"),
    ("VARIANT", "", None),  # empty string is SQL NULL
    ("VARIANT", "   ", None),
    ("VARIANT", {"b": 2, "a": 1}, '{"a":1,"b":2}'),
    ("VARIANT", {1: "x"}, '{"1":"x"}'),
    ("VARIANT", (1, "a"), '[1,"a"]'),
    ("VARIANT", 5, "5"),
    ("VARIANT", True, "true"),
    ("VARIANT", 1.5, "1.5"),
    ("VARIANT", Decimal("1.10"), "1.1"),
    ("VARIANT", {"d": Decimal("12345678901234567890.5")}, '{"d":12345678901234567890.5}'),
    ("VARIANT", {"big": 2**70}, '{"big":1180591620717411303424}'),
    ("VARIANT", {"b": b"\x01\xff"}, '{"b":"01ff"}'),
    ("VARIANT", {"d": date(2013, 4, 28), "t": time(20, 57)}, '{"d":"2013-04-28","t":"20:57:00"}'),
    ("VARIANT", [datetime(2013, 4, 28, 20, 57, 1)], '["2013-04-28T20:57:01"]'),
    ("VARIANT", {"k": None}, '{"k":null}'),
    ("VARIANT", "not json", (V, "the text is not valid JSON")),
    ("VARIANT", '{"a": 1, "a": 2}', (V, "the JSON object has the key 'a' twice")),
    ("VARIANT", "NaN", (V, "NaN is not valid JSON")),
    ("VARIANT", {"x": float("nan")}, (V, "NaN and infinity have no JSON form")),
    ("VARIANT", {"x": {1, 2}}, (V, "a set has no JSON form")),
    ("VARIANT", {"x": object()}, (V, "has no JSON form")),
    ("VARIANT", object(), (T, "a object cannot be converted to VARIANT")),
    ("OBJECT", {"a": [1]}, '{"a":[1]}'),
    ("OBJECT", ' {"a": {"b": null}} ', '{"a":{"b":null}}'),
    ("OBJECT", "[1]", (V, "the JSON text is not an object")),
    ("OBJECT", "", (V, "an empty string is not a JSON object")),
    ("OBJECT", [1], (T, "a list cannot be converted to OBJECT")),
    ("OBJECT", 5, (T, "a int cannot be converted to OBJECT")),
    ("ARRAY", [1, "a"], '[1,"a"]'),
    ("ARRAY", "[1, 2]", "[1,2]"),
    ("ARRAY", 5, "[5]"),  # a non-array value is wrapped
    ("ARRAY", '{"a":1}', '[{"a":1}]'),
    ("ARRAY", {"a": 1}, '[{"a":1}]'),
    ("ARRAY", '"x"', '["x"]'),
    ("ARRAY", "", (V, "an empty string is not a JSON array")),
    ("ARRAY", "[1,", (V, "not valid JSON")),
]


@pytest.mark.parametrize(("column_type", "value", "expected"), CASES)
def test_semi_structured_conversion(column_type, value, expected):
    check_case(column_type, value, expected)


def test_serialization_is_deterministic_whatever_the_key_order():
    first = convert_value("VARIANT", {"z": 1, "a": {"y": 2, "b": 3}})
    second = convert_value("VARIANT", '{"a": {"b": 3, "y": 2}, "z": 1}')
    assert first == second == '{"a":{"b":3,"y":2},"z":1}'


def test_size_limit_is_enforced():
    limit = 16_777_152
    assert len(convert_value("VARIANT", ["x" * (limit - 4)])) == limit  # '["' + x + '"]'
    with pytest.raises(InvalidValueError, match="the serialized value is 16777153 bytes"):
        convert_value("VARIANT", ["x" * (limit - 3)])


def test_nan_decimal_is_refused():
    with pytest.raises(InvalidValueError, match="NaN and infinity have no JSON form"):
        convert_value("VARIANT", [Decimal("NaN")])
