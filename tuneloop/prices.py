"""GPU prices: what a GPU-hour costs, per accelerator model and capacity type, server-wide or
per project (``gpu_prices``).

- A row's ``model`` is dcgm-exporter's ``modelName`` exactly (``NVIDIA H100 80GB HBM3``), or a
  prefix of it ending in ``*`` (``NVIDIA H100*``); ``*`` alone matches every model. Plain
  string comparison: no pattern language to escape or to abuse.
- A GPU's capacity type is its series' ``capacity_type`` label (``on_demand``, ``spot`` or
  ``reserved``; ``on-demand`` as Karpenter's ``karpenter.sh/capacity-type`` spells it is
  accepted), else the one assigned to its host (``Hostname``) in ``gpu_host_capacity``, the
  project's before the server-wide one, else ``on_demand``.
- The row that prices a GPU at a moment: among the rows of its model and capacity type in force
  then (no ``valid_from``, or one not after it), a project's own before the server-wide ones,
  then an exact model before a prefix, a longer prefix before a shorter, the latest
  ``valid_from`` first, the row added last first.
- Each row names its currency (ISO 4217); a project's cost adds up only one currency.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, or_, select
from sqlalchemy.orm import Session

from tuneloop.errors import InvalidInput, NotFound
from tuneloop.storage.models import CAPACITY_TYPES, GpuPrice, HostCapacity

MODEL_LABEL = "modelName"
HOST_LABEL = "Hostname"
CAPACITY_LABEL = "capacity_type"
DEFAULT_CAPACITY = "on_demand"
ANY_MODEL = "*"
MAX_PRICE = Decimal("999999999999.999999")
"""The largest price ``Numeric(18, 6)`` holds."""

_CURRENCY = re.compile(r"[A-Z]{3}")
_prices = cast(Table, GpuPrice.__table__)
_hosts = cast(Table, HostCapacity.__table__)


@dataclass(frozen=True, slots=True)
class Price:
    """One row of the price table."""

    project_id: int | None
    model: str
    capacity_type: str
    price_per_gpu_hour: Decimal
    currency: str
    valid_from: datetime | None = None

    def matches(self, model: str) -> bool:
        if self.model.endswith(ANY_MODEL):
            return model.startswith(self.model[:-1])
        return model == self.model


@dataclass(frozen=True, slots=True)
class HostAssignment:
    """The capacity type of a host's GPUs whose series do not name one."""

    project_id: int | None
    host: str
    capacity_type: str


# --------------------------------------------------------------------------- validation


def validate_host(host: str) -> str:
    host = host.strip()
    if not host or len(host) > 253:
        raise InvalidInput("host must be 1 to 253 characters")
    return host


def validate_model(model: str) -> str:
    model = model.strip()
    if not model or len(model) > 200:
        raise InvalidInput("model must be 1 to 200 characters")
    if ANY_MODEL in model[:-1]:
        raise InvalidInput("model may hold '*' only at its end (a prefix)")
    return model


def validate_capacity_type(value: str) -> str:
    if value not in CAPACITY_TYPES:
        raise InvalidInput(f"capacity_type must be one of {', '.join(CAPACITY_TYPES)}")
    return value


def validate_currency(value: str) -> str:
    if not _CURRENCY.fullmatch(value):
        raise InvalidInput("currency must be an ISO 4217 code: three capital letters, e.g. USD")
    return value


def validate_price(value: Decimal) -> Decimal:
    if not value.is_finite() or value < 0 or value > MAX_PRICE:
        raise InvalidInput(f"price_per_gpu_hour must be between 0 and {MAX_PRICE}")
    if value != value.quantize(Decimal("0.000001")):
        raise InvalidInput("price_per_gpu_hour may have at most 6 decimal places")
    return value


def validated(price: Price) -> Price:
    since = price.valid_from
    if since is not None and since.tzinfo is None:
        raise InvalidInput("valid_from must name its time zone (e.g. 2026-11-01T00:00:00Z)")
    if since is not None and (since.second or since.microsecond):
        # GPU time is counted in whole minutes: a price changes between two of them.
        raise InvalidInput("valid_from must be a whole minute")
    return Price(
        project_id=price.project_id,
        model=validate_model(price.model),
        capacity_type=validate_capacity_type(price.capacity_type),
        price_per_gpu_hour=validate_price(price.price_per_gpu_hour),
        currency=validate_currency(price.currency),
        valid_from=price.valid_from,
    )


# --------------------------------------------------------------------------- which row applies


def capacity_of(labels: Mapping[str, str], hosts: Mapping[str, str] | None = None) -> str:
    """The capacity type a GPU's series names (``on-demand`` read as ``on_demand``), else its
    host's in ``hosts``, else ``on_demand``."""
    value = labels.get(CAPACITY_LABEL, "").strip().lower().replace("-", "_")
    if value in CAPACITY_TYPES:
        return value
    return (hosts or {}).get(labels.get(HOST_LABEL, ""), DEFAULT_CAPACITY)


@dataclass(frozen=True)
class PriceBook:
    """The rows that can price one project's GPUs: its own and the server-wide ones, and the
    capacity type of its hosts."""

    rows: Sequence[Price]
    hosts: Mapping[str, str] = field(default_factory=dict)

    def capacity_of(self, labels: Mapping[str, str]) -> str:
        return capacity_of(labels, self.hosts)

    def price_for(self, labels: Mapping[str, str], at: datetime) -> Price | None:
        model, capacity = labels.get(MODEL_LABEL, ""), self.capacity_of(labels)
        found = [
            row
            for row in self.rows
            if row.capacity_type == capacity
            and row.matches(model)
            and (row.valid_from is None or row.valid_from <= at)
        ]
        return min(found, key=_precedence, default=None)

    def changes_within(self, start: datetime, end: datetime) -> list[datetime]:
        """The moments in ``(start, end)`` at which a row comes into force."""
        return sorted(
            {row.valid_from for row in self.rows if row.valid_from and start < row.valid_from < end}
        )


def _precedence(row: Price) -> tuple[bool, bool, int, float]:
    prefix = row.model.endswith(ANY_MODEL)
    since = row.valid_from.timestamp() if row.valid_from else float("-inf")
    return (row.project_id is None, prefix, -len(row.model), -since)


def price_book(connection: Connection | Session, project_id: int) -> PriceBook:
    scope = or_(_prices.c.project_id.is_(None), _prices.c.project_id == project_id)
    # Newest first: of two rows alike but for their price, the one added last wins.
    rows = connection.execute(select(_prices).where(scope).order_by(_prices.c.id.desc()))
    # Server-wide first, each scope's latest last: the later assignment of a host wins.
    assigned = connection.execute(
        select(_hosts.c.host, _hosts.c.capacity_type)
        .where(or_(_hosts.c.project_id.is_(None), _hosts.c.project_id == project_id))
        .order_by(_hosts.c.project_id.is_not(None), _hosts.c.id)
    )
    return PriceBook([_price(row) for row in rows], {host: kind for host, kind in assigned})


def _price(row: GpuPrice | Row[Any]) -> Price:
    return Price(
        project_id=row.project_id,
        model=str(row.model),
        capacity_type=str(row.capacity_type),
        price_per_gpu_hour=Decimal(row.price_per_gpu_hour).quantize(Decimal("0.000001")),
        currency=str(row.currency),
        valid_from=row.valid_from,
    )


# --------------------------------------------------------------------------- the table


def add_price(session: Session, price: Price) -> GpuPrice:
    price = validated(price)
    row = GpuPrice(
        project_id=price.project_id,
        model=price.model,
        capacity_type=price.capacity_type,
        price_per_gpu_hour=price.price_per_gpu_hour,
        currency=price.currency,
        valid_from=price.valid_from,
    )
    session.add(row)
    session.flush()
    return row


def list_prices(session: Session, project_id: int | None) -> list[GpuPrice]:
    """The server-wide rows (``None``) or one project's own, oldest first."""
    scope = (
        GpuPrice.project_id.is_(None) if project_id is None else GpuPrice.project_id == project_id
    )
    return list(session.scalars(select(GpuPrice).where(scope).order_by(GpuPrice.id)))


def update_price(session: Session, price_id: int, price: Price) -> GpuPrice:
    """Replace the row's fields with ``price``'s, in its scope (``price.project_id``); a row of
    another scope answers :class:`NotFound`."""
    price = validated(price)
    row = session.get(GpuPrice, price_id)
    if row is None or row.project_id != price.project_id:
        raise NotFound(f"price {price_id} not found")
    row.model = price.model
    row.capacity_type = price.capacity_type
    row.price_per_gpu_hour = price.price_per_gpu_hour
    row.currency = price.currency
    row.valid_from = price.valid_from
    session.flush()
    return row


def delete_price(session: Session, price_id: int, project_id: int | None) -> None:
    """Delete a row of that scope; any other answers :class:`NotFound`."""
    row = session.get(GpuPrice, price_id)
    if row is None or row.project_id != project_id:
        raise NotFound(f"price {price_id} not found")
    session.delete(row)
    session.flush()


def replace_prices(
    session: Session,
    scopes: Iterable[int | None],
    prices: Sequence[Price],
    hosts: Sequence[HostAssignment] = (),
) -> int:
    """Make ``prices`` and ``hosts`` the whole table of each scope in ``scopes`` (all or
    nothing)."""
    checked = [validated(price) for price in prices]
    for scope in set(scopes):
        for row in list_prices(session, scope):
            session.delete(row)
        owned = (
            HostCapacity.project_id.is_(None) if scope is None else HostCapacity.project_id == scope
        )
        for assignment in session.scalars(select(HostCapacity).where(owned)):
            session.delete(assignment)
    session.flush()
    for price in checked:
        add_price(session, price)
    for item in hosts:
        session.add(
            HostCapacity(
                project_id=item.project_id,
                host=validate_host(item.host),
                capacity_type=validate_capacity_type(item.capacity_type),
            )
        )
    session.flush()
    return len(checked)


def as_price(row: GpuPrice) -> Price:
    return _price(row)
