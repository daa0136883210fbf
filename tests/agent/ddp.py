"""A real 2-rank DDP job in a test: its ranks started as torchrun starts them, waited on, and
what each rank recorded read back; and the job's step timings as the store holds them."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select

from tests.agent.conftest import Live
from tests.helpers import free_port
from tuneloop.storage import session_scope
from tuneloop.storage.models import Series, samples

T = TypeVar("T")


def until(probe: Callable[[], T], timeout_s: float, what: str, job: subprocess.Popen[str]) -> T:
    """``probe()`` once truthy; fails at once if ``job`` exits first, naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if job.poll() is not None:
            raise AssertionError(f"the job exited ({job.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextmanager
def two_ranks(
    command: list[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> Iterator[list[subprocess.Popen[str]]]:
    """Ranks 0 and 1 of ``command`` (gloo on this host, one thread each); on the way out a rank
    still running, whatever failed, is killed so that no test leaves a job behind."""
    base = {**(os.environ if env is None else env), "WORLD_SIZE": "2"}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    ranks = [
        subprocess.Popen(command, text=True, env={**base, "RANK": str(rank)}, cwd=cwd)
        for rank in (0, 1)
    ]
    try:
        yield ranks
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()


def both_exit_cleanly(ranks: list[subprocess.Popen[str]], stop: Path | None = None) -> None:
    """Ask the job to stop (its ``--stop-file``) and wait for both ranks to exit 0."""
    if stop is not None:
        stop.touch()
    assert [process.wait(60) for process in ranks] == [0, 0]


def rank_results(directory: Path) -> list[dict[str, Any]]:
    """What each rank wrote at its end, after checking both ranks applied the same configs at
    the same steps."""
    ranks = [json.loads((directory / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert ranks[0]["history"] == ranks[1]["history"]
    return ranks


def stored_steps(live: Live, rank: str, job: str) -> dict[int, float]:
    """Samples per step of one rank of ``job``, from the stored step timings (samples/s x
    duration)."""
    metrics = [
        "tuneloop_step_number",
        "tuneloop_samples_per_second",
        "tuneloop_step_duration_seconds",
    ]
    with session_scope(live.runtime.sessions) as session:
        series = {
            sid: metric
            for sid, metric, labels in session.execute(
                select(Series.id, Series.metric, Series.labels).where(Series.metric.in_(metrics))
            )
            if labels.get("job") == job and labels.get("rank") == rank
        }
        rows = session.execute(
            select(samples.c.series_id, samples.c.ts, samples.c.value).where(
                samples.c.series_id.in_(list(series))
            )
        ).all()
    by_metric: dict[str, dict[Any, float]] = {}
    for series_id, ts, value in rows:
        by_metric.setdefault(series[series_id], {})[ts] = value
    numbers = by_metric.get("tuneloop_step_number", {})
    rate = by_metric.get("tuneloop_samples_per_second", {})
    duration = by_metric.get("tuneloop_step_duration_seconds", {})
    return {int(n): rate[ts] * duration[ts] for ts, n in numbers.items() if ts in rate}
