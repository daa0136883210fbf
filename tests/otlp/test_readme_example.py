"""The README's "Sending metrics and step timings" example runs as written, configured only
through the environment variables it shows, against a real API server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.api.conftest import Minter
from tests.otlp.conftest import eventually
from tests.otlp.query_api import QueryApi

README = Path(__file__).parents[2] / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("## Sending metrics and step timings")
    return text[start : text.index("\n## ", start + 1)]


def test_the_readme_example_exports_through_the_otel_variables(
    server: str, mint: Minter, tmp_path: Path
) -> None:
    mint.project("default")
    token = mint.token("default", "agent", "readme")
    shell, program = re.findall(r"```(?:sh|python)\n(.*?)```", section(), re.DOTALL)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:8000" in shell
    variables = dict(re.findall(r"^export (OTEL_\w+)=\"?(.*?)\"?(?:\s+#.*)?$", shell, re.M))
    assert set(variables) == {"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = server  # the test server's port instead of 8000
    env["OTEL_EXPORTER_OTLP_HEADERS"] = variables["OTEL_EXPORTER_OTLP_HEADERS"].replace(
        "$TOKEN", token
    )
    script = tmp_path / "train.py"
    script.write_text(program)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Failed to export" not in done.stderr, done.stderr
    api = QueryApi(server, token, "default")
    stored = eventually(lambda: api.latest("train_tokens_total", job="llama-pretrain"))
    assert stored == {"": "2048"}
