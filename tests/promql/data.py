"""Deterministic series for comparing the PromQL engine with Prometheus: dcgm-exporter's
metrics and labels (as in tests/collector/fixtures/dcgm-exporter-*.txt, MIG instances
included) and step-timing series (tuneloop/step_timing.py, plus a classic histogram), one
hour at 15 s. Samples sit 125 ms past whole seconds (exact in binary, so promtool's float
seconds give the same milliseconds), so that no query time falls on a sample and window edges
mean the same in every Prometheus version."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tuneloop.step_timing import (
    PHASE_DURATION,
    SAMPLES_PER_SECOND,
    STEP_DURATION,
    STEP_NUMBER,
    TOKENS_PER_SECOND,
)

T0_S = 1_700_000_000
"""Start of the data, in Unix seconds."""
INTERVAL_MS = 15_000
OFFSET_MS = 125
POINTS = 240  # one hour
BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2.5", "+Inf")


@dataclass(frozen=True)
class GenSeries:
    metric: str
    labels: dict[str, str]
    counter: bool
    times_ms: list[int]
    values: list[float]


def sample_times(first: int = 0, last: int = POINTS) -> list[int]:
    return [T0_S * 1000 + OFFSET_MS + i * INTERVAL_MS for i in range(first, last)]


def _gpus() -> list[dict[str, str]]:
    gpus = []
    for host, model, driver in (
        ("node-a", "NVIDIA H100 80GB HBM3", "570.133.20"),
        ("node-b", "NVIDIA H100 80GB HBM3", "570.133.20"),
        ("node-c", "NVIDIA RTX 4000 Ada Generation", "580.95.05"),
    ):
        for gpu in range(4 if host != "node-c" else 2):
            gpus.append(
                {
                    "gpu": str(gpu),
                    "UUID": f"GPU-{host[-1]}{gpu}c3d8a27-6b1e-4f0a-9d42-7e1b0c9a3f6{gpu}",
                    "device": f"nvidia{gpu}",
                    "modelName": model,
                    "Hostname": host,
                    "DCGM_FI_DRIVER_VERSION": driver,
                }
            )
    for instance, profile in (("3", "2g.20gb"), ("5", "1g.10gb")):
        gpus.append(
            {
                "gpu": "0",
                "UUID": "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418",
                "device": "nvidia0",
                "modelName": "NVIDIA A800-SXM4-80GB",
                "GPU_I_PROFILE": profile,
                "GPU_I_ID": instance,
                "Hostname": "node-mig",
                "DCGM_FI_DRIVER_VERSION": "535.129.03",
            }
        )
    return gpus


def generate() -> list[GenSeries]:
    rng = random.Random(20241125)
    out: list[GenSeries] = []
    for index, labels in enumerate(_gpus()):
        # One GPU stops reporting at 40 min: lookback and gaps.
        last = 160 if index == 3 else POINTS
        times = sample_times(0, last)
        n = len(times)
        util = [
            round(min(100.0, max(0.0, 50 + 40 * math.sin(i / 17 + index) + rng.gauss(0, 8))), 3)
            for i in range(n)
        ]
        out.append(GenSeries("DCGM_FI_DEV_GPU_UTIL", labels, False, times, util))
        temp = [round(40 + u / 4 + rng.random(), 2) for u in util]
        out.append(GenSeries("DCGM_FI_DEV_GPU_TEMP", labels, False, times, temp))
        power = [round(80 + 5 * u + rng.random() * 10, 3) for u in util]
        out.append(GenSeries("DCGM_FI_DEV_POWER_USAGE", labels, False, times, power))
        clock = [float(1980 if (i // 20 + index) % 3 else 1410) for i in range(n)]
        out.append(GenSeries("DCGM_FI_DEV_SM_CLOCK", labels, False, times, clock))
        energy, total = [], 1e6 * (index + 1)
        for i, p in enumerate(power):
            if index % 3 == 1 and i == 120:
                total = 0.0  # the exporter restarted: a counter reset
            total += p * 15_000
            energy.append(round(total, 1))
        out.append(GenSeries("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, True, times, energy))
        xid, errors = [], 0.0
        for i in range(n):
            if rng.random() < 0.03:
                errors += 1
            xid.append(errors if not (index == 2 and i == 200) else 0.0)
        out.append(GenSeries("DCGM_FI_DEV_XID_ERRORS", labels, True, times, xid))
    for host, driver in (
        ("node-a", "570.133.20"),
        ("node-b", "570.133.20"),
        ("node-c", "580.95.05"),
    ):
        out.append(
            GenSeries(
                "dcgm_node_info",
                {"Hostname": host, "driver": driver},
                False,
                sample_times(),
                [1.0] * POINTS,
            )
        )
    out.extend(_step_timing(rng))
    out.extend(_recorded(rng))
    return out


FIXTURES = Path(__file__).resolve().parents[1] / "collector" / "fixtures"
MIG_HOST = "msxf-hpc-64-35-ai"
NODE_FAMILIES = (
    "node_network_receive_bytes_total",
    "node_network_transmit_bytes_total",
    "node_disk_read_bytes_total",
    "node_disk_written_bytes_total",
)


def _recorded(rng: random.Random) -> list[GenSeries]:
    """Every series of the recorded dcgm-exporter scrape and of the node-exporter families
    the Prometheus Fleet dashboard reads, over the hour, labelled as tuneloop stores them
    (``Hostname``, the scrape's ``job`` and ``instance``): gauges wander around the recorded
    value, counters grow from it. A second host, gpu-node-18, has the same series."""
    out: list[GenSeries] = []
    times = sample_times()
    for host in ("gpu-node-17", "gpu-node-18"):
        dcgm = {"job": "dcgm-exporter", "instance": f"{host}:9400", "Hostname": host}
        for metric, labels, value, counter in _scrape(FIXTURES / "dcgm-exporter-metrics.txt"):
            labels = {k: v for k, v in labels.items() if k != "hostname"} | dcgm
            if host != "gpu-node-17":
                labels["UUID"] = labels.get("UUID", "")[:-2] + "18"
            out.append(GenSeries(metric, labels, counter, times, _walk(rng, value, counter)))
        node = _scrape(FIXTURES / "node-exporter-metrics.txt")
        received = [(labels, value) for m, labels, value, _ in node if m == NODE_FAMILIES[0]]
        scrape = {"job": "node-exporter", "instance": f"{host}:9100", "Hostname": host}
        # The scrape recorded only the received bytes: the other families the dashboard
        # reads are shaped after it (disks named as NVMe disks are).
        for metric in NODE_FAMILIES:
            for labels, value in received:
                if metric.startswith("node_disk"):
                    labels = {"device": labels["device"].replace("eth", "nvme").replace("ib", "sd")}
                labels = {**labels, **scrape}
                out.append(GenSeries(metric, labels, True, times, _walk(rng, value, True)))
    # A MIG host, recorded with its instances (GPU_I_PROFILE, GPU_I_ID) and Hostname set.
    mig = {"job": "dcgm-exporter", "instance": f"{MIG_HOST}:9400", "Hostname": MIG_HOST}
    for metric, labels, value, counter in _scrape(FIXTURES / "dcgm-exporter-mig-a800.txt"):
        labels = labels | mig
        out.append(GenSeries(metric, labels, counter, times, _walk(rng, value, counter)))
    return out


def _scrape(path: Path) -> list[tuple[str, dict[str, str], float, bool]]:
    text = path.read_text()
    found = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # The parser names counters ..._total; dcgm-exporter's do not end so.
            name = sample.name
            if f"\n{name}{{" not in text and f"\n{name} " not in text:
                name = family.name
            if math.isfinite(sample.value):
                found.append((name, dict(sample.labels), sample.value, family.type == "counter"))
    return found


def _walk(rng: random.Random, value: float, counter: bool) -> list[float]:
    if counter:
        step = max(1.0, abs(value) * 1e-4)
        total, values = value, []
        for _ in range(POINTS):
            total += round(rng.random() * step, 3)
            values.append(total)
        return values
    # A phase of its own: GPUs that recorded one value do not tie (topk would pick either).
    phase = rng.random() * 6
    return [
        round(value * (1 + 0.1 * math.sin(i / 13 + phase)) + rng.random(), 6) for i in range(POINTS)
    ]


def _step_timing(rng: random.Random) -> list[GenSeries]:
    out: list[GenSeries] = []
    times = sample_times()
    for job, base in (("llm-pretrain", 0.42), ("vision-ft", 0.11)):
        for rank in ("0", "1", "2"):
            labels = {"job": job, "rank": rank}
            step = [
                round(base * (1 + 0.3 * math.sin(i / 9 + int(rank)) + rng.random() * 0.2), 5)
                for i in range(POINTS)
            ]
            out.append(GenSeries(STEP_DURATION, labels, False, times, step))
            out.append(
                GenSeries(
                    SAMPLES_PER_SECOND, labels, False, times, [round(64 / s, 4) for s in step]
                )
            )
            out.append(
                GenSeries(
                    TOKENS_PER_SECOND, labels, False, times, [round(64 * 2048 / s, 2) for s in step]
                )
            )
            numbers, n = [], 0.0
            for s in step:
                n += math.floor(15 / s)
                numbers.append(n)
            out.append(GenSeries(STEP_NUMBER, labels, True, times, numbers))
            for phase, share in (("forward", 0.35), ("backward", 0.55), ("optimizer", 0.1)):
                phase_labels = {**labels, "phase": phase}
                out.append(
                    GenSeries(
                        PHASE_DURATION,
                        phase_labels,
                        False,
                        times,
                        [round(s * share, 6) for s in step],
                    )
                )
            counts = [0.0] * len(BUCKETS)
            series = [[] for _ in BUCKETS]  # type: list[list[float]]
            total_sum, sums, totals = 0.0, [], []
            for s in step:
                steps = math.floor(15 / s)
                for _ in range(steps):
                    observed = s * (0.5 + rng.random())
                    total_sum += observed
                    for b, bound in enumerate(BUCKETS):
                        if observed <= float(bound):
                            counts[b] += 1
                for b in range(len(BUCKETS)):
                    series[b].append(counts[b])
                sums.append(round(total_sum, 6))
                totals.append(counts[-1])
            for bound, values in zip(BUCKETS, series):
                out.append(
                    GenSeries(
                        STEP_DURATION + "_bucket", {**labels, "le": bound}, True, times, values
                    )
                )
            out.append(GenSeries(STEP_DURATION + "_sum", labels, True, times, sums))
            out.append(GenSeries(STEP_DURATION + "_count", labels, True, times, totals))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_openmetrics(series: list[GenSeries], path: Path) -> None:
    """The series as an OpenMetrics text file, as ``promtool tsdb create-blocks-from
    openmetrics`` takes it: each metric's samples together, untyped."""
    by_metric: dict[str, list[GenSeries]] = {}
    for one in series:
        by_metric.setdefault(one.metric, []).append(one)
    lines: list[str] = []
    for metric, members in by_metric.items():
        lines.append(f"# TYPE {metric} unknown")
        for one in members:
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in one.labels.items())
            for t, v in zip(one.times_ms, one.values):
                lines.append(f"{metric}{{{labels}}} {v!r} {t / 1000:.3f}")
    lines.append("# EOF")
    path.write_text("\n".join(lines) + "\n")
