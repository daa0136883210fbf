"""Incidents for the rule pack (alerts/prometheus/gpu-fleet.rules.yml) to see, over the hour of
tests/promql/data.py, in the series the real emitters write: dcgm-exporter's families and labels
(its default counter list and the exporter-owned ``DCGM_EXP_*`` families, labelled as
tests/collector/fixtures/dcgm-exporter-hostname-mig-xid.txt is, with the scrape's ``job`` and
``instance``), tuneloop's step-timing series (tuneloop/step_timing.py, the phases the agent
times) and an OpenTelemetry-instrumented inference server's ``http.server.request.duration``
histogram as tuneloop's OTLP receiver stores it, and the gauges the job diagnosis writes
(docs/diagnosis.md). Point ``i`` is minute ``i / 4``.

* gpu-node-21, 4 x H100 running llm-pretrain-b on GPUs 0-2, GPU 3 in MIG mode:
  GPU 0 runs at its power cap (power violation) over a flaky NVLink (CRC errors, one link
  recovery at 32.5 min); GPU 1 runs hot from 10 min (thermal violation, DCGM's thermal watch
  warns) and at 25 min returns an uncorrectable ECC error: XID 48 (the last-value gauge and the
  counted family), the memory watch fails, a row is remapped; GPU 2 is a hung rank, its pod
  holding the framebuffer without doing any work; GPU 3's 3g.40gb instance is held by an idle
  pod, its 1g.10gb instance is free. llm-pretrain-b's rank 1, on the hot GPU 1, lags from 10
  min (its diagnosis names it).
* gpu-node-22, 2 x H100 running llm-sft: its data loader stalls from 27.5 min (the steps slow
  down, its diagnosis finds it input-bound), and at 40 min the node stops reporting and the
  job falls silent.
* inference/vllm (two replicas) answers slowly from 30 to 42.5 min, past its 500 ms P99;
  inference/embedder stays fast.

Every value carries noise of its own, so no two series tie (topk and sort pick alike)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from tests.promql.data import POINTS, GenSeries, sample_times
from tuneloop.step_timing import (
    PHASE_DURATION,
    PHASE_SHARE,
    SAMPLES_PER_SECOND,
    STEP_DURATION,
    STEP_NUMBER,
    STRAGGLER_RATIO,
    TOKENS_PER_SECOND,
)

HOT_FROM = 40  # gpu-node-21's GPU 1 runs hot from 10 min
ECC_AT = 100  # and returns an uncorrectable error at 25 min
RECOVERY_AT = 130
STALL_FROM = 110  # llm-sft's data loader stalls from 27.5 min
DOWN_AT = 160  # gpu-node-22 and llm-sft stop at 40 min
SLOW = range(120, 170)  # inference/vllm is slow from 30 to 42.5 min
H100 = "NVIDIA H100 80GB HBM3"
DRIVER = "570.133.20"
HEALTH_WATCHES = (
    "PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER"
)  # fmt: skip
HTTP_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10)
"""OpenTelemetry's advised buckets for ``http.server.request.duration``."""


@dataclass(frozen=True)
class _Device:
    """One entity dcgm-exporter reports on: a GPU, or a MIG instance of one."""

    labels: dict[str, str]
    points: int
    """How many points it reports (its node may stop)."""
    util: float | None
    """Typical GPU_UTIL; ``None`` for a MIG instance, which DCGM gives none."""
    fb_free: float
    temp: Callable[[int], float]
    power: float

    @property
    def physical(self) -> bool:
        return "GPU_I_ID" not in self.labels

    def key(self) -> tuple[str, str]:
        return self.labels["Hostname"], self.labels["gpu"]


def _labels(
    host: str, gpu: int, uuid: str, pod: tuple[str, str, str] | None, mig: str = ""
) -> dict[str, str]:
    labels = {
        "gpu": str(gpu),
        "UUID": uuid,
        "pci_bus_id": f"00000000:{0x18 + 0x11 * gpu:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": H100,
    }
    if mig:
        profile, instance = mig.split("/")
        labels |= {"GPU_I_PROFILE": profile, "GPU_I_ID": instance}
    labels |= {"Hostname": host, "DCGM_FI_DRIVER_VERSION": DRIVER}
    if pod is not None:
        # A GPU no pod holds has no pod labels: the collector drops empty ones.
        labels |= dict(zip(("pod", "namespace", "container"), pod, strict=True))
    return labels | {"job": "dcgm-exporter", "instance": f"{host}:9400"}


def _devices() -> list[_Device]:
    pretrain = ("llm-pretrain-b-worker-{}", "ml-training", "trainer")
    sft = ("llm-sft-worker-{}", "ml-training", "trainer")

    def pod(template: tuple[str, str, str], rank: int) -> tuple[str, str, str]:
        return template[0].format(rank), template[1], template[2]

    node21, node22 = "gpu-node-21", "gpu-node-22"
    mig_uuid = "GPU-9d0e4b21-5a7c-4e3f-8b16-c2a7f05d3e94"
    embed = ("embed-5f7d8c9b4-wq7zk", "inference", "embedder")
    return [
        _Device(
            _labels(node21, 0, "GPU-21a4c7e0-3f58-4b92-a6d1-0c8e5b7f2a10", pod(pretrain, 0)),
            POINTS, 97.0, 3120.0, lambda i: 68.0, 699.0,
        ),
        _Device(
            _labels(node21, 1, "GPU-21b83d5f-7e14-4c06-9a2b-6f1d0e9c4b21", pod(pretrain, 1)),
            POINTS, 95.0, 2980.0, lambda i: 87.5 if i >= HOT_FROM else 66.0, 640.0,
        ),
        _Device(
            _labels(node21, 2, "GPU-21c95e0a-2b67-4d18-8c3f-7a2e1f0d5c32", pod(pretrain, 2)),
            POINTS, 2.5, 310.0, lambda i: 36.0, 92.0,
        ),
        _Device(
            _labels(node21, 3, mig_uuid, embed, "3g.40gb/1"),
            POINTS, None, 1400.0, lambda i: 46.0, 71.0,
        ),
        _Device(
            _labels(node21, 3, mig_uuid, None, "1g.10gb/9"),
            POINTS, None, 9730.0, lambda i: 46.5, 70.0,
        ),
        _Device(
            _labels(node22, 0, "GPU-22d0f6b1-8c39-4e2a-b5d4-1e3f7a0c6d43", pod(sft, 0)),
            DOWN_AT, 88.0, 5210.0, lambda i: 62.0, 610.0,
        ),
        _Device(
            _labels(node22, 1, "GPU-22e1a7c2-9d4a-4f3b-86e5-2f4a8b1d7e54", pod(sft, 1)),
            DOWN_AT, 86.0, 5330.0, lambda i: 63.0, 605.0,
        ),
    ]  # fmt: skip


def generate() -> list[GenSeries]:
    rng = random.Random(20261125)
    return [*_dcgm(rng), *_llm_sft(rng), *_http(rng), _straggler()]


def _noisy(rng: random.Random, values: list[float], spread: float) -> list[float]:
    return [round(v + (rng.random() - 0.5) * spread, 4) for v in values]


def _cumulative(per_point: list[float]) -> list[float]:
    total, out = 0.0, []
    for value in per_point:
        total += value
        out.append(round(total, 3))
    return out


def _dcgm(rng: random.Random) -> list[GenSeries]:
    out: list[GenSeries] = []

    def add(metric: str, device: _Device, values: list[float], counter: bool = False) -> None:
        times = sample_times(0, device.points)
        out.append(GenSeries(metric, device.labels, counter, times, values[: device.points]))

    for device in _devices():
        n = device.points
        if device.util is not None:
            add("DCGM_FI_DEV_GPU_UTIL", device, _noisy(rng, [device.util] * n, 4))
        engine = (device.util if device.util is not None else 1.2) / 100
        add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", device, _noisy(rng, [engine] * n, 0.02))
        add("DCGM_FI_DEV_GPU_TEMP", device, _noisy(rng, [device.temp(i) for i in range(n)], 2))
        add("DCGM_FI_DEV_POWER_USAGE", device, _noisy(rng, [device.power] * n, 2))
        free = _noisy(rng, [device.fb_free] * n, 40)
        add("DCGM_FI_DEV_FB_FREE", device, free)
        total = 81559.0 if device.physical else 40192.0
        add("DCGM_FI_DEV_FB_USED", device, [round(total - f, 4) for f in free])
        out.extend(_xid(device))
        if device.physical:
            out.extend(_health(device))
            out.extend(_errors(rng, device))
    return out


def _xid(device: _Device) -> list[GenSeries]:
    """The last-value gauge (a new series when the code changes) and, for the GPU that had
    errors, the count of its window: two XID 48s, 1 min apart, seen for the 5 min after each."""
    times = sample_times(0, device.points)
    no_error = device.labels | {"err_code": "0", "err_msg": "No Error"}
    if device.key() != ("gpu-node-21", "1"):
        return [GenSeries("DCGM_FI_DEV_XID_ERRORS", no_error, False, times, [0.0] * len(times))]
    failed = device.labels | {"err_code": "48", "err_msg": "Double Bit ECC Error"}
    counted = device.labels | {"window_size_in_ms": "300000", "xid": "48"}
    window = range(ECC_AT, ECC_AT + 24)
    return [
        GenSeries("DCGM_FI_DEV_XID_ERRORS", no_error, False, times[:ECC_AT], [0.0] * ECC_AT),
        GenSeries(
            "DCGM_FI_DEV_XID_ERRORS", failed, False, times[ECC_AT:], [48.0] * (POINTS - ECC_AT)
        ),
        GenSeries(
            "DCGM_EXP_XID_ERRORS_COUNT",
            counted,
            True,
            [times[i] for i in window],
            [1.0 if i < ECC_AT + 4 or i >= ECC_AT + 20 else 2.0 for i in window],
        ),
    ]


def _health(device: _Device) -> list[GenSeries]:
    """One series per health watch, labelled with its failure code (a new series when it
    changes): 0 passes, 10 warns, 20 fails."""
    times = sample_times(0, device.points)
    out: list[GenSeries] = []
    faulty = device.key() == ("gpu-node-21", "1")
    for watch in HEALTH_WATCHES:
        labels = device.labels | {"health_watch": watch}
        since, code, status = len(times), "", 0.0
        if faulty and watch == "MEM":
            since, code, status = ECC_AT, "DCGM_FR_VOLATILE_DBE_DETECTED", 20.0
        elif faulty and watch == "THERMAL":
            since, code, status = HOT_FROM, "DCGM_FR_CLOCK_THROTTLE_THERMAL", 10.0
        ok = labels | {"health_error_code": "DCGM_FR_OK"}
        out.append(GenSeries("DCGM_EXP_GPU_HEALTH_STATUS", ok, True, times[:since], [0.0] * since))
        if since < len(times):
            failing = labels | {"health_error_code": code}
            values = [status] * (len(times) - since)
            out.append(
                GenSeries("DCGM_EXP_GPU_HEALTH_STATUS", failing, True, times[since:], values)
            )
    return out


def _errors(rng: random.Random, device: _Device) -> list[GenSeries]:
    """The violation (ns), ECC, row-remap and NVLink error counters of a GPU."""
    n, key = device.points, device.key()
    capped = key == ("gpu-node-21", "0")
    hot = key == ("gpu-node-21", "1")
    ns = 15e9  # one scrape interval, in ns
    thermal = [ns * (0.3 + 0.1 * rng.random()) if hot and i >= HOT_FROM else 0.0 for i in range(n)]
    power = [
        ns * (0.15 + 0.1 * rng.random()) if capped else ns * 0.001 * rng.random() for _ in range(n)
    ]
    dbe = [1.0 if hot and i in (ECC_AT, ECC_AT + 4) else 0.0 for i in range(n)]
    remapped = [1.0 if hot and i == ECC_AT + 1 else 0.0 for i in range(n)]
    crc = [float(rng.random() < 0.4) * rng.randint(1, 6) if capped else 0.0 for _ in range(n)]
    recovery = [1.0 if capped and i == RECOVERY_AT else 0.0 for i in range(n)]
    times = sample_times(0, n)
    families = (
        ("DCGM_FI_DEV_THERMAL_VIOLATION", thermal, 1.2e12),
        ("DCGM_FI_DEV_POWER_VIOLATION", power, 3.4e11),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", dbe, 0.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", remapped, 0.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", [0.0] * n, 0.0),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", crc, 12.0),
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", recovery, 0.0),
    )
    out = []
    for metric, increments, start in families:
        counter = metric != "DCGM_FI_DEV_ROW_REMAP_FAILURE"
        values = _cumulative([start, *increments])[1:] if counter else increments
        out.append(GenSeries(metric, device.labels, counter, times, values))
    return out


def _llm_sft(rng: random.Random) -> list[GenSeries]:
    """The step-timing series of llm-sft's two ranks: its data loader stalls, then it stops."""
    out: list[GenSeries] = []
    times = sample_times(0, DOWN_AT)
    shares: dict[str, list[list[float]]] = {}
    for rank in ("0", "1"):
        labels = {"job": "llm-sft", "rank": rank}
        phases: dict[str, list[float]] = {
            "data_loading": [
                (1.2 + 0.5 * rng.random()) if i >= STALL_FROM else 0.02 + 0.02 * rng.random()
                for i in range(DOWN_AT)
            ],
            "forward": [0.09 + 0.01 * rng.random() for _ in range(DOWN_AT)],
            "backward": [0.16 + 0.02 * rng.random() for _ in range(DOWN_AT)],
            "grad_sync": [0.03 + 0.01 * rng.random() for _ in range(DOWN_AT)],
            "optimizer": [0.02 + 0.005 * rng.random() for _ in range(DOWN_AT)],
        }
        step = [round(sum(parts), 6) for parts in zip(*phases.values(), strict=True)]
        for phase, values in phases.items():
            shares.setdefault(phase, []).append([v / s for v, s in zip(values, step, strict=True)])
        out.append(GenSeries(STEP_DURATION, labels, False, times, step))
        for phase, values in phases.items():
            rounded = [round(v, 6) for v in values]
            out.append(GenSeries(PHASE_DURATION, labels | {"phase": phase}, False, times, rounded))
        samples = [round(32 / s, 4) for s in step]
        out.append(GenSeries(SAMPLES_PER_SECOND, labels, False, times, samples))
        tokens = [round(32 * 4096 / s, 2) for s in step]
        out.append(GenSeries(TOKENS_PER_SECOND, labels, False, times, tokens))
        numbers = _cumulative([float(math.floor(15 / s)) for s in step])
        out.append(GenSeries(STEP_NUMBER, labels, True, times, numbers))
    # The job's diagnosis (tuner/diagnosis_series.py): each phase's share, mean over the ranks.
    for phase, per_rank in shares.items():
        mean = [round(sum(v) / len(v), 6) for v in zip(*per_rank, strict=True)]
        labels = {"job": "llm-sft", "phase": phase}
        out.append(GenSeries(PHASE_SHARE, labels, False, times, mean))
    return out


def _straggler() -> GenSeries:
    """llm-pretrain-b's rank 1 runs on gpu-node-21's hot GPU 1: from 10 min its diagnosis names
    it as lagging in backward, by a throttled GPU's 20-30 %."""
    labels = {
        "job": "llm-pretrain-b",
        "rank": "1",
        "lags_in": "backward",
        "Hostname": "gpu-node-21",
        "gpu": "1",
    }
    values = [round(0.25 + 0.05 * math.sin(i), 4) for i in range(HOT_FROM, POINTS)]
    return GenSeries(STRAGGLER_RATIO, labels, False, sample_times(HOT_FROM, POINTS), values)


def _http(rng: random.Random) -> list[GenSeries]:
    """``http_server_request_duration_seconds`` of three replicas as cumulative OTLP
    histograms: each ``le`` a counter (labelled as tuneloop's receiver formats bounds), with
    ``_sum`` and ``_count``."""
    out: list[GenSeries] = []
    times = sample_times()
    replicas = (
        ("inference/vllm", "vllm-6d9f7c8b5-x2k4q", "/v1/completions", 0.12),
        ("inference/vllm", "vllm-6d9f7c8b5-p8m3t", "/v1/completions", 0.11),
        ("inference/embedder", "embedder-7c4b9d6f8-r5n2v", "/v1/embeddings", 0.02),
    )
    name = "http_server_request_duration_seconds"
    for job, instance, route, typical in replicas:
        labels = {
            "job": job,
            "instance": instance,
            "otel_scope_name": "opentelemetry.instrumentation.fastapi",
            "http_request_method": "POST",
            "http_route": route,
            "http_response_status_code": "200",
        }
        counts = [0.0] * (len(HTTP_BOUNDS) + 1)
        buckets: list[list[float]] = [[] for _ in counts]
        sums, total = [], 0.0
        for i in range(POINTS):
            slow = job == "inference/vllm" and i in SLOW
            for _ in range(rng.randint(20, 40)):
                latency = typical * rng.lognormvariate(0, 0.5) * (6 if slow else 1)
                total += latency
                for b, bound in enumerate((*HTTP_BOUNDS, math.inf)):
                    counts[b] += latency <= bound
            for b, count in enumerate(counts):
                buckets[b].append(count)
            sums.append(round(total, 6))
        for bound, values in zip((*HTTP_BOUNDS, math.inf), buckets, strict=True):
            le = "+Inf" if bound == math.inf else repr(float(bound))
            out.append(GenSeries(f"{name}_bucket", labels | {"le": le}, True, times, values))
        out.append(GenSeries(f"{name}_sum", labels, True, times, sums))
        out.append(GenSeries(f"{name}_count", labels, True, times, buckets[-1]))
    return out
