"""The memory of confirmed tokens that keeps OTLP exports flowing while the database is down."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.exc import OperationalError

from collector.otlp.targets import RecentTargets, Target


def test_recalls_a_confirmed_target() -> None:
    recent = RecentTargets()
    recent.remember("hash-a", Target(project_id=1, max_series=10))
    assert recent.recall("hash-a") == Target(project_id=1, max_series=10)
    assert recent.recall("hash-b") is None


def test_forgets_a_token_the_database_refused() -> None:
    recent = RecentTargets()
    recent.remember("hash-a", Target(1, 10))
    recent.forget("hash-a")
    assert recent.recall("hash-a") is None


def test_entries_expire() -> None:
    recent = RecentTargets(max_age_s=0.05)
    recent.remember("hash-a", Target(1, 10))
    time.sleep(0.1)
    assert recent.recall("hash-a") is None


def test_the_oldest_entry_goes_first_past_the_bound() -> None:
    recent = RecentTargets(max_entries=2)
    for key in ("a", "b", "c"):
        recent.remember(key, Target(1, 10))
    assert recent.recall("a") is None
    assert recent.recall("b") is not None and recent.recall("c") is not None


def _database_down() -> Target:
    raise OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_resolve_remembers_and_answers_from_memory_through_an_outage() -> None:
    recent = RecentTargets()
    assert recent.resolve("hash-a", lambda: Target(1, 10)) == Target(1, 10)
    assert recent.resolve("hash-a", _database_down) == Target(1, 10)
    with pytest.raises(OperationalError):
        recent.resolve("hash-b", _database_down)


def test_resolve_forgets_a_token_the_lookup_refuses() -> None:
    recent = RecentTargets()
    recent.resolve("hash-a", lambda: Target(1, 10))

    def refused() -> Target:
        raise PermissionError("revoked")

    with pytest.raises(PermissionError):
        recent.resolve("hash-a", refused)
    assert recent.recall("hash-a") is None
