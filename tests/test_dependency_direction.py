"""The job-side agent's distribution imports nothing of the server's.

Which layer may import which (entry points > API > components > domain > store > core > the
job-side SDK) is the import-linter contracts' job (``[tool.importlinter]`` in pyproject.toml,
run by ``make test``; docs/architecture.md). They can forbid what is listed; this test holds the
agent to what its distribution ships, so a server module added later is covered too.

Read from the source with ``ast``, so a lazy import inside a function counts as much as one at
the top of a module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER_PACKAGES = ("api", "alerts", "tuner", "actuators", "collector")


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_agent_imports_nothing_of_the_server() -> None:
    """The agent's distribution ships ``tuneloop/__init__.py``, ``tuneloop.agent``,
    ``tuneloop.learning_rate`` and ``tuneloop.backoff`` alone (agent/pyproject.toml): nothing
    else is there to import."""
    shipped = re.compile(r"tuneloop(\.agent(\..+)?|\.learning_rate|\.backoff)?$")
    modules = [
        *sorted((ROOT / "tuneloop/agent").rglob("*.py")),
        ROOT / "tuneloop/learning_rate.py",
        ROOT / "tuneloop/backoff.py",
    ]
    offenders = {
        path.relative_to(ROOT).as_posix(): sorted(
            name
            for name in _imported_modules(path)
            if name.split(".")[0] in SERVER_PACKAGES
            or (name.split(".")[0] == "tuneloop" and not shipped.match(name))
        )
        for path in modules
    }
    assert {path: names for path, names in offenders.items() if names} == {}


PURE_TUNER_MODULES = (
    "tuner.space",
    "tuner.objectives",
    "tuner.strategies",
    "tuner.measurement",
    "tuner.memory",
    "tuner.study_options",
    "tuner.knobs",
    "tuneloop.window_stats",
    "actuators.policy",
    "actuators.policy_config",
    "actuators.autoscaler.policy",
    "actuators.autoscaler.reconcile",
)
IO_LIBRARIES = ("sqlalchemy", "psycopg", "httpx", "fastapi", "celery", "redis", "kubernetes")


def test_the_pure_tuner_loads_no_io_library_at_run_time() -> None:
    """import-linter sees the imports a module names, not the packages Python loads on the way
    (a parent package's ``__init__``): import them in a fresh interpreter and look."""
    import subprocess
    import sys

    program = (
        "import importlib, sys\n"
        f"for name in {PURE_TUNER_MODULES!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {IO_LIBRARIES!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
