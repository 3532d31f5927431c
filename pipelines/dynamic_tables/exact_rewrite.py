"""The incremental rewrite of a stateless query, run only once Spark has shown that it
means what the query the user wrote means.

:func:`pipelines.dynamic_tables.rewrite.rewrite` works on sqlglot's tree and regenerates
the text, and a regenerated text can differ from the written one (a function's argument
dropped, a literal re-typed). So Spark optimises both, the written query and the
rewritten one without its two added columns, over the same source views, and the
rewrite runs only if the two optimised plans give the same result
(``LogicalPlan.sameResult``: equal once names and expression ids are normalised). A
rewrite that cannot be shown equal is refused (fails closed): the table refreshes FULL
by value instead, and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlglot.errors import ErrorLevel, SqlglotError

from catalog import TableInfo
from pipelines.dynamic_tables.rewrite import RewriteError, rewrite
from pipelines.errors import SqlError
from pipelines.sql.source_text import parse_with_spans

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from pipelines.sql.context import StatementContext

__all__ = ["exact_rewrite", "inexact_reason"]


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
        # A construct sqlglot cannot write back in Spark's dialect stops here (it would
        # only warn, and drop an argument).
        text = tree.sql("spark", unsupported_level=ErrorLevel.RAISE)
        rewritten = session.run_spark(text)
        written = session.run_spark(bound)
    except (SqlError, SqlglotError) as exc:
        raise RewriteError(f"the rewrite cannot carry this query exactly ({exc})") from None
    width = len(written.columns)
    if len(rewritten.columns) != width + 2:
        raise RewriteError("the rewritten query gives other columns than the query")
    names = [f"c{i}" for i in range(width)]
    ours = rewritten.toDF(*names, "_row_id", "_action").select(*names)
    if not _optimized(ours).sameResult(_optimized(written.toDF(*names))):
        raise RewriteError("the rewrite for incremental refresh cannot carry this query "
                           "exactly (Spark's plans of the rewritten and the written query "
                           "differ)")  # fmt: skip
    return rewritten


def _optimized(frame: DataFrame) -> Any:
    return frame._jdf.queryExecution().optimizedPlan()  # type: ignore[attr-defined]


def inexact_reason(
    session: StatementContext, query: str, defaults: tuple[str, str], txn: Any
) -> str | None:
    """Why a stateless query's rewrite cannot run exactly (REWRITE_INEXACT), or None:
    checked when the dynamic table is created, over its sources as they are then, so
    its refreshes are FULL from the start rather than fail."""
    from pyspark.sql import functions as F

    from pipelines.dynamic_tables.rewrite import ACTION
    from pipelines.sql.binding import Binder

    def with_actions(info: TableInfo) -> DataFrame:
        return txn.table_frame(info, row_ids=True).withColumn(ACTION, F.lit("INSERT"))

    binder = Binder(session, txn, defaults, analysis=True, sources=with_actions)
    try:
        exact_rewrite(session, binder.bind(query), binder.source_views)
    except RewriteError:
        return "REWRITE_INEXACT"
    return None
