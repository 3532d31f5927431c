"""A deterministic exit status for our command-line entry points.

On CPython 3.11 to 3.13 a native thread that asks for the GIL once interpreter
finalization has begun is ended with ``pthread_exit()``. pyarrow finishes tearing
down a dataset scan on its own threads after ``to_table()`` has returned; when the
scan read through a Python-implemented filesystem (what delta-rs'
``DeltaTable.to_pyarrow_table()`` uses by default), that teardown releases Python
objects, takes the GIL, is ``pthread_exit()``-ed inside a C++ destructor, and the
C++ runtime aborts the process: "terminate called without an active exception",
exit status 134, after ``main()`` succeeded (apache/arrow#33975 and #36389,
python/cpython#87135, fixed in 3.14).

Our own reads avoid the cause (:func:`flush.tables.read_table` passes a native
filesystem). :func:`run_entry_point` is the backstop for every entry point: it
gives the status ``sys.exit(main())`` would give, but ends the process with
``os._exit()`` after the shutdown steps that matter (joining non-daemon threads,
atexit callbacks such as PySpark's JVM shutdown, flushing logging and stdio), so
nothing can abort during finalization.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import NoReturn

__all__ = ["exit_process", "exit_status", "run_entry_point"]


def exit_process(code: int) -> NoReturn:
    """End the process with ``code`` without interpreter finalization.

    First does what a normal exit does before finalization: joins non-daemon threads,
    runs atexit callbacks, then flushes logging and stdio and calls ``os._exit()``.
    """
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        logging.shutdown()  # idempotent; covers handlers added after atexit ran
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):  # e.g. a closed pipe
            if stream is not None:
                stream.flush()
    os._exit(code)


def exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives: None -> 0, an int -> itself, else print it, 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        print(code, file=sys.stderr)
    return 1


def run_entry_point(main: Callable[[], object]) -> NoReturn:
    """``if __name__ == "__main__": run_entry_point(main)``.

    ``main()`` may return None or an int, call ``sys.exit()`` (argparse errors give 2)
    or raise (traceback on stderr and 1; Ctrl-C gives 130). Never returns.
    """
    try:
        code = exit_status(main())
    except SystemExit as exc:
        code = exit_status(exc.code)
    except KeyboardInterrupt:
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    exit_process(code)
