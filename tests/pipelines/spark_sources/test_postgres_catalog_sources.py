"""The Spark data sources and ``python -m pipelines`` on a warehouse whose catalog is in
PostgreSQL: named by the option ``catalog`` or by ``$INGEST_CATALOG`` (as the service's
Spark worker finds it), checked without laying a catalog out, and refused by name where
none is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from catalog import CATALOG_VARIABLE, open_catalog
from flush.tables import ROW_ID_COLUMN, read_table
from pipelines import Session, SqlError
from pipelines.spark_sources.source_options import source_errors
from tests.pipelines.conftest import rows as rows_of
from tests.pipelines.test_cli import cli
from tests.servers import ROOT


@pytest.fixture
def warehouse(tmp_path, spark, postgres_dsn):
    """A warehouse folder whose catalog is in PostgreSQL, with a table T of three rows."""
    folder = tmp_path / "warehouse"
    with Session(folder, spark=spark, catalog=postgres_dsn) as session:
        session.sql("CREATE TABLE T (ID INT NOT NULL, NAME VARCHAR(10))")
        session.sql("INSERT INTO T VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    assert not (folder / "catalog.sqlite").exists()
    return folder


def changes(spark, folder: Path, **options: str):
    reader = spark.read.format("ingest-changes").option("warehouse", str(folder))
    for key, value in {"table": "T", "startingVersion": "0", **options}.items():
        reader = reader.option(key, value)
    with source_errors():
        return rows_of(reader.load(), "ID", "NAME", "_change_type")


def test_the_change_source_reads_the_postgres_catalog_named_by_the_option(
    spark, warehouse, postgres_dsn
):
    assert changes(spark, warehouse, catalog=postgres_dsn) == [
        (1, "a", "insert"), (2, "b", "insert"), (3, "c", "insert"),
    ]  # fmt: skip


def test_the_change_source_finds_the_catalog_in_the_environment_spark_started_with(
    warehouse, postgres_dsn
):
    """Spark runs a data source in Python workers that inherit the environment of the
    process that started Spark (the service's worker gets ``INGEST_CATALOG`` so): a child
    process, as the shared session here started long ago."""
    code = (
        "import os, sys\n"
        "from flush.spark_tables import spark_session\n"
        "from pipelines.spark_sources.source_options import source_errors\n"
        "from pipelines import register_data_sources\n"
        "spark = spark_session('local[1]', app_name='catalog-from-environment')\n"
        "register_data_sources(spark)\n"
        "with source_errors():\n"
        f"    frame = spark.read.format('ingest-changes').option('warehouse', {str(warehouse)!r})"
        ".option('table', 'T').option('startingVersion', '0').load()\n"
        "    print(sorted(int(row.ID) for row in frame.collect()), flush=True)\n"
        "os._exit(0)\n"  # no JVM shutdown to wait for
    )
    env = {**os.environ, CATALOG_VARIABLE: postgres_dsn, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600, check=False)  # fmt: skip
    failure = [line for line in done.stderr.splitlines() if "Error" in line][:5]
    assert done.returncode == 0, failure or done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[1, 2, 3]"


def test_without_the_catalog_the_folder_is_refused_naming_the_option(
    spark, warehouse, monkeypatch
):
    monkeypatch.delenv(CATALOG_VARIABLE, raising=False)
    with pytest.raises(SqlError, match=r"no catalog\.sqlite.*option catalog \(or INGEST_CATALOG"):
        changes(spark, warehouse)


def test_a_database_without_a_catalog_is_refused_and_left_empty(
    spark, warehouse, postgres_server
):
    empty = postgres_server.create_database()
    try:
        with pytest.raises(SqlError, match="holds no catalog; set the option catalog"):
            changes(spark, warehouse, catalog=empty)
        import psycopg

        with psycopg.connect(empty) as connection:
            (count,) = connection.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone()
        assert count == 0  # the check laid nothing out
    finally:
        postgres_server.drop_database(empty)


def test_the_sink_appends_with_row_ids_from_the_postgres_catalog(
    spark, warehouse, postgres_dsn
):
    frame = spark.createDataFrame([(10, "x"), (11, "y")], "ID INT, NAME STRING")
    writer = frame.write.format("ingest").mode("append")
    with source_errors():
        writer.option("warehouse", str(warehouse)).option("catalog", postgres_dsn).option(
            "table", "T"
        ).save()
    catalog = open_catalog(postgres_dsn)
    try:
        info = catalog.get_table("DB", "PUBLIC", "T")
    finally:
        catalog.close()
    found = read_table(info.uri).select(["ID", ROW_ID_COLUMN]).to_pylist()
    assert sorted(row["ID"] for row in found) == [1, 2, 3, 10, 11]
    ids = [row[ROW_ID_COLUMN] for row in found]
    assert len(set(ids)) == 5  # reserved in the catalog: unique
    assert info.next_row_id > max(ids)


def test_the_command_line_runs_statements_on_the_postgres_catalog(warehouse, postgres_dsn):
    done = cli("--warehouse", str(warehouse), "--catalog", postgres_dsn, "--format", "json",
               "sql", "SELECT count(*) AS N FROM T")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"N": 3' in done.stdout.replace('"N":3', '"N": 3')
    missing = cli("--warehouse", str(warehouse), "sql", "SELECT 1")
    assert missing.returncode == 2
    assert "holds no warehouse (no catalog.sqlite)" in missing.stderr


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("/etc/passwd", "/etc/passwd holds no catalog; set the option catalog"),
        ("", "is not a warehouse (no catalog.sqlite)"),
        ("postgresql://someone:s3cret@127.0.0.1:1/nowhere",
         "cannot open the catalog in PostgreSQL (nowhere on 127.0.0.1:1 as someone)"),
    ],
)  # fmt: skip
def test_a_catalog_option_that_names_no_catalog_is_refused_without_its_password(
    spark, warehouse, given, expected, monkeypatch
):
    monkeypatch.delenv(CATALOG_VARIABLE, raising=False)
    before = sorted(str(p) for p in warehouse.rglob("*"))
    with pytest.raises(SqlError) as refused:
        changes(spark, warehouse, catalog=given)
    assert expected in str(refused.value)
    assert "s3cret" not in str(refused.value)
    assert sorted(str(p) for p in warehouse.rglob("*")) == before  # no catalog made
