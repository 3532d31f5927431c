"""flush.store_check against moto's S3 API: a store that honours conditional puts passes,
one that ignores them (a proxy dropping If-None-Match) is refused, and so are a locking
provider, a missing bucket and an unreachable endpoint; the probe leaves nothing behind."""

import re
import socket
import uuid

import pytest

from flush.store_check import PROBE_FOLDER, StoreConfigError, check_object_store
from tests.s3_server import IgnoringConditionalPuts


@pytest.fixture
def ignoring_store(s3_server):
    with IgnoringConditionalPuts(s3_server) as store:
        yield store


def test_a_local_warehouse_is_not_probed(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")  # only S3 warehouses care
    check_object_store(str(tmp_path / "warehouse"))
    check_object_store(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_moto_passes_and_the_probe_leaves_nothing_behind(s3_server, s3_bucket, s3_warehouse):
    s3_server.client().put_object(Bucket=s3_bucket.name, Key="warehouse/kept", Body=b"x")
    check_object_store(s3_warehouse)
    check_object_store(s3_warehouse + "/")
    assert s3_server.keys(s3_bucket.name) == ["warehouse/kept"]


def test_a_store_that_ignores_conditional_puts_is_refused(
    s3_server, s3_bucket, s3_warehouse, ignoring_store, monkeypatch
):
    for name, value in ignoring_store.env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(StoreConfigError) as refused:
        check_object_store(s3_warehouse)
    message = str(refused.value)
    assert f"the object store at {ignoring_store.endpoint_url} overwrote a Delta commit" in message
    assert re.search(r"4 commits raced for version 1 .* its log holds [0-3]\. ", message)
    assert "ignores conditional puts (If-None-Match)" in message
    assert "concurrent commits would be lost silently" in message
    assert "use a store that supports conditional writes (AWS S3, MinIO, ...)" in message
    assert s3_server.keys(s3_bucket.name, f"warehouse/{PROBE_FOLDER}") == []
    # The same warehouse straight on moto passes.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    check_object_store(s3_warehouse)


def test_a_locking_provider_is_refused_before_anything_is_written(
    s3_server, s3_bucket, s3_warehouse, monkeypatch
):
    monkeypatch.setenv("AWS_S3_LOCKING_PROVIDER", "dynamodb")
    with pytest.raises(StoreConfigError) as refused:
        check_object_store(s3_warehouse)
    message = str(refused.value)
    assert message.startswith(
        "delta-rs commits to S3 with conditional puts and ignores a locking provider: "
        "unset AWS_S3_LOCKING_PROVIDER (it is 'dynamodb')"
    )
    assert isinstance(refused.value, ValueError)
    assert s3_server.keys(s3_bucket.name) == []


def test_a_missing_bucket_is_refused_naming_it(s3_server, s3_warehouse):
    bucket = f"missing-{uuid.uuid4().hex}"
    with pytest.raises(StoreConfigError) as refused:
        check_object_store(f"s3://{bucket}/warehouse")
    message = str(refused.value)
    assert f"under the warehouse s3://{bucket}/warehouse" in message
    assert f"through the object store at {s3_server.endpoint_url}" in message
    assert f"check that the bucket '{bucket}' exists" in message
    assert "404" in message  # delta-rs's own words, on one line
    assert "\n" not in message and "\x1b" not in message
    assert isinstance(refused.value.__cause__, OSError)


def test_an_unreachable_endpoint_is_refused_naming_it(s3_warehouse, monkeypatch):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        endpoint = f"http://127.0.0.1:{unused.getsockname()[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        with pytest.raises(StoreConfigError) as refused:
            check_object_store(s3_warehouse)
    message = str(refused.value)
    assert f"under the warehouse {s3_warehouse} through the object store at {endpoint}" in message
    assert "that the endpoint is reachable (AWS_ENDPOINT_URL" in message
    assert isinstance(refused.value.__cause__, OSError)
