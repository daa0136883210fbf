"""PromQL ``query_range`` benchmark: tuneloop's Prometheus API (``/api/v1/query_range`` over
its PostgreSQL store) against a real Prometheus answering the same queries over the same
samples.

Data: ``--series`` series (default 1,000) over ``--days`` days (default 7) at one sample per
``--interval-s`` seconds (default 120: 5,040,000 samples, so that promtool makes Prometheus's
blocks in about 5 minutes on a loaded 2-core host; at 60 s it took 10.5), generated with numpy
from a fixed seed: half GPU utilization gauges (``DCGM_FI_DEV_GPU_UTIL``, dcgm-exporter labels,
8 GPUs a host), 40% energy counters (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``), 10%
step-duration histogram buckets (``tuneloop_step_duration_seconds_bucket``, 10 ``le`` bounds a
job). tuneloop gets them through its own writer (``SampleWriter``, in blocks of columns) into a
scratch PostgreSQL database that the script creates and drops (then ``VACUUM ANALYZE``, as
autovacuum leaves data this old); Prometheus from blocks that ``promtool tsdb
create-blocks-from openmetrics`` makes of the same samples (the script waits until Prometheus
has compacted them). Samples sit 125 ms past the minute, so that no window edge falls on one
and both engines must give the same answer, which the script checks first.

Queries (Grafana-like steps: 2 minutes over a day, 15 minutes over the week), each over the
last day and the whole range, interleaved (the contender that goes first alternates), both
over HTTP from this process (tuneloop served by uvicorn in a thread)::

    .venv/bin/python bench/promql_query_range.py                 # 1,000 series, 7 days, 60 s
    .venv/bin/python bench/promql_query_range.py --quick         # a smoke run
    .venv/bin/python bench/promql_query_range.py --out bench/data/promql_query_range.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dashboard_query import DEFAULT_URL, log, scratch_database

from api.main import create_app
from collector.pipeline import Pipeline
from collector.sinks.store import StoreSink
from tuneloop import accounts
from tuneloop.ports import free_port
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, migrate, session_factory, session_scope
from tuneloop.storage.timeseries.columns import SampleColumns, SeriesTable
from tuneloop.storage.timeseries.types import SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

START_S = 1_709_251_200  # 2024-03-01T00:00:00Z
OFFSET_MS = 125
BUCKETS = ("0.05", "0.1", "0.2", "0.3", "0.5", "0.75", "1", "2", "5", "+Inf")
QUERIES = {
    "avg by host": "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)",
    "sum of rates": "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]))",
    "p90 of a histogram": (
        "histogram_quantile(0.9, sum by (le) (rate(tuneloop_step_duration_seconds_bucket[5m])))"
    ),
}


# --------------------------------------------------------------------------- data


def generate(series: int, days: int, interval_s: int) -> tuple[SeriesTable, np.ndarray, Any]:
    """The series table and, per series, its values (a row each); times are shared."""
    rng = np.random.default_rng(20240301)
    points = days * 86_400 // interval_s
    gauges, counters = series // 2, series * 2 // 5
    jobs = max(1, (series - gauges - counters) // len(BUCKETS))
    metrics: list[str] = []
    labels: list[dict[str, str]] = []
    kinds: list[SeriesKind] = []
    rows: list[np.ndarray] = []
    steps = np.arange(points)
    for i in range(gauges + counters):
        gpu = {
            "gpu": str(i % 8),
            "UUID": f"GPU-{i:08x}-6b1e-4f0a-9d42-7e1b0c9a3f61",
            "device": f"nvidia{i % 8}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": f"gpu-node-{(i % gauges) // 8:03d}",
        }
        if i < gauges:
            metrics.append("DCGM_FI_DEV_GPU_UTIL")
            kinds.append(SeriesKind.GAUGE)
            wave = 50 + 40 * np.sin(steps / 97 + i) + rng.normal(0, 5, points)
            rows.append(np.round(np.clip(wave, 0, 100), 2))
        else:
            metrics.append("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
            kinds.append(SeriesKind.COUNTER)
            rows.append(np.round(np.cumsum(rng.uniform(200, 700, points) * interval_s), 1))
        labels.append(gpu)
    for job in range(jobs):
        observations = rng.poisson(interval_s / 0.4, (points, 1)).astype(np.float64)
        shares = np.array([0.02, 0.05, 0.15, 0.3, 0.6, 0.8, 0.9, 0.97, 0.995, 1.0])
        counts = np.cumsum(observations, axis=0) * shares
        for b, bound in enumerate(BUCKETS):
            metrics.append("tuneloop_step_duration_seconds_bucket")
            kinds.append(SeriesKind.COUNTER)
            labels.append({"job": f"train-{job:02d}", "rank": "0", "le": bound})
            rows.append(np.floor(counts[:, b]))
    table = SeriesTable(tuple(metrics), tuple(labels), tuple(kinds))
    times_ms = (START_S * 1000 + OFFSET_MS + steps * interval_s * 1000).astype(np.int64)
    return table, times_ms, np.vstack(rows)


def load_tuneloop(engine: Any, table: SeriesTable, times_ms: np.ndarray, values: Any) -> int:
    with session_scope(session_factory(engine)) as session:
        project = accounts.create_project(session, "bench", max_series=len(table) + 10)
        project_id = project.id
    writer = SampleWriter(engine, max_series_per_project=len(table) + 10)
    chunk = max(1, 1_000_000 // len(table))
    for start in range(0, len(times_ms), chunk):
        part = times_ms[start : start + chunk]
        block = values[:, start : start + chunk]
        columns = SampleColumns(
            table,
            np.repeat(np.arange(len(table), dtype=np.intp), len(part)),
            np.tile(part * 1000, len(table)).astype(np.int64),
            block.reshape(-1).astype(np.float64),
        )
        result = writer.write(project_id, [columns])
        assert not result.rejected, result.rejected[:2]
    return project_id


def write_openmetrics(table: SeriesTable, times_ms: np.ndarray, values: Any, path: Path) -> None:
    stamps = [f"{t / 1000:.3f}" for t in times_ms.tolist()]
    with path.open("w") as out:
        previous = None
        for index in range(len(table)):
            metric = table.metrics[index]
            if metric != previous:
                out.write(f"# TYPE {metric} unknown\n")
                previous = metric
            head = metric + "{" + ",".join(f'{k}="{v}"' for k, v in table.labels[index].items())
            out.writelines(
                f"{head}}} {v!r} {t}\n" for v, t in zip(values[index].tolist(), stamps, strict=True)
            )
        out.write("# EOF\n")


# --------------------------------------------------------------------------- servers


@contextmanager
def prometheus(blocks: Path, workdir: Path) -> Iterator[str]:
    port = free_port()
    (workdir / "prometheus.yml").write_text(yaml.safe_dump({"global": {}}))
    log_file = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={blocks}",
            "--storage.tsdb.retention.time=100y",
            f"--web.listen-address=127.0.0.1:{port}",
            "--query.max-samples=100000000",
            "--log.level=warn",
        ],
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
            assert time.monotonic() < deadline and process.poll() is None, "prometheus"
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log_file.close()


def wait_for_compaction(blocks: Path, quiet_s: float = 100, limit_s: float = 900) -> int:
    """Block count once Prometheus has compacted promtool's 2-hour blocks as it would have
    its own (unchanged for ``quiet_s``: its compactor wakes once a minute)."""

    def count() -> int:
        return sum(1 for p in blocks.iterdir() if p.is_dir() and len(p.name) == 26)

    seen, since, began = count(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() - began < limit_s:
        time.sleep(2)
        now = count()
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


@contextmanager
def tuneloop_server(runtime: Runtime) -> Iterator[str]:
    port = free_port()
    pipeline = Pipeline(StoreSink(SampleWriter(runtime.engine)))
    config = uvicorn.Config(
        create_app(runtime, pipeline), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def ask(url: str, params: dict[str, str], token: str | None = None) -> tuple[float, Any]:
    request = urllib.request.Request(
        f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}",
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    began = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        body = json.load(response)
    elapsed = time.perf_counter() - began
    assert body["status"] == "success", body
    return elapsed, body["data"]


def same_answer(ours: Any, theirs: Any, what: str) -> int:
    def points(data: Any) -> dict[Any, list[Any]]:
        return {tuple(sorted(s["metric"].items())): s["values"] for s in data["result"]}

    mine, other = points(ours), points(theirs)
    assert mine.keys() == other.keys(), what
    total = 0
    for key, values in other.items():
        assert [p[0] for p in mine[key]] == [p[0] for p in values], (what, key)
        for (_, a), (_, b) in zip(mine[key], values, strict=True):
            assert math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9), (what, a, b)
        total += len(values)
    return total


def interval(values: list[float]) -> tuple[float, float]:
    """Range of the middle runs: min and max for a handful, else the 10th-90th percentile."""
    if len(values) < 10:
        return min(values), max(values)
    ordered = sorted(values)
    return ordered[len(values) // 10], ordered[-(len(values) // 10) - 1]


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--interval-s", type=int, default=120)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL server (a scratch db)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    parser.add_argument("--quick", action="store_true", help="100 series, 2 days, 2 repeats")
    args = parser.parse_args()
    if args.quick:
        args.series, args.days, args.repeats = 100, 2, 2
    assert shutil.which("prometheus") and shutil.which("promtool"), "needs prometheus, promtool"

    table, times_ms, values = generate(args.series, args.days, args.interval_s)
    samples = values.size
    log(f"{len(table)} series, {samples:,} samples")
    end_s = START_S + args.days * 86_400
    ranges = {
        "1 day": (end_s - 86_400, end_s, 120),
        f"{args.days} days": (START_S, end_s, 900),
    }
    with tempfile.TemporaryDirectory() as tmp, scratch_database(args.url) as url:
        workdir = Path(tmp)
        began = time.perf_counter()
        write_openmetrics(table, times_ms, values, workdir / "data.om")
        blocks = workdir / "blocks"
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet",
             str(workdir / "data.om"), str(blocks)],
            check=True,
        )  # fmt: skip
        (workdir / "data.om").unlink()
        prometheus_load_s = time.perf_counter() - began
        log(f"prometheus blocks in {prometheus_load_s:.0f} s")
        migrate.upgrade(url)
        engine = make_engine(url)
        began = time.perf_counter()
        load_tuneloop(engine, table, times_ms, values)
        tuneloop_load_s = time.perf_counter() - began
        log(f"tuneloop store loaded in {tuneloop_load_s:.0f} s")
        # As autovacuum leaves data a day old: visibility map set, so counts scan the index only.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
            connection.exec_driver_sql("VACUUM ANALYZE samples")
        runtime = Runtime(
            settings=Settings(database_url=url, redis_url=None),
            engine=engine,
            sessions=session_factory(engine),
        )
        with session_scope(runtime.sessions) as session:
            project = accounts.get_project_by_name(session, "bench")
            assert project is not None
            _, token = accounts.create_token(session, project, "bench", "member")
        with prometheus(blocks, workdir) as prom, tuneloop_server(runtime) as ours:
            block_count = wait_for_compaction(blocks)
            log(f"prometheus settled on {block_count} blocks")
            results = run(prom, ours, token, ranges, args.repeats)
        engine.dispose()
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "data": {
            "series": len(table),
            "days": args.days,
            "interval_s": args.interval_s,
            "samples": samples,
            "tuneloop_load_s": round(tuneloop_load_s, 1),
            "prometheus_blocks_s": round(prometheus_load_s, 1),
            "prometheus_blocks": block_count,
        },
        "repeats": args.repeats,
        "results": results,
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    print_table(results)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


def run(
    prom: str, ours: str, token: str, ranges: dict[str, tuple[int, int, int]], repeats: int
) -> list[dict[str, Any]]:
    cases = [(q, r) for q in QUERIES for r in ranges]
    timings: dict[tuple[str, str], dict[str, list[float]]] = {}
    loads: list[float] = []
    for query, span in cases:
        start, end, step = ranges[span]
        params = {"query": QUERIES[query], "start": str(start), "end": str(end), "step": str(step)}
        _, theirs = ask(prom, params)  # warm-up, and the answer to check against
        _, mine = ask(ours, params, token)
        points = same_answer(mine, theirs, f"{query} over {span}")
        timings[(query, span)] = {"tuneloop": [], "prometheus": [], "points": [points]}
    for repeat in range(repeats):
        for query, span in cases:
            start, end, step = ranges[span]
            params = {
                "query": QUERIES[query], "start": str(start), "end": str(end), "step": str(step)
            }  # fmt: skip
            order = [("tuneloop", ours, token), ("prometheus", prom, None)]
            for name, url, secret in order if repeat % 2 == 0 else order[::-1]:
                elapsed, _ = ask(url, params, secret)
                timings[(query, span)][name].append(elapsed)
            loads.append(os.getloadavg()[0])
        log(f"repeat {repeat + 1}/{repeats} done, load {os.getloadavg()[0]:.1f}")
    results = []
    for (query, span), times in timings.items():
        ratios = [a / b for a, b in zip(times["tuneloop"], times["prometheus"], strict=True)]
        results.append(
            {
                "query": QUERIES[query],
                "name": query,
                "range": span,
                "step_s": ranges[span][2],
                "points": int(times["points"][0]),
                "tuneloop_ms": _summary(times["tuneloop"]),
                "prometheus_ms": _summary(times["prometheus"]),
                "ratio": {
                    "median": round(statistics.median(ratios), 2),
                    "interval": [round(x, 2) for x in interval(ratios)],
                },
                "load_avg": [round(min(loads), 2), round(max(loads), 2)],
            }
        )
    return results


def _summary(seconds: list[float]) -> dict[str, Any]:
    low, high = interval(seconds)
    return {
        "median": round(statistics.median(seconds) * 1000, 1),
        "interval": [round(low * 1000, 1), round(high * 1000, 1)],
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print("| query | range, step | points | tuneloop ms | Prometheus ms | tuneloop / Prometheus |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in results:
        t, p, q = r["tuneloop_ms"], r["prometheus_ms"], r["ratio"]
        print(
            f"| `{r['query']}` | {r['range']}, {r['step_s']} s | {r['points']:,} "
            f"| {t['median']:,} ({t['interval'][0]:,}-{t['interval'][1]:,}) "
            f"| {p['median']:,} ({p['interval'][0]:,}-{p['interval'][1]:,}) "
            f"| **{q['median']}** ({q['interval'][0]}-{q['interval'][1]}) |"
        )
    loads = [x for r in results for x in r["load_avg"]]
    print(f"\nload average (1 min) during the runs: {min(loads)} to {max(loads)}")


if __name__ == "__main__":
    main()
