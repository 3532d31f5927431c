"""The incremental rewrite of a stateless query, run on the shared Spark session: the
output is the query's own (values, order), every row carries its source row's action
and a packed id that is unique and decodes to the source id; everything else is refused.
Then the net change of such output, checked against applying it."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.errors import ArithmeticException

from flush.tables import ROW_ID_COLUMN as ROW_ID
from pipelines.change_sets import REFRESH_ACTION as ACTION
from pipelines.change_sets import NetChange, net_change
from pipelines.dynamic_tables.rewrite import RewriteError, rewrite

_NUMBERS = itertools.count(900001)
SCHEMA = pa.schema([("A", pa.int64()), ("B", pa.string()), ("C", pa.float64())])


def source(ids, actions=None, schema=SCHEMA, values=None) -> pa.Table:
    """A change source: user columns (derived from the id unless ``values`` are given),
    then the row id and the action (INSERT unless ``actions`` says otherwise)."""
    ids = list(ids)
    if values is None:
        values = [(i % 7 if i % 5 else None, f"b{i}", i / 4) for i in ids]
    columns = [pa.array([v[k] for v in values], f.type) for k, f in enumerate(schema)]
    actions = actions or ["INSERT"] * len(ids)
    return pa.table([*columns, pa.array(ids, pa.int64()), pa.array(actions, pa.string())],
                    names=[*schema.names, ROW_ID, ACTION])  # fmt: skip


@contextmanager
def registered(spark, *tables: pa.Table) -> Iterator[list[str]]:
    """The tables as fresh temporary views ``ingest_v9...``, dropped afterwards."""
    names = [f"ingest_v{next(_NUMBERS)}" for _ in tables]
    try:
        for name, table in zip(names, tables, strict=True):
            spark.createDataFrame(table).createOrReplaceTempView(name)
        yield names
    finally:
        for name in names:
            spark.catalog.dropTempView(name)
            spark.catalog.dropTempView(f"{name}_user")


def run(spark, query: str, *tables: pa.Table, plain: bool = True) -> tuple[pa.Table, list[tuple]]:
    """The rewritten query over the change sources, and (if ``plain``) the original
    query's rows over the same rows without the hidden columns. ``{0}``, ``{1}``...
    name the sources."""
    with registered(spark, *tables) as names:
        return run_on(spark, query, names, tables, plain)


def run_on(spark, query, names, tables, plain=True) -> tuple[pa.Table, list[tuple]]:
    """:func:`run` on views already registered."""
    text = query.format(*names)
    rewritten = rewrite(text, names)
    assert _deleted(text, rewritten) == ""  # the rewrite only inserts
    out = spark.sql(rewritten).toArrow()
    if not plain:
        return out, []
    for name in names:
        spark.table(name).drop(ROW_ID, ACTION).createOrReplaceTempView(f"{name}_user")
    rows = spark.sql(query.format(*(f"{name}_user" for name in names))).collect()
    return out, [tuple(row) for row in rows]


def _deleted(before: str, after: str) -> str:
    """The characters of ``before`` missing from ``after`` (as a subsequence)."""
    rest = iter(after)
    return "".join(char for char in before if char not in rest)


def user_rows(out: pa.Table) -> list[tuple]:
    return [tuple(r[:-2]) for r in zip(*(c.to_pylist() for c in out.columns), strict=True)]


def ids_of(out: pa.Table) -> list[int]:
    return out.column(ROW_ID).to_pylist()


T = source([3, 8, 21, 40, 55], ["INSERT", "DELETE", "INSERT", "DELETE", "INSERT"])
U = source([3, 8, 9, 40], ["DELETE", "INSERT", "INSERT", "INSERT"])


@pytest.fixture(scope="module")
def tu(spark):
    """T and U registered once for the module."""
    with registered(spark, T, U) as names:
        yield names


@pytest.mark.parametrize(
    "query",
    [
        "SELECT a, b FROM {0}",
        "SELECT * FROM {0} AS `T`",
        "SELECT t.* FROM {0} AS `T`",
        "SELECT b, T.a, c FROM {0} AS `T` WHERE t.A > 1",
        "SELECT b, a + 1 AS a1, upper(b), CASE WHEN c > 5 THEN 'x' ELSE 'y' END AS k, coalesce(a, -1) FROM {0} WHERE a > 1 OR a IS NULL",
        "SELECT x.a FROM (SELECT a, b FROM {0} WHERE a > 1) AS x WHERE x.b <> 'b21'",
        "WITH c AS (SELECT a, b FROM {0} WHERE a > 1) SELECT b, a FROM c",
        "WITH c AS (SELECT * FROM {0}), d AS (SELECT c, a FROM c WHERE c > 2) SELECT * FROM d",
        "SELECT * FROM (SELECT * FROM (SELECT b, a FROM {0}) AS i WHERE a < 5) AS o",
        "SELECT * FROM (WITH c AS (SELECT a FROM {0}) SELECT * FROM c) AS s",
        "SELECT a + 1 AS p, p * 2 AS q FROM {0}",
        "SELECT * FROM {0} AS t(x, y, z) WHERE x > 1",
        "SELECT a, a, b AS a FROM {0}",
        "SELECT /*+ REPARTITION(2) */ a FROM {0} DISTRIBUTE BY a",
        "SELECT s.f, q.s.f AS g FROM (SELECT named_struct('f', a) AS s FROM {0}) AS q",
        "SELECT element_at(transform(array(a, 1), x -> x * 2), 1) AS t FROM {0}",
        "SELECT * FROM (SELECT a, a FROM {0}) AS s",
        "WITH c(x, y) AS (SELECT a, b FROM {0}) SELECT y, * FROM c WHERE x > 1",
        "SELECT * FROM (SELECT b, a FROM {0}) AS s(p, q) WHERE q > 1",
        "SELECT to_char(CAST(c AS DECIMAL(10, 2)), '999.99') AS f, 1.50BD AS d, '\\u0041' AS u FROM {0}",
    ],
)
def test_one_source_keeps_values_order_ids_and_actions(spark, tu, query):
    out, plain = run_on(spark, query, tu[:1], [T])
    assert out.column_names[-2:] == [ROW_ID, ACTION]
    assert out.num_columns == len(plain[0]) + 2  # a * expands to the user columns only
    assert Counter(user_rows(out)) == Counter(plain)
    action = dict(zip(ids_of(T), T.column(ACTION).to_pylist(), strict=True))
    assert sorted(ids_of(out)) == sorted(set(ids_of(out)))
    for row_id, act in zip(ids_of(out), out.column(ACTION).to_pylist(), strict=True):
        assert action[row_id] == act  # without a union the id is the source id


def test_order_and_case_of_output_columns_follow_the_query(spark, tu):
    query = "SELECT c AS Zed, b, a AS `mixed Case` FROM {0} AS `T`"
    out, plain = run_on(spark, query, tu[:1], [T])
    assert out.column_names == ["Zed", "b", "mixed Case", ROW_ID, ACTION]  # as Spark names them
    assert Counter(user_rows(out)) == Counter(plain)


def test_unusual_column_names(spark):
    schema = pa.schema([("My Col", pa.int64()), ("we`ird", pa.string()), ("日本", pa.float64())])
    table = source([1, 2, 3], schema=schema, values=[(1, "x", 0.5), (2, "y", None), (3, None, 2.0)])
    for query in (
        "SELECT * FROM {0}",
        "SELECT `日本`, `my col` FROM {0} WHERE `WE``IRD` <> 'y'",
        "SELECT s.* FROM (SELECT `My Col` + 1 AS `a b`, `we``ird` FROM {0}) AS s",
    ):
        out, plain = run(spark, query, table)
        assert Counter(user_rows(out)) == Counter(plain), query


# Union shapes (the property test below decodes random ones too): ids unique, values kept.
@pytest.mark.parametrize(
    "query",
    [
        "SELECT a FROM {0} UNION ALL SELECT a FROM {0}",
        "SELECT a FROM {0} UNION ALL SELECT a FROM {1} UNION ALL SELECT a FROM {0}",
        "SELECT a FROM {0} UNION ALL (SELECT a FROM {1} UNION ALL SELECT a FROM {0})",
        "SELECT a FROM {0} UNION ALL SELECT a FROM {1} UNION ALL SELECT a FROM {0} UNION ALL SELECT a FROM {1}",
        "SELECT a FROM {0} UNION ALL (SELECT a FROM {1} UNION ALL (SELECT a FROM {0} UNION ALL SELECT a FROM {0}))",
        "(SELECT a FROM {0} UNION ALL SELECT a FROM {1}) UNION ALL (SELECT a FROM {0} UNION ALL SELECT a FROM {1})",
        "WITH c AS (SELECT a, b FROM {0} WHERE a IS NOT NULL) SELECT a FROM c UNION ALL SELECT a FROM c",
        "SELECT * FROM (SELECT a, b FROM {0} UNION ALL SELECT a, b FROM {1}) AS s WHERE s.a > 1",
        "WITH c AS (SELECT a FROM {0} UNION ALL SELECT a FROM {1}) SELECT * FROM c UNION ALL SELECT * FROM c WHERE a > 2",
        "WITH c AS (SELECT a FROM {0} UNION ALL SELECT a FROM {0}) SELECT * FROM c WHERE a <> 3",
        "SELECT * FROM (SELECT * FROM {0} UNION ALL SELECT * FROM {1}) UNION ALL SELECT * FROM {0}",
        "WITH c AS (SELECT a FROM {0}) SELECT * FROM c UNION ALL SELECT * FROM (WITH c AS (SELECT a FROM {1}) SELECT * FROM c) AS s",
    ],
)
def test_union_shapes_give_unique_ids(spark, tu, query):
    out, plain = run_on(spark, query, tu, [T, U])
    assert Counter(user_rows(out)) == Counter(plain)
    assert len(set(ids_of(out))) == out.num_rows == len(plain)


def test_three_way_union_codes_are_the_designs(spark):
    """``a UNION ALL b UNION ALL c`` over ids {5, 10, 7} gives a: 4e, b: 4e+2, c: 2e+1
    (outermost-first tagging would give 21 twice)."""
    ids = [5, 10, 7]
    query = "SELECT a FROM {0} UNION ALL SELECT a FROM {0} UNION ALL SELECT a FROM {0}"
    out, _ = run(spark, query, source(ids))
    expected = [4 * e for e in ids] + [4 * e + 2 for e in ids] + [2 * e + 1 for e in ids]
    assert sorted(ids_of(out)) == sorted(expected)
    assert len(set(expected)) == 9


def test_an_overflowing_id_raises_instead_of_wrapping(spark):
    big = source([2**62 + 5])
    query = "SELECT a FROM {0} UNION ALL SELECT a FROM {0} UNION ALL SELECT a FROM {0}"
    with pytest.raises(ArithmeticException, match="ARITHMETIC_OVERFLOW"):
        run(spark, query, big)
    fits, _ = run(spark, query, source([2**60 + 5]))  # 4e < 2**63: no error
    assert sorted(ids_of(fits)) == sorted(
        [4 * (2**60 + 5), 4 * (2**60 + 5) + 2, 2 * (2**60 + 5) + 1]
    )


@pytest.mark.parametrize(
    ("query", "found"),
    [
        ("SELECT x.a FROM {0} AS x JOIN {1} AS y ON x.a = y.a", "join"),
        ("SELECT x.a FROM {0} AS x, {1} AS y", "join"),
        ("SELECT a FROM {0} UNION SELECT a FROM {1}", "UNION without ALL"),
        ("SELECT a FROM {0} INTERSECT SELECT a FROM {1}", "INTERSECT"),
        ("SELECT a FROM {0} EXCEPT SELECT a FROM {1}", "EXCEPT"),
        ("SELECT a, count(*) AS n FROM {0} GROUP BY a", "GROUP BY|aggregate"),
        ("SELECT sum(a) FROM {0}", "aggregate"),
        ("SELECT DISTINCT a FROM {0}", "DISTINCT"),
        ("SELECT a, row_number() OVER (PARTITION BY b ORDER BY a) AS r FROM {0}", "window"),
        ("SELECT a FROM {0} LIMIT 5", "LIMIT"),
        ("SELECT a FROM {0} ORDER BY a", "ORDER BY"),
        ("SELECT a FROM (SELECT a FROM {0} ORDER BY a) AS s", "ORDER BY"),
        ("SELECT 1 AS one", "without FROM"),
        ("SELECT a FROM {0} UNION ALL SELECT 1", "without FROM"),
        ("SELECT a FROM not_a_source", "not a source"),
        ("SELECT a FROM {0} WHERE a IN (SELECT a FROM {1})", "subquery outside FROM"),
        ("SELECT a FROM {0} WHERE EXISTS (SELECT 1 FROM {1})", "subquery outside FROM"),
        ("SELECT a, (SELECT 1 FROM {1}) AS s FROM {0}", "subquery outside FROM"),
        ("SELECT explode(array(a, a)) AS e FROM {0}", "generator"),
        ("SELECT a FROM {0} LATERAL VIEW explode(array(a)) v AS e", "LATERAL"),
        ("SELECT a FROM {0} TABLESAMPLE (10 PERCENT)", "TABLESAMPLE"),
        ("SELECT a, rand() AS r FROM {0}", "non-deterministic"),
        ("SELECT a, current_timestamp() AS t FROM {0}", "current time"),
        ("SELECT x FROM VALUES (1), (2) AS v(x)", "generator or table function"),
        ("SELECT a AS _ingest_row_id FROM {0}", "hidden"),
        ("SELECT struct(*) AS s FROM {0}", "inside an expression"),
        ("SELECT * EXCEPT (b) FROM {0}", "EXCEPT"),
    ],
)
def test_other_shapes_are_refused(query, found):
    with pytest.raises(RewriteError, match=found) as caught:
        rewrite(query.format("ingest_v1", "ingest_v2"), ["ingest_v1", "ingest_v2"])
    assert caught.value.code == "REWRITE_UNSUPPORTED"


# --- The property: random union shapes over random unique ids -------------------------


@dataclass(frozen=True)
class Leaf:
    view: int
    skip: int | None  # WHERE a % 3 <> skip (a NULL a never passes)


@dataclass(frozen=True)
class Union:
    left: object
    right: object


@dataclass(frozen=True)
class Wrap:  # SELECT * FROM (inner) AS s WHERE a <> skip
    inner: object
    skip: int | None


@dataclass(frozen=True)
class Twice:  # WITH c AS (inner) SELECT * FROM c UNION ALL SELECT * FROM c
    inner: object


def shape_sql(shape, ctes: list[str], names: list[str]) -> str:
    if isinstance(shape, Leaf):
        where = "" if shape.skip is None else f" WHERE a % 3 <> {shape.skip}"
        return f"SELECT a, b FROM {names[shape.view]}{where}"
    if isinstance(shape, Union):
        left, right = shape_sql(shape.left, ctes, names), shape_sql(shape.right, ctes, names)
        return f"({left}) UNION ALL ({right})"
    if isinstance(shape, Wrap):
        where = "" if shape.skip is None else f" WHERE s.a <> {shape.skip}"
        return f"SELECT * FROM ({shape_sql(shape.inner, ctes, names)}) AS s{where}"
    body = shape_sql(shape.inner, ctes, names)  # its own CTEs are defined first
    name = f"c{len(ctes)}"
    ctes.append(f"{name} AS ({body})")
    return f"SELECT * FROM {name} UNION ALL SELECT * FROM {name}"


def paths(shape, a_value):
    """The paths (branch choices, outermost first) and views a row with ``a`` takes."""
    if isinstance(shape, Leaf):
        ok = shape.skip is None or (a_value is not None and a_value % 3 != shape.skip)
        return [((), shape.view)] if ok else []
    if isinstance(shape, Wrap):
        ok = shape.skip is None or (a_value is not None and a_value != shape.skip)
        return paths(shape.inner, a_value) if ok else []
    left, right = (shape.left, shape.right) if isinstance(shape, Union) else (shape.inner,) * 2
    return [((0, *p), v) for p, v in paths(left, a_value)] + [
        ((1, *p), v) for p, v in paths(right, a_value)
    ]


def decode(shape, code: int) -> tuple[tuple[int, ...], int]:
    """Invert the tagging: the lowest bit is the outermost union's branch."""
    if isinstance(shape, Leaf):
        return (), code
    if isinstance(shape, Wrap):
        return decode(shape.inner, code)
    branch = (shape.left, shape.right)[code & 1] if isinstance(shape, Union) else shape.inner
    path, row_id = decode(branch, code >> 1)
    return (code & 1, *path), row_id


leaves = st.builds(Leaf, st.integers(0, 2), st.none() | st.integers(0, 2))
shapes = st.recursive(
    leaves,
    lambda inner: (
        st.builds(Union, inner, inner)
        | st.builds(Wrap, inner, st.none() | st.integers(0, 6))
        | st.builds(Twice, inner)
    ),
    max_leaves=5,
)
id_sets = st.lists(st.integers(0, 2**40), min_size=0, max_size=6, unique=True)


@settings(max_examples=20, deadline=None)
@given(shape=shapes, ids=st.tuples(id_sets, id_sets, id_sets), seed=st.integers(0, 2**16))
def test_packed_ids_are_unique_and_decode_to_the_source_row(spark, shape, ids, seed):
    chance = random.Random(seed)
    tables = [
        source(view_ids, [chance.choice(["INSERT", "DELETE"]) for _ in view_ids],
               values=[(chance.choice([None, *range(7)]), f"v{n}r{i}", 0.0) for i in view_ids])
        for n, view_ids in enumerate(ids)
    ]  # fmt: skip
    rows = {(n, i): (a, b, act) for n, t in enumerate(tables)
            for a, b, i, act in zip(t["A"].to_pylist(), t["B"].to_pylist(), t[ROW_ID].to_pylist(),
                                    t[ACTION].to_pylist(), strict=True)}  # fmt: skip
    ctes: list[str] = []
    body = shape_sql(shape, ctes, ["{0}", "{1}", "{2}"])
    query = (f"WITH {', '.join(ctes)} " if ctes else "") + body
    out, _ = run(spark, query, *tables, plain=False)  # the decoding below checks every row
    codes = ids_of(out)
    assert len(set(codes)) == len(codes)
    decoded = []
    for code, a, b, act in zip(codes, out.column(0).to_pylist(), out.column(1).to_pylist(),
                               out.column(ACTION).to_pylist(), strict=True):  # fmt: skip
        path, row_id = decode(shape, code)
        views = [v for p, v in paths(shape, a) if p == path]
        assert len(views) == 1, (code, path)
        assert rows[(views[0], row_id)] == (a, b, act)
        decoded.append((path, views[0], row_id))
    expected = [
        (p, v, i) for (n, i), (a, _, _) in rows.items() for p, v in paths(shape, a) if v == n
    ]
    assert sorted(decoded) == sorted(expected)


# --- Net change ----------------------------------------------------------------------


XY_TYPES = (pa.int64(), pa.float64())


def result(rows, names=("X", "Y"), types=XY_TYPES) -> pa.Table:
    """An output of the rewritten query: ``rows`` of (*values, id, action)."""
    columns = [pa.array([r[k] for r in rows], t) for k, t in enumerate(types)]
    return pa.table([*columns, pa.array([r[-2] for r in rows], pa.int64()),
                     pa.array([r[-1] for r in rows], pa.string())],
                    names=[*names, ROW_ID, ACTION])  # fmt: skip


def summary(change: NetChange):
    return (change.rows.to_pylist(), sorted(change.deleted.to_pylist()),
            sorted(change.new_ids.to_pylist()), change.updated)  # fmt: skip


def test_inserts_only():
    change = net_change(result([(1, 0.5, 10, "INSERT"), (2, None, 11, "INSERT")]), ["X", "Y"])
    assert change.rows.column_names == ["X", "Y", ROW_ID]
    assert summary(change) == ([{"X": 1, "Y": 0.5, ROW_ID: 10}, {"X": 2, "Y": None, ROW_ID: 11}],
                               [], [10, 11], 0)  # fmt: skip


def test_deletes_only():
    change = net_change(result([(1, 0.5, 10, "DELETE"), (2, None, 11, "DELETE")]), ["X", "Y"])
    assert summary(change) == ([], [10, 11], [], 0)


def test_update_of_a_selected_column_is_one_update():
    change = net_change(result([(1, 0.5, 10, "DELETE"), (2, 0.5, 10, "INSERT")]), ["X", "Y"])
    assert summary(change) == ([{"X": 2, "Y": 0.5, ROW_ID: 10}], [], [], 1)


def test_update_of_an_unselected_column_writes_nothing():
    change = net_change(result([(1, 0.5, 10, "INSERT"), (1, 0.5, 10, "DELETE")]), ["X", "Y"])
    assert summary(change) == ([], [], [], 0)


def test_nulls_and_nans_are_equal():
    rows = [(None, math.nan, 10, "DELETE"), (None, math.nan, 10, "INSERT"),
            (None, 1.0, 11, "DELETE"), (None, math.nan, 11, "INSERT")]  # fmt: skip
    change = net_change(result(rows), ["X", "Y"])
    assert change.rows[ROW_ID].to_pylist() == [11]
    assert (change.updated, len(change.deleted), len(change.new_ids)) == (1, 0, 0)


def test_nested_values_are_compared_by_value():
    rows = [
        ([1, 2], 10, "DELETE"),
        ([1, 2], 10, "INSERT"),
        ([1], 11, "DELETE"),
        ([2], 11, "INSERT"),
    ]
    change = net_change(result(rows, ("L",), (pa.list_(pa.int64()),)), ["L"])
    assert summary(change) == ([{"L": [2], ROW_ID: 11}], [], [], 1)


@pytest.mark.parametrize("action", ["DELETE", "INSERT"])
def test_an_id_twice_on_one_side_is_an_error(action):
    with pytest.raises(ValueError, match=f"twice among {action}"):
        net_change(result([(1, 0.5, 10, action), (2, 0.5, 10, action)]), ["X", "Y"])


def test_an_unknown_action_is_an_error():
    with pytest.raises(ValueError, match="other than"):
        net_change(result([(1, 0.5, 10, "UPSERT")]), ["X", "Y"])
    with pytest.raises(ValueError, match="other than"):
        net_change(result([(1, 0.5, 10, None)]), ["X", "Y"])


def test_filter_leaving_and_entering_end_to_end(spark):
    """Source changes through the rewritten query: an update that leaves the filter is a
    delete, one that enters it an insert, one of an unselected column nothing."""
    old = {1: (5, "x", 1.0), 2: (0, "y", 2.0), 3: (5, "z", 3.0), 4: (6, "w", 4.0)}
    new = {1: (0, "x", 1.0), 2: (5, "y", 2.0), 3: (5, "z", 9.0), 4: (7, "w", 4.0)}
    ids, actions, values = [], [], []
    for row_id in old:
        ids += [row_id, row_id]
        actions += ["DELETE", "INSERT"]
        values += [old[row_id], new[row_id]]
    changes = source(ids, actions, values=values)
    with registered(spark, changes) as names:
        out = spark.sql(rewrite(f"SELECT a, b FROM {names[0]} WHERE a > 3", names)).toArrow()
    change = net_change(out.rename_columns(["A", "B", ROW_ID, ACTION]), ["A", "B"])
    assert summary(change) == ([{"A": 5, "B": "y", ROW_ID: 2}, {"A": 7, "B": "w", ROW_ID: 4}],
                               [1], [2], 1)  # fmt: skip


# The property: for random old and new rows keyed by id, the net change of the query's
# output over the source change set turns the old content into the new one, minimally.
values = st.tuples(st.none() | st.integers(0, 3),
                   st.none() | st.sampled_from([0.0, 1.5, math.nan]),
                   st.sampled_from(["p", "q"]))  # fmt: skip


def query_of(row):
    """The DT's query on one source row: WHERE x IS NULL OR x < 3, SELECT x, y."""
    x, y, _ = row
    return (x, y) if x is None or x < 3 else None


def key(values):
    return tuple("NaN" if isinstance(v, float) and math.isnan(v) else v for v in values)


@settings(max_examples=150, deadline=None)
@given(old=st.dictionaries(st.integers(0, 30), values, max_size=12),
       new=st.dictionaries(st.integers(0, 30), values, max_size=12),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_applying_the_net_change_gives_the_new_content(old, new, seed):
    changes = []  # the source's net change set, with DELETE carrying the old values
    for row_id in sorted(old.keys() | new.keys()):
        before, after = old.get(row_id), new.get(row_id)
        if before is not None and after is not None and key(before) == key(after):
            continue
        if before is not None:
            changes.append((before, row_id, "DELETE"))
        if after is not None:
            changes.append((after, row_id, "INSERT"))
    rows = [(*query_of(v), i, a) for v, i, a in changes if query_of(v) is not None]
    random.Random(seed).shuffle(rows)
    change = net_change(result(rows), ["X", "Y"])
    content = {i: key(query_of(v)) for i, v in old.items() if query_of(v) is not None}
    for row_id in change.deleted.to_pylist():
        assert content.pop(row_id, None) is not None
    new_ids = set(change.new_ids.to_pylist())
    for row in change.rows.to_pylist():
        value = key((row["X"], row["Y"]))
        if row[ROW_ID] in new_ids:
            assert row[ROW_ID] not in content
        else:
            assert content[row[ROW_ID]] != value  # an update that changes nothing is not written
        content[row[ROW_ID]] = value
    assert content == {i: key(query_of(v)) for i, v in new.items() if query_of(v) is not None}
    assert change.updated == change.rows.num_rows - len(new_ids)
