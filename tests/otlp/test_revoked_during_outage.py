"""Revocation holds through a database outage: a token revoked before the outage is refused
during it, even though the database confirmed it lately, whether it was revoked through this
API or elsewhere (the CLI, another replica); a token still valid keeps exporting into the
spool. The outage is the OTLP route's store lookups failing as a stopped server makes them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError

from collector.otlp import targets
from collector.otlp.targets import RecentTargets, Target
from tests.api.conftest import Minter, bearer
from tests.otlp.test_routes import post, sample_metrics
from tuneloop import accounts
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import ApiToken


@contextmanager
def _down(*_args: object, **_kwargs: object) -> Iterator[None]:
    raise OperationalError("SELECT 1", {}, Exception("connection refused"))
    yield  # pragma: no cover


def _export(client: TestClient, token: dict[str, str]) -> int:
    return post(client, "/v1/metrics", sample_metrics().SerializeToString(), token).status_code


def _token_id(runtime: Runtime, secret: str) -> int:
    with session_scope(runtime.sessions) as session:
        found = session.query(ApiToken).filter_by(token_hash=accounts.hash_secret(secret)).one()
        return found.id


def test_a_token_revoked_before_the_outage_stays_refused_through_it(
    client: TestClient, mint: Minter, runtime: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(targets, "REVOCATION_SWEEP_S", 0.0)
    mint.project("alpha")
    member = bearer(mint.token("alpha", "member", "alice"))
    by_api, by_cli, kept = (mint.token("alpha", "agent", name) for name in ("a", "b", "c"))
    for secret in (by_api, by_cli, kept):
        assert _export(client, bearer(secret)) == 200  # confirmed, remembered
    deleted = client.delete(f"/api/v1/tokens/{_token_id(runtime, by_api)}", headers=member)
    assert deleted.status_code == 204
    with session_scope(runtime.sessions) as session:  # as `tuneloop token revoke` does
        accounts.revoke_token(session, _token_id(runtime, by_cli))
    assert _export(client, bearer(kept)) == 200  # the database answers: revocations heard of

    monkeypatch.setattr("api.ingest.session_scope", _down)
    for _ in range(3):
        for secret in (by_api, by_cli):
            assert _export(client, bearer(secret)) == 401
        assert _export(client, bearer(kept)) == 200
    assert _export(client, bearer(mint.token("alpha", "agent", "new"))) == 503  # never seen


def test_refusals_are_remembered_and_swept_in() -> None:
    recent = RecentTargets(max_entries=2)
    recent.remember("a", Target(1, 10))
    recent.refuse("a")
    assert recent.recall("a") is None and recent.refused("a")
    windows: list[float] = []
    recent.sweep(lambda window_s: windows.append(window_s) or ["b", "c"])
    recent.sweep(lambda window_s: windows.append(window_s) or ["d"])  # too soon: not asked
    assert windows == [targets.OUTAGE_GRACE_S]
    assert recent.refused("b") and recent.refused("c")
    assert not recent.refused("a")  # bounded: the oldest refusal goes first
