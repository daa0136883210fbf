"""Names of the step-timing series: the OTLP receiver writes them from a training job's step
and phase spans; the tuner judges trials on them and alert rules may name them before the first
sample arrives. All gauges, labelled with ``job`` and ``rank`` (``phase`` too for phases)."""

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
