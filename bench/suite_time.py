"""The test suite's wall time, directory by directory, at an earlier commit against the working
tree: each directory run with its own pytest command (two workers), the two checkouts
alternating which goes first, the load average noted before and after each run.

The earlier commit is exported (``git archive``) to a scratch directory and run from there
with ``PYTHONPATH`` at it, as the working tree is. Both need the services ``make test`` needs
(PostgreSQL, Redis, the peers of ``.ci/ensure-tools``); ``CI=true``, so nothing skips::

    .venv/bin/python bench/suite_time.py --base main~3 \\
        --base-args='--dist loadfile' --new-args='--dist loadfile --no-loadscope-reorder'

Prints a row per directory (seconds, new / base) and the totals; the median of the
per-directory ratios comes with its 95% interval (order statistics).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from store_fixture_setup import median_interval

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    seconds: float
    returncode: int
    summary: str
    load: tuple[float, float]


def default_targets(root: Path) -> list[str]:
    """Every folder of tests/ with tests, then the top-level test files as one target."""
    folders = sorted(p for p in (root / "tests").iterdir() if any(p.glob("test_*.py")))
    return [str(p.relative_to(root)) for p in folders] + ["tests/test_*.py"]


def export(ref: str, into: Path) -> None:
    archive = into / "base.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    archive.unlink()


def _default_sigint() -> None:
    # A shell's background job starts with SIGINT ignored; tests that stop a child process
    # with Ctrl-C need it to have the default handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_target(checkout: Path, target: str, workers: int, extra: list[str]) -> Run:
    paths = sorted(str(p.relative_to(checkout)) for p in checkout.glob(target))
    command = [sys.executable, "-m", "pytest", *paths, "-n", str(workers), *extra]
    command += ["-q", "-p", "no:randomly", "-p", "no:cacheprovider", "--durations=0"]
    env = {**os.environ, "CI": "true", "PYTHONPATH": str(checkout)}
    before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=checkout, env=env, capture_output=True, text=True, preexec_fn=_default_sigint
    )
    seconds = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    last = lines[-1] if lines else done.stderr[-200:]
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    summary = "; ".join([last, *failures])
    return Run(seconds, done.returncode, summary, (before, os.getloadavg()[0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base", required=True, help="the earlier commit (any git ref)")
    parser.add_argument("--base-args", default="--dist loadfile")
    parser.add_argument("--new-args", default="--dist loadfile --no-loadscope-reorder")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("targets", nargs="*", help="folders or globs under the root [all]")
    args = parser.parse_args()
    targets = args.targets or default_targets(ROOT)
    print(f"{os.cpu_count()} CPUs, load at the start {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as scratch:
        export(args.base, Path(scratch))
        sides = {
            "base": (Path(scratch) / "tree", shlex.split(args.base_args)),
            "new": (ROOT, shlex.split(args.new_args)),
        }
        rows, ratios = [], []
        for index, target in enumerate(targets):
            runs: dict[str, Run] = {}
            for side in ("base", "new") if index % 2 == 0 else ("new", "base"):
                checkout, extra = sides[side]
                runs[side] = run_target(checkout, target, args.workers, extra)
            base, new = runs["base"], runs["new"]
            ratios.append(new.seconds / base.seconds)
            rows.append((target, base, new))
            print(
                f"| {target} | {base.seconds:.1f} | {new.seconds:.1f} | {ratios[-1]:.2f} | "
                f"{base.load[0]:.1f}-{base.load[1]:.1f} / {new.load[0]:.1f}-{new.load[1]:.1f} | "
                f"{base.summary} / {new.summary} |",
                flush=True,
            )
    total_base = sum(base.seconds for _, base, _ in rows)
    total_new = sum(new.seconds for _, _, new in rows)
    ratio, low, high = median_interval(ratios)
    print(f"total: base {total_base:.0f} s, new {total_new:.0f} s, new / base "
          f"{total_new / total_base:.3f}; median per-directory ratio {ratio:.3f} "
          f"(95% interval {low:.3f} .. {high:.3f}, {len(ratios)} directories); "
          f"load at the end {os.getloadavg()[0]:.2f}")  # fmt: skip
    failed = [t for t, b, n in rows if b.returncode or n.returncode]
    if failed:
        print(f"runs that did not pass: {', '.join(failed)}")


if __name__ == "__main__":
    main()
