"""Py4J's class and static-method lookups answered once per JVM connection, not on every use.

PySpark reaches the JVM through Py4J, which resolves a name on every use: each
``F.col(...)`` asks the JVM what ``functions`` is, then whether ``col`` is a member of
it, before the call itself; ``PythonUtils.toSeq`` and ``PythonSQLUtils`` likewise. An
engine refresh builds hundreds of columns and frames: a third of its round trips
(422 of 1,288 for a MIN over a GROUP BY) were these two questions, whose answers never
change while the JVM lives (a class's name and its static methods are fixed once
loaded).

:func:`install` keeps the answers that cannot change: a name of the ``jvm`` view that
names a class, and a class's member that is a static method or a nested class. What
can change is asked every time as before: a static field's value, a name that is not
found (it may be imported later), a package. The answers are kept on the Py4J client
(one per JVM connection), so a new gateway starts empty. A short name is kept as the
class it first named: an import added later (PySpark's streaming modules add packages)
could change that only for a name two imported packages share, which Spark's names
are not.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["install", "installed", "uninstall"]

_LOCK = threading.Lock()
_ORIGINAL: dict[str, Any] = {}
_CACHE_ATTRIBUTE = "_ingest_jvm_lookups"


def _answers(client: Any) -> dict[tuple[str, str, str], Any]:
    """The answers kept for one Py4J client (created on first use)."""
    found = client.__dict__.get(_CACHE_ATTRIBUTE)
    if found is None:
        found = client.__dict__.setdefault(_CACHE_ATTRIBUTE, {})
    return found


def _kept(kind: str, holder: Any, name: str, identity: str, keep: tuple[type, ...]) -> Any:
    """``holder``'s attribute ``name`` as Py4J answers it (``_ORIGINAL[kind]``), kept
    when the answer is one of ``keep``. ``identity``: the instance attribute naming what
    ``holder`` stands for (a view's id, a class's name)."""
    own = holder.__dict__  # (an attribute missing here would call __getattr__ again)
    if "_gateway_client" not in own or identity not in own:
        return _ORIGINAL[kind](holder, name)
    answers = _answers(own["_gateway_client"])
    key = (kind, own[identity], name)
    found = answers.get(key)
    if found is None:
        found = _ORIGINAL[kind](holder, name)  # raises AttributeError for magic names
        if isinstance(found, keep):
            answers[key] = found
    return found


def _view_getattr(view: Any, name: str) -> Any:
    from py4j.java_gateway import JavaClass

    return _kept("view", view, name, "_id", (JavaClass,))  # not a package


def _class_getattr(cls: Any, name: str) -> Any:
    from py4j.java_gateway import JavaClass, JavaMember

    return _kept("class", cls, name, "_fqn", (JavaMember, JavaClass))  # not a field's value


def install() -> None:
    """Keep Py4J's lookups of classes and static methods (idempotent; process-wide)."""
    from py4j import java_gateway

    with _LOCK:
        if _ORIGINAL:
            return
        _ORIGINAL["view"] = java_gateway.JVMView.__getattr__
        _ORIGINAL["class"] = java_gateway.JavaClass.__getattr__
        java_gateway.JVMView.__getattr__ = _view_getattr
        java_gateway.JavaClass.__getattr__ = _class_getattr


def installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return bool(_ORIGINAL)


def uninstall() -> None:
    """Ask Py4J every time again, as before :func:`install` (benchmarks compare both)."""
    from py4j import java_gateway

    with _LOCK:
        if not _ORIGINAL:
            return
        java_gateway.JVMView.__getattr__ = _ORIGINAL.pop("view")
        java_gateway.JavaClass.__getattr__ = _ORIGINAL.pop("class")
