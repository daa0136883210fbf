"""The unit every source emits and the pipeline consumes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from tuneloop.storage.timeseries.types import SeriesKind


@dataclass(frozen=True, slots=True)
class Point:
    metric: str
    labels: Mapping[str, str]
    ts: datetime
    value: float
    kind: SeriesKind = SeriesKind.GAUGE
