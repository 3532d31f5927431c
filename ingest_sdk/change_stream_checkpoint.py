"""The checkpoint of :class:`~ingest_sdk.ChangeStreamReader`: a SQLite file (WAL,
``synchronous=FULL``) holding, per stream, where the read started and ends, and each
partition's watermark and last position handed.

A stream's checkpoint is written only once its first query succeeded: a refused start
leaves nothing behind (and no file, if there was none). A checkpoint that does not fit
the reader's arguments is refused with a message that names the file and what to do.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

import orjson

from ingest_sdk.change_stream_positions import Partition, rfc3339
from ingest_sdk.errors import ConfigurationError

log = logging.getLogger("ingest_sdk.change_stream_reader")

SCHEMA = """
CREATE TABLE IF NOT EXISTS change_stream_reader (
    stream TEXT PRIMARY KEY,
    start_us INTEGER NOT NULL,
    end_us INTEGER,
    initialized INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS change_stream_reader_partitions (
    stream TEXT NOT NULL,
    token TEXT NOT NULL,
    parents TEXT NOT NULL,
    start_us INTEGER NOT NULL,
    watermark_us INTEGER NOT NULL,
    last_us INTEGER,
    last_table TEXT,
    last_sequence TEXT,
    last_transaction TEXT,
    state TEXT NOT NULL CHECK (state IN ('open', 'finished', 'ended')),
    PRIMARY KEY (stream, token)
);
"""
_PARTITION_COLUMNS = (
    "token, parents, start_us, watermark_us, last_us, last_table, last_sequence, "
    "last_transaction, state"
)


class Checkpoint:
    """The checkpoint's part of :class:`ChangeStreamReader`."""

    name: str
    _path: Path
    _start_us: int
    _end_us: int | None
    _partitions: dict[str, Partition]
    _state_lock: threading.Lock
    _running: threading.Lock

    def reset(self) -> bool:
        """Forget this stream's progress in the checkpoint file, so the next :meth:`run`
        starts a new read from ``start_timestamp``. Other streams' progress in the file,
        and the tables the callback wrote, stay. Whether there was progress to forget.

        Raises:
            ConfigurationError: the reader is running, or the file is not a checkpoint.
        """
        if not self._running.acquire(blocking=False):
            raise ConfigurationError("this reader is running; stop it before reset()")
        try:
            db = self._open_checkpoint(create=False)
            if db is None:
                return False
            try:
                db.execute("BEGIN IMMEDIATE")
                forgot = db.execute(
                    "DELETE FROM change_stream_reader WHERE stream = ?", (self.name,)
                ).rowcount
                db.execute(
                    "DELETE FROM change_stream_reader_partitions WHERE stream = ?", (self.name,)
                )
                db.execute("COMMIT")
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()
            with self._state_lock:
                self._partitions = {}
            return forgot > 0
        finally:
            self._running.release()

    def _how_to_reset(self) -> str:
        return (
            f"to start a new read instead, reset the checkpoint: call reset() on the reader "
            f"(it forgets {self.name}'s progress in {self._path} and keeps the tables your "
            f"callback wrote), or delete {self._path} with its -wal and -shm files if it "
            "holds nothing else (docs/sdk.md, 'Resetting a checkpoint')"
        )

    def _open_checkpoint(self, *, create: bool) -> sqlite3.Connection | None:
        """The checkpoint's connection; None if the file does not exist and not ``create``."""
        if not create and not self._path.exists():
            return None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self._path), isolation_level=None, timeout=30.0)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(SCHEMA)
            db.execute("SELECT stream, start_us, end_us, initialized FROM change_stream_reader")
            db.execute(f"SELECT stream, {_PARTITION_COLUMNS} FROM change_stream_reader_partitions")
        except sqlite3.DatabaseError as exc:
            db.close()
            raise ConfigurationError(
                f"checkpoint_path {self._path} is not a ChangeStreamReader checkpoint ({exc}); "
                "pass the path of a checkpoint a reader wrote, or of a file that does not exist"
            ) from None
        return db

    def _load(self, db: sqlite3.Connection) -> bool:
        """Load this stream's checkpoint; whether there was one to resume. A later
        ``end_timestamp`` reopens the partitions that ended at the old one.

        Raises:
            ConfigurationError: the checkpoint does not fit the reader's arguments.
        """
        db.execute("BEGIN IMMEDIATE")
        try:
            resumed = self._check_arguments(db)
            found = db.execute(
                f"SELECT {_PARTITION_COLUMNS} FROM change_stream_reader_partitions "
                "WHERE stream = ?",
                (self.name,),
            ).fetchall()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        partitions: dict[str, Partition] = {}
        for token, parents, start, mark, last_us, table, sequence, transaction, state in found:
            last = None if last_us is None else (last_us, table, sequence, transaction)
            partitions[token] = Partition(
                token, tuple(orjson.loads(parents)), start, mark, last, state,
                read_watermark=mark, read_last=last,
            )  # fmt: skip
        with self._state_lock:
            self._partitions = partitions
        return resumed

    def _check_arguments(self, db: sqlite3.Connection) -> bool:
        """Inside ``_load``'s transaction: whether this stream has a checkpoint, refused
        if it does not fit the reader's start and end."""
        row = db.execute(
            "SELECT start_us, end_us, initialized FROM change_stream_reader WHERE stream = ?",
            (self.name,),
        ).fetchone()
        if row is not None and not row[2]:
            # Left by an earlier version whose first query was refused: it read nothing.
            log.info("checkpoint %s: dropping %s's unstarted read", self._path, self.name)
            db.execute("DELETE FROM change_stream_reader WHERE stream = ?", (self.name,))
            db.execute("DELETE FROM change_stream_reader_partitions WHERE stream = ?", (self.name,))
            row = None
        if row is None:
            others = [s for (s,) in db.execute("SELECT stream FROM change_stream_reader")]
            if others:
                log.warning(
                    "checkpoint %s holds no read of %s (it holds %s): a new read starts at %s",
                    self._path, self.name, ", ".join(sorted(others)), rfc3339(self._start_us),
                )  # fmt: skip
            return False
        start_us, end_us, _ = row
        if start_us != self._start_us:
            raise ConfigurationError(
                f"the checkpoint {self._path} holds a read of {self.name} that started at "
                f"{rfc3339(start_us)}, not at start_timestamp {rfc3339(self._start_us)}. To "
                f"resume it, pass start_timestamp='{rfc3339(start_us)}'; " + self._how_to_reset()
            )
        if end_us is not None and (self._end_us is None or self._end_us > end_us):
            db.execute(
                "UPDATE change_stream_reader_partitions SET state = 'open' "
                "WHERE stream = ? AND state = 'ended'",
                (self.name,),
            )
        elif end_us != self._end_us:
            assert self._end_us is not None
            raise ConfigurationError(
                f"the checkpoint {self._path} read {self.name} up to "
                f"{'the end (no end_timestamp)' if end_us is None else rfc3339(end_us)}; a "
                f"resumed reader cannot stop earlier, at {rfc3339(self._end_us)}. To resume "
                "it, pass that end_timestamp, a later one or none; " + self._how_to_reset()
            )
        db.execute(
            "UPDATE change_stream_reader SET end_us = ? WHERE stream = ?", (self._end_us, self.name)
        )
        return True

    def _write_start(self, db: sqlite3.Connection) -> None:
        """Inside the first query's transaction: the stream's checkpoint begins."""
        try:
            db.execute(
                "INSERT INTO change_stream_reader (stream, start_us, end_us, initialized) "
                "VALUES (?, ?, ?, 1)",
                (self.name, self._start_us, self._end_us),
            )
        except sqlite3.IntegrityError:
            raise ConfigurationError(
                f"another reader of {self.name} began a checkpoint in {self._path} at the same "
                "time; run one reader per stream and checkpoint"
            ) from None

    def _save(self, db: sqlite3.Connection) -> None:
        """Write the changed partitions and commit (the callback's writes with them).

        A finished partition no unstarted child waits for is forgotten: it is never read
        again, and the checkpoint stays as small as the stream's open partitions."""
        waited_for = {
            t for p in self._partitions.values() if p.state != "finished" for t in p.parents
        }
        for p in list(self._partitions.values()):
            if p.state == "finished" and p.token not in waited_for:
                db.execute(
                    "DELETE FROM change_stream_reader_partitions WHERE stream = ? AND token = ?",
                    (self.name, p.token),
                )
                with self._state_lock:
                    del self._partitions[p.token]
        for p in self._partitions.values():
            if not p.dirty:
                continue
            last = p.last or (None, None, None, None)
            db.execute(
                "INSERT INTO change_stream_reader_partitions (stream, token, parents, start_us, "
                "watermark_us, last_us, last_table, last_sequence, last_transaction, state) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, token) DO UPDATE SET "
                "parents = excluded.parents, "
                "watermark_us = max(watermark_us, excluded.watermark_us), "
                "last_us = excluded.last_us, last_table = excluded.last_table, "
                "last_sequence = excluded.last_sequence, "
                "last_transaction = excluded.last_transaction, state = excluded.state",
                (self.name, p.token, orjson.dumps(list(p.parents)).decode(), p.start_us,
                 p.watermark, *last, p.state),
            )  # fmt: skip
            p.dirty = False
        db.execute("COMMIT")
