"""The price table of GPU time (re-exported by ``tuneloop.storage.models``)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, Numeric, String
from sqlalchemy.orm import Mapped, mapped_column

from tuneloop.storage.base import Base
from tuneloop.storage.types import utcnow

CAPACITY_TYPES = ("on_demand", "spot", "reserved")


class GpuPrice(Base):
    """The price of one GPU-hour of an accelerator model on one capacity type, server-wide
    (``project_id`` null) or for one project, whose rows override the server-wide ones."""

    __tablename__ = "gpu_prices"
    __table_args__ = (
        CheckConstraint("capacity_type IN ('on_demand', 'spot', 'reserved')", name="capacity"),
        CheckConstraint("price_per_gpu_hour >= 0", name="price"),
        Index("ix_gpu_prices_project_id", "project_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), default=None
    )
    model: Mapped[str] = mapped_column(String(200))
    """dcgm-exporter's ``modelName`` exactly, or a prefix of it ending in ``*`` (``*``: any)."""
    capacity_type: Mapped[str] = mapped_column(String(20))
    price_per_gpu_hour: Mapped[Decimal] = mapped_column(Numeric(18, 6, asdecimal=True))
    currency: Mapped[str] = mapped_column(String(3))
    """ISO 4217 code."""
    valid_from: Mapped[datetime | None] = mapped_column(default=None)
    """In force from then on (until a later row of the same model and capacity type)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class HostCapacity(Base):
    """The capacity type of every GPU of a host whose series carry no ``capacity_type`` label,
    server-wide (``project_id`` null) or for one project, whose rows override the others."""

    __tablename__ = "gpu_host_capacity"
    __table_args__ = (
        CheckConstraint("capacity_type IN ('on_demand', 'spot', 'reserved')", name="capacity"),
        Index("ix_gpu_host_capacity_host", "host"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), default=None
    )
    host: Mapped[str] = mapped_column(String(253))
    """dcgm-exporter's ``Hostname`` label."""
    capacity_type: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
