"""The example job in docs/step-timing.md runs as written and produces the documented series,
so the document cannot drift from the receiver."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.conftest import Minter
from tests.otlp.conftest import eventually
from tests.otlp.query_api import QueryApi

DOC = Path(__file__).parents[2] / "docs" / "step-timing.md"


def example_code() -> str:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert match is not None, "no python example in docs/step-timing.md"
    return match.group(1)


def test_the_documented_example_job_reports_step_timing(
    server: str, mint: Minter, tmp_path: Path
) -> None:
    mint.project("docs")
    token = mint.token("docs", "agent", "example")
    script = tmp_path / "train.py"
    script.write_text(example_code())
    env = {**os.environ, "TUNELOOP_URL": server, "TUNELOOP_TOKEN": token, "RANK": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    api = QueryApi(server, token, "docs")
    labels = {"job": "llama-pretrain", "rank": "1"}
    phases = eventually(lambda: api.latest("tuneloop_step_phase_seconds", **labels))
    assert set(phases) == {"data_loading", "forward", "backward", "grad_sync", "optimizer"}
    assert float(phases["backward"]) >= 0.03
    assert eventually(lambda: api.latest("tuneloop_step_number", **labels)) == {"": "2"}
    duration = float(api.latest("tuneloop_step_duration_seconds", **labels)[""])
    assert duration >= 0.08
    samples = float(api.latest("tuneloop_samples_per_second", **labels)[""])
    assert samples == pytest.approx(32 / duration)
    assert api.latest("tuneloop_tokens_per_second", **labels)
    assert "Traceback" not in done.stderr
