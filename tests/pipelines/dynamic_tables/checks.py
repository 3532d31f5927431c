"""What the dynamic-table tests compare and how they force an interleaving: a table
against its query run fresh (as a multiset: duplicates, NULLs, NaN and -0.0 count), the
refresh history against the table's log, its row ids, the table folders no table owns,
and ``once``, a hook that runs another client's statement at one point of a refresh.

A plain module the test files import (no fixtures)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
from deltalake import DeltaTable

from flush.change_commit import PIPELINE_METADATA_KEY
from flush.tables import ROW_ID_COLUMN
from pipelines import Session


def canon(value: object) -> object:
    """A value as compared here: NaN equal to NaN, -0.0 apart from 0.0, bytes as hex,
    whole numbers by value (a count is a bigint in a query, a NUMBER in a table)."""
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        return "#" + str(Decimal(value).normalize())
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else repr(value)
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    return value if value is None or isinstance(value, str) else repr(value)


def bag(session: Session, query: str) -> Counter:
    """A query's rows as a multiset (duplicates, NULLs, NaN and -0.0 count)."""
    return Counter(tuple(canon(v) for v in row) for row in session.sql(query).collect())


def assert_same_as_query(session: Session, name: str, query: str) -> None:
    content, fresh = bag(session, f"SELECT * FROM {name}"), bag(session, query)
    assert content == fresh, (
        f"{name} differs from its query: only in {name}: {list((content - fresh).items())[:5]}; "
        f"only in the query: {list((fresh - content).items())[:5]}"
    )


def refresh_commits(uri: str) -> list[int]:
    """The refresh (history row) ids in the table's log, oldest first."""
    entries = sorted(DeltaTable(uri).history(), key=lambda e: e["version"])
    return [orjson.loads(e[PIPELINE_METADATA_KEY])["dynamic_table"]["refresh"]
            for e in entries if PIPELINE_METADATA_KEY in e]  # fmt: skip


def row_ids(uri: str) -> list[int]:
    return DeltaTable(uri).to_pyarrow_table(columns=[ROW_ID_COLUMN]).column(0).to_pylist()


def assert_consistent(session: Session, name: str) -> None:
    """History and log agree: every SUCCEEDED refresh that wrote is in the log exactly
    once, the log holds no other refresh, no commit is pending, no claim is left, and
    the table's row ids are unique."""
    info = session.require_table(name)
    dt = session.catalog.get_dynamic_table(info.id)
    assert session.catalog.pending_commits() == []
    assert dt is not None and dt.claimed_by is None
    logged = refresh_commits(info.uri)
    assert len(logged) == len(set(logged)), f"a refresh was applied twice: {logged}"
    history = session.catalog.list_refreshes(info.id)
    wrote = {
        r.id for r in history if r.state == "SUCCEEDED" and r.action in ("FULL", "INCREMENTAL")
    }
    assert wrote == set(logged), (wrote, logged)
    assert not [r for r in history if r.state == "EXECUTING"]
    ids = row_ids(info.uri)
    assert len(ids) == len(set(ids)), "duplicate row ids in the dynamic table"


def history_rows(session: Session, name: str) -> list[tuple]:
    info = session.require_table(name)
    return [
        (r.trigger, r.state, r.action, r.reason) for r in session.catalog.list_refreshes(info.id)
    ]


def once(action):
    """A wrapper factory: the wrapped function runs ``action`` once, after its first
    call returned (the hook of a deterministic interleaving)."""

    def wrap(original):
        fired = []

        def hooked(*args, **kwargs):
            result = original(*args, **kwargs)
            if not fired:
                fired.append(True)
                action()
            return result

        return hooked

    return wrap


def folders(session: Session) -> set[str]:
    return {p.parent.name for p in Path(session.warehouse).rglob("_delta_log")}


def orphan_folders(session: Session) -> set[str]:
    """Table folders no table of the catalog owns."""
    owned = {Path(t.uri).name for t in session.catalog.list_tables()}
    return folders(session) - owned


def refresh_status(session: Session, name: str) -> str:
    """A manual refresh's status line (it names the action: INCREMENTAL, FULL, ...)."""
    return session.sql(f"ALTER DYNAMIC TABLE {name} REFRESH").collect()[0].status


def newest_refresh(session: Session, name: str):
    """The newest history row of ``name`` as the history function answers it."""
    return session.sql(
        "SELECT REFRESH_ACTION, STATE_CODE, STATE_MESSAGE FROM TABLE(DYNAMIC_TABLE_REFRESH_"
        f"HISTORY(NAME => '{name}', RESULT_LIMIT => 1))"
    ).collect()[0]


def refresh_modes(session: Session) -> dict[str, tuple[str, str]]:
    """Each dynamic table's mode and its reason, as SHOW DYNAMIC TABLES shows them."""
    shown = session.sql("SHOW DYNAMIC TABLES").collect()
    return {r.name: (r.refresh_mode, r.refresh_mode_reason) for r in shown}


def record_engine_refreshes(monkeypatch) -> list:
    """The Deltas of each incremental engine refresh from now on, as the refresh used
    them (``refresh_change._derived_incremental`` wrapped by ``monkeypatch``)."""
    import pipelines.dynamic_tables.refresh_change as refresh_change

    seen: list = []
    original = refresh_change._derived_incremental

    def recording(info, deltas, *rest):
        seen.append(deltas)
        return original(info, deltas, *rest)

    monkeypatch.setattr(refresh_change, "_derived_incremental", recording)
    return seen


def scanned(session: Session, deltas, table: str) -> bool:
    """Whether the plan of an engine refresh's net change reads any of the table's data
    files."""
    def local(path: str) -> str:
        return re.sub(r"^file:/*", "/", path)

    folder = local(session.require_table(table).uri).rstrip("/") + "/"
    return any(local(path).startswith(folder) for path in deltas.net().inputFiles())


def create_incremental(session: Session, tables: dict[str, str]) -> None:
    """One INCREMENTAL dynamic table (lag one hour: refreshed only when told) per name
    and query of ``tables``."""
    for name, query in tables.items():
        session.sql(f"CREATE DYNAMIC TABLE {name} TARGET_LAG = '1 hour' "
                    f"REFRESH_MODE = INCREMENTAL AS {query}")  # fmt: skip


def engine_warehouse(folder: Path, spark: Any, statements: list[str], tables: dict[str, str]) -> Session:
    """A session over a new warehouse in ``folder`` on ``spark``: ``statements`` run (the
    sources), then one INCREMENTAL dynamic table per name and query of ``tables``."""
    session = Session(folder / "warehouse", spark=spark)
    for statement in statements:
        session.sql(statement)
    create_incremental(session, tables)
    return session


def pruning_warehouse(
    folder: Path, spark: Any, statements: list[str], tables: dict[str, str]
) -> Iterator[Session]:  # fmt: skip
    """:func:`engine_warehouse`, yielded (closed after) with the engine's source-file
    pruning forced on for every source, however small (a module fixture's body)."""
    import pytest

    from pipelines.incremental import pruning

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pruning, "PRUNE_FROM_BYTES", 0)
        session = engine_warehouse(folder, spark, statements, tables)
        yield session
        session.close()
