"""The job-side agent: registration, config subscription, step instrumentation and the
gradient noise scale, for one process (one rank) of a training job.

Only rank 0 talks to the control plane's agent protocol (registers for every rank, polls,
acknowledges); every rank emits its own step spans. A framework integration
(:mod:`tuneloop.agent.torch`) carries a new config from rank 0 to all ranks at one step.

With a :class:`~tuneloop.agent.power.GpuPowerLimit` the agent applies the ``power_limit_w``
knob itself: rank 0 sets it before it hands a released config to the job, and reports a config
the driver refuses as one the job could not run (``status`` failed, with the reason) instead of
handing it over; every rank puts back the limits it found when it closes.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, SupportsFloat

from tuneloop.agent.client import ControlPlaneClient, RankInfo, Released
from tuneloop.agent.knobs import Knob, check_unique
from tuneloop.agent.noise import GradientNoiseScale
from tuneloop.agent.power import POWER_LIMIT_KEY, GpuPowerLimit, PowerLimitRefused
from tuneloop.agent.subscription import ConfigSubscription

if TYPE_CHECKING:
    from tuneloop.agent.steps import StepSpan, StepTracer

log = logging.getLogger(__name__)


class Agent:
    """Configure with arguments or from the environment (:meth:`from_env`).

    ``phase_every``: phases are timed on every this many steps (step spans on every step),
    which keeps the instrumentation's cost under 1% of a 20 ms step. ``flops_per_sample``
    (and ``peak_flops_per_gpu`` for a GPU tuneloop's table lacks): the job's work per sample,
    from which the diagnosis computes its MFU (docs/agent.md)."""

    def __init__(
        self,
        *,
        url: str,
        token: str,
        job: str,
        project: str = "default",
        rank: int = 0,
        world_size: int = 1,
        instrument: bool = True,
        poll_timeout_s: float = 30.0,
        phase_every: int = 10,
        flops_per_sample: float | None = None,
        peak_flops_per_gpu: float | None = None,
        tracer: StepTracer | None = None,
        client: ControlPlaneClient | None = None,
        power: GpuPowerLimit | None = None,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside 0..{world_size - 1}")
        self.url, self.job, self.project = url, job, project
        self.rank, self.world_size = rank, world_size
        self.noise_scale = GradientNoiseScale()
        self.config: dict[str, Any] = {}
        self.version = 0
        """The released version the job runs (0: its own starting config, not yet adopted)."""
        self._poll_timeout_s = poll_timeout_s
        self._client = client
        if self._client is None and rank == 0:
            self._client = ControlPlaneClient(url, token, project, job)
        self.tracer = tracer
        if self.tracer is None and instrument:
            from tuneloop.agent.steps import StepTracer

            self.tracer = StepTracer(
                url,
                token,
                job,
                rank=rank,
                phase_every=phase_every,
                flops_per_sample=flops_per_sample,
                peak_flops_per_gpu=peak_flops_per_gpu,
            )
        self._subscription: ConfigSubscription | None = None
        self.power = power
        self._power_error: str | None = None  # why the power limit cannot be set at all
        self._power_version = 0  # the released version whose power limit is set

    @classmethod
    def from_env(cls, **overrides: Any) -> Agent:
        """``TUNELOOP_URL``, ``TUNELOOP_TOKEN``, ``TUNELOOP_JOB``, ``TUNELOOP_PROJECT``
        (default ``default``), ``RANK`` and ``WORLD_SIZE`` (as torchrun sets them), and
        optionally ``TUNELOOP_FLOPS_PER_SAMPLE`` and ``TUNELOOP_PEAK_FLOPS_PER_GPU``."""
        env = os.environ
        missing = [n for n in ("TUNELOOP_URL", "TUNELOOP_TOKEN", "TUNELOOP_JOB") if n not in env]
        if missing and not {"url", "token", "job"} <= overrides.keys():
            raise RuntimeError(f"set {', '.join(missing)} (or pass them to Agent)")
        values: dict[str, Any] = {
            "url": env.get("TUNELOOP_URL"),
            "token": env.get("TUNELOOP_TOKEN"),
            "job": env.get("TUNELOOP_JOB"),
            "project": env.get("TUNELOOP_PROJECT", "default"),
            "rank": int(env.get("RANK", "0")),
            "world_size": int(env.get("WORLD_SIZE", "1")),
        }
        for name in ("flops_per_sample", "peak_flops_per_gpu"):
            text = env.get(f"TUNELOOP_{name.upper()}")
            if text:
                values[name] = float(text)
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ control plane

    def start(
        self,
        config: Mapping[str, Any],
        ranks: Sequence[RankInfo] | None = None,
        *,
        details: Mapping[str, Any] | None = None,
        knobs: Sequence[Knob] = (),
    ) -> None:
        """Start with the job's own ``config``; with a power limit, its ``power_limit_w`` is set
        (one refused is dropped from the config, logged), and the limit the GPUs run at added
        when it sets none. A knob missing from ``config`` starts at its default. On rank 0:
        register (with ``ranks``, every rank's host and GPUs; default: ranks on this host
        without GPUs, and ``knobs``, the job's own settings a study may search) and subscribe,
        in the background, so an unreachable control plane never holds the job up."""
        check_unique(knobs)
        self.config = {**{k.name: k.default for k in knobs}, **dict(config)}
        declarations = [k.declaration() for k in knobs]
        power_details = self._start_power()
        found = set(power_details.get(POWER_LIMIT_KEY, {}).get("found_w", ()))
        if self.config.get(POWER_LIMIT_KEY) is not None:
            try:
                self.apply_power(self.config)
            except PowerLimitRefused as exc:
                log.error("the starting config's power limit is not set: %s", exc)
                del self.config[POWER_LIMIT_KEY]
        if len(found) == 1 and POWER_LIMIT_KEY not in self.config:
            # What the job runs at is part of its config: a study over the knob measures it
            # first, and a rollback can return to it.
            self.config[POWER_LIMIT_KEY] = found.pop()
        if self.rank != 0:
            return
        client = self._client
        assert client is not None
        rank_list = (
            list(ranks) if ranks is not None else [RankInfo(r) for r in range(self.world_size)]
        )

        def register() -> tuple[int, Released | None]:
            client.ensure_job()
            return client.register(
                host=socket.gethostname(),
                world_size=self.world_size,
                ranks=rank_list,
                config=self.config,
                pid=os.getpid(),
                details={"sdk": "tuneloop.agent", **power_details, **(details or {})},
                knobs=declarations,
            )

        self._subscription = ConfigSubscription(
            client, register, running_version=self.version, poll_timeout_s=self._poll_timeout_s
        )
        self._subscription.start()

    def _start_power(self) -> dict[str, Any]:
        """The GPUs' power range, registered so that a study's ``power_limit_w`` bounds can be
        taken from it; a failure to open NVML is registered too, and refuses the knob."""
        if self.power is None:
            return {}
        try:
            return {POWER_LIMIT_KEY: self.power.start()}
        except PowerLimitRefused as exc:
            self._power_error = str(exc)
            log.warning("the power limit cannot be set: %s", exc)
            return {POWER_LIMIT_KEY: {"error": str(exc)}}

    def apply_power(self, config: Mapping[str, Any]) -> None:
        """Set ``config``'s power limit on this rank's GPUs (the limits found, without one):
        :class:`PowerLimitRefused` when the driver refuses it, nothing changed. Rank 0 calls
        it in :meth:`pending`; a framework integration calls it on the other ranks."""
        if self.power is None:
            if config.get(POWER_LIMIT_KEY) is not None:
                raise PowerLimitRefused(
                    f"{POWER_LIMIT_KEY}: the agent was started without a power limit "
                    "(Agent(power=GpuPowerLimit()), docs/energy.md)"
                )
            return
        if self._power_error is not None:
            if config.get(POWER_LIMIT_KEY) is not None:
                raise PowerLimitRefused(self._power_error)
            return
        self.power.apply_config(config)

    def refuse(self, version: int, reason: str) -> None:
        """Rank 0: the job cannot run released ``version``: keep the running config's power
        limit and report the version as failed, with ``reason``, for the tuner and the
        actuator to act on (a trial fails, a change is rolled back)."""
        log.error("released version %d refused: %s", version, reason)
        if self.power is not None and self._power_version != self.version:
            try:
                self.apply_power(self.config)
                self._power_version = self.version
            except PowerLimitRefused as exc:
                log.error("power limit of the running config not restored: %s", exc)
        if self._subscription is not None:
            self._subscription.refused(version, self.config, reason)

    @property
    def connected(self) -> bool:
        return self._subscription is not None and self._subscription.connected.is_set()

    @property
    def agent_id(self) -> int | None:
        return None if self._subscription is None else self._subscription.agent_id

    def pending(self) -> Released | None:
        """Rank 0: a released config newer than the one running, if any (non-blocking)."""
        if self._subscription is None:
            return None
        pending = self._subscription.pending()
        if pending is not None and pending.version > self.version:
            if dict(pending.config) == self.config:
                # The adopted starting config (or a copy of what runs): nothing to apply.
                self.applied(pending.version, pending.config, step=None)
                return None
            if pending.version != self._power_version:
                try:
                    self.apply_power(pending.config)
                except PowerLimitRefused as exc:
                    self.refuse(pending.version, str(exc))
                    return None
                self._power_version = pending.version
            return pending
        return None

    def applied(self, version: int, config: Mapping[str, Any], step: int | None) -> None:
        """The job runs ``version`` from ``step`` on; rank 0 acknowledges it."""
        self.version, self.config = version, dict(config)
        if self._subscription is not None:
            self._subscription.applied(version, step)

    # ------------------------------------------------------------------ instrumentation

    def step(
        self,
        number: int | None = None,
        *,
        samples: float | None = None,
        tokens: float | None = None,
    ) -> StepSpan | AbstractContextManager[None]:
        """Time one training step (a no-op without instrumentation): ``samples`` and
        ``tokens`` this rank processed in it, all micro-batches together."""
        if self.tracer is None:
            return nullcontext()
        return self.tracer.step(number, samples=samples, tokens=tokens)

    def record(
        self,
        *,
        grad_norm: SupportsFloat | None = None,
        learning_rate: SupportsFloat | None = None,
    ) -> None:
        """The latest step's gradient norm (e.g. what ``clip_grad_norm_`` returns; a tensor is
        read off the training thread) and learning rate."""
        if self.tracer is not None:
            self.tracer.record(grad_norm=grad_norm, learning_rate=learning_rate)

    def checkpoint(self) -> AbstractContextManager[None]:
        """Times a checkpoint save: ``with agent.checkpoint(): torch.save(...)``."""
        return nullcontext() if self.tracer is None else self.tracer.checkpoint()

    def record_checkpoint(self, seconds: float) -> None:
        """A checkpoint save timed by the job itself (an asynchronous save's own figure)."""
        if self.tracer is not None:
            self.tracer.record_checkpoint(seconds)

    def record_noise(self, sq_small: float, sq_big: float, b_small: float, b_big: float) -> None:
        self.noise_scale.update(sq_small, sq_big, b_small, b_big)
        if self.tracer is not None:
            self.tracer.set_noise_scale(self.noise_scale.value)

    def close(self) -> None:
        """Put back the GPUs' power limits, send queued acknowledgements and what the
        exporters hold, then stop."""
        if self.power is not None:
            self.power.close()
        if self._subscription is not None:
            self._subscription.stop()  # closes the client
        elif self._client is not None:
            self._client.close()
        if self.tracer is not None:
            self.tracer.shutdown()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
