"""How a range query covers its range: whole buckets of the coarsest complete rollup, finer
rollups at its edges, raw samples for what is left (the rollups' watermarks say how far each
is complete)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from tuneloop.storage.models import ROLLUP_TABLES
from tuneloop.storage.timeseries.rollups import ceil_time, floor_time, read_watermarks


@dataclass(frozen=True, slots=True)
class Segment:
    """A part of the query range served by one source."""

    width_s: int | None
    """Rollup bucket width in seconds; ``None`` for raw samples."""
    start: datetime
    end: datetime


def rollup_tiers(connection: Connection, step_s: int) -> list[tuple[int, datetime]]:
    """Rollups that can serve ``step_s`` (its width divides the step), coarsest first, with
    their watermarks."""
    watermarks = read_watermarks(connection)
    return [
        (width, watermarks[width])
        for width in sorted(ROLLUP_TABLES, reverse=True)
        if step_s % width == 0 and width in watermarks
    ]


def plan_segments(
    start: datetime, end: datetime, tiers: list[tuple[int, datetime]]
) -> list[Segment]:
    """Cover ``[start, end)`` with whole rollup buckets where the coarsest complete rollup has
    them, finer rollups at its edges, and raw samples for what is left."""
    if start >= end:
        return []
    if not tiers:
        return [Segment(None, start, end)]
    (width, watermark), finer = tiers[0], tiers[1:]
    low, high = ceil_time(start, width), min(floor_time(end, width), watermark)
    if high <= low:
        return plan_segments(start, end, finer)
    return [
        *plan_segments(start, low, finer),
        Segment(width, low, high),
        *plan_segments(high, end, finer),
    ]
