"""The job agent's cost to a training job, measured against a live control plane.

1. **Overhead on a step.** A stand-in training step of fixed work (numpy matrix products,
   calibrated to ``--step-ms``, default 20 ms of CPU, one BLAS thread) runs in blocks,
   alternately bare and instrumented, in the same process and run; the ratio of the blocks'
   CPU time per step (of the training thread) is the overhead. Instrumented = what the agent
   does per step in one process: the step-boundary check for a new config, a
   ``tuneloop.step`` span and, every 10th step, four phase spans, exported by the real
   OTLP/HTTP exporter (on its own thread) to the API. On a busy machine the block ratio is
   noisier than the effect, so the same loop with empty phases also measures the agent's
   per-step CPU alone, reported as a share of the bare step's CPU from the same run.
2. **Time from a new desired version to the job running it.** The same loop with the agent
   subscribed; the bench writes a new desired config through the API (``PUT .../config``) and
   times until the step that runs it begins. Reported minus one step time; target < 1 s.

The API is ``tuneloop api`` in a child process on a temporary SQLite store::

    .venv/bin/python bench/agent_overhead.py              # 8 block pairs of 100 steps, 10 changes
    .venv/bin/python bench/agent_overhead.py --quick
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
from threadpoolctl import threadpool_limits

from tuneloop import accounts
from tuneloop.agent import Agent
from tuneloop.ports import free_port
from tuneloop.runtime import Runtime
from tuneloop.settings import Settings
from tuneloop.storage import session_scope
from tuneloop.storage.migrate import upgrade

PHASES = ("data_loading", "forward", "backward", "optimizer")


def calibrate(step_s: float) -> Callable[[], None]:
    """A function doing about ``step_s`` of CPU work, split into four phases."""
    rng = np.random.default_rng(0)
    a, b = rng.random((128, 128)), rng.random((128, 128))
    # CPU time of this thread, not wall time: other processes on the machine do not skew it.
    start, n = time.thread_time(), 0
    while time.thread_time() - start < 0.3:
        a @ b
        n += 1
    per_product = (time.thread_time() - start) / n
    products = max(4, round(step_s / per_product))

    def work() -> None:
        for _ in range(products // 4):
            a @ b

    return work


@contextmanager
def control_plane(data_dir: Path) -> Iterator[tuple[str, str, str]]:
    """``tuneloop api`` in a child process on a free port, on a fresh SQLite store, so that
    serving the exports costs this process nothing: (url, agent token, member token)."""
    url = f"sqlite:///{data_dir / 'bench.db'}"
    upgrade(url)
    runtime = Runtime.open(Settings(database_url=url, data_dir=data_dir))
    with session_scope(runtime.sessions) as session:
        project = accounts.create_project(session, "bench")
        _, agent = accounts.create_token(session, project, "agent", "agent")
        _, member = accounts.create_token(session, project, "member", "member")
    runtime.close()
    port = free_port()
    env = {**os.environ, "TUNELOOP_DATABASE_URL": url, "TUNELOOP_DATA_DIR": str(data_dir)}
    command = [sys.executable, "-m", "tuneloop", "api", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the API did not start")
            time.sleep(0.2)
        yield base, agent, member
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()


def run_block(
    work: Callable[[], None], steps: int, agent: Agent | None, first: int, report: bool = True
) -> float:
    """Mean CPU time of this (the training) thread per step, bare (``agent`` None) or
    instrumented. The exporter's own thread is not counted: in a job it runs beside the
    training loop on another core."""
    start = time.thread_time()
    for step in range(first, first + steps):
        if agent is None:
            for _ in PHASES:
                work()
            continue
        agent.pending()
        with agent.step(step, samples=64, tokens=64 * 512) as timed:
            for phase in PHASES:
                with timed.phase(phase):  # type: ignore[union-attr]
                    work()
        if report:  # what a job adds per step beyond its spans
            agent.record(grad_norm=1.0 + step % 7, learning_rate=0.01)
    return (time.thread_time() - start) / steps


def overhead(work: Callable[[], None], agent: Agent, blocks: int, steps: int) -> list[float]:
    """Per pair of blocks (bare, instrumented; order alternating): instrumented / bare - 1."""
    ratios, step = [], 0
    run_block(work, steps, agent, step)  # warm-up: exporter connection, caches
    for block in range(blocks):
        order = (None, agent) if block % 2 == 0 else (agent, None)
        times = {}
        for who in order:
            times[who is not None] = run_block(work, steps, who, step)
            step += steps
        ratios.append(times[True] / times[False] - 1)
    return ratios


def noop() -> None:
    pass


def instrumentation_only(agent: Agent, steps: int) -> dict[bool, list[float]]:
    """CPU time per step of the agent's per-step work alone (no training work), the same
    instrumented loop with empty phases: the cost that the block ratios are noisy about.
    With and without the per-step reports (gradient norm, learning rate), interleaved."""
    run_block(noop, steps, agent, 0)  # warm
    timed: dict[bool, list[float]] = {True: [], False: []}
    for i in range(1, 11):
        report = i % 2 == 0
        timed[report].append(run_block(noop, steps, agent, i * steps, report))
    return timed


def change_latency(
    work: Callable[[], None], agent: Agent, url: str, member: str, job: str, changes: int
) -> tuple[list[float], float]:
    """Seconds from each desired write's response to the start of the step that runs it."""
    http = httpx.Client(headers={"Authorization": f"Bearer {member}"})
    latencies, step_times = [], []
    for change in range(changes):
        config = {"batch_size": 32 * (1 + change % 2), "change": change}
        response = http.put(
            f"{url}/api/v1/projects/bench/jobs/{job}/config", json={"config": config}
        )
        response.raise_for_status()
        written = time.perf_counter()
        version = int(response.json()["version"])
        while True:
            pending = agent.pending()
            if pending is not None and pending.version >= version:
                latencies.append(time.perf_counter() - written)
                agent.applied(pending.version, pending.config, step=None)
                break
            started = time.perf_counter()
            with agent.step(None, samples=64):
                for _ in PHASES:
                    work()
            step_times.append(time.perf_counter() - started)
        time.sleep(0.2)
    http.close()
    return latencies, statistics.median(step_times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="steps per block")
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.blocks, args.steps, args.changes = 2, 30, 3
    # One BLAS thread: the step's work is then all on this thread's CPU clock.
    with threadpool_limits(limits=1):
        run(args)


def run(args: argparse.Namespace) -> None:
    work = calibrate(args.step_ms / 1000)
    with tempfile.TemporaryDirectory() as tmp, control_plane(Path(tmp)) as (url, token, member):
        # Verification holds each change for its measurement window; here we time the
        # protocol path from a released version to the job, so the job's policy skips it.
        policy = {"verify": {"enabled": False}}
        http = httpx.Client(headers={"Authorization": f"Bearer {member}"})
        jobs = f"{url}/api/v1/projects/bench/jobs"
        http.post(jobs, json={"name": "bench-job", "status": "running"}).raise_for_status()
        http.put(f"{jobs}/bench-job/actuator", json=policy).raise_for_status()
        http.close()
        agent = Agent(
            url=url,
            token=token,
            project="bench",
            job="bench-job",
            poll_timeout_s=30,
            flops_per_sample=1e9,
        )
        agent.start({"batch_size": 32})
        deadline = time.monotonic() + 30
        while agent.version == 0 and time.monotonic() < deadline:
            agent.pending()
            time.sleep(0.01)
        ratios = overhead(work, agent, args.blocks, args.steps)
        bare_step = statistics.median(run_block(work, args.steps, None, 0) for _ in range(3))
        per_block = instrumentation_only(agent, 1000)
        latencies, step_s = change_latency(work, agent, url, member, "bench-job", args.changes)
        agent.close()
    bare = statistics.median(ratios)
    alone, spans_only = (statistics.median(per_block[r]) for r in (True, False))
    ranges = {r: f"{min(v) * 1e6:.0f}-{max(v) * 1e6:.0f} us" for r, v in per_block.items()}
    print(f"step work: {args.step_ms:.0f} ms of CPU; wall time per step {step_s * 1000:.1f} ms")
    print(
        f"overhead: median {bare * 100:+.2f}% over {len(ratios)} block pairs "
        f"(min {min(ratios) * 100:+.2f}%, max {max(ratios) * 100:+.2f}%)"
    )
    print(
        f"instrumentation alone: {alone * 1e6:.0f} us CPU per step = "
        f"{alone / bare_step * 100:.2f}% of the bare step's {bare_step * 1000:.1f} ms CPU; "
        f"range {ranges[True]}; without the per-step reports {spans_only * 1e6:.0f} us, range "
        f"{ranges[False]} (5 blocks of 1000 steps each, interleaved)"
    )
    over = sorted(lat - step_s for lat in latencies)
    print(
        f"desired -> running: median {statistics.median(latencies) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms; minus one step: median "
        f"{statistics.median(over) * 1000:.0f} ms, max {over[-1] * 1000:.0f} ms "
        f"({len(latencies)} changes)"
    )


if __name__ == "__main__":
    main()
