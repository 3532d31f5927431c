"""Fixtures for the pipeline layer: sessions on a fresh warehouse, on the shared Spark."""

import pytest

from pipelines import Session

# Helper modules the tests import: their asserts explain a failure as a test's do.
pytest.register_assert_rewrite("tests.pipelines.dynamic_tables.checks", "tests.pipelines.refusals")


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


#: A window, the query of the FULL dynamic table of :func:`windowed` (declared
#: ``REFRESH_MODE = FULL``: under AUTO the engine would refresh it incrementally).
WINDOW = "SELECT ID, V, count(*) OVER (PARTITION BY V) AS K FROM T"
#: The options that make a dynamic table of :data:`WINDOW` refresh FULL.
FULL_TABLE = "TARGET_LAG = '1 minute' REFRESH_MODE = FULL"


@pytest.fixture
def windowed(session):
    """A session with ``T (ID, V)`` of four rows and ``D``, the :data:`WINDOW` query over
    it as a dynamic table nothing follows."""
    session.sql("CREATE TABLE T (ID NUMBER, V VARCHAR)")
    session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'a'), (3, 'b'), (4, 'c')")
    session.sql(f"CREATE DYNAMIC TABLE D {FULL_TABLE} AS {WINDOW}")
    return session


@pytest.fixture
def watched(session):
    """Table ``T (ID NUMBER PRIMARY KEY, V VARCHAR)`` watched by change stream ``CS`` of
    one partition; the session and that partition's token."""
    session.sql("CREATE TABLE T (ID NUMBER PRIMARY KEY, V VARCHAR)")
    session.sql("CREATE CHANGE STREAM CS FOR T")
    stream = session.catalog.get_change_stream("DB", "PUBLIC", "CS")
    (partition,) = session.catalog.list_partitions(stream.uid)
    return session, partition.token
