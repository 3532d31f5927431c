"""Real channel servers for tests: in-process on a loop thread, or as a killable process."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from channel_server import ServerConfig, create_app
from channel_server.http_common import SERVICE
from channel_server.service import IngestService

ROOT = Path(__file__).resolve().parents[1]


class ThreadServer:
    """The service on 127.0.0.1, port chosen by the OS, in a private event loop thread."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.app = create_app(config)
        self._runner = web.AppRunner(self.app, access_log=None)
        self.run(self._start())

    async def _start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    @property
    def service(self) -> IngestService:
        return self.app[SERVICE]

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def call(self, function: Any, *args: Any) -> Any:
        """Run a plain function on the server's loop (service state is loop-owned)."""

        async def call() -> Any:
            return function(*args)

        return self.run(call())

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.run(self._runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


def table_folder(warehouse: Path, database: str, schema: str, name: str) -> str:
    """The folder of the one table of that name in a warehouse (folders end in a random id)."""
    (folder,) = (Path(warehouse) / database / schema).glob(f"{name}-*")
    return str(folder)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ProcessServer:
    """``python -m channel_server`` as a child process, restartable on the same port."""

    def __init__(self, warehouse: Path, *args: str, failpoints: str = "") -> None:
        self.warehouse = warehouse
        self.args = list(args)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.failpoints = failpoints
        self.process: subprocess.Popen[bytes] | None = None
        self.log = warehouse.parent / f"server-{self.port}.log"

    def start(self, failpoints: str | None = None) -> ProcessServer:
        self.kill()  # reap a previous process and close its pipe
        env = dict(
            os.environ, INGEST_FAILPOINTS=self.failpoints if failpoints is None else failpoints
        )
        env["PYTHONPATH"] = str(ROOT)
        with open(self.log, "ab") as log:  # the child keeps its own copy of the handle
            self.process = subprocess.Popen(
                [sys.executable, "-m", "channel_server", "--port", str(self.port),
                 "--warehouse", str(self.warehouse), "--no-auto-compaction", *self.args],
                stdout=subprocess.PIPE, stderr=log, env=env, cwd=ROOT,
            )  # fmt: skip
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 60)
        line = self.process.stdout.readline() if ready else b""
        if not line:
            self.kill()
            raise RuntimeError(f"server did not start; log: {self.log.read_text()[-2000:]}")
        assert orjson.loads(line)["event"] == "listening"
        return self

    def wait_killed(self, timeout: float = 60) -> int:
        """Wait for the process to die on its own (a kill failpoint); returns its status."""
        assert self.process is not None
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGKILL)
                self.process.wait(30)
            if self.process.stdout is not None:
                self.process.stdout.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
