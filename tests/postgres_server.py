"""A throwaway PostgreSQL cluster for tests: initdb in a temporary folder, a server on
127.0.0.1 at a free port, a fresh database per test, and everything gone at the end.

The server runs with no durability (``fsync``, ``synchronous_commit`` and
``full_page_writes`` off, :data:`NO_DURABILITY`): its data lives only as long as the test
process. ``bench/catalog.py`` starts one with PostgreSQL's durable defaults instead
(``settings``). initdb and postgres refuse to run as root, so as root they run as the
``postgres`` user through ``runuser``, and the cluster's folder is made where that user
can reach it (:func:`cluster_parent`). A watchdog (``sh``, in a session of its own) holds
the read end of a pipe whose write end only this process holds: when this process ends,
however it ends, even by SIGKILL, the watchdog reads end-of-file, stops the server and
removes the folder.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

#: Seconds from ``postgres`` started to its first accepted connection, at most (it takes
#: about a tenth of a second; a machine loaded far past its cores may take much longer).
START_TIMEOUT = 60.0

_BINARIES = ("initdb", "pg_ctl", "postgres")
#: The server's settings in the tests: nothing is made durable (the data dies with the test
#: process), so commits cost no fsync.
NO_DURABILITY = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}

# $0 is the folder, "$@" the command that stops the server. `cat` returns at end-of-file:
# when the test process has ended, or when stop() has already cleaned up and closes it.
_WATCHDOG = 'cat >/dev/null; "$@" >/dev/null 2>&1; rm -rf -- "$0"'


class PostgresUnavailable(Exception):
    """No PostgreSQL server can be started on this machine: its binaries, psycopg, or (as
    root) ``runuser`` or the ``postgres`` user are missing. Not raised for a server that
    is there but fails to start: that is an error."""


def find_bindir() -> Path:
    """The folder of ``initdb``, ``pg_ctl`` and ``postgres``: ``pg_config --bindir``
    (Debian's may name the client's version, without a server), then PATH, then the
    newest of ``/usr/lib/postgresql/*/bin`` (Debian's packages put no server on PATH)."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            bindir = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True
            ).stdout.strip()
            candidates.append(Path(bindir))
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates += [Path(initdb).parent, Path(os.path.realpath(initdb)).parent]

    def version(folder: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in folder.parent.name.split(".") if part.isdigit())

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for folder in candidates:
        if all(os.access(folder / name, os.X_OK) for name in _BINARIES):
            return folder
    searched = ", ".join(dict.fromkeys(str(folder) for folder in candidates)) or "nothing"
    raise PostgresUnavailable(
        "PostgreSQL's server binaries (initdb, pg_ctl, postgres) were not found: no "
        f"pg_config --bindir, PATH or /usr/lib/postgresql/*/bin has all three (searched: "
        f"{searched}); install PostgreSQL (Debian: apt-get install postgresql)"
    )


def _reachable(folder: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` may enter ``folder`` and each folder above it (by their modes)."""
    for each in (folder, *folder.parents):
        found = os.stat(each)
        if found.st_uid == user.pw_uid:
            allowed = found.st_mode & stat.S_IXUSR
        elif found.st_gid == user.pw_gid:
            allowed = found.st_mode & stat.S_IXGRP
        else:
            allowed = found.st_mode & stat.S_IXOTH
        if not allowed:
            return False
    return True


def cluster_parent(user: pwd.struct_passwd | None) -> str:
    """The folder the cluster's folder is made in: the temporary folder (``TMPDIR``), unless
    the server runs as ``user`` (as root) and that user cannot enter it, as when ``TMPDIR``
    is a pytest temporary folder of root's (mode 0700, tests/bench/test_smoke.py runs each
    benchmark so): then ``/tmp``."""
    parent = tempfile.gettempdir()
    if user is None or _reachable(Path(parent).resolve(), user):
        return parent
    return "/tmp"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One throwaway cluster: ``start()``, then :attr:`dsn` (the ``postgres`` database,
    user ``postgres``, no password) and :meth:`create_database`; ``stop()`` at the end.
    Also a context manager."""

    def __init__(
        self, start_timeout: float = START_TIMEOUT, settings: Mapping[str, str] | None = None
    ) -> None:
        self.start_timeout = start_timeout
        #: ``postgres -c name=value`` for each: :data:`NO_DURABILITY` unless told.
        self.settings = dict(NO_DURABILITY if settings is None else settings)
        self.port: int | None = None
        self.folder: Path | None = None
        #: Seconds the last start() took: initdb, and postgres until it accepted a connection.
        self.initdb_seconds = 0.0
        self.start_seconds = 0.0
        self._as_postgres: list[str] = []
        self._bindir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return self.database_dsn("postgres")

    def database_dsn(self, name: str) -> str:
        if self.port is None:
            raise RuntimeError("the PostgreSQL server is not started")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    @property
    def log_path(self) -> Path:
        assert self.folder is not None
        return self.folder / "postgres.log"

    def start(self) -> PostgresServer:
        try:
            import psycopg  # noqa: F401
        except ImportError as error:
            raise PostgresUnavailable(
                f"psycopg is not installed ({error}): pip install -e '.[test]'"
            ) from error
        self._bindir = find_bindir()
        user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                user = None
            if runuser is None or user is None:
                raise PostgresUnavailable(
                    "running as root, where initdb and postgres refuse to run, and there is "
                    "no runuser or no postgres user to run them as"
                )
            self._as_postgres = [runuser, "-u", "postgres", "--"]
        try:
            self._start(user)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, user: pwd.struct_passwd | None) -> None:
        assert self._bindir is not None
        self.folder = Path(tempfile.mkdtemp(prefix="pytest-postgres-", dir=cluster_parent(user)))
        if user is not None:
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        # Before anything is started in the folder: from here on it is removed however
        # this process ends.
        self._watchdog = subprocess.Popen(
            ["sh", "-c", _WATCHDOG, str(self.folder), *self._stop_command()],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,
        )
        atexit.register(self.stop)
        began = time.perf_counter()
        initdb = subprocess.run(
            [
                *self._as_postgres,
                str(self._bindir / "initdb"),
                "-D",
                str(self.folder / "data"),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            cwd=self.folder,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if initdb.returncode != 0:
            raise RuntimeError(
                f"initdb failed ({initdb.returncode}):\n{initdb.stdout}\n{initdb.stderr}"
            )
        self.initdb_seconds = time.perf_counter() - began
        # The port is free when chosen but may be taken before postgres binds it: a few tries.
        for attempt in range(3):
            began = time.perf_counter()
            if self._run_postgres(_free_port()):
                self.start_seconds = time.perf_counter() - began
                return
            log = self.log_path.read_text(errors="replace")
            if "could not bind" not in log or attempt == 2:
                raise RuntimeError(f"postgres exited at start; its log:\n{log[-4000:]}")

    def _run_postgres(self, port: int) -> bool:
        """Start postgres on ``port``; True once it accepts connections, False if it exited."""
        import psycopg

        assert self._bindir is not None and self.folder is not None
        self.port = port
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [
                    *self._as_postgres,
                    str(self._bindir / "postgres"),
                    "-D",
                    str(self.folder / "data"),
                    "-p",
                    str(port),
                    "-k",
                    str(self.folder),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    *(
                        part
                        for name, value in self.settings.items()
                        for part in ("-c", f"{name}={value}")
                    ),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        pause = 0.005
        while True:
            if self._process.poll() is not None:
                self._process = None
                return False
            try:
                psycopg.connect(self.dsn, connect_timeout=5).close()
                return True
            except psycopg.OperationalError as error:
                if time.monotonic() > deadline:
                    log_text = self.log_path.read_text(errors="replace")[-4000:]
                    raise TimeoutError(
                        f"postgres accepted no connection within {self.start_timeout:.0f} s "
                        f"({error}); its log:\n{log_text}"
                    ) from error
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _stop_command(self) -> list[str]:
        assert self._bindir is not None and self.folder is not None
        return [
            *self._as_postgres,
            str(self._bindir / "pg_ctl"),
            "stop",
            "-D",
            str(self.folder / "data"),
            "-m",
            "immediate",
            "-w",
            "-t",
            "60",
        ]

    def create_database(self) -> str:
        """A new empty database ``t_<uuid>``; returns its DSN."""
        from psycopg import connect, sql

        name = f"t_{uuid.uuid4().hex}"
        with connect(self.dsn, autocommit=True) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.database_dsn(name)

    def drop_database(self, dsn: str) -> None:
        """Drop a database of :meth:`create_database`, closing the connections still on it."""
        from psycopg import connect, sql
        from psycopg.conninfo import conninfo_to_dict

        name = conninfo_to_dict(dsn)["dbname"]
        assert isinstance(name, str) and name.startswith("t_"), name
        with connect(self.dsn, autocommit=True) as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def stop(self) -> None:
        """Stop the server at once (no checkpoint) and remove its folder. Idempotent."""
        atexit.unregister(self.stop)
        if self._process is not None:
            subprocess.run(
                self._stop_command(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self.folder,
                timeout=120,
                check=False,
            )
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._kill_postmaster()
                self._process.kill()
                self._process.wait()
            self._process = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        if self._watchdog is not None:
            assert self._watchdog.stdin is not None
            self._watchdog.stdin.close()  # nothing left for it to do: it ends at once
            self._watchdog.wait(timeout=120)
            self._watchdog = None
        self.port = None

    def _kill_postmaster(self) -> None:
        assert self.folder is not None
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


@contextlib.contextmanager
def postgres_server(**kwargs: Any) -> Iterator[PostgresServer]:
    """``with postgres_server() as server:`` a started cluster, stopped and removed after."""
    with PostgresServer(**kwargs) as server:
        yield server
