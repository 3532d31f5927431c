"""The command line's start and round trip (``cli_round_trip``): how long a user waits for
``python -m pipelines``.

A service process is started for the measurement (``python -m channel_server --port 0``,
as :mod:`bench.ingest` starts it) and warmed with a first ``SELECT 1`` (its Spark worker
starts then). Then ``RUNS`` rounds, each timing, one after another so the machine's load
falls on all alike (wall time of a fresh process each, from ``Popen`` to its exit):

1. ``python -c pass``: the interpreter's own start, the floor nothing here can beat;
2. ``python -m pipelines --help``: the command's start;
3. ``python -m pipelines --url URL --format csv sql "SELECT 1"``: one statement;
4. baseline: the same request by ``curl`` (``POST /v1/sql`` with ``{"statement":
   "SELECT 1"}``), or, without curl, by a fresh ``python -c`` sending it with
   ``http.client``: the service's own time and a minimal client's.

Reported: each one's median and all runs (ms), the statement's time over the baseline's
(target: at most 300 ms) and ``--help``'s (target: at most 300 ms), and the load
average. ``--scale S`` multiplies the rounds (20; at least 3): ``--scale 0.001`` is a
smoke run.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.ingest import ROOT, _Server

RUNS = 20
MIN_RUNS = 3
TARGET_OVER_BASELINE_MS = 300.0
TARGET_HELP_MS = 300.0
WARM_TIMEOUT_S = 600.0
_STATEMENT = "SELECT 1"
_RAW_REQUEST = (
    "import http.client, sys, urllib.parse\n"
    "u = urllib.parse.urlsplit(sys.argv[1])\n"
    "c = http.client.HTTPConnection(u.hostname, u.port)\n"
    "c.request('POST', '/v1/sql', body=sys.argv[2], headers={'Content-Type': 'application/json'})\n"
    "r = c.getresponse(); sys.stdout.buffer.write(r.read()); sys.exit(r.status != 200)\n"
)


def _env() -> dict[str, str]:
    """The caller's environment without ``INGEST_*`` (a token or warehouse of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGEST_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _timed_ms(argv: list[str], env: dict[str, str]) -> float:
    """Wall time of one process, from its start to its exit; it must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, check=False)
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]} exited {done.returncode}: {done.stderr[-2000:]!r}")
    return elapsed


def _warm(url: str) -> float:
    """Send ``SELECT 1`` until the service answers it (its Spark worker starts on the
    first statement; until then it may answer 503): how long that took, in ms."""
    import urllib.error
    import urllib.request

    body = orjson.dumps({"statement": _STATEMENT})
    start = time.perf_counter()
    deadline = start + WARM_TIMEOUT_S
    while True:
        request = urllib.request.Request(f"{url}/v1/sql", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=WARM_TIMEOUT_S) as response:
                response.read()
            return (time.perf_counter() - start) * 1000
        except urllib.error.HTTPError as error:
            if error.code not in (429, 503) or time.perf_counter() > deadline:
                message = f"the service answered {error.code}: {error.read()!r}"
                raise RuntimeError(message) from None
        time.sleep(0.5)


def _commands(url: str) -> dict[str, list[str]]:
    body = orjson.dumps({"statement": _STATEMENT}).decode()
    curl = shutil.which("curl")
    baseline = (
        [curl, "-sf", "-X", "POST", "-H", "Content-Type: application/json", "-d", body,
         f"{url}/v1/sql"]
        if curl is not None
        else [sys.executable, "-c", _RAW_REQUEST, url, body]
    )  # fmt: skip
    python = [sys.executable, "-m", "pipelines"]
    return {
        "python_start": [sys.executable, "-c", "pass"],
        "cli_help": [*python, "--help"],
        "cli_select": [*python, "--url", url, "--format", "csv", "sql", _STATEMENT],
        "baseline": baseline,
    }


def _round_ms(value: float) -> float:
    return round(value, 1)


def run(scale: float | None = None) -> dict[str, Any]:
    scale = 1.0 if scale is None else scale
    runs = max(MIN_RUNS, round(RUNS * scale))
    folder = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    server = _Server(folder / "warehouse")
    try:
        commands = _commands(server.url)
        env = _env()
        warm_ms = _warm(server.url)
        times: dict[str, list[float]] = {name: [] for name in commands}
        load = [os.getloadavg()[0]]
        for _ in range(runs):
            for name, argv in commands.items():
                times[name].append(_timed_ms(argv, env))
        load.append(os.getloadavg()[0])
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    over = medians["cli_select"] - medians["baseline"]
    return {
        "benchmark": "cli_round_trip",
        "scale": scale,
        "runs": runs,
        "statement": _STATEMENT,
        "baseline_tool": "curl" if commands["baseline"][0] != sys.executable else "python",
        "first_request_ms": _round_ms(warm_ms),
        "python_start_ms_median": _round_ms(medians["python_start"]),
        "cli_help_ms_median": _round_ms(medians["cli_help"]),
        "cli_select_ms_median": _round_ms(medians["cli_select"]),
        "baseline_request_ms_median": _round_ms(medians["baseline"]),
        "cli_over_baseline_ms": _round_ms(over),
        "targets": {
            "cli_over_baseline_ms": TARGET_OVER_BASELINE_MS,
            "cli_help_ms": TARGET_HELP_MS,
        },
        "meets_targets": over <= TARGET_OVER_BASELINE_MS and medians["cli_help"] <= TARGET_HELP_MS,
        "all_ms": {name: [_round_ms(v) for v in values] for name, values in times.items()},
        "load_average": [round(v, 2) for v in load],
    }


def main() -> None:
    from bench.pipelines import cli

    cli("python -m bench.cli", __doc__, {"cli": run})


if __name__ == "__main__":
    from ingest_sdk.process_exit import run_entry_point

    run_entry_point(main)
