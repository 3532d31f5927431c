"""Fixtures for the pipeline layer: sessions on a fresh warehouse, on the shared Spark."""

import pytest

from pipelines import Session


@pytest.fixture
def session_factory(tmp_path, spark):
    """``session_factory(warehouse=None, **kwargs)``: a Session on the shared Spark session;
    by default on this test's own warehouse folder. Closed at the end of the test."""
    made = []

    def make(warehouse=None, **kwargs):
        session = Session(warehouse or tmp_path / "warehouse", spark=spark, **kwargs)
        made.append(session)
        return session

    yield make
    for session in made:
        session.close()


@pytest.fixture
def session(session_factory):
    return session_factory()


def rows(frame, *columns):
    """A DataFrame's rows as sorted tuples (of ``columns``, default all), for comparisons."""
    picked = frame.select(*columns) if columns else frame
    return sorted(tuple(row) for row in picked.collect())
