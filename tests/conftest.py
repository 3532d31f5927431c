"""Fixtures shared by the whole suite: one Spark session for every test that needs it."""

import pytest


@pytest.fixture(scope="session")
def spark():
    from flush.spark_tables import spark_session

    session = spark_session("local[2]", app_name="streaming-ingest-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
