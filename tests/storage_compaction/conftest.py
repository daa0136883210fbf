"""These tests pin every chunk to one span (``TUNELOOP_CHUNK_MIN_SAMPLES=1``): their small
fleet then makes hourly chunks whose edges fall inside the ranges read. Widened chunks, the
default, are tested in ``test_chunk_widths.py`` with ``min_samples`` given."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import tuneloop.settings
from tuneloop.settings import get_settings


@pytest.fixture(autouse=True)
def one_span_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # In the environment too: the crash test's child process builds its own settings.
    monkeypatch.setenv("TUNELOOP_CHUNK_MIN_SAMPLES", "1")
    monkeypatch.setattr(tuneloop.settings, "_current", None)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
