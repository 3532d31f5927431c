"""Operators that make several rows of each input row, and relations of constant rows,
as the query-delta engine evaluates them (:class:`pipelines.incremental.delta.Deltas`).

- ``Expand`` (ROLLUP, CUBE, GROUPING SETS, several COUNT DISTINCTs): one row per
  projection;
- ``Generate`` (``explode``, ``posexplode``, ``inline``, their ``_outer`` forms,
  ``LATERAL VIEW``): one row per element of an array or entry of a map.

Both are row-wise: an input row's made rows depend on it alone, so an operator's delta
is the operator applied to its input's delta. A made row's id is a hash of its input
row's id and its position (the projection's, the element's), the same at every version
while the input row holds the same values.

- ``LocalRelation`` (``VALUES``, a literal table) and ``OneRowRelation`` (``SELECT``
  without ``FROM``): rows that never change (their delta is empty), each with a hash of
  its position in the relation as its id.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipelines.incremental.hidden import ID, KEY
from pipelines.incremental.plan import Node, PlanReader

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["CONSTANT", "constant", "expand", "generate", "generates"]

#: Leaves whose rows are constants of the plan.
CONSTANT = frozenset({"LocalRelation", "OneRowRelation"})
#: The generators :func:`generate` evaluates (Spark's class names).
_GENERATORS = frozenset({"Explode", "PosExplode", "Inline"})
_POS, _KEYS, _VALUES = f"{KEY}P", f"{KEY}MK", f"{KEY}V"


def expand(reader: PlanReader, node: Node, rows: DataFrame, extra: list[str]) -> DataFrame:
    """One row per projection for each row, the rows of one source row told apart by the
    projection's position. Exploded from an array (a union of selects over one frame
    would have its ids renewed); the columns every projection passes through keep their
    own ids, the others take the output's."""
    from pyspark.sql import functions as F

    child = {a.exprId().id() for a in node.children[0].output}
    passed = [a for a in node.output if a.exprId().id() in child]
    made = [i for i, a in enumerate(node.output) if a.exprId().id() not in child]
    rows_of = F.array(*[
        F.struct(*[reader.column(items[i]).alias(f"{KEY}{i}") for i in made],
                 F.xxhash64(F.col(ID), F.lit(position)).alias(ID))
        for position, items in enumerate(
            reader.items(p) for p in reader.items(node.jvm.projections()))
    ])  # fmt: skip
    kept = [reader.column(a) for a in passed]
    exploded = rows.select(*kept, F.explode(rows_of).alias(KEY), *extra)
    flat = exploded.select(*[f"{KEY}.{KEY}{i}" for i in made], *kept, f"{KEY}.{ID}", *extra)
    bound = reader.rebound(flat, [node.output[i] for i in made], [*kept, ID, *extra])
    return bound.select(*[reader.column(a) for a in node.output], ID, *extra)


def generates(node: Node) -> bool:
    """Whether :func:`generate` evaluates the ``Generate`` node's generator (else its
    pretty name is the reason for a FULL refresh: ``stack``, ``json_tuple``, a
    table function, the repeated rows of INTERSECT ALL and EXCEPT ALL)."""
    return str(node.jvm.generator().getClass().getSimpleName()) in _GENERATORS


def generate(reader: PlanReader, node: Node, rows: DataFrame, extra: list[str]) -> DataFrame:
    """Each row with one row per element of its collection (none for an empty or NULL
    one, unless outer: then one with NULLs), numbered by ``posexplode``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType, _parse_datatype_json_string

    generator = node.jvm.generator()
    kind = str(generator.getClass().getSimpleName())
    collection = generator.child()
    is_map = str(collection.dataType().getClass().getSimpleName()) == "MapType"
    explode = F.posexplode_outer if node.jvm.outer() else F.posexplode
    names = [_POS, _KEYS, _VALUES] if is_map else [_POS, _VALUES]
    kept = [reader.column(a) for a in reader.items(node.jvm.requiredChildOutput())]
    exploded = rows.select(*kept, ID, *extra, explode(reader.column(collection)).alias(*names))
    if kind == "Inline":  # an array of structs: one column per field, by position (two
        # fields may share a name): the struct cast to one of names of its own
        element = _parse_datatype_json_string(collection.dataType().elementType().json())
        assert isinstance(element, StructType)
        positional = StructType([StructField(f"{_VALUES}{i}", f.dataType, f.nullable)
                                 for i, f in enumerate(element.fields)])  # fmt: skip
        structs = F.col(_VALUES).cast(positional)
        values = [structs.getField(f.name) for f in positional.fields]
    else:
        values = [F.col(n) for n in names[0 if kind == "PosExplode" else 1:]]
    made = reader.items(node.jvm.generatorOutput())
    flat = exploded.select(*values, *kept, F.xxhash64(F.col(ID), F.col(_POS)).alias(ID), *extra)
    bound = reader.rebound(flat, made, [*kept, ID, *extra])
    return bound.select(*[reader.column(a) for a in node.output], ID, *extra)


def constant(reader: PlanReader, node: Node) -> DataFrame:
    """A constant relation's rows with their ids (its rows at every version)."""
    from pyspark.sql import DataFrame, Window
    from pyspark.sql import functions as F

    spark = reader.spark
    ids = F.xxhash64(F.lit("constant"), F.col(_POS)).alias(ID)
    if node.kind == "OneRowRelation":
        return spark.range(1).select(F.lit(0).alias(_POS)).select(ids)
    # A relation of its own (new attribute ids), numbered in its rows' order in Spark:
    # an Arrow round trip cannot carry intervals, nor a NULL struct of NOT NULL fields.
    classic: Any = reader.jvm.org.apache.spark.sql.classic.Dataset
    frame = DataFrame(classic.ofRows(spark._jsparkSession, node.jvm.newInstance()), spark)
    columns = [frame[i] for i in range(len(frame.columns))]
    order = Window.orderBy(F.monotonically_increasing_id())  # the rows' order, scan by scan
    numbered = frame.select(*columns, (F.row_number().over(order) - 1).alias(_POS))
    return reader.rebound(numbered.select(*columns, ids), node.output, [ID])
