"""catalog.suggest: which existing names a missing one is close to, and the hint's text."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog.suggest import KINDS, close_names, did_you_mean, edit_distance


def reference_distance(a: str, b: str) -> int:
    """Optimal string alignment distance, written the textbook way (no limit)."""

    @cache
    def d(i: int, j: int) -> int:
        if min(i, j) == 0:
            return max(i, j)
        best = min(d(i - 1, j) + 1, d(i, j - 1) + 1, d(i - 1, j - 1) + (a[i - 1] != b[j - 1]))
        if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
            best = min(best, d(i - 2, j - 2) + 1)
        return best

    return d(len(a), len(b))


@given(st.text("ABC_", max_size=8), st.text("ABC_", max_size=8), st.integers(0, 4))
def test_edit_distance_is_the_reference_distance_capped_at_limit_plus_one(a, b, limit):
    assert edit_distance(a, b, limit) == min(reference_distance(a, b), limit + 1)


@pytest.mark.parametrize(
    ("name", "candidates", "expected"),
    [
        ("ORDRES", ["ORDERS", "CUSTOMERS"], ["ORDERS"]),  # a swap is one edit
        ("ORDER", ["ORDERS", "ORDER_LINES"], ["ORDERS"]),
        ("orders", ["ORDERS"], ["ORDERS"]),  # quoted in the wrong case
        ("CUSTOMRS", ["CUSTOMERS", "ORDERS"], ["CUSTOMERS"]),
        ("SALES_2024", ["SALES_2023", "SALES_2025", "SALES_2022", "SALES_2021"],
         ["SALES_2021", "SALES_2022", "SALES_2023"]),  # ties in name order, three at most
        ("ORDERS_V2", ["ORDERS_V1", "ORDERS"], ["ORDERS_V1"]),
        ("orders", ["ORDERS", "S_ORDERS"], ["ORDERS"]),  # only the closest
        ("T", ["U", "T2"], []),  # short names: only a difference of case
        ("t", ["T", "U"], ["T"]),
        ("ABC", ["ABD", "XYZ"], ["ABD"]),
        ("ABC", ["AXY"], []),  # two edits are too many for three letters
        ("PAYMENTS", ["ORDERS", "INVOICES"], []),
        ("ORDERS", ["ORDERS"], []),  # itself is never a suggestion
    ],
)  # fmt: skip
def test_close_names(name, candidates, expected):
    assert close_names(name, candidates) == expected


def test_a_hostile_name_costs_no_more_than_the_names_it_meets():
    started = time.process_time()
    assert close_names("A" * 1_000_000, ["A" * 255] * 1000 + ["B" * 1000]) == []
    # Long names that stay within the limit until their last letters.
    near = [f"{'A' * 250}{i:05d}" for i in range(300)]
    assert close_names("A" * 250 + "XXXXX", near) == []
    assert close_names("B" + "A" * 249 + "00042", near)[0] == "A" * 250 + "00042"
    # ... and ones that differ at both ends, around one long common middle.
    ends = [f"{i:02d}{'A' * 251}{i:02d}" for i in range(100)]
    assert close_names("ZZ" + "A" * 251 + "ZZ", ends * 10) == []
    assert close_names("ZZ" + "A" * 251 + "ZZ", [f"{i}{n}" for i in range(10) for n in ends]) == []
    # Cells within 2 of the diagonal: about 1 s of CPU here; the whole table took 50 s.
    assert time.process_time() - started < 10.0


@dataclass(frozen=True)
class Object:
    database: str
    schema_name: str
    name: str
    id: int = 0
    table_id: int = 0


class FakeCatalog:
    """The listing methods did_you_mean reads, over fixed objects."""

    def __init__(self):
        self.tables = [
            Object("DB", "PUBLIC", "ORDERS", id=1),
            Object("DB", "PUBLIC", "SUMMARY", id=2),
            Object("DB", "OTHER", "ORDERZ", id=3),
            Object("DB2", "PUBLIC", "ORDERX", id=4),
        ]
        self.dynamic = [Object("", "", "", table_id=2)]
        self.views = [Object("DB", "PUBLIC", "V_ORDERS")]
        self.streams = [Object("DB", "PUBLIC", "S_ORDERS")]
        self.change_streams = [Object("DB", "PUBLIC", "BALANCES")]

    def list_tables(self):
        return self.tables

    def list_dynamic_tables(self):
        return self.dynamic

    def list_views(self):
        return self.views

    def list_streams(self, table_id=None):
        return self.streams

    def list_change_streams(self):
        return self.change_streams


@pytest.mark.parametrize(
    ("database", "schema", "name", "kinds", "hint"),
    [
        ("DB", "PUBLIC", "ORDRES", ["table"], " (did you mean DB.PUBLIC.ORDERS?)"),
        # Only the schema looked in: DB.OTHER.ORDERZ and DB2.PUBLIC.ORDERX are not offered.
        ("DB", "PUBLIC", "ORDERQ", ["table"], " (did you mean DB.PUBLIC.ORDERS?)"),
        ("DB", "OTHER", "ORDERS", ["table"], " (did you mean DB.OTHER.ORDERZ?)"),
        ("DB", "NONE", "ORDERS", ["table"], ""),
        ("DB", "PUBLIC", "SUMARY", ["dynamic table"], " (did you mean DB.PUBLIC.SUMMARY?)"),
        ("DB", "PUBLIC", "ORDRES", ["dynamic table"], ""),  # ORDERS is not a dynamic table
        ("DB", "PUBLIC", "V_ORDER", ["view"], " (did you mean DB.PUBLIC.V_ORDERS?)"),
        ("DB", "PUBLIC", "S_ORDRS", ["stream"], " (did you mean DB.PUBLIC.S_ORDERS?)"),
        ("DB", "PUBLIC", "SUMMARY", ["stream"], ""),  # a table is not a stream
        ("DB", "PUBLIC", "balances", ["change stream"], " (did you mean DB.PUBLIC.BALANCES?)"),
        ("DB", "PUBLIC", "S_ORDER", ["table", "stream", "view"],
         " (did you mean DB.PUBLIC.S_ORDERS?)"),  # the closest only: V_ORDERS is 2 away
        ("DB", "PUBLIC", "X_ORDERS", ["table", "stream", "view"],
         " (did you mean DB.PUBLIC.S_ORDERS or DB.PUBLIC.V_ORDERS?)"),
    ],
)  # fmt: skip
def test_did_you_mean_looks_in_one_schema_among_the_kinds_named(
    database, schema, name, kinds, hint
):
    assert did_you_mean(FakeCatalog(), database, schema, name, kinds) == hint


def test_a_suggested_name_is_written_as_it_must_be_typed():
    catalog = FakeCatalog()
    catalog.tables.append(Object("DB", "PUBLIC", "Mixed Case", id=9))
    assert did_you_mean(catalog, "DB", "PUBLIC", "MIXED CASE", ["table"]) == (
        ' (did you mean DB.PUBLIC."Mixed Case"?)'
    )


def test_an_unknown_kind_is_refused_naming_the_kinds():
    with pytest.raises(ValueError, match=", ".join(KINDS)):
        did_you_mean(FakeCatalog(), "DB", "PUBLIC", "X", ["index"])
