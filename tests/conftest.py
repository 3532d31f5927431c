"""Fixtures shared by the whole suite: one Spark session, real servers, real clients."""

import contextlib

import pytest

#: The longest files, longest first: ``make test`` runs files in two processes, taking
#: the next file as one finishes, so a long file started last would run alone at the end.
LONG_FILES = (
    "tests/test_docs.py",
    "tests/pipelines/test_dynamic_table_adversarial.py",
    "tests/pipelines/test_multi_table_kill.py",
    "tests/channel_server/test_dynamic_table_service.py",
    "tests/pipelines/test_concurrent_writers.py",
    "tests/pipelines/test_consumption_crash.py",
    "tests/pipelines/test_dynamic_table_kill.py",
    "tests/pipelines/test_sink_crash.py",
    "tests/channel_server/test_fuzz_http.py",
    "tests/examples/test_kafka_bridge.py",
    "tests/channel_server/test_sql_security.py",
    "tests/pipelines/test_dynamic_table_property.py",
)


def pytest_collection_modifyitems(session, config, items):
    """The files of :data:`LONG_FILES` first, in that order; the rest as collected."""
    rank = {path: index for index, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


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
