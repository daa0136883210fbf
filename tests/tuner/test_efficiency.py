"""MFU on its own: the peak table by GPU model name, which peak wins, and a FLOPs figure that
implies more than the hardware's peak flagged and kept out of the verdict."""

from __future__ import annotations

import math

import pytest

from tests.tuner.test_diagnosis import rank
from tuner.diagnosis import GpuActivity, diagnose
from tuner.efficiency import TERA, Throughput, efficiency, table_peak


@pytest.mark.parametrize(
    ("model", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA A100-SXM4-40GB", 312.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A800-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA L40", 181.05),
        ("NVIDIA L4", 121.0),
        ("NVIDIA RTX 4000 Ada Generation", 76.7),
        ("Tesla V100-SXM2-32GB", 125.0),
        ("Tesla T4", 65.0),
    ],
)
def test_the_peak_table_by_model_name(model: str, tflops: float) -> None:
    assert table_peak(model) == pytest.approx(tflops * TERA)


def test_an_unknown_gpu_has_no_peak() -> None:
    assert table_peak("Radeon Instinct MI250X") is None
    assert table_peak("NVIDIA GeForce GTX 1080") is None


def work(
    flops: float | None, rates: dict[str, float], declared_peak: float | None = None
) -> Throughput:
    return Throughput(flops, rates, {r: 1 for r in rates}, declared_peak)


H100 = ["NVIDIA H100 80GB HBM3"]


def test_mfu_is_achieved_flops_per_gpu_over_the_peak() -> None:
    # 7B-parameter transformer, 4096 tokens per sample: 6 * 7e9 * 4096 FLOPs per sample.
    flops = 6 * 7e9 * 4096
    found = efficiency(work(flops, {"0": 2.0, "1": 2.2}), ["0", "1"], H100)
    assert found is not None and found.excluded is None
    assert found.samples_per_second == pytest.approx(2.1)
    assert found.achieved_flops == pytest.approx(flops * 2.1)
    assert found.mfu == pytest.approx(flops * 2.1 / (989 * TERA))
    assert found.peak_source == "table: NVIDIA H100 80GB HBM3"


def test_a_rank_with_several_gpus_shares_its_samples_among_them() -> None:
    found = efficiency(Throughput(1e12, {"0": 100.0}, {"0": 4}), ["0"], H100)
    assert found is not None and found.samples_per_second == pytest.approx(25.0)


def test_the_job_s_peak_wins_over_the_setting_over_the_table() -> None:
    rates = {"0": 1.0}
    declared = efficiency(work(1e14, rates, declared_peak=2e14), ["0"], H100, setting_peak=4e14)
    assert declared is not None and (declared.peak_source, declared.mfu) == ("job", 0.5)
    setting = efficiency(work(1e14, rates), ["0"], H100, setting_peak=4e14)
    assert setting is not None and (setting.peak_source, setting.mfu) == ("setting", 0.25)
    mixed = efficiency(work(1e14, rates), ["0"], ["NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB"])
    assert mixed is not None and mixed.peak_flops == 312 * TERA  # the slower GPU bounds


def test_flops_implying_more_than_the_peak_are_flagged_and_excluded() -> None:
    found = efficiency(work(1e15, {"0": 3.0}), ["0"], H100)
    assert found is not None and found.mfu is None
    assert found.excluded is not None and "over the peak" in found.excluded
    assert "303%" in found.excluded and "989" in found.excluded
    timings = [rank("0", 1.0, forward=0.4, backward=0.5)]
    gpu = GpuActivity(utilization=0.95, model_names=tuple(H100))
    judged = diagnose(timings, gpu, work(1e15, {"0": 3.0}))
    assert judged.efficiency is not None and judged.efficiency.excluded is not None
    assert not any("MFU" in line for line in judged.evidence)
    sane = diagnose(timings, gpu, work(1e14, {"0": 3.0}))
    assert any(line.startswith("MFU 30%") for line in sane.evidence)


def test_what_is_missing_is_said() -> None:
    assert efficiency(work(None, {"0": 1.0}), ["0"], H100) is None
    no_rate = efficiency(work(1e12, {}), ["0"], H100)
    assert no_rate is not None and no_rate.excluded is not None
    assert "no samples per second" in no_rate.excluded
    unknown = efficiency(work(1e12, {"0": 1.0}), ["0"], ["Mystery GPU"])
    assert unknown is not None and unknown.excluded is not None
    assert "Mystery GPU" in unknown.excluded and unknown.achieved_flops == 1e12
    for bad in (0.0, -5.0, math.nan):
        found = efficiency(work(bad, {"0": 1.0}), ["0"], H100)
        assert found is not None and found.mfu is None and found.excluded is not None
    # A rank excluded from the diagnosis does not count towards the job's rate.
    only = efficiency(work(1e12, {"0": 1.0, "1": 100.0}), ["0"], H100)
    assert only is not None and only.samples_per_second == 1.0
