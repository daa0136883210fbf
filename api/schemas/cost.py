"""Response bodies of the cost view (``api/routes/cost.py``)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, Field, PlainSerializer

from tuneloop import prices
from tuneloop.cost import CostGroup, GpuUsage, GroupBy, gpu_key
from tuneloop.priced_cost import Money

MONEY_PLACES = Decimal("0.000001")
MoneyFigure = Annotated[
    Decimal | None,
    PlainSerializer(
        lambda value: None if value is None else float(value.quantize(MONEY_PLACES)),
        return_type=float | None,
    ),
]


class CostFiguresOut(BaseModel):
    key: str | None = Field(
        description="The job, team or GPU; null for GPUs with no job or team, "
        "'project' for the project's total"
    )
    gpus: int = Field(description="GPUs that were in use or used energy in the period")
    gpu_hours: float
    idle_gpu_hours: float = Field(description="GPU-hours below the idle threshold")
    energy_kwh: float = Field(description="From the DCGM energy counters")
    cost: MoneyFigure = Field(
        description="GPU-hours times their price, in the report's currency; "
        "null when a GPU of the group has no price"
    )
    idle_cost: MoneyFigure = Field(description="Idle GPU-hours times their price")
    unpriced_gpus: int = Field(description="GPUs of the group that no price matches")

    @classmethod
    def of(cls, group: CostGroup, money: Money) -> CostFiguresOut:
        return cls(
            key=group.key,
            gpus=group.gpus,
            gpu_hours=group.gpu_hours,
            idle_gpu_hours=group.idle_gpu_hours,
            energy_kwh=group.energy_kwh,
            cost=money.cost,
            idle_cost=money.idle_cost,
            unpriced_gpus=money.unpriced_gpus,
        )


class UnpricedGpuOut(BaseModel):
    gpu: str = Field(description="host/gpu/UUID, and /profile/instance for a MIG instance")
    model: str | None = Field(description="dcgm-exporter's modelName")
    capacity_type: str

    @classmethod
    def of(cls, usage: GpuUsage, capacity_type: str) -> UnpricedGpuOut:
        return cls(
            gpu=gpu_key(usage.labels),
            model=usage.labels.get(prices.MODEL_LABEL),
            capacity_type=capacity_type,
        )


class CostReportOut(BaseModel):
    start: datetime
    end: datetime
    by: GroupBy
    idle_below_percent: float
    currency: str | None = Field(description="ISO 4217; null when no price applied")
    groups: list[CostFiguresOut]
    total: CostFiguresOut
    unpriced: list[UnpricedGpuOut] = Field(
        description="GPUs no price matches: give their model and capacity type a price"
    )
