"""A source table as the query-delta engine reads it (:class:`pipelines.incremental.delta.Source`):
its rows at two versions and its net change between them, from the Delta change feed.

Shared by dynamic tables' refreshes and streams on views; it sits here, above the
change feed (:mod:`pipelines.streams.changes`) and the engine, below the SQL layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltalake import DeltaTable

from flush.spark_tables import read_delta
from flush.tables import ROW_ID_COLUMN, live_files
from pipelines.change_sets import STREAM_ACTION, STREAM_ROW_ID, ChangeMode
from pipelines.incremental import pruning
from pipelines.incremental.delta import ID, SIGN, Source
from pipelines.streams.changes import read_changes

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from catalog import TableInfo

__all__ = ["TableSource"]


@dataclass
class TableSource(Source):
    """A table read at versions ``after`` (None: no old version) and ``to``.

    ``append_only``: only the rows inserted in ``(after, to]`` count as its change, each
    as inserted (a stream on a view with APPEND_ONLY = TRUE): the new rows are then the
    old ones plus those, so that the engine's old, new and delta stay consistent."""

    spark: SparkSession
    info: TableInfo
    after: int | None
    to: int
    append_only: bool = False
    _changes: DataFrame | None = None
    _handles: dict[int, DeltaTable] = field(default_factory=dict)
    _files_at: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def _columns(self, frame: DataFrame, extra: Sequence[Any]) -> DataFrame:
        from pyspark.sql import functions as F

        names = ["`" + n.replace("`", "``") + "`" for n in self.info.schema.names]
        return frame.select(*[F.col(n) for n in names], *extra)

    def _at(self, version: int, files: list[dict[str, Any]] | None = None) -> DataFrame:
        """The rows at ``version`` (of ``files`` only; by default all, from the listing
        :meth:`_files` made, if it made one, rather than listing them again)."""
        if files is None:
            files = self._files_at.get(version)
        frame = read_delta(self.spark, self.info.uri, version, loaded=self._handles.get(version),
                           files=files)  # fmt: skip
        return self._columns(frame, [ROW_ID_COLUMN]).withColumnRenamed(ROW_ID_COLUMN, ID)

    def _files(self, version: str) -> tuple[int, list[dict[str, Any]]] | None:
        """The data files at ``version`` ("old", "new") and its number; None where the
        rows are not those of one version (the new rows of an append-only source)."""
        if self.append_only and version == "new":
            return None
        at = self.to if version == "new" else self.after
        assert at is not None
        if at not in self._files_at:
            self._handles[at] = DeltaTable(self.info.uri, version=at)
            self._files_at[at] = live_files(self._handles[at])
        return at, self._files_at[at]

    def prunable(self, version: str) -> bool:
        found = self._files(version)
        return found is not None and len(found[1]) > 1 and sum(
            f["size_bytes"] for f in found[1]) >= pruning.PRUNE_FROM_BYTES  # fmt: skip

    def pruned(
        self, version: str, position: int | None, values: list[Any], nulls: bool = False
    ) -> DataFrame | None:  # fmt: skip
        found = self._files(version)
        if found is None:
            return None
        at, files = found
        column = ROW_ID_COLUMN if position is None else self.info.schema.names[position]
        kept = pruning.kept_files(files, column, values, nulls)
        return None if len(kept) == len(files) else self._at(at, kept)

    def old(self) -> DataFrame:
        assert self.after is not None
        return self._at(self.after)

    def unchanged(self) -> bool:
        return self.after == self.to

    def new(self) -> DataFrame:
        if not self.append_only or self.after is None:
            return self._at(self.to)
        return self.old().unionByName(self.changes().drop(SIGN))

    def changes(self) -> DataFrame:
        from pyspark.sql import functions as F

        if self._changes is None:
            after = self.after if self.after is not None else -1
            mode = ChangeMode.APPEND_ONLY if self.append_only else ChangeMode.DEFAULT
            frame = read_changes(self.spark, self.info.uri, self.info.schema, after, self.to,
                                 mode)  # fmt: skip
            sign = F.when(F.col(f"`{STREAM_ACTION}`") == "INSERT", 1).otherwise(-1)
            self._changes = self._columns(frame, [
                F.col(f"`{STREAM_ROW_ID}`").alias(ID), sign.alias(SIGN)])  # fmt: skip
        return self._changes
