"""The whole loop on a real job, repeated over seeds: ``tuneloop demo`` (docs/demo.md) once per
seed, each in its own directory, then one table of the ratios it measured.

Each demo tunes a live 2-process PyTorch DDP job from a poor config and times fresh runs of
the starting config, the hand-picked default and the tuned config to the target accuracy,
interleaved in the same run: the ratios (start / tuned, default / tuned) are the claim, each
with Welch's 95% interval of the difference in seconds.

    .venv/bin/python bench/live_tuning.py --seeds 0,1 --repeats 8     # about 9 minutes a seed
    .venv/bin/python bench/live_tuning.py --quick                     # one seed, --quick demo
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tuneloop.demo.runner import DemoPlan, run_demo


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", default="0", help="comma-separated study seeds")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    root = Path(tempfile.mkdtemp(prefix="tuneloop-live-tuning-"))
    for seed in seeds:
        plan = (
            DemoPlan(trials=3, repeats=2, target_accuracy=0.9, tuned_run_s=3.0, seed=seed)
            if args.quick
            else DemoPlan(trials=args.trials, repeats=args.repeats, seed=seed)
        )
        summary = run_demo(plan, root / f"seed{seed}", lambda line: print(line, flush=True))
        configs = summary["configs"]
        tuned = configs["tuned"]
        ttt = {label: entry["time_to_target_s"]["mean"] for label, entry in configs.items()}
        verdicts = [line for line in summary["report"] if line.startswith("tuned vs")]
        rows.append(
            f"| {seed} | {tuned['config']['batch_size']} x {tuned['config']['sync_period']} "
            f"| {ttt['start']:.2f} | {ttt['default']:.2f} | {ttt['tuned']:.2f} "
            f"| {ttt['start'] / ttt['tuned']:.2f} | {ttt['default'] / ttt['tuned']:.2f} "
            f"| {'; '.join(v.split(': ', 1)[1] for v in verdicts)} | {summary['wall_s']:.0f} |"
        )
    print()
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(
        "| seed | tuned (batch x sync) | start s | default s | tuned s | start / tuned "
        "| default / tuned | verdicts | wall s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for row in rows:
        print(row)
    print(f"(every run's details: {root}/seed*/demo.json)")


if __name__ == "__main__":
    main()
