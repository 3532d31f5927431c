"""The catalog's code as an older commit had it, run in a child process: what an older
service does to a catalog, and what this code makes of a catalog an older one laid out."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.servers import ROOT


def older_code(commit: str, folder: Path) -> Callable[..., str]:
    """Unpack ``catalog`` and ``ingest_sdk`` of ``commit`` into ``folder`` (skips the test
    when this clone lacks the commit) and answer ``run(script, *args)``: the script run
    on that code in a child, its stdout (it must succeed)."""
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "catalog",
                              "ingest_sdk"], capture_output=True)  # fmt: skip
    if archive.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone: {archive.stderr[:200]!r}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)

    def run(script: str, *args: str) -> str:
        done = subprocess.run([sys.executable, "-c", script, *args], cwd=folder,
                              env={**os.environ, "PYTHONPATH": str(folder)},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    return run
