"""One replica of the inference service: FastAPI in front of the dynamic batcher and the model.

::

    python -m examples.inference.server --port 8101 --weights digits-mlp.pt
    TUNELOOP_URL=http://127.0.0.1:8000 TUNELOOP_TOKEN=... TUNELOOP_JOB=digits-serve \\
        python -m examples.inference.server --port 8101 --weights digits-mlp.pt --replica r1

- ``POST /predict`` ``{"pixels": [64 numbers in 0..1]}`` answers ``{"label": 0-9, ...}``;
  503 when the queue is full.
- ``GET /knobs``: ``max_batch_size``, ``max_delay_ms`` and the config version running;
  ``PUT /knobs`` sets them, only on a replica without a control plane (with one, the control
  plane owns them).
- ``GET /healthz``: the knobs, the queue depth and the batches run.

With ``TUNELOOP_URL`` (and ``TUNELOOP_TOKEN``, ``TUNELOOP_JOB``) the replica registers with
tuneloop's agent and declares both knobs (:func:`declared_knobs`: ``max_batch_size``, powers
of two in [1, 64]; ``max_delay_ms``, log scale in [1, 64]; each starting at the command line's
value), applies each released config between two batches and acknowledges it (one it cannot
run is reported as failed), times each batch as a step (samples: the batch's requests) and
exports its latency histogram, the requests arriving and its queue depth
(:mod:`examples.inference.telemetry`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Final

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from examples.inference import model as models
from examples.inference.batcher import DynamicBatcher, QueueFull, check_knobs
from examples.inference.data import FEATURES
from examples.inference.lifecycle import exit_on_sigterm
from examples.inference.telemetry import ServerTelemetry
from tuneloop.agent import Agent
from tuneloop.agent.knobs import Knob, KnobError
from tuneloop.agent.steps import StepTracer

log = logging.getLogger("examples.inference.server")

BATCH_RANGE: Final = (1, 64)
DELAY_RANGE_MS: Final = (1, 64)
"""The ranges the replica declares to tuneloop, which a study searches: a request never waits
for more than 64 others or 64 ms (the batcher itself takes wider values, e.g. ``PUT /knobs``)."""
KEEPALIVE_TIMEOUT_S: Final = 15
"""How long an idle client connection stays open: longer than the load generator keeps one
(``wire.KEEPALIVE_EXPIRY_S``), so the client, not the server, ends an idle connection."""


class PredictIn(BaseModel):
    pixels: list[float] = Field(min_length=FEATURES, max_length=FEATURES)


class PredictOut(BaseModel):
    label: int
    variant: str
    replica: str


class KnobsIn(BaseModel):
    max_batch_size: int | None = None
    max_delay_ms: int | None = None


class InferenceService:
    """The model, its batcher, and (optionally) the agent and telemetry of one replica."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        variant: str,
        replica: str,
        knobs: dict[str, int],
        agent: Agent | None = None,
        telemetry: ServerTelemetry | None = None,
        max_queue: int = 512,
    ) -> None:
        self.model, self.variant, self.replica = model, variant, replica
        self.agent, self.telemetry = agent, telemetry
        self.version = 0
        checked = {"max_batch_size": 8, "max_delay_ms": 5, **check_knobs(knobs)}
        # Declared before the batcher starts: a starting value outside its range stops here.
        self.knobs = [] if agent is None else declared_knobs(checked, self._set_knobs)
        self.batcher = DynamicBatcher(
            self._run,
            max_batch_size=checked["max_batch_size"],
            max_delay_ms=checked["max_delay_ms"],
            max_queue=max_queue,
            at_boundary=self._boundary,
        )
        if telemetry is not None:
            telemetry.watch_queue(self.batcher.queue_depth)
        if agent is not None:
            agent.start({}, details={"kind": "inference", "replica": replica}, knobs=self.knobs)

    def _run(self, inputs: Sequence[Any]) -> list[int]:
        x = torch.from_numpy(np.stack(inputs))
        timed = (
            self.agent.step(self.batcher.batches + 1, samples=len(inputs))
            if self.agent is not None
            else nullcontext()
        )
        with timed, torch.inference_mode():
            labels: list[int] = self.model(x).argmax(dim=1).tolist()
        return labels

    def _set_knobs(self, **knobs: int) -> None:
        self.batcher.set_knobs(**knobs)

    def _boundary(self, batches: int) -> None:
        """Between two batches: apply a newer released config, then acknowledge it; one this
        replica cannot run is refused (reported as failed) and the running knobs kept."""
        if self.agent is None:
            return
        pending = self.agent.pending()
        if pending is None:
            return
        try:
            values = checked_release(self.knobs, pending.config)
        except KnobError as exc:
            self.agent.refuse(pending.version, str(exc))
            return
        for knob in self.knobs:
            if knob.name in values:
                knob.apply(values[knob.name])
        self.version = pending.version
        self.agent.applied(pending.version, pending.config, step=batches)
        log.info("running config version %d: %s", pending.version, values)

    def status(self) -> dict[str, Any]:
        return {
            **self.batcher.knobs,
            "version": self.version,
            "queue": self.batcher.queue_depth(),
            "batches": self.batcher.batches,
            "variant": self.variant,
            "replica": self.replica,
        }

    def close(self) -> None:
        self.batcher.stop()
        if self.agent is not None:
            self.agent.close()
        if self.telemetry is not None:
            self.telemetry.shutdown()


def declared_knobs(start: Mapping[str, int], apply: Callable[..., None]) -> list[Knob]:
    """The batching knobs as the replica declares them to tuneloop, starting at ``start``
    (a :class:`KnobError` when a value is outside its range); a new value is applied as
    ``apply(name=value)``."""
    return [
        Knob.integer(
            "max_batch_size",
            *BATCH_RANGE,
            default=start["max_batch_size"],
            powers_of_two=True,
            apply=lambda value: apply(max_batch_size=value),
        ),
        Knob.integer(
            "max_delay_ms",
            *DELAY_RANGE_MS,
            default=start["max_delay_ms"],
            log=True,
            apply=lambda value: apply(max_delay_ms=value),
        ),
    ]


def checked_release(knobs: Sequence[Knob], config: Mapping[str, Any]) -> dict[str, Any]:
    """The declared knobs a released ``config`` sets, each checked against its declaration
    (one it leaves out keeps its value); a :class:`KnobError` naming an unknown key or the
    first value outside its knob's range."""
    unknown = sorted(set(config) - {k.name for k in knobs})
    if unknown:
        raise KnobError(f"unknown knob(s) {unknown}; the knobs are {[k.name for k in knobs]}")
    return {k.name: k.check(config[k.name]) for k in knobs if k.name in config}


def build_app(service: InferenceService) -> FastAPI:
    app = FastAPI(title="digits inference (tuneloop example)")

    @app.post("/predict")
    async def predict(body: PredictIn) -> PredictOut:
        start = time.monotonic()
        if service.telemetry is not None:
            service.telemetry.arrived()
        try:
            future = service.batcher.submit(np.asarray(body.pixels, dtype=np.float32))
        except QueueFull as exc:
            raise HTTPException(503, f"queue full: {exc}") from None
        label = await asyncio.wrap_future(future)
        if service.telemetry is not None:
            service.telemetry.record(time.monotonic() - start)
        return PredictOut(label=label, variant=service.variant, replica=service.replica)

    @app.get("/knobs")
    def knobs() -> dict[str, int]:
        return {**service.batcher.knobs, "version": service.version}

    @app.put("/knobs")
    def set_knobs(body: KnobsIn) -> dict[str, int]:
        if service.agent is not None:
            raise HTTPException(409, "the control plane sets this replica's knobs")
        try:
            now = service.batcher.set_knobs(**body.model_dump(exclude_none=True))
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None
        return {**now, "version": service.version}

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return service.status()

    return app


def make_service(args: argparse.Namespace) -> InferenceService:
    torch.set_num_threads(args.threads)
    model = models.variant(models.load_or_train(Path(args.weights)), args.variant)
    replica = args.replica or f"{args.host}:{args.port}"
    url, token, job = (os.environ.get(f"TUNELOOP_{n}") for n in ("URL", "TOKEN", "JOB"))
    agent: Agent | None = None
    telemetry: ServerTelemetry | None = None
    knobs = {"max_batch_size": args.max_batch_size, "max_delay_ms": args.max_delay_ms}
    if url and job:
        # Each replica is rank 0 of its own agent (it takes configs itself); its step timings
        # carry the replica's number as their rank, so the job's throughput adds replicas up.
        tracer = StepTracer(url, token, job, rank=args.rank, resource={"replica": replica})
        agent = Agent.from_env(instrument=False, tracer=tracer)
        telemetry = ServerTelemetry(
            job=job, replica=replica, variant=args.variant, url=url, token=token
        )
    return InferenceService(
        model,
        variant=args.variant,
        replica=replica,
        knobs=knobs,
        agent=agent,
        telemetry=telemetry,
        max_queue=args.max_queue,
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="One replica of the digits inference service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--weights", default="digits-mlp.pt", help="trained here if missing")
    parser.add_argument("--variant", choices=models.VARIANTS, default="float32")
    parser.add_argument("--replica", help="this replica's name (default host:port)")
    parser.add_argument("--rank", type=int, default=0, help="the rank its step timings carry")
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-delay-ms", type=int, default=5)
    parser.add_argument("--max-queue", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1, help="PyTorch's CPU threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health check or poll
    exit_on_sigterm()  # so that the agent acknowledges and the exporters flush on the way out
    try:
        service = make_service(args)
    except KnobError as exc:
        raise SystemExit(f"error: {exc} (the range this replica declares to tuneloop)") from None
    print(
        f"serving {args.variant} on http://{args.host}:{args.port} {service.status()}", flush=True
    )
    try:
        uvicorn.run(
            build_app(service), host=args.host, port=args.port, log_level="warning",
            access_log=False, timeout_keep_alive=KEEPALIVE_TIMEOUT_S,
        )  # fmt: skip
    finally:
        service.close()


if __name__ == "__main__":
    main()
