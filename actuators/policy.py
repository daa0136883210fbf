"""The job actuator's policy: a pure function from (policy, what the store holds, now) to one
decision. No I/O, no clock: the reconcile loop (:mod:`actuators.job`) reads the store, calls
:func:`decide` and writes what it says, so the same inputs always give the same decision and a
restarted loop repeats nothing.

Vocabulary: the **goal** is the desired version written by the tuner, the API or a person; the
**released** version is the one agents are told to run; the **last good** version is the last
released one that passed verification. The actuator walks the released config towards the goal
(at most ``max_change`` per step, one step per ``freeze_s``), verifies every change against the
objective measured before it, and rolls back when the change made things worse by more than
the measurement noise.

A tuning study's versions are not changes of that kind. Its **trials** are exploration: each is
released whole as soon as the study writes it (the study measures the very config it proposed
over its own window), never verified and never the last good version, so that a study that
ends badly, or a job restarted in the middle of one, can only return to a config measured as
good. Its **outcome** (the pre-study config it restores, or the best config after it beat the
pre-study one beyond the noise) was measured by the study: it is released whole at once and is
the last good version from then on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from actuators.policy_config import ActuationPolicy, VerifyPolicy

VersionRole = Literal["change", "study_trial", "study_outcome"]
Action = Literal["none", "release", "step", "wait", "refuse", "dry_run", "confirm", "rollback"]

GRACE_WINDOWS = 2
"""Measurements reach the store seconds late (exporter batches, the write pipeline, a busy
host): how many more windows to wait for them before deciding without them."""

LEARNING_RATE = "learning_rate"
"""Follows the batch: when a step clamps the batch, the learning rate is interpolated too."""


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Version:
    """One desired config version as the policy sees it."""

    number: int
    config: Mapping[str, Any]
    role: VersionRole = "change"
    """``study_trial`` or ``study_outcome`` for a tuning study's versions (module docstring);
    ``change`` for everything else (people, the API, the actuator's own steps)."""


@dataclass(frozen=True, slots=True)
class Stats:
    """The objective over one window: mean, its standard error and the sample count."""

    mean: float
    stderr: float
    n: int

    def to_dict(self) -> dict[str, float | None]:
        """Strict JSON: a job that reports but has nothing of this config yet has no mean
        (NaN) and no bound on its error (infinite), which PostgreSQL's ``json`` refuses; both
        are written as null."""
        return {"mean": _finite(self.mean), "stderr": _finite(self.stderr), "n": self.n}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Stats | None:
        if not data:
            return None
        mean, stderr = data["mean"], data["stderr"]
        return cls(
            math.nan if mean is None else float(mean),
            math.inf if stderr is None else float(stderr),
            int(data["n"]),
        )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


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
    refused: str | None = None
    """Why the job could not run the released version, when it said so (an observed version
    acknowledging it with status ``oom`` or ``failed``: a knob its agent could not set)."""
    running: Mapping[str, Any] | None = None
    """With ``refused``: the config the job said it kept running."""


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
    """Whether the released version is a change not verified yet (a study's trial is never
    verified, its outcome is good as released)."""
    return (
        view.released is not None
        and view.released.role == "change"
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
    # 0. A change the job could not run goes back at once to what it runs (there is nothing
    # to measure), even one kept before the job said so: a study handles its own trials.
    refused = _refused(view)
    if refused is not None:
        return refused
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
        if worse and view.last_good is not None and view.last_good.role != "study_trial":
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
    held = _held_by_freeze(policy, view, goal) or _held_by_approval(policy, view, goal)
    if held is None and goal.role == "change":
        held = _held_for_baseline(policy, view)
    if held is not None:
        return held
    # A study's versions are released whole: the study measures the config it proposed.
    step = _step_towards(policy, view.released, goal) if goal.role == "change" else None
    if policy.dry_run:
        what = "release version" if step is None else "step towards version"
        return Decision(
            "dry_run",
            "dry_run",
            f"dry run: would {what} {goal.number}",
            version=goal.number,
            config=step if step is not None else dict(goal.config),
        )
    if goal.role == "study_outcome":
        return Decision(
            "release",
            "study_outcome",
            f"release desired version {goal.number}, the config a study ended on, as good",
            version=goal.number,
        )
    if goal.role == "study_trial":
        return Decision(
            "release",
            "study_trial",
            f"release desired version {goal.number}, a study's trial, unverified",
            version=goal.number,
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


def _refused(view: View) -> Decision | None:
    released = view.released
    if view.refused is None or released is None or released.role != "change":
        return None
    back = view.running or None
    if back is None and view.last_good is not None and view.last_good.number != released.number:
        back = view.last_good.config
    if back is None:
        return None  # nothing known to go back to: the version stays, the report says why
    return Decision(
        "rollback",
        "refused_by_job",
        f"the job could not run version {released.number} ({view.refused}); back to the "
        "config it runs",
        version=released.number,
        config=dict(back),
    )


def _held_by_freeze(policy: ActuationPolicy, view: View, goal: Version) -> Decision | None:
    """The freeze counts from the last release. A study's outcome is never held by it, and
    its trials only with ``freeze_study_trials`` (the study times its own trials)."""
    if goal.role == "study_outcome" or (
        goal.role == "study_trial" and not policy.freeze_study_trials
    ):
        return None
    if view.changed_at is None or view.now >= view.changed_at + policy.freeze_s:
        return None
    return Decision(
        "wait",
        "frozen",
        f"no change for {policy.freeze_s:g}s after the last one",
        retry_at=view.changed_at + policy.freeze_s,
    )


def _held_by_approval(policy: ActuationPolicy, view: View, goal: Version) -> Decision | None:
    """An outcome needs no approval: it is the pre-study config or a trial already released."""
    if (
        not policy.require_approval
        or goal.role == "study_outcome"
        or (view.approved_version or 0) >= goal.number
    ):
        return None
    return Decision(
        "wait",
        "awaiting_approval",
        f"desired version {goal.number} waits for approval",
    )


def _held_for_baseline(policy: ActuationPolicy, view: View) -> Decision | None:
    """The job reports measurements, but too few yet of the running config to verify a
    change against (it just changed, or its measurements are late)."""
    verify, before = policy.verify, view.before
    if not verify.enabled or view.changed_at is None or before is None:
        return None
    hold_until = verify.due_at(view.changed_at) + GRACE_WINDOWS * verify.window_s
    if before.n >= verify.min_samples or view.now >= hold_until:
        return None
    return Decision(
        "wait",
        "measuring_baseline",
        "measuring the running config before changing it",
        retry_at=hold_until,
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
