"""Ships the agent's sources, which live with the server's in ../tuneloop, in the agent's wheel.

A build hook rather than ``force-include`` because hatchling copies forced files into editable
wheels too: ``pip install -e ./agent`` would then install stale copies in site-packages that
hide the checkout. The editable wheel gets only the ``.pth`` line (``dev-mode-dirs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

CHECKOUT = Path(__file__).resolve().parent.parent
SHIPPED = (
    "tuneloop/__init__.py",
    "tuneloop/learning_rate.py",
    "tuneloop/backoff.py",
    "tuneloop/agent",
)
"""What the agent's distribution owns; the server's wheel excludes exactly these."""


class AgentSources(BuildHookInterface):  # type: ignore[type-arg]
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "standard":
            for path in SHIPPED:
                build_data["force_include"][str(CHECKOUT / path)] = path
