"""Did you mean: existing objects whose names are close to a name that was not found.

Every "does not exist" error about a table, view, stream, dynamic table or change stream
ends its first clause with :func:`did_you_mean`'s hint, so a typo (``ORDRES``), a name
quoted in the wrong case (``"orders"`` for ``ORDERS``) or a swapped pair of letters is
answered with the name meant. Only objects of the kinds the statement could name, in the
database and schema it looked in, are suggested: an object of another schema is not
what the name, read with the same defaults, would have found.

Close means a Damerau-Levenshtein distance (optimal string alignment: insertions,
deletions, substitutions, swaps of two neighbours) of at most 2 between the names with
case folded, 1 for names of 3 to 5 characters, and only a difference of case for shorter
ones (any one-letter name is one edit from every other); of the names that close, those
at the smallest distance are named. Names of very different lengths
are skipped before any distance is computed, and only cells near the diagonal are, so a
hostile name costs no more than the names it is compared with, which the name rules
bound.
"""

from __future__ import annotations

from collections.abc import Iterable

from catalog.base import Catalog
from catalog.records import full_name

__all__ = ["KINDS", "close_names", "did_you_mean", "edit_distance"]

#: The kinds of objects :func:`did_you_mean` looks among.
KINDS = ("table", "dynamic table", "view", "stream", "change stream")
#: At most this many names are suggested (the closest, in name order).
MAX_SUGGESTIONS = 3


def edit_distance(a: str, b: str, limit: int) -> int:
    """The optimal string alignment distance between ``a`` and ``b``, or ``limit + 1`` when
    it exceeds ``limit``. Only the cells within ``limit`` of the diagonal are computed (any
    other is over the limit), so the cost is ``len(a) * (2 * limit + 1)``."""
    over = limit + 1
    if abs(len(a) - len(b)) > limit:
        return over
    # A common prefix and suffix change no distance: names often share long ones.
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start : len(a) - end], b[start : len(b) - end]
    previous2: list[int] = []
    previous = [j if j <= limit else over for j in range(len(b) + 1)]
    for i in range(1, len(a) + 1):
        current = [over] * (len(b) + 1)
        current[0] = min(i, over)
        low, high = max(1, i - limit), min(len(b), i + limit)
        for j in range(low, high + 1):
            value = min(previous[j] + 1, current[j - 1] + 1,
                        previous[j - 1] + (a[i - 1] != b[j - 1]))  # fmt: skip
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                value = min(value, previous2[j - 2] + 1)
            current[j] = min(value, over)
        if min(current[low - 1 : high + 1]) > limit:
            return over
        previous2, previous = previous, current
    return previous[-1]


def _limit(name: str) -> int:
    if len(name) <= 2:
        return 0
    return 1 if len(name) <= 5 else 2


def close_names(name: str, candidates: Iterable[str]) -> list[str]:
    """The candidates closest to ``name`` within the distance its length allows (case
    folded; ``name`` itself left out): those at the smallest distance found, in name order,
    at most :data:`MAX_SUGGESTIONS`."""
    folded = name.upper()
    limit = _limit(folded)
    scored = []
    for candidate in set(candidates):
        if candidate == name:
            continue
        distance = edit_distance(folded, candidate.upper(), limit)
        if distance <= limit:
            scored.append((distance, candidate))
    best = min((distance for distance, _ in scored), default=0)
    return [c for distance, c in sorted(scored) if distance == best][:MAX_SUGGESTIONS]


def _names(catalog: Catalog, kind: str, database: str, schema_name: str) -> list[str]:
    """The names of one kind's objects in one schema."""
    if kind == "table":
        found = [(t.database, t.schema_name, t.name) for t in catalog.list_tables()]
    elif kind == "dynamic table":
        dynamic = {dt.table_id for dt in catalog.list_dynamic_tables()}
        found = [(t.database, t.schema_name, t.name) for t in catalog.list_tables()
                 if t.id in dynamic]  # fmt: skip
    elif kind == "view":
        found = [(v.database, v.schema_name, v.name) for v in catalog.list_views()]
    elif kind == "stream":
        found = [(s.database, s.schema_name, s.name) for s in catalog.list_streams()]
    elif kind == "change stream":
        found = [(c.database, c.schema_name, c.name) for c in catalog.list_change_streams()]
    else:
        raise ValueError(f"unknown kind {kind!r}; the kinds are {', '.join(KINDS)}")
    return [n for d, s, n in found if (d, s) == (database, schema_name)]


def did_you_mean(
    catalog: Catalog, database: str, schema_name: str, name: str, kinds: Iterable[str]
) -> str:
    """``" (did you mean DB.PUBLIC.ORDERS?)"``: the existing objects of ``kinds`` in
    ``database.schema_name`` whose names are close to ``name``; ``""`` when none is. For the
    error that says ``name`` does not exist, right after those words.

    Raises:
        ValueError: a kind not in :data:`KINDS`.
    """
    candidates = [n for kind in kinds for n in _names(catalog, kind, database, schema_name)]
    close = close_names(name, candidates)
    if not close:
        return ""
    return f" (did you mean {' or '.join(full_name(database, schema_name, n) for n in close)}?)"
