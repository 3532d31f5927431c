"""Fixtures shared by the whole suite: one Spark session, real servers, real clients."""

import contextlib

import pytest


@pytest.fixture(scope="session")
def spark():
    from flush.spark_tables import spark_session

    session = spark_session("local[2]", app_name="streaming-ingest-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def server_factory(tmp_path):
    """Start real in-process servers: ``server_factory(**config_overrides)``."""
    from channel_server import CompactionTrigger, ServerConfig
    from tests.servers import ThreadServer

    started = []

    def start(**overrides):
        overrides.setdefault("warehouse", tmp_path / "warehouse")
        # Background compaction starts Spark processes; only its own tests turn it on.
        overrides.setdefault("compaction", CompactionTrigger(enabled=False))
        server = ThreadServer(ServerConfig(port=0, **overrides))
        started.append(server)
        return server

    yield start
    for server in started:
        with contextlib.suppress(Exception):
            server.stop()


@pytest.fixture
def server(server_factory):
    return server_factory()


@pytest.fixture
def process_server_factory(tmp_path):
    """Start ``python -m channel_server`` processes that tests may SIGKILL."""
    from tests.servers import ProcessServer

    started = []

    def start(*args, failpoints=""):
        server = ProcessServer(tmp_path / "warehouse", *args, failpoints=failpoints)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def client_factory():
    """Sync clients that are closed after the test."""
    from ingest_sdk import RetryPolicy, StreamingIngestClient

    made = []

    def make(url, **kwargs):
        kwargs.setdefault("max_client_lag", 0.1)
        kwargs.setdefault("retry", RetryPolicy(deadline=5))  # a stopped server fails fast
        client = StreamingIngestClient("test", url=url, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        with contextlib.suppress(Exception):
            client.close()
