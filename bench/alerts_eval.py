"""Alerting benchmark: evaluation time of the default GPU-fleet pack, and notification delay.

1. **Evaluation**: one pass of the default pack (``alerts/pack/gpu-fleet.yaml``, 19 rules)
   over 10,000 dcgm-exporter series (8 metrics x 1,250 GPUs on 157 hosts, a sample every 15 s
   for the last 70 minutes; a few GPUs breach so alerts fire), against the baseline of the
   plain latest-value query (``latest``) over the same 10,000 series, interleaved, in the same
   process. Ratio = pass / baseline.
2. **Delay**: on the embedded default (SQLite, in-process runner, evaluation every 1 s), a rule
   with ``for: 5s``; a sample breaching it is written every 0.2 s. The delay is the time from
   "the condition has held for 5 s" to the local webhook receiving the notification, against
   the same run's evaluation interval (target: under 2 s). A plain POST to the same receiver is
   timed too, for scale.

Scratch databases only (created and dropped)::

    .venv/bin/python bench/alerts_eval.py            # PostgreSQL and SQLite, 10,000 series
    .venv/bin/python bench/alerts_eval.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_network
from pathlib import Path

import httpx
from sqlalchemy import Engine

# The sibling benchmark's scratch-database helper and machine description.
from storage_write import machine, new_project, scratch_database

from alerts import store
from alerts.evaluator import Evaluator
from alerts.rules import parse_rule, parse_rule_file
from tuneloop.settings import Settings, configure, load_settings
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import Project, metadata
from tuneloop.storage.timeseries.query import latest
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuneloop.taskqueue.inprocess import InProcessRunner
from tuneloop.taskqueue.maintenance import close_task_runtime
from tuneloop.taskqueue.registry import periodic_tasks

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
LOCAL_RECEIVERS = (ip_network("127.0.0.0/8"),)
"""The benchmark's webhook listens on 127.0.0.1: allowed as an operator would allow it."""
PACK = Path(__file__).resolve().parents[1] / "alerts/pack/gpu-fleet.yaml"
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
STEP = timedelta(seconds=15)
HISTORY = timedelta(minutes=70)
GPUS_PER_HOST = 8
METRICS = [
    ("DCGM_FI_DEV_GPU_UTIL", SeriesKind.GAUGE, 85.0),
    ("DCGM_FI_DEV_XID_ERRORS", SeriesKind.GAUGE, 0.0),
    ("DCGM_FI_DEV_GPU_TEMP", SeriesKind.GAUGE, 60.0),
    ("DCGM_FI_DEV_FB_FREE", SeriesKind.GAUGE, 20_000.0),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", SeriesKind.COUNTER, 0.0),
    ("DCGM_FI_DEV_POWER_VIOLATION", SeriesKind.COUNTER, 0.0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", SeriesKind.COUNTER, 0.0),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", SeriesKind.COUNTER, 0.0),
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- part 1


def fleet(series: int) -> list[SeriesBatch]:
    """``series`` dcgm-exporter series; every 97th GPU runs hot, every 101st logs an XID."""
    gpus = series // len(METRICS)
    stamps = []
    at = NOW - HISTORY
    while at <= NOW:
        stamps.append(at)
        at += STEP
    batches = []
    for index in range(gpus):
        labels = {
            "gpu": str(index % GPUS_PER_HOST),
            "UUID": f"GPU-{index:08d}",
            "device": f"nvidia{index % GPUS_PER_HOST}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": f"gpu-node-{index // GPUS_PER_HOST}",
            "pod": f"train-{index // 64}",
        }
        for metric, kind, level in METRICS:
            value = level
            if metric == "DCGM_FI_DEV_GPU_TEMP" and index % 97 == 0:
                value = 91.0
            if metric == "DCGM_FI_DEV_XID_ERRORS" and index % 101 == 0:
                value = 79.0
            if kind is SeriesKind.COUNTER:
                values = [level + i * 1000.0 * (index % 3 == 0) for i in range(len(stamps))]
            else:
                values = [value] * len(stamps)
            batches.append(SeriesBatch(metric, labels, stamps, values, kind))
    return batches


def load_pack(engine: Engine, project_id: int) -> int:
    parsed = parse_rule_file(PACK.read_text(), source="pack")
    sessions = session_factory(engine)
    with session_scope(sessions) as session:
        project = session.get(Project, project_id)
        assert project is not None
        store.load_rule_file(session, project, parsed, source="pack")
        store.create_receiver(
            session, project, name="hook", kind="webhook", config={"url": "http://127.0.0.1:9/"},
            allowed_networks=LOCAL_RECEIVERS,
        )  # fmt: skip
    return len(parsed.rules)


@dataclass
class EvalRow:
    backend: str
    series: int
    rules: int
    baseline_s: float
    pass_s: float
    firing: int

    @property
    def ratio(self) -> float:
        return self.pass_s / self.baseline_s


def measure_evaluation(url: str, backend: str, series: int, repeats: int) -> EvalRow:
    engine = make_engine(url)
    metadata.create_all(engine)
    project_id = new_project(engine, "bench")
    log(f"{backend}: writing {series} series x {int(HISTORY / STEP) + 1} samples")
    writer = SampleWriter(engine)
    batches = fleet(series)
    for start in range(0, len(batches), 1000):
        result = writer.write(project_id, batches[start : start + 1000])
        assert not result.rejected, result.rejected[:3]
    rules = load_pack(engine, project_id)
    evaluator = Evaluator(engine, session_factory(engine))
    evaluator.evaluate(NOW)  # first pass creates the alert rows; later passes are steady state

    def baseline() -> None:
        total = sum(
            len(latest(engine, project_id, metric, since=NOW - timedelta(minutes=5)))
            for metric, _, _ in METRICS
        )
        assert total == series, total

    passes: list[float] = []
    baselines: list[float] = []
    firing = 0
    for repeat in range(repeats):
        evaluate_at = NOW + timedelta(seconds=1 + repeat)
        contenders: list[tuple[list[float], Callable[[], object]]] = [
            (baselines, baseline),
            (passes, partial(evaluator.evaluate, evaluate_at)),
        ]
        for times, action in contenders if repeat % 2 == 0 else reversed(contenders):
            started = time.perf_counter()
            outcome = action()
            times.append(time.perf_counter() - started)
            if outcome is not None:
                assert not outcome.failed_rules, outcome.failed_rules  # type: ignore[attr-defined]
    from sqlalchemy import func, select

    from tuneloop.storage.models import AlertInstance

    with engine.connect() as connection:
        firing = connection.execute(
            select(func.count()).where(AlertInstance.state == "firing")
        ).scalar_one()
    engine.dispose()
    return EvalRow(
        backend, series, rules, statistics.median(baselines), statistics.median(passes), firing
    )


# --------------------------------------------------------------------------- part 2


class _Arrivals:
    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.event = threading.Condition()


@contextmanager
def webhook() -> Iterator[tuple[str, _Arrivals]]:
    arrivals = _Arrivals()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received = time.monotonic()
            with arrivals.event:
                for alert in body.get("alerts", []):
                    if alert["status"] == "firing":
                        arrivals.times.setdefault(alert["labels"].get("gpu", "?"), received)
                arrivals.event.notify_all()
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", arrivals
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class DelayRow:
    trials: int
    interval_s: float
    delays: list[float]
    post_s: float


def measure_delay(trials: int) -> DelayRow:
    hold_s, interval_s = 5.0, 1.0
    with tempfile.TemporaryDirectory() as scratch, webhook() as (url, arrivals):
        database = f"sqlite:///{Path(scratch) / 'tuneloop.db'}"
        settings = configure(
            Settings(
                database_url=database,
                redis_url=None,
                alerts_eval_interval_s=interval_s,
                alerts_notify_interval_s=interval_s,
                alerts_allowed_target_networks=LOCAL_RECEIVERS,
            )
        )
        engine = make_engine(database)
        metadata.create_all(engine)
        project_id = new_project(engine, "bench")
        with session_scope(session_factory(engine)) as session:
            project = session.get(Project, project_id)
            assert project is not None
            rule = parse_rule(
                {
                    "name": "GpuHot",
                    "kind": "threshold",
                    "query": {"metric": "DCGM_FI_DEV_GPU_TEMP", "window": "10s"},
                    "op": ">",
                    "threshold": 85,
                    "for": f"{int(hold_s)}s",
                }
            )
            store.create_rule(session, project, rule)
            store.create_receiver(
                session, project, name="hook", kind="webhook", config={"url": url}
            )
        with httpx.Client() as client:
            posts = []
            for _ in range(20):
                started = time.perf_counter()
                client.post(url, json={"alerts": []})
                posts.append(time.perf_counter() - started)
        writer = SampleWriter(engine)
        runner = InProcessRunner(periodic_tasks(settings))
        runner.start()
        delays: list[float] = []
        rng = random.Random(7)
        try:
            for trial in range(trials):
                gpu = str(trial)
                labels = {"gpu": gpu, "Hostname": "n1"}
                # Start anywhere within an evaluation interval, as a real condition would.
                time.sleep(rng.uniform(0, interval_s))
                started = time.monotonic()
                deadline = started + hold_s + 10
                while gpu not in arrivals.times and time.monotonic() < deadline:
                    batch = SeriesBatch("DCGM_FI_DEV_GPU_TEMP", labels, [utcnow()], [95.0])
                    writer.write(project_id, [batch])
                    with arrivals.event:
                        arrivals.event.wait(0.2)
                assert gpu in arrivals.times, f"trial {trial}: no notification"
                # The condition holds from the first breaching sample, written at ``started``.
                delays.append(arrivals.times[gpu] - started - hold_s)
                log(f"trial {trial}: {delays[-1]:.3f} s")
                # Cool the GPU down so its alert resolves and the next trial starts clean.
                writer.write(project_id, [SeriesBatch("DCGM_FI_DEV_GPU_TEMP", labels,
                                                      [utcnow()], [40.0])])  # fmt: skip
        finally:
            runner.stop()
            from alerts.tasks import close_components

            close_components()
            close_task_runtime()
            engine.dispose()
            configure(load_settings())
    return DelayRow(trials, interval_s, delays, statistics.median(posts))


# --------------------------------------------------------------------------- report


def report(rows: list[EvalRow], delay: DelayRow | None, where: str) -> str:
    lines = [
        f"Machine: {where}",
        "",
        "| backend | series | rules | latest() baseline (s) | pack pass (s) | ratio | firing |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.backend} | {row.series:,} | {row.rules} | {row.baseline_s:.3f} | "
            f"{row.pass_s:.3f} | **{row.ratio:.1f}** | {row.firing} |"
        )
    if delay is not None:
        ordered = sorted(delay.delays)
        lines += [
            "",
            "| trials | eval interval (s) | delay median (s) | delay max (s) | "
            "median / interval | max / interval | plain POST (ms) |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {delay.trials} | {delay.interval_s:g} | {statistics.median(ordered):.3f} | "
            f"{ordered[-1]:.3f} | **{statistics.median(ordered) / delay.interval_s:.2f}** | "
            f"**{ordered[-1] / delay.interval_s:.2f}** | {delay.post_s * 1000:.2f} |",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url", default=os.environ.get("TUNELOOP_BENCH_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--quick", action="store_true", help="1,000 series, 3 repeats, 3 trials")
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--skip-delay", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.series, args.repeats, args.trials = 1_000, 3, 3
    rows = []
    with scratch_database(args.database_url) as url:
        rows.append(measure_evaluation(url, "PostgreSQL", args.series, args.repeats))
        engine = make_engine(url)
        where = machine(engine)
        engine.dispose()
    if not args.skip_sqlite:
        with tempfile.TemporaryDirectory() as scratch:
            url = f"sqlite:///{Path(scratch) / 'bench.db'}"
            rows.append(measure_evaluation(url, "SQLite", args.series, args.repeats))
    delay = None if args.skip_delay else measure_delay(args.trials)
    print(report(rows, delay, where))
    return 0


if __name__ == "__main__":
    sys.exit(main())
