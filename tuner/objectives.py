"""What a trial is scored on: pure formulas and a registry of named objectives.

Training jobs default to **goodput** (Pollux, Qiao et al., OSDI'21): useful progress per second,

    GOODPUT(M) = THROUGHPUT(M) * EFFICIENCY(M),   EFFICIENCY(M) = (phi + M0) / (phi + M)

where THROUGHPUT is in *samples* per second, M is the effective batch (samples per gradient
synchronisation), M0 the batch the job was tuned at (its base batch) and phi the gradient noise
scale the job's agent reports. Derivation: with gradient noise scale phi = tr(Sigma) / |g|^2,
one SGD step on a batch of M makes the progress of ``M / M0 * (phi + M0) / (phi + M)`` steps on
M0 (the "gain", AdaptDL's ``(var + sqr) / (var / scale + sqr)`` with scale = M / M0). Per
*sample* that is gain / (M / M0) = (phi + M0) / (phi + M), which is why the efficiency multiplies
a samples-per-second throughput. (Multiplying samples/s by the gain would count the batch twice;
the gain goes with steps/s.) Goodput is then in M0-equivalent samples per second: it equals the
throughput at M = M0, tends to it when phi >> M (perfect scaling), and to
``throughput * M0 / M`` (constant progress per step) when phi << M.

An objective may also be a PromQL expression (``promql``, see ``tuner.promql_objective``): its
value is the window's mean of the expression's values, in the direction the study gives.

**samples_per_joule** and **tokens_per_joule** score a configuration by the work the job does
per joule its GPUs draw: the window's throughput (samples/s or tokens/s, from the agent's step
reports) over the mean power of the job's GPUs (joules per second, from the increase of their
energy counters over the same window, ``tuner.readings.gpu_power``). With a study's
``throughput_floor`` (in the objective's unit per second) a configuration slower than the floor
is infeasible, however frugal: the energy the job saves must not cost more than the user allows
in time to result.

Inference services default to **slo_throughput**: the throughput, infeasible when the P99
latency is over the SLO. **offered_load_p99** judges a service under an open-loop load, where
every configuration that keeps up serves the offered rate and throughput ranks nothing: a
configuration that keeps up (serves at least :data:`KEEPS_UP` of the requests arriving) is
scored by its P99 latency (minimized), one over the SLO is infeasible, and one that does not
keep up scores above the SLO by the share of the offered rate it left unserved, so that
throughput decides only between configurations that do not keep up.

An objective's ``evaluate`` never raises on bad measurements: a missing, non-finite or
out-of-domain input gives ``Evaluation(status="missing")`` with the reason, so it can never
become a trial value. Only an unknown objective name raises (:class:`ObjectiveError`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from tuneloop.errors import InvalidInput

Direction: TypeAlias = Literal["maximize", "minimize"]
DIRECTIONS: tuple[Direction, ...] = ("maximize", "minimize")
EvaluationStatus: TypeAlias = Literal["ok", "infeasible", "missing"]


class ObjectiveError(InvalidInput):
    """Unknown objective, or a formula called with values outside its domain."""


def _positive(name: str, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ObjectiveError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ObjectiveError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


# --------------------------------------------------------------------------- formulas


def statistical_efficiency(effective_batch: float, noise_scale: float, base_batch: float) -> float:
    """Pollux's EFFICIENCY(M) = (phi + M0) / (phi + M): progress per sample at batch M relative
    to batch M0. 1 at M = M0; below 1 for M > M0."""
    m = _positive("effective_batch", effective_batch)
    m0 = _positive("base_batch", base_batch)
    phi = _non_negative("noise_scale", noise_scale)
    return (phi + m0) / (phi + m)


def throughput(throughput_samples_s: float) -> float:
    """Raw training throughput in samples per second (not the default: it rewards batches
    so large that each sample teaches less)."""
    return _non_negative("throughput_samples_s", throughput_samples_s)


def goodput(
    throughput_samples_s: float, effective_batch: float, noise_scale: float, base_batch: float
) -> float:
    """GOODPUT = THROUGHPUT(M) * (phi + M0) / (phi + M), in M0-equivalent samples per second.

    ``throughput_samples_s``: samples/s over all ranks; ``effective_batch``: M = per-device
    batch * ranks * sync period; ``noise_scale``: phi, the gradient noise scale; ``base_batch``:
    M0, the global batch the learning rate was tuned at.
    """
    return throughput(throughput_samples_s) * statistical_efficiency(
        effective_batch, noise_scale, base_batch
    )


@dataclass(frozen=True, slots=True)
class Evaluation:
    """An objective's verdict on one set of measurements."""

    status: EvaluationStatus
    value: float | None = None
    reason: str = ""

    @classmethod
    def ok(cls, value: float) -> Evaluation:
        return cls("ok", float(value))

    @classmethod
    def infeasible(cls, reason: str) -> Evaluation:
        return cls("infeasible", None, reason)

    @classmethod
    def missing(cls, reason: str) -> Evaluation:
        return cls("missing", None, reason)


def slo_throughput(throughput: float, p99_latency_s: float, slo_s: float) -> Evaluation:
    """Inference: the throughput when the P99 latency is within the SLO, infeasible otherwise
    (at exactly the SLO it is met)."""
    served = _non_negative("throughput", throughput)
    p99 = _non_negative("p99_latency_s", p99_latency_s)
    slo = _positive("slo_s", slo_s)
    if p99 > slo:
        return Evaluation.infeasible(f"slo: p99 latency {p99:.4g} s > SLO {slo:.4g} s")
    return Evaluation.ok(served)


KEEPS_UP: Final = 0.98
"""Served over offered at or above this: the configuration keeps up with its load."""


def offered_load_p99(
    offered_rate: float, served_rate: float, p99_latency_s: float, slo_s: float
) -> Evaluation:
    """A service under an offered load (requests/s arriving, ``served_rate`` answered): its P99
    when it keeps up, ``slo_s * (2 - served / offered)`` when it does not (always above any
    that keeps up; less the more it serves), infeasible when the P99 is over the SLO."""
    offered = _non_negative("offered_rate", offered_rate)
    served = _non_negative("served_rate", served_rate)
    p99 = _non_negative("p99_latency_s", p99_latency_s)
    slo = _positive("slo_s", slo_s)
    if p99 > slo:
        return Evaluation.infeasible(f"slo: p99 latency {p99:.4g} s > SLO {slo:.4g} s")
    share = min(1.0, served / offered) if offered > 0 else 1.0
    if share >= KEEPS_UP:
        return Evaluation.ok(p99)
    return Evaluation.ok(slo * (2.0 - share))


def step_time(step_time_s: float) -> float:
    """Mean seconds per optimizer step; minimized."""
    return _positive("step_time_s", step_time_s)


def per_joule(throughput: float, gpu_power_w: float, throughput_floor: float) -> Evaluation:
    """Work per joule: ``throughput`` (samples or tokens per second) over ``gpu_power_w`` (the
    job's GPUs' mean power, J/s); infeasible when the throughput is below ``throughput_floor``
    (0: no floor)."""
    done = _non_negative("throughput", throughput)
    watts = _positive("gpu_power_w", gpu_power_w)
    floor = _non_negative("throughput_floor", throughput_floor)
    if done < floor:
        return Evaluation.infeasible(
            f"throughput_floor: throughput {done:.4g}/s < floor {floor:.4g}/s"
        )
    return Evaluation.ok(done / watts)


def samples_per_joule(
    throughput_samples_s: float, gpu_power_w: float, throughput_floor: float
) -> Evaluation:
    """Training samples per joule of the job's GPUs (:func:`per_joule`)."""
    return per_joule(throughput_samples_s, gpu_power_w, throughput_floor)


def tokens_per_joule(
    throughput_tokens_s: float, gpu_power_w: float, throughput_floor: float
) -> Evaluation:
    """Tokens per joule of the job's GPUs (:func:`per_joule`)."""
    return per_joule(throughput_tokens_s, gpu_power_w, throughput_floor)


def expression_value(value: float) -> float:
    """The window's mean of a PromQL objective's values, as is (``tuner.promql_objective``)."""
    return float(value)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, slots=True)
class Objective:
    """A named objective: its direction and the inputs its formula needs."""

    name: str
    direction: Direction
    inputs: tuple[str, ...]
    description: str
    formula: Callable[..., float | Evaluation]

    def evaluate(self, inputs: Mapping[str, float | None]) -> Evaluation:
        """Score one set of measurements; a missing or invalid input gives ``missing``."""
        values: dict[str, float] = {}
        for name in self.inputs:
            value = inputs.get(name)
            if value is None:
                return Evaluation.missing(f"{self.name}: no {name}")
            if isinstance(value, bool) or not isinstance(value, int | float):
                return Evaluation.missing(f"{self.name}: {name} is not a number: {value!r}")
            if not math.isfinite(value):
                return Evaluation.missing(f"{self.name}: {name} is {value}")
            values[name] = float(value)
        try:
            result = self.formula(**values)
        except ObjectiveError as exc:
            return Evaluation.missing(f"{self.name}: invalid measurement: {exc}")
        return result if isinstance(result, Evaluation) else Evaluation.ok(result)


OBJECTIVES: Mapping[str, Objective] = {
    o.name: o
    for o in (
        Objective(
            "goodput",
            "maximize",
            ("throughput_samples_s", "effective_batch", "noise_scale", "base_batch"),
            "training progress per second: throughput x statistical efficiency (Pollux)",
            goodput,
        ),
        Objective(
            "throughput",
            "maximize",
            ("throughput_samples_s",),
            "raw training throughput in samples/s",
            throughput,
        ),
        Objective(
            "slo_throughput",
            "maximize",
            ("throughput", "p99_latency_s", "slo_s"),
            "inference throughput, infeasible when P99 latency exceeds the SLO",
            slo_throughput,
        ),
        Objective(
            "offered_load_p99",
            "minimize",
            ("offered_rate", "served_rate", "p99_latency_s", "slo_s"),
            "inference under an offered load: P99 latency among configs that keep up with the "
            "arriving requests, infeasible over the SLO, served share below that",
            offered_load_p99,
        ),
        Objective(
            "step_time",
            "minimize",
            ("step_time_s",),
            "mean seconds per optimizer step",
            step_time,
        ),
        Objective(
            "samples_per_joule",
            "maximize",
            ("throughput_samples_s", "gpu_power_w", "throughput_floor"),
            "training samples per joule of the job's GPUs (energy counters), "
            "infeasible below the study's throughput_floor",
            samples_per_joule,
        ),
        Objective(
            "tokens_per_joule",
            "maximize",
            ("throughput_tokens_s", "gpu_power_w", "throughput_floor"),
            "tokens per joule of the job's GPUs (energy counters), "
            "infeasible below the study's throughput_floor",
            tokens_per_joule,
        ),
        Objective(
            "promql",
            "maximize",
            ("value",),
            "a PromQL expression (objective_expr; $job is the job's name), direction given",
            expression_value,
        ),
    )
}

PROMQL: Final = "promql"
"""The objective whose values are a PromQL expression's (``tuner.promql_objective``)."""

ENERGY_OBJECTIVES: Final = ("samples_per_joule", "tokens_per_joule")
"""Objectives scored per joule of the job's GPUs (``tuner.readings.gpu_power``)."""

SLO_OBJECTIVES: Final = ("slo_throughput", "offered_load_p99")
"""Inference objectives bounded by the study's ``slo_s`` (guarded trials, the SLO rule)."""
LOAD_BANDED_OBJECTIVES: Final = ("offered_load_p99",)
"""Objectives judged per band of the offered rate (``tuner.load_bands``)."""

DEFAULT_OBJECTIVE: Mapping[str, str] = {"training": "goodput", "inference": "slo_throughput"}


def get_objective(name: str) -> Objective:
    try:
        return OBJECTIVES[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(OBJECTIVES))
        raise ObjectiveError(f"unknown objective {name!r}; known: {known}") from None


def default_objective(job_kind: str) -> Objective:
    """``goodput`` for training jobs, ``slo_throughput`` for inference services."""
    try:
        return OBJECTIVES[DEFAULT_OBJECTIVE[job_kind]]
    except KeyError:
        raise ObjectiveError(
            f"unknown job kind {job_kind!r}; known: {', '.join(DEFAULT_OBJECTIVE)}"
        ) from None


def check_direction(direction: str) -> Direction:
    if direction == "maximize":
        return "maximize"
    if direction == "minimize":
        return "minimize"
    raise ObjectiveError(f"unknown direction {direction!r}; known: maximize, minimize")
