"""Two services on one warehouse: the steps one of them must run alone (partition
balancing, channel retention, the dynamic tables' scheduler) run on the service holding
their lease, and move to the other when it stops."""

from __future__ import annotations

import time

from catalog import open_catalog
from channel_server.schedules import BALANCER_LEASE, RETENTION_LEASE
from ingest_sdk import StreamingIngestClient
from pipelines.dynamic_tables.scheduler import SCHEDULER_LEASE


def _holder(catalog, lease, deadline_s=30.0, other_than=None):
    """The lease's holder once one holds it (other than ``other_than``)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = catalog.lease_holder(lease)
        if found is not None and found[0] != other_than and found[1] > time.time():
            return found[0]
        time.sleep(0.02)
    raise AssertionError(
        f"no holder of {lease} after {deadline_s} s: {catalog.lease_holder(lease)}"
    )


def _renewed_twice(catalog, lease, holder):
    """Wait until ``holder`` renewed ``lease`` twice from now (it holds it throughout)."""
    seen = [catalog.lease_holder(lease)]
    deadline = time.monotonic() + 30
    while len(seen) < 3 and time.monotonic() < deadline:
        now = catalog.lease_holder(lease)
        assert now[0] == holder, f"{lease} went to {now[0]} while {holder} held it"
        if now[1] > seen[-1][1]:
            seen.append(now)
        time.sleep(0.01)
    assert len(seen) == 3, f"{lease} was not renewed: {seen}"


def test_one_service_runs_the_shared_steps_and_the_other_takes_over(server_factory, tmp_path):
    warehouse = tmp_path / "shared"
    quick = {"warehouse": warehouse, "change_stream_check_seconds": 0.05,
             "retention_check_seconds": 0.05}  # fmt: skip
    first = server_factory(**quick)
    catalog = open_catalog(warehouse / "catalog.sqlite")
    try:
        assert _holder(catalog, BALANCER_LEASE) == first.service.id
        assert _holder(catalog, RETENTION_LEASE) == first.service.id
        second = server_factory(**quick)
        for lease in (BALANCER_LEASE, RETENTION_LEASE):  # renewed by the first, twice, while
            _renewed_twice(catalog, lease, first.service.id)  # the second tries alike
        first.stop()  # gives its leases up
        assert _holder(catalog, BALANCER_LEASE, other_than=first.service.id) == second.service.id
        assert _holder(catalog, RETENTION_LEASE, other_than=first.service.id) == second.service.id
    finally:
        catalog.close()


def test_one_service_schedules_the_refreshes_and_the_other_takes_over(server_factory, tmp_path):
    """Dynamic tables on a schedule: only the service holding the scheduler's lease runs
    a worker for them; the other starts one, and refreshes, once the first stops."""
    warehouse = tmp_path / "shared"
    first = server_factory(warehouse=warehouse)
    with StreamingIngestClient("scheduler-lease", first.url) as client:
        client.sql("CREATE TABLE SRC (ID NUMBER)")
        client.sql("CREATE DYNAMIC TABLE DT TARGET_LAG = '1 second' AS SELECT ID FROM SRC")
    catalog = open_catalog(warehouse / "catalog.sqlite")
    try:
        assert _holder(catalog, SCHEDULER_LEASE, 120) == first.service.id
        second = server_factory(warehouse=warehouse)
        _renewed_twice(catalog, SCHEDULER_LEASE, first.service.id)
        assert not second.service.schedules_refreshes
        assert second.service.worker.pid is None  # no Spark for a scheduler it is not
        first.stop()  # stops its worker, then gives the lease up
        handed_over = time.time()
        holder = _holder(catalog, SCHEDULER_LEASE, 60, other_than=first.service.id)
        assert holder == second.service.id
        deadline = time.monotonic() + 180  # the second's worker (a JVM) starts first
        while not any(r.trigger == "SCHEDULED" and r.started_at > handed_over
                      for r in catalog.list_refreshes()):  # fmt: skip
            assert time.monotonic() < deadline, "no scheduled refresh after the handover"
            time.sleep(0.5)
        assert second.service.worker.pid is not None
    finally:
        catalog.close()
