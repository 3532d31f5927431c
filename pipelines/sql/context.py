"""What a statement handler may use of the session that runs it: :class:`StatementContext`.

The session hands itself to every handler (:data:`pipelines.sql.ddl.HANDLERS`, the DML
runners of :mod:`pipelines.sql.dml`) and to the :class:`~pipelines.sql.binding.Binder`.
They are typed against this protocol, not against :class:`~pipelines.session.Session`,
so no handler module imports the session module (which imports all of them): the
session satisfies the protocol structurally, and mypy checks that where it passes
itself. The protocol lists exactly what the handlers use; a handler that needs more
adds it here first.

What is not here is deliberate: handlers never see the session's open transaction
(statements that change rows get theirs passed in; the others refuse to run inside a
transaction), nor ``sql()`` (a handler does not run statements of its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import DataFrame, SparkSession
    from sqlglot import exp

    from catalog import Catalog, StreamRecord, TableInfo
    from pipelines.sql.binding import Binder
    from pipelines.transactions.transaction import Transaction

__all__ = ["StatementContext"]


class StatementContext(Protocol):
    """The session as its statement handlers and binder see it."""

    #: The defaults for one- and two-part names; ``USE`` and ``CREATE DATABASE|SCHEMA``
    #: set them.
    database: str
    schema: str

    @property
    def warehouse(self) -> Path:
        """The warehouse folder (where new tables' folders go)."""
        ...

    @property
    def catalog(self) -> Catalog:
        """The catalog the session opened."""
        ...

    @property
    def spark(self) -> SparkSession:
        """The Spark session that evaluates queries and builds answers."""
        ...

    @property
    def views(self) -> list[str]:
        """The temporary views the binder made for this session (dropped by
        :meth:`release_views`); the plan guard lets a query read only these."""
        ...

    @property
    def view_names(self) -> dict[str, str]:
        """Each view's table or stream as the user named it (for error messages)."""
        ...

    def qualify(self, name: str) -> tuple[str, str, str]:
        """``DB.SCHEMA.NAME`` of a dotted name, defaults filled in."""
        ...

    def find_table(self, database: str, schema: str, name: str) -> TableInfo | None:
        """The table of that name, or None."""
        ...

    def require_table(self, name: str) -> TableInfo:
        """The table a dotted name names, or ObjectNotFoundError."""
        ...

    def table_or_error(self, database: str, schema: str, table: str) -> TableInfo:
        """The table, or an ObjectNotFoundError that names it and says what to check."""
        ...

    def require_stream(self, name: str) -> StreamRecord:
        """The stream a dotted name names, or ObjectNotFoundError."""
        ...

    def point(self, info: TableInfo, at: str, kind: str, value: Any) -> int:
        """The table version an ``AT | BEFORE (VERSION | TIMESTAMP | STREAM => ...)``
        names."""
        ...

    def staleness(self, stream: StreamRecord, table: TableInfo | None) -> tuple[bool, float]:
        """Whether the stream is stale, and when it becomes stale if not consumed."""
        ...

    def check_stream_fresh(self, stream: StreamRecord) -> None:
        """Raise StreamStaleError if the stream is stale."""
        ...

    def run_spark(self, text: str) -> DataFrame:
        """A bound query's DataFrame, once the plan guard has checked it."""
        ...

    def consumed(self, txn: Transaction, binder: Binder) -> None:
        """The streams ``binder`` read are consumed by ``txn`` when it commits."""
        ...

    def release_views(self) -> None:
        """Drop the temporary views earlier statements made."""
        ...

    def information_schema_view(self, database: str, name: str) -> DataFrame:
        """The rows of ``<database>.INFORMATION_SCHEMA.<name>``
        (:mod:`pipelines.information_schema`)."""
        ...

    def table_function(
        self, table: exp.Table, call: exp.Anonymous, defaults: tuple[str, str]
    ) -> tuple[DataFrame, str]:
        """The rows of one of our table-valued calls in a query (``READ_<change
        stream>(...)``, ``TABLE(DYNAMIC_TABLE_REFRESH_HISTORY(...))``) and the name its
        view goes by; ``call``: the function's call inside ``table``; ``defaults``: the
        database and schema its unqualified names mean."""
        ...
