"""Samples per joule of a real training loop under a sweep of GPU power limits, as a ratio
against the board's default limit measured in the same run. Needs an NVIDIA GPU, PyTorch with
CUDA, nvidia-ml-py and the right to set power limits (root or CAP_SYS_ADMIN, as
``nvidia-smi -pl``); refuses clearly, changing nothing, without them.

Method
------
* The job: a PyTorch training loop on GPU 0 (a 6-layer MLP of width ``--width`` on synthetic
  data, bf16 autocast, AdamW), a fixed batch: every step is the same work.
* The knob: the limits are set and verified through the agent's own code
  (``tuneloop.agent.GpuPowerLimit``: ``nvmlDeviceSetPowerManagementLimit``, read back with
  ``nvmlDeviceGetEnforcedPowerLimit``), and the limit found is put back at the end, even on
  an error or Ctrl-C.
* A block: set the limit, ``--warmup-s`` of steps (clocks and temperature settle), then
  ``--block-s`` measured: samples done over the growth of ``nvmlDeviceGetTotalEnergyConsumption``
  (mJ) between the block's first and last step, synchronised with the GPU at both ends.
* Contenders interleaved: every repeat runs every limit once, in an order rotated by the repeat,
  the default limit among them, so drift (temperature, other load) spreads over all of them.
* Result per limit: median samples/J and throughput with 95% bootstrap intervals, and the ratio
  of each repeat's samples/J to the default limit's in the same repeat (median, 95% interval).
  ``uptime``'s load is printed at the start and the end.

::

    sudo .venv/bin/python bench/energy_power_limit.py                       # 50-100% of default
    sudo .venv/bin/python bench/energy_power_limit.py --limits 300,400,500,700 --repeats 5
    sudo .venv/bin/python bench/energy_power_limit.py --quick --out /tmp/energy.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from remote_write import interval

from tuneloop.agent import GpuPowerLimit, PowerLimitRefused

FRACTIONS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
"""Default sweep: these fractions of the default limit (clipped to the board's range)."""


class NoGpu(SystemExit):
    def __init__(self, why: str) -> None:
        super().__init__(f"energy_power_limit: {why}; nothing was changed")


def require_gpu() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise NoGpu("PyTorch is not installed") from exc
    if not torch.cuda.is_available():
        raise NoGpu("no CUDA GPU is visible (this benchmark measures a real GPU's energy)")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError or any NVMLError: either way, no NVML
        raise NoGpu(f"NVML is not available ({exc})") from exc
    return torch


def training_step(torch: Any, width: int, batch: int) -> Any:
    """One step of fixed work, returned as a closure over the model and its optimizer."""
    device = torch.device("cuda", 0)
    layers: list[Any] = []
    for _ in range(6):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run_block(
    torch: Any, nvml: Any, handle: Any, step: Any, args: argparse.Namespace
) -> dict[str, float]:
    deadline = time.perf_counter() + args.warmup_s
    while time.perf_counter() < deadline:
        step()
    torch.cuda.synchronize()
    energy0 = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    started = time.perf_counter()
    steps = 0
    while time.perf_counter() - started < args.block_s:
        step()
        steps += 1
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    joules = (nvml.nvmlDeviceGetTotalEnergyConsumption(handle) - energy0) / 1000.0
    samples = steps * args.batch
    return {
        "samples": samples,
        "seconds": seconds,
        "joules": joules,
        "samples_per_joule": samples / joules,
        "samples_per_second": samples / seconds,
        "mean_power_w": joules / seconds,
    }


def sweep_limits(args: argparse.Namespace, described: dict[str, Any]) -> list[int]:
    low, high, default = described["min_w"], described["max_w"], described["default_w"]
    if args.limits:
        limits = [int(w) for w in args.limits.split(",")]
    else:
        limits = [min(high, max(low, round(default * f))) for f in FRACTIONS]
    outside = [w for w in limits if not low <= w <= high]
    if outside:
        raise SystemExit(f"energy_power_limit: {outside} W outside the board's {low}-{high} W")
    return sorted({*limits, default})


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return f"load average {os.getloadavg()}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch = require_gpu()
    import pynvml

    print(f"start: {uptime()}")
    power = GpuPowerLimit([0])
    try:
        described = power.start()
    except PowerLimitRefused as exc:
        raise SystemExit(f"energy_power_limit: {exc}") from exc
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = pynvml.nvmlDeviceGetName(handle)
    limits = sweep_limits(args, described)
    default = described["default_w"]
    print(f"{name}: limits {limits} W (default {default} W, found {described['found_w']} W)")
    step = training_step(torch, args.width, args.batch)
    blocks: dict[int, list[dict[str, float]]] = {w: [] for w in limits}
    try:
        for repeat in range(args.repeats):
            order = limits[repeat % len(limits) :] + limits[: repeat % len(limits)]
            for watts in order:
                power.apply(watts)
                block = run_block(torch, pynvml, handle, step, args)
                blocks[watts].append(block)
                print(
                    f"repeat {repeat + 1}/{args.repeats} {watts:4d} W: "
                    f"{block['samples_per_joule']:.2f} samples/J, "
                    f"{block['samples_per_second']:.0f} samples/s, {block['mean_power_w']:.0f} W"
                )
    except PowerLimitRefused as exc:
        raise SystemExit(f"energy_power_limit: {exc}") from exc
    finally:
        power.close()  # the limit found is back, whatever happened
    report = summarize(blocks, default)
    report.update({"gpu": name, "args": vars(args), "load_end": uptime()})
    print_table(report)
    print(f"end: {report['load_end']}")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


def summarize(blocks: dict[int, list[dict[str, float]]], default: int) -> dict[str, Any]:
    rows = []
    for watts, runs in sorted(blocks.items()):
        ratios = [
            run["samples_per_joule"] / base["samples_per_joule"]
            for run, base in zip(runs, blocks[default], strict=True)
        ]
        rows.append(
            {
                "limit_w": watts,
                "samples_per_joule": interval([r["samples_per_joule"] for r in runs]),
                "samples_per_second": interval([r["samples_per_second"] for r in runs]),
                "mean_power_w": statistics.median(r["mean_power_w"] for r in runs),
                "ratio_vs_default": interval(ratios),
                "blocks": runs,
            }
        )
    return {"default_w": default, "rows": rows}


def print_table(report: dict[str, Any]) -> None:
    print("| limit (W) | samples/J (95%) | samples/s (95%) | power (W) | samples/J vs default |")
    print("| --- | --- | --- | --- | --- |")
    for row in report["rows"]:
        spj, sps, ratio = (
            row["samples_per_joule"],
            row["samples_per_second"],
            row["ratio_vs_default"],
        )
        print(
            f"| {row['limit_w']} | {spj[0]:.2f} ({spj[1]:.2f}-{spj[2]:.2f}) | "
            f"{sps[0]:.0f} ({sps[1]:.0f}-{sps[2]:.0f}) | {row['mean_power_w']:.0f} | "
            f"{ratio[0]:.3f} ({ratio[1]:.3f}-{ratio[2]:.3f}) |"
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--limits", help="watts, comma-separated (default: 50-100%% of default)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--block-s", type=float, default=30.0)
    parser.add_argument("--width", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--quick", action="store_true", help="2 repeats of 3 s + 10 s blocks")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup_s, args.block_s = 2, 3.0, 10.0
    return args


if __name__ == "__main__":
    main()
