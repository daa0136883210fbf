"""The autoscaler's webhook target: starts and stops real replica processes of the server.

::

    python -m examples.inference.scaler --port 8200 -- --weights digits-mlp.pt --variant float32

- ``GET /scale`` answers ``{"replicas": n}`` (the replica processes running or starting);
  ``POST /scale`` ``{"replicas": n, "reason": "..."}`` starts or stops processes to make it
  ``n`` (tuneloop's webhook target speaks exactly this, ``actuators/autoscaler/webhook.py``).
- ``GET /replicas``: the base URLs of the replicas that answer ``/healthz``, for the load
  generator. A replica is listed once it answers and delisted before it is stopped, so no
  request is sent to a process that is going away.

**No replica without a free core** (``--cores-per-replica``, default 1): a replica is one
PyTorch thread plus its HTTP server, and on a host whose cores are busy a second one adds no
capacity, while starting it (PyTorch, the weights) takes a core for seconds from the replica
already serving. So a scale-out starts only as many replicas as the host has free cores for:
``floor((cores - 1-minute load average) / cores_per_replica)``; the answer says how many run,
and the log why fewer than asked. Scaling in, and the first replica, are never refused; 0
turns the check off.

The arguments after ``--`` go to every replica (``python -m examples.inference.server``); each
gets a free port, a name (``r<rank>``) and a rank (the lowest free one), and inherits the
environment (``TUNELOOP_URL``, ``TUNELOOP_TOKEN``, ``TUNELOOP_JOB``).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from examples.inference.lifecycle import exit_on_sigterm
from tuneloop.ports import free_port

log = logging.getLogger("examples.inference.scaler")
DRAIN_S = 1.0
"""Between delisting a replica and stopping it: requests already sent to it finish."""


@dataclass
class Replica:
    rank: int
    port: int
    process: subprocess.Popen[bytes]
    ready: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class ReplicaPool:
    """Replica processes of one server command line; thread-safe."""

    server_args: Sequence[str]
    log_dir: Path
    max_replicas: int = 8
    cores_per_replica: float = 1.0
    load_average: Callable[[], float] = field(default=lambda: os.getloadavg()[0])
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    replicas: list[Replica] = field(default_factory=list)
    draining: list[Replica] = field(default_factory=list)
    """Replicas scaled in, still answering what they hold for ``DRAIN_S``: ``close`` stops them
    too, so that none outlives the pool."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        threading.Thread(target=self._watch, name="replica-health", daemon=True).start()

    def count(self) -> int:
        with self._lock:
            return sum(1 for r in self.replicas if r.process.poll() is None)

    def ready_urls(self) -> list[str]:
        with self._lock:
            return [r.url for r in self.replicas if r.ready and r.process.poll() is None]

    def scale(self, wanted: int, reason: str = "") -> int:
        """Start or stop processes until ``wanted`` run; returns how many run now."""
        if not 0 <= wanted <= self.max_replicas:
            raise ValueError(f"replicas must be in [0, {self.max_replicas}], got {wanted}")
        with self._lock:
            self.replicas = [r for r in self.replicas if r.process.poll() is None]
            leaving = []
            while len(self.replicas) > wanted:
                # The newest goes first: the oldest replicas keep their warm caches.
                replica = max(self.replicas, key=lambda r: r.rank)
                self.replicas.remove(replica)
                leaving.append(replica)
            self.draining += leaving
            room = self._room(len(self.replicas), wanted)
            while len(self.replicas) < room:
                self.replicas.append(self._start())
            now = len(self.replicas)
        if now < wanted:
            log.info("asked for %d replicas, %d run: no free core for more", wanted, now)
        log.info("scaled to %d replicas (%s)", now, reason or "no reason given")
        for replica in leaving:
            threading.Thread(target=self._stop, args=(replica, DRAIN_S), daemon=True).start()
        return now

    def _room(self, running: int, wanted: int) -> int:
        """How many replicas may run: ``wanted``, less those no free core is left for."""
        if wanted <= running or running == 0 or self.cores_per_replica <= 0:
            return wanted
        free = self.cores - self.load_average()
        return min(wanted, running + max(0, math.floor(free / self.cores_per_replica)))

    def _start(self) -> Replica:
        ranks = {r.rank for r in self.replicas}
        rank = next(n for n in range(len(ranks) + 1) if n not in ranks)
        port = free_port()
        command = [
            sys.executable, "-m", "examples.inference.server", *self.server_args,
            "--port", str(port), "--rank", str(rank), "--replica", f"r{rank}",
        ]  # fmt: skip
        with (self.log_dir / f"replica-r{rank}.log").open("ab") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
        log.info("started replica r%d on port %d (pid %d)", rank, port, process.pid)
        return Replica(rank, port, process)

    def _stop(self, replica: Replica, drain_s: float) -> None:
        if self._stopped.wait(drain_s):
            return  # close() stops it
        replica.process.send_signal(signal.SIGTERM)
        _reap(replica)
        with self._lock:
            if replica in self.draining:
                self.draining.remove(replica)

    def _watch(self) -> None:
        """Marks a started replica ready once it answers."""
        while not self._stopped.wait(0.2):
            with self._lock:
                starting = [r for r in self.replicas if not r.ready]
            for replica in starting:
                try:
                    replica.ready = httpx.get(f"{replica.url}/healthz", timeout=1).is_success
                except httpx.HTTPError:
                    continue

    def close(self) -> None:
        self._stopped.set()
        with self._lock:
            leaving, self.replicas, self.draining = self.replicas + self.draining, [], []
        for replica in leaving:  # all at once: each takes seconds to finish on a busy host
            replica.process.send_signal(signal.SIGTERM)
        for replica in leaving:
            _reap(replica)


def _reap(replica: Replica, timeout_s: float = 15.0) -> None:
    """Wait for a replica told to stop; kill it if it takes longer than ``timeout_s``."""
    try:
        replica.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        replica.process.kill()
        replica.process.wait()
    log.info("stopped replica r%d (pid %d)", replica.rank, replica.process.pid)


class ScaleIn(BaseModel):
    replicas: int = Field(ge=0)
    reason: str = ""


def build_app(pool: ReplicaPool) -> FastAPI:
    app = FastAPI(title="replica scaler (tuneloop example)")

    @app.get("/scale")
    def get_scale() -> dict[str, int]:
        return {"replicas": pool.count()}

    @app.post("/scale")
    def post_scale(body: ScaleIn) -> dict[str, int]:
        try:
            return {"replicas": pool.scale(body.replicas, body.reason)}
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None

    @app.get("/replicas")
    def replicas() -> dict[str, Any]:
        return {"urls": pool.ready_urls()}

    return app


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Webhook target that runs server replicas")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=1, help="replicas to start with")
    parser.add_argument("--max-replicas", type=int, default=8)
    parser.add_argument(
        "--cores-per-replica",
        type=float,
        default=1.0,
        help="scale out only while (cores - load average) leaves this many per new replica; "
        "0: no check",
    )
    parser.add_argument("--log-dir", default="replica-logs")
    parser.add_argument("server_args", nargs="*", help="after --: the server's arguments")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health check or poll
    exit_on_sigterm()
    pool = ReplicaPool(
        args.server_args,
        Path(args.log_dir),
        args.max_replicas,
        cores_per_replica=args.cores_per_replica,
    )
    pool.scale(args.replicas, "start")
    print(f"scaler on http://{args.host}:{args.port}/scale", flush=True)
    try:
        uvicorn.run(build_app(pool), host=args.host, port=args.port, log_level="warning")
    finally:
        pool.close()


if __name__ == "__main__":
    main()
