"""MIN and MAX kept as aggregation state (:mod:`.algebraic`): a group's current extreme
and how many non-NULL values it has, maintained from the change where no deleted value
could have been the extreme, and recomputed from the group's input rows where one could.

A change of a group inserts some values and deletes others. The extreme of the inserted
values and the old extreme give the new one (Spark's own ``min``/``max`` over the two, so
NaN, the order of strings and the rest are Spark's) unless a deleted value could have
been the old extreme: for a MIN, a deleted value not greater than the old minimum (Spark
comparison: -0.0 equals 0.0 and NaN equals NaN, so such a deletion recomputes, which is
right either way). Such a group (UNSAFE) has its whole state, every state column of
every aggregate function, computed again from its input rows at the new versions; only
those groups' rows are read (:meth:`~pipelines.incremental.delta.Deltas.restricted`).

A change of one row that leaves its value as it was (an UPDATE of another column) shows
as a deletion and an insertion of that value: if it is the extreme, the group is
recomputed. The delta of a join of two changed sides may hold a row deleted and inserted
again that was in neither version; its value counts among both the deleted and the
inserted ones, so it sends the group to recomputation or lies beyond the old extreme,
where it changes nothing.

The UNSAFE groups' new rows are the aggregation's own over their rows (:func:`recomputed`),
put first in the delta's union: they carry the plan's attribute ids (a grouping column's
is its input column's, which the state path's rows alias as well), and Spark renews the
ids of the later children, whose rows the union reads by position.

Argument types kept: integers, decimals, FLOAT, DOUBLE, STRING of the default
(binary) collation, DATE, TIMESTAMP (NTZ and LTZ) and BOOLEAN, each stored in the type of
the argument; anything else (binary, intervals, arrays, structs, maps, variants,
collated strings) keeps its aggregation recomputing its groups.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipelines.incremental.hidden import ID, KEY, SIGN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from pipelines.incremental.algebraic import Layout
    from pipelines.incremental.delta import Deltas

__all__ = ["Extreme", "changed", "kept", "lost_values", "merged", "recomputed", "retyped",
           "unsafe"]

_DELETED = "_INGEST_D_"
_OLD = "_INGEST_O_"


@dataclass(frozen=True)
class Extreme:
    """A MIN (``least``) or a MAX kept as state, its value of Arrow type ``arrow`` (the
    argument's), of Spark type ``spark`` (its JSON) in the engine's frames."""

    least: bool
    arrow: pa.DataType
    spark: str

    @property
    def kind(self) -> Any:
        """The argument's Spark type (the state's, which an Arrow round trip may lose:
        Arrow has no mark of TIMESTAMP_NTZ)."""
        from pyspark.sql.types import _parse_datatype_json_string

        return _parse_datatype_json_string(self.spark)

    def aggregate(self, column: Column) -> Column:
        """Spark's own MIN or MAX of ``column``."""
        from pyspark.sql import functions as F

        return F.min(column) if self.least else F.max(column)


def kept(aggregate: Any) -> Extreme | bool | None:
    """For a JVM aggregate function: None if it is no MIN or MAX, False if it is one whose
    argument type the state does not keep, else its :class:`Extreme`."""
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_type
    from pyspark.sql.types import _parse_datatype_json_string

    kind = aggregate.getClass().getSimpleName()
    if kind not in ("Min", "Max"):
        return None
    argument = _parse_datatype_json_string(aggregate.child().dataType().json())
    simple = (T.IntegralType, T.DecimalType, T.FloatType, T.DoubleType, T.DateType,
              T.TimestampType, T.BooleanType)  # fmt: skip
    if isinstance(argument, T.StringType):
        if argument.collation != "UTF8_BINARY":
            return False
    elif not isinstance(argument, (*simple, T.TimestampNTZType)):
        return False
    return Extreme(kind == "Min", to_arrow_type(argument, timezone="UTC"), argument.json())


def _state(j: int) -> str:
    return f"_INGEST_STATE_{j}"


def changed(argument: Column, extreme: Extreme, j: int) -> list[Column]:
    """What a group's signed change rows give the state of function ``j``: the extreme
    of the inserted values (as its value), the change of its non-NULL count, and the
    extreme of the deleted values (``_INGEST_D_<j>``, read by :func:`recomputed_unsafe`)."""
    from pyspark.sql import functions as F

    sign = F.col(SIGN)
    return [
        extreme.aggregate(F.when(sign > 0, argument)).alias(_state(j)),
        F.sum(F.when(argument.isNotNull(), sign).otherwise(0)).cast("bigint")
        .alias(f"{_state(j)}_N"),
        extreme.aggregate(F.when(sign < 0, argument)).alias(f"{_DELETED}{j}"),
    ]  # fmt: skip


def merged(extreme: Extreme, name: str) -> Column:
    """The new extreme of a SAFE group from its old one and the inserted values' (the
    rows of one group, ``name`` their value column)."""
    from pyspark.sql import functions as F

    return extreme.aggregate(F.col(name)).cast(extreme.kind)


def retyped(found: Layout, touched: DataFrame) -> DataFrame:
    """The touched groups' extremes (inserted and deleted) after an Arrow round trip,
    cast back to their Spark types."""
    from pyspark.sql import functions as F

    from pipelines.incremental.algebraic import extremes_of

    casts = {name: F.col(name).cast(extreme.kind) for j, extreme in extremes_of(found)
             for name in (_state(j), f"{_DELETED}{j}")}  # fmt: skip
    return touched.withColumns(casts) if casts else touched  # one analysis, not one a column


def lost_values(found: Layout, touched: pa.Table) -> bool:
    """Whether the change deleted any non-NULL value of a MIN's or MAX's argument (in
    ``touched``, the collected change per group: :func:`changed`): if not, no group can
    have lost its extreme and :func:`unsafe` need not run (an append-only source's)."""
    from pipelines.incremental.algebraic import extremes_of

    return any(touched.column(f"{_DELETED}{j}").null_count < touched.num_rows
               for j, _ in extremes_of(found))  # fmt: skip


def _unsafe(found: Layout) -> Column:
    """Whether a touched group lost a value that could have been its extreme (over the
    touched groups joined with their old extremes as ``_INGEST_O_<j>``)."""
    from pyspark.sql import functions as F

    from pipelines.incremental.algebraic import extremes_of

    conditions = [F.lit(False)]
    for j, extreme in extremes_of(found):
        deleted, old = F.col(f"{_DELETED}{j}"), F.col(f"{_OLD}{j}")
        beyond = deleted > old if extreme.least else deleted < old
        conditions.append(deleted.isNotNull() & ~F.coalesce(beyond, F.lit(False)))
    return functools.reduce(operator.or_, conditions)


def unsafe(deltas: Deltas, found: Layout, touched: DataFrame, old: DataFrame) -> DataFrame | None:
    """The touched groups (keys ``_INGEST_K<i>``, ``ID``) that lost a value that could
    have been an extreme, read back as a relation of their own; None if there is none
    (no value deleted that could be an extreme), and nothing more is read.
    ``touched``: the groups' change (:func:`changed`), ``old``: their old state."""
    from pyspark.sql import functions as F

    from flush.spark_tables import arrow_frame
    from pipelines.incremental.algebraic import extremes_of

    lost = [F.col(f"{_DELETED}{j}").isNotNull() for j, _ in extremes_of(found)]
    candidates = touched.where(functools.reduce(operator.or_, lost, F.lit(False)))
    olds = old.select(ID, *[F.col(_state(j)).alias(f"{_OLD}{j}") for j, _ in extremes_of(found)])
    flagged = candidates.join(olds, on=ID, how="left").where(_unsafe(found))
    keys = [f"{KEY}{i}" for i in range(len(found.keys))]
    groups = flagged.select(*keys, ID).toArrow()
    if groups.num_rows == 0:
        return None
    frame = arrow_frame(deltas.reader.spark, groups)
    for name in keys:  # as they were before the round trip
        frame = frame.withColumn(name, F.col(name).cast(touched.schema[name].dataType))
    return frame


def recomputed(deltas: Deltas, found: Layout, groups: DataFrame) -> DataFrame:
    """The new rows (+1) of the UNSAFE ``groups`` (:func:`unsafe`), each with its whole
    state, aggregated again from their input rows at the new versions: only those
    groups' rows are read. A group whose rows are all gone has no row.

    The rows carry the plan's own attribute ids: the delta puts them first in its union,
    whose output is its first child's (Spark renews the ids the state's rows alias)."""
    from pyspark.sql import functions as F

    from pipelines.incremental.algebraic import full

    reader = deltas.reader
    rows = deltas.state(found.aggregate.children[0], "new")
    if found.keys:
        rows = deltas.restricted(rows, list(found.keys), groups)
    new = deltas.aggregate(found.aggregate, rows, full(reader, found))
    for above in reversed(found.chain):
        new = new.select(*reader.columns(above.jvm.projectList()), ID, *found.names)
    return new.withColumn(SIGN, F.lit(1))
