"""One submission, every destination: the store's pipeline and each forwarding pipeline.

Each destination has a pipeline of its own (queue, spool, retries), so a TSDB that is down
holds back only what goes to it. A submission is acknowledged once every pipeline accepted it:
the store's first, then each forward. If a forward refuses it (``PipelineFull``: its spool is
full), the sender is refused too and retries; the store already holds those samples and keeps
them once (samples are unique on series and time), and the forward takes them then. So every
destination gets each acknowledged sample at least once, none is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TypeAlias

from prometheus_client import CollectorRegistry

from collector.pipeline import Pipeline, PipelineStatus
from collector.selfmetrics import CollectorMetrics
from tuneloop.storage.timeseries.columns import Batch


class FanOut:
    """The store's pipeline (``primary``: its status and metrics are this object's) and the
    forwarding ``pipelines``, submitted to, started and stopped together."""

    def __init__(self, primary: Pipeline, forwards: Sequence[Pipeline]) -> None:
        self.primary = primary
        self.forwards = tuple(forwards)

    @property
    def registry(self) -> CollectorRegistry:
        return self.primary.registry

    @property
    def metrics(self) -> CollectorMetrics:
        return self.primary.metrics

    def status(self) -> PipelineStatus:
        return self.primary.status()

    def submit(self, project_id: int, batches: Sequence[Batch]) -> None:
        """Accepted by every pipeline, or ``PipelineFull`` raised (see the module doc)."""
        self.primary.submit(project_id, batches)
        for forward in self.forwards:
            forward.submit(project_id, batches)

    def start(self) -> None:
        self.primary.start()
        for forward in self.forwards:
            forward.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Drain every pipeline (each to its destination or its spool), side by side: a
        destination that is down holds the stop for ``timeout_s`` once, not once each."""
        threads = [
            threading.Thread(target=forward.stop, args=(timeout_s,), name="tuneloop-forward-stop")
            for forward in self.forwards
        ]
        for thread in threads:
            thread.start()
        self.primary.stop(timeout_s)
        for thread in threads:
            thread.join()


WritePipeline: TypeAlias = Pipeline | FanOut
"""Where samples are submitted: one pipeline, or the store's and the forwards' together."""
