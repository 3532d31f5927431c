"""Spark's optimized logical plan of a query, read through the JVM: its operators, their
expressions as Columns, and its leaves matched to the sources they read.

The plan is read, never run: the delta rules (:mod:`.delta`) build new DataFrames from
its operators' own expressions, and Spark analyses and optimises each of them afresh.
Running the optimized plan with other data under it is wrong in general, because the
optimizer bakes facts about the data it saw into the plan (an empty source folds a
join away; a NOT IN over columns it believes never NULL loses its NULL rule). So the
plan is made over stand-ins that carry the real schema (nullability included) and
nothing the optimizer can fold (an RDD of no rows, not a local relation), and with the
optimizations that plant subqueries over the data (runtime bloom filters, dynamic
partition pruning) and the window top-k rewrite turned off while it is made.

Expressions keep the ids Spark gave their attributes (``exprId``): a leaf's columns are
rebound to the ids the plan's expressions expect (an ``Alias`` carrying that id), so an
operator's expressions resolve against DataFrames built from other data.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "Node", "PlanReader", "cast_select", "cast_sql", "join_type", "planning_confs", "quoted",
    "sql_type",
]  # fmt: skip

#: Settings while the plan is made: no subquery over the data planted by the optimizer,
#: no window top-k node (a filter over ranks stays a Filter over a Window).
_PLANNING = {
    "spark.sql.optimizer.runtime.bloomFilter.enabled": "false",
    "spark.sql.optimizer.runtimeFilter.semiJoinReduction.enabled": "false",
    "spark.sql.optimizer.dynamicPartitionPruning.enabled": "false",
    "spark.sql.optimizer.windowGroupLimitThreshold": "-1",
}


#: One plan is made at a time: the settings are the whole Spark session's, and two
#: threads restoring them in turn would leave the other's plan made without them.
_PLANNING_LOCK = threading.Lock()


@contextlib.contextmanager
def planning_confs(spark: SparkSession) -> Iterator[None]:
    """The settings of :data:`_PLANNING` while the block runs (restored after). Other
    threads' queries planned meanwhile run without those optimizations (speed only)."""
    with _PLANNING_LOCK:
        before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in _PLANNING}
        for key, value in _PLANNING.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key, old in before.items():
                if old is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, old)


@dataclass(frozen=True)
class Node:
    """One operator of the plan: its class name, the JVM node and its children."""

    kind: str
    jvm: Any
    children: tuple[Node, ...]

    @functools.cached_property
    def output(self) -> tuple[Any, ...]:
        """The attributes the operator outputs (JVM ``Attribute``s, with their ids); read
        once (the plan is never changed)."""
        return tuple(_items(self.jvm.output()))


def join_type(node: Node) -> str:
    """Spark's name of a ``Join`` node's type (an existence join's without its attribute:
    ``ExistenceJoin``, not ``ExistenceJoin(exists#n)``)."""
    return str(node.jvm.joinType().toString()).split("(")[0]


class PlanReader:
    """Reads plans and expressions of one Spark session through its JVM."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        jvm: Any = spark._jvm  # type: ignore[attr-defined]
        self.jvm = jvm
        # Classes looked up once: each name of a JVM path is a round trip to the JVM.
        self._expressions = jvm.org.apache.spark.sql.catalyst.expressions
        self._utils = jvm.org.apache.spark.sql.classic.ExpressionUtils
        self._none = getattr(getattr(jvm.scala, "None$"), "MODULE$")
        self._nil = getattr(getattr(jvm.scala.collection.immutable, "Nil$"), "MODULE$")

    def tree(self, plan: Any) -> Node:
        """The operator tree of a JVM logical plan."""
        children = tuple(self.tree(child) for child in _items(plan.children()))
        return Node(str(plan.getClass().getSimpleName()), plan, children)

    def optimized(self, frame: DataFrame) -> Node:
        """The optimized plan of ``frame``, made under :func:`planning_confs` (by a new
        query execution: one Spark already optimized keeps the plan it made)."""
        with planning_confs(self.spark):
            plan = frame.select("*")._jdf.queryExecution().optimizedPlan()
        return self.tree(plan)

    def column(self, expression: Any) -> Column:
        """A JVM expression as a Column (its attributes keep their ids)."""
        from pyspark.sql.column import Column

        return Column(self._utils.column(expression))

    def columns(self, expressions: Any) -> list[Column]:
        return [self.column(e) for e in _items(expressions)]

    def rebound(
        self, frame: DataFrame, attributes: Sequence[Any], keep: Sequence[str | Column]
    ) -> DataFrame:
        """``frame``'s first columns, by position, as ``attributes`` (same names and ids,
        cast to their types), then the columns ``keep`` (names or columns) as they are."""
        from pyspark.sql.types import _parse_datatype_json_string

        casts = [
            frame[quoted(name)].cast(_parse_datatype_json_string(a.dataType().json()))
            for a, name in zip(attributes, frame.columns, strict=False)
        ]
        analyzed = frame.select(*casts)._jdf.queryExecution().analyzed()
        children = [item.child() if item.getClass().getSimpleName() == "Alias" else item
                    for item in _items(analyzed.projectList())]  # fmt: skip
        aliases = [self._alias(c, a) for c, a in zip(children, attributes, strict=True)]
        return frame.select(*[self.column(e) for e in aliases], *keep)

    def binders(self, names: Sequence[str], attributes: Sequence[Any]) -> list[Column]:
        """Columns that read a frame's columns ``names``, by position, as ``attributes``
        (same names and ids, cast to their types): :meth:`rebound`'s for any frame with
        those column names, made once (a leaf is read at two versions and as a change)."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import _parse_datatype_json_string

        binders = []
        for attribute, name in zip(attributes, names, strict=False):
            kind = _parse_datatype_json_string(attribute.dataType().json())
            cast = self._utils.expression(F.col(quoted(name)).cast(kind)._jc)  # (unresolved)
            binders.append(self.column(self._alias(cast, attribute)))
        return binders

    def aliased(self, expression: Any, attribute: Any) -> Column:
        """``expression`` as a Column named and identified as ``attribute`` (an
        operator's unnamed output expression, e.g. one of an ``Expand``'s projections)."""
        return self.column(self._alias(expression, attribute))

    def _alias(self, child: Any, attribute: Any) -> Any:
        return self._expressions.Alias(
            child, attribute.name(), attribute.exprId(), attribute.qualifier(), self._none,
            self._nil,
        )  # fmt: skip

    def option(self, value: Any) -> Any | None:
        """A Scala ``Option``'s value, or None."""
        return value.get() if value.isDefined() else None

    def items(self, seq: Any) -> list[Any]:
        return _items(seq)


def _items(seq: Any) -> list[Any]:
    """A Scala collection's elements: one JVM round trip each and two more (an iterator
    takes two each)."""
    indexed = seq.toIndexedSeq()
    return [indexed.apply(i) for i in range(indexed.size())]


def typed_as(name: str, kind: Any) -> Column:
    """Column ``name`` of a table the engine keeps (as the table stores it) in the plan's
    type ``kind``: a VOID column (a NULL the query writes) is stored as NULLs of another
    type, which Spark does not cast to VOID."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NullType

    if isinstance(kind, NullType):
        return F.lit(None).alias(name)
    return F.col(quoted(name)).cast(kind)


def sql_type(kind: Any) -> str | None:
    """Spark SQL's name of type ``kind`` for a CAST in expression text (one JVM call for a
    whole select, where a Column built by functions takes several per column), or None
    for a type whose name is not written here exactly (nested, collated, intervals,
    user-defined types): the caller builds that one as a Column (:func:`typed_as`)."""
    from pyspark.sql.types import (
        BinaryType,
        BooleanType,
        DateType,
        NumericType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )  # fmt: skip

    simple = (NumericType, BinaryType, BooleanType, DateType, TimestampType, TimestampNTZType)
    if isinstance(kind, simple) or (type(kind) is StringType and kind == StringType()):
        return str(kind.simpleString())
    return None


def cast_sql(name: str, kind: Any, alias: str | None = None) -> str | None:
    """``CAST(`name` AS kind) AS `alias``` (default ``name``) as expression text, None
    where :func:`sql_type` has no name for ``kind``; a VOID is a NULL, as in
    :func:`typed_as`."""
    from pyspark.sql.types import NullType

    target = quoted(name if alias is None else alias)
    if isinstance(kind, NullType):
        return f"NULL AS {target}"
    written = sql_type(kind)
    return None if written is None else f"CAST({quoted(name)} AS {written}) AS {target}"


def cast_select(frame: DataFrame, casts: Sequence[tuple[str, Any] | tuple[str, Any, str]],
                keep: Sequence[str] = ()) -> DataFrame:  # fmt: skip
    """``frame``'s columns ``casts`` (name, type, and the name to give it: default its
    own) cast to their types, then its columns ``keep`` as they are: one JVM call when
    :func:`cast_sql` writes every type."""
    named = [(cast[0], cast[1], cast[-1] if len(cast) == 3 else cast[0]) for cast in casts]
    texts = [cast_sql(name, kind, alias) for name, kind, alias in named]
    if all(text is not None for text in texts):
        return frame.selectExpr(*texts, *(quoted(name) for name in keep))  # type: ignore[arg-type]
    from pyspark.sql import functions as F

    return frame.select(*[typed_as(name, kind).alias(alias) for name, kind, alias in named],
                        *[F.col(quoted(name)) for name in keep])  # fmt: skip


def quoted(name: str) -> str:
    """A column name as Spark reads it whatever it holds (dots, spaces, backquotes)."""
    return "`" + name.replace("`", "``") + "`"
