"""Dependencies point one way: entry points (API, Celery task registry, CLI) -> components
(``alerts``, ``tuner``, ``collector``) -> the shared core (``tuneloop``).

Read from the source with ``ast``, so a lazy import inside a function counts as much as one at
the top of a module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPONENTS = ("alerts", "tuner", "collector")
ENTRY_POINTS = ("tuneloop/cli", "tuneloop/taskqueue", "tuneloop/demo")
"""Parts of ``tuneloop`` that start things (commands, the task registry, the demo that runs the
whole system) and so may reach up."""


def _imported_packages(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _is_entry_point(path: Path) -> bool:
    relative = path.relative_to(ROOT).as_posix()
    return any(relative.startswith(f"{entry}/") for entry in ENTRY_POINTS)


@pytest.mark.parametrize("component", COMPONENTS)
def test_components_do_not_import_the_api(component: str) -> None:
    offenders = [
        path.relative_to(ROOT).as_posix()
        for path in _modules(component)
        if "api" in _imported_packages(path)
    ]
    assert offenders == [], f"{component} imports the API layer"


def test_the_core_imports_neither_the_api_nor_components() -> None:
    upper = {"api", *COMPONENTS}
    offenders = {
        path.relative_to(ROOT).as_posix(): sorted(_imported_packages(path) & upper)
        for path in _modules("tuneloop")
        if not _is_entry_point(path) and _imported_packages(path) & upper
    }
    assert offenders == {}, "the shared core reaches up into the API or a component"


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_agent_imports_nothing_of_the_server() -> None:
    """The agent's distribution ships ``tuneloop/__init__.py``, ``tuneloop.agent`` and
    ``tuneloop.learning_rate`` alone (agent/pyproject.toml): nothing else is there to import."""
    shipped = re.compile(r"tuneloop(\.agent(\..+)?|\.learning_rate)?$")
    server = {"api", *COMPONENTS}
    modules = [*_modules("tuneloop/agent"), ROOT / "tuneloop/learning_rate.py"]
    offenders = {
        path.relative_to(ROOT).as_posix(): sorted(
            name
            for name in _imported_modules(path)
            if name.split(".")[0] in server
            or (name.split(".")[0] == "tuneloop" and not shipped.match(name))
        )
        for path in modules
    }
    assert {path: names for path, names in offenders.items() if names} == {}
