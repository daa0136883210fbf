"""Body of ``GET /api/v1/projects/{project}/jobs/{job}/diagnosis``: where a job's step time
goes, what bounds it and which ranks lag (docs/diagnosis.md)."""

from __future__ import annotations

import math
from datetime import datetime

from pydantic import BaseModel, Field

from tuner.diagnosis import Diagnosis, GpuActivity, Verdict


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
    metrics: list[str]

    @classmethod
    def of(cls, gpu: GpuActivity) -> GpuActivityOut:
        return cls(
            utilization=gpu.utilization,
            sm_active=gpu.sm_active,
            dram_active=gpu.dram_active,
            metrics=list(gpu.metrics),
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
        )
