"""The job actuator's policy: a pure function from (policy, what the store holds, now) to one
decision. No I/O, no clock: the reconcile loop (:mod:`tuner.actuators.job`) reads the store, calls
:func:`decide` and writes what it says, so the same inputs always give the same decision and a
restarted loop repeats nothing.

Vocabulary: the **goal** is the desired version written by the tuner, the API or a person; the
**released** version is the one agents are told to run; the **last good** version is the last
released one that passed verification. The actuator walks the released config towards the goal
(at most ``max_change`` per step, one step per ``freeze_s``), verifies every change against the
objective measured before it, and rolls back when the change made things worse by more than
the measurement noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Direction = Literal["maximize", "minimize"]
Action = Literal["none", "release", "step", "wait", "refuse", "dry_run", "confirm", "rollback"]

GRACE_WINDOWS = 2
"""Measurements reach the store seconds late (exporter batches, the write pipeline, a busy
host): how many more windows to wait for them before deciding without them."""

LEARNING_RATE = "learning_rate"
"""Follows the batch: when a step clamps the batch, the learning rate is interpolated too."""


class PolicyError(ValueError):
    """An actuation policy, or a config checked against it, is invalid."""


@dataclass(frozen=True, slots=True)
class Bound:
    """Allowed values of one config key: a numeric range (either end open) or a list."""

    min: float | None = None
    max: float | None = None
    values: tuple[Any, ...] | None = None

    def problem(self, name: str, value: object) -> str | None:
        """Why ``value`` is outside this bound, or ``None`` when it is inside."""
        if self.values is not None:
            if value not in self.values:
                return f"{name}={value!r} is not one of {list(self.values)!r}"
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"{name}={value!r} is not a number"
        if not math.isfinite(value):
            return f"{name}={value!r} is not finite"
        if self.min is not None and value < self.min:
            return f"{name}={value!r} is below its minimum {self.min:g}"
        if self.max is not None and value > self.max:
            return f"{name}={value!r} is above its maximum {self.max:g}"
        return None

    @classmethod
    def from_dict(cls, name: str, data: object) -> Bound:
        if isinstance(data, list):
            if not data:
                raise PolicyError(f"bounds.{name}: an empty list allows nothing")
            return cls(values=tuple(data))
        if not isinstance(data, Mapping):
            raise PolicyError(f"bounds.{name}: use {{'min': x, 'max': y}} or a list of values")
        unknown = set(data) - {"min", "max"}
        if unknown:
            raise PolicyError(f"bounds.{name}: unknown field(s) {sorted(unknown)}")
        low, high = data.get("min"), data.get("max")
        for end, value in (("min", low), ("max", high)):
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise PolicyError(f"bounds.{name}.{end} must be a finite number, got {value!r}")
        if low is not None and high is not None and low > high:
            raise PolicyError(f"bounds.{name}: min {low} is above max {high}")
        return cls(min=low, max=high)

    def to_dict(self) -> Any:
        if self.values is not None:
            return list(self.values)
        return {k: v for k, v in (("min", self.min), ("max", self.max)) if v is not None}


@dataclass(frozen=True, slots=True)
class VerifyPolicy:
    """How a change is verified: the objective is the mean of ``metric`` (rank 0 of the job)
    over ``window_s`` before the change and over ``window_s`` after ``settle_s`` past it."""

    enabled: bool = True
    metric: str = "tuneloop_samples_per_second"
    direction: Direction = "maximize"
    settle_s: float = 5.0
    window_s: float = 30.0
    noise_sigmas: float = 2.0
    """Worse by more than this many standard errors of the difference means worse."""
    min_samples: int = 4

    def due_at(self, changed_at: float) -> float:
        return changed_at + self.settle_s + self.window_s


@dataclass(frozen=True, slots=True)
class ActuationPolicy:
    bounds: Mapping[str, Bound] = field(default_factory=dict)
    max_change: Mapping[str, float] = field(default_factory=dict)
    """Largest factor (> 1) by which a positive numeric key may grow or shrink in one step."""
    freeze_s: float = 0.0
    """No new change for this long after each change (verification also holds changes)."""
    dry_run: bool = False
    """Decide and record, but release nothing."""
    require_approval: bool = False
    """Release a goal only once a person approved its version (or a later one)."""
    verify: VerifyPolicy = field(default_factory=VerifyPolicy)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ActuationPolicy:
        """Parse and validate a stored or submitted policy; :class:`PolicyError` names the
        first problem."""
        data = dict(data or {})
        unknown = set(data) - {
            "bounds",
            "max_change",
            "freeze_s",
            "dry_run",
            "require_approval",
            "verify",
        }
        if unknown:
            raise PolicyError(f"unknown policy field(s) {sorted(unknown)}")
        bounds_data = data.get("bounds") or {}
        if not isinstance(bounds_data, Mapping):
            raise PolicyError("bounds must be an object of config key -> bound")
        bounds = {str(k): Bound.from_dict(str(k), v) for k, v in bounds_data.items()}
        changes_data = data.get("max_change") or {}
        if not isinstance(changes_data, Mapping):
            raise PolicyError("max_change must be an object of config key -> factor")
        max_change: dict[str, float] = {}
        for key, factor in changes_data.items():
            if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 1:
                raise PolicyError(f"max_change.{key} must be a factor > 1, got {factor!r}")
            max_change[str(key)] = float(factor)
        freeze = _number(data.get("freeze_s", 0.0), "freeze_s")
        verify = _verify_from_dict(data.get("verify") or {})
        for flag in ("dry_run", "require_approval"):
            if not isinstance(data.get(flag, False), bool):
                raise PolicyError(f"{flag} must be true or false")
        return cls(
            bounds=bounds,
            max_change=max_change,
            freeze_s=freeze,
            dry_run=bool(data.get("dry_run", False)),
            require_approval=bool(data.get("require_approval", False)),
            verify=verify,
        )

    def to_dict(self) -> dict[str, Any]:
        verify = self.verify
        return {
            "bounds": {k: b.to_dict() for k, b in self.bounds.items()},
            "max_change": dict(self.max_change),
            "freeze_s": self.freeze_s,
            "dry_run": self.dry_run,
            "require_approval": self.require_approval,
            "verify": {
                "enabled": verify.enabled,
                "metric": verify.metric,
                "direction": verify.direction,
                "settle_s": verify.settle_s,
                "window_s": verify.window_s,
                "noise_sigmas": verify.noise_sigmas,
                "min_samples": verify.min_samples,
            },
        }

    def bound_problems(self, config: Mapping[str, Any]) -> list[str]:
        """Every key of ``config`` outside its bound, by key (keys without a bound are free)."""
        problems = []
        for name, bound in sorted(self.bounds.items()):
            if name in config:
                problem = bound.problem(name, config[name])
                if problem is not None:
                    problems.append(problem)
        return problems


def _number(value: object, name: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PolicyError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise PolicyError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _verify_from_dict(data: object) -> VerifyPolicy:
    if not isinstance(data, Mapping):
        raise PolicyError("verify must be an object")
    default = VerifyPolicy()
    known = set(VerifyPolicy.__dataclass_fields__)
    unknown = set(data) - known
    if unknown:
        raise PolicyError(f"unknown verify field(s) {sorted(unknown)}")
    direction = data.get("direction", default.direction)
    if direction not in ("maximize", "minimize"):
        raise PolicyError(f"verify.direction must be maximize or minimize, got {direction!r}")
    metric = data.get("metric", default.metric)
    if not isinstance(metric, str) or not metric:
        raise PolicyError("verify.metric must be a metric name")
    enabled = data.get("enabled", default.enabled)
    if not isinstance(enabled, bool):
        raise PolicyError("verify.enabled must be true or false")
    min_samples = data.get("min_samples", default.min_samples)
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise PolicyError(f"verify.min_samples must be an integer >= 2, got {min_samples!r}")
    return VerifyPolicy(
        enabled=enabled,
        metric=metric,
        direction=direction,
        settle_s=_number(data.get("settle_s", default.settle_s), "verify.settle_s"),
        window_s=_number(data.get("window_s", default.window_s), "verify.window_s", positive=True),
        noise_sigmas=_number(data.get("noise_sigmas", default.noise_sigmas), "verify.noise_sigmas"),
        min_samples=min_samples,
    )


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Version:
    """One desired config version as the policy sees it."""

    number: int
    config: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Stats:
    """The objective over one window: mean, its standard error and the sample count."""

    mean: float
    stderr: float
    n: int

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "stderr": self.stderr, "n": self.n}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Stats | None:
        if not data:
            return None
        return cls(float(data["mean"]), float(data["stderr"]), int(data["n"]))


@dataclass(frozen=True, slots=True)
class View:
    """What the reconcile loop read from the store for one job, and the time."""

    now: float
    goal: Version | None
    released: Version | None
    last_good: Version | None = None
    approved_version: int | None = None
    changed_at: float | None = None
    """Epoch seconds of the last change of the released version."""
    baseline: Stats | None = None
    """The objective before the last change (``None``: nothing to verify against)."""
    after: Stats | None = None
    """The objective since the last change settled; read only when :func:`verification_due`."""
    before: Stats | None = None
    """The objective of the running config so far (the baseline a change would get); read
    only when a change is wanted. ``None``: the job reports no such measurements."""


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: str
    """A stable word: ``in_sync``, ``frozen``, ``awaiting_approval``, ``out_of_bounds``, ..."""
    message: str
    version: int | None = None
    """``release``: the existing desired version to release; ``confirm``: the good version;
    ``rollback``: the version marked bad."""
    config: Mapping[str, Any] | None = None
    """``step`` and ``rollback``: the config to write as a new desired version and release."""
    retry_at: float | None = None
    """``wait``: when waiting may end by itself (freeze or verification over)."""


def verification_pending(view: View) -> bool:
    """Whether the released version has not been verified yet."""
    return (
        view.released is not None
        and view.changed_at is not None
        and (view.last_good is None or view.last_good.number != view.released.number)
    )


def verification_due(policy: ActuationPolicy, view: View) -> bool:
    """Whether the loop should measure ``after`` now (the window after the change is over)."""
    return (
        policy.verify.enabled
        and view.baseline is not None
        and verification_pending(view)
        and view.changed_at is not None
        and view.now >= policy.verify.due_at(view.changed_at)
    )


def judge_change(before: Stats, after: Stats, verify: VerifyPolicy) -> tuple[bool, float, float]:
    """(worse beyond the noise?, signed loss, the noise it is compared to).

    The loss is how much worse ``after`` is in the objective's direction; the noise is
    ``noise_sigmas`` standard errors of the difference of the two means."""
    loss = before.mean - after.mean if verify.direction == "maximize" else after.mean - before.mean
    noise = verify.noise_sigmas * math.hypot(before.stderr, after.stderr)
    return loss > noise, loss, noise


def decide(policy: ActuationPolicy, view: View) -> Decision:
    """The one next action for a job. Called on every tick; acting on it and calling again
    gives ``none`` or ``wait``, never the same action twice."""
    verify = policy.verify
    # 1. A change still being verified holds everything else.
    if verify.enabled and view.baseline is not None and verification_pending(view):
        assert view.released is not None and view.changed_at is not None
        due = verify.due_at(view.changed_at)
        if view.now < due:
            return Decision(
                "wait",
                "verifying",
                f"measuring version {view.released.number} until the window ends",
                retry_at=due,
            )
        after = view.after
        if after is None or after.n < verify.min_samples or not math.isfinite(after.stderr):
            if view.now < due + GRACE_WINDOWS * verify.window_s:
                # Measurements reach the store seconds late (exporter batches, the write
                # pipeline): give them one more window before judging without them.
                return Decision(
                    "wait",
                    "awaiting_measurements",
                    f"waiting for measurements of version {view.released.number}",
                    retry_at=due + GRACE_WINDOWS * verify.window_s,
                )
            # No evidence either way (the job sends no step timings): keep the change.
            return Decision(
                "confirm",
                "unverified",
                f"version {view.released.number} kept: too few measurements to verify it",
                version=view.released.number,
            )
        worse, loss, noise = judge_change(view.baseline, after, verify)
        if worse and view.last_good is not None:
            return Decision(
                "rollback",
                "objective_worse",
                f"{verify.metric} went from {view.baseline.mean:.4g} to {after.mean:.4g} "
                f"after version {view.released.number} (worse by {loss:.4g}, noise "
                f"{noise:.4g}); back to version {view.last_good.number}",
                version=view.released.number,
                config=dict(view.last_good.config),
            )
        return Decision(
            "confirm",
            "verified",
            f"version {view.released.number}: {verify.metric} {view.baseline.mean:.4g} -> "
            f"{after.mean:.4g} (noise {noise:.4g})",
            version=view.released.number,
        )
    if verification_pending(view):
        # Nothing to verify against (first release, or verification off): good as released.
        assert view.released is not None
        return Decision(
            "confirm",
            "unverified",
            f"version {view.released.number} kept without verification",
            version=view.released.number,
        )

    # 2. Towards the goal.
    goal = view.goal
    if goal is None:
        return Decision("none", "no_goal", "no desired config yet")
    if view.released is not None and (
        view.released.number == goal.number or dict(view.released.config) == dict(goal.config)
    ):
        return Decision("none", "in_sync", f"desired version {goal.number} is what runs")
    problems = policy.bound_problems(goal.config)
    if problems:
        return Decision(
            "refuse",
            "out_of_bounds",
            f"desired version {goal.number} is outside the job's bounds: {'; '.join(problems)}",
            version=goal.number,
        )
    if view.changed_at is not None and view.now < view.changed_at + policy.freeze_s:
        until = view.changed_at + policy.freeze_s
        return Decision(
            "wait",
            "frozen",
            f"no change for {policy.freeze_s:g}s after the last one",
            retry_at=until,
        )
    if policy.require_approval and (view.approved_version or 0) < goal.number:
        return Decision(
            "wait",
            "awaiting_approval",
            f"desired version {goal.number} waits for approval",
        )
    before = view.before
    if verify.enabled and view.changed_at is not None and before is not None:
        hold_until = verify.due_at(view.changed_at) + GRACE_WINDOWS * verify.window_s
        if before.n < verify.min_samples and view.now < hold_until:
            # The job reports measurements, but too few yet of the running config to verify
            # a change against (it just changed, or its measurements are late).
            return Decision(
                "wait",
                "measuring_baseline",
                "measuring the running config before changing it",
                retry_at=hold_until,
            )
    step = _step_towards(policy, view.released, goal)
    if policy.dry_run:
        what = "release version" if step is None else "step towards version"
        return Decision(
            "dry_run",
            "dry_run",
            f"dry run: would {what} {goal.number}",
            version=goal.number,
            config=step if step is not None else dict(goal.config),
        )
    if step is None:
        return Decision(
            "release", "goal", f"release desired version {goal.number}", version=goal.number
        )
    return Decision(
        "step",
        "max_change",
        f"step towards desired version {goal.number} (at most max_change per step)",
        version=goal.number,
        config=step,
    )


def _step_towards(
    policy: ActuationPolicy, released: Version | None, goal: Version
) -> dict[str, Any] | None:
    """The config one step from ``released`` towards ``goal``, or ``None`` when the goal is
    within one step (or nothing runs yet: the first config is taken whole)."""
    if released is None or not policy.max_change:
        return None
    current, target = released.config, goal.config
    step = dict(target)
    ratios: list[float] = []  # how far along, in log terms, each clamped key got
    clamped = False
    for key, factor in policy.max_change.items():
        old, new = current.get(key), target.get(key)
        if not (_positive(old) and _positive(new)):
            continue
        assert isinstance(old, int | float) and isinstance(new, int | float)
        low, high = old / factor, old * factor
        if low <= new <= high:
            continue
        clamped = True
        value: float = min(max(new, low), high)
        if isinstance(new, int):
            # Round towards the old value (stay within the factor) but always move by one.
            value = math.floor(value) if value > old else math.ceil(value)
            if value == old:
                value = old + (1 if new > old else -1)
        step[key] = value
        ratios.append(math.log(value / old) / math.log(new / old))
    if not clamped:
        return None
    lr_old, lr_new = current.get(LEARNING_RATE), target.get(LEARNING_RATE)
    if LEARNING_RATE not in policy.max_change and _positive(lr_old) and _positive(lr_new):
        assert isinstance(lr_old, int | float) and isinstance(lr_new, int | float)
        # The learning rate travels with the batch: the same fraction of the way, in log terms.
        fraction = min(ratios)
        step[LEARNING_RATE] = lr_old * (lr_new / lr_old) ** fraction
    return step


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
