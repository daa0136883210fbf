"""``bench/energy_power_limit.py`` refuses clearly where no GPU runs, and its figures (samples
per joule against the default limit of the same repeat) come out right on canned blocks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from energy_power_limit import summarize

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "energy_power_limit.py"


def test_without_a_gpu_it_refuses_and_changes_nothing() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "energy_power_limit: " in done.stderr
    assert "nothing was changed" in done.stderr


def block(samples_per_joule: float) -> dict[str, float]:
    return {
        "samples_per_joule": samples_per_joule,
        "samples_per_second": 100.0,
        "mean_power_w": 1.0,
    }


def test_ratios_pair_each_repeat_with_the_default_limit_of_the_same_repeat() -> None:
    # The default's figure drifts between repeats; each repeat's ratio is to its own.
    blocks = {
        700: [block(2.0), block(4.0), block(3.0)],
        400: [block(3.0), block(6.0), block(4.5)],
    }
    rows = {row["limit_w"]: row for row in summarize(blocks, 700)["rows"]}
    assert rows[400]["ratio_vs_default"] == pytest.approx((1.5, 1.5, 1.5))
    assert rows[700]["ratio_vs_default"] == pytest.approx((1.0, 1.0, 1.0))
    assert rows[400]["samples_per_joule"][0] == pytest.approx(4.5)
