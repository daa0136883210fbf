"""Body of ``GET /api/v1/projects/{project}/jobs/{job}/diagnosis``: where a job's step time
goes, what bounds it and which ranks lag (docs/diagnosis.md)."""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, Field

from tuner.diagnosis import Diagnosis, GpuActivity, Verdict
from tuner.efficiency import Efficiency


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


class ShareOut(BaseModel):
    phase: str
    share: float = Field(description="Mean share of the step in this phase (0-1)")
    low: float | None = Field(description="Low end of the share's ~95 % interval")
    high: float | None = Field(description="High end; null when too few buckets for an interval")
    seconds: float = Field(description="Mean seconds per step in this phase")


class StragglerOut(BaseModel):
    rank: str
    metric: str = Field(description="'step', or the phase the rank lags in")
    seconds: float = Field(description="The rank's mean over the window")
    others_median: float = Field(description="Median of the other ranks' means")
    excess: float = Field(description="seconds - others_median")
    stderr: float = Field(description="Standard error of the rank's window mean")
    host: str | None = Field(description="The host its agent registered; null if none")
    gpus: list[str] = Field(description="Its GPUs: DCGM's index where known, else the UUID")


class ExcludedOut(BaseModel):
    rank: str
    reason: str


class GpuActivityOut(BaseModel):
    utilization: float | None = Field(description="DCGM_FI_DEV_GPU_UTIL / 100, window mean")
    sm_active: float | None = Field(description="DCGM_FI_PROF_SM_ACTIVE, window mean")
    dram_active: float | None = Field(description="DCGM_FI_PROF_DRAM_ACTIVE, window mean")
    tensor_active: float | None = Field(
        description="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (tensor-pipe activity), window mean"
    )
    model_names: list[str] = Field(description="The GPUs' modelName labels")
    metrics: list[str]

    @classmethod
    def of(cls, gpu: GpuActivity) -> GpuActivityOut:
        return cls(
            utilization=gpu.utilization,
            sm_active=gpu.sm_active,
            dram_active=gpu.dram_active,
            tensor_active=gpu.tensor_active,
            model_names=list(gpu.model_names),
            metrics=list(gpu.metrics),
        )


class EfficiencyOut(BaseModel):
    flops_per_sample: float = Field(description="As the job declares it (forward + backward)")
    samples_per_second: float | None = Field(description="Per GPU, mean over the ranks judged")
    achieved_flops: float | None = Field(description="FLOP/s per GPU")
    peak_flops: float | None = Field(description="Peak FLOP/s of one GPU")
    peak_source: str | None = Field(description="'job', 'setting' or 'table: <model name>'")
    mfu: float | None = Field(description="achieved / peak (0-1); null when excluded")
    excluded: str | None = Field(description="Why there is no MFU (a figure over the peak...)")

    @classmethod
    def of(cls, found: Efficiency) -> EfficiencyOut:
        return cls(
            flops_per_sample=found.flops_per_sample,
            samples_per_second=found.samples_per_second,
            achieved_flops=found.achieved_flops,
            peak_flops=found.peak_flops,
            peak_source=found.peak_source,
            mfu=found.mfu,
            excluded=found.excluded,
        )


class DiagnosisOut(BaseModel):
    job: str
    start: datetime
    end: datetime
    verdict: Verdict
    summary: str
    evidence: list[str] = Field(description="The figures and thresholds behind the verdict")
    step_seconds: float | None = Field(description="Mean step time of the ranks judged")
    ranks: int = Field(description="Ranks judged (those excluded not counted)")
    shares: list[ShareOut]
    stragglers: list[StragglerOut]
    excluded: list[ExcludedOut] = Field(description="Ranks left out of the verdict, and why")
    gpu: GpuActivityOut | None = Field(description="The job's GPUs' activity; null if unreported")
    efficiency: EfficiencyOut | None = Field(
        description="MFU against the GPUs' peak; null when the job reports no FLOPs per sample"
    )

    @classmethod
    def of(cls, job: str, start: datetime, end: datetime, found: Diagnosis) -> DiagnosisOut:
        return cls(
            job=job,
            start=start,
            end=end,
            verdict=found.verdict,
            summary=found.summary,
            evidence=list(found.evidence),
            step_seconds=found.step_seconds,
            ranks=found.ranks,
            shares=[
                ShareOut(
                    phase=s.phase,
                    share=s.share,
                    low=_finite(s.low),
                    high=_finite(s.high),
                    seconds=s.seconds,
                )
                for s in found.shares
            ],
            stragglers=[
                StragglerOut(
                    rank=s.rank,
                    metric=s.metric,
                    seconds=s.seconds,
                    others_median=s.others_median,
                    excess=s.excess,
                    stderr=s.stderr,
                    host=s.host,
                    gpus=list(s.gpus),
                )
                for s in found.stragglers
            ],
            excluded=[ExcludedOut(rank=e.rank, reason=e.reason) for e in found.excluded],
            gpu=None if found.gpu is None else GpuActivityOut.of(found.gpu),
            efficiency=None if found.efficiency is None else EfficiencyOut.of(found.efficiency),
        )
