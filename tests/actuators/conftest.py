"""Fixtures of the actuator tests: the fake Kubernetes API server of :mod:`.scale_servers`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.actuators.scale_servers import FakeScaleApi, serve


@pytest.fixture
def fake_kubernetes_api() -> Iterator[tuple[str, type[FakeScaleApi]]]:
    handler = type("Handler", (FakeScaleApi,), {"replicas": {}, "requests": []})
    with serve(handler) as url:
        yield url, handler
