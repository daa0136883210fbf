"""A compaction process killed with SIGKILL, at several moments, loses and duplicates nothing:
after each kill every sample is either a row or in a chunk, exactly once, and a pass run to
the end then answers every read as before."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine

from tests.storage_compaction.fleet import NOW, counts, every_read, fleet, make_project, write
from tuneloop.storage.timeseries.compaction import compact

ROOT = Path(__file__).resolve().parents[2]


def kill_after(url: str, lines: int, delay_s: float) -> bool:
    """Start a compaction, SIGKILL it ``delay_s`` after its ``lines``-th progress line; whether
    it was still running when killed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.storage_compaction.compact_child", url],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        for _ in range(lines):
            if not child.stdout.readline():
                break
        time.sleep(delay_s)
        running = child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        return running
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_killed_compaction_loses_and_duplicates_nothing(engine: Engine) -> None:
    project = make_project(engine)
    write(engine, project, fleet(hours=6))
    before = every_read(engine, project)
    total = counts(engine)[0]
    url = engine.url.render_as_string(hide_password=False)

    killed = 0
    for lines, delay_s in ((1, 0.0), (1, 0.03), (2, 0.1)):
        killed += kill_after(url, lines, delay_s)
        raw_rows, _, held = counts(engine)
        assert raw_rows + held == total
        if not raw_rows:  # a pass that ended before its kill left nothing to kill
            break
    assert killed, "every compaction ended before it was killed: make it longer"

    compact(
        engine, hot_window=timedelta(0), now=NOW, after_rollups=False, span=timedelta(minutes=1)
    )
    assert counts(engine)[0] == 0 and counts(engine)[2] == total
    assert every_read(engine, project) == before
