"""Each verdict's training job under a real ``tuneloop up``, diagnosed through the API.

The jobs (``tuneloop/demo/verdict_jobs.py``) are the demo's real 2-rank PyTorch DDP job (gloo,
CPU, digits) with the agent: an input-bound one (a slow loader), a communication-bound one (an
emulated slow all-reduce), a compute-bound one (no emulated delay, large micro-batches), and
one whose rank 1 is slowed on purpose (a sleep in its forward pass). They run at the same time
against one control plane on a fresh SQLite store. The bench polls
``GET /api/v1/projects/demo/jobs/{job}/diagnosis`` (``--window``) every 2 s and records, per
job: the time from start to its first diagnosis with data (steady running), the time from
there and from the start to the first right verdict (with the slowed rank named, and no other),
and after ``--seconds`` from the start the last verdict, its phase shares and stragglers. The
1-minute load average is recorded before and after::

    .venv/bin/python bench/diagnosis_jobs.py --job all --seconds 90 --out diagnosis_jobs.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tuneloop.demo import verdict_jobs
from tuneloop.demo.processes import RunningJob, control_plane
from tuneloop.demo.verdict_jobs import JOBS, VerdictJob, Watch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--job", choices=[*JOBS, "all"], default="all")
    parser.add_argument(
        "--seconds", type=float, default=90, help="run each job this long at least [90]"
    )
    parser.add_argument("--window", default="30s", help="the diagnosis window [30s]")
    parser.add_argument(
        "--dir", type=Path, default=None, help="keep the store and the ranks' logs here [temp]"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    return parser.parse_args(argv)


def summary(watch: Watch, final: dict[str, Any]) -> dict[str, Any]:
    return {
        "job": watch.job.name,
        "expected": watch.job.verdict,
        "expected_straggler": watch.job.straggler,
        "first_data_s": watch.first_data_s,
        "start_to_right_s": watch.right_s,
        "steady_to_right_s": watch.steady_to_right_s,
        "verdict": final["verdict"],
        "right_at_end": verdict_jobs.is_right(watch.job, final),
        "evidence": final["evidence"],
        "step_seconds": final["step_seconds"],
        "shares": {s["phase"]: round(s["share"], 4) for s in final["shares"]},
        "stragglers": [
            {k: s[k] for k in ("rank", "metric", "seconds", "others_median", "host")}
            for s in final["stragglers"]
        ],
    }


def show(row: dict[str, Any]) -> None:
    right = row["steady_to_right_s"]
    took = (
        f"right {row['start_to_right_s']:.0f} s after start, {right:.0f} s after its first data"
        if right is not None
        else "never right"
    )
    shares = ", ".join(f"{p} {v:.0%}" for p, v in sorted(row["shares"].items()))
    lagging = ", ".join(f"rank {s['rank']} in {s['metric']}" for s in row["stragglers"]) or "none"
    print(f"{row['job']:>9}: {row['verdict']} (want {row['expected']}; {took})")
    print(f"           shares: {shares}; stragglers: {lagging}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen: list[VerdictJob] = list(JOBS.values()) if args.job == "all" else [JOBS[args.job]]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tuneloop-diagnosis-") as tmp:
        workdir = args.dir or Path(tmp)
        data = workdir / "data"
        with control_plane(workdir, say=print) as plane:
            running: dict[str, tuple[VerdictJob, RunningJob]] = {}
            try:
                for job in chosen:
                    name = verdict_jobs.job_name(job)
                    running[name] = (job, verdict_jobs.start(plane, job, data, workdir / name))
                watches = verdict_jobs.watch(plane, running, window=args.window, timeout_s=60)
                time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
                rows = [
                    summary(watches[name], verdict_jobs.diagnosis(plane, name, args.window))
                    for name in running
                ]
            finally:
                for _, job_run in running.values():
                    job_run.kill()
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window": args.window,
        "seconds": round(time.monotonic() - started, 1),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": os.getloadavg()[0],
        "jobs": rows,
    }
    for row in rows:
        show(row)
    print(
        f"load average (1 m) {result['loadavg_1m_before']:.2f} before, "
        f"{result['loadavg_1m_after']:.2f} after"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if all(r["right_at_end"] and r["steady_to_right_s"] is not None for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
