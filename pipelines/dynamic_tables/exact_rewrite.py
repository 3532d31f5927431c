"""The incremental rewrite of a stateless query, run over the change views.

:func:`pipelines.dynamic_tables.rewrite.rewrite` works on sqlglot's tree and regenerates
the text, and a regenerated text can differ from the written one (``to_char``'s format
dropped, ``1.50BD`` re-typed). Known gap (issue 30, next step): comparing Spark's
optimised plans of both texts caught those but also refused exact rewrites whose plans
differ only in form, so nothing is checked here yet beyond the columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlglot.errors import SqlglotError

from catalog import TableInfo
from pipelines.dynamic_tables.rewrite import RewriteError, rewrite
from pipelines.errors import SqlError
from pipelines.sql.source_text import parse_with_spans

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["exact_rewrite"]


def exact_rewrite(
    session: StatementContext, bound: str, source_views: Mapping[str, TableInfo]
) -> DataFrame:
    """The rewritten query's DataFrame (the user's columns, then the row id and action).

    Args:
        bound: the query as the binder bound it over the change views ``source_views``
            (view name -> its table), which carry ``_INGEST_ROW_ID`` and ``_INGEST_ACTION``.

    Raises:
        RewriteError: the query is not one the rewrite supports, or the rewritten text
            does not mean what ``bound`` means.
    """
    columns = {view: list(info.schema.names) for view, info in source_views.items()}
    try:
        tree = rewrite(parse_with_spans(bound), columns)  # type: ignore[arg-type]
        rewritten = session.run_spark(tree.sql("spark"))
    except (SqlError, SqlglotError) as exc:
        raise RewriteError(f"the rewrite cannot carry this query ({exc})") from None
    return rewritten

