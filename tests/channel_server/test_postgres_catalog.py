"""The service on a catalog in PostgreSQL: channels, commits and resume tokens, SQL run
by the Spark worker and a dynamic table refreshed there, and two services on one
warehouse sharing the catalog (each with channels on the same table)."""

from __future__ import annotations

import threading

import pyarrow.compute as pc
from deltalake import DeltaTable

from catalog import open_catalog
from flush.tables import ROW_ID_COLUMN
from ingest_sdk import OpenChannelRequest


def _rows(uri):
    return DeltaTable(uri).to_pyarrow_dataset().to_table()


def _fill(client, channel_name, ids):
    channel = client.open_channel(OpenChannelRequest(channel_name, "DB", "S", "T"))
    for n in ids:
        channel.insert_rows([{"ID": n}], end_offset_token=str(n))
    channel.wait_for_commit(timeout=60)
    return channel


def test_a_service_keeps_its_channels_and_tokens_in_postgres(
    server_factory, client_factory, postgres_dsn
):
    server = server_factory(catalog=postgres_dsn)
    client = client_factory(server.url)
    info = client.create_table("db.s.t", {"ID": "INT NOT NULL"})
    _fill(client, "c", range(1, 4))
    assert not (server.config.warehouse / "catalog.sqlite").exists()  # nothing local
    catalog = open_catalog(postgres_dsn)
    try:
        table = catalog.get_table("DB", "S", "T")
        channel = catalog.get_channel(table.id, "c")
        assert (channel.offset_token, channel.rows_committed) == ("3", 3)
    finally:
        catalog.close()
    server.stop()
    again = server_factory(catalog=postgres_dsn)
    reopened = client_factory(again.url).open_channel(OpenChannelRequest("c", "DB", "S", "T"))
    assert reopened.get_latest_committed_offset_token() == "3"
    assert sorted(_rows(info["location"]).column("ID").to_pylist()) == [1, 2, 3]


def test_statements_and_refreshes_run_on_the_postgres_catalog(
    server_factory, client_factory, postgres_dsn
):
    """The Spark worker opens the same catalog (--catalog URL): a table made over SQL is
    the service's, and a dynamic table over it refreshes."""
    client = client_factory(server_factory(catalog=postgres_dsn).url)
    client.sql("CREATE TABLE db.s.src (id INT)")
    client.sql("INSERT INTO db.s.src VALUES (1), (2), (3)")
    client.sql("CREATE DYNAMIC TABLE db.s.big TARGET_LAG = '1 hour' AS "
               "SELECT id FROM db.s.src WHERE id > 1")  # fmt: skip
    client.sql("INSERT INTO db.s.src VALUES (4)")
    client.sql("ALTER DYNAMIC TABLE db.s.big REFRESH")
    assert client.sql("SELECT id FROM db.s.big ORDER BY id") == [
        {"ID": "2"}, {"ID": "3"}, {"ID": "4"}]  # fmt: skip
    assert [t["name"] for t in client.list_tables()] == ["DB.S.BIG", "DB.S.SRC"]


def test_two_services_on_one_warehouse_share_the_postgres_catalog(
    server_factory, client_factory, postgres_dsn, tmp_path
):
    warehouse = tmp_path / "shared"
    a = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    b = server_factory(catalog=postgres_dsn, warehouse=warehouse)
    on_a, on_b = client_factory(a.url), client_factory(b.url)
    info = on_a.create_table("db.s.t", {"ID": "INT NOT NULL"})
    assert on_b.describe_table("db.s.t")["location"] == info["location"]
    go = threading.Barrier(2)

    def fill(client, name, ids):
        go.wait()
        _fill(client, name, ids)

    threads = [threading.Thread(target=fill, args=(on_a, "from-a", range(0, 200))),
               threading.Thread(target=fill, args=(on_b, "from-b", range(1000, 1200)))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    rows = _rows(info["location"])
    assert sorted(rows.column("ID").to_pylist()) == [*range(0, 200), *range(1000, 1200)]
    assert pc.count_distinct(rows.column(ROW_ID_COLUMN)).as_py() == 400  # unique across both
    catalog = open_catalog(postgres_dsn)
    try:
        table = catalog.get_table("DB", "S", "T")
        channels = catalog.list_channels(table.id)
        tokens = {c.name: (c.offset_token, c.rows_committed) for c in channels}
        assert tokens == {"from-a": ("199", 200), "from-b": ("1199", 200)}
    finally:
        catalog.close()


def test_an_unreachable_catalog_is_one_line_without_the_password(tmp_path):
    import subprocess
    import sys

    from tests.servers import free_port

    url = f"postgresql://bob:s3cret@127.0.0.1:{free_port()}/nodb"
    done = subprocess.run(
        [sys.executable, "-m", "channel_server", "--port", "0", "--warehouse",
         str(tmp_path / "w"), "--catalog", url],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: cannot open the catalog in PostgreSQL (nodb on")
    assert "s3cret" not in done.stderr and "Traceback" not in done.stderr


def test_the_worker_gets_the_catalog_url_in_its_environment_not_its_command_line(
    server_factory, postgres_dsn
):
    from catalog import CATALOG_VARIABLE
    from pipelines.dynamic_tables.scheduler import SERVICE_ID_VARIABLE

    url = postgres_dsn.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    service = server_factory(catalog=url).service
    worker = service.worker
    assert not any("s3cret" in part or "postgresql:" in part for part in worker.command)
    assert worker.environment == {CATALOG_VARIABLE: url, SERVICE_ID_VARIABLE: service.id}
