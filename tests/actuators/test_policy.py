"""The job actuator's policy, table-driven: one row per situation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from actuators.policy import (
    Stats,
    Version,
    View,
    decide,
    judge_change,
    verification_due,
)
from actuators.policy_config import ActuationPolicy, PolicyError

NOW = 10_000.0
V1 = Version(1, {"batch_size": 16, "sync_period": 1, "learning_rate": 0.1})
V2 = Version(2, {"batch_size": 256, "sync_period": 1, "learning_rate": 1.6})
V3 = Version(3, {"batch_size": 32, "sync_period": 2, "learning_rate": 0.4})
GOOD = Stats(mean=1000.0, stderr=5.0, n=30)


@dataclass
class Case:
    name: str
    view: dict[str, Any]
    expect: tuple[str, str]
    policy: dict[str, Any] = field(default_factory=dict)
    version: int | None = None
    config: dict[str, Any] | None = None


def settled(**extra: Any) -> dict[str, Any]:
    """V1 released long ago and verified; ``extra`` overrides."""
    return {"released": V1, "last_good": V1, "changed_at": NOW - 3600, **extra}


CASES = [
    Case("nothing desired yet", {"goal": None, "released": None}, ("none", "no_goal")),
    Case("in sync", settled(goal=V1), ("none", "in_sync")),
    Case("first config", {"goal": V1, "released": None}, ("release", "goal"), version=1),
    Case("new goal", settled(goal=V3), ("release", "goal"), version=3),
    Case(
        "goal out of bounds",
        settled(goal=V2),
        ("refuse", "out_of_bounds"),
        policy={"bounds": {"batch_size": {"max": 128}}},
        version=2,
    ),
    Case(
        "goal outside a list bound",
        settled(goal=Version(4, {"optimizer": "lion"})),
        ("refuse", "out_of_bounds"),
        policy={"bounds": {"optimizer": ["sgd", "adam"]}},
        version=4,
    ),
    Case(
        "frozen after a change",
        settled(goal=V3, changed_at=NOW - 10),
        ("wait", "frozen"),
        policy={"freeze_s": 60},
    ),
    Case(
        "freeze over",
        settled(goal=V3, changed_at=NOW - 61),
        ("release", "goal"),
        policy={"freeze_s": 60},
        version=3,
    ),
    Case(
        "a study's trial is not spaced by the freeze",
        settled(goal=replace(V3, role="study_trial"), changed_at=NOW - 10),
        ("release", "study_trial"),
        policy={"freeze_s": 60},
        version=3,
    ),
    Case(
        "a study's trial spaced by the freeze when asked",
        settled(goal=replace(V3, role="study_trial"), changed_at=NOW - 10),
        ("wait", "frozen"),
        policy={"freeze_s": 60, "freeze_study_trials": True},
    ),
    Case(
        "a study's trial is released whole, not stepped",
        settled(goal=replace(V2, role="study_trial")),
        ("release", "study_trial"),
        policy={"max_change": {"batch_size": 2}},
        version=2,
    ),
    Case(
        "a study's outcome waits for neither freeze nor approval",
        settled(goal=replace(V3, role="study_outcome"), changed_at=NOW - 10, approved_version=1),
        ("release", "study_outcome"),
        policy={"freeze_s": 60, "require_approval": True, "freeze_study_trials": True},
        version=3,
    ),
    Case(
        "a released trial is never verified nor confirmed",
        {
            "goal": replace(V2, role="study_trial"),
            "released": replace(V2, role="study_trial"),
            "last_good": V1,
            "changed_at": NOW - 1,
            "baseline": GOOD,
        },
        ("none", "in_sync"),
    ),
    Case(
        "awaiting approval",
        settled(goal=V3, approved_version=2),
        ("wait", "awaiting_approval"),
        policy={"require_approval": True},
    ),
    Case(
        "approved",
        settled(goal=V3, approved_version=3),
        ("release", "goal"),
        policy={"require_approval": True},
        version=3,
    ),
    Case(
        "dry run",
        settled(goal=V3),
        ("dry_run", "dry_run"),
        policy={"dry_run": True},
        version=3,
        config=dict(V3.config),
    ),
    Case(
        "a big jump is stepped, lr along",
        settled(goal=V2),
        ("step", "max_change"),
        policy={"max_change": {"batch_size": 2}},
        version=2,
        config={"batch_size": 32, "sync_period": 1, "learning_rate": 0.2},
    ),
    Case(
        "a big drop is stepped",
        settled(released=V2, last_good=V2, goal=Version(5, {"batch_size": 16})),
        ("step", "max_change"),
        policy={"max_change": {"batch_size": 4}},
        version=5,
        config={"batch_size": 64},
    ),
    Case(
        "within one step: the goal itself",
        settled(goal=V3),
        ("release", "goal"),
        policy={"max_change": {"batch_size": 2, "sync_period": 2}},
        version=3,
    ),
    Case(
        "integers always move",
        settled(goal=Version(6, {"batch_size": 20})),
        ("step", "max_change"),
        policy={"max_change": {"batch_size": 1.01}},
        version=6,
        config={"batch_size": 17},
    ),
    Case(
        "verifying",
        settled(goal=V3, released=V3, changed_at=NOW - 10, baseline=GOOD),
        ("wait", "verifying"),
        policy={"verify": {"settle_s": 5, "window_s": 30}},
    ),
    Case(
        "worse beyond the noise: roll back",
        settled(
            goal=V3,
            released=V3,
            changed_at=NOW - 40,
            baseline=GOOD,
            after=Stats(900.0, 5.0, 30),
        ),
        ("rollback", "objective_worse"),
        policy={"verify": {"settle_s": 5, "window_s": 30}},
        version=3,
        config=dict(V1.config),
    ),
    Case(
        "the job could not run it: roll back at once",
        settled(
            goal=V3,
            released=V3,
            changed_at=NOW - 1,
            baseline=GOOD,
            refused="power_limit_w: GPU 0 refused 250 W: Insufficient Permissions",
        ),
        ("rollback", "refused_by_job"),
        version=3,
        config=dict(V1.config),
    ),
    Case(
        "refused after it was kept: back to the config the job says it runs",
        settled(goal=V3, released=V3, last_good=V3, refused="failed", running={"batch_size": 8}),
        ("rollback", "refused_by_job"),
        policy={"verify": {"enabled": False}},
        version=3,
        config={"batch_size": 8},
    ),
    Case(
        "refused, kept, and nothing known to go back to: stays",
        settled(goal=V3, released=V3, last_good=V3, refused="failed"),
        ("none", "in_sync"),
    ),
    Case(
        "a study's trial the job could not run is the study's to handle",
        settled(
            goal=Version(3, V3.config, "study_trial"),
            released=Version(3, V3.config, "study_trial"),
            refused="oom",
            running=V1.config,
        ),
        ("none", "in_sync"),
    ),
    Case(
        "worse within the noise: keep",
        settled(
            goal=V3,
            released=V3,
            changed_at=NOW - 40,
            baseline=GOOD,
            after=Stats(990.0, 5.0, 30),
        ),
        ("confirm", "verified"),
        policy={"verify": {"settle_s": 5, "window_s": 30}},
        version=3,
    ),
    Case(
        "minimized objective went up: roll back",
        settled(
            goal=V3,
            released=V3,
            changed_at=NOW - 40,
            baseline=Stats(0.020, 0.0005, 30),
            after=Stats(0.030, 0.0005, 30),
        ),
        ("rollback", "objective_worse"),
        policy={"verify": {"metric": "tuneloop_step_duration_seconds", "direction": "minimize"}},
        version=3,
        config=dict(V1.config),
    ),
    Case(
        "too few measurements yet: wait for late ones",
        settled(
            goal=V3, released=V3, changed_at=NOW - 40, baseline=GOOD, after=Stats(10.0, 1.0, 2)
        ),
        ("wait", "awaiting_measurements"),
    ),
    Case(
        "still too few a window later: kept unverified",
        settled(
            goal=V3, released=V3, changed_at=NOW - 96, baseline=GOOD, after=Stats(10.0, 1.0, 2)
        ),
        ("confirm", "unverified"),
        version=3,
    ),
    Case(
        "no baseline: kept unverified",
        settled(goal=V3, released=V3, changed_at=NOW - 1),
        ("confirm", "unverified"),
        version=3,
    ),
    Case(
        "verification off",
        settled(goal=V3, released=V3, changed_at=NOW - 1, baseline=GOOD),
        ("confirm", "unverified"),
        policy={"verify": {"enabled": False}},
        version=3,
    ),
    Case(
        "nothing good to go back to",
        {
            "goal": V3,
            "released": V3,
            "changed_at": NOW - 100,
            "baseline": GOOD,
            "after": Stats(1.0, 1.0, 30),
        },
        ("confirm", "verified"),
        version=3,
    ),
    Case(
        "measurements too few for a baseline: wait",
        settled(goal=V3, changed_at=NOW - 10, before=Stats(900.0, 5.0, 2)),
        ("wait", "measuring_baseline"),
    ),
    Case(
        "a job without measurements is not held",
        settled(goal=V3, changed_at=NOW - 10),
        ("release", "goal"),
        version=3,
    ),
    Case(
        "verification holds a new goal",
        settled(goal=V2, released=V3, changed_at=NOW - 1, baseline=GOOD),
        ("wait", "verifying"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    policy = ActuationPolicy.from_dict(case.policy)
    decision = decide(policy, View(now=NOW, **case.view))
    assert (decision.action, decision.reason) == case.expect, decision.message
    assert decision.version == case.version
    if case.config is not None:
        assert decision.config is not None
        assert decision.config.keys() == case.config.keys()
        for key, value in case.config.items():
            assert decision.config[key] == pytest.approx(value), key
    elif decision.action not in ("dry_run",):
        assert decision.config is None


def test_acting_on_a_decision_gives_no_second_action() -> None:
    """Release, then the same view with the release recorded: only waiting or nothing."""
    policy = ActuationPolicy.from_dict({"freeze_s": 60})
    view = View(now=NOW, **settled(goal=V3))
    assert decide(policy, view).action == "release"
    after = View(now=NOW, goal=V3, released=V3, last_good=V1, changed_at=NOW, baseline=GOOD)
    assert decide(policy, after).action == "wait"
    confirmed = View(now=NOW + 3600, goal=V3, released=V3, last_good=V3, changed_at=NOW)
    assert decide(policy, confirmed).action == "none"


def test_frozen_wait_says_when() -> None:
    policy = ActuationPolicy.from_dict({"freeze_s": 60})
    decision = decide(policy, View(now=NOW, **settled(goal=V3, changed_at=NOW - 10)))
    assert decision.retry_at == NOW + 50


def test_verification_due_only_after_the_window() -> None:
    policy = ActuationPolicy.from_dict({"verify": {"settle_s": 5, "window_s": 30}})
    pending = settled(goal=V3, released=V3, baseline=GOOD)
    assert not verification_due(policy, View(now=NOW, **{**pending, "changed_at": NOW - 34}))
    assert verification_due(policy, View(now=NOW, **{**pending, "changed_at": NOW - 35}))
    assert not verification_due(policy, View(now=NOW, **settled(goal=V1)))


def test_judge_change_noise_is_the_difference_of_two_means() -> None:
    verify = ActuationPolicy.from_dict({"verify": {"noise_sigmas": 2}}).verify
    worse, loss, noise = judge_change(Stats(100, 3, 10), Stats(89, 4, 10), verify)
    assert (worse, loss, noise) == (True, 11, pytest.approx(10.0))
    assert judge_change(Stats(100, 3, 10), Stats(91, 4, 10), verify)[0] is False
    assert judge_change(Stats(100, math.inf, 2), Stats(1, 1, 10), verify)[0] is False


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"bounds": {"b": {"min": 9, "max": 1}}}, "bounds.b: min 9 is above max 1"),
        ({"bounds": {"b": []}}, "bounds.b: an empty list allows nothing"),
        ({"bounds": {"b": {"low": 1}}}, "bounds.b: unknown field(s) ['low']"),
        ({"bounds": {"b": {"max": "big"}}}, "bounds.b.max must be a finite number"),
        ({"max_change": {"b": 1}}, "max_change.b must be a factor > 1"),
        ({"freeze_s": -1}, "freeze_s must be >= 0"),
        ({"dry_run": "yes"}, "dry_run must be true or false"),
        ({"verify": {"direction": "up"}}, "verify.direction must be maximize or minimize"),
        ({"verify": {"window_s": 0}}, "verify.window_s must be > 0"),
        ({"verify": {"min_samples": 1}}, "verify.min_samples must be an integer >= 2"),
        ({"freeze": 1}, "unknown policy field(s) ['freeze']"),
    ],
)
def test_invalid_policies_name_the_problem(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=None) as raised:
        ActuationPolicy.from_dict(policy)
    assert message in str(raised.value)


def test_policy_round_trips() -> None:
    data = {
        "bounds": {"batch_size": {"min": 8, "max": 512}, "opt": ["sgd", "adam"]},
        "max_change": {"batch_size": 2.0},
        "freeze_s": 30.0,
        "dry_run": True,
        "require_approval": True,
    }
    policy = ActuationPolicy.from_dict(data)
    assert ActuationPolicy.from_dict(policy.to_dict()) == policy
    assert policy.bound_problems({"batch_size": 4, "opt": "sgd", "free": 1}) == [
        "batch_size=4 is below its minimum 8"
    ]
    assert policy.bound_problems({"batch_size": True}) == ["batch_size=True is not a number"]
