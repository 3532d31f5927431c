"""Fixtures shared by the whole suite: one Spark session, real servers, real clients."""

import contextlib
import os

import pytest

# Every JVM the suite starts (its Spark sessions, and those of the services, workers,
# killed children and docs blocks it runs, which inherit the environment) compiles with
# C1 only and collects with the serial GC. They live for seconds to minutes on small
# data, so the optimizing compiler's threads only compete with the tests for the two
# cores: a module of killed children ran in 141 s instead of 205 s, a module of Spark
# statements in 53 s instead of 61 s; measured again on 2026-12-03 over seven Spark-heavy
# files in two processes (each about 5 minutes on one shared session): 656 worker-seconds
# with C1 only, 746 with the default tiered compilers. (Three processes instead of two
# took 387 s against 341 s: the two cores are the limit.) The service itself and
# `make bench` keep the JVM's defaults, under which Spark's work on large data runs about
# twice as fast. (SPARK_SUBMIT_OPTS reaches the driver JVM without the notice that
# JAVA_TOOL_OPTIONS prints on every start.)
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
# The services' Spark workers run at the service's own priority here (their default is
# niceness 10, behind the flushes): the suite's two processes share two cores, and a niced
# worker would wait for the other process's Spark session, not for a flush. The worker's
# niceness itself is tested with an explicit CompactionTrigger(worker_nice=...).
os.environ.setdefault("INGEST_SPARK_WORKER_NICE", "0")

#: The longest files, longest first: ``make test`` runs files in two processes, each
#: taking the next file as it finishes one, so a long file started last would run alone
#: at the end (pytest-xdist would order files by their number of tests).
LONG_FILES = (
    "tests/pipelines/sql/test_statement_fidelity.py",
    "tests/bench/test_smoke.py",
    "tests/channel_server/test_sql_security.py",
    "tests/pipelines/streams/test_view_stream_attacks.py",
    "tests/pipelines/dynamic_tables/test_algebraic_attack.py",
    "tests/pipelines/spark_sources/test_spark_sources.py",
    "tests/test_docs.py",
    "tests/pipelines/dynamic_tables/test_kill.py",
    "tests/pipelines/dynamic_tables/test_engine_attack.py",
    "tests/pipelines/dynamic_tables/test_subqueries_attack.py",
    "tests/pipelines/dynamic_tables/test_algebraic_extremes.py",
    "tests/examples/test_kafka_bridge.py",
    "tests/pipelines/dynamic_tables/test_engine_kept_attacks.py",
    "tests/pipelines/dynamic_tables/test_engine_property.py",
    "tests/pipelines/dynamic_tables/test_rewrite_end_to_end.py",
    "tests/pipelines/dynamic_tables/test_property.py",
    "tests/pipelines/dynamic_tables/test_engine_existence.py",
    "tests/pipelines/dynamic_tables/test_engine_subqueries.py",
    "tests/pipelines/streams/test_view_streams.py",
    "tests/pipelines/dynamic_tables/test_row_maps_attack.py",
    "tests/pipelines/transactions/test_concurrent_writers.py",
    "tests/pipelines/dynamic_tables/test_engine_bag_sets.py",
    "tests/pipelines/dynamic_tables/test_engine_pruning.py",
    "tests/pipelines/sql/test_plan_guard.py",
    "tests/pipelines/spark_sources/test_sink_crash.py",
    "tests/channel_server/test_compaction_service.py",
    "tests/pipelines/dynamic_tables/test_algebraic.py",
    "tests/channel_server/test_dynamic_table_service.py",
    "tests/pipelines/dynamic_tables/test_engine_row_maps.py",
    "tests/pipelines/sql/test_statement_text.py",
    "tests/pipelines/transactions/test_multi_table_kill.py",
    "tests/pipelines/dynamic_tables/test_refresh_exactly_once.py",
    "tests/pipelines/dynamic_tables/test_moved_source.py",
    "tests/pipelines/dynamic_tables/test_extremes_moved_source.py",
    "tests/pipelines/dynamic_tables/test_extremes_attack.py",
    "tests/pipelines/change_streams/test_transaction_attack.py",
    "tests/pipelines/transactions/test_multi_table_commit.py",
    "tests/pipelines/dynamic_tables/test_overwrite_concurrency.py",
    "tests/channel_server/test_fuzz_http.py",
    "tests/pipelines/dynamic_tables/test_adaptive_attacks.py",
)


def pytest_configure(config):
    """Before the test processes start (they inherit the environment): every JVM of the
    run maps one class-data archive of Spark's classes (:mod:`tests.jvm_archive`)."""
    if hasattr(config, "workerinput") or "SharedArchiveFile" in os.environ["SPARK_SUBMIT_OPTS"]:
        return
    from pathlib import Path

    from tests.jvm_archive import class_archive

    archive = class_archive(Path(__file__).parent.parent, os.environ["SPARK_SUBMIT_OPTS"])
    if archive is not None:
        # A JVM of another class path ignores the archive; it says so on stdout unless told not to.
        os.environ["SPARK_SUBMIT_OPTS"] += (f" -XX:SharedArchiveFile={archive}"
                                            " -Xlog:cds=off -Xlog:cds+dynamic=off")


def _rank(path: str) -> int:
    return LONG_FILES.index(path) if path in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(session, config, items):
    """The files of :data:`LONG_FILES` first, in that order; the rest as collected."""
    items.sort(key=lambda item: _rank(item.nodeid.split("::")[0]))


def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadfile``: files handed out in :data:`LONG_FILES` order after the
    first ones (xdist starts each process with the files of the most tests)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongFilesFirst(LoadFileScheduling):
        def schedule(self) -> None:
            super().schedule()
            queued = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))
            self.workqueue.clear()
            self.workqueue.update(queued)

    return LongFilesFirst(config, log)


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


def _server_unavailable(reason: str):
    """A server this machine cannot run: the test is skipped, but fails in CI (``CI=true``),
    where .ci/run installs what the servers need and a skip would hide a missing install."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL cluster for this test process (:mod:`tests.postgres_server`)."""
    from tests.postgres_server import PostgresServer, PostgresUnavailable

    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as error:
        _server_unavailable(str(error))
    yield server
    server.stop()


@pytest.fixture
def postgres_dsn(postgres_server):
    """The DSN of a fresh empty database of the test's own, dropped after it."""
    dsn = postgres_server.create_database()
    yield dsn
    postgres_server.drop_database(dsn)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 API server for this test process (:mod:`tests.s3_server`)."""
    from tests.s3_server import S3Server, S3Unavailable

    server = S3Server()
    try:
        server.start()
    except S3Unavailable as error:
        _server_unavailable(str(error))
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh empty bucket of the test's own (``.uri`` is ``s3://<name>``,
    ``.storage_options`` delta-rs's), deleted with its objects after the test."""
    bucket = s3_server.create_bucket()
    yield bucket
    s3_server.delete_bucket(bucket.name)


@pytest.fixture
def s3_warehouse(s3_server, s3_bucket, monkeypatch):
    """``s3://<a fresh bucket>/warehouse``, with the AWS variables that point delta-rs,
    pyarrow and boto3 at the moto server set during the test (``s3_server.env``; those of
    ``tests.s3_server.CLEARED_ENV`` unset)."""
    from tests.s3_server import CLEARED_ENV

    for name in CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return f"{s3_bucket.uri}/warehouse"


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """The seconds each of the costliest files took (setup, calls and teardown), printed
    last: a CI log keeps its tail, where pytest's own ``--durations`` list is cut off."""
    seconds: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(getattr(report, "duration", None), float) and hasattr(report, "when"):
                path = report.nodeid.split("::")[0]
                seconds[path] = seconds.get(path, 0.0) + report.duration
    if not seconds:
        return
    costliest = sorted(seconds.items(), key=lambda item: -item[1])[:15]
    total = sum(seconds.values())
    terminalreporter.write_sep("-", f"worker-seconds: {total:.0f} in all; the costliest files")
    for path, spent in costliest:
        terminalreporter.write_line(f"{spent:8.0f}  {path}")
