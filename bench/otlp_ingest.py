"""End-to-end OTLP ingest benchmark: protobuf export requests through the HTTP receiver into
PostgreSQL, against raw binary COPY of the very same samples (and VictoriaMetrics, if installed).

What is timed, per contender, interleaved in rotating order, median of the repeats:

* **OTLP ingest**: the real API app (``create_app`` with the pipeline ``build_pipeline`` makes,
  as ``tuneloop api`` serves it) under uvicorn in a child process, on a real socket on
  127.0.0.1, with a project token. An httpx client in this process POSTs the pre-serialized
  ``ExportMetricsServiceRequest`` bodies over a few keep-alive connections. The clock runs from
  the first request until every sample is committed: after the last response the child stops
  its pipeline (``Pipeline.stop`` drains the queue straight away, as at shutdown, rather than
  after ``flush_interval_s``) and says so. Each repeat gets a fresh server, warmed up first
  (series created, partitions made, token seen), then ``samples`` is truncated: the timed run
  is the steady state of a receiver whose series exist.
* **raw COPY**: the same ``(series_id, ts, value)`` rows, pre-built, drained into psycopg's
  ``Copy.write_row`` by a C-level loop in one transaction (as ``bench/storage_write.py``).
* **VictoriaMetrics** (optional): ``/usr/bin/victoria-metrics`` from the Debian package, a fresh
  instance per repeat with a temporary data directory, importing the same samples (same metric
  names, labels, timestamps to the millisecond and values) as Prometheus text in the same
  number of requests over the same number of connections, then ``/internal/force_flush`` so
  that they are searchable. The packaged version (1.79) has no OTLP endpoint.

Two shapes of the same samples (10 GPU metrics x 100 GPUs on 13 hosts, 7 attributes per data
point, resource attributes ``service.name``/``host.name``/...):

* **batched**: ``--points-per-request`` (default 10) points per series in each request, as an
  exporter or collector batching over time sends;
* **periodic**: one point per series per request, what a periodic SDK exporter sends.

OTLP ingest runs with the durable acknowledgement (``TUNELOOP_COLLECTOR_DURABLE=true``, the
default: each request answered only once its samples are fsync'ed to the write-ahead log) and,
with ``--durable both``, also without it (answered from memory), interleaved in the same run.

The ratio is baseline_time / ingest_time: 1.0 would be as fast as the baseline. A scratch
database is created and dropped; nothing else is touched::

    .venv/bin/python bench/otlp_ingest.py            # 10^6 samples per shape
    .venv/bin/python bench/otlp_ingest.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality
from sqlalchemy import Engine

# The sibling benchmark's scratch-database and raw-COPY helpers: the baseline is the same code.
from storage_write import (
    count_samples,
    machine,
    raw_copy,
    reset_samples,
    scratch_database,
    series_ids,
)

from collector.otlp.delta import DeltaAccumulator
from collector.otlp.metrics import map_metrics
from tuneloop import accounts
from tuneloop.ports import free_port
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.types import SeriesBatch, fingerprint
from tuneloop.storage.timeseries.writer import SampleWriter

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
VICTORIA_METRICS = "/usr/bin/victoria-metrics"
STEP_NS = 15_000_000_000
GPUS_PER_HOST = 8
CUMULATIVE = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
# (OpenTelemetry name, unit, kind): "double"/"int" gauges, one monotonic cumulative sum.
METRICS = [
    ("gpu.utilization", "1", "double"),
    ("gpu.memory.copy_utilization", "1", "double"),
    ("gpu.memory.used", "By", "int"),
    ("gpu.memory.free", "By", "int"),
    ("gpu.power.usage", "W", "double"),
    ("gpu.temperature", "Cel", "int"),
    ("gpu.sm.clock", "MHz", "int"),
    ("gpu.sm.active", "1", "double"),
    ("gpu.tensor.active", "1", "double"),
    ("gpu.energy.consumption", "J", "counter"),
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- payloads


@dataclass(frozen=True, slots=True)
class Workload:
    """The samples every contender loads: ``gpus`` x len(METRICS) series x ``ticks`` points."""

    gpus: int
    ticks: int
    end_ns: int
    values: list[list[list[float | int]]]  # [metric][gpu][tick]
    uuids: list[str]

    @property
    def samples(self) -> int:
        return self.gpus * len(METRICS) * self.ticks

    @property
    def start_ns(self) -> int:
        return self.end_ns - (self.ticks - 1) * STEP_NS


def make_workload(gpus: int, ticks: int, seed: int = 7) -> Workload:
    rng = random.Random(seed)
    # Whole seconds, five minutes ago: recent enough for any retention, never in the future.
    end_ns = (time.time_ns() // 1_000_000_000 - 300) * 1_000_000_000
    values: list[list[list[float | int]]] = []
    for _name, _unit, kind in METRICS:
        per_gpu: list[list[float | int]] = []
        for _gpu in range(gpus):
            if kind == "int":
                per_gpu.append([rng.randrange(0, 80_000_000_000) for _ in range(ticks)])
            elif kind == "counter":
                total, series = rng.uniform(0, 1e6), []
                for _ in range(ticks):
                    total += rng.uniform(0, 10_000)
                    series.append(total)
                per_gpu.append(series)
            else:
                per_gpu.append([rng.random() for _ in range(ticks)])
        values.append(per_gpu)
    uuids = [f"GPU-{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(gpus)]
    return Workload(gpus, ticks, end_ns, values, uuids)


def _attribute(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def build_request(workload: Workload, first_tick: int, last_tick: int) -> bytes:
    """One export request with ticks [first_tick, last_tick) of every series: one
    ResourceMetrics per host, one Metric per name in it, the points of each GPU in time order."""
    request = ExportMetricsServiceRequest()
    hosts = (workload.gpus + GPUS_PER_HOST - 1) // GPUS_PER_HOST
    for host in range(hosts):
        resource_metrics = request.resource_metrics.add()
        host_name = f"gpu-node-{host:03d}"
        resource_metrics.resource.attributes.extend(
            [
                _attribute("service.name", "gpu-telemetry"),
                _attribute("service.instance.id", f"{host_name}:9400"),
                _attribute("host.name", host_name),
                _attribute("k8s.cluster.name", "train-a"),
                _attribute("telemetry.sdk.name", "opentelemetry"),
                _attribute("telemetry.sdk.language", "go"),
                _attribute("telemetry.sdk.version", "1.28.0"),
            ]
        )
        scope_metrics = resource_metrics.scope_metrics.add()
        scope_metrics.scope.name = "tuneloop.bench.gpu"
        scope_metrics.scope.version = "1.0.0"
        gpus = range(host * GPUS_PER_HOST, min((host + 1) * GPUS_PER_HOST, workload.gpus))
        for index, (name, unit, kind) in enumerate(METRICS):
            metric = scope_metrics.metrics.add(name=name, unit=unit)
            if kind == "counter":
                metric.sum.aggregation_temporality = CUMULATIVE
                metric.sum.is_monotonic = True
                points = metric.sum.data_points
            else:
                points = metric.gauge.data_points
            for gpu in gpus:
                attributes = [
                    _attribute("gpu", str(gpu % GPUS_PER_HOST)),
                    _attribute("gpu.uuid", workload.uuids[gpu]),
                    _attribute("device", f"nvidia{gpu % GPUS_PER_HOST}"),
                    _attribute("gpu.model", "NVIDIA H100 80GB HBM3"),
                    _attribute("k8s.namespace.name", "training"),
                    _attribute("k8s.pod.name", f"llm-pretrain-worker-{host}"),
                    _attribute("k8s.container.name", "trainer"),
                ]
                for tick in range(first_tick, last_tick):
                    point = points.add(time_unix_nano=workload.start_ns + tick * STEP_NS)
                    point.attributes.extend(attributes)
                    value = workload.values[index][gpu][tick]
                    if kind == "int":
                        point.as_int = int(value)
                    else:
                        point.as_double = float(value)
                    if kind == "counter":
                        point.start_time_unix_nano = workload.start_ns - STEP_NS
    return bytes(request.SerializeToString())


def build_requests(workload: Workload, points_per_request: int) -> list[bytes]:
    return [
        build_request(workload, first, min(first + points_per_request, workload.ticks))
        for first in range(0, workload.ticks, points_per_request)
    ]


def map_locally(bodies: Sequence[bytes]) -> list[list[SeriesBatch]]:
    """What the receiver makes of each body: the series, names and labels every other
    contender uses, so that they load exactly the same samples."""
    now = datetime.now(UTC)
    mapped = []
    for body in bodies:
        request = ExportMetricsServiceRequest.FromString(body)
        result = map_metrics(
            request, project_id=0, now=now, max_series=10**9, deltas=DeltaAccumulator()
        )
        assert result.rejections.total == 0, result.rejections.summary("points")
        mapped.append(result.batches)
    return mapped


# ---------------------------------------------------------------------- the tuneloop server


class GcClock:
    """Seconds the cyclic garbage collector ran since :meth:`reset` (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.seconds = 0.0

    def _callback(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def serve(port: int, *, gc_freeze: bool) -> None:
    """The child process: the API app as ``tuneloop api`` assembles it, plus control lines on
    stdin: ``start`` zeroes the GC clock; ``drain`` stops the pipeline (writing everything
    queued) and answers ``drained <seconds spent in GC since start>``."""
    import uvicorn

    from api.main import create_app
    from collector.service import build_pipeline
    from tuneloop.runtime import Runtime
    from tuneloop.settings import configure, load_settings

    settings = configure(load_settings(host="127.0.0.1", port=port))
    runtime = Runtime.open(settings)
    pipeline = build_pipeline(runtime)
    pipeline.start()
    clock = GcClock()

    def control() -> None:
        for line in sys.stdin:
            if line.strip() == "start":
                clock.reset()
            elif line.strip() == "drain":
                pipeline.stop()
                print(f"drained {clock.seconds}", flush=True)

    threading.Thread(target=control, name="bench-control", daemon=True).start()
    app = create_app(runtime, pipeline)
    if gc_freeze:
        # What an entry point can do once started: the objects alive now (modules, the app)
        # are left out of every later collection.
        gc.freeze()
    config = uvicorn.Config(
        app, host=settings.host, port=port, log_level=settings.log_level, access_log=False
    )
    uvicorn.Server(config).run()
    pipeline.stop()
    runtime.close()


class Server:
    """A child process serving the API app on a free port (see :func:`serve`)."""

    def __init__(
        self, database_url: str, data_dir: Path, *, gc_freeze: bool = False, durable: bool = True
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "TUNELOOP_DATABASE_URL": database_url,
            "TUNELOOP_DATA_DIR": str(data_dir),
            "TUNELOOP_LOG_LEVEL": "warning",
            "TUNELOOP_COLLECTOR_DURABLE": "true" if durable else "false",
        }
        env.pop("TUNELOOP_REDIS_URL", None)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port)]
            + (["--gc-freeze"] if gc_freeze else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        wait_until_up(f"{self.url}/healthz", self.process)

    def start(self) -> None:
        self._send("start")

    def drain(self) -> float:
        """Block until the child's pipeline has written everything it accepted; the seconds
        its garbage collector ran since :meth:`start`."""
        self._send("drain")
        line = self._pipes()[1].readline()
        word, _, seconds = line.partition(" ")
        if word != "drained":
            raise RuntimeError(f"the server did not drain (said {line!r})")
        return float(seconds)

    def _send(self, command: str) -> None:
        stdin = self._pipes()[0]
        stdin.write(command + "\n")
        stdin.flush()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.process.stdin is not None and self.process.stdout is not None
        return self.process.stdin, self.process.stdout


def wait_until_up(url: str, process: subprocess.Popen[str], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server at {url} did not come up in {timeout_s:.0f} s")
        time.sleep(0.05)


# ---------------------------------------------------------------------- the HTTP client


@dataclass(slots=True)
class Sent:
    requests: int = 0
    retried: int = 0
    """503 answers (pipeline full) that were retried."""


async def post_all(
    url: str,
    bodies: Sequence[bytes],
    *,
    headers: dict[str, str],
    connections: int,
    check: Callable[[httpx.Response], None],
) -> Sent:
    """POST every body, ``connections`` at a time over keep-alive connections; a 503 is retried
    after 10 ms (an exporter would wait Retry-After: the count is reported)."""
    sent = Sent()
    pending = iter(bodies)
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=300.0) as client:

        async def worker() -> None:
            for body in pending:
                while True:
                    response = await client.post(url, content=body)
                    if response.status_code != 503:
                        break
                    sent.retried += 1
                    await asyncio.sleep(0.01)
                check(response)
                sent.requests += 1

        await asyncio.gather(*(worker() for _ in range(connections)))
    return sent


def check_otlp(response: httpx.Response) -> None:
    if response.status_code != 200:
        raise RuntimeError(f"OTLP export answered {response.status_code}: {response.text[:300]}")
    partial = ExportMetricsServiceResponse.FromString(response.content).partial_success
    if partial.rejected_data_points:
        raise RuntimeError(f"points rejected: {partial.error_message}")


def check_victoria(response: httpx.Response) -> None:
    if response.status_code not in (200, 204):
        raise RuntimeError(f"VictoriaMetrics answered {response.status_code}: {response.text}")


# ---------------------------------------------------------------------- contenders


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    points_per_request: int
    bodies: list[bytes]
    warmup: list[bytes]
    warmup_samples: int
    prometheus_text: list[bytes]


@dataclass(slots=True)
class Bench:
    engine: Engine
    database_url: str
    data_dir: Path
    token: str
    workload: Workload
    rows: list[tuple[int, datetime, float]]
    connections: int
    gc_freeze: bool
    retried: dict[str, list[int]] = field(default_factory=dict)
    gc_share: dict[str, list[float]] = field(default_factory=dict)
    """Per shape and run: the part of the time the server's garbage collector ran."""

    def raw(self) -> float:
        reset_samples(self.engine)
        started = time.perf_counter()
        raw_copy(self.engine, self.rows)
        elapsed = time.perf_counter() - started
        self._check_count("raw COPY")
        return elapsed

    def otlp(self, shape: Shape, *, durable: bool = True) -> float:
        server = Server(self.database_url, self.data_dir, gc_freeze=self.gc_freeze, durable=durable)
        try:
            headers = {
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/x-protobuf",
            }
            url = f"{server.url}/v1/metrics"
            # Warm-up: series, partitions and the token, then an empty table for the timed run.
            reset_samples(self.engine)
            asyncio.run(
                post_all(url, shape.warmup, headers=headers, connections=1, check=check_otlp)
            )
            wait_for(lambda: count_samples(self.engine) == shape.warmup_samples)
            reset_samples(self.engine)
            server.start()
            started = time.perf_counter()
            sent = asyncio.run(
                post_all(
                    url,
                    shape.bodies,
                    headers=headers,
                    connections=self.connections,
                    check=check_otlp,
                )
            )
            gc_seconds = server.drain()
            elapsed = time.perf_counter() - started
        finally:
            server.close()
        name = contender(shape, durable)
        self.retried.setdefault(name, []).append(sent.retried)
        self.gc_share.setdefault(name, []).append(gc_seconds / elapsed)
        self._check_count(name)
        return elapsed

    def victoria(self, shape: Shape) -> float:
        with victoria_metrics() as url:
            asyncio.run(
                post_all(
                    f"{url}/api/v1/import/prometheus",
                    prometheus_text(shape.warmup, shift_ms=-86_400_000),
                    headers={},
                    connections=1,
                    check=check_victoria,
                )
            )
            httpx.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
            started = time.perf_counter()
            asyncio.run(
                post_all(
                    f"{url}/api/v1/import/prometheus",
                    shape.prometheus_text,
                    headers={},
                    connections=self.connections,
                    check=check_victoria,
                )
            )
            httpx.get(f"{url}/internal/force_flush", timeout=60).raise_for_status()
            elapsed = time.perf_counter() - started
            stored = victoria_count(url, self.workload)
        if stored != self.workload.samples:
            raise RuntimeError(f"VictoriaMetrics holds {stored} samples, not {len(self.rows)}")
        return elapsed

    def _check_count(self, name: str) -> None:
        stored = count_samples(self.engine)
        if stored != len(self.rows):
            raise RuntimeError(f"{name} stored {stored} samples, not {len(self.rows)}")


def wait_for(probe: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for the warm-up samples")
        time.sleep(0.05)


# ---------------------------------------------------------------------- VictoriaMetrics


def prometheus_text(mapped_bodies: Sequence[bytes], *, shift_ms: int = 0) -> list[bytes]:
    """The Prometheus text exposition of each OTLP body (as the receiver maps it), with
    millisecond timestamps: the samples tuneloop stores, in the same requests."""
    texts = []
    for batches in map_locally(mapped_bodies):
        lines = []
        for batch in batches:
            labels = ",".join(f'{name}="{_escape(value)}"' for name, value in batch.labels.items())
            head = f"{batch.metric}{{{labels}}} "
            for ts, value in zip(batch.timestamps, batch.values, strict=True):
                millis = int(ts.timestamp()) * 1000 + ts.microsecond // 1000 + shift_ms
                lines.append(f"{head}{float(value)!r} {millis}")
        texts.append(("\n".join(lines) + "\n").encode())
    return texts


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@contextmanager
def victoria_metrics() -> Iterator[str]:
    """A fresh VictoriaMetrics on a free port with a temporary data directory."""
    data = tempfile.mkdtemp(prefix="tuneloop-bench-vm-")
    port = free_port()
    process = subprocess.Popen(
        [
            VICTORIA_METRICS,
            f"-storageDataPath={data}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-loggerLevel=ERROR",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/health", process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(data, ignore_errors=True)


def victoria_count(url: str, workload: Workload) -> int:
    """Samples VictoriaMetrics holds in the timed range (the warm-up was a day earlier)."""
    window_s = (workload.end_ns - workload.start_ns) // 1_000_000_000 + 1
    response = httpx.get(
        f"{url}/api/v1/query",
        params={
            "query": f'sum(count_over_time({{__name__=~".+"}}[{window_s}s]))',
            "time": str(workload.end_ns // 1_000_000_000),
        },
        timeout=60,
    )
    response.raise_for_status()
    result = response.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


# ---------------------------------------------------------------------- setup and report


def make_token(engine: Engine) -> tuple[int, str]:
    """A project and an agent token for it, as ``tuneloop token create`` would."""
    with session_scope(session_factory(engine)) as session:
        project = accounts.create_project(session, "bench")
        _, secret = accounts.create_token(session, project, "bench", "agent")
        return project.id, secret


def reference_rows(
    engine: Engine, project_id: int, bodies: Sequence[bytes]
) -> list[tuple[int, datetime, float]]:
    """The raw-COPY rows: every sample of ``bodies`` with the id of its series, created here
    (the servers find them in place, as their warm-up would)."""
    mapped = map_locally(bodies)
    SampleWriter(engine).write(project_id, [batch for batches in mapped for batch in batches])
    ids = series_ids(engine, project_id)
    reset_samples(engine)
    return [
        (ids[fingerprint(batch.metric, batch.labels)], ts, value)
        for batches in mapped
        for batch in batches
        for ts, value in zip(batch.timestamps, batch.values, strict=True)
    ]


def make_shape(workload: Workload, name: str, points_per_request: int, vm: bool) -> Shape:
    bodies = build_requests(workload, points_per_request)
    warmup = [bodies[0], bodies[-1]] if len(bodies) > 1 else bodies[:1]
    per_request = workload.samples // workload.ticks
    warmup_ticks = min(points_per_request, workload.ticks) + (
        workload.ticks - (len(bodies) - 1) * points_per_request if len(bodies) > 1 else 0
    )
    log(
        f"{name}: {len(bodies):,} requests of {points_per_request} point(s) per series, "
        f"{statistics.mean(map(len, bodies)) / 1e6:.2f} MB each"
    )
    return Shape(
        name,
        points_per_request,
        bodies,
        warmup,
        per_request * warmup_ticks,
        prometheus_text(bodies) if vm else [],
    )


@dataclass(frozen=True, slots=True)
class Result:
    shape: Shape
    durable: bool
    samples: int
    raw_s: float
    otlp_s: float
    vm_s: float | None
    retried: int
    gc_share: float


def table(results: Sequence[Result]) -> str:
    vm = any(result.vm_s is not None for result in results)
    head = (
        "| shape | requests | samples | raw COPY (s) | OTLP ingest (s) | samples/s "
        "| ratio vs COPY | server GC |"
    )
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|"
    if vm:
        head += " VictoriaMetrics (s) | VM samples/s | ratio vs VM |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for result in results:
        line = (
            f"| {result.shape.name} ({result.shape.points_per_request}/series/request"
            f"{'' if result.durable else ', not durable'}) "
            f"| {len(result.shape.bodies):,} | {result.samples:,} | {result.raw_s:.3f} "
            f"| {result.otlp_s:.3f} | {result.samples / result.otlp_s:,.0f} "
            f"| **{result.raw_s / result.otlp_s:.2f}** | {result.gc_share:.0%} |"
        )
        if result.vm_s is not None:
            line += (
                f" {result.vm_s:.3f} | {result.samples / result.vm_s:,.0f} "
                f"| **{result.vm_s / result.otlp_s:.2f}** |"
            )
        lines.append(line)
    return "\n".join(lines)


def contender(shape: Shape, durable: bool) -> str:
    return f"otlp {shape.name}" + ("" if durable else " not durable")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TUNELOOP_BENCH_DATABASE_URL", DEFAULT_URL),
        help="PostgreSQL server to run on; a scratch database is created there and dropped",
    )
    parser.add_argument("--quick", action="store_true", help="small N, 2 repeats: a smoke run")
    parser.add_argument("--gpus", type=int, default=100, help="series per metric (10 metrics)")
    parser.add_argument("--ticks", type=int, default=1_000, help="points per series")
    parser.add_argument("--points-per-request", type=int, default=10, help="batched shape")
    parser.add_argument("--shapes", nargs="+", choices=("batched", "periodic"))
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--victoria-metrics",
        choices=("auto", "yes", "no"),
        default="auto",
        help=f"also time VictoriaMetrics ({VICTORIA_METRICS}); auto: if installed",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="the server calls gc.freeze() once started (not what tuneloop api does today)",
    )
    parser.add_argument(
        "--durable",
        choices=("yes", "no", "both"),
        default="both",
        help="OTLP ingest with the durable acknowledgement, without it, or both (interleaved)",
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve is not None:
        serve(args.serve, gc_freeze=args.gc_freeze)
        return 0
    gpus, ticks = (16, 50) if args.quick else (args.gpus, args.ticks)
    repeats = 2 if args.quick else args.repeats
    vm = args.victoria_metrics == "yes" or (
        args.victoria_metrics == "auto" and os.access(VICTORIA_METRICS, os.X_OK)
    )
    workload = make_workload(gpus, ticks)
    log(f"{workload.samples:,} samples: {gpus * len(METRICS):,} series x {ticks:,} points")
    wanted = args.shapes or ["batched", "periodic"]
    shapes = [
        make_shape(workload, name, per_request, vm)
        for name, per_request in (("batched", args.points_per_request), ("periodic", 1))
        if name in wanted
    ]
    with (
        scratch_database(args.database_url) as url,
        tempfile.TemporaryDirectory(prefix="tuneloop-bench-") as data_dir,
    ):
        engine = make_engine(url)
        try:
            metadata.create_all(engine)
            log(f"machine: {machine(engine)}")
            project_id, token = make_token(engine)
            rows = reference_rows(engine, project_id, shapes[0].bodies)
            bench = Bench(
                engine, url, Path(data_dir), token, workload, rows, args.connections, args.gc_freeze
            )
            contenders: list[tuple[str, Callable[[], float]]] = [("raw", bench.raw)]
            modes = {"yes": [True], "no": [False], "both": [True, False]}[args.durable]
            for shape in shapes:
                for durable in modes:
                    contenders.append(
                        (contender(shape, durable), partial(bench.otlp, shape, durable=durable))
                    )
                if vm:
                    contenders.append((f"vm {shape.name}", partial(bench.victoria, shape)))
            times: dict[str, list[float]] = {name: [] for name, _ in contenders}
            for repeat in range(repeats):
                shift = repeat % len(contenders)
                for name, action in contenders[shift:] + contenders[:shift]:
                    elapsed = action()
                    times[name].append(elapsed)
                    log(
                        f"  repeat {repeat + 1}/{repeats} {name:>28}: {elapsed:7.3f} s "
                        f"({workload.samples / elapsed:,.0f} samples/s)"
                    )
            raw_s = statistics.median(times["raw"])
            results = [
                Result(
                    shape,
                    durable,
                    workload.samples,
                    raw_s,
                    statistics.median(times[contender(shape, durable)]),
                    statistics.median(times[f"vm {shape.name}"]) if vm else None,
                    sum(bench.retried.get(contender(shape, durable), [])),
                    statistics.median(bench.gc_share[contender(shape, durable)]),
                )
                for shape in shapes
                for durable in modes
            ]
            print(
                f"\n{machine(engine)}; median of {repeats} interleaved runs, "
                f"{args.connections} connections"
                + (", server with gc.freeze()" if args.gc_freeze else "")
                + "\n"
            )
            print(table(results))
            for result in results:
                if result.retried:
                    name = contender(result.shape, result.durable)
                    print(f"{name}: {result.retried} requests answered 503, retried")
        finally:
            engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
