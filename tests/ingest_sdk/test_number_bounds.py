"""NUMBER(p,s) at its boundaries, on the row path and the Arrow path alike.

The rule: round HALF_UP to s fraction digits, then keep the value when its
absolute value is below 10^(p-s), i.e. it has at most p significant digits. Every
precision/scale class is probed with its largest and smallest accepted values,
the first refused one and the rounding boundary, given as Decimal, text, int,
float and JSON; the row path (``convert_rows``) and the Arrow path
(``check_arrow_batch``) must both match the reference rule.
"""

from decimal import ROUND_HALF_UP, Context, Decimal, localcontext

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ingest_sdk import (
    InsertValidationError,
    InvalidValueError,
    OnErrorOption,
    TableSchema,
    convert_rows,
)
from ingest_sdk.batch_check import check_arrow_batch
from ingest_sdk.wire import loads_exact

#: Every storage class: int64 (s = 0, p <= 18), decimal128 with s = 0, with s > 0, s = p.
CLASSES = [(1, 0), (1, 1), (3, 2), (10, 2), (18, 0), (18, 2), (19, 0), (19, 1), (38, 0),
           (38, 4), (38, 37), (38, 38)]  # fmt: skip
OUT = "out of range"
_EXACT = Context(prec=200, Emax=10**6, Emin=-(10**6))


def reference(number: Decimal, precision: int, scale: int):
    """The stored value under the rule, or OUT."""
    rounded = number.quantize(Decimal(1).scaleb(-scale), ROUND_HALF_UP, _EXACT)
    if rounded.copy_abs() >= 10 ** (precision - scale):
        return OUT
    return int(rounded) if scale == 0 and precision <= 18 else rounded


def row_path(declared: str, value):
    schema = TableSchema.parse({"N": declared})
    try:
        batch, _ = convert_rows(schema, [{"N": value}], OnErrorOption.ABORT)
    except InsertValidationError as exc:
        assert OUT in str(exc) and "below 10^" in str(exc), str(exc)
        return OUT
    return batch.column(0)[0].as_py()


def arrow_path(declared: str, array: pa.Array):
    schema = TableSchema.parse({"N": declared})
    try:
        table = check_arrow_batch(schema, pa.table({"N": array}))
    except InvalidValueError as exc:
        assert OUT in str(exc) and "below 10^" in str(exc), str(exc)
        return OUT
    assert table.schema == schema.to_arrow()
    return table.column(0)[0].as_py()


def decimal_array(number: Decimal) -> pa.Array:
    """A one-value Arrow decimal array holding ``number`` exactly, in the narrowest type."""
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    precision = max(1, scale, len(digits) + max(0, exponent))
    kind = pa.decimal128 if precision <= 38 else pa.decimal256
    return pa.array([number], kind(precision, scale))


def float_of(number: Decimal) -> float | None:
    """The float holding ``number`` exactly (by its shortest text), if there is one."""
    value = float(number)
    return value if Decimal(repr(value)) == number else None


def inputs(text: str):
    """Every form of one number each path takes: (path name, what convert sees)."""
    number = Decimal(text)
    yield "row Decimal", lambda d: row_path(d, number)
    yield "row str", lambda d: row_path(d, text)
    yield "row JSON", lambda d: row_path(d, loads_exact(f'{{"N": {text}}}'.encode())["N"])
    yield "arrow decimal", lambda d: arrow_path(d, decimal_array(number))
    yield "arrow string", lambda d: arrow_path(d, pa.array([text]))
    if number == number.to_integral_value():
        yield "row int", lambda d: row_path(d, int(number))
        if -(2**63) <= number < 2**63:
            yield "arrow int64", lambda d: arrow_path(d, pa.array([int(number)], pa.int64()))
    as_float = float_of(number)
    if as_float is not None:
        yield "row float", lambda d: row_path(d, as_float)
        yield "arrow float64", lambda d: arrow_path(d, pa.array([as_float], pa.float64()))


def boundary_texts(precision: int, scale: int) -> list[str]:
    integer_digits = precision - scale
    with localcontext(_EXACT):  # the default context would round 38 digits to 28
        quantum = Decimal(1).scaleb(-scale)
        largest = Decimal(10) ** integer_digits - quantum  # p nines: 9.99 for NUMBER(3,2)
        half = quantum / 2
        tiny = Decimal(1).scaleb(-scale - 10)
        probes = [
            largest,  # largest accepted
            largest + half - tiny,  # rounds down to the largest: 9.99499999...
            largest + half,  # rounds up to 10^(p-s): refused (9.995 -> 10.00)
            Decimal(10) ** integer_digits,  # first refused
            quantum,  # smallest positive
            half,  # rounds up to the smallest positive
            half - tiny,  # rounds to zero
        ]
    assert len(largest.as_tuple().digits) == precision
    texts = []
    for probe in probes:
        for signed in (probe, -probe):
            texts.append(format(signed, "f"))
    return texts


CASES = [
    (f"NUMBER({p},{s})", text, reference(Decimal(text), p, s))
    for p, s in CLASSES
    for text in boundary_texts(p, s)
]


@pytest.mark.parametrize(("declared", "text", "expected"), CASES)
def test_boundaries_of_every_class_on_both_paths(declared, text, expected):
    for name, convert in inputs(text):
        got = convert(declared)
        assert got == expected and type(got) is type(expected), (name, got, expected)


@pytest.mark.parametrize(
    ("declared", "text", "expected"),
    [
        ("NUMBER(38,4)", "9999999999999999999999999999999999.9999", Decimal("9999999999999999999999999999999999.9999")),
        ("NUMBER(38,4)", "1234567890123456789012345678901234.5678", Decimal("1234567890123456789012345678901234.5678")),
        ("NUMBER(38,4)", "10000000000000000000000000000000000", OUT),
        ("NUMBER(38,37)", "9.9999999999999999999999999999999999999", Decimal("9.9999999999999999999999999999999999999")),
        ("NUMBER(38,37)", "9.99999999999999999999999999999999999995", OUT),
        ("NUMBER(38,2)", "123456789012345678901234567890", Decimal("123456789012345678901234567890.00")),
        ("NUMBER(3,2)", "9.995", OUT),
        ("NUMBER(3,2)", "9.994", Decimal("9.99")),
        ("NUMBER(3,2)", "-9.995", OUT),
        ("NUMBER(10,2)", "1.005", Decimal("1.01")),  # HALF_UP on the text, not the double
        ("NUMBER(10,2)", "0.125", Decimal("0.13")),  # not half-to-even
        ("NUMBER(1,1)", "0.95", OUT),
        ("NUMBER(1,0)", "9.5", OUT),
        ("NUMBER(1,0)", "-9.4", -9),
        ("NUMBER(19,0)", "2.5", Decimal(3)),
    ],
)  # fmt: skip
def test_widest_values_and_half_up_examples(declared, text, expected):
    for name, convert in inputs(text):
        got = convert(declared)
        assert got == expected and type(got) is type(expected), (name, got, expected)


def test_the_smallest_int64_is_refused_by_number_18_0_on_the_arrow_path():
    # abs() of -2^63 wraps around to itself in int64, which once slipped through.
    assert arrow_path("NUMBER(18,0)", pa.array([-(2**63)], pa.int64())) == OUT
    assert arrow_path("NUMBER(18,0)", pa.array([2**63 - 1], pa.int64())) == OUT


@pytest.mark.parametrize(
    ("declared", "value"),
    [("NUMBER(37,37)", 18), ("NUMBER(37,37)", 35), ("NUMBER(38,37)", 18), ("NUMBER(38,37)", -99),
     ("NUMBER(38,20)", 10**20), ("NUMBER(38,20)", -(10**21))],
)  # fmt: skip
def test_arrow_decimals_rescaled_past_128_bits_are_refused_not_wrapped(declared, value):
    # Rescaling 35 to 37 fraction digits overflows 128 bits: Arrow's decimal128 cast once
    # wrapped it around to 0.97176... and the wrong value passed every check.
    array = pa.array([value], pa.decimal128(len(str(abs(value))), 0))
    assert arrow_path(declared, array) == OUT
    assert row_path(declared, value) == OUT


@pytest.mark.parametrize(("precision", "scale"), [(38, 0), (38, 4), (10, 2), (19, 0)])
def test_arrow_decimals_beyond_their_declared_precision_are_refused(precision, scale):
    # Arrow does not check that values fit the precision of the type they arrive in.
    def raw(unscaled: int) -> pa.Array:
        data = pa.py_buffer(unscaled.to_bytes(16, "little", signed=True))
        return pa.Array.from_buffers(pa.decimal128(precision, scale), 1, [None, data])

    declared = f"NUMBER({precision},{scale})"
    largest = 10**precision - 1
    assert arrow_path(declared, raw(largest)) == Decimal(largest).scaleb(-scale, _EXACT)
    assert arrow_path(declared, raw(-largest)) == Decimal(-largest).scaleb(-scale, _EXACT)
    assert arrow_path(declared, raw(largest + 1)) == OUT
    assert arrow_path(declared, raw(-largest - 1)) == OUT


@st.composite
def numbers_and_columns(draw):
    """A NUMBER(p,s) and a number of up to 38 digits at any scale, often near the bounds."""
    precision = draw(st.integers(1, 38))
    scale = draw(st.integers(0, precision))
    digits = draw(st.integers(1, 38))
    unscaled = draw(
        st.integers(0, 10**digits - 1)
        | st.sampled_from([10**digits - 1, 10**digits - 5, 10**digits // 2, 5, 1])
    )
    fraction_digits = draw(st.integers(0, digits))
    text = format(Decimal(unscaled).scaleb(-fraction_digits, _EXACT), "f")
    if draw(st.booleans()):
        text = "-" + text
    if draw(st.integers(0, 4)) == 0:  # now and then the same number in exponent notation
        text = f"{Decimal(text):E}"
    assert Decimal(text).copy_abs() == Decimal(unscaled).scaleb(-fraction_digits, _EXACT)
    return precision, scale, text


@given(numbers_and_columns())
@example((38, 4, "9999999999999999999999999999999999.9999"))
@example((3, 2, "9.995"))
@example((38, 0, "123456789012345678901234567890"))
@settings(max_examples=300, deadline=None)
def test_json_numbers_convert_to_their_exact_rounded_value_on_both_paths(case):
    precision, scale, text = case
    declared = f"NUMBER({precision},{scale})"
    expected = reference(Decimal(text), precision, scale)
    value = loads_exact(f'{{"rows": [{{"N": {text}}}]}}'.encode())["rows"][0]["N"]
    if isinstance(value, float):  # only when the float holds the number exactly
        assert Decimal(repr(value)) == Decimal(text)
    got = row_path(declared, value)
    assert got == expected and type(got) is type(expected), (got, expected)
    assert arrow_path(declared, pa.array([text])) == expected
    assert arrow_path(declared, decimal_array(Decimal(text))) == expected
