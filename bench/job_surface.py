"""Time-to-target surfaces of the benchmark jobs: per-rank batch x sync period, fresh runs.

For each job named with ``--job`` (``teacher``, ``shapes``, ``charlm``, ``digits``: see
``tuneloop/demo/workloads``), every config of the grid runs ``--repeats`` times from fresh
weights to the job's target (``bench/job_runs.py``). Runs are interleaved: repeat ``r`` runs
every (job, config) once, in an order shuffled with seed ``r``, before repeat ``r + 1`` starts,
so that a slow spell of this shared machine spreads over the configs instead of landing on one;
repeat ``r`` uses seed ``r + 1`` for every config (the same initial weights and data order).
One control plane (``tuneloop up`` on a fresh SQLite store) receives the agents' metrics, as
in the demo and in ``bench/tuning_outcome.py``, whose fresh runs are the same runs.

Every run appends one JSON line to ``bench/data/jobs_<job>_runs.jsonl`` (with the host's
1-minute load average before and after it); ``--resume`` skips runs already there. At the end
``bench/data/jobs_<job>_surface.json`` is rewritten from all the job's runs and the table is
printed::

    .venv/bin/python bench/job_surface.py --job teacher,shapes,charlm --repeats 3
    .venv/bin/python bench/job_surface.py --job charlm --batches 16,32,64 --periods 1,2 --resume
    .venv/bin/python bench/job_surface.py --job shapes --analyze      # table only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from job_runs import data_file, eval_run, surface

from tuneloop.demo import workloads
from tuneloop.demo.processes import control_plane

DATA_DIR = Path(__file__).resolve().parent / "data"
BATCHES = (8, 16, 32, 64, 128)
PERIODS = (1, 2, 4, 8)


def runs_path(job: str) -> Path:
    return DATA_DIR / f"jobs_{job}_runs.jsonl"


def load_runs(job: str) -> list[dict[str, Any]]:
    path = runs_path(job)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def planned(
    jobs: list[str], batches: list[int], periods: list[int], repeats: int
) -> list[tuple[str, int, int, int]]:
    """(job, batch, period, seed) in run order: repeat by repeat, each shuffled."""
    order = []
    for repeat in range(repeats):
        block = [(j, b, k, repeat + 1) for j in jobs for b in batches for k in periods]
        random.Random(repeat).shuffle(block)
        order.extend(block)
    return order


def measure(args: argparse.Namespace) -> None:
    todo = planned(args.job, args.batches, args.periods, args.repeats)
    if args.resume:
        done = {
            (r["workload"], r["batch_size"], r["sync_period"], r["seed"])
            for job in args.job
            for r in load_runs(job)
        }
        todo = [run for run in todo if run not in done]
    else:
        for job in args.job:
            if runs_path(job).exists():
                sys.exit(f"{runs_path(job)} exists: pass --resume to add to it, or move it away")
    workdir = Path(tempfile.mkdtemp(prefix="tuneloop-surface-"))
    started = time.monotonic()
    say = print
    with control_plane(workdir, lambda line: say(line, flush=True)) as plane:
        for index, (job, batch, period, seed) in enumerate(todo, 1):
            config = {"batch_size": batch, "sync_period": period}
            data = data_file(job, workdir / "data")
            out = workdir / "runs" / f"{job}-b{batch}-k{period}-s{seed}"
            run = eval_run(plane, job, config, seed, data, out)
            run["host"] = {"nproc": os.cpu_count(), "python": platform.python_version()}
            with runs_path(job).open("a", encoding="utf-8") as log:
                log.write(json.dumps(run) + "\n")
            elapsed = time.monotonic() - started
            ttt = run["time_to_target_s"]
            print(
                f"[{index:3d}/{len(todo)}] {job:<8} b={batch:<4d} k={period:<2d} seed={seed} "
                + (f"{ttt:6.2f} s" if ttt is not None else "missed  ")
                + f" load {run['loadavg_1m_before']:.2f} [{elapsed / 60:.1f} min, eta "
                f"{elapsed / index * (len(todo) - index) / 60:.1f} min]",
                flush=True,
            )


def analyze(job: str) -> None:
    runs = load_runs(job)
    if not runs:
        print(f"{job}: no runs in {runs_path(job)}")
        return
    points = surface(runs)
    workload = workloads.get(job)
    loads = [r["loadavg_1m_before"] for r in runs]
    doc: dict[str, Any] = {
        "workload": job,
        "summary": workload.summary,
        "metric": workload.metric,
        "target": workload.target,
        "time_budget_s": workload.time_budget_s,
        "runs": len(runs),
        "loadavg_1m": {"min": min(loads), "max": max(loads), "mean": sum(loads) / len(loads)},
        "best": points[0].config,
        "configs": [asdict(p) for p in points],
    }
    (DATA_DIR / f"jobs_{job}_surface.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\n{job}: {workload.summary}")
    print(f"{'rank':>4} {'batch':>5} {'sync':>4} {'time to target (95% CI)':>24} {'reached':>8}")
    for rank, p in enumerate(points, 1):
        print(
            f"{rank:4d} {p.batch_size:5d} {p.sync_period:4d} "
            f"{p.time_to_target.fmt('s', 2):>24} {p.reached:4d}/{p.time_to_target.n:<3d}"
        )
    print(
        f"{len(runs)} runs; 1-minute load average before a run "
        f"{doc['loadavg_1m']['min']:.2f}..{doc['loadavg_1m']['max']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--job", required=True, help="comma-separated workload names")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)))
    parser.add_argument("--periods", default=",".join(map(str, PERIODS)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--analyze", action="store_true", help="only rewrite the surfaces")
    args = parser.parse_args()
    args.job = args.job.split(",")
    for job in args.job:
        try:
            workloads.get(job)
        except ValueError as exc:
            parser.error(f"--job: {exc}")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.periods = [int(k) for k in args.periods.split(",")]
    if not args.analyze:
        measure(args)
    for job in args.job:
        analyze(job)


if __name__ == "__main__":
    main()
