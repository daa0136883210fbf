"""A study with nothing better to show than the config the job ran before it, seen by the job
(a real agent against a live API on each backend, the tuning loop's passes run here): the job
ends up on its pre-study config. Apart from ``test_study_end.py`` so that the two files, some
30 s each, can run on different workers."""

from __future__ import annotations

import threading

import pytest

from tests.agent.conftest import Live
from tests.agent.study_job import (
    MEASUREMENT,
    START,
    create_study,
    desired_configs,
    has_steps,
    passes_until,
    running_job,
    study,
    until,
)


@pytest.mark.parametrize("job_side", ["silent", "noisy"])
def test_a_study_with_nothing_better_to_show_leaves_the_job_on_its_config(
    live: Live, job_side: str
) -> None:
    """Silent: the job stops reporting step timings once the study exists, so no trial is
    ever measured. Noisy: every window swings ±50%, so no trial beats the pre-study config
    beyond the noise (or, with noisy windows failing, none is measured)."""
    reporting = threading.Event()
    reporting.set()
    wobble = 0.5 if job_side == "noisy" else 0.005
    with running_job(live, wobble=wobble, reporting=reporting) as agent:
        until(lambda: agent.version == 1, 10, "the starting config to be adopted")
        until(lambda: has_steps(live), 10, "step timings in the store")
        # One extension, not three: a trial that measures nothing (silent) or only noise
        # (noisy) spends its whole budget either way, and the outcome is the same.
        quick = {**MEASUREMENT, "max_extensions": 1}
        created = create_study(live, max_trials=2, strategy="random", seed=1, measurement=quick)
        if job_side == "silent":
            reporting.clear()
        ended = lambda: study(live, created["id"]).state != "running"  # noqa: E731
        passes_until(live, created["id"], ended, "the study to end")
        back = lambda: agent.config == START and agent.pending() is None  # noqa: E731
        until(back, 10, "the job back on its pre-study config")
    row = study(live, created["id"])
    assert row.state in ("complete", "failed"), row.end_reason
    if job_side == "silent":
        assert row.state == "failed" and "the job stays on its pre-study config" in row.end_reason
    assert desired_configs(live)[-1][1] == START
