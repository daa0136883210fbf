"""Where a job's step time goes and what bounds it: the rules of the diagnosis, pure.

Input: per rank, the job's step time and phase times averaged per bucket of a window (the
reading is :mod:`tuner.diagnosis_reading`), and the mean activity of the job's GPUs when DCGM
reports it. Output: the share of the step in each phase (mean and interval over the window's
buckets), one verdict with the evidence behind it, the ranks that lag, and the ranks whose
timings cannot be true (excluded, with the reason). docs/diagnosis.md states every rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from tuneloop.window_stats import window_stats
from tuner.efficiency import TERA, Efficiency, Throughput, efficiency

DATA_PHASE: Final = "data_loading"
SYNC_PHASE: Final = "grad_sync"
COMPUTE_PHASES: Final = ("forward", "backward")

INPUT_BOUND_SHARE: Final = 0.30
"""Waiting for the next batch for this share of the step or more: input-bound."""
COMMUNICATION_BOUND_SHARE: Final = 0.30
"""Gradient synchronisation for this share of the step or more: communication-bound."""
COMPUTE_BOUND_SHARE: Final = 0.70
"""Forward and backward together for this share or more (and a busy GPU): compute-bound."""
GPU_BUSY: Final = 0.80
"""GPU utilisation (0-1) at or above which the GPU counts as busy."""
GPU_IDLE: Final = 0.30
"""GPU utilisation (0-1) below which the GPU counts as idle."""
DRAM_ACTIVE_HIGH: Final = 0.50
"""DCGM's DRAM activity (0-1) at or above which memory traffic is heavy..."""
SM_ACTIVE_LOW: Final = 0.50
"""...while SM activity below this says the cores wait on it: memory-bound."""

PHASE_OVER_STEP: Final = 1.05
"""One phase longer than its step by more than 5 % cannot be: a phase is inside its step."""
PHASES_OVER_STEP: Final = 1.50
"""Phases may overlap (DDP's all-reduce under backward), so their sum may pass the step; past
1.5 times the step no overlap a training loop has explains it."""

STRAGGLER_MARGIN: Final = 0.10
"""A rank lags when its time is this fraction above the median of the other ranks..."""
STRAGGLER_MIN_STEP_SHARE: Final = 0.05
"""...the excess is at least this share of the job's median step time (so a phase of a few
milliseconds does not flag on a rounding)..."""
STRAGGLER_Z: Final = 3.0
"""...and the excess is this many standard errors of the rank's window estimate (so noise
does not flag)."""
MIN_BUCKETS: Final = 4
"""Buckets a rank needs in the window for its estimate to have a standard error."""
INTERVAL_Z: Final = 1.96
"""Half-width of a share's interval, in standard errors (about 95 %)."""


class Verdict(StrEnum):
    NO_DATA = "no_data"
    INPUT_BOUND = "input_bound"
    COMMUNICATION_BOUND = "communication_bound"
    MEMORY_BOUND = "memory_bound"
    COMPUTE_BOUND = "compute_bound"
    IDLE = "idle"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class RankTimings:
    """One rank's step and phase times, each bucket's mean, keyed by bucket (epoch seconds)."""

    rank: str
    step: Mapping[float, float]
    phases: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    lowest: float | None = None
    """The smallest raw step or phase time in the window (a negative one is bad input)."""
    step_max: Mapping[float, float] = field(default_factory=dict)
    """The longest step of each bucket. Phases may be timed on only some steps (the agent's
    ``phase_every``), so a bucket's phase mean is bounded by its longest step, not its mean."""


@dataclass(frozen=True, slots=True)
class GpuActivity:
    """Window means (0-1) over the job's GPUs; ``None`` where DCGM does not report it."""

    utilization: float | None = None
    sm_active: float | None = None
    dram_active: float | None = None
    tensor_active: float | None = None
    """DCGM's tensor-pipe activity: the share of cycles the tensor cores are busy."""
    model_names: tuple[str, ...] = ()
    """The GPUs' model names (``modelName``), for the peak of :mod:`tuner.efficiency`."""
    metrics: tuple[str, ...] = ()
    """The series the figures come from."""


@dataclass(frozen=True, slots=True)
class Share:
    phase: str
    share: float
    low: float
    high: float
    seconds: float


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: str
    metric: str
    """``step`` or the phase the rank lags in."""
    seconds: float
    others_median: float
    excess: float
    stderr: float
    host: str | None = None
    gpus: tuple[str, ...] = ()
    """The rank's GPUs as its agent registered them (index where DCGM names it, else UUID)."""


@dataclass(frozen=True, slots=True)
class Excluded:
    rank: str
    reason: str


@dataclass(frozen=True, slots=True)
class Diagnosis:
    verdict: Verdict
    summary: str
    evidence: tuple[str, ...] = ()
    step_seconds: float | None = None
    shares: tuple[Share, ...] = ()
    stragglers: tuple[Straggler, ...] = ()
    excluded: tuple[Excluded, ...] = ()
    gpu: GpuActivity | None = None
    ranks: int = 0
    efficiency: Efficiency | None = None


def diagnose(
    ranks: Sequence[RankTimings],
    gpu: GpuActivity | None = None,
    work: Throughput | None = None,
    *,
    setting_peak: float | None = None,
) -> Diagnosis:
    """The diagnosis of a job from its ranks' timings over one window; with ``work`` (what the
    job reports of its FLOPs and samples) its efficiency against the GPUs' peak too."""
    excluded = [Excluded(r.rank, why) for r in ranks if (why := bad_input(r)) is not None]
    bad = {e.rank for e in excluded}
    valid = [r for r in ranks if r.rank not in bad and r.step]
    if not valid:
        summary = (
            "no step timings in the window"
            if not excluded
            else "no step timings left once the ranks with impossible timings were excluded"
        )
        return Diagnosis(Verdict.NO_DATA, summary, excluded=tuple(excluded), gpu=gpu)
    shares = phase_shares(valid)
    step_mean = statistics.fmean(v for r in valid for v in r.step.values())
    verdict, evidence = judge({s.phase: s.share for s in shares}, gpu)
    names = gpu.model_names if gpu is not None else ()
    found = None
    if work is not None:
        found = efficiency(work, (r.rank for r in valid), names, setting_peak)
    if found is not None and found.mfu is not None and found.achieved_flops is not None:
        evidence.append(
            f"MFU {found.mfu:.0%}: {found.achieved_flops / TERA:.4g} of "
            f"{(found.peak_flops or 0) / TERA:.4g} TFLOP/s per GPU ({found.peak_source})"
        )
    return Diagnosis(
        verdict=verdict,
        summary=_SUMMARIES[verdict],
        evidence=tuple(evidence),
        step_seconds=step_mean,
        shares=tuple(shares),
        stragglers=tuple(stragglers(valid)),
        excluded=tuple(excluded),
        gpu=gpu,
        ranks=len(valid),
        efficiency=found,
    )


def bad_input(rank: RankTimings) -> str | None:
    """Why ``rank``'s timings cannot be true, or ``None``."""
    if rank.lowest is not None and rank.lowest < 0:
        return f"negative step or phase time ({rank.lowest:.4g} s)"
    for bucket, mean_step in sorted(rank.step.items()):
        phases = {p: v[bucket] for p, v in rank.phases.items() if bucket in v}
        if not phases:
            continue
        step = max(mean_step, rank.step_max.get(bucket, mean_step))
        longest, seconds = max(phases.items(), key=lambda item: item[1])
        if seconds > step * PHASE_OVER_STEP:
            return f"phase {longest} ({seconds:.4g} s) longer than its step ({step:.4g} s)"
        total = sum(phases.values())
        if total > step * PHASES_OVER_STEP:
            return (
                f"phases sum to {total:.4g} s, over {PHASES_OVER_STEP:g} times "
                f"the step ({step:.4g} s)"
            )
    return None


def phase_shares(ranks: Sequence[RankTimings]) -> list[Share]:
    """Each phase's share of the step: per bucket the mean over ranks of phase / step, then the
    window estimate over buckets (its interval robust to autocorrelation)."""
    names = sorted({p for r in ranks for p in r.phases})
    shares: list[Share] = []
    for phase in names:
        by_bucket: dict[float, list[float]] = {}
        seconds: list[float] = []
        for r in ranks:
            for bucket, value in r.phases.get(phase, {}).items():
                step = r.step.get(bucket)
                if step is not None and step > 0:
                    by_bucket.setdefault(bucket, []).append(value / step)
                    seconds.append(value)
        if not by_bucket:
            continue
        series = [statistics.fmean(by_bucket[b]) for b in sorted(by_bucket)]
        stats = window_stats(series)
        half = INTERVAL_Z * stats.stderr if math.isfinite(stats.stderr) else math.inf
        shares.append(
            Share(
                phase=phase,
                share=stats.mean,
                low=max(0.0, stats.mean - half),
                high=stats.mean + half,
                seconds=statistics.fmean(seconds),
            )
        )
    return shares


def judge(shares: Mapping[str, float], gpu: GpuActivity | None) -> tuple[Verdict, list[str]]:
    """The verdict from the phase shares and GPU activity, first rule that holds wins."""
    data = shares.get(DATA_PHASE, 0.0)
    sync = shares.get(SYNC_PHASE, 0.0)
    compute = sum(shares.get(p, 0.0) for p in COMPUTE_PHASES)
    util = gpu.utilization if gpu is not None else None
    if data >= INPUT_BOUND_SHARE:
        return Verdict.INPUT_BOUND, [
            f"{DATA_PHASE} is {data:.0%} of the step (input-bound at {INPUT_BOUND_SHARE:.0%})"
        ]
    if sync >= COMMUNICATION_BOUND_SHARE:
        return Verdict.COMMUNICATION_BOUND, [
            f"{SYNC_PHASE} is {sync:.0%} of the step "
            f"(communication-bound at {COMMUNICATION_BOUND_SHARE:.0%})"
        ]
    dram = gpu.dram_active if gpu is not None else None
    sm = gpu.sm_active if gpu is not None else None
    if dram is not None and sm is not None and dram >= DRAM_ACTIVE_HIGH and sm < SM_ACTIVE_LOW:
        return Verdict.MEMORY_BOUND, [
            f"GPU DRAM activity {dram:.0%} (>= {DRAM_ACTIVE_HIGH:.0%}) "
            f"with SM activity {sm:.0%} (< {SM_ACTIVE_LOW:.0%})"
        ]
    busy = f"forward + backward are {compute:.0%} of the step"
    if compute >= COMPUTE_BOUND_SHARE:
        if util is None:
            return Verdict.COMPUTE_BOUND, [
                f"{busy} (compute-bound at {COMPUTE_BOUND_SHARE:.0%})",
                "GPU utilisation not reported: judged on the phases alone",
            ]
        if util >= GPU_BUSY:
            return Verdict.COMPUTE_BOUND, [
                f"{busy} (compute-bound at {COMPUTE_BOUND_SHARE:.0%})",
                f"GPU utilisation {util:.0%} (busy at {GPU_BUSY:.0%})",
            ]
    if util is not None and util < GPU_IDLE:
        return Verdict.IDLE, [
            f"GPU utilisation {util:.0%} (idle below {GPU_IDLE:.0%})",
            f"{busy}; {DATA_PHASE} {data:.0%}; {SYNC_PHASE} {sync:.0%}",
        ]
    evidence = [f"{busy}; {DATA_PHASE} {data:.0%}; {SYNC_PHASE} {sync:.0%}"]
    if util is not None:
        evidence.append(f"GPU utilisation {util:.0%}")
    return Verdict.MIXED, evidence


def stragglers(ranks: Sequence[RankTimings]) -> list[Straggler]:
    """Ranks whose step time, or a phase's time other than the synchronisation they make the
    others wait in, sits persistently above the median of the other ranks."""
    if len(ranks) < 2:
        return []
    job_step = statistics.median(statistics.fmean(r.step.values()) for r in ranks)
    metrics: list[tuple[str, dict[str, Mapping[float, float]]]] = [
        ("step", {r.rank: r.step for r in ranks})
    ]
    phases = sorted({p for r in ranks for p in r.phases} - {SYNC_PHASE})
    metrics += [(p, {r.rank: r.phases[p] for r in ranks if r.phases.get(p)}) for p in phases]
    found: dict[str, Straggler] = {}
    for metric, per_rank in metrics:
        if len(per_rank) < 2:
            continue
        estimates = {rank: window_stats([v[b] for b in sorted(v)]) for rank, v in per_rank.items()}
        for rank, own in estimates.items():
            others = [e.mean for r, e in estimates.items() if r != rank]
            median = statistics.median(others)
            excess = own.mean - median
            if (
                own.n >= MIN_BUCKETS
                and excess > STRAGGLER_MARGIN * median
                and excess > STRAGGLER_MIN_STEP_SHARE * job_step
                and excess > STRAGGLER_Z * own.stderr
            ):
                lag = Straggler(rank, metric, own.mean, median, excess, own.stderr)
                if rank not in found or excess > found[rank].excess:
                    found[rank] = lag
    return sorted(found.values(), key=lambda s: -s.excess)


_SUMMARIES: Final = {
    Verdict.NO_DATA: "no step timings in the window",
    Verdict.INPUT_BOUND: "input-bound: steps wait for their data",
    Verdict.COMMUNICATION_BOUND: "communication-bound: steps wait for gradient synchronisation",
    Verdict.MEMORY_BOUND: "memory-bound: the GPUs wait on memory traffic",
    Verdict.COMPUTE_BOUND: "compute-bound: steps are spent computing on the GPU",
    Verdict.IDLE: "idle: the GPUs mostly wait",
    Verdict.MIXED: "no single bound: no phase dominates the step",
}
