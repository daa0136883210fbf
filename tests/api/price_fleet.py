"""A priced fleet for the cost tests: four GPUs, one of them split into two MIG instances,
sampled every 30 s for an hour (:data:`T0` to :data:`END`), and the prices that cover all but
one of them.

- ``h100-od``: NVIDIA H100, on-demand (no ``capacity_type`` label), team nlp, busy.
- ``h100-spot``: NVIDIA H100, ``capacity_type="spot"``, team vision, idle (1 %).
- the A100 in two MIG instances (on-demand, Karpenter's spelling ``on-demand``), team nlp: the
  first busy, the second idle; each is priced as half the GPU.
- ``l4``: NVIDIA L4, team infer: no price matches it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from tuneloop import cost
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 25, 9, 0, tzinfo=UTC)
END = T0 + timedelta(hours=1)
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"

SPOT = {"capacity_type": "spot"}
WHOLE = {
    "h100-od": ({"modelName": H100, "team": "nlp", "gpu": "0", "UUID": "GPU-od"}, 90.0),
    "h100-spot": (
        {"modelName": H100, "team": "vision", "gpu": "1", "UUID": "GPU-spot", **SPOT},
        1.0,
    ),
    "l4": ({"modelName": "NVIDIA L4", "team": "infer", "gpu": "2", "UUID": "GPU-l4"}, 90.0),
}
MIG = {"modelName": A100, "team": "nlp", "gpu": "3", "UUID": "GPU-mig"}
MIG["capacity_type"] = "on-demand"
INSTANCES = [
    ({**MIG, "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1"}, 0.7),
    ({**MIG, "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2"}, 0.01),
]

GLOBAL_PRICES: list[dict[str, Any]] = [
    {"model": "NVIDIA H100*", "capacity_type": "on_demand", "price_per_gpu_hour": "4.00",
     "currency": "USD"},
    {"model": "NVIDIA H100*", "capacity_type": "spot", "price_per_gpu_hour": "1.50",
     "currency": "USD"},
    {"model": A100, "price_per_gpu_hour": "3.00", "currency": "USD"},
]  # fmt: skip
"""H100 4.00 on demand, 1.50 spot; A100 3.00 (on demand, the default capacity type)."""


def fill(engine: Engine, project: int) -> None:
    stamps = [T0 + timedelta(seconds=30 * k) for k in range(120)]

    def gauge(metric: str, labels: dict[str, str], value: float) -> SeriesBatch:
        labels = {"Hostname": "node-1", **labels}
        return SeriesBatch(metric, labels, stamps, [value] * len(stamps), SeriesKind.GAUGE)

    batches = [gauge(cost.UTILIZATION_METRIC, labels, util) for labels, util in WHOLE.values()]
    batches += [gauge(cost.ACTIVITY_METRIC, labels, active) for labels, active in INSTANCES]
    result = SampleWriter(engine).write(project, batches)
    assert not result.rejected
