"""Operators that make several rows of each input row, and relations of constant rows,
as the query-delta engine evaluates them (:class:`pipelines.incremental.delta.Deltas`).

- ``Expand`` (ROLLUP, CUBE, GROUPING SETS, several COUNT DISTINCTs): one row per
  projection;
- ``Generate`` (``explode``, ``posexplode``, ``inline``, their ``_outer`` forms,
  ``LATERAL VIEW``): one row per element of an array or entry of a map; ``stack``:
  its rows of the input row's values; ``json_tuple``: one row of the fields it reads;
  ``replicaterows`` (what Spark plans for INTERSECT ALL and EXCEPT ALL, over the count
  of each distinct row): its values as many times as its count says.

Both are row-wise: an input row's made rows depend on it alone, so an operator's delta
is the operator applied to its input's delta, by Spark (``posexplode`` of the plan's
collection; the plan's own ``stack`` and ``json_tuple``). A
made row's id is a hash of its input row's id and its position (the projection's, the
element's, the stack row's), the same at every version while the input row holds the
same values.

- ``LocalRelation`` (``VALUES``, a literal table), ``OneRowRelation`` (``SELECT``
  without ``FROM``) and ``Range`` (``range(...)``): rows that never change (their delta
  is empty), each with a hash of its position in the relation as its id (a range's row:
  of its value, each value once).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipelines.incremental.hidden import ID, KEY
from pipelines.incremental.plan import Node, PlanReader

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["CONSTANT", "constant", "expand", "generate", "generates"]

#: Leaves whose rows are constants of the plan.
CONSTANT = frozenset({"LocalRelation", "OneRowRelation", "Range"})
#: The generators :func:`generate` evaluates (Spark's class names): of a collection,
#: one row per element; of values, rows of the input row's values alone.
_OF_COLLECTIONS = frozenset({"Explode", "PosExplode", "Inline"})
_OF_VALUES = frozenset({"Stack", "JsonTuple"})
_OF_COUNTS = frozenset({"ReplicateRows"})
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


def generates(reader: PlanReader, node: Node) -> bool:
    """Whether :func:`generate` evaluates the ``Generate`` node's generator (else its
    pretty name is the reason for a FULL refresh: a table function other than
    ``range`` and the generators)."""
    kind = str(node.jvm.generator().getClass().getSimpleName())
    if kind in _OF_COUNTS:
        return _copies_its_input(reader, node)
    return kind in _OF_COLLECTIONS | _OF_VALUES


def generate(reader: PlanReader, node: Node, rows: DataFrame, extra: list[str]) -> DataFrame:
    """Each row with the rows its generator makes of it, each made row's id a hash of
    the row's and of its position among them."""
    from pyspark.sql import functions as F

    kind = str(node.jvm.generator().getClass().getSimpleName())
    if kind in _OF_COUNTS:
        return _replicated(reader, node, rows, extra)
    kept = [reader.column(a) for a in reader.items(node.jvm.requiredChildOutput())]
    of = _of_collection if kind in _OF_COLLECTIONS else _of_values
    values, position, exploded = of(reader, node, rows, [*kept, F.col(ID), *extra])
    made = reader.items(node.jvm.generatorOutput())
    flat = exploded.select(*values, *kept, F.xxhash64(F.col(ID), position).alias(ID), *extra)
    bound = reader.rebound(flat, made, [*kept, ID, *extra])
    return bound.select(*[reader.column(a) for a in node.output], ID, *extra)


_Made = tuple[list["Column"], "Column", "DataFrame"]


def _of_collection(reader: PlanReader, node: Node, rows: DataFrame, kept: list[Any]) -> _Made:
    """One row per element of the collection (none for an empty or NULL one, unless
    outer: then one with NULLs), numbered by ``posexplode``: the made values, the
    position and the rows (``kept`` then the generated columns)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType, _parse_datatype_json_string

    generator = node.jvm.generator()
    kind = str(generator.getClass().getSimpleName())
    collection = generator.child()
    is_map = str(collection.dataType().getClass().getSimpleName()) == "MapType"
    explode = F.posexplode_outer if node.jvm.outer() else F.posexplode
    names = [_POS, _KEYS, _VALUES] if is_map else [_POS, _VALUES]
    exploded = rows.select(*kept, explode(reader.column(collection)).alias(*names))
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
    return values, F.col(_POS), exploded


def _of_values(reader: PlanReader, node: Node, rows: DataFrame, kept: list[Any]) -> _Made:
    """The plan's own generator applied by Spark to each row: ``stack``'s rows numbered
    by a position it is given before each row's values, ``json_tuple``'s one row (NULLs
    for a NULL or malformed text) numbered 0."""
    from pyspark.sql import functions as F

    generator = node.jvm.generator()
    width = len(reader.items(node.jvm.generatorOutput()))
    names = [f"{_VALUES}{i}" for i in range(width)]
    position = F.lit(0)
    if str(generator.getClass().getSimpleName()) == "Stack":
        generator, names, position = _numbered(reader, generator), [_POS, *names], F.col(_POS)
    if node.jvm.outer():
        expressions: Any = reader.jvm.org.apache.spark.sql.catalyst.expressions
        generator = expressions.GeneratorOuter(generator)
    exploded = rows.select(*kept, reader.column(generator).alias(*names))
    return [F.col(n) for n in names[-width:]], position, exploded


def _replicated(reader: PlanReader, node: Node, rows: DataFrame, extra: list[str]) -> DataFrame:
    """``replicaterows(n, v...)``: each row ``n`` times (none for ``n`` <= 0), numbered 0
    to n - 1 by ``posexplode``. Its output is its input's own attributes (Spark reuses
    their ids: :func:`generates` checks), so a copy keeps the row's columns as they are.
    The row is a group's (its id kept while the group lives): a count going from 3 to 2
    deletes copy 2 alone."""
    from pyspark.sql import functions as F

    count = reader.items(node.jvm.generator().children())[0]
    times = F.greatest(reader.column(count), F.lit(0)).cast("int")
    copies = F.posexplode(F.array_repeat(F.lit(True), times)).alias(_POS, _KEYS)
    inputs = [reader.column(a) for a in node.children[0].output]
    exploded = rows.select(*inputs, F.col(ID), *extra, copies)
    made = F.xxhash64(F.col(ID), F.col(_POS)).alias(ID)
    return exploded.select(*[reader.column(a) for a in node.output], made, *extra)


def _copies_its_input(reader: PlanReader, node: Node) -> bool:
    """Whether a ``replicaterows`` node's values are its input's attributes, and its
    output those attributes again (as Spark plans INTERSECT ALL and EXCEPT ALL)."""
    def ids(expressions: Any) -> list[int | None]:
        return [e.exprId().id() if e.getClass().getSimpleName() == "AttributeReference"
                else None for e in expressions]  # fmt: skip

    values = ids(reader.items(node.jvm.generator().children())[1:])
    made = ids(reader.items(node.jvm.generatorOutput()))
    return None not in values and values == made


def _numbered(reader: PlanReader, stack: Any) -> Any:
    """``stack(n, v...)`` as ``stack(n, 0, row 0's values, 1, row 1's values, ...)``:
    Spark's own stack, each row with its position first. A short last row (Spark fills
    it with NULLs) is filled here with NULLs of its columns' types (the first row's)."""
    expressions: Any = reader.jvm.org.apache.spark.sql.catalyst.expressions
    literal = expressions.Literal
    count, *values = reader.items(stack.children())
    rows = int(count.eval(None))
    width = -(-len(values) // rows)
    types = [v.dataType() for v in values[:width]]
    numbered = [count]
    for row in range(rows):
        have = values[row * width:(row + 1) * width]
        nulls = [literal(None, kind) for kind in types[len(have):]]
        numbered += [literal(row, count.dataType()), *have, *nulls]
    return expressions.Stack(reader.jvm.PythonUtils.toSeq(numbered))


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
    if node.kind == "Range":  # its values are distinct, each its row's id
        ranged = frame.select(*columns, F.xxhash64(F.lit("range"), columns[0]).alias(ID))
        return reader.rebound(ranged, node.output, [ID])
    order = Window.orderBy(F.monotonically_increasing_id())  # the rows' order, scan by scan
    numbered = frame.select(*columns, (F.row_number().over(order) - 1).alias(_POS))
    return reader.rebound(numbered.select(*columns, ids), node.output, [ID])
