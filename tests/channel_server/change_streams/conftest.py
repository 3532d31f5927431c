"""The change stream routes' tests (reads and listing) share a service with no partition
balancer and a session on its warehouse."""

from __future__ import annotations

import pytest

from pipelines import Session


@pytest.fixture
def server(server_factory):
    # No balancer: it would merge a test's idle partitions in the middle of its reads.
    return server_factory(change_stream_check_seconds=0)


@pytest.fixture
def session(server, spark):
    """A session on the service's warehouse (the tests' tables and change streams)."""
    made = Session(server.config.warehouse, spark=spark)
    yield made
    made.close()
