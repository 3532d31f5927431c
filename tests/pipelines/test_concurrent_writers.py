"""SQL DML racing the service's own writers on one table.

The service ingests rows through channels (flush commits every ~100 ms), a SQL
session runs INSERT/UPDATE/DELETE on the same table, a child process runs another
session, and the compaction worker rewrites the files under both. Row ids come from
one sequence in the catalog; nothing may be lost, doubled or given the same row id.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from flush import ROW_ID_COLUMN, read_table
from ingest_sdk import OpenChannelRequest
from pipelines import TransactionConflictError

TABLE = "DB.PUBLIC.T"
COLUMNS = {"ID": "NUMBER(38,0)", "V": "VARCHAR(20)"}


def channel_request(name: str) -> OpenChannelRequest:
    return OpenChannelRequest(name, "DB", "PUBLIC", "T")


@dataclass
class Producer:
    """One channel inserting ``ids`` in small batches, token = the batch's last id."""

    client: object
    name: str
    ids: range
    batch: int = 50
    #: The batches are spread evenly over this many seconds.
    duration: float = 15.0
    error: BaseException | None = None
    thread: threading.Thread | None = None
    channel: object = None

    def start(self) -> Producer:
        self.channel = self.client.open_channel(channel_request(self.name))
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        firsts = range(self.ids.start, self.ids.stop, self.batch)
        started = time.monotonic()
        try:
            for index, first in enumerate(firsts):
                last = min(first + self.batch, self.ids.stop) - 1
                self.channel.insert_rows(
                    [{"ID": n, "V": "ingested"} for n in range(first, last + 1)],
                    end_offset_token=str(last),
                )
                due = started + self.duration * (index + 1) / len(firsts)
                time.sleep(max(0.0, due - time.monotonic()))
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def committed(self) -> int:
        """The highest id whose row is committed (-1: none yet)."""
        token = self.channel.get_latest_committed_offset_token()
        return -1 if token is None else int(token)

    def finish(self, timeout: float = 120) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.name} is stuck"
        if self.error is not None:
            raise self.error
        assert self.channel.wait_for_commit(timeout=timeout) == str(self.ids.stop - 1)


@dataclass
class SqlLog:
    """What the SQL side did, to compute the expected final state."""

    inserted: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    failed: Counter = field(default_factory=Counter)
    done: Counter = field(default_factory=Counter)
    seconds: Counter = field(default_factory=Counter)
    #: For the last UPDATE that succeeded: each producer's committed id before it began.
    committed_before_last_update: dict[str, int] = field(default_factory=dict)


def snapshot(uri: str) -> pa.Table:
    return read_table(uri, columns=["ID", "V", ROW_ID_COLUMN])


def check_unique_row_ids(table: pa.Table) -> None:
    counts = Counter(table.column(ROW_ID_COLUMN).to_pylist())
    doubled = {rid: n for rid, n in counts.items() if n > 1}
    assert not doubled, f"{len(doubled)} row ids appear more than once: {list(doubled)[:10]}"


def ids_of(table: pa.Table) -> Counter:
    return Counter(int(v) for v in table.column("ID").to_pylist())


def test_dml_while_channels_insert(server_factory, client_factory, session_factory):
    server = server_factory()
    client = client_factory(server.url, max_client_lag=0.15)
    info = client.create_table(TABLE, COLUMNS)
    session = session_factory(server.config.warehouse)
    session.sql("CREATE TABLE TGT(ID NUMBER(38,0), V VARCHAR(20))")
    session.sql("CREATE STREAM S ON TABLE T")

    per_channel, channels = 6_000, 3
    producers = [
        Producer(client, f"p{i}", range(i * per_channel, (i + 1) * per_channel)).start()
        for i in range(channels)
    ]
    log = SqlLog()
    started = time.monotonic()
    round_ = 0
    while any(p.thread.is_alive() for p in producers) and time.monotonic() - started < 60:
        round_ += 1
        new = [-(round_ * 10 + j) for j in range(1, 11)]
        values = ", ".join(f"({n}, 'sql')" for n in new)
        run(session, log, "insert", f"INSERT INTO T VALUES {values}", inserted=new)
        before = {p.name: p.committed() for p in producers}
        if run(session, log, "update", "UPDATE T SET V = 'updated' WHERE ID % 7 = 0"):
            log.committed_before_last_update = before
        if round_ > 1:  # half of the previous round's SQL rows
            low, high = -((round_ - 1) * 10 + 5), -((round_ - 1) * 10 + 1)
            gone = set(range(low, high + 1)) & log.inserted
            run(session, log, "delete", f"DELETE FROM T WHERE ID BETWEEN {low} AND {high}",
                deleted=gone)  # fmt: skip
    for producer in producers:
        producer.finish()

    print("rounds", round_, "done", dict(log.done), "failed", dict(log.failed),
          "seconds", dict(log.seconds), "took", time.monotonic() - started)
    assert log.done["insert"] >= 3 and log.done["update"] >= 3 and log.done["delete"] >= 2
    table = snapshot(info["location"])
    check_unique_row_ids(table)
    counts = ids_of(table)
    doubled = {n: c for n, c in counts.items() if c > 1}
    assert not doubled, f"ids present more than once: {sorted(doubled)[:20]}"
    ingested = set(range(channels * per_channel))
    expected = ingested | (log.inserted - log.deleted)
    assert set(counts) - expected == set(), "rows that should not be there"
    assert expected - set(counts) == set(), "rows lost"

    # Values: only UPDATE writes 'updated', only on ID % 7 = 0; and it reached every
    # such row that was committed before the last UPDATE began.
    values = dict(zip(table.column("ID").to_pylist(), table.column("V").to_pylist(), strict=True))
    values = {int(k): v for k, v in values.items()}
    wrong = [n for n, v in values.items() if n % 7 != 0 and v == "updated"]
    assert not wrong, f"rows updated that the WHERE does not match: {wrong[:10]}"
    originals = {n: ("sql" if n < 0 else "ingested") for n in values}
    wrong = [n for n, v in values.items() if v not in (originals[n], "updated")]
    assert not wrong, f"rows with a value nobody wrote: {wrong[:10]}"
    existed = set()
    for producer in producers:
        upto = log.committed_before_last_update.get(producer.name, -1)
        existed |= {n for n in producer.ids if n <= upto}
    missed = sorted(n for n in existed if n % 7 == 0 and values[n] != "updated")
    assert not missed, f"{len(missed)} rows the last UPDATE should have updated: {missed[:10]}"

    # The stream shows the net change since it was created: every row now in the table,
    # as an INSERT; consuming it copies exactly those rows.
    changes = session.sql(
        "SELECT ID, V, METADATA$ACTION, METADATA$ISUPDATE, METADATA$ROW_ID FROM S"
    ).toArrow()
    actions = Counter(zip(changes.column(2).to_pylist(), changes.column(3).to_pylist()))
    assert actions == Counter({("INSERT", False): table.num_rows}), actions
    seen = sorted(zip(changes.column(4).to_pylist(), changes.column(0).to_pylist(),
                      changes.column(1).to_pylist()))  # fmt: skip
    now = sorted(zip(table.column(ROW_ID_COLUMN).to_pylist(), table.column("ID").to_pylist(),
                     table.column("V").to_pylist()))  # fmt: skip
    assert seen == now, "the stream's rows differ from the table's"
    result = session.sql("INSERT INTO TGT SELECT ID, V FROM S").collect()
    assert result[0][0] == table.num_rows
    target = session.sql("SELECT ID, V FROM TGT").toArrow()
    assert sorted(zip(target.column(0).to_pylist(), target.column(1).to_pylist())) == sorted(
        zip(table.column("ID").to_pylist(), table.column("V").to_pylist())
    )
    assert session.sql("SELECT COUNT(*) FROM S").collect()[0][0] == 0  # consumed


def run(session, log: SqlLog, kind: str, text: str, inserted=(), deleted=()) -> bool:
    """Run one autocommit statement; a conflict that changed nothing is recorded."""
    began = time.monotonic()
    try:
        session.sql(text).collect()
    except TransactionConflictError:
        log.failed[kind] += 1
        return False
    finally:
        log.seconds[kind] += time.monotonic() - began
    log.done[kind] += 1
    log.inserted |= set(inserted)
    log.deleted |= set(deleted)
    return True
