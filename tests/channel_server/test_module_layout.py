"""The service's modules import without circles, and every module that serves routes
adds them itself through ``setup(app)``, which the application calls: no route is
registered by importing a module.

Imports are read from the source (also under TYPE_CHECKING and inside functions), as
``tests/pipelines/test_package_layout.py`` reads the pipelines' layers.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from channel_server import app as app_module
from channel_server.http_common import Routes
from tests.pipelines.test_package_layout import imported

PACKAGE = Path(__file__).resolve().parents[2] / "channel_server"


def _graph() -> dict[str, set[str]]:
    modules = {f"channel_server.{p.stem}": p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {name: imported(path) & set(modules) - {name} for name, path in modules.items()}


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (its modules in order), or None."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for other in sorted(graph[name]):
            if found := visit(other, [*path, name]):
                return found
        done.add(name)
        return None

    for name in sorted(graph):
        if found := visit(name, []):
            return found
    return None


def test_the_modules_import_without_circles():
    assert _circle(_graph()) is None, " -> ".join(_circle(_graph()) or [])


def test_the_circle_finder_finds_one():
    """The check above can fail: a made-up circle is found."""
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_module_with_routes_adds_them_itself_and_the_app_calls_it():
    with_routes = set()
    for path in PACKAGE.glob("*.py"):
        module = importlib.import_module(f"channel_server.{path.stem}")
        if isinstance(getattr(module, "routes", None), Routes):
            assert callable(getattr(module, "setup", None)), f"{path.name} has no setup(app)"
            with_routes.add(module)
    assert with_routes == set(app_module.API_MODULES)


def test_the_app_serves_exactly_the_modules_routes():
    served = {(r.method, r.resource.canonical) for r in app_module.create_app().router.routes()
              if r.resource is not None and r.method != "HEAD"}  # fmt: skip
    declared = {(route.method, re.sub(r":[^}]*}", "}", route.path))
                for module in app_module.API_MODULES for route in module.routes}  # fmt: skip
    assert len(declared) > 20 and declared == served
