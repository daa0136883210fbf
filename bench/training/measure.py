"""Grid driver: measures the DDP digits job over batch x sync period under several conditions.

Methodology
-----------
* Grid: per-rank micro-batch ``b`` in ``BATCHES`` x sync period ``k`` in ``PERIODS`` (gradient
  accumulation, see :mod:`bench.training.ddp_job`), effective batch ``M = 2 b k``.
* Conditions (:data:`CONDITIONS`): ``baseline`` (the machine as is), ``slownet`` (an emulated
  slower interconnect: a sleep per synchronization), ``memlimit`` (the baseline network with
  an emulated 2 MiB per-rank activation budget: micro-batches above it fail as ``oom``),
  ``mem1m`` (the same with 1 MiB) and ``slownet_mem1m`` (slownet with the 1 MiB budget, which
  cuts off slownet's optimum). ``mem1m`` -> ``slownet_mem1m`` is the moving-optimum pair.
* Repeats: every (condition, config) runs ``--repeats`` times; repeat ``r`` uses seed ``r`` for
  every config and condition (common random numbers: the same initial weights and data order).
* Order: one 2-process group runs everything. It first runs one throw-away warm-up run (the
  first DDP construction and first collectives are seconds slower), then, repeat by repeat, all
  (condition, config) pairs in an order shuffled with the repeat's seed, so that drifts in the
  background load of this shared machine spread over conditions and configs instead of
  biasing one of them. ``--resume`` runs what is missing, shuffled as a whole.
* Output: every run appends one JSON line to ``bench/data/ddp_digits_runs.jsonl`` (raw, with
  the validation-accuracy history); ``--resume`` skips runs already there. ``analyze`` (run
  automatically at the end) writes ``bench/data/ddp_digits_<condition>.json`` with the raw runs
  and per-config statistics, and prints the tables and the checks.

Per-config statistics
---------------------
* throughput: mean, standard deviation and coefficient of variation over the repeats.
* time to target: mean and standard deviation over the repeats that reached it, the count that
  did, and ``speed`` = mean over all repeats of ``1 / time_to_target`` (0 for a repeat that did
  not reach the target: a ranking that needs no arbitrary penalty).
* noise scale: ``B_simple`` from the squared-norm means pooled over all updates of all repeats
  (``noise_scale``), and the spread of the per-run estimates.
* goodput (Pollux): ``throughput x (phi + M0) / (phi + M)`` with ``phi`` the gradient noise
  scale and ``M0`` the smallest effective batch of the grid. Its variants are ranked against
  the measured speed to target with Spearman's rho over the feasible configs:

  - ``goodput_own_phi``: the config's mean throughput and its own ``phi`` (whole runs);
  - ``goodput_pooled_phi``: ``phi`` pooled over the condition (median of the configs' values:
    the noise scale is a property of the training problem, not of the config);
  - ``goodput_online`` / ``goodput_online_own_phi``: only what an agent would have reported
    during the first ``ONLINE_WINDOW_S`` seconds of training (throughput including warm-up, and
    the gradient norms of the evaluation intervals completed by then), with ``phi`` pooled over
    the condition's configs / the config's own.

  ``throughput_only`` is the same correlation for raw throughput, for comparison.

Usage::

    .venv/bin/python -m bench.training.measure run            # all conditions, 3 repeats
    .venv/bin/python -m bench.training.measure run --resume   # finish an interrupted one
    .venv/bin/python -m bench.training.measure analyze        # re-write the JSON, print tables
"""

import argparse
import contextlib
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch  # type: ignore[import-not-found, unused-ignore]

from .ddp_job import WORLD_SIZE, RunSpec, activation_elements_per_sample, build_model, run_specs

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
RAW_NAME = "ddp_digits_runs.jsonl"
META_NAME = "ddp_digits_sessions.json"

BATCHES = (2, 4, 8, 16, 32, 64, 128, 256)
PERIODS = (1, 2, 4, 8, 16)
REPEATS = 3
ONLINE_WINDOW_S = 1.0

CONDITIONS: dict[str, dict[str, Any]] = {
    "baseline": {"time_budget_s": 8.0},
    "slownet": {"net_latency_ms": 40.0, "net_bandwidth_mb_s": 50.0, "time_budget_s": 12.0},
    "memlimit": {"memory_budget_mib": 2.0, "time_budget_s": 8.0},
    "mem1m": {"memory_budget_mib": 1.0, "time_budget_s": 8.0},
    "slownet_mem1m": {
        "net_latency_ms": 40.0,
        "net_bandwidth_mb_s": 50.0,
        "memory_budget_mib": 1.0,
        "time_budget_s": 12.0,
    },
}
DESCRIPTIONS = {
    "baseline": "The machine as is: real gloo all-reduce over loopback between the 2 ranks.",
    "slownet": (
        "Emulated slower interconnect (network contention): after every real all-reduce the "
        "communication hook sleeps 2 (W-1)/W x gradient bytes / (50 MB/s) (12.1 ms for the "
        "605 KB of fp32 gradients) and the update then sleeps a 40 ms latency: about 52 ms more "
        "sync per update."
    ),
    "memlimit": (
        "Baseline network with an emulated 2 MiB per-rank GPU memory limit: a micro-batch whose "
        "estimated activation memory (b x 14,602 elements x 4 B) exceeds it fails before its "
        "first forward pass with an emulated CUDA out-of-memory error (status 'oom', "
        "infeasible): b <= 32 fits (1.78 MiB), b >= 64 (3.56 MiB) does not. The limit binds: "
        "it cuts off the baseline optimum (b = 64, k = 1); the best feasible config reaches the "
        "same effective batch M = 128 with b = 32, k = 2."
    ),
    "mem1m": (
        "Baseline network with an emulated 1 MiB per-rank GPU memory limit (see memlimit): "
        "b <= 16 fits (0.89 MiB), b >= 32 (1.78 MiB) fails as 'oom': half the grid. It cuts off "
        "the optima of baseline (b = 64, k = 1) and memlimit (b = 32, k = 2); the best feasible "
        "config is b = 16, k = 1 (M = 32). The first half of the moving-optimum pair "
        "mem1m -> slownet_mem1m (only the network changes)."
    ),
    "slownet_mem1m": (
        "The slownet emulation plus the 1 MiB limit of mem1m: b <= 16 fits, b >= 32 fails as "
        "'oom'. It cuts off slownet's best configs (b = 64, k = 1 and b = 32, k = 2, M = 128); "
        "the best feasible one reaches M = 128 by accumulating (b = 16, k = 4). The second half "
        "of the moving-optimum pair mem1m -> slownet_mem1m."
    ),
}


def grid_specs(
    conditions: Sequence[str], batches: Sequence[int], periods: Sequence[int], repeats: int
) -> list[RunSpec]:
    """Every (condition, b, k) once per repeat, each repeat in its own shuffled order."""
    specs: list[RunSpec] = []
    for repeat in range(repeats):
        block = [
            RunSpec(batch=b, sync_period=k, seed=repeat, condition=c, **CONDITIONS[c])
            for c in conditions
            for b in batches
            for k in periods
        ]
        random.Random(repeat).shuffle(block)
        specs.extend(block)
    return specs


def _key(run: dict[str, Any]) -> tuple[str, int, int, int]:
    spec = run["spec"]
    return (spec["condition"], spec["batch"], spec["sync_period"], spec["seed"])


def load_runs(path: Path) -> list[dict[str, Any]]:
    """The raw runs measured so far in ``path`` (warm-up runs excluded)."""
    if not path.exists():
        return []
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in runs if r["spec"]["condition"] in CONDITIONS]


def machine_info() -> dict[str, Any]:
    """What the measurements ran on."""
    cpu_model = "unknown"
    memory = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = line.split(":", 1)[1].strip()
                break
    import sklearn  # type: ignore[import-untyped, import-not-found, unused-ignore]

    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model,
        "memory": memory,
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "scikit_learn": str(sklearn.__version__),
        "torch_threads_per_rank": 1,
        "world_size": WORLD_SIZE,
    }


def run(args: argparse.Namespace) -> None:
    """Measure the grid (appending to the raw JSONL), then analyze."""
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path, meta_path = out_dir / RAW_NAME, out_dir / META_NAME
    specs = grid_specs(args.conditions, args.batches, args.periods, args.repeats)
    if args.resume:
        done = {_key(r) for r in load_runs(raw_path)}
        specs = [s for s in specs if s.key() not in done]
        # What is left may be whole repeats of some conditions only: interleave it all.
        random.Random(len(done)).shuffle(specs)
    elif raw_path.exists():
        sys.exit(f"{raw_path} exists: pass --resume to add to it, or move it away")
    warmup = RunSpec(batch=32, sync_period=1, seed=99, condition="warmup", time_budget_s=2.0)
    session: dict[str, Any] = {
        "command": " ".join(
            [os.path.relpath(sys.executable), "-m", "bench.training.measure", *sys.argv[1:]]
        ),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine_at_start": machine_info(),
        "runs_planned": len(specs),
    }
    print(
        f"{len(specs)} runs planned (+1 warm-up); load average {os.getloadavg()}",
        file=sys.stderr,
    )
    started = time.perf_counter()
    if specs:
        run_specs([warmup, *specs], raw_path)
    session["wall_s"] = time.perf_counter() - started
    session["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    session["loadavg_at_end"] = list(os.getloadavg())
    sessions = json.loads(meta_path.read_text()) if meta_path.exists() else []
    sessions.append(session)
    meta_path.write_text(json.dumps(sessions, indent=2) + "\n")
    print(f"measured in {session['wall_s'] / 60:.1f} min", file=sys.stderr)
    analyze(args)


# --- statistics ---------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _std(values: Sequence[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            result[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return result


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson correlation of the tie-averaged ranks)."""
    if len(x) != len(y) or len(x) < 3:
        return None
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx > 0 and vy > 0 else None


def noise_scale(sq_small: float, sq_big: float, b_small: int, b_big: int) -> float | None:
    """McCandlish et al. appendix A: ``B_simple`` from two batch sizes' mean squared norms."""
    grad_sq = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return trace / grad_sq if grad_sq > 0 and trace > 0 else None


def efficiency(phi: float, m: int, m0: int) -> float:
    """Pollux's statistical efficiency of effective batch ``m`` relative to ``m0``."""
    return (phi + m0) / (phi + m)


def _online(run: dict[str, Any], window_s: float) -> tuple[float, float, float, int] | None:
    """Throughput, mean ``|G_small|^2``, mean ``|G_big|^2`` and updates of the first intervals.

    Only the evaluation intervals up to ``window_s`` seconds of training: what an agent
    reporting online would have sent by then.
    """
    samples = 0
    train_time = 0.0
    small = big = 0.0
    updates = 0
    for entry in run["history"]:
        samples = int(entry["samples"])
        train_time = float(entry["train_time_s"])
        n = int(entry["interval_updates"])
        small += float(entry["grad_sq_small"]) * n
        big += float(entry["grad_sq_big"]) * n
        updates += n
        if train_time >= window_s:
            break
    if updates == 0 or train_time <= 0:
        return None
    return samples / train_time, small / updates, big / updates, updates


def summarize_config(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-config statistics over its repeats."""
    first = runs[0]
    spec = first["spec"]
    b, k = spec["batch"], spec["sync_period"]
    b_small, b_big = b * k, first["effective_batch"]
    statuses = Counter(r["status"] for r in runs)
    summary: dict[str, Any] = {
        "batch": b,
        "sync_period": k,
        "effective_batch": b_big,
        "lr": first["lr"],
        "activation_bytes_per_rank": first["activation_bytes_per_rank"],
        "runs": len(runs),
        "status": dict(statuses),
        "feasible": statuses.get("oom", 0) == 0,
    }
    if not summary["feasible"]:
        summary["error"] = first["error"]
        return summary
    thr = [r["throughput"] for r in runs if r["throughput"] is not None]
    reached = [r["time_to_target_s"] for r in runs if r["status"] == "reached"]
    speed = [1.0 / r["time_to_target_s"] if r["status"] == "reached" else 0.0 for r in runs]
    samples_to_target = [r["samples_to_target"] for r in runs if r["status"] == "reached"]
    thr_mean = _mean(thr)
    thr_std = _std(thr)
    ttt_mean = _mean(reached)
    ttt_std = _std(reached)
    counted = [r for r in runs if r["grad_sq_small"] is not None]
    weights = [r["updates"] for r in counted]
    pooled_small = sum(r["grad_sq_small"] * w for r, w in zip(counted, weights, strict=True))
    pooled_big = sum(r["grad_sq_big"] * w for r, w in zip(counted, weights, strict=True))
    phi = (
        noise_scale(pooled_small / sum(weights), pooled_big / sum(weights), b_small, b_big)
        if weights
        else None
    )
    per_run_phi = [r["noise_scale"] for r in runs if r["noise_scale"] is not None]
    phases: dict[str, float] = {}
    for name in ("data", "forward", "backward", "sync", "optimizer"):
        values = [r["phases_s"][name] for r in runs if r["phases_s"]]
        if values:
            phases[name] = statistics.fmean(values)
    online = [o for o in (_online(r, ONLINE_WINDOW_S) for r in runs) if o is not None]
    online_thr = _mean([o[0] for o in online])
    online_phi = (
        noise_scale(
            statistics.fmean(o[1] for o in online),
            statistics.fmean(o[2] for o in online),
            b_small,
            b_big,
        )
        if online
        else None
    )
    summary.update(
        {
            "throughput_mean": thr_mean,
            "throughput_std": thr_std,
            "throughput_cv": thr_std / thr_mean if thr_mean and thr_std is not None else None,
            "throughput_runs": thr,
            "reached": len(reached),
            "time_to_target_mean_s": ttt_mean,
            "time_to_target_std_s": ttt_std,
            "time_to_target_cv": ttt_std / ttt_mean if ttt_mean and ttt_std is not None else None,
            "time_to_target_runs_s": [r["time_to_target_s"] for r in runs],
            "time_budget_s": spec["time_budget_s"],
            "speed_to_target_mean": statistics.fmean(speed),
            "samples_to_target_mean": _mean(samples_to_target),
            "noise_scale": phi,
            "noise_scale_run_mean": _mean(per_run_phi),
            "noise_scale_run_std": _std(per_run_phi),
            "step_time_mean_s": _mean([r["step_time_s"] for r in runs if r["step_time_s"]]),
            "phases_mean_s": phases,
            "online_throughput": online_thr,
            "online_noise_scale": online_phi,
            "best_accuracy_mean": _mean([r["best_accuracy"] or 0.0 for r in runs]),
        }
    )
    return summary


def analyze_condition(
    condition: str, runs: list[dict[str, Any]], sessions: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON document of one condition: raw runs, per-config statistics and the checks."""
    by_config: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in sorted(runs, key=_key):
        by_config.setdefault((r["spec"]["batch"], r["spec"]["sync_period"]), []).append(r)
    configs = [summarize_config(group) for group in by_config.values()]
    feasible = [c for c in configs if c["feasible"]]
    m0 = min(c["effective_batch"] for c in configs)
    phis = [c["noise_scale"] for c in feasible if c["noise_scale"] is not None]
    pooled_phi = statistics.median(phis) if phis else None
    online_phis = [c["online_noise_scale"] for c in feasible if c["online_noise_scale"]]
    pooled_online_phi = statistics.median(online_phis) if online_phis else None
    for c in feasible:
        thr, m = c["throughput_mean"], c["effective_batch"]
        c["goodput_own_phi"] = (
            thr * efficiency(c["noise_scale"], m, m0) if thr and c["noise_scale"] else None
        )
        c["goodput_pooled_phi"] = (
            thr * efficiency(pooled_phi, m, m0) if thr and pooled_phi else None
        )
        c["goodput_online_own_phi"] = (
            c["online_throughput"] * efficiency(c["online_noise_scale"], m, m0)
            if c["online_throughput"] and c["online_noise_scale"]
            else None
        )
        c["goodput_online"] = (
            c["online_throughput"] * efficiency(pooled_online_phi, m, m0)
            if c["online_throughput"] and pooled_online_phi
            else None
        )

    def rho(metric: str) -> float | None:
        pairs = [(c[metric], c["speed_to_target_mean"]) for c in feasible if c.get(metric)]
        return spearman([p[0] for p in pairs], [p[1] for p in pairs])

    best = max(feasible, key=lambda c: c["speed_to_target_mean"]) if feasible else None
    loads = [r["loadavg_1m"] for r in runs]
    spec = runs[0]["spec"]
    emulation = {
        key: spec[key] for key in ("net_latency_ms", "net_bandwidth_mb_s", "memory_budget_mib")
    }
    return {
        "condition": condition,
        "description": DESCRIPTIONS[condition],
        "emulation": emulation,
        "job": {
            "module": "bench.training.ddp_job",
            "dataset": "sklearn.datasets.load_digits (1,797 8x8 images, 10 classes), "
            "1,437 train / 360 validation (fixed split, seed 0), standardized",
            "model": "CNN conv(1->32,3x3)-ReLU-conv(32->64,3x3)-ReLU-maxpool2-"
            "fc(1024->128)-ReLU-fc(128->10), 151,306 parameters",
            "activation_elements_per_sample": activation_elements_per_sample(build_model()),
            "world_size": WORLD_SIZE,
            "sync": "gradient accumulation: k-1 micro-steps under DDP no_sync(), all-reduce on "
            "the k-th; effective batch M = 2 b k",
            "optimizer": f"SGD momentum {spec['momentum']}, lr = {spec['base_lr']} x "
            f"(M / {spec['base_batch']}) ** 0.5 ({spec['lr_rule']} rule)",
            "target_accuracy": spec["target_accuracy"],
            "time_budget_s": spec["time_budget_s"],
            "eval_every_samples": spec["eval_every_samples"],
            "throughput_warmup_updates": spec["warmup_updates"],
        },
        "measurement": {
            "sessions": sessions,
            "grid": {
                "batch": sorted({c["batch"] for c in configs}),
                "sync_period": sorted({c["sync_period"] for c in configs}),
            },
            "seeds": sorted({r["spec"]["seed"] for r in runs}),
            "runs": len(runs),
        },
        "analysis": {
            "goodput_m0": m0,
            "pooled_noise_scale": pooled_phi,
            "pooled_online_noise_scale": pooled_online_phi,
            "online_window_s": ONLINE_WINDOW_S,
            "optimum": None
            if best is None
            else {
                "batch": best["batch"],
                "sync_period": best["sync_period"],
                "effective_batch": best["effective_batch"],
                "time_to_target_mean_s": best["time_to_target_mean_s"],
                "speed_to_target_mean": best["speed_to_target_mean"],
            },
            "spearman_vs_speed_to_target": {
                "goodput_own_phi": rho("goodput_own_phi"),
                "goodput_pooled_phi": rho("goodput_pooled_phi"),
                "goodput_online": rho("goodput_online"),
                "goodput_online_own_phi": rho("goodput_online_own_phi"),
                "throughput_only": rho("throughput_mean"),
            },
            "throughput_rises": _monotonicity(feasible),
            "median_throughput_cv": _median_of(c.get("throughput_cv") for c in feasible),
            "median_time_to_target_cv": _median_of(c.get("time_to_target_cv") for c in feasible),
            "infeasible": [[c["batch"], c["sync_period"]] for c in configs if not c["feasible"]],
            "samples_to_target_by_effective_batch": _by_effective_batch(runs),
            "loadavg_1m_during_runs": {
                "min": min(loads),
                "median": statistics.median(loads),
                "max": max(loads),
            },
        },
        "configs": configs,
        "runs": sorted(runs, key=_key),
    }


def _by_effective_batch(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The statistical side alone: samples to target by effective batch (any b x k split)."""
    groups: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        if r["status"] != "oom":
            groups.setdefault(r["effective_batch"], []).append(r)
    rows = []
    for m, group in sorted(groups.items()):
        samples = [r["samples_to_target"] for r in group if r["status"] == "reached"]
        rows.append(
            {
                "effective_batch": m,
                "runs": len(group),
                "reached": len(samples),
                "samples_to_target_mean": _mean(samples),
                "samples_to_target_std": _std(samples),
            }
        )
    return rows


def _median_of(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _monotonicity(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """Fractions of neighbouring grid steps (b doubled, or k doubled) where throughput rose."""
    table = {(c["batch"], c["sync_period"]): c["throughput_mean"] for c in configs}
    up_b = up_k = n_b = n_k = 0
    for (b, k), thr in table.items():
        if (2 * b, k) in table:
            n_b += 1
            up_b += table[(2 * b, k)] > thr
        if (b, 2 * k) in table:
            n_k += 1
            up_k += table[(b, 2 * k)] > thr
    return {
        "batch_doubled_rose": f"{up_b}/{n_b}",
        "sync_period_doubled_rose": f"{up_k}/{n_k}",
    }


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if value is not None else "--"


def print_table(doc: dict[str, Any]) -> None:
    """One condition as a Markdown table (means ± standard deviations over the repeats)."""
    analysis = doc["analysis"]
    best = analysis["optimum"] or {}
    print(f"\n### {doc['condition']}\n\n{doc['description']}\n")
    print(
        "| b | k | M | throughput (samples/s) | time to target (s) | reached | speed (1/s) "
        "| phi | goodput | sync (ms/update) | step (ms/update) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in sorted(doc["configs"], key=lambda c: (c["batch"], c["sync_period"])):
        head = f"| {c['batch']} | {c['sync_period']} | {c['effective_batch']} |"
        if not c["feasible"]:
            print(f"{head} OOM | OOM | 0/{c['runs']} | 0 | | | | |")
            continue
        is_best = (c["batch"], c["sync_period"]) == (best.get("batch"), best.get("sync_period"))
        mark = "**" if is_best else ""
        sync = c["phases_mean_s"].get("sync")
        step = c["step_time_mean_s"]
        print(
            f"{head} {_fmt(c['throughput_mean'], '.0f')} ± {_fmt(c['throughput_std'], '.0f')} "
            f"| {mark}{_fmt(c['time_to_target_mean_s'], '.2f')} ± "
            f"{_fmt(c['time_to_target_std_s'], '.2f')}{mark} | {c['reached']}/{c['runs']} "
            f"| {mark}{c['speed_to_target_mean']:.3f}{mark} | {_fmt(c['noise_scale'], '.1f')} "
            f"| {_fmt(c['goodput_pooled_phi'], '.0f')} "
            f"| {_fmt(sync * 1000 if sync is not None else None, '.1f')} "
            f"| {_fmt(step * 1000 if step else None, '.1f')} |"
        )
    rho = analysis["spearman_vs_speed_to_target"]
    print(
        f"\noptimum: b={best.get('batch')} k={best.get('sync_period')} "
        f"(M={best.get('effective_batch')}); pooled phi "
        f"{_fmt(analysis['pooled_noise_scale'], '.1f')}"
        f"; Spearman vs speed to target: goodput (own phi) {_fmt(rho['goodput_own_phi'], '.3f')},"
        f" goodput (pooled phi) {_fmt(rho['goodput_pooled_phi'], '.3f')}, goodput (online, "
        f"first {analysis['online_window_s']:g} s) {_fmt(rho['goodput_online'], '.3f')}, "
        f"throughput alone {_fmt(rho['throughput_only'], '.3f')}; throughput rose when b doubled "
        f"{analysis['throughput_rises']['batch_doubled_rose']}, when k doubled "
        f"{analysis['throughput_rises']['sync_period_doubled_rose']}; median CV throughput "
        f"{_fmt(analysis['median_throughput_cv'], '.2f')}, time to target "
        f"{_fmt(analysis['median_time_to_target_cv'], '.2f')}; load average (1 min) during runs "
        f"{analysis['loadavg_1m_during_runs']['min']:.1f}-"
        f"{analysis['loadavg_1m_during_runs']['max']:.1f} "
        f"(median {analysis['loadavg_1m_during_runs']['median']:.1f})"
    )


def print_moves(docs: dict[str, dict[str, Any]]) -> None:
    """How each condition's optimum does under the other conditions (the moving optimum)."""
    print("\n| optimum of \\ speed (1/s) under | " + " | ".join(docs) + " |")
    print("|---|" + "---:|" * len(docs))
    for name, doc in docs.items():
        best = doc["analysis"]["optimum"]
        if best is None:
            continue
        cells = []
        for other in docs.values():
            found = [
                c
                for c in other["configs"]
                if (c["batch"], c["sync_period"]) == (best["batch"], best["sync_period"])
            ]
            cells.append(
                "OOM"
                if not found or not found[0]["feasible"]
                else f"{found[0]['speed_to_target_mean']:.3f}"
            )
        print(f"| {name}: b={best['batch']} k={best['sync_period']} | " + " | ".join(cells) + " |")


def _dump(doc: dict[str, Any]) -> str:
    """JSON with one line per config and per run (readable, diffable, not bloated)."""
    parts = []
    for key, value in doc.items():
        if key in ("configs", "runs"):
            rows = ",\n  ".join(json.dumps(item) for item in value)
            text = f"[\n  {rows}\n ]"
        else:
            text = json.dumps(value, indent=1).replace("\n", "\n ")
        parts.append(f" {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def analyze(args: argparse.Namespace) -> None:
    """Write ``ddp_digits_<condition>.json`` from the raw runs and print the tables."""
    out_dir: Path = args.out_dir
    runs = load_runs(out_dir / RAW_NAME)
    meta_path = out_dir / META_NAME
    sessions = json.loads(meta_path.read_text()) if meta_path.exists() else []
    docs: dict[str, dict[str, Any]] = {}
    for condition in CONDITIONS:
        selected = [r for r in runs if r["spec"]["condition"] == condition]
        if not selected:
            continue
        doc = docs[condition] = analyze_condition(condition, selected, sessions)
        path = out_dir / f"ddp_digits_{condition}.json"
        path.write_text(_dump(doc))
        print_table(doc)
        print(f"\n(wrote {path})")
    print_moves(docs)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def main(argv: Sequence[str] | None = None) -> None:
    """``run`` measures (and analyzes); ``analyze`` only re-analyzes the raw runs."""
    parser = argparse.ArgumentParser(description="Measure the DDP digits job over a grid.")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="measure the grid, then analyze")
    run_parser.add_argument("--conditions", type=lambda s: s.split(","), default=list(CONDITIONS))
    run_parser.add_argument("--batches", type=_ints, default=list(BATCHES))
    run_parser.add_argument("--periods", type=_ints, default=list(PERIODS))
    run_parser.add_argument("--repeats", type=int, default=REPEATS)
    run_parser.add_argument("--resume", action="store_true", help="skip runs already measured")
    analyze_parser = sub.add_parser("analyze", help="re-write the JSON from the raw runs")
    for p in (run_parser, analyze_parser):
        p.add_argument("--out-dir", type=Path, default=DATA_DIR, help="default: bench/data")
    args = parser.parse_args(argv)
    if args.command == "run":
        for condition in args.conditions:
            if condition not in CONDITIONS:
                parser.error(f"unknown condition {condition!r}: {sorted(CONDITIONS)}")
        run(args)
    else:
        analyze(args)


if __name__ == "__main__":
    main()
