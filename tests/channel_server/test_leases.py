"""Two services on one warehouse: the steps one of them must run alone (partition
balancing, channel retention) run on the service holding their lease, and move to the
other when it stops."""

from __future__ import annotations

import time

from catalog import open_catalog
from channel_server.schedules import BALANCER_LEASE, RETENTION_LEASE


def _holder(catalog, lease, deadline_s=30.0, other_than=None):
    """The lease's holder once one holds it (other than ``other_than``)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = catalog.lease_holder(lease)
        if found is not None and found[0] != other_than and found[1] > time.time():
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no holder of {lease} after {deadline_s} s: {catalog.lease_holder(lease)}")


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
