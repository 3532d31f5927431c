"""One lock per table folder for the writers that rewrite a table's files or its rows
outside the flush path: compaction and dynamic-table refreshes. An advisory ``flock``
on a file in the table folder, so it holds across threads and processes alike, and a
process that dies lets go of it with its file descriptors."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LOCK_FILE", "TableLocked", "table_lock"]

LOCK_FILE = "_compaction.lock"


class TableLocked(RuntimeError):
    """Another writer holds the table's lock (only when not waiting for it)."""


@contextlib.contextmanager
def table_lock(table_uri: str, wait: bool = True) -> Iterator[None]:
    """Hold the table's lock; wait for it, or raise :class:`TableLocked` at once if
    ``wait`` is false and another writer holds it."""
    with open(Path(table_uri) / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError as exc:
            raise TableLocked(table_uri) from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
