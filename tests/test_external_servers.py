"""The suite's external servers work: a throwaway PostgreSQL cluster with a fresh database
per test, and moto's S3 API with a fresh bucket per test, on which delta-rs writes and
reads tables and a conditional put of an existing key is refused (what Delta commits
on S3 rely on)."""

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

# psycopg and botocore are imported in the tests: without them the fixtures skip the tests
# (or fail them in CI) with the reason, where an import here would stop the collection.

#: The databases of the earlier runs of test_each_test_gets_a_fresh_database.
_seen_databases: list[str] = []


def test_postgres_compare_and_swap(postgres_dsn):
    from psycopg import connect

    with connect(postgres_dsn, autocommit=True) as first, connect(postgres_dsn) as second:
        first.execute("CREATE TABLE cell (k int PRIMARY KEY, v bigint NOT NULL)")
        first.execute("INSERT INTO cell VALUES (1, 10)")
        swap = "UPDATE cell SET v = %s WHERE k = 1 AND v = %s RETURNING v"
        # Both read 10; the first swap wins, the second (expecting 10) changes nothing.
        assert second.execute("SELECT v FROM cell WHERE k = 1").fetchall() == [(10,)]
        second.commit()
        assert first.execute(swap, (11, 10)).fetchall() == [(11,)]
        assert second.execute(swap, (12, 10)).fetchall() == []
        second.commit()
        assert second.execute(swap, (12, 11)).fetchall() == [(12,)]
        second.commit()
        assert first.execute("SELECT v FROM cell").fetchall() == [(12,)]


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_gets_a_fresh_database(postgres_server, postgres_dsn, run):
    from psycopg import connect

    with connect(postgres_dsn, autocommit=True) as connection:
        (name,) = connection.execute("SELECT current_database()").fetchone()
        assert name.startswith("t_")
        # Empty, though the earlier run made this table in its own database.
        assert connection.execute("SELECT to_regclass('marker')").fetchone() == (None,)
        connection.execute("CREATE TABLE marker (run int)")
    with connect(postgres_server.dsn) as admin:
        existing = {row[0] for row in admin.execute("SELECT datname FROM pg_database")}
    assert name in existing
    assert not existing & set(_seen_databases)  # the earlier runs' were dropped
    assert name not in _seen_databases
    _seen_databases.append(name)


def test_deltalake_writes_and_reads_a_table_on_s3(s3_server, s3_bucket):
    client = s3_server.client()
    assert client.list_objects_v2(Bucket=s3_bucket.name)["KeyCount"] == 0
    uri, options = f"{s3_bucket.uri}/t", s3_bucket.storage_options
    write_deltalake(uri, pa.table({"id": [1, 2], "s": ["a", "b"]}), storage_options=options)
    write_deltalake(uri, pa.table({"id": [3], "s": ["c"]}), storage_options=options, mode="append")

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    # Not to_pyarrow_table(): after it this interpreter may abort at exit (134).
    rows = table.to_pyarrow_dataset().to_table().sort_by("id").to_pylist()
    assert rows == [{"id": 1, "s": "a"}, {"id": 2, "s": "b"}, {"id": 3, "s": "c"}]
    keys = {entry["Key"] for entry in client.list_objects_v2(Bucket=s3_bucket.name)["Contents"]}
    assert {f"t/_delta_log/{version:020}.json" for version in (0, 1)} <= keys


def test_a_conditional_put_of_an_existing_key_is_refused(s3_server, s3_bucket):
    from botocore.exceptions import ClientError

    client = s3_server.client()
    client.put_object(Bucket=s3_bucket.name, Key="probe", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as refused:
        client.put_object(Bucket=s3_bucket.name, Key="probe", Body=b"second", IfNoneMatch="*")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
    assert client.get_object(Bucket=s3_bucket.name, Key="probe")["Body"].read() == b"first"


def test_the_cluster_folder_is_made_where_its_user_can_reach_it(tmp_path, monkeypatch):
    """As root the cluster runs as ``postgres``, which cannot enter a ``TMPDIR`` of root's
    mode 0700 (tests/bench/test_smoke.py gives each benchmark one): the folder goes in
    /tmp then. Otherwise, and without a user to run as, in ``TMPDIR``."""
    import pwd
    import tempfile

    from tests.postgres_server import cluster_parent

    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    # Neither the owner nor in the group of any folder here.
    stranger = pwd.struct_passwd(("stranger", "x", 2**31 - 7, 2**31 - 7, "", "/", "/bin/sh"))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    assert cluster_parent(None) == str(private)
    assert cluster_parent(stranger) == "/tmp"
    monkeypatch.setattr(tempfile, "tempdir", "/")  # anyone may enter it: kept
    assert cluster_parent(stranger) == "/"
