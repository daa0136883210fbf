"""bench/suite_time.py's directories cover the whole suite: every test file is run by exactly
one of its targets, so the sum of its rows is the suite."""

from __future__ import annotations

from pathlib import Path

from suite_time import ROOT, default_targets


def test_every_test_file_is_in_exactly_one_target() -> None:
    targets = default_targets(ROOT)
    covered: list[Path] = []
    for target in targets:
        for match in ROOT.glob(target):
            covered += [match] if match.is_file() else sorted(match.rglob("test_*.py"))
    every = sorted((ROOT / "tests").rglob("test_*.py"))
    assert sorted(covered) == every
    assert "tests/agent" in targets and targets[-1] == "tests/test_*.py"
