"""Prometheus remote write, both ways, against VictoriaMetrics doing the same in the same run.

1. **Ingest**: the same remote-write bodies POSTed to tuneloop's ``/api/v1/write`` (``tuneloop
   api`` in a child process, a project token, on SQLite and on PostgreSQL) and to
   VictoriaMetrics' ``/api/v1/write``, over the same number of connections, each connection
   sending its own series in time order as a Prometheus shard does. The clock runs from the
   first request until every sample is stored: for tuneloop until the child, stopped with
   SIGTERM after the last answer, has drained its pipeline into the store and exited; for
   VictoriaMetrics until ``/internal/force_flush`` returns. Each tuneloop run gets a fresh
   child, warmed up first (its series created), outside the clock.
2. **Forwarding**: the receiver's batches of the same samples submitted to tuneloop's
   forwarding pipeline (``collector.service.forwarding_pipeline``: write-ahead log, batching,
   ``RemoteWriter``) until it has drained into VictoriaMetrics, against the very bodies it
   sends (same series with ``tuneloop_project``, same 10,000-sample requests), pre-encoded and
   POSTed by one connection as the forwarder uses one.

Contenders interleaved in rotating order, ``--repeats`` times; medians with 95% bootstrap
intervals, and the ratio of VictoriaMetrics' time to tuneloop's (1.0: as fast) per repeat, its
median and interval. Every count is checked after the clock stops. Scratch databases and data
directories are made and removed; nothing else is touched::

    python bench/remote_write.py --repeats 5 --out bench/data/remote_write.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import func, select

from collector.relabel import Relabeler
from collector.remote_write.receiver import RemoteWriteReceiver
from collector.service import forwarding_pipeline
from tuneloop import accounts, remote_write
from tuneloop.ports import free_port
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.migrate import upgrade
from tuneloop.storage.models import samples
from tuneloop.storage.prometheus.remote_writer import RemoteWriter
from tuneloop.storage.timeseries.columns import Batch

sys.path.insert(0, str(Path(__file__).parent))
from storage_write import DEFAULT_URL, scratch_database

ROOT = Path(__file__).resolve().parents[1]
DAY_MS = 86_400_000
TICK_MS = 15_000
TICKS_PER_REQUEST = 10
CONNECTIONS = 4
METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "node_network_receive_bytes_total",
    "train_tokens_total",
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------- workload


def series_labels(count: int) -> list[tuple[str, dict[str, str]]]:
    """``count`` dcgm-exporter-like series: metric, GPU, host, pod."""
    return [
        (
            METRICS[i % len(METRICS)],
            {
                "gpu": str(i // len(METRICS) % 8),
                "Hostname": f"gpu-node-{i // (8 * len(METRICS))}",
                "job": "dcgm",
                "namespace": "training",
                "pod": f"llama-{i // 40}",
            },
        )
        for i in range(count)
    ]


def shard_bodies(
    series: int, ticks: int, start_ms: int, per_request: int, extra: dict[str, str] | None = None
) -> list[list[bytes]]:
    """Per connection, its bodies in send order: its share of the series, ``TICKS_PER_REQUEST``
    ticks of each per request, ``per_request`` series per request (a Prometheus shard)."""
    rng = random.Random(start_ms)
    all_labels = series_labels(series)
    shards: list[list[bytes]] = [[] for _ in range(CONNECTIONS)]
    groups = [all_labels[i : i + per_request] for i in range(0, series, per_request)]
    for first in range(0, ticks, TICKS_PER_REQUEST):
        stamps = [
            start_ms + TICK_MS * t for t in range(first, min(ticks, first + TICKS_PER_REQUEST))
        ]
        for index, group in enumerate(groups):
            body = remote_write.encode(
                remote_write.series(
                    metric,
                    {**labels, **(extra or {})},
                    stamps,
                    [rng.random() * 100 for _ in stamps],
                )
                for metric, labels in group
            )
            shards[index % CONNECTIONS].append(body)
    return shards


def forward_bodies(batches: Sequence[Batch], url: str) -> list[bytes]:
    """What the forwarder sends for ``batches`` (project 1): its own conversion and split."""
    writer = RemoteWriter(url)
    bodies, _ = writer.requests(1, batches)
    writer.close()
    return [body for body, _ in bodies]


# ---------------------------------------------------------------------- peers


@contextmanager
def process(
    command: list[str], ready_url: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if child.poll() is not None:
                errors = child.stderr.read().decode()[-2000:] if child.stderr else ""
                raise RuntimeError(f"{command[0]} exited: {errors}")
            try:
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{ready_url} did not come up")
            time.sleep(0.05)
        yield child
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextmanager
def victoria_metrics() -> Iterator[str]:
    data = tempfile.mkdtemp(prefix="tuneloop-bench-vm-")
    port = free_port()
    command = [
        shutil.which("victoria-metrics") or "victoria-metrics",
        f"-storageDataPath={data}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        "-search.latencyOffset=0s",
        "-loggerLevel=ERROR",
    ]
    try:
        with process(command, f"http://127.0.0.1:{port}/health"):
            yield f"http://127.0.0.1:{port}"
    finally:
        shutil.rmtree(data, ignore_errors=True)


def vm_count(url: str, start_ms: int, ticks: int) -> int:
    """Samples VictoriaMetrics holds from ``start_ms`` on for ``ticks`` ticks (the windows of
    the runs are days apart)."""
    end_s = (start_ms + TICK_MS * ticks) / 1000
    query = f'sum(count_over_time({{__name__=~".+"}}[{TICK_MS * ticks // 1000 + 5}s]))'
    answer = httpx.get(f"{url}/api/v1/query", params={"query": query, "time": end_s}, timeout=60)
    result = answer.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def post_shards(url: str, shards: Sequence[Sequence[bytes]], headers: dict[str, str]) -> None:
    def send(bodies: Sequence[bytes]) -> None:
        with httpx.Client(headers={**remote_write.HEADERS, **headers}, timeout=300) as client:
            for body in bodies:
                while (response := client.post(url, content=body)).status_code == 503:
                    time.sleep(0.01)
                if response.status_code >= 300:
                    raise RuntimeError(
                        f"{url} answered {response.status_code}: {response.text[:300]}"
                    )

    with ThreadPoolExecutor(len(shards)) as pool:
        list(pool.map(send, shards))


# ---------------------------------------------------------------------- contenders


class Tuneloop:
    """``tuneloop api`` on one database, a fresh child per run."""

    def __init__(self, name: str, database_url: str, data_dir: Path) -> None:
        self.name = name
        self.url = database_url
        self.data_dir = data_dir
        upgrade(database_url)
        self.engine = make_engine(database_url)
        with session_scope(session_factory(self.engine)) as session:
            project = accounts.create_project(session, "bench")
            _, self.token = accounts.create_token(session, project, "prometheus", "agent")

    def stored(self) -> int:
        with self.engine.connect() as connection:
            return int(connection.execute(select(func.count()).select_from(samples)).scalar_one())

    def run(self, shards: Sequence[Sequence[bytes]], warmup: Sequence[Sequence[bytes]]) -> float:
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TUNELOOP_DATABASE_URL": self.url,
            "TUNELOOP_DATA_DIR": str(self.data_dir),
            "TUNELOOP_LOG_LEVEL": "warning",
        }
        command = [
            sys.executable,
            "-m",
            "tuneloop",
            "api",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {self.token}"}
        with process(command, f"{url}/healthz", env) as child:
            post_shards(f"{url}/api/v1/write", warmup, headers)
            time.sleep(1.5)  # the warm-up's series created and written
            started = time.perf_counter()
            post_shards(f"{url}/api/v1/write", shards, headers)
            child.send_signal(signal.SIGTERM)  # drains the pipeline into the store, then exits
            child.wait(300)
            return time.perf_counter() - started


def vm_ingest(url: str, shards: Sequence[Sequence[bytes]]) -> float:
    started = time.perf_counter()
    post_shards(f"{url}/api/v1/write", shards, {})
    httpx.get(f"{url}/internal/force_flush", timeout=60)
    return time.perf_counter() - started


def forward(url: str, batches: Sequence[Batch], data_dir: Path) -> float:
    settings = Settings(data_dir=data_dir, remote_write_url=f"{url}/api/v1/write")
    pipeline = forwarding_pipeline(settings, Relabeler())
    pipeline.start()
    started = time.perf_counter()
    for block in batches:
        pipeline.submit(1, [block])
    pipeline.stop(timeout_s=300)  # drains everything into VictoriaMetrics
    httpx.get(f"{url}/internal/force_flush", timeout=60)
    return time.perf_counter() - started


def vm_direct(url: str, bodies: Sequence[bytes]) -> float:
    started = time.perf_counter()
    post_shards(f"{url}/api/v1/write", [bodies], {})
    httpx.get(f"{url}/internal/force_flush", timeout=60)
    return time.perf_counter() - started


# ---------------------------------------------------------------------- statistics


def interval(values: Sequence[float], seed: int = 1) -> tuple[float, float, float]:
    """Median and its 95% bootstrap interval."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return statistics.median(values), medians[49], medians[1949]


def decode(shards: Sequence[Sequence[bytes]]) -> list[Batch]:
    receiver = RemoteWriteReceiver(max_body_bytes=64 * 1024 * 1024)
    out: list[Batch] = []
    for body in (body for shard in shards for body in shard):
        receiver.write(body, content_type=None, content_encoding=None, submit=out.extend)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--series", type=int, default=1000, help="series per run (1000)")
    parser.add_argument("--samples", type=int, default=50, help="samples per series per run (50)")
    parser.add_argument(
        "--per-request",
        type=int,
        default=200,
        help="series per request (200: 2,000 samples, Prometheus's max_samples_per_send)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TUNELOOP_BENCH_DATABASE_URL", DEFAULT_URL),
        help="PostgreSQL next to which a scratch database is made",
    )
    parser.add_argument("--out", type=Path, help="write the raw figures as JSON here")
    return parser.parse_args(argv)


Run = tuple[str, Callable[[], float], Callable[[], int], int]
"""A contender's name, its timed run, the count of samples it stored, and the count due."""


def repeat_runs(
    args: argparse.Namespace, repeat: int, systems: Sequence[Tuneloop], vm: str, scratch: Path
) -> list[Run]:
    """This repeat's contenders, their data built now (outside every clock)."""
    # In the past (VictoriaMetrics drops samples from days ahead), days apart per repeat.
    base = int(time.time() * 1000) - 700 * DAY_MS + repeat * DAY_MS
    base -= base % TICK_MS
    total = args.series * args.samples
    shards = shard_bodies(args.series, args.samples, base, args.per_request)
    warmup = shard_bodies(args.series, 1, base - DAY_MS // 2, args.per_request)
    forwarded_at, direct_at = base + 200 * DAY_MS, base + 400 * DAY_MS
    forwarded = decode(shard_bodies(args.series, args.samples, forwarded_at, args.per_request))
    direct = forward_bodies(
        decode(shard_bodies(args.series, args.samples, direct_at, args.per_request)), vm
    )
    runs: list[Run] = []
    for system in systems:
        before = system.stored()
        runs.append(
            (
                system.name,
                partial(system.run, shards, warmup),
                partial(lambda s, b: s.stored() - b, system, before),
                total + args.series,
            )
        )
    runs += [
        (
            "VictoriaMetrics ingest",
            partial(vm_ingest, vm, shards),
            partial(vm_count, vm, base, args.samples),
            total,
        ),
        (
            "tuneloop forwarding",
            partial(forward, vm, forwarded, scratch / f"forward-{repeat}"),
            partial(vm_count, vm, forwarded_at, args.samples),
            total,
        ),
        (
            "VictoriaMetrics direct",
            partial(vm_direct, vm, direct),
            partial(vm_count, vm, direct_at, args.samples),
            total,
        ),
    ]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    total = args.series * args.samples
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="tuneloop-bench-rw-"))
    try:
        with scratch_database(args.database_url) as pg_url, victoria_metrics() as vm:
            systems = [
                Tuneloop("tuneloop SQLite", f"sqlite:///{scratch / 'bench.db'}", scratch / "lite"),
                Tuneloop("tuneloop PostgreSQL", pg_url, scratch / "pg"),
            ]
            for repeat in range(args.repeats):
                runs = repeat_runs(args, repeat, systems, vm, scratch)
                shift = repeat % len(runs)  # rotating order
                for name, timed, stored, due in runs[shift:] + runs[:shift]:
                    seconds = timed()
                    if (found := stored()) != due:
                        raise RuntimeError(f"{name}: {found} samples stored, {due} due")
                    times.setdefault(name, []).append(seconds)
                    log(f"repeat {repeat + 1}: {name}: {seconds:.3f} s, {total / seconds:,.0f}/s")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = summarize(times, total, args, load_before, os.getloadavg())
    print(report.pop("table"))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def summarize(
    times: dict[str, list[float]],
    total: int,
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
) -> dict[str, Any]:
    pairs = [
        ("tuneloop SQLite", "VictoriaMetrics ingest"),
        ("tuneloop PostgreSQL", "VictoriaMetrics ingest"),
        ("tuneloop forwarding", "VictoriaMetrics direct"),
    ]
    rows = [
        "| contender | median (s) | samples/s (95% interval) | baseline | ratio (95% interval) |",
        "|---|---:|---:|---|---:|",
    ]
    results: dict[str, Any] = {}
    for name, baseline in [*pairs, ("VictoriaMetrics ingest", ""), ("VictoriaMetrics direct", "")]:
        rate = interval([total / t for t in times[name]])
        entry: dict[str, Any] = {"seconds": times[name], "samples_per_s": rate}
        ratio_text = baseline_text = ""
        if baseline:
            ratio = interval([b / t for t, b in zip(times[name], times[baseline], strict=True)])
            entry["ratio_vs"] = {"baseline": baseline, "median_and_95": ratio}
            ratio_text = f"**{ratio[0]:.2f}** ({ratio[1]:.2f}-{ratio[2]:.2f})"
            baseline_text = baseline
        results[name] = entry
        median_s = statistics.median(times[name])
        rate_text = f"{rate[0]:,.0f} ({rate[1]:,.0f}-{rate[2]:,.0f})"
        rows.append(f"| {name} | {median_s:.3f} | {rate_text} | {baseline_text} | {ratio_text} |")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python bench/remote_write.py " + " ".join(sys.argv[1:]),
        "series": args.series,
        "samples_per_series": args.samples,
        "samples_per_run": total,
        "repeats": args.repeats,
        "connections": CONNECTIONS,
        "load_average_before": load_before,
        "load_average_after": load_after,
        "results": results,
        "table": "\n".join(rows),
    }


if __name__ == "__main__":
    sys.exit(main())
