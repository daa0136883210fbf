"""Bodies of ``/api/v1/prices`` and ``/api/v1/projects/{project}/prices`` (and the rows of
the price file ``tuneloop prices load`` reads, :class:`PriceFileRow`)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, PlainSerializer

from tuneloop import prices

CapacityType = Literal["on_demand", "spot", "reserved"]
Model = Annotated[
    str,
    AfterValidator(prices.validate_model),
    Field(
        description="dcgm-exporter's modelName exactly, or a prefix ending in '*' ('*': any)",
        examples=["NVIDIA H100 80GB HBM3", "NVIDIA A100*"],
    ),
]
Currency = Annotated[
    str,
    AfterValidator(prices.validate_currency),
    Field(description="ISO 4217 code", examples=["USD"]),
]
PricePerHour = Annotated[
    Decimal,
    AfterValidator(prices.validate_price),
    Field(description="Per GPU-hour, at most 6 decimal places", examples=["2.45"]),
]
MoneyOut = Annotated[Decimal, PlainSerializer(float, return_type=float, when_used="json")]
"""Money as a JSON number (exact in the store, as ``Numeric(18, 6)``)."""


class PriceIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: Model
    capacity_type: CapacityType = "on_demand"
    price_per_gpu_hour: PricePerHour
    currency: Currency
    valid_from: AwareDatetime | None = Field(
        default=None, description="In force from then on (a whole minute); absent: always"
    )

    def to_price(self, project_id: int | None) -> prices.Price:
        return prices.Price(
            project_id=project_id,
            model=self.model,
            capacity_type=self.capacity_type,
            price_per_gpu_hour=self.price_per_gpu_hour,
            currency=self.currency,
            valid_from=self.valid_from,
        )


class PriceFileRow(PriceIn):
    """A row of a price file (``tuneloop prices load``): server-wide, or a project's."""

    project: str | None = Field(default=None, description="absent: server-wide")


class HostFileRow(BaseModel):
    """A row of a price file that gives a host's GPUs a capacity type (those whose series carry
    no ``capacity_type`` label)."""

    model_config = ConfigDict(extra="forbid")

    host: Annotated[str, AfterValidator(prices.validate_host)] = Field(
        description="dcgm-exporter's Hostname label"
    )
    capacity_type: CapacityType
    project: str | None = Field(default=None, description="absent: server-wide")


class PriceOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    project_id: int | None = Field(description="null: server-wide")
    model: str
    capacity_type: CapacityType
    price_per_gpu_hour: MoneyOut
    currency: str
    valid_from: datetime | None
    created_at: datetime
