"""Whether an ``s3://`` warehouse can hold Delta tables without losing commits (issue 34).

delta-rs (1.x) writes each version of a table's log with a conditional put
(``If-None-Match: *``) and nothing else: it no longer has a locking provider (with
``AWS_S3_LOCKING_PROVIDER`` set it logs that and commits the same way). On a store that
ignores the condition, two writers racing for one version both succeed and the log keeps
the last: a commit, its rows and its offset tokens, lost without an error.
:func:`check_object_store` refuses such a store before anything commits there.
"""

from __future__ import annotations

import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.fs import DeltaStorageHandler
from deltalake.schema import Schema

from flush.storage import describe_store_error

__all__ = ["CONTENDERS", "PROBE_FOLDER", "StoreConfigError", "check_object_store"]

#: The folder of the warehouse the probe tables are made in (each deleted after its probe).
PROBE_FOLDER = "_probe"
#: Commits the probe races for version 1 of its table.
CONTENDERS = 4
_SCHEMA = Schema.from_arrow(pa.schema([("probe", pa.int64())]))


class StoreConfigError(ValueError):
    """The warehouse's object store is configured so that Delta commits would be lost, or
    cannot be used at all; the message says which and what to change."""


def check_object_store(warehouse: str) -> None:
    """Refuse an ``s3://`` warehouse whose store would lose Delta commits (a no-op for any
    other warehouse), from the AWS environment variables delta-rs reads.

    The probe races :data:`CONTENDERS` empty appends, from handles loaded at version 0,
    for a throwaway table under ``<warehouse>/_probe/``. It races them because delta-rs
    lists the log for its newest version right before each put and puts the next one:
    an append through a stale handle, one after the other, landed as version 2 on moto
    and through a proxy that drops ``If-None-Match`` alike, and never put an existing
    version. Raced, on moto all four landed as versions 1 to 4 (a put refused with 412
    is retried on the next version: appends do not conflict); through that proxy all
    four succeeded and the table stayed at version 1, in each of 80 runs (40 with both
    cores busy). A race that happens not to overlap would pass an ignoring store: the
    probe may miss one, but never refuses a store that honours the condition.

    Raises:
        StoreConfigError: ``AWS_S3_LOCKING_PROVIDER`` is set; the store overwrote a
            commit; or the probe could not write, or delete, its table (a missing
            bucket, an unreachable endpoint, refused credentials), the cause chained.
    """
    if not warehouse.startswith("s3://"):
        return
    if "AWS_S3_LOCKING_PROVIDER" in os.environ:
        raise StoreConfigError(
            "delta-rs commits to S3 with conditional puts and ignores a locking provider: "
            "unset AWS_S3_LOCKING_PROVIDER (it is "
            f"{os.environ['AWS_S3_LOCKING_PROVIDER']!r}) and keep the warehouse on a store "
            "that supports conditional writes (AWS S3, MinIO, ...)"
        )
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or "AWS S3 (AWS_ENDPOINT_URL is unset)"
    warehouse = warehouse.rstrip("/")
    folder = f"{PROBE_FOLDER}/{uuid.uuid4().hex}"
    try:
        version = _race(f"{warehouse}/{folder}")
    except Exception as error:
        raise StoreConfigError(_unusable(warehouse, endpoint, "write", error)) from error
    finally:
        cleanup_error = _delete(warehouse, folder)
    if cleanup_error is not None:
        raise StoreConfigError(
            _unusable(warehouse, endpoint, "delete", cleanup_error)
        ) from cleanup_error
    if version < CONTENDERS:
        raise StoreConfigError(
            f"the object store at {endpoint} overwrote a Delta commit: {CONTENDERS} commits "
            f"raced for version 1 of a probe table under {warehouse} and all succeeded, but "
            f"its log holds {version}. It ignores conditional puts (If-None-Match), so "
            "concurrent commits would be lost silently; use a store that supports "
            "conditional writes (AWS S3, MinIO, ...)"
        )


def _race(table_uri: str) -> int:
    """Commits :data:`CONTENDERS` empty appends at once from handles at version 0 (each
    raises if delta-rs refuses it); returns the table's version after them."""
    DeltaTable.create(table_uri, _SCHEMA)
    handles = [DeltaTable(table_uri) for _ in range(CONTENDERS)]
    start = threading.Barrier(CONTENDERS)

    def commit(handle: DeltaTable) -> None:
        start.wait(timeout=60)
        handle.create_write_transaction([], "append", _SCHEMA)

    with ThreadPoolExecutor(CONTENDERS, thread_name_prefix="store-check") as pool:
        for attempt in [pool.submit(commit, handle) for handle in handles]:
            attempt.result()
    return DeltaTable(table_uri).version()


def _delete(warehouse: str, folder: str) -> Exception | None:
    """Delete the probe table; the error if that failed. delta-rs's store, not pyarrow's:
    pyarrow leaves an empty ``_probe/`` marker object where it deleted a folder."""
    try:
        DeltaStorageHandler(warehouse).delete_dir(folder)
    except Exception as error:
        return error
    return None


def _unusable(warehouse: str, endpoint: str, action: str, error: Exception) -> str:
    bucket = warehouse.removeprefix("s3://").split("/", 1)[0]
    cause = describe_store_error(error)
    return (
        f"cannot {action} a probe Delta table under the warehouse {warehouse} through the "
        f"object store at {endpoint} ({type(error).__name__}: {cause}); check that the "
        f"bucket {bucket!r} exists, that the endpoint is reachable (AWS_ENDPOINT_URL, "
        "AWS_ALLOW_HTTP for http) and that AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "may write there"
    )
