"""S3 API servers for tests: moto's, on 127.0.0.1 at a port the OS chooses, started once per
test process with a fresh bucket per test; and :class:`IgnoringConditionalPuts`, a proxy
in front of it that drops ``If-None-Match`` and ``If-Match`` (a store that ignores
conditional puts, as some S3-compatible stores do).

Each server runs in a child process (``python tests/s3_server.py moto|proxy``), not in a
thread of the test process: some delta-rs calls hold the GIL while they wait on the store
(``DeltaTable.history()``, which ``flush.tables.commit_history`` uses, and
``deltalake.fs.DeltaStorageHandler.delete_dir``), so against a server in this interpreter
they wait out object_store's retries (a minute or more) and fail. A child exits when its
stdin reaches end-of-file: when :meth:`stop` closes it, or when the test process ends,
however it ends. Its state (buckets, objects) goes with it; its log goes to a temporary
file, shown only if it fails to start. It answers other processes too (a service started
by a test).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
#: Seconds from a child started to its port printed, at most (about a second for moto).
START_TIMEOUT = 60.0
#: Variables that would send the requests elsewhere or sign them otherwise, or that
#: :func:`flush.store_check.check_object_store` refuses: unset where :attr:`S3Store.env` is set.
CLEARED_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_S3_LOCKING_PROVIDER")
#: Request headers the proxy drops: the conditions of a conditional put.
CONDITIONS = frozenset({"if-none-match", "if-match"})
# Headers about one connection (and Content-Length, which aiohttp sets from the body):
# not forwarded as they came.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
     "transfer-encoding", "upgrade", "expect", "content-length"}
)  # fmt: skip
_PORT_LINE = "s3-test-server-port="


class S3Unavailable(Exception):
    """moto (``moto[server]``) or boto3 is not installed."""


@dataclass(frozen=True)
class S3Bucket:
    """A bucket of the test's own: ``uri`` is ``s3://<name>``; ``storage_options`` as
    delta-rs takes them."""

    name: str
    uri: str
    storage_options: dict[str, str]


class _Child:
    """One server of this module in a child process, until :meth:`stop`."""

    def __init__(self, *argv: str) -> None:
        self._argv = argv
        # Kept open while the child runs: its stderr.
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            # -P: this folder is not put on the child's sys.path (tests/flush would shadow flush).
            [sys.executable, "-P", os.path.abspath(__file__), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        try:
            self.port = self._read_port()
        except BaseException:
            self.stop()
            raise

    def _read_port(self) -> int:
        assert self._process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self._process.stdout], [], [], left)[0]:
                break
            line = self._process.stdout.readline().decode(errors="replace")
            if not line:
                break  # the child exited
            if line.startswith(_PORT_LINE):
                return int(line[len(_PORT_LINE) :])
        self._log.seek(0)
        log = self._log.read().decode(errors="replace")[-4000:]
        raise RuntimeError(f"the S3 test server {self._argv} did not start:\n{log}")

    def stop(self) -> None:
        """End the child (closing its stdin ends it) and wait for it. Idempotent."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._log.close()


class S3Store:
    """An S3 API endpoint: :attr:`endpoint_url`, and :attr:`env`, the AWS variables that
    point delta-rs, pyarrow and boto3 at it (:meth:`environ` sets them for a while)."""

    endpoint_url = ""

    @property
    def env(self) -> dict[str, str]:
        """The five AWS variables for this endpoint (a new dict each time)."""
        if not self.endpoint_url:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",
        }

    @property
    def storage_options(self) -> dict[str, str]:
        """delta-rs's storage options for this endpoint: :attr:`env`."""
        return self.env

    @contextlib.contextmanager
    def environ(self) -> Iterator[dict[str, str]]:
        """``with store.environ():`` :attr:`env` set in ``os.environ`` (and
        :data:`CLEARED_ENV` unset); the earlier values back after."""
        env = self.env
        earlier = {name: os.environ.get(name) for name in (*env, *CLEARED_ENV)}
        for name in CLEARED_ENV:
            os.environ.pop(name, None)
        os.environ.update(env)
        try:
            yield env
        finally:
            for name, value in earlier.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class S3Server(S3Store):
    """moto's server: ``start()``, then :attr:`endpoint_url`, :attr:`env`, :meth:`client`
    and :meth:`create_bucket`; ``stop()`` at the end. Also a context manager."""

    def __init__(self) -> None:
        self._child: _Child | None = None
        self._client: Any = None

    def start(self) -> S3Server:
        try:
            import boto3  # noqa: F401
            import moto.server  # noqa: F401
        except ImportError as error:
            raise S3Unavailable(
                f"moto[server] is not installed ({error}): pip install -e '.[test]'"
            ) from error
        self._child = _Child("moto")
        self.endpoint_url = f"http://127.0.0.1:{self._child.port}"
        return self

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

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys of a bucket's objects (under ``prefix``), sorted."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(entry["Key"] for page in pages for entry in page.get("Contents", []))

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
        if self._child is not None:
            self._child.stop()
            self._child = None
        self.endpoint_url = ""

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


class IgnoringConditionalPuts(S3Store):
    """A store that silently ignores conditional puts: a proxy in front of ``upstream`` that
    forwards every request as it came (method, path and query, body, headers: the SigV4
    signature stays as the client made it; moto does not check it) but without
    :data:`CONDITIONS`, and the answer's status, headers and body back. ``with
    IgnoringConditionalPuts(server) as store:``; buckets are made on ``upstream``."""

    def __init__(self, upstream: S3Server) -> None:
        self.upstream = upstream
        self._child: _Child | None = None

    def start(self) -> IgnoringConditionalPuts:
        self._child = _Child("proxy", self.upstream.endpoint_url)
        self.endpoint_url = f"http://127.0.0.1:{self._child.port}"
        return self

    def create_bucket(self) -> S3Bucket:
        """A new empty bucket on ``upstream``; its storage options point here."""
        bucket = self.upstream.create_bucket()
        return S3Bucket(bucket.name, bucket.uri, self.storage_options)

    def stop(self) -> None:
        if self._child is not None:
            self._child.stop()
            self._child = None
        self.endpoint_url = ""

    def __enter__(self) -> IgnoringConditionalPuts:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


# The children's side.


def _serve_moto() -> int:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    return int(server.get_host_and_port()[1])


def _serve_proxy(upstream: str) -> int:
    """The proxy's aiohttp server on a loop thread; returns its port."""
    import asyncio
    import threading

    import aiohttp
    from aiohttp import web
    from yarl import URL

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="proxy", daemon=True).start()
    session_key = web.AppKey("session", aiohttp.ClientSession)

    async def forward(request: web.Request) -> web.StreamResponse:
        dropped = _HOP_BY_HOP | CONDITIONS
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in dropped]
        body = await request.read()
        async with request.app[session_key].request(
            request.method,
            URL(upstream + request.raw_path, encoded=True),  # the path and query as sent
            headers=headers,
            data=body if body or request.content_length is not None else None,
            allow_redirects=False,
        ) as answer:
            payload = await answer.read()
            response = web.StreamResponse(status=answer.status, reason=answer.reason)
            for name, value in answer.headers.items():
                # Content-Length too: a HEAD's is the object's size, not the empty body's.
                if name.lower() not in _HOP_BY_HOP - {"content-length"}:
                    response.headers.add(name, value)
            await response.prepare(request)
            if payload:
                await response.write(payload)
            await response.write_eof()
            return response

    async def start() -> int:
        app = web.Application(client_max_size=1 << 31)
        # Forwarded as they are: no decompression, no headers of aiohttp's own.
        app[session_key] = aiohttp.ClientSession(
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        app.router.add_route("*", "/{path:.*}", forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return int(runner.addresses[0][1])

    return asyncio.run_coroutine_threadsafe(start(), loop).result()


def _serve(kind: str, *args: str) -> None:
    port = _serve_moto() if kind == "moto" else _serve_proxy(*args)
    print(f"{_PORT_LINE}{port}", flush=True)
    sys.stdin.buffer.read()  # until end-of-file: stop(), or the test process ended
    os._exit(0)


if __name__ == "__main__":
    _serve(*sys.argv[1:])
