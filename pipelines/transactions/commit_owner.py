"""Who owns a pending pipeline commit, and whether that owner is alive for sure.

An owner is a process named by its pid, its start time (clock ticks after boot, from
``/proc/<pid>/stat``) and the boot id: a pid reused by another process, or by any
process after a reboot, has another start time or boot id, so it never passes for the
owner. Within the owning process, a commit is alive only while a thread rolls it
forward (:data:`IN_FLIGHT`, one owner token per attempt); one whose roll-forward
failed is released to recovery.
Processes sharing a warehouse share one host (and one pid namespace), as they share
its catalog file.
"""

from __future__ import annotations

import os
import uuid
from functools import cache
from pathlib import Path

__all__ = ["IN_FLIGHT", "new_owner", "owner_alive", "process_identity"]

#: Owners (one per commit attempt) working in this process right now.
IN_FLIGHT: set[str] = set()


@cache
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "-"


def process_identity(pid: int) -> str | None:
    """``"<pid>:<start ticks>:<boot id>"`` of a running process; None if there is none
    (or it has exited and only waits to be reaped: a zombie does no more work)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc: the pid alone (weaker; documented)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return f"{pid}:-:{_boot_id()}"
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # field 3: exited, not yet reaped by its parent
        return None
    return f"{pid}:{fields[19]}:{_boot_id()}"  # field 22, starttime


_IDENTITIES: dict[int, str | None] = {}


def new_owner() -> str:
    """An owner for one commit attempt of this process: the process's identity (made
    again in a forked child, which is another process) and a random token."""
    pid = os.getpid()
    if pid not in _IDENTITIES:
        _IDENTITIES[pid] = process_identity(pid)
    return f"{_IDENTITIES[pid]}:{uuid.uuid4().hex[:12]}"


def owner_alive(owner: str) -> bool:
    """Whether the owner of a pending commit may still be working on it."""
    if not owner:  # released: recovery's to take
        return False
    identity = owner.rpartition(":")[0]
    try:
        pid = int(identity.partition(":")[0])
    except ValueError:
        return False
    if pid == os.getpid():  # this process: alive while one of its threads works on it
        return owner in IN_FLIGHT  # (a forked child inherits IN_FLIGHT, not the pid)
    return process_identity(pid) == identity
