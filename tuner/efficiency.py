"""Efficiency against the hardware's peak: model FLOPs utilisation (MFU), pure.

MFU = achieved FLOP/s per GPU / the GPU's peak FLOP/s, where achieved = FLOPs per sample (the
job declares it: forward + backward of one sample) x samples per second per GPU. The peak is the
job's declared figure, else the operator's setting, else the table below by the GPU's model name
(DCGM's and NVML's ``modelName`` label). A FLOPs figure implying more than the peak cannot be
true: MFU is then withheld and the reason shown, never fed to the verdict.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

TERA: Final = 1e12

PEAK_TABLE: Final[tuple[tuple[frozenset[str], float], ...]] = tuple(
    (frozenset(words.split()), tflops * TERA)
    for words, tflops in (
        # Dense BF16/FP16 tensor-core peaks (no structured sparsity) from NVIDIA's datasheets,
        # which print the sparse figure, twice these, with an asterisk. Most specific first.
        ("h200 nvl", 835.0),  # H200 NVL datasheet: BF16 1,671 TFLOPS with sparsity
        ("h200", 989.0),  # H200 SXM datasheet: BF16 1,979 TFLOPS with sparsity
        ("h100 nvl", 835.0),  # H100 NVL datasheet: BF16 1,671 TFLOPS with sparsity
        ("h100 pcie", 756.0),  # H100 PCIe datasheet: BF16 1,513 TFLOPS with sparsity
        ("h100", 989.0),  # H100 SXM datasheet: BF16 1,979 TFLOPS with sparsity
        ("h800 pcie", 756.0),  # as H100 PCIe
        ("h800", 989.0),  # as H100 SXM
        ("a100", 312.0),  # A100 40 GB and 80 GB, SXM and PCIe datasheet: BF16 312 TFLOPS
        ("a800", 312.0),  # A800 40/80 GB datasheet: BF16 312 TFLOPS
        ("a30", 165.0),  # A30 datasheet: BF16 165 TFLOPS
        ("a10", 125.0),  # A10 datasheet: BF16 125 TFLOPS (250 with sparsity)
        ("l40s", 362.05),  # L40S datasheet: BF16 362.05 TFLOPS (733 with sparsity)
        ("l40", 181.05),  # L40 datasheet: BF16 181.05 TFLOPS (362.1 with sparsity)
        ("l4", 121.0),  # L4 datasheet: BF16 121 TFLOPS (242 with sparsity)
        ("rtx 6000 ada", 364.25),  # RTX 6000 Ada datasheet: 1,457 TFLOPS FP8 sparse / 4
        ("rtx 4000 ada", 76.7),  # RTX 4000 Ada datasheet: 306.8 TFLOPS FP8 sparse / 4
        ("v100 pcie", 112.0),  # V100 PCIe datasheet: tensor 112 TFLOPS (FP16)
        ("v100", 125.0),  # V100 SXM2 datasheet: tensor 125 TFLOPS (FP16)
        ("t4", 65.0),  # T4 datasheet: FP16 mixed precision 65 TFLOPS
        ("b200", 2250.0),  # HGX B200 datasheet: FP16/BF16 4.5 PFLOPS per GPU with sparsity
    )
)
"""The model-name words each peak applies to, and the peak FLOP/s of one GPU."""

MAX_MFU: Final = 1.0
"""No job runs faster than its GPU's peak: a figure implying more is bad input."""


def table_peak(model_name: str) -> float | None:
    """The table's peak FLOP/s for a GPU model name as NVML reports it (``NVIDIA H100 80GB
    HBM3``, ``NVIDIA A100-SXM4-80GB``, ``NVIDIA RTX 4000 Ada Generation``), or ``None``."""
    words = set(re.split(r"[^a-z0-9]+", model_name.lower()))
    for needed, peak in PEAK_TABLE:
        if needed <= words:
            return peak
    return None


@dataclass(frozen=True, slots=True)
class Throughput:
    """What the job reports of its work: per rank its samples per second and GPU count."""

    flops_per_sample: float | None
    samples_per_second: Mapping[str, float]
    gpus_per_rank: Mapping[str, int]
    declared_peak: float | None = None
    """The job's peak FLOP/s per GPU, when it declares one."""


@dataclass(frozen=True, slots=True)
class Efficiency:
    flops_per_sample: float
    samples_per_second: float | None
    """Per GPU, mean over the ranks judged."""
    achieved_flops: float | None
    """FLOP/s per GPU."""
    peak_flops: float | None
    peak_source: str | None
    """``job``, ``setting`` or ``table: <model name>``."""
    mfu: float | None
    """0-1; ``None`` when it cannot be computed or is excluded (see ``excluded``)."""
    excluded: str | None = None
    """Why there is no MFU: a figure over the peak, a missing figure or an unknown GPU."""


def efficiency(
    work: Throughput,
    ranks: Iterable[str],
    model_names: Iterable[str],
    setting_peak: float | None = None,
) -> Efficiency | None:
    """MFU over ``ranks`` (those judged), or ``None`` when the job declares no FLOPs."""
    flops = work.flops_per_sample
    if flops is None:
        return None
    if not (math.isfinite(flops) and flops > 0):
        why = f"FLOPs per sample must be a positive number, got {flops:g}"
        return Efficiency(flops, None, None, None, None, None, why)
    per_gpu = [
        rate / max(1, work.gpus_per_rank.get(rank, 1))
        for rank in ranks
        if (rate := work.samples_per_second.get(rank)) is not None
    ]
    rate = sum(per_gpu) / len(per_gpu) if per_gpu else None
    achieved = None if rate is None else flops * rate
    peak, source = _peak(work.declared_peak, setting_peak, model_names)
    if achieved is None:
        why = "no samples per second reported (give samples to each step)"
        return Efficiency(flops, rate, achieved, peak, source, None, why)
    if peak is None:
        names = ", ".join(sorted(set(model_names))) or "unknown"
        why = f"no peak known for the GPU model ({names}): declare the job's peak or set one"
        return Efficiency(flops, rate, achieved, peak, source, None, why)
    mfu = achieved / peak
    if mfu > MAX_MFU:
        why = (
            f"{flops:.4g} FLOPs per sample at {rate:.4g} samples/s per GPU is "
            f"{achieved / TERA:.4g} TFLOP/s, {mfu:.0%} of the peak {peak / TERA:.4g} TFLOP/s "
            f"({source}): over the peak, so the FLOPs figure or the samples are wrong"
        )
        return Efficiency(flops, rate, achieved, peak, source, None, why)
    return Efficiency(flops, rate, achieved, peak, source, mfu)


def _peak(
    declared: float | None, setting: float | None, model_names: Iterable[str]
) -> tuple[float | None, str | None]:
    if declared is not None and declared > 0:
        return declared, "job"
    if setting is not None and setting > 0:
        return setting, "setting"
    known = [(p, name) for name in model_names if (p := table_peak(name)) is not None]
    if not known:
        return None, None
    peak, name = min(known)  # mixed GPUs: the slowest bounds a data-parallel job
    return peak, f"table: {name}"
