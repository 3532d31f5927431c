"""Committing a change set to a Delta table: the one Delta write of the pipeline layer.

A change set is keyed by the hidden row id: the new state of rows inserted or updated
(``rows``) and the ids of rows deleted (``deleted``). Inserts alone are an append of
one Parquet file; anything else is one delta-rs ``merge`` on the row id. Either way the
commit carries the consumer's app transactions (one per stream it consumed), one more
that marks the pipeline commit itself (so a replay finds it and never applies it twice)
and metadata naming it.
A change set that *replaces* the content (``ChangeSet.replaces``: ``rows`` is the
whole new content) is one overwrite commit of one new file: what a FULL refresh writes
when nothing follows the table's row ids (:mod:`pipelines.dynamic_tables.refresh_change`).
An empty change set still commits (an empty commit), because the app transactions
must land even when a consumption wrote no row.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from flush.commit_clock import commit_info, stamped, table_folder
from flush.parquet_files import WrittenFile, write_parquet_file
from flush.tables import ROW_ID_COLUMN

__all__ = [
    "PIPELINE_METADATA_KEY",
    "ChangeSet",
    "ConcurrentChangeError",
    "StagedChange",
    "TxnVersionError",
    "changed_row_ids",
    "check_unchanged",
    "commit_conflict_retries",
    "commit_staged",
    "landed_version",
    "stage_change_set",
]

PIPELINE_METADATA_KEY = "ingest.pipelines"

#: How long a merge keeps retrying after conflicts with concurrent appends.
MERGE_RETRY_SECONDS = 60.0
_OP = "__INGEST_OP"


class ConcurrentChangeError(RuntimeError):
    """Another writer changed rows this change set updates or deletes, after it was computed."""


class TxnVersionError(RuntimeError):
    """A consumer would move an app transaction backwards (delta-rs would accept it)."""


@dataclass(slots=True)
class ChangeSet:
    """Rows to write to one table, keyed by the hidden row id.

    Attributes:
        rows: the new state of inserted and updated rows (the table's Delta schema).
        deleted: ids of deleted rows.
        new_ids: ids in ``rows`` that no earlier version holds (inserts).
        replaces: ``rows`` is the table's whole new content (every earlier row goes);
            ``deleted`` and ``new_ids`` are then unused.
    """

    rows: pa.Table
    deleted: pa.Array = field(default_factory=lambda: pa.array([], pa.int64()))
    new_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.int64()))
    replaces: bool = False

    @property
    def is_append(self) -> bool:
        """Only inserts: committed as an append, which needs no write intent (it cannot
        lose a row another writer changed; delta-rs may still refuse it once after a
        concurrent merge, and the commit is retried)."""
        return (not self.replaces and len(self.deleted) == 0
                and len(self.new_ids) == self.rows.num_rows)  # fmt: skip


def commit_conflict_retries() -> Retrying:
    """Retries of a Delta commit that delta-rs refused for a concurrent commit
    (``CommitFailedError``): for :data:`MERGE_RETRY_SECONDS`, with jittered backoff."""
    return Retrying(
        retry=retry_if_exception_type(CommitFailedError),
        stop=stop_after_delay(MERGE_RETRY_SECONDS),
        wait=wait_random_exponential(multiplier=0.02, max=0.5),
        reraise=True,
    )


def landed_version(table: DeltaTable, commit_app: str, after_version: int) -> int | None:
    """The version that holds pipeline commit ``commit_app``, searched in
    ``(after_version, table.version()]``; None if it never landed (a replay must not
    apply it twice).

    Read from each version's commit metadata (the commit's app id is there), not only
    from the snapshot's app transactions: those expire after
    ``delta.setTransactionRetentionDuration``, and a commit held up longer than that
    (damage waiting for an operator) must still be known as landed. delta-rs'
    ``history()`` is not used: it labels entries from the loaded version, so a commit
    landing meanwhile shifts them. A version whose commit file log cleanup removed is
    unreadable; then the app transaction decides (the newest version if present).
    """
    newest = table.version()
    if newest <= after_version:
        return None
    uri = table_folder(table)
    for version in range(after_version + 1, newest + 1):
        info = commit_info(uri, version)
        if info is None:  # cleaned up: the snapshot's app transaction is all there is
            return newest if table.transaction_version(commit_app) is not None else None
        metadata = info.get(PIPELINE_METADATA_KEY)
        if metadata and orjson.loads(metadata).get("app_id") == commit_app:
            return version
    return None


def changed_row_ids(table_uri: str, after_version: int, to_version: int) -> pa.Array:
    """Ids of rows updated or deleted by commits in ``(after_version, to_version]``
    (from the change data feed; compaction does not count)."""
    if to_version <= after_version:
        return pa.array([], pa.int64())
    events = pa.table(
        DeltaTable(table_uri).load_cdf(
            starting_version=after_version + 1, ending_version=to_version
        )
    )
    kinds = events.column("_change_type").cast(pa.string())
    mask = pc.is_in(kinds, value_set=pa.array(["delete", "update_preimage"]))
    return events.column(ROW_ID_COLUMN).filter(mask).combine_chunks()


def check_unchanged(
    table_uri: str, staged: StagedChange | None, base_version: int, where: str = ""
) -> None:
    """Check that no commit after ``base_version`` updated or deleted a row the staged
    change updates or deletes, or, for an overwrite, changed any row (an append or no
    change can always apply).

    Raises:
        ConcurrentChangeError: another writer changed such a row first.
    """
    if staged is None or not staged.changes_rows:
        return
    newest = DeltaTable(table_uri).version()
    if newest <= base_version:
        return
    if staged.kind == "overwrite":
        _check_no_data_change(table_uri, base_version, newest, where)
        return
    source = pq.read_table(f"{table_uri}/{staged.path}", columns=[ROW_ID_COLUMN, _OP])
    touched = source.filter(pc.is_in(source.column(_OP), pa.array(["U", "D"])))
    changed = changed_row_ids(table_uri, base_version, newest)
    if pc.any(pc.is_in(changed, value_set=touched.column(ROW_ID_COLUMN))).as_py():
        raise ConcurrentChangeError(
            f"rows this transaction changes{where} were changed by another writer after "
            f"version {base_version}, which this transaction read"
        )


def _check_no_data_change(table_uri: str, after: int, to: int, where: str) -> None:
    """An overwrite replaces the content it was computed from: no commit in
    ``(after, to]`` may have changed a row (compaction changes none)."""
    events = DeltaTable(table_uri).load_cdf(starting_version=after + 1, ending_version=to)
    if pa.table(events).num_rows:
        raise ConcurrentChangeError(
            f"another writer changed rows{where} after version {after}, which this "
            "transaction replaces"
        )


def _check_txns(table: DeltaTable, app_transactions: dict[str, int]) -> None:
    for app_id, version in app_transactions.items():
        landed = table.transaction_version(app_id)
        if landed is not None and landed > version:
            raise TxnVersionError(
                f"{app_id} is already at version {landed} in {table.table_uri}; "
                f"refusing to move it back to {version}"
            )


def _quoted(name: str) -> str:
    """A column name as DataFusion (delta-rs' SQL) reads it: quoted keeps its case."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True)
class StagedChange:
    """A change set written to disk before its commit, so recovery can roll it forward.

    ``kind`` is ``append`` (``path`` is the data file the commit adds), ``merge``
    (``path`` holds the rows with an operation column: I insert, U update, D delete;
    the ids of U and D rows are the rows a concurrent writer must not have changed) or
    ``overwrite`` (``path`` is the one data file of the new content; no row may have
    changed since the content it replaces was read).
    """

    kind: str
    path: str  # relative to the table folder
    size: int
    rows: int
    stats: str

    @property
    def changes_rows(self) -> bool:
        """Whether the commit updates or deletes rows (a write intent on the table's rows,
        checked against concurrent writers), not only adds them."""
        return self.kind in ("merge", "overwrite")

    def to_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}  # type: ignore[attr-defined]

    @classmethod
    def from_dict(cls, value: dict[str, object]) -> StagedChange:
        return cls(**{k: v for k, v in value.items() if k in cls.__slots__})  # type: ignore[attr-defined, arg-type]


def stage_change_set(table_uri: str, change: ChangeSet) -> StagedChange:
    """Write ``change`` under the table's ``_ingest/`` folder (fsync'd). An append's file
    is the data file its commit adds; a merge's is the source of the merge. An unused
    file is unreferenced by the log, and maintenance's vacuum removes it in time."""
    if change.is_append or change.replaces:
        kind = "overwrite" if change.replaces else "append"
        written = write_parquet_file(table_uri, change.rows)
        return StagedChange(kind, written.path, written.size, written.rows, written.stats)
    # Deleted rows travel as ids with NULL values: the source allows NULL everywhere.
    arrow_schema = pa.schema([f.with_nullable(True) for f in change.rows.schema])
    deletes = pa.table(
        {
            name: (
                change.deleted.cast(pa.int64())
                if name == ROW_ID_COLUMN
                else pa.nulls(len(change.deleted), arrow_schema.field(name).type)
            )
            for name in arrow_schema.names
        },
        schema=arrow_schema,
    )
    is_new = pc.is_in(change.rows.column(ROW_ID_COLUMN), value_set=change.new_ids)
    operations = pa.concat_arrays([
        pc.if_else(is_new, "I", "U").combine_chunks().cast(pa.string()),
        pa.array(["D"] * deletes.num_rows, pa.string()),
    ])  # fmt: skip
    source = pa.concat_tables([change.rows.cast(arrow_schema), deletes]).append_column(
        _OP, operations
    )
    written = write_parquet_file(table_uri, source, use_dictionary=True)
    return StagedChange("merge", written.path, written.size, written.rows, "")


def _merge(table: DeltaTable, source: pa.Table, properties: CommitProperties) -> None:
    names = [n for n in source.schema.names if n != _OP]
    values = {_quoted(n): f"s.{_quoted(n)}" for n in names}
    row_id = _quoted(ROW_ID_COLUMN)
    # An update of a row that is gone is not an insert: a decided commit rolls forward
    # over a row deleted by a writer outside the protocol without bringing it back.
    (
        table.merge(
            source,
            f"t.{row_id} = s.{row_id}",
            source_alias="s",
            target_alias="t",
            commit_properties=properties,
        )
        .when_matched_delete(predicate=f"s.{_OP} = 'D'")
        .when_matched_update(updates=values, predicate=f"s.{_OP} <> 'D'")
        .when_not_matched_insert(updates=values, predicate=f"s.{_OP} = 'I'")
        .execute()
    )


def commit_staged(
    table_uri: str,
    staged: StagedChange | None,
    *,
    commit_app: str,
    base_version: int,
    app_transactions: dict[str, int],
    metadata: dict[str, object],
) -> int:
    """Apply a staged change set (None: nothing but the app transactions) to the table
    in one Delta commit; returns its version.

    Idempotent: if the log already holds pipeline commit ``commit_app`` (its app
    transaction) after ``base_version`` (the version the change set was computed on),
    that version is returned and nothing is written. The rows were checked before the
    commit was decided (:func:`check_unchanged`) and are held against other pipeline
    writers since, so a merge that loses a race with a concurrent append or compaction
    (delta-rs reports a conflict) is simply tried again on the newest version.

    Raises:
        TxnVersionError: an app transaction would move backwards.
    """
    now = int(time.time() * 1000)  # they expire after flush.tables.TXN_RETENTION
    custom = {PIPELINE_METADATA_KEY: orjson.dumps({**metadata, "app_id": commit_app}).decode()}
    txns = [Transaction(app, version, now) for app, version in app_transactions.items()]
    txns.append(Transaction(commit_app, 1, now))
    # A merge conflicts with every append that lands while it runs (delta-rs checks
    # blind appends too), so under steady ingestion it retries for a while, not a count.
    # Each attempt is stamped for the version it commits on (flush.commit_clock).
    for attempt in commit_conflict_retries():
        with attempt:
            table = DeltaTable(table_uri)
            if (landed := landed_version(table, commit_app, base_version)) is not None:
                return landed
            _check_txns(table, app_transactions)
            # Flushes may have landed while the log was read: commit on the newest
            # version, so that only a commit landing in the next moment makes this
            # attempt go again (the stamp is for the next version only).
            table.update_incremental()
            properties = stamped(table, custom, txns)
            if staged is None or staged.kind in ("append", "overwrite"):
                actions: list[AddAction | RemoveAction] = []
                if staged is not None and staged.rows:
                    actions.append(
                        WrittenFile(staged.path, staged.size, staged.rows, staged.stats)
                        .add_action()
                    )  # fmt: skip
                # A decided overwrite replaces whatever is there: its rows were checked
                # before the decision and held against pipeline writers since, and a
                # decided commit only rolls forward (what a writer outside the protocol
                # added meanwhile is replaced too).
                overwrite = staged is not None and staged.kind == "overwrite"
                mode = "overwrite" if overwrite else "append"
                table.create_write_transaction(
                    actions, mode, table.schema(), commit_properties=properties
                )
            else:
                _merge(table, pq.read_table(f"{table_uri}/{staged.path}"), properties)
    version = landed_version(DeltaTable(table_uri), commit_app, base_version)
    assert version is not None, "the commit landed but is not in the log"
    return version
