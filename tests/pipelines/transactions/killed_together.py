"""One child process SIGKILLed at one failpoint inside the commits of several warehouses.

A child starts its own JVM (about 20 s on a 2-core machine, more under load), and the
kill tests need a child per kill point, not per scenario: scenarios that die at the
same point can die in the same process. :func:`start_group` starts one child that
opens a Session on each scenario's warehouse (one Spark), runs each scenario's body
on a thread named after it, and holds each thread at the failpoint the first time it
reaches it, until every thread is there; then the product's own failpoint
(``INGEST_FAILPOINTS=<point>=kill``) SIGKILLs the process, so every warehouse is left
as a process killed at that point leaves it (no thread of it runs on). Each thread
reports reaching the point first, and :meth:`Member.wait` refuses a kill its scenario
did not reach. If a body raises, or ends without reaching the point, the child exits 3
instead, and the scenarios' tests fail showing its output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.pipelines.transactions.test_consumption_crash import CHILD_TIMEOUT, Child

#: Runs after the child's preamble (``session`` is open on the first warehouse);
#: ``report`` is redefined to tag each result with the scenario of its thread.
_GROUP = """
import threading, traceback
import pipelines.transactions.commit as _commit

_BODIES = {bodies!r}  # scenario -> (warehouse, body)
_POINT = {point!r}
_barrier = threading.Barrier(len(_BODIES), timeout={timeout})
_printing = threading.Lock()


def report(**fields):
    with _printing:
        print("RESULT " + json.dumps({{"scenario": threading.current_thread().name, **fields}}),
              flush=True)


_failpoint = _commit.failpoint


def _held_failpoint(name):
    if name == _POINT:
        report(reached=_POINT)  # flushed before any thread can pass the barrier
        try:
            _barrier.wait()  # every scenario at the point: the real failpoint kills
        except threading.BrokenBarrierError:
            report(error="another scenario failed or ended before the point")
            os._exit(3)
    _failpoint(name)


_commit.failpoint = _held_failpoint


def _run(own, body):
    try:
        exec(compile(body, threading.current_thread().name, "exec"), {{**globals(), "session": own}})
        report(error="ended without reaching " + _POINT)
    except BaseException:
        report(error=traceback.format_exc()[-3000:])
    _barrier.abort()


_threads = []
for _number, (_name, (_warehouse, _body)) in enumerate(_BODIES.items()):
    _own = Session(_warehouse, spark=session.spark) if _number else session  # the first's
    _threads.append(threading.Thread(target=_run, args=(_own, _body), name=_name))
for _thread in _threads:
    _thread.start()
for _thread in _threads:
    _thread.join()
exit_process(3)
"""


@dataclass
class Member:
    """One scenario's view of a group child: its process, and its own results."""

    group: Child
    name: str

    @property
    def proc(self):
        return self.group.proc

    def wait(self) -> int:
        """The child's exit code; SIGKILLed (-9) only after this scenario reached the point."""
        code = self.group.wait()
        reached = any("reached" in r for r in self._own())
        if code == -9 and not reached:
            raise AssertionError(f"killed before {self.name} reached the failpoint\n"
                                 f"{self.describe()}")  # fmt: skip
        return code

    def stop(self) -> None:
        self.group.stop()

    def _own(self) -> list[dict]:
        return [r for r in self.group.results() if r.pop("scenario", None) == self.name]

    def results(self) -> list[dict]:
        """What this scenario's body reported (as a child of its own would)."""
        return [r for r in self._own() if "reached" not in r]

    def describe(self) -> str:
        return f"scenario {self.name} of a group child: {self.group.describe()}"


def start_group(
    point: str, bodies: dict[str, tuple[Path, str]], folder: Path
) -> dict[str, Member]:
    """Start one child killed at ``point`` running each scenario's ``(warehouse, body)``;
    its output goes to ``folder``. Returns each scenario's :class:`Member`."""
    listed = {name: (str(warehouse), body) for name, (warehouse, body) in bodies.items()}
    first = Path(next(iter(listed.values()))[0])
    script = _GROUP.format(bodies=listed, point=point, timeout=CHILD_TIMEOUT)
    child = Child.start(first, script, f"{point}=kill", name=f"group-{point}", out_dir=folder)
    return {name: Member(child, name) for name in bodies}
