"""Fresh training runs of the benchmark jobs (``tuneloop.demo.workloads``) to their targets, and
the time-to-target surface they make: shared by ``bench/job_surface.py`` (the grid) and
``bench/tuning_outcome.py`` (start, default and tuned configs after a live study).

A run is the demo's job in ``eval`` mode (``python -m tuneloop.demo.job eval``): both ranks
with the agent, from fresh seeded weights, until the validation metric reaches the workload's
target or the training clock passes its time budget. Its time to target is training time
(evaluation excluded); a run that misses the target counts at the budget, a lower bound that
never flatters a config. The 1-minute load average is recorded before and after each run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneloop.demo import workloads
from tuneloop.demo.processes import ControlPlane, config_args, start_job
from tuneloop.demo.stats import Interval, mean_interval

Config = Mapping[str, int]


def data_file(workload: str, directory: Path) -> Path:
    """Write the workload's data set (seed 0) into ``directory`` once; its path."""
    path = directory / f"{workload}.npz"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        workloads.get(workload).save_data(path, 0)
    return path


def eval_run(
    plane: ControlPlane,
    workload: str,
    config: Config,
    seed: int,
    data: Path,
    out_dir: Path,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """One fresh run of ``config`` to the target: rank 0's result with the config, the seed
    and the host load around it."""
    budget = workloads.get(workload).time_budget_s
    load_before = os.getloadavg()[0]
    job = start_job(
        plane,
        f"{workload}-b{config['batch_size']}-k{config['sync_period']}",
        "eval",
        data,
        out_dir,
        ["--workload", workload, *config_args(config), "--seed", str(seed), *extra_args],
    )
    result = job.wait(budget * 4 + 120)
    return {
        "workload": workload,
        "batch_size": int(config["batch_size"]),
        "sync_period": int(config["sync_period"]),
        "seed": seed,
        "time_to_target_s": result["time_to_target_s"],
        "time_budget_s": budget,
        "best_score": result["best_score"],
        "throughput_samples_s": result["throughput_samples_s"],
        "noise_scale": result["noise_scale"],
        "steps": result["steps"],
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
    }


def charged_time(run: Mapping[str, Any]) -> float:
    """The run's time to target, or its budget when it missed the target."""
    value = run["time_to_target_s"]
    return float(value if value is not None else run["time_budget_s"])


@dataclass(frozen=True)
class SurfacePoint:
    """One config of a measured surface."""

    batch_size: int
    sync_period: int
    time_to_target: Interval
    reached: int
    speed: float
    """Mean over the repeats of ``1 / time to target`` (0 for a missed target)."""
    loadavg_1m: float

    @property
    def config(self) -> dict[str, int]:
        return {"batch_size": self.batch_size, "sync_period": self.sync_period}


def surface(runs: Sequence[Mapping[str, Any]]) -> list[SurfacePoint]:
    """Per-config statistics of ``runs``, shortest mean time to target first."""
    grouped: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["batch_size"], run["sync_period"]), []).append(run)
    points = []
    for (batch, period), group in grouped.items():
        speeds = [
            1.0 / run["time_to_target_s"] if run["time_to_target_s"] is not None else 0.0
            for run in group
        ]
        loads = [(run["loadavg_1m_before"] + run["loadavg_1m_after"]) / 2 for run in group]
        points.append(
            SurfacePoint(
                batch_size=batch,
                sync_period=period,
                time_to_target=mean_interval([charged_time(run) for run in group]),
                reached=sum(run["time_to_target_s"] is not None for run in group),
                speed=sum(speeds) / len(speeds),
                loadavg_1m=sum(loads) / len(loads),
            )
        )
    return sorted(points, key=lambda p: p.time_to_target.mean)


@dataclass(frozen=True)
class Placement:
    """Where a config's measured time to target falls on a surface."""

    rank: int
    """1 + the number of surface configs whose mean time to target is shorter."""
    of: int
    speed_fraction: float
    """The best surface config's mean time to target / this config's (1.0: as fast)."""
    best: dict[str, int]


def place(points: Sequence[SurfacePoint], mean_time_s: float) -> Placement:
    """The rank and speed fraction of a config whose runs averaged ``mean_time_s``."""
    if not points:
        raise ValueError("the surface has no configs")
    best = min(points, key=lambda p: p.time_to_target.mean)
    faster = sum(p.time_to_target.mean < mean_time_s for p in points)
    return Placement(
        rank=faster + 1,
        of=len(points),
        speed_fraction=best.time_to_target.mean / mean_time_s,
        best=best.config,
    )
