"""The service's Spark worker: one long-lived ``python -m pipelines.worker --serve``.

It compacts tables and runs SQL statements (``POST /v1/sql``) in one warm Spark. Each
request is one JSON line; each answer one frame (a JSON header line with the payload's
length in ``bytes``, then the payload), read in full before the next request is sent.

Compaction runs in a separate process so ingestion latency does not suffer (at a lower
CPU priority, ``CompactionTrigger.worker_nice``, so it cannot take the CPU flushes need),
and in one *long-lived* process so its Spark session (JVM, JIT-compiled code, Python
task workers) stays warm: a run in a warm session takes about a quarter of the
time of one in a fresh process (``make bench``). Tables take turns; the worker
is started on first use, restarted if it died, and stopped after a quiet spell so
an idle service does not hold a JVM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson

__all__ = ["SparkWorker", "SparkWorkerDied", "WorkerBusy"]

log = logging.getLogger(__name__)
#: The longest answer header line read from the worker (the rows follow it as raw bytes).
HEADER_LIMIT = 1 << 20


class SparkWorkerDied(RuntimeError):
    """The worker exited without answering (its log says why)."""


class WorkerBusy(RuntimeError):
    """A request waited its longest for its turn and was withdrawn, never sent."""


class SparkWorker:
    """Sends table names to the worker process, one at a time, and returns its answers.

    Args:
        command: the worker's command line (``python -m flush.compact --serve ...``).
        log_path: the worker's stderr (progress, Spark's log) is appended here.
        idle_seconds: the worker is stopped after this long without a request.
        on_death: called each time the worker died or was killed (not stopped when idle).
        environment: variables set for the worker beside the service's own.
    """

    def __init__(
        self,
        command: list[str],
        log_path: Path,
        idle_seconds: float,
        on_death: Callable[[], None] | None = None,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.command = command
        #: Variables set for the worker beside the service's own (e.g. the catalog's URL,
        #: which a command line would show to every user of the machine).
        self.environment = dict(environment or {})
        self.on_death = on_death
        #: While this answers True the worker is not stopped for being idle.
        self.keep_alive: Callable[[], bool] = lambda: False
        self.log_path = log_path
        self.idle_seconds = idle_seconds
        self.starts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._turn = asyncio.Lock()
        self._idle_stop: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        """The running worker's process id, if one is running."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    async def compact(self, table_name: str) -> dict[str, Any]:
        """Compact one table in the worker and return its run record.

        Raises:
            SparkWorkerDied: the worker exited before answering.
        """
        return await self.request({"table": table_name})

    async def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send one request and return the answer's header (see :meth:`exchange`)."""
        header, _ = await self.exchange(payload)
        return header

    async def exchange(
        self,
        payload: dict[str, Any],
        answer_within: float | None = None,
        queue_within: float | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        """Send one request; its answer frame: the header, and the payload bytes.

        A caller cancelled while the request waits its turn withdraws it. Once sent, the
        exchange goes on to its end even if the caller is cancelled: a client that hangs up
        must not leave the next request reading this one's answer.

        Args:
            payload: the request.
            answer_within: seconds the worker has to answer once the request is sent; past
                them it is killed (the request fails), and started afresh next time.
            queue_within: seconds the request may wait for its turn; past them it is
                withdrawn, never sent (:class:`WorkerBusy`).

        Raises:
            SparkWorkerDied: the worker exited (or was killed) before answering in full,
                or answered out of step (it is stopped, and started afresh next time).
            WorkerBusy: the request waited ``queue_within`` seconds and was not sent.
        """
        sent = asyncio.Event()
        task = asyncio.ensure_future(self._exchange(payload, answer_within, queue_within, sent))
        task.add_done_callback(_retrieve)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if not sent.is_set():
                task.cancel()
            raise

    async def _exchange(
        self,
        payload: dict[str, Any],
        answer_within: float | None,
        queue_within: float | None,
        sent: asyncio.Event,
    ) -> tuple[dict[str, Any], bytes]:
        if not await self._take_turn(queue_within):
            raise WorkerBusy(f"the worker stayed busy for {queue_within:g} s")
        try:
            return await self._send(payload, answer_within, sent)
        finally:
            self._turn.release()

    async def _take_turn(self, within: float | None) -> bool:
        """Acquire the turn within ``within`` seconds (``None``: however long). Never leaves
        it held when giving up or cancelled (``wait_for`` around ``Lock.acquire`` can)."""
        acquire = asyncio.ensure_future(self._turn.acquire())
        try:
            done, _ = await asyncio.wait({acquire}, timeout=within)
        except asyncio.CancelledError:
            self._give_up(acquire)
            raise
        if done:
            return True
        self._give_up(acquire)
        return False

    def _give_up(self, acquire: asyncio.Future[Any]) -> None:
        """Cancel an acquisition, or release the turn it got (now or as it completes)."""

        def release_if_taken(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and future.exception() is None:
                self._turn.release()

        if acquire.done():
            release_if_taken(acquire)
        else:
            acquire.add_done_callback(release_if_taken)
            acquire.cancel()

    async def _send(
        self, payload: dict[str, Any], answer_within: float | None, sent: asyncio.Event
    ) -> tuple[dict[str, Any], bytes]:
        self._cancel_idle_stop()
        process = await self._running_process()
        assert process.stdin is not None and process.stdout is not None
        sent.set()
        try:
            process.stdin.write(orjson.dumps(payload) + b"\n")
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), answer_within)
        except (BrokenPipeError, ConnectionResetError):
            line = b""
        except TimeoutError:
            await self.kill()
            raise SparkWorkerDied(
                f"the worker did not answer within {answer_within:g} s and was stopped"
            ) from None
        except ValueError:  # a header line over the limit: out of step
            await self.kill()
            raise SparkWorkerDied("the worker answered a header over the size limit") from None
        if not line:
            await self.kill()
            raise SparkWorkerDied(
                f"the Spark worker exited without answering (log {self.log_path}): "
                f"{self._log_tail()}"
            )
        try:
            answer: dict[str, Any] = orjson.loads(line)
            size = int(answer.get("bytes", 0))
            if size < 0:
                raise ValueError(size)
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            await self.kill()  # out of step with us: start afresh next time
            raise SparkWorkerDied(
                f"the Spark worker answered {line[:200]!r} (log {self.log_path})"
            ) from None
        try:
            body = await process.stdout.readexactly(size) if size else b""
        except asyncio.IncompleteReadError:
            await self.kill()
            raise SparkWorkerDied(
                f"the worker exited in the middle of an answer (log {self.log_path}): "
                f"{self._log_tail()}"
            ) from None
        self._idle_stop = asyncio.create_task(self._stop_when_idle())
        return answer, body

    async def stop(self) -> None:
        """Stop the worker: close its input and let it finish, or kill it."""
        self._cancel_idle_stop()
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), timeout=30)
        except TimeoutError:
            await _kill(process)

    async def _running_process(self) -> asyncio.subprocess.Process:
        process = self._process
        if process is not None and process.returncode is None:
            return process
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self._process = await asyncio.create_subprocess_exec(
                *self.command,
                env={**os.environ, **self.environment} if self.environment else None,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                limit=HEADER_LIMIT,
            )
        self.starts += 1
        log.info("Spark worker started (pid %d)", self._process.pid)
        return self._process

    async def _stop_when_idle(self) -> None:
        await asyncio.sleep(self.idle_seconds)
        # e.g. open SQL transactions live in the worker; in a thread: it may read the catalog
        while await asyncio.to_thread(self.keep_alive):
            await asyncio.sleep(self.idle_seconds)
        if not self._turn.locked():
            log.info("Spark worker idle for %.0fs: stopping it", self.idle_seconds)
            self._idle_stop = None  # stop() must not cancel this very task
            await self.stop()

    async def kill(self) -> None:
        """Kill the worker now (a request it is answering fails with
        :class:`SparkWorkerDied`); the next request starts a new one."""
        process, self._process = self._process, None
        if process is not None:
            await _kill(process)
            if self.on_death is not None:
                self.on_death()

    def _cancel_idle_stop(self) -> None:
        if self._idle_stop is not None:
            self._idle_stop.cancel()
            self._idle_stop = None

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_bytes()[-2000:].decode(errors="replace")
        except OSError:
            return "(no log)"


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark an exchange's failure as seen when its caller stopped waiting for it."""
    if not task.cancelled():
        task.exception()


async def _kill(process: asyncio.subprocess.Process) -> None:
    """Kill and reap a worker process and close its input (no transport left open)."""
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()
    if process.stdin is not None:
        process.stdin.close()
