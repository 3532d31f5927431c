"""The sub-packages of ``pipelines`` import only downwards, and no statement handler
imports the session module: handlers see the session as ``StatementContext``.

Read from the source (every import, also under TYPE_CHECKING and inside functions), so a
circle cannot come back unnoticed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipelines"
SESSION = "pipelines.sql.session"


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


def test_only_the_session_and_the_worker_import_the_session_module():
    importers = {path.name for path in (PACKAGE / "sql").glob("*.py") if SESSION in imported(path)}
    assert importers <= {"session.py", "worker.py"}, importers


@pytest.mark.parametrize(
    ("package", "never"),
    [
        ("streams", ("pipelines.sql", "pipelines.transactions", "pipelines.spark_sources")),
        ("transactions", ("pipelines.sql", "pipelines.spark_sources")),
    ],
)
def test_lower_sub_packages_do_not_import_higher_ones(package, never):
    for path in (PACKAGE / package).glob("*.py"):
        wrong = {n for n in imported(path) if n.startswith(never)}
        assert not wrong, f"{path.name} imports {sorted(wrong)}"


@pytest.mark.parametrize("package", ["dynamic_tables", "change_streams"])
def test_only_the_session_and_the_worker_reach_the_handlers_above_sql(package):
    """``dynamic_tables`` and ``change_streams`` build on ``sql``'s binder and helpers; in
    ``sql`` only the session (which dispatches statements) and the worker (which runs the
    refresh loop) import them back."""
    importers = {
        path.name
        for path in (PACKAGE / "sql").glob("*.py")
        if any(name.startswith(f"pipelines.{package}") for name in imported(path))
    }
    assert importers <= {"session.py", "worker.py"}, importers
    for path in (PACKAGE / package).glob("*.py"):
        assert SESSION not in imported(path), path.name
