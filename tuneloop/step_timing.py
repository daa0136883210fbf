"""Names of the step-timing series: the OTLP receiver writes them from a training job's step
and phase spans; the tuner judges trials on them and alert rules may name them before the first
sample arrives. All gauges, labelled with ``job`` and ``rank`` (``phase`` too for phases).

Also the series the job diagnosis writes from them (docs/diagnosis.md), so alert rules and
dashboards read its findings as they read any gauge."""

from __future__ import annotations

from typing import Final

STEP_DURATION: Final = "tuneloop_step_duration_seconds"
PHASE_DURATION: Final = "tuneloop_step_phase_seconds"
SAMPLES_PER_SECOND: Final = "tuneloop_samples_per_second"
TOKENS_PER_SECOND: Final = "tuneloop_tokens_per_second"
STEP_NUMBER: Final = "tuneloop_step_number"

STEP_TIMING_SERIES: Final = (
    STEP_DURATION,
    PHASE_DURATION,
    SAMPLES_PER_SECOND,
    TOKENS_PER_SECOND,
    STEP_NUMBER,
)

PHASE_SHARE: Final = "tuneloop_job_phase_share"
"""Share (0-1) of a job's step spent in one phase over the diagnosis window: ``job``, ``phase``."""
STRAGGLER_RATIO: Final = "tuneloop_job_straggler_ratio"
"""How far (0.4: 40 %) a lagging rank sits above the median of the others, written only while it
lags: ``job``, ``rank``, ``lags_in`` (``step`` or a phase), ``Hostname``, ``gpu``."""
VERDICT: Final = "tuneloop_job_diagnosis"
"""1 for a job's current verdict: ``job``, ``verdict``."""

DIAGNOSIS_SERIES: Final = (PHASE_SHARE, STRAGGLER_RATIO, VERDICT)
