"""``assert_refused``: the one check, for the pipeline tests, that a statement is refused
with a stable code and a message naming the cause, and (when asked) that it changed
nothing.

A plain module the tests import (no fixtures); tests/pipelines/conftest.py registers it
for assert rewriting, so a failure here is explained as in a test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipelines import SqlError
from pipelines.errors import evaluation_errors


def assert_refused(
    session: Any,
    text: object,
    code: str,
    *fragments: str,
    kind: type[SqlError] = SqlError,
    exact_kind: bool = False,
    ignore_case: bool = False,
    collect: bool = True,
    unchanged: Callable[[Any], object] | None = None,
) -> SqlError:
    """Run ``text`` through ``session.sql``: it must raise a :class:`SqlError` that is a
    ``kind`` (exactly that class with ``exact_kind``), whose code is ``code`` and whose
    message holds every one of ``fragments`` (in any case with ``ignore_case``).

    ``collect``: the answer's rows are collected too, as the service and the CLI do (so
    a query refused only when Spark evaluates it counts; Spark's own errors there are
    ``SQL_EXECUTION_ERROR``, as ``evaluation_errors`` makes them). With ``collect=False``
    the refusal must come from ``session.sql`` itself.

    ``unchanged``: what the refusal must leave alone, as a snapshot that
    ``unchanged(session)`` takes before and after; the two must be equal (a dict is
    compared key by key, and the failure names the keys that changed).

    Any exception that is not a :class:`SqlError` propagates and fails the test. Returns
    the error, for further checks."""
    before = unchanged(session) if unchanged is not None else None
    with pytest.raises(SqlError) as caught:
        if collect:
            with evaluation_errors():
                session.sql(text).collect()
        else:
            session.sql(text)
    error = caught.value
    described = f"{type(error).__name__} ({error.code}): {error}"
    if exact_kind:
        assert type(error) is kind, f"not a {kind.__name__}: {described}"
    else:
        assert isinstance(error, kind), f"not a {kind.__name__}: {described}"
    assert error.code == code, f"not {code}: {described}"
    message = str(error).lower() if ignore_case else str(error)
    for fragment in fragments:
        wanted = fragment.lower() if ignore_case else fragment
        assert wanted in message, f"{fragment!r} not in {str(error)!r}"
    if unchanged is not None:
        after = unchanged(session)
        if isinstance(before, dict) and isinstance(after, dict):
            keys = sorted(before.keys() | after.keys())
            changed = [key for key in keys if before.get(key) != after.get(key)]
            assert not changed, f"a refused statement changed {changed}: " + "; ".join(
                f"{key}: {before.get(key)!r} -> {after.get(key)!r}"[:600] for key in changed
            )
        else:
            assert after == before, f"a refused statement changed something: {text!r}"
    return error
