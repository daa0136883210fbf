"""The example server's dynamic batcher honours both knobs, live."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import pytest

from examples.inference.batcher import DynamicBatcher, check_knobs

SLACK_S = 0.15
"""Scheduling slack on a loaded two-core machine."""


class Recorder:
    """A model that takes 5 ms a batch and remembers each batch's size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        time.sleep(0.005)
        with self.lock:
            self.sizes.append(len(inputs))
        return [x * 2 for x in inputs]


def test_a_batch_never_exceeds_max_batch_size_and_a_change_applies_live() -> None:
    model = Recorder()
    batcher = DynamicBatcher(model, max_batch_size=8, max_delay_ms=50)
    try:
        futures: list[Future[Any]] = [batcher.submit(i) for i in range(100)]
        assert [f.result(10) for f in futures] == [2 * i for i in range(100)]
        assert max(model.sizes) == 8, "the queue was full: batches fill up to the limit"
        assert sum(model.sizes) == 100

        assert batcher.set_knobs(max_batch_size=3) == {"max_batch_size": 3, "max_delay_ms": 50}
        model.sizes.clear()
        futures = [batcher.submit(i) for i in range(30)]
        assert [f.result(10) for f in futures] == [2 * i for i in range(30)]
        assert max(model.sizes) == 3 and sum(model.sizes) == 30
    finally:
        batcher.stop()


@pytest.mark.parametrize("delay_ms", [0, 40, 120])
def test_a_lone_request_waits_at_most_max_delay(delay_ms: int) -> None:
    batcher = DynamicBatcher(Recorder(), max_batch_size=64, max_delay_ms=delay_ms)
    try:
        batcher.submit(0).result(5)  # warm: the worker thread is running
        start = time.monotonic()
        assert batcher.submit(21).result(5) == 42
        waited = time.monotonic() - start
        assert waited >= delay_ms / 1000, "it waited for company as long as allowed"
        assert waited <= delay_ms / 1000 + SLACK_S
    finally:
        batcher.stop()


def test_a_full_queue_refuses_and_bad_knobs_are_named() -> None:
    gate = threading.Event()

    def blocked(inputs: Sequence[Any]) -> list[Any]:
        gate.wait(5)
        return list(inputs)

    batcher = DynamicBatcher(blocked, max_batch_size=1, max_delay_ms=0, max_queue=2)
    try:
        first = batcher.submit(1)
        time.sleep(0.05)  # the worker holds it
        queued = [batcher.submit(2), batcher.submit(3)]
        with pytest.raises(RuntimeError, match="2 requests queued"):
            batcher.submit(4)
        gate.set()
        assert [f.result(5) for f in (first, *queued)] == [1, 2, 3]
    finally:
        batcher.stop()
    for knobs, message in [
        ({"max_batch_size": 0}, "max_batch_size must be an integer in \\[1, 1024\\], got 0"),
        ({"max_delay_ms": 2.5}, "max_delay_ms must be an integer"),
        ({"max_batch_size": True}, "max_batch_size must be an integer"),
        ({"batch_size": 8}, "unknown knob\\(s\\) \\['batch_size'\\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_knobs(knobs)


def test_a_failing_model_fails_its_batch_only() -> None:
    calls = []

    def flaky(inputs: Sequence[Any]) -> list[Any]:
        calls.append(len(inputs))
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return list(inputs)

    batcher = DynamicBatcher(flaky, max_batch_size=4, max_delay_ms=0)
    try:
        with pytest.raises(RuntimeError, match="out of memory"):
            batcher.submit(1).result(5)
        assert batcher.submit(2).result(5) == 2
    finally:
        batcher.stop()
