"""The input-bound job's study over its loader knobs, started from its diagnosis, under a real
``tuneloop up``; then the default and the tuned loader measured in fresh, interleaved runs.

The job is the input-bound verdict job (``tuneloop/demo/verdict_jobs.py``: the demo's real
2-rank PyTorch DDP job, gloo, CPU, digits) loading through a real ``DataLoader`` whose every
batch pays ``--input-delay-ms`` of emulated I/O latency (a sleep in the worker that fetches it:
no CPU, so more workers hide it even on two cores), starting on ``num_workers=0``. It declares
``loader_workers`` (0..6) and ``prefetch_factor`` (1..4) when its agent registers. The bench:

1. waits for ``GET .../diagnosis`` to say ``input_bound``;
2. ``POST .../studies/from-diagnosis`` (the study searches exactly the loader knobs, for
   throughput) and follows it until it completes, reading the config it left the job on;
3. times ``--repeats`` fresh runs of the default and of the tuned loader, interleaved, each
   ``--run-s`` seconds of training (throughput: global samples/s after the warm-up steps);
4. prints medians, means with 95% t intervals, the 95% Welch interval of the difference, and
   the 1-minute load average before and after::

    .venv/bin/python bench/loader_study.py --out bench/data/loader_study.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from tuneloop.demo import verdict_jobs
from tuneloop.demo.processes import (
    ControlPlane,
    DemoError,
    RunningJob,
    check_response,
    control_plane,
    start_job,
    until,
)
from tuneloop.demo.stats import mean_interval, welch_faster

JOB = verdict_jobs.JOBS["input"]
NAME = "input-bound"
DEFAULT = {"loader_workers": 0, "prefetch_factor": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="the study's trials [8]")
    parser.add_argument("--seed", type=int, default=0, help="the study's seed [0]")
    parser.add_argument("--repeats", type=int, default=6, help="fresh runs per config [6]")
    parser.add_argument("--run-s", type=float, default=10.0, help="each run's training [10]")
    parser.add_argument("--dir", type=Path, default=None, help="keep everything here [temp]")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def loader_args(knobs: dict[str, Any]) -> list[str]:
    return [
        "--loader-workers",
        str(knobs["loader_workers"]),
        "--loader-prefetch",
        str(knobs["prefetch_factor"]),
    ]


def study(
    plane: ControlPlane, data: Path, workdir: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """Run the job, wait for its input-bound verdict, tune it from the diagnosis; returns the
    loader knobs the study left the job on and the study's trials."""
    client = plane.client()
    job_url = f"{plane.jobs_url}/{NAME}"
    check_response(
        client.post(plane.jobs_url, json={"name": NAME, "status": "running"}), "create the job"
    )
    stop = workdir / "tune" / "stop"
    job = start_job(
        plane,
        NAME,
        "tune",
        data,
        workdir / "tune",
        [*JOB.args, *loader_args(DEFAULT), "--stop-file", str(stop)],
    )
    try:
        found = until(
            lambda: _verdict(client, job_url, job, "input_bound"), 180, "an input-bound verdict"
        )
        print(f"diagnosis: {found['verdict']}: {found['summary']}", flush=True)
        body = {
            "name": "loader",
            "window": "30s",
            "strategy": "bayesian",
            "seed": args.seed,
            "max_trials": args.trials,
            "measurement": {"warmup_s": 3, "window_s": 8, "min_samples": 5, "max_rel_stderr": 0.05},
            "warm_start": False,
        }
        response = client.post(f"{job_url}/studies/from-diagnosis", json=body)
        check_response(response, "start the study from the diagnosis")
        created = response.json()
        print(f"study {created['id']}: {created['verdict']} -> {', '.join(created['knobs'])}")
        study_url = f"{job_url}/studies/{created['id']}"
        done = until(lambda: _ended(client, study_url, job), 1800, "the study to end", 2.0)
        if done["state"] != "complete":
            raise DemoError(f"the study ended {done['state']}: {done['end_reason']}")
        trials = client.get(f"{study_url}/trials", params={"limit": 500}).json()["items"]
        for trial in trials:
            value = trial.get("value")
            shown = f"{value:7.1f} samples/s" if value is not None else trial["state"]
            print(f"  trial {trial['number']:2d} {trial['params']}: {shown}")
        print(f"study complete: {done['end_reason']}")
        desired = client.get(f"{job_url}/config").json()["desired"]["config"]
        tuned = {k: int(desired[k]) for k in DEFAULT}
        return {"study": done, "trials": trials, "tuned": tuned}
    finally:
        stop.touch()
        try:
            job.wait(120)
        finally:
            job.kill()
            client.close()


def _verdict(client: Any, job_url: str, job: RunningJob, wanted: str) -> dict[str, Any] | None:
    job.check_alive()
    found: dict[str, Any] = client.get(f"{job_url}/diagnosis", params={"window": "30s"}).json()
    return found if found["verdict"] == wanted else None


def _ended(client: Any, study_url: str, job: RunningJob) -> dict[str, Any] | None:
    job.check_alive()
    found: dict[str, Any] = client.get(study_url).json()
    return found if found["state"] != "running" else None


def measure(
    plane: ControlPlane, data: Path, workdir: Path, configs: dict[str, dict[str, Any]], args: Any
) -> dict[str, list[float]]:
    """Fresh runs of each config, interleaved (a slow spell of the machine hits both alike)."""
    runs: dict[str, list[float]] = {label: [] for label in configs}
    client = plane.client()
    for repeat in range(args.repeats):
        for label, knobs in configs.items():
            out = workdir / "measure" / f"{label}-{repeat}"
            stop = out / "stop"
            name = f"{NAME}-{label}-{repeat}"
            job = start_job(
                plane,
                name,
                "tune",
                data,
                out,
                [*JOB.args, *loader_args(knobs), "--stop-file", str(stop), "--seed", str(repeat)],
            )
            try:
                # Trains from its agent's registration on; only warm steps are counted.
                started = partial(_registered, client, f"{plane.jobs_url}/{name}", job)
                until(started, 120, f"{name} to start")
                time.sleep(args.run_s)
            finally:
                stop.touch()
            result = job.wait(120)
            runs[label].append(float(result["throughput_samples_s"]))
            print(
                f"  run {repeat + 1}/{args.repeats} {label:>7} {knobs}: "
                f"{runs[label][-1]:7.1f} samples/s",
                flush=True,
            )
    return runs


def _registered(client: Any, job_url: str, job: RunningJob) -> bool:
    job.check_alive()
    response = client.get(f"{job_url}/config")
    return response.status_code == 200 and response.json()["observed"] is not None


def summarize(runs: dict[str, list[float]]) -> dict[str, Any]:
    default, tuned = runs["default"], runs["tuned"]
    gain = welch_faster(default, tuned)  # mean(tuned) - mean(default), samples/s
    summary: dict[str, Any] = {
        label: {
            "median": statistics.median(values),
            "mean": mean_interval(values).mean,
            "ci95": [mean_interval(values).low, mean_interval(values).high],
            "runs": values,
        }
        for label, values in runs.items()
    }
    summary["tuned_over_default_median"] = statistics.median(tuned) / statistics.median(default)
    summary["difference"] = {"mean": gain.difference, "ci95": [gain.low, gain.high]}
    summary["beyond_noise"] = gain.low > 0
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tuneloop-loader-study-") as tmp:
        workdir = args.dir or Path(tmp)
        data = verdict_jobs.data_file(JOB.workload, workdir / "data")
        with control_plane(workdir, say=print) as plane:
            tuned = study(plane, data, workdir, args)
            configs = {"default": DEFAULT, "tuned": tuned["tuned"]}
            print(f"measuring {args.repeats} fresh runs each of {configs}", flush=True)
            runs = measure(plane, data, workdir, configs, args)
    summary = summarize(runs)
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "job": {"args": list(JOB.args), "default": DEFAULT},
        "study": {
            "end_reason": tuned["study"]["end_reason"],
            "trials": [
                {"params": t["params"], "value": t.get("value"), "state": t["state"]}
                for t in tuned["trials"]
            ],
        },
        "tuned": tuned["tuned"],
        "measured": summary,
        "repeats": args.repeats,
        "run_s": args.run_s,
        "wall_s": round(time.monotonic() - started, 1),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
    }
    d, t = summary["default"], summary["tuned"]
    for label, row in (("default", d), ("tuned", t)):
        low, high = row["ci95"]
        print(
            f"{label} {configs[label]}: median {row['median']:.1f} samples/s, "
            f"mean {row['mean']:.1f} (95% CI {low:.1f}..{high:.1f})"
        )
    diff = summary["difference"]
    print(
        f"tuned / default (medians) {summary['tuned_over_default_median']:.2f}; difference "
        f"{diff['mean']:+.1f} samples/s, 95% CI [{diff['ci95'][0]:+.1f}, {diff['ci95'][1]:+.1f}]"
        f" ({'beyond' if summary['beyond_noise'] else 'within'} the noise)"
    )
    print(f"load average (1 m) {load_before:.2f} before, {result['loadavg_1m_after']:.2f} after")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if summary["beyond_noise"] else 1


if __name__ == "__main__":
    sys.exit(main())
