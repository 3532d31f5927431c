"""Helpers for table-driven conversion tests."""

import pytest

from ingest_sdk import InvalidTypeError, InvalidValueError, convert_value


def check_case(column_type, value, expected, **options):
    """Assert one conversion: a value, or an error class with a message fragment."""
    from ingest_sdk import ConversionOptions

    opts = ConversionOptions(**options)
    if (
        isinstance(expected, tuple)
        and expected
        and expected[0]
        in (
            InvalidTypeError,
            InvalidValueError,
        )
    ):
        error, fragment = expected
        with pytest.raises(error) as info:
            convert_value(column_type, value, opts)
        message = str(info.value)
        assert fragment in message
        # Every located error names the row, the column type and the fix.
        assert message.startswith("Row 0") and "Fix: send" in message
        assert column_type.split("(")[0].upper() in message
    else:
        result = convert_value(column_type, value, opts)
        assert result == expected and type(result) is type(expected), (result, expected)
