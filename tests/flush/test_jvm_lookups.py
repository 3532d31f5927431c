"""Py4J's lookups of classes and static methods kept (flush/jvm_lookups.py): asked of the
JVM once, answered the same afterwards; a field's value, a name not found and a package
asked every time as before; the answers of queries unchanged."""

from __future__ import annotations

import pytest
from py4j.java_gateway import JavaClass, JavaMember, JavaPackage
from py4j.protocol import MEMORY_COMMAND_NAME, Py4JError

from flush import jvm_lookups


@pytest.fixture
def trips(spark, monkeypatch):
    """The commands sent to the JVM from here on (the Spark session's Py4J client), but
    the deletions of collected JVM objects, which Py4J's finalizer sends at any time."""
    client = spark.sparkContext._gateway._gateway_client
    sent: list[str] = []
    original = client.send_command

    def counting(command, *args, **kwargs):
        if not command.startswith(MEMORY_COMMAND_NAME):
            sent.append(command)
        return original(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", counting)
    return sent


def test_the_spark_session_installs_it(spark):
    assert jvm_lookups.installed()


def test_a_class_and_its_static_method_are_asked_once(spark, trips):
    jvm = spark._jvm
    first = jvm.functions.col("a")  # resolved now or by an earlier use
    trips.clear()
    second = jvm.functions.col("b")
    assert isinstance(jvm.functions, JavaClass)
    assert isinstance(jvm.functions.col, JavaMember)
    # Only the call itself reached the JVM, and it made the column asked for.
    assert len([c for c in trips if c.startswith("r")]) == 0, trips
    assert len(trips) == 1
    assert first.toString() == "a" and second.toString() == "b"


def test_a_field_value_is_read_every_time(spark, trips):
    jvm = spark._jvm
    assert jvm.Integer.MAX_VALUE == 2**31 - 1  # java.lang, by its short name
    trips.clear()
    assert jvm.Integer.MAX_VALUE == 2**31 - 1
    assert len(trips) == 1, trips  # the field's value asked again; its class was kept


def test_a_name_not_found_and_a_package_are_asked_every_time(spark, trips):
    """Py4J answers a name that is no class as a package (it may be one, or a class
    imported later): neither is kept."""
    jvm = spark._jvm
    for _ in range(2):
        assert isinstance(jvm.NoSuchClassAnywhere, JavaPackage)
        assert isinstance(jvm.org, JavaPackage)
    assert len([c for c in trips if "\nNoSuchClassAnywhere\n" in c]) == 2, trips
    assert len([c for c in trips if "\norg\n" in c]) == 2, trips
    with pytest.raises(Py4JError, match="noSuchMethod"):
        jvm.functions.noSuchMethod  # noqa: B018 (the lookup is the test)


def test_queries_answer_the_same_with_and_without_it(spark):
    from pyspark.sql import functions as F

    def answer():
        frame = spark.range(5).select(F.col("id"), (F.col("id") * 2).alias("twice"),
                                      F.lit("x").alias("tag"))  # fmt: skip
        return sorted(tuple(row) for row in frame.collect())

    kept = answer()
    jvm_lookups.uninstall()
    try:
        assert not jvm_lookups.installed()
        asked = answer()
    finally:
        jvm_lookups.install()
    assert kept == asked == [(i, 2 * i, "x") for i in range(5)]


def test_threads_building_columns_at_once_get_their_own_answers(spark):
    """Four threads build columns and run queries at once over the shared answers."""
    import threading

    from pyspark.sql import functions as F

    errors: list[str] = []

    def run(offset: int) -> None:
        try:
            for _ in range(10):
                value = F.col("id") + F.lit(offset)
                total = spark.range(5).select(value.alias("v")).agg(F.sum("v")).collect()
                assert total[0][0] == 10 + 5 * offset, (offset, total)
        except Exception as exc:  # reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
