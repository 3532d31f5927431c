"""Runs the Python blocks of one docs page, one after another, in one interpreter.

Started once per page by ``tests.docs_snippets.Runner``: each line on stdin is the path of
a block's script, run as ``__main__`` (``runpy.run_path``), as ``python script.py`` would
run it; the outcome goes back as one JSON line on the file descriptor
``$DOCS_RESULT_FD`` (``{"ok": ..., "output": ...}``), never on stdout, which the block and
the JVM may write to. A block that starts a Spark session therefore leaves it to the
next block of the page, which skips the ~15 s of a JVM start; each block's ``Session``
opens and closes its own warehouse as written. At the end of its input it exits as a
script does, and must exit with 0 (an abort at exit fails the page).
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
import traceback

import orjson


def _run(path: str) -> dict[str, object]:
    sys.path[0] = os.path.dirname(path)  # as `python path` has it (not this file's folder)
    output = io.StringIO()
    ok = True
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            ok = exc.code in (None, 0)
            if not ok:
                output.write(f"SystemExit({exc.code!r})\n")
        except BaseException:  # the block's failure is the answer
            ok = False
            output.write(traceback.format_exc())
    return {"ok": ok, "output": output.getvalue()}


def main() -> None:
    results = os.fdopen(int(os.environ["DOCS_RESULT_FD"]), "wb", buffering=0)
    for line in sys.stdin:
        results.write(orjson.dumps(_run(line.strip())) + b"\n")
    # Then the interpreter exits as a script's does, with what the blocks left: an
    # abort at exit (ingest_sdk.process_exit) shows in its exit status.


if __name__ == "__main__":
    main()
