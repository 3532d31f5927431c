"""Every dynamic table of a round compared with its query run fresh in one Spark job, not
two collects per table (the engine tests refresh many tables after each change).

The comparison is :func:`checks.assert_same_as_query`'s: as multisets, NaN equal to NaN,
-0.0 apart from 0.0, whole numbers and decimals by value (a count is a bigint in a query,
a NUMBER in a table), a value's type told apart (``1`` from ``'1'`` from ``1.0``). Each
value travels as text: Spark's text of a double tells every double apart (Java's
shortest distinguishing digits), a decimal's is read back by value, bytes go as hex,
timestamps keep their microseconds. A plain module the test files import (no fixtures).
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import Session

_EXACT = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)


def _kind(dtype: T.DataType) -> str:
    """The class of values a column's type gives (what ``canon`` tells apart)."""
    if isinstance(dtype, _EXACT):
        return "exact"
    if isinstance(dtype, T.FloatType | T.DoubleType):
        return "float"
    if isinstance(dtype, T.TimestampType | T.TimestampNTZType):
        return "timestamp"
    if isinstance(dtype, T.StringType | T.CharType | T.VarcharType):
        return "string"
    return dtype.simpleString()


def _text(column: Column, dtype: T.DataType) -> Column:
    if isinstance(dtype, T.BinaryType):
        return F.hex(column)
    return column.cast("string")


def _as_text(frame: DataFrame, table: int, side: int) -> tuple[DataFrame, list[str]]:
    """``frame``'s rows as (table, side, array of each value's text), and its columns'
    kinds. Columns are taken by position (a query may repeat a name)."""
    fields = frame.schema.fields
    named = frame.toDF(*[f"_c{i}" for i in range(len(fields))])
    values = [_text(F.col(f"_c{i}"), f.dataType) for i, f in enumerate(fields)]
    texts = named.select(F.lit(table).alias("_T"), F.lit(side).alias("_S"),
                         F.array(*values).alias("_R"))  # fmt: skip
    return texts, [_kind(f.dataType) for f in fields]


def _canon(text: str | None, kind: str) -> object:
    if text is None or kind == "string":
        return text
    if kind == "exact":
        return "#" + str(Decimal(text).normalize())
    return f"{kind}:{text}"


def bags(session: Session, tables: dict[str, str]) -> dict[str, tuple[Counter, Counter]]:
    """Each table's rows and its query's, as multisets, read by one Spark job."""
    if not tables:
        return {}
    frames, kinds = [], {}
    for index, (name, query) in enumerate(tables.items()):
        for side, frame in enumerate((session.sql(f"SELECT * FROM {name}"), session.sql(query))):
            texts, kinds[index, side] = _as_text(frame, index, side)
            frames.append(texts)
    found: dict[tuple[int, int], Counter] = {key: Counter() for key in kinds}
    for row in reduce(DataFrame.unionAll, frames).collect():
        kind = kinds[row["_T"], row["_S"]]
        values = zip(row["_R"], kind, strict=True)
        found[row["_T"], row["_S"]][tuple(_canon(t, k) for t, k in values)] += 1
    return {name: (found[i, 0], found[i, 1]) for i, name in enumerate(tables)}


def assert_all_same_as_queries(
    session: Session, tables: dict[str, str], step: object = None
) -> None:
    """Each table of ``tables`` (name -> query) equals its query run fresh."""
    wrong = []
    for name, (content, fresh) in bags(session, tables).items():
        if content != fresh:
            wrong.append(f"{name} differs from its query: only in {name}: "
                         f"{list((content - fresh).items())[:5]}; only in the query: "
                         f"{list((fresh - content).items())[:5]}")  # fmt: skip
    assert not wrong, f"after {step!r}:\n" + "\n".join(wrong)


def assert_every_step_refreshes_incrementally(
    session: Session, steps: list[str] | list[str | list[str]], tables: dict[str, str],
    no_data: bool = False,
) -> None:  # fmt: skip
    """Each table equals its query; then after each of ``steps`` (a statement, or a list
    of statements run one after another, one change for the refreshes), each table's
    refresh is INCREMENTAL (or NO_DATA where ``no_data``: none of its sources changed)
    and leaves it equal to its query run fresh. Each round's tables are compared in one
    Spark job."""
    assert_all_same_as_queries(session, tables, "the first refresh")
    for step in steps:
        for statement in [step] if isinstance(step, str) else step:
            session.sql(statement)
        for name in tables:
            status = session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status
            assert "INCREMENTAL" in status or (no_data and "NO_DATA" in status), (
                name, step, status)  # fmt: skip
        assert_all_same_as_queries(session, tables, step)
