"""The demo's driver: start the control plane, tune the job live, measure the outcome.

1. **Control plane**: ``tuneloop up`` as a child process on the embedded default (a SQLite
   file in the demo's directory, in-process periodic tasks, no servers), with the tuner and
   actuator loops ticking every half second; a project ``demo`` with a member token (for the
   person) and an agent token (for the job).
2. **Tune**: the 2-rank DDP job (:mod:`tuneloop.demo.job`) starts from a deliberately poor
   config; once its step timings arrive a study is created (goodput, Bayesian optimization)
   and the tuner and the actuator push each trial's config into the running job, which
   applies it at a step boundary on both ranks. When the study completes its best config is
   the job's desired config; the demo waits for the job to run it, then stops the job.
3. **Measure**: fresh training runs, from new weights, of the starting config, a hand-picked
   default and the tuned config, interleaved, ``repeats`` of each: time to the target
   validation accuracy (training time), throughput and goodput (throughput x the statistical
   efficiency of the run's effective batch at the gradient noise scale the run's agent
   estimated, the tuner's own objective), each as a mean with its 95% confidence interval.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tuneloop.demo import stats
from tuneloop.demo.processes import (
    WORLD_SIZE,
    ControlPlane,
    DemoError,
    RunningJob,
    Say,
    check_response,
    config_args,
    control_plane,
    create_study_when_ready,
    start_job,
    until,
)
from tuneloop.demo.stats import Interval

JOB = "digits"


@dataclass(frozen=True)
class DemoPlan:
    """What the demo runs. The defaults take about 10 minutes on 2 CPU cores."""

    trials: int = 12
    repeats: int = 8
    start: Mapping[str, int] = field(default_factory=lambda: {"batch_size": 4, "sync_period": 1})
    default: Mapping[str, int] = field(default_factory=lambda: {"batch_size": 32, "sync_period": 1})
    """The hand-picked default: 32 samples per device, synchronizing every step (PyTorch's
    examples' choice)."""
    batch_size: tuple[int, int] = (4, 64)
    sync_period: tuple[int, int] = (1, 4)
    """Effective batches up to 2 x 64 x 4 = 512: beyond that the square-root learning-rate rule
    no longer keeps this model's training stable (runs miss the target), which goodput's
    efficiency model cannot see (docs/demo.md)."""
    target_accuracy: float = 0.97
    time_budget_s: float = 40.0
    input_delay_ms: float = 2.0
    sync_latency_ms: float = 25.0
    warmup_s: float = 2.0
    window_s: float = 6.0
    tuned_run_s: float = 15.0
    """How long the live job keeps training on the tuned config before it stops."""
    seed: int = 0

    def job_args(self) -> list[str]:
        return [
            "--input-delay-ms",
            str(self.input_delay_ms),
            "--sync-latency-ms",
            str(self.sync_latency_ms),
        ]


@dataclass(frozen=True)
class Measured:
    """One config's fresh runs."""

    label: str
    config: Mapping[str, int]
    runs: list[dict[str, Any]]
    time_to_target: Interval
    throughput: Interval
    goodput: Interval
    reached: int


# --------------------------------------------------------------------------- tuning


def study_body(plan: DemoPlan) -> dict[str, Any]:
    from tuneloop.demo.job import BASE_BATCH, BASE_LR, LR_SCALING

    return {
        "name": "demo-goodput",
        "objective": "goodput",
        "strategy": "bayesian",
        "seed": plan.seed,
        "space": {
            "batch_size": list(plan.batch_size),
            "sync_period": list(plan.sync_period),
            "sync_powers_of_two": True,
            "lr_scaling": LR_SCALING,
            "base_lr": BASE_LR,
            "base_batch": BASE_BATCH,
        },
        # The agent exports step gauges about once a second: a window holds a few samples.
        "measurement": {
            "warmup_s": plan.warmup_s,
            "window_s": plan.window_s,
            "min_samples": 5,
            "max_rel_stderr": 0.05,
        },
        "ranks": WORLD_SIZE,
        "max_trials": plan.trials,
        "ack_timeout_s": 60,
        "warm_start": False,
    }


def tune(
    plane: ControlPlane, plan: DemoPlan, data: Path, workdir: Path, say: Say
) -> dict[str, int]:
    """Tune the live job; returns the config the study left it on."""
    client = plane.client()
    job_url = f"{plane.jobs_url}/{JOB}"
    response = client.post(plane.jobs_url, json={"name": JOB, "status": "running"})
    check_response(response, "create the job")
    bounds = {
        "batch_size": {"min": plan.batch_size[0], "max": plan.batch_size[1]},
        "sync_period": {"min": plan.sync_period[0], "max": plan.sync_period[1]},
    }
    # Verification stays on (the default): it leaves a study's own trials to the study.
    policy = {"bounds": bounds}
    check_response(client.put(f"{job_url}/actuator", json=policy), "set the actuator policy")
    stop = workdir / "tune" / "stop"
    job = start_job(
        plane,
        JOB,
        "tune",
        data,
        workdir / "tune",
        [*config_args(plan.start), "--stop-file", str(stop), *plan.job_args()],
    )
    say(f"job {JOB!r}: 2 ranks started from the poor config {_fmt(plan.start)}")
    try:
        study = create_study_when_ready(
            client, job_url, study_body(plan), job, timeout_s=120, interval_s=1.0
        )
        say(
            f"study {study['id']}: goodput, Bayesian optimization, {plan.trials} trials of "
            f"{plan.warmup_s:g} s warm-up + {plan.window_s:g} s window"
        )
        best = _follow(client, f"{job_url}/studies/{study['id']}", job, say)
        say(f"tuned config {_fmt(best)}; waiting for the job to run it")

        def running_best() -> bool:
            job.check_alive()
            return bool(client.get(f"{job_url}/config").json()["in_sync"])

        until(running_best, 90, "the job to acknowledge the tuned config")
        say(f"the job runs the tuned config; letting it train {plan.tuned_run_s:g} s more")
        deadline = time.monotonic() + plan.tuned_run_s
        while time.monotonic() < deadline:
            job.check_alive()
            time.sleep(0.5)
    finally:
        stop.touch()
    result = job.wait(120)
    say(f"job stopped after {result['steps']} steps, {len(result['history'])} config changes")
    _say_episodes(result.get("episodes") or [], say)
    return best


def _say_episodes(episodes: Sequence[Mapping[str, Any]], say: Say) -> None:
    """The live job's runs to the target, each with the config it ended on."""
    if not episodes:
        return
    say(f"live: the job reached the target {len(episodes)} times (weights reset each time):")
    for number, episode in enumerate(episodes, 1):
        say(
            f"  episode {number:2d} {episode['time_to_target_s']:6.2f} s to target, "
            f"ending on {_fmt(episode['config'])}"
        )


def _follow(client: httpx.Client, study_url: str, job: RunningJob, say: Say) -> dict[str, int]:
    """Print each trial as it finishes; once the study completes, return the config it left
    the job on."""
    shown: set[int] = set()
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        job.check_alive()
        for trial in client.get(f"{study_url}/trials", params={"limit": 500}).json()["items"]:
            if trial["state"] != "running" and trial["number"] not in shown:
                shown.add(trial["number"])
                value = trial.get("value")
                outcome = f"goodput {value:8.0f}" if value is not None else trial["state"]
                reason = f" ({trial['reason']})" if trial.get("reason") else ""
                say(f"  trial {trial['number']:2d} {_fmt(trial['params']):>22}  {outcome}{reason}")
        study = client.get(study_url).json()
        if study["state"] == "complete":
            # Not /best: the study applies its best only when it beat the starting config
            # beyond the noise, else it puts the job back. Measure what the job was left on.
            say(f"study complete: {study.get('end_reason') or 'done'}")
            job_url = study_url.rsplit("/studies/", 1)[0]
            desired = client.get(f"{job_url}/config").json()["desired"]["config"]
            return {k: int(desired[k]) for k in ("batch_size", "sync_period")}
        if study["state"] not in ("running",):
            reason = study.get("end_reason") or "see the audit log"
            raise DemoError(f"the study ended {study['state']}: {reason}")
        time.sleep(1.0)
    raise DemoError("the study did not complete in 30 minutes")


# --------------------------------------------------------------------------- measuring


def measure(
    plane: ControlPlane,
    plan: DemoPlan,
    configs: Mapping[str, Mapping[str, int]],
    data: Path,
    workdir: Path,
    say: Say,
) -> list[Measured]:
    """``plan.repeats`` fresh runs of each config, interleaved so that a slow spell of the
    machine hits every config alike."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in configs}
    for repeat in range(plan.repeats):
        for label, config in configs.items():
            job = start_job(
                plane,
                f"{JOB}-{label}",
                "eval",
                data,
                workdir / "measure" / f"{label}-{repeat}",
                [
                    *config_args(config),
                    "--seed",
                    str(plan.seed + repeat + 1),
                    "--target-accuracy",
                    str(plan.target_accuracy),
                    "--time-budget-s",
                    str(plan.time_budget_s),
                    *plan.job_args(),
                ],
            )
            result = job.wait(plan.time_budget_s * 3 + 120)
            runs[label].append(result)
            ttt = result["time_to_target_s"]
            say(
                f"  run {repeat + 1}/{plan.repeats} {label:>8} {_fmt(config):>22}: "
                + (f"{ttt:6.2f} s to target" if ttt is not None else "target not reached")
                + f", {result['throughput_samples_s']:7.0f} samples/s"
            )
    return [_summarize(label, configs[label], runs[label], plan) for label in configs]


def run_goodput(run: Mapping[str, Any]) -> float | None:
    """The tuner's objective for one run: its throughput x the statistical efficiency of its
    effective batch at the noise scale its agent estimated."""
    from tuneloop.demo.job import BASE_BATCH
    from tuner.objectives import goodput

    if run.get("noise_scale") is None or run.get("throughput_samples_s") is None:
        return None
    return goodput(
        run["throughput_samples_s"], run["effective_batch"], run["noise_scale"], BASE_BATCH
    )


def _summarize(
    label: str, config: Mapping[str, int], runs: list[dict[str, Any]], plan: DemoPlan
) -> Measured:
    reached = [r["time_to_target_s"] for r in runs if r["time_to_target_s"] is not None]
    # A run that missed the target counts at the budget: a lower bound, never flattering.
    times = [
        r["time_to_target_s"] if r["time_to_target_s"] is not None else plan.time_budget_s
        for r in runs
    ]
    goodputs = [g for g in map(run_goodput, runs) if g is not None]
    return Measured(
        label=label,
        config=dict(config),
        runs=runs,
        time_to_target=stats.mean_interval(times),
        throughput=stats.mean_interval([r["throughput_samples_s"] for r in runs]),
        goodput=stats.mean_interval(goodputs),
        reached=len(reached),
    )


# --------------------------------------------------------------------------- report


def report(measured: Sequence[Measured], plan: DemoPlan) -> list[str]:
    """The before/after table and the verdicts."""
    lines = [
        f"{'config':>8} {'batch x sync':>13} {'time to ' + format(plan.target_accuracy, '.0%'):>17}"
        f" {'throughput/s':>16} {'goodput/s':>16}",
    ]
    for m in measured:
        shape = f"{m.config['batch_size']} x {m.config['sync_period']}"
        missed = "" if m.reached == len(m.runs) else f" ({len(m.runs) - m.reached} missed)"
        lines.append(
            f"{m.label:>8} {shape:>13} {m.time_to_target.fmt('s', 2):>17}"
            f" {m.throughput.fmt('', 0):>16} {m.goodput.fmt('', 0):>16}{missed}"
        )
    lines.append(
        f"(means of {plan.repeats} fresh runs each, +- the half-width of the 95% confidence "
        "interval; time to target is training time, evaluation excluded)"
    )
    by_label = {m.label: m for m in measured}
    tuned = by_label.get("tuned")
    if tuned is not None:
        for other in (m for m in measured if m.label != "tuned"):
            lines.append(_verdict(tuned, other))
    return lines


def _verdict(tuned: Measured, other: Measured) -> str:
    faster = stats.welch_faster(
        [_ttt(r, tuned) for r in tuned.runs], [_ttt(r, other) for r in other.runs]
    )
    ratio = other.time_to_target.mean / tuned.time_to_target.mean
    word = "faster" if ratio >= 1 else "slower"
    sure = "by more than the measured noise" if faster.significant else "within the measured noise"
    return (
        f"tuned vs {other.label}: {ratio:.2f}x {word} to target, {sure} "
        f"(difference {faster.difference:.2f} s, 95% CI {faster.low:.2f} .. {faster.high:.2f} s)"
    )


def _ttt(run: Mapping[str, Any], m: Measured) -> float:
    value = run["time_to_target_s"]
    return float(value) if value is not None else float(m.time_to_target.high)


def _fmt(config: Mapping[str, Any]) -> str:
    return f"batch {config['batch_size']}, sync every {config['sync_period']}"


# --------------------------------------------------------------------------- all of it


def run_demo(plan: DemoPlan, workdir: Path | None, say: Say) -> dict[str, Any]:
    """The whole demo; returns what it measured (also written to ``workdir/demo.json``)."""
    from tuneloop.demo.job import save_digits

    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="tuneloop-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "digits.npz"
    save_digits(data)
    say(f"demo directory {workdir}")
    started = time.monotonic()
    with control_plane(workdir, say) as plane:
        say("phase 1: tuning the running job live")
        tuned = tune(plane, plan, data, workdir, say)
        configs = {"start": plan.start, "default": plan.default, "tuned": tuned}
        say(
            f"phase 2: {plan.repeats} fresh runs of each config to "
            f"{plan.target_accuracy:.0%} validation accuracy"
        )
        measured = measure(plane, plan, configs, data, workdir, say)
    lines = report(measured, plan)
    summary = {
        "plan": asdict(plan),
        "workdir": str(workdir),
        "wall_s": time.monotonic() - started,
        "configs": {
            m.label: {
                "config": m.config,
                "time_to_target_s": asdict(m.time_to_target),
                "throughput_samples_s": asdict(m.throughput),
                "goodput_samples_s": asdict(m.goodput),
                "reached": m.reached,
                "runs": m.runs,
            }
            for m in measured
        },
        "report": lines,
    }
    (workdir / "demo.json").write_text(json.dumps(summary, indent=1, default=_json_default))
    return summary


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON: {value!r}")
