"""An S3 API server for tests: moto's, on 127.0.0.1 at a port the OS chooses, in a thread
of the test process, started once; a fresh bucket per test.

Its state (buckets, objects) is in this process's memory and goes with it. It answers
other processes too (a service started by a test), while this process runs.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


class S3Unavailable(Exception):
    """moto (``moto[server]``) or boto3 is not installed."""


@dataclass(frozen=True)
class S3Bucket:
    """A bucket of the test's own: ``uri`` is ``s3://<name>``; ``storage_options`` as
    delta-rs takes them."""

    name: str
    uri: str
    storage_options: dict[str, str]


class S3Server:
    """``start()``, then :attr:`endpoint_url`, :attr:`storage_options`, :meth:`client` and
    :meth:`create_bucket`; ``stop()`` at the end. Also a context manager."""

    def __init__(self) -> None:
        self._server: Any = None
        self._client: Any = None
        self.endpoint_url = ""

    def start(self) -> S3Server:
        try:
            import boto3  # noqa: F401
            from moto.server import ThreadedMotoServer
        except ImportError as error:
            raise S3Unavailable(
                f"moto[server] is not installed ({error}): pip install -e '.[test]'"
            ) from error
        # werkzeug logs every request at INFO on stderr; its errors still show.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        return self

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for this server (a new dict each time)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    def client(self) -> Any:
        """A boto3 S3 client of this server (one, made on first use)."""
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3",
                endpoint_url=self.endpoint_url,
                aws_access_key_id=ACCESS_KEY,
                aws_secret_access_key=SECRET_KEY,
                region_name=REGION,
            )
        return self._client

    def create_bucket(self) -> S3Bucket:
        """A new empty bucket ``t-<uuid>``."""
        name = f"t-{uuid.uuid4().hex}"
        self.client().create_bucket(Bucket=name)
        return S3Bucket(name, f"s3://{name}", self.storage_options)

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket and all its objects (and versions); a missing bucket is fine."""
        client = self.client()
        try:
            for page in client.get_paginator("list_object_versions").paginate(Bucket=name):
                objects = [
                    {"Key": entry["Key"], "VersionId": entry["VersionId"]}
                    for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
                ]
                if objects:
                    client.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
            for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=name):
                for upload in page.get("Uploads", []):
                    client.abort_multipart_upload(
                        Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"]
                    )
            client.delete_bucket(Bucket=name)
        except client.exceptions.NoSuchBucket:
            pass

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()
