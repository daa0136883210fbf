"""The job diagnosis reads its series through the contract: the same findings from the store
(SQLite, PostgreSQL) and from a Prometheus-compatible TSDB (VictoriaMetrics, Prometheus)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from tests.timeseries_contract.conftest import T0, Subject
from tests.tuner.stepspans import step_batches
from tuneloop.storage.timeseries.types import SeriesBatch
from tuner.diagnosis import Verdict, diagnose
from tuner.diagnosis_reading import gpu_activity, gpu_names, rank_timings

PHASES = {
    "data_loading": 0.4,
    "forward": 0.2,
    "backward": 0.25,
    "grad_sync": 0.05,
    "optimizer": 0.05,
}


def test_diagnosis_on_every_backend(subject: Subject) -> None:
    end = T0 + timedelta(seconds=120)
    batches = step_batches("train", PHASES, end=end, ranks=3, slow={2: 1.5}, noise=0.05)
    gpu = {"UUID": "GPU-n2-2", "gpu": "2", "Hostname": "n2"}
    times = [T0 + timedelta(seconds=s) for s in range(0, 120, 5)]
    batches += [
        SeriesBatch("DCGM_FI_DEV_GPU_UTIL", gpu, times, [70.0] * len(times)),
        SeriesBatch("DCGM_FI_PROF_DRAM_ACTIVE", {**gpu, "job": "train"}, times, [0.2] * 24),
    ]
    subject.write(batches)
    backend, project = subject.backend, subject.project

    ranks = rank_timings(backend, project, "train", start=T0, end=end, step_s=2)
    assert [r.rank for r in ranks] == ["0", "1", "2"]
    assert all(len(r.step) >= 55 for r in ranks)
    assert all(r.lowest is not None and 0 < r.lowest < 0.06 for r in ranks)
    activity = gpu_activity(backend, project, "train", ["GPU-n2-2"], start=T0, end=end)
    assert activity is not None
    assert activity.utilization == pytest.approx(0.7)
    assert activity.dram_active == pytest.approx(0.2) and activity.sm_active is None
    assert gpu_names(backend, project, ["GPU-n2-2", "GPU-gone"]) == {"GPU-n2-2": "2"}

    found = diagnose(ranks, activity)
    assert found.verdict is Verdict.INPUT_BOUND
    data = next(s for s in found.shares if s.phase == "data_loading")
    step = 0.4 + 0.2 * 1.5 + 0.25 * 1.5 + 0.05 + 0.05
    assert data.share == pytest.approx(0.4 / step, rel=0.05)
    assert math.isfinite(data.high)
    assert [(s.rank, s.metric) for s in found.stragglers] == [("2", "backward")]
    # Another project sees none of it.
    other = rank_timings(backend, subject.projects[1], "train", start=T0, end=end, step_s=2)
    assert diagnose(other).verdict is Verdict.NO_DATA
