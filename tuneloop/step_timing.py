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

GRAD_NORM: Final = "tuneloop_grad_norm"
"""The gradient's global L2 norm at the latest reported step."""
LEARNING_RATE: Final = "tuneloop_learning_rate"
"""The optimizer's learning rate at the latest reported step."""
CHECKPOINT_DURATION: Final = "tuneloop_checkpoint_duration_seconds"
"""Histogram of checkpoint save times (``_bucket``, ``_sum``, ``_count``)."""
FLOPS_PER_SAMPLE: Final = "tuneloop_flops_per_sample"
"""Floating-point operations one training sample costs (forward + backward), as the job declares."""
PEAK_FLOPS: Final = "tuneloop_peak_flops_per_gpu"
"""The peak FLOP/s of one of the job's GPUs, when the job declares it (overrides the table)."""

AGENT_GAUGES: Final = (GRAD_NORM, LEARNING_RATE, FLOPS_PER_SAMPLE, PEAK_FLOPS)
"""Gauges the agent reports beside its step spans (and the checkpoint histogram), labelled
``job`` and ``rank``."""

PHASE_SHARE: Final = "tuneloop_job_phase_share"
"""Share (0-1) of a job's step spent in one phase over the diagnosis window: ``job``, ``phase``."""
STRAGGLER_RATIO: Final = "tuneloop_job_straggler_ratio"
"""How far (0.4: 40 %) a lagging rank sits above the median of the others, written only while it
lags: ``job``, ``rank``, ``lags_in`` (``step`` or a phase), ``Hostname``, ``gpu``."""
VERDICT: Final = "tuneloop_job_diagnosis"
"""1 for a job's current verdict: ``job``, ``verdict``."""

MFU: Final = "tuneloop_job_mfu_ratio"
"""Model FLOPs utilisation (0-1): achieved FLOP/s per GPU over the GPU's peak: ``job``."""

DIAGNOSIS_SERIES: Final = (PHASE_SHARE, STRAGGLER_RATIO, VERDICT, MFU)
