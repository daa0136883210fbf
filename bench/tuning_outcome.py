"""The tuning loop on a job it has never seen, run as a user runs it, and what it gained.

For one benchmark job (``--job``: ``teacher``, ``shapes``, ``charlm`` or ``digits``; see
``tuneloop/demo/workloads`` and ``docs/demo.md``):

1. ``tuneloop up`` as a child process on a fresh SQLite store, a member token (the person) and
   an agent token (the job), as the demo starts it;
2. the job is created (``POST /jobs``, member token) and its 2 DDP ranks start with the agent
   from a poor config (``--start``, batch 4 per rank, sync every step);
3. once its step timings are in, a study is created through the REST API with what a user
   writes: a name, the objective (goodput), the space (batch and sync period, the job's
   learning-rate rule) and ``max_trials``: **default measurement settings**; the study is
   followed until it ends, whatever its end state; the job is stopped once it runs the config
   the study left it on (the *tuned* config, read from the job itself);
4. fresh runs of the start config, the hand-picked default (batch 32, sync every step) and the
   tuned config to the job's target, interleaved, ``--repeats`` each (``bench/job_runs.py``);
5. the table: time to target with 95% t intervals, the tuned config's speed-up over the default
   and over the start with Welch's 95% interval of the difference, and the tuned config's rank
   and speed fraction on the job's measured surface (``bench/data/jobs_<job>_surface.json``
   from ``bench/job_surface.py``), with the host's load.

``--load N`` starts N CPU-burning processes (``while True: pass``) beside the job for the whole
run (killed at the end): the loaded condition.

    .venv/bin/python bench/tuning_outcome.py --job shapes --out /tmp/shapes.json
    .venv/bin/python bench/tuning_outcome.py --job shapes --load 1 --out /tmp/shapes-loaded.json
    .venv/bin/python bench/tuning_outcome.py --job teacher --quick   # a check, see --help
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from job_runs import data_file, eval_run, place, surface
from tuning_outcome_report import ConfigOutcome, as_json, table

from tuneloop.demo import workloads
from tuneloop.demo.processes import (
    ControlPlane,
    DemoError,
    RunningJob,
    check_response,
    config_args,
    control_plane,
    create_study_when_ready,
    start_job,
    until,
)

DATA_DIR = Path(__file__).resolve().parent / "data"
DEFAULT = {"batch_size": 32, "sync_period": 1}
"""The hand-picked default: 32 samples per device, synchronizing every step."""


def say(line: str) -> None:
    print(line, flush=True)


@contextmanager
def cpu_burners(count: int) -> Iterator[None]:
    """``count`` processes that keep a core busy each, until the block ends."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


QUICK_MEASUREMENT = {"warmup_s": 5.0, "window_s": 15.0, "max_extensions": 1}
"""``--quick`` only: short trials to check the harness end to end, not default settings."""


def study_body(job: str, trials: int, measurement: Mapping[str, float]) -> dict[str, Any]:
    """What a user writes: name, objective, space and max_trials; the measurement settings are
    left to their defaults unless ``measurement`` names some (``--quick``)."""
    workload = workloads.get(job)
    body: dict[str, Any] = {
        "name": f"{job}-goodput",
        "objective": "goodput",
        "space": {
            "batch_size": [4, 128],
            "sync_period": [1, 4],
            "sync_powers_of_two": True,
            "lr_scaling": workload.lr_scaling,
            "base_lr": workload.base_lr,
            "base_batch": workload.base_batch,
        },
        "max_trials": trials,
    }
    if measurement:
        body["measurement"] = dict(measurement)
    return body


def follow(
    client: httpx.Client, study_url: str, job: RunningJob, timeout_s: float
) -> dict[str, Any]:
    """Print each trial as it ends; the study once it is no longer running, or as it stands
    after ``timeout_s`` (still ``running``: the table then measures the config the job is on)."""
    shown: set[int] = set()
    started = time.monotonic()
    while True:
        job.check_alive()
        trials = client.get(f"{study_url}/trials", params={"limit": 500}).json()["items"]
        for trial in trials:
            if trial["state"] != "running" and trial["number"] not in shown:
                shown.add(trial["number"])
                value = trial.get("value")
                outcome = f"goodput {value:8.0f}" if value is not None else trial["state"]
                reason = f" ({trial['reason']})" if trial.get("reason") else ""
                say(
                    f"  [{(time.monotonic() - started) / 60:4.1f} min] trial {trial['number']:2d}"
                    f" batch {trial['params'].get('batch_size')}, sync every "
                    f"{trial['params'].get('sync_period')}: {outcome}{reason}"
                )
        study: dict[str, Any] = client.get(study_url).json()
        if study["state"] != "running":
            return study
        if time.monotonic() - started > timeout_s:
            say(f"warning: the study is still running after {timeout_s:.0f} s (--study-timeout-s)")
            return study
        time.sleep(2.0)


def tune(
    plane: ControlPlane, args: argparse.Namespace, data: Path, workdir: Path
) -> dict[str, Any]:
    """Steps 2 and 3: the live job and its study; what the study ended as and the tuned config."""
    client = plane.client()
    job_url = f"{plane.jobs_url}/{args.job}"
    check_response(
        client.post(plane.jobs_url, json={"name": args.job, "status": "running"}), "create the job"
    )
    stop = workdir / "tune" / "stop"
    job = start_job(
        plane,
        args.job,
        "tune",
        data,
        workdir / "tune",
        ["--workload", args.job, *config_args(args.start), "--stop-file", str(stop)],
    )
    say(
        f"job {args.job!r}: 2 ranks started from batch {args.start['batch_size']}, "
        f"sync every {args.start['sync_period']}"
    )
    started = time.monotonic()
    try:
        body = study_body(args.job, args.trials, args.measurement)
        study = create_study_when_ready(client, job_url, body, job, timeout_s=180, interval_s=2.0)
        settings = f"measurement {args.measurement}" if args.measurement else "default measurement"
        say(f"study {study['id']} created ({settings}, {args.trials} trials)")
        study = follow(client, f"{job_url}/studies/{study['id']}", job, args.study_timeout_s)
        reason = study.get("end_reason") or ""
        say(f"study {study['state']} after {(time.monotonic() - started) / 60:.1f} min {reason}")
        best_response = client.get(f"{job_url}/studies/{study['id']}/best")
        best = best_response.json() if best_response.status_code == 200 else None

        def settled() -> bool:
            job.check_alive()
            return bool(client.get(f"{job_url}/config").json()["in_sync"])

        try:
            until(settled, 120, "the job to run the config the study left it on")
        except DemoError as exc:
            say(f"warning: {exc}")
    finally:
        stop.touch()
    result = job.wait(120)
    tuned = {k: int(result["config"][k]) for k in ("batch_size", "sync_period")}
    say(f"the job ended on batch {tuned['batch_size']}, sync every {tuned['sync_period']}")
    return {
        "study": study,
        "best": best,
        "study_minutes": (time.monotonic() - started) / 60,
        "tuned": tuned,
    }


def measure(
    plane: ControlPlane,
    args: argparse.Namespace,
    configs: Mapping[str, Mapping[str, int]],
    data: Path,
    workdir: Path,
) -> dict[str, list[dict[str, Any]]]:
    """Step 4: ``args.repeats`` fresh runs of each config, interleaved."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in configs}
    for repeat in range(args.repeats):
        for label, config in configs.items():
            out = workdir / "measure" / f"{label}-{repeat}"
            run = eval_run(plane, args.job, config, args.seed + repeat + 1, data, out)
            runs[label].append(run)
            ttt = run["time_to_target_s"]
            say(
                f"  run {repeat + 1}/{args.repeats} {label:>8} {config['batch_size']:>4} x "
                f"{config['sync_period']}: "
                + (f"{ttt:6.2f} s to target" if ttt is not None else "target not reached")
                + f" (load {run['loadavg_1m_before']:.2f})"
            )
    return runs


def outcome(args: argparse.Namespace) -> dict[str, Any]:
    workload = workloads.get(args.job)
    workdir = args.dir or Path(tempfile.mkdtemp(prefix=f"tuneloop-outcome-{args.job}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = data_file(args.job, workdir / "data")
    say(f"{args.job}: {workload.summary}; directory {workdir}")
    surface_runs = _surface_runs(args.job)
    started = time.monotonic()
    with cpu_burners(args.load), control_plane(workdir, say) as plane:
        if args.load:
            say(f"{args.load} CPU burner(s) running beside the job")
        tuning = tune(plane, args, data, workdir)
        configs = contenders(args, tuning["tuned"], surface_runs)
        say(f"fresh runs to the target, {args.repeats} of each config, interleaved")
        runs = measure(plane, args, configs, data, workdir)
    outcomes = [ConfigOutcome.of(label, configs[label], runs[label]) for label in configs]
    placement = (
        place(surface(surface_runs), outcomes[-1].time_to_target.mean) if surface_runs else None
    )
    loads = [run["loadavg_1m_before"] for group in runs.values() for run in group]
    load = {"min": min(loads), "max": max(loads), "burners": float(args.load)}
    target = workload.fmt_score(workload.target)
    lines, speedups = table(outcomes, target, placement, load)
    return {
        "job": args.job,
        "load_burners": args.load,
        "workdir": str(workdir),
        "wall_minutes": (time.monotonic() - started) / 60,
        "tuning": tuning,
        "placement": None if placement is None else placement.__dict__,
        "loadavg_1m": load,
        **as_json(outcomes, speedups),
        "runs": runs,
        "report": lines,
    }


def contenders(
    args: argparse.Namespace, tuned: Mapping[str, int], surface_runs: list[dict[str, Any]]
) -> dict[str, Mapping[str, int]]:
    """The configs of the fresh runs, the tuned one last. With ``--with-best`` the surface's
    best config runs too (unless it is the default or the tuned one), so that the tuned
    config's fraction of the best speed is measured in the same run, under the same load."""
    configs: dict[str, Mapping[str, int]] = {"start": args.start, "default": DEFAULT}
    if args.with_best and surface_runs:
        best = surface(surface_runs)[0].config
        if dict(best) not in (dict(DEFAULT), dict(tuned)):
            configs["best"] = best
    configs["tuned"] = tuned
    return configs


def _surface_runs(job: str) -> list[dict[str, Any]]:
    path = DATA_DIR / f"jobs_{job}_runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _config(text: str) -> dict[str, int]:
    batch, _, period = text.partition("x")
    return {"batch_size": int(batch), "sync_period": int(period or 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--job", required=True, choices=workloads.names())
    parser.add_argument("--trials", type=int, default=10, help="the study's max_trials")
    parser.add_argument("--repeats", type=int, default=5, help="fresh runs of each config")
    parser.add_argument("--start", type=_config, default=_config("4x1"), help="BATCHxSYNC")
    parser.add_argument("--load", type=int, default=0, help="CPU burners beside the job")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--study-timeout-s", type=float, default=3600.0)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a check that it all works: 3 trials of 5 s warm-up + 15 s window, 2 runs each",
    )
    parser.add_argument(
        "--with-best",
        action="store_true",
        help="also run the surface's best config fresh, beside the others",
    )
    parser.add_argument("--dir", type=Path, default=None, help="empty directory [a new one]")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    args.measurement = {}
    if args.quick:
        args.trials, args.repeats, args.measurement = 3, 2, QUICK_MEASUREMENT
    try:
        result = outcome(args)
    except DemoError as exc:
        sys.exit(f"tuning_outcome: {exc}")
    print()
    for line in result["report"]:
        print(line)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, default=str))
        print(f"(results: {args.out})")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
