"""A group's row id from its key values: the one rule of the engine's aggregations
(:meth:`~pipelines.incremental.delta.Deltas.aggregate`), of the groups a change touched and
of the aggregation state (:mod:`.algebraic`)."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any

from pipelines.incremental.plan import PlanReader

if TYPE_CHECKING:
    from pyspark.sql import Column

__all__ = ["GROUP_ID_RULE", "group_id", "grouping"]


#: The rule :func:`group_id` follows, written in every commit of a table it maintains
#: (as an application transaction): 1 hashed the keys alone, so groups whose keys
#: differ only in where their NULLs are, like ``(NULL, 1)`` and ``(1, NULL)``, shared
#: an id; 2 hashes where the NULLs are too. A table of an older rule refreshes FULL
#: once (:func:`renews_group_ids`).
GROUP_ID_RULE = 2
_NULLS_MARK = "_INGEST_NULLS"


def group_id(keys: list[Any], reader: PlanReader, names: list[str] | None = None) -> Column:
    """A group's row id from its key values (``keys``: the grouping expressions; read
    from the columns ``names`` instead where given): the one rule of
    :meth:`Deltas._aggregate` and of the touched groups' ids (:meth:`Deltas._touched_keys`).

    ``xxhash64`` skips NULLs, at the top and inside arrays, structs and maps, so a key
    without any NULL hashes to ``xxhash64(keys)`` and a key with one also hashes the
    flags of where they are, then a mark: a flag hashes as the integer 1 or 0, so the
    key NULL would otherwise hash as the key 1 (rule 2: :data:`GROUP_ID_RULE`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import _parse_datatype_json_string

    if not keys:
        return F.lit(0).cast("bigint")
    columns = [F.col(n) for n in names] if names else [reader.column(k) for k in keys]
    masks = [_null_mask(c, _parse_datatype_json_string(k.dataType().json()))
             for c, k in zip(columns, keys, strict=True)]  # fmt: skip
    any_null = functools.reduce(operator.or_, [anywhere for _, anywhere in masks])
    flags = [flag for mask, _ in masks for flag in mask]
    marked = F.xxhash64(*columns, *flags, F.lit(_NULLS_MARK))  # a flag alone hashes as 1
    return F.when(any_null, marked).otherwise(F.xxhash64(*columns))


def grouping(reader: PlanReader, key: Any) -> Column:
    """A grouping expression as a DataFrame's ``groupBy`` takes it: a constant key (the
    optimizer makes ``GROUP BY 'c'`` a ``Literal(0)``) wrapped, or ``groupBy`` would read
    an integer literal as a position in the select list."""
    from pyspark.sql import functions as F

    column = reader.column(key)
    return F.coalesce(column) if key.getClass().getSimpleName() == "Literal" else column


def _null_mask(value: Column, kind: Any) -> tuple[list[Column], Column]:
    """Where ``value`` (of Spark type ``kind``) and what it holds are NULL: flags that
    are never NULL themselves (an array's, one per element), and whether any is set."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, MapType, StructType

    flags, anywhere = [value.isNull()], value.isNull()
    if isinstance(kind, StructType):
        for field in kind.fields:
            inner, inner_any = _null_mask(value.getField(field.name), field.dataType)
            flags, anywhere = [*flags, *inner], anywhere | inner_any
    elif isinstance(kind, ArrayType | MapType):
        items = value if isinstance(kind, ArrayType) else F.map_values(value)
        element = kind.elementType if isinstance(kind, ArrayType) else kind.valueType
        flags.append(F.transform(items, lambda x: F.struct(*_null_mask(x, element)[0])))
        anywhere = anywhere | F.coalesce(
            F.exists(items, lambda x: _null_mask(x, element)[1]), F.lit(False)
        )
    return flags, anywhere
