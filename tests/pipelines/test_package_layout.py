"""The sub-packages of ``pipelines`` form layers that import only downwards, and none of
them imports the modules at the package's top (the session, the worker, the command
line), which put them together: statement handlers see the session as
``StatementContext``. The other modules at the top (``SHARED``: the errors, the change
sets' one equality and netting) lie below every layer: they import no sub-package.

Read from the source (every import, also under TYPE_CHECKING and inside functions), so a
circle cannot come back unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipelines"
#: Each sub-package's layer: it may import its own modules and those of lower layers.
LAYERS = {
    "streams": 0,
    "incremental": 0,
    "transactions": 1,
    "sql": 2,
    "dynamic_tables": 3,
    "change_streams": 3,
    "spark_sources": 4,
    "cli": 5,  # the command line's client side: what `--url` imports, below `__main__`
}
#: The top: what puts the layers together. No sub-package imports these.
TOP = ("pipelines.session", "pipelines.information_schema", "pipelines.worker", "pipelines.__main__")
#: Modules at the package's top that every layer may import (below layer 0): the error
#: tree, and the one equality and netting of change sets, which ``streams`` and
#: ``incremental`` (two layer-0 packages that may not import each other) both use.
SHARED = ("errors", "change_sets")


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a import b`` counts as ``a`` and ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sub_package(name: str) -> str | None:
    """The sub-package a dotted module name lies in (None: not in one)."""
    parts = name.split(".")
    if len(parts) >= 2 and parts[0] == "pipelines" and parts[1] in LAYERS:
        return parts[1]
    return None


def test_every_sub_package_has_a_layer():
    found = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert found == set(LAYERS), "give the new sub-package a layer in LAYERS"


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_sub_packages_import_only_lower_layers(package):
    for path in (PACKAGE / package).glob("*.py"):
        names = imported(path)
        upward = {
            name for name in names
            if (other := sub_package(name)) is not None and other != package
            and LAYERS[other] >= LAYERS[package]
        }  # fmt: skip
        assert not upward, f"{package}/{path.name} imports {sorted(upward)}"
        top = {name for name in names if name.startswith(TOP)}
        assert not top, f"{package}/{path.name} imports {sorted(top)}"


def test_the_top_holds_only_known_modules():
    found = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    expected = set(SHARED) | {name.rsplit(".", 1)[1] for name in TOP}
    assert found == expected, "a new module at the top: a sub-package, or SHARED?"


@pytest.mark.parametrize("module", SHARED)
def test_shared_modules_import_no_sub_package_and_nothing_of_the_top(module):
    """What every layer imports sits below them all: it imports only other shared
    modules of ``pipelines``."""
    names = imported(PACKAGE / f"{module}.py")
    allowed = tuple(f"pipelines.{name}" for name in SHARED)
    wrong = {n for n in names if n.split(".")[0] == "pipelines" and not n.startswith(allowed)}
    assert not wrong, f"{module}.py imports {sorted(wrong)}"


def test_the_layer_test_sees_an_upward_import(tmp_path):
    """The walk reads imports inside functions and TYPE_CHECKING blocks too."""
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pipelines.session import Session\n"
        "def f():\n    from pipelines.dynamic_tables import refresh\n"
    )
    assert {"pipelines.session", "pipelines.dynamic_tables.refresh"} <= imported(module)
