"""Response bodies of the cost view (``api/routes/cost.py``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from tuneloop.cost import CostGroup, GroupBy


class CostFiguresOut(BaseModel):
    key: str | None = Field(
        description="The job, team or GPU; null for GPUs with no job or team, "
        "'project' for the project's total"
    )
    gpus: int = Field(description="GPUs that were in use or used energy in the period")
    gpu_hours: float
    idle_gpu_hours: float = Field(description="GPU-hours below the idle threshold")
    energy_kwh: float = Field(description="From the DCGM energy counters")

    @classmethod
    def of(cls, group: CostGroup) -> CostFiguresOut:
        return cls(
            key=group.key,
            gpus=group.gpus,
            gpu_hours=group.gpu_hours,
            idle_gpu_hours=group.idle_gpu_hours,
            energy_kwh=group.energy_kwh,
        )


class CostReportOut(BaseModel):
    start: datetime
    end: datetime
    by: GroupBy
    idle_below_percent: float
    groups: list[CostFiguresOut]
    total: CostFiguresOut
