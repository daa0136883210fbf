"""Tuning problems replayed from the measured DDP training runs of ``bench/data``.

Every number a problem returns comes from a real run of ``bench/training/ddp_job.py`` (see
``bench/data/README.md``): nothing is modelled or interpolated.

- **Space**: the measured grid, per-rank batch ``b`` in {2, ..., 256} x sync period ``k`` in
  {1, 2, 4, 8, 16} (powers of two: 40 configurations; gradient accumulation over 2 ranks),
  with the job's own learning-rate rule (square root, 0.05 at an effective batch of 32), so the
  tuner's ``SearchSpace.desired`` gives each proposal the learning rate it was measured with.
- **One evaluation** of a configuration draws one of that configuration's measured runs
  uniformly at random (with replacement, from a generator the caller seeds) and returns the
  run's objective value: the run-to-run noise of the problem is the measured one (load on the
  shared host, the seed), not an assumed distribution. Its ``stderr`` is the noise of one
  draw, the standard deviation of the configuration's measured runs, as a trial's measured
  stderr tells the tuner how far its value may be from the truth. A configuration whose runs
  were out of memory is ``infeasible`` with reason ``oom`` (the job's own error message is
  kept).
- **Objectives** per run, all maximized:

  - ``speed``: ``1 / time to target`` (s^-1), 0 when the run did not reach 98% validation
    accuracy within its time budget (a censored run, ranked last without an invented penalty);
  - ``goodput``: the run's throughput x Pollux's efficiency ``(phi + M0) / (phi + M)``
    (:func:`tuner.objectives.goodput`) with ``phi`` the condition's pooled gradient noise
    scale and ``M0`` = 8, both from the condition's ``analysis``: what the tuner optimizes
    online;
  - ``throughput``: the run's steady-state samples per second (both ranks).

- **Truth** of a configuration: the mean of its runs' values (for ``speed``, the
  ``speed_to_target_mean`` of the data files), which defines the optimum and every fraction of
  it the benchmark reports.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias

import numpy as np

from tuner.objectives import goodput
from tuner.space import BATCH_SIZE, SYNC_PERIOD, ParamValue, SearchSpace
from tuner.strategies import REASON_OOM, Observation

DATA_DIR = Path(__file__).resolve().parent / "data"
RANKS = 2
"""World size of the measured job."""

ObjectiveName: TypeAlias = Literal["speed", "goodput", "throughput"]
OBJECTIVES: tuple[ObjectiveName, ...] = ("speed", "goodput", "throughput")


class ProblemError(ValueError):
    """The measured data do not make a consistent problem."""


def measured_space() -> SearchSpace:
    """The grid the runs were measured on, with the job's learning-rate rule."""
    return SearchSpace.training(
        (2, 256),
        (1, 16),
        sync_powers_of_two=True,
        lr_scaling="sqrt",
        base_lr=0.05,
        base_batch=32,
    )


def load_condition(condition: str, data_dir: Path = DATA_DIR) -> dict[str, Any]:
    path = data_dir / f"ddp_digits_{condition}.json"
    if not path.is_file():
        raise ProblemError(f"no measurements for condition {condition!r}: {path} is missing")
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def run_value(run: Mapping[str, Any], objective: ObjectiveName, phi: float, m0: float) -> float:
    """The objective value of one measured run that did not run out of memory."""
    if objective == "speed":
        if run["status"] != "reached":
            return 0.0
        return 1.0 / float(run["time_to_target_s"])
    samples_s = float(run["throughput"])
    if objective == "throughput":
        return samples_s
    return goodput(samples_s, float(run["effective_batch"]), phi, m0)


@dataclass(frozen=True, slots=True)
class MeasuredConfig:
    """One grid point: its measured runs' objective values, or why it is infeasible."""

    batch_size: int
    sync_period: int
    values: tuple[float, ...]
    error: str = ""

    @property
    def feasible(self) -> bool:
        return not self.error

    @property
    def truth(self) -> float | None:
        """Mean over the measured runs; ``None`` when infeasible."""
        return float(np.mean(self.values)) if self.feasible else None

    @property
    def stderr(self) -> float:
        """The noise of one draw: the standard deviation of the measured runs (0 with one)."""
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else 0.0


@dataclass(frozen=True, slots=True)
class Problem:
    """A tuning problem: the measured grid under one condition and one objective."""

    name: str
    condition: str
    objective: ObjectiveName
    description: str
    space: SearchSpace
    configs: Mapping[tuple[int, int], MeasuredConfig]

    def __post_init__(self) -> None:
        grid = {_key(c) for c in self.space.grid(None)}
        if set(self.configs) != grid:
            missing = sorted(grid - set(self.configs))
            raise ProblemError(f"{self.name}: no measured runs for {missing[:3]} ...")
        if not any(c.feasible for c in self.configs.values()):
            raise ProblemError(f"{self.name}: no feasible configuration")

    @property
    def ident(self) -> int:
        """A stable number for seeding this problem's draws (``hash`` is salted per process)."""
        return zlib.crc32(self.name.encode())

    def measured(self, config: Mapping[str, ParamValue]) -> MeasuredConfig:
        return self.configs[_key(config)]

    def truth(self, config: Mapping[str, ParamValue]) -> float | None:
        return self.measured(config).truth

    @property
    def best(self) -> MeasuredConfig:
        feasible = [c for c in self.configs.values() if c.feasible]
        return max(feasible, key=lambda c: (c.truth or 0.0, -c.batch_size, -c.sync_period))

    @property
    def optimum(self) -> float:
        value = self.best.truth
        assert value is not None
        return value

    def fraction(self, config: Mapping[str, ParamValue]) -> float:
        """Truth of ``config`` as a fraction of the optimum; 0 when infeasible."""
        return (self.truth(config) or 0.0) / self.optimum

    def evaluate(
        self,
        config: Mapping[str, ParamValue],
        number: int,
        rng: np.random.Generator,
        *,
        with_stderr: bool = True,
    ) -> Observation:
        """One trial: a measured run of ``config`` drawn at random, as the tuner sees it, with
        the draw's noise as its stderr (none when not ``with_stderr``)."""
        point = self.measured(config)
        if not point.feasible:
            return Observation(number, config, "infeasible", reason=REASON_OOM)
        value = point.values[int(rng.integers(len(point.values)))]
        stderr = point.stderr if with_stderr else None
        return Observation(number, config, "complete", value=value, stderr=stderr)


def _key(config: Mapping[str, ParamValue]) -> tuple[int, int]:
    return int(config[BATCH_SIZE]), int(config[SYNC_PERIOD])


def build_problem(
    name: str,
    condition: str,
    objective: ObjectiveName,
    description: str,
    *,
    data_dir: Path = DATA_DIR,
) -> Problem:
    """The problem of ``condition``'s measured runs under ``objective``."""
    if objective not in OBJECTIVES:
        raise ProblemError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    doc = load_condition(condition, data_dir)
    analysis = doc["analysis"]
    phi, m0 = float(analysis["pooled_noise_scale"]), float(analysis["goodput_m0"])
    grouped: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for run in doc["runs"]:
        spec = run["spec"]
        grouped.setdefault((int(spec["batch"]), int(spec["sync_period"])), []).append(run)
    configs: dict[tuple[int, int], MeasuredConfig] = {}
    for (batch, period), runs in grouped.items():
        statuses = {r["status"] for r in runs}
        if REASON_OOM in statuses:
            if statuses != {REASON_OOM}:
                raise ProblemError(f"{condition} ({batch}, {period}): OOM in only some runs")
            configs[batch, period] = MeasuredConfig(batch, period, (), str(runs[0]["error"]))
            continue
        values = tuple(run_value(r, objective, phi, m0) for r in runs)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ProblemError(f"{condition} ({batch}, {period}): a value is not finite")
        configs[batch, period] = MeasuredConfig(batch, period, values)
    return Problem(name, condition, objective, description, measured_space(), configs)


@dataclass(frozen=True, slots=True)
class ProblemSpec:
    name: str
    condition: str
    objective: ObjectiveName
    description: str


STATIC_PROBLEMS: tuple[ProblemSpec, ...] = (
    ProblemSpec(
        "baseline/ttt",
        "baseline",
        "speed",
        "time to target, real loopback all-reduce: interior optimum, one config within 95%",
    ),
    ProblemSpec(
        "slownet/ttt",
        "slownet",
        "speed",
        "time to target, emulated slow network: the same argmax, a flat top of three configs",
    ),
    ProblemSpec(
        "memlimit/ttt",
        "memlimit",
        "speed",
        "time to target, 2 MiB memory limit: b >= 64 out of memory, the optimum cut off",
    ),
    ProblemSpec(
        "slownet_mem1m/ttt",
        "slownet_mem1m",
        "speed",
        "time to target, slow network and 1 MiB: b >= 32 OOM, optimum at the OOM edge",
    ),
    ProblemSpec(
        "baseline/goodput",
        "baseline",
        "goodput",
        "goodput (pooled noise scale), real loopback all-reduce",
    ),
    ProblemSpec(
        "slownet/goodput",
        "slownet",
        "goodput",
        "goodput, emulated slow network",
    ),
    ProblemSpec(
        "mem1m/goodput",
        "mem1m",
        "goodput",
        "goodput, 1 MiB memory limit: b >= 32 out of memory (half the grid)",
    ),
    ProblemSpec(
        "baseline/throughput",
        "baseline",
        "throughput",
        "raw throughput (not the default objective): optimum in the large-batch corner",
    ),
)

MOVING_PROBLEMS: tuple[tuple[ProblemSpec, ProblemSpec], ...] = (
    (
        ProblemSpec("mem1m/goodput", "mem1m", "goodput", "1 MiB limit, before the network slows"),
        ProblemSpec("slownet_mem1m/goodput", "slownet_mem1m", "goodput", "after"),
    ),
    (
        ProblemSpec("mem1m/ttt", "mem1m", "speed", "1 MiB limit, before the network slows"),
        ProblemSpec("slownet_mem1m/ttt", "slownet_mem1m", "speed", "after"),
    ),
    (
        ProblemSpec("baseline/goodput", "baseline", "goodput", "before the network slows"),
        ProblemSpec("slownet/goodput", "slownet", "goodput", "after"),
    ),
)
"""The moving optimum: the same job, the network slows halfway. The memory-limited pair is the
clean move (same grid, same limit: (16, 1) -> (16, 4)); on the full grid goodput's optimum moves
from (16, 1) to (64, 1) (time to target's stays at (64, 1), so that pair is not used for it).
A problem with the same name as a static one is the same problem (same draws)."""


def build(spec: ProblemSpec, data_dir: Path = DATA_DIR) -> Problem:
    return build_problem(
        spec.name, spec.condition, spec.objective, spec.description, data_dir=data_dir
    )


def static_problems(data_dir: Path = DATA_DIR) -> list[Problem]:
    return [build(s, data_dir) for s in STATIC_PROBLEMS]


def moving_problems(data_dir: Path = DATA_DIR) -> list[tuple[Problem, Problem]]:
    return [(build(a, data_dir), build(b, data_dir)) for a, b in MOVING_PROBLEMS]


def config_label(config: Mapping[str, ParamValue] | MeasuredConfig) -> str:
    if isinstance(config, MeasuredConfig):
        return f"({config.batch_size}, {config.sync_period})"
    return f"({config[BATCH_SIZE]}, {config[SYNC_PERIOD]})"


def ranking_inputs(condition: str, data_dir: Path = DATA_DIR) -> dict[str, Sequence[float]]:
    """Per feasible config of ``condition`` (grid order): the measured speed to target, and
    what the tuner would rank by: goodput with the pooled noise scale (whole runs), goodput
    online (only what the agent reported in the first second of each run: throughput with
    warm-up and the noise scale pooled from those early gradient norms) and raw throughput."""
    doc = load_condition(condition, data_dir)
    analysis = doc["analysis"]
    m0 = float(analysis["goodput_m0"])
    phi, phi_online = (
        float(analysis["pooled_noise_scale"]),
        float(analysis["pooled_online_noise_scale"]),
    )
    rows = [c for c in doc["configs"] if c["feasible"]]
    return {
        "speed": [float(c["speed_to_target_mean"]) for c in rows],
        "goodput": [
            goodput(float(c["throughput_mean"]), float(c["effective_batch"]), phi, m0) for c in rows
        ],
        "goodput_online": [
            goodput(float(c["online_throughput"]), float(c["effective_batch"]), phi_online, m0)
            for c in rows
        ],
        "throughput": [float(c["throughput_mean"]) for c in rows],
    }
