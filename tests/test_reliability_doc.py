"""docs/reliability.md names the test behind each promise: every one it names must exist, so a
renamed or removed test cannot leave a promise pointing at nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def test_every_test_the_reliability_page_names_exists() -> None:
    references = REFERENCE.findall(DOC.read_text())
    assert len(references) > 30, "the page lost its test references"
    missing = [
        f"{path}::{name}"
        for path, name in references
        if not re.search(rf"^(async )?def {name}\(", (ROOT / path).read_text(), re.MULTILINE)
    ]
    assert missing == [], f"docs/reliability.md names tests that do not exist: {missing}"
