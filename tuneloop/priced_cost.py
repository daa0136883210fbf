"""GPU cost in money: the figures of :mod:`tuneloop.cost` priced by :mod:`tuneloop.prices`.

A GPU's cost is its GPU-hours times the price of a GPU-hour of its model and capacity type; its
idle cost, its idle GPU-hours times that price. A MIG instance is priced as its share of the
GPU, as the GPU's energy is shared: an equal share among the instances of the same
``Hostname`` and ``UUID`` (distinct ``GPU_I_ID``) that were in use in the period. When a price
comes into force inside the period, the minutes before and after it are priced apart. A GPU
that was in use for minutes no row prices is **unpriced**: its cost is unknown (``None``),
never 0, and so is the cost of every group that holds it (a GPU that only used energy had no
GPU time to price: it costs 0). The Cost dashboard's ``tuneloop_gpu_cost`` (migration 0012)
computes the same figures on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from itertools import pairwise

from tuneloop import cost
from tuneloop.errors import Conflict
from tuneloop.prices import PriceBook, price_book
from tuneloop.storage.timeseries.query import Bind, use_connection

SECONDS_PER_HOUR = Decimal(3600)


@dataclass(frozen=True, slots=True)
class PricedUsage:
    usage: cost.GpuUsage
    cost: Decimal | None
    """``None`` when no price applies to some of its minutes."""
    idle_cost: Decimal | None


@dataclass(frozen=True, slots=True)
class Money:
    """The cost of a group: ``None`` when any of its GPUs is unpriced."""

    cost: Decimal | None
    idle_cost: Decimal | None
    unpriced_gpus: int


@dataclass
class PricedReport:
    usages: list[PricedUsage]
    currency: str | None
    """The one currency of every price applied; ``None`` when none applied."""
    unpriced: list[cost.GpuUsage] = field(default_factory=list)
    book: PriceBook = field(default_factory=lambda: PriceBook([]))

    def capacity_of(self, usage: cost.GpuUsage) -> str:
        """The capacity type its price was looked up by."""
        return self.book.capacity_of(usage.labels)

    def money(self, by: cost.GroupBy) -> dict[str | None, Money]:
        groups: dict[str | None, list[PricedUsage]] = {}
        for item in self.usages:
            groups.setdefault(cost.group_key(item.usage, by), []).append(item)
        return {key: summed(members) for key, members in groups.items()}

    def total(self) -> Money:
        return summed(self.usages)


def summed(items: Sequence[PricedUsage]) -> Money:
    unpriced = sum(1 for item in items if item.cost is None)
    if unpriced:
        return Money(None, None, unpriced)
    return Money(
        sum((item.cost or Decimal(0) for item in items), Decimal(0)),
        sum((item.idle_cost or Decimal(0) for item in items), Decimal(0)),
        0,
    )


def priced_usage(
    bind: Bind,
    project_id: int,
    start: datetime,
    end: datetime,
    *,
    idle_below: float = cost.DEFAULT_IDLE_BELOW,
) -> PricedReport:
    """Every GPU's figures over ``[start, end)`` (as :func:`tuneloop.cost.gpu_usage`) and money."""
    with use_connection(bind) as connection:
        book = price_book(connection, project_id)
        bounds = [start, *book.changes_within(start, end), end]
        segments = [
            (since, cost.gpu_usage(connection, project_id, since, until, idle_below=idle_below))
            for since, until in pairwise(bounds)
        ]
    shares = cost.mig_shares(
        usage.labels for _, usages in segments for usage in usages if usage.gpu_seconds
    )
    merged: dict[tuple[tuple[str, str], ...], PricedUsage] = {}
    currencies: set[str] = set()
    for since, usages in segments:
        for usage in usages:
            price = book.price_for(usage.labels, since)
            money: tuple[Decimal, Decimal] | None = (Decimal(0), Decimal(0))
            if price is None and usage.gpu_seconds:
                money = None
            elif price is not None and usage.gpu_seconds:
                currencies.add(price.currency)
                rate = price.price_per_gpu_hour * _share(usage.labels, shares) / SECONDS_PER_HOUR
                money = (rate * Decimal(usage.gpu_seconds), rate * Decimal(usage.idle_gpu_seconds))
            key = cost.labels_key(usage.labels)
            merged[key] = _add(merged.get(key), usage, money)
    if len(currencies) > 1:
        raise Conflict(
            f"prices in {' and '.join(sorted(currencies))} apply to this project's GPUs: "
            "a cost adds up one currency; give the project its own prices in one"
        )
    items = sorted(merged.values(), key=lambda item: sorted(item.usage.labels.items()))
    return PricedReport(
        usages=items,
        currency=next(iter(currencies), None),
        unpriced=[item.usage for item in items if item.cost is None],
        book=book,
    )


def usages_of(report: PricedReport) -> Iterable[cost.GpuUsage]:
    return (item.usage for item in report.usages)


def _share(labels: Mapping[str, str], shares: dict[tuple[str, str], int]) -> Decimal:
    if cost.MIG_INSTANCE_LABEL not in labels:
        return Decimal(1)
    gpu = (labels.get(cost.HOST_LABEL, ""), labels.get(cost.UUID_LABEL, ""))
    return Decimal(1) / Decimal(shares.get(gpu, 1))


def _add(
    before: PricedUsage | None, usage: cost.GpuUsage, money: tuple[Decimal, Decimal] | None
) -> PricedUsage:
    if before is None:
        return PricedUsage(usage, *(money or (None, None)))
    whole = replace(
        before.usage,
        gpu_seconds=before.usage.gpu_seconds + usage.gpu_seconds,
        idle_gpu_seconds=before.usage.idle_gpu_seconds + usage.idle_gpu_seconds,
        energy_joules=before.usage.energy_joules + usage.energy_joules,
    )
    if money is None or before.cost is None or before.idle_cost is None:
        return PricedUsage(whole, None, None)
    return PricedUsage(whole, before.cost + money[0], before.idle_cost + money[1])
