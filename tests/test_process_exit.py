"""Processes that read tables exit with the status their work earned, never 134.

A script that reads a table through delta-rs' default (Python) filesystem and then
exits may abort during interpreter finalization (see ingest_sdk.process_exit). These
tests run real subprocesses: our safe read, and our entry-point wrapper around the
unsafe read, must both exit 0 every time; the wrapper keeps other statuses as they are.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

ROOT = Path(__file__).resolve().parents[1]
RUNS = 12


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    location = tmp_path_factory.mktemp("exit") / "t"
    write_deltalake(str(location), pa.table({"ID": list(range(1000)), "S": ["x"] * 1000}))
    return str(location)


def run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_reading_with_read_table_exits_0(table):
    script = f"""
        from flush import read_table
        assert read_table({table!r}).num_rows == 1000
    """
    codes = [run(script).returncode for _ in range(RUNS)]
    assert codes == [0] * RUNS


def test_the_entry_point_wrapper_exits_0_after_an_unsafe_read(table):
    script = f"""
        from deltalake import DeltaTable
        from ingest_sdk.process_exit import run_entry_point

        def main():
            assert DeltaTable({table!r}).to_pyarrow_table().num_rows == 1000
            print("done", flush=False)  # buffered: the wrapper must flush it

        run_entry_point(main)
    """
    results = [run(script) for _ in range(RUNS)]
    assert [r.returncode for r in results] == [0] * RUNS
    assert all(r.stdout == "done\n" for r in results)


@pytest.mark.parametrize(
    ("body", "code", "stderr"),
    [("return 3", 3, ""), ("raise SystemExit('bad config')", 1, "bad config"),
     ("raise SystemExit(2)", 2, ""), ("raise ValueError('boom')", 1, "ValueError: boom"),
     ("import atexit; atexit.register(lambda: print('atexit ran'))", 0, "")],
)  # fmt: skip
def test_the_wrapper_keeps_the_status_main_gave(body, code, stderr):
    script = f"""
        from ingest_sdk.process_exit import run_entry_point

        def main():
            {body}

        run_entry_point(main)
    """
    result = run(script)
    assert result.returncode == code
    assert stderr in result.stderr
    if "atexit" in body:
        assert result.stdout == "atexit ran\n"


@pytest.mark.parametrize(
    "module",
    [
        "channel_server",
        "flush.compact",
        "pipelines",
        "pipelines.worker",
        "examples.kafka_bridge",
        "bench",
    ],
)
def test_every_entry_point_ends_through_the_wrapper(module):
    file = ROOT / (module.replace(".", "/") + ".py")
    path = file if file.exists() else ROOT / module.replace(".", "/") / "__main__.py"
    text = path.read_text()
    # The CLI's own wrapper ends through exit_process once Arrow or Spark is loaded (its
    # --url path loads neither, nor the SDK's wrapper, to start fast).
    assert "run_entry_point(main)" in text or ("exit_process(" in text and "run(main)" in text)
