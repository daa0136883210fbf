"""Stored autoscalers reconciled for real: rows and metrics in the store (SQLite and
PostgreSQL), metrics written through the store's writer, and as targets the local fake
Kubernetes API server (reached through a kubeconfig file, as the server is configured) and a
local webhook receiver."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session, sessionmaker

from actuators.autoscaler.service import LEASE_S, PassResult, reconcile_autoscaler
from actuators.autoscaler.tasks import reconcile_all
from tests.actuators.scale_servers import FakeScaleApi, WebhookReceiver, serve
from tuneloop import accounts
from tuneloop.settings import Settings
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Autoscaler
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
P99 = "llm_request_latency_p99_seconds"
QUEUE = "llm_queue_requests"
POLICY: dict[str, Any] = {"min_replicas": 1, "max_replicas": 10, "p99_slo_s": 0.2}
P99_SELECTOR = {"metric": P99, "match": ['service="llama"']}
DEPLOYMENT = {"kind": "Deployment", "namespace": "serving", "name": "llama"}
DEPLOYMENT_KEY = ("deployments", "serving", "llama")


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: local\n"
        f"clusters:\n- name: local\n  cluster:\n    server: {server}\n"
        "contexts:\n- name: local\n  context:\n    cluster: local\n    user: local\n"
        "users:\n- name: local\n  user: {}\n"
    )
    return path


@dataclass
class Fleet:
    """A project with autoscalers in the store, its metrics writer and the fake cluster."""

    database_url: str
    sessions: sessionmaker[Session]
    writer: SampleWriter
    project_id: int
    settings: Settings
    cluster: type[FakeScaleApi]

    def write(self, metric: str, value: float, at: datetime, **labels: str) -> None:
        labels = {"service": "llama", **labels}
        result = self.writer.write(self.project_id, [SeriesBatch(metric, labels, [at], [value])])
        assert result.samples_written == 1, result.rejected

    def add(
        self,
        name: str,
        target: dict[str, Any],
        *,
        kind: str = "kubernetes",
        policy: dict[str, Any] | None = None,
        p99: dict[str, Any] | None = P99_SELECTOR,
        queue: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> int:
        with session_scope(self.sessions) as session:
            row = Autoscaler(
                project_id=self.project_id,
                name=name,
                target_kind=kind,
                target=target,
                policy=policy or POLICY,
                p99_selector=p99,
                queue_selector=queue,
                dry_run=dry_run,
            )
            session.add(row)
            session.flush()
            return row.id

    def run(self, autoscaler_id: int, now: datetime = NOW) -> PassResult:
        with self.sessions() as session:
            return reconcile_autoscaler(session, autoscaler_id, now, settings=self.settings)

    def row(self, autoscaler_id: int) -> Autoscaler:
        with self.sessions() as session:
            found = session.get(Autoscaler, autoscaler_id)
            assert found is not None
            return found

    def audit(self) -> list[tuple[str, dict[str, Any]]]:
        with self.sessions() as session:
            rows = session.scalars(
                select(AuditEntry).where(AuditEntry.actor == "autoscaler").order_by(AuditEntry.id)
            )
            return [(entry.action, entry.details) for entry in rows]

    def patches(self) -> list[Any]:
        return [body for method, _, _, body in self.cluster.requests if method == "PATCH"]


@pytest.fixture
def fleet(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    fake_kubernetes_api: tuple[str, type[FakeScaleApi]],
) -> Fleet:
    url, cluster = fake_kubernetes_api
    sessions = session_factory(engine)
    with session_scope(sessions) as session:
        project_id = accounts.create_project(session, "serving").id
    settings = Settings(kubeconfig=kubeconfig(tmp_path / "kubeconfig", url))
    return Fleet(database_url, sessions, SampleWriter(engine), project_id, settings, cluster)


@pytest.fixture
def webhook() -> Iterator[tuple[str, type[WebhookReceiver]]]:
    handler = type("Handler", (WebhookReceiver,), {"posts": [], "replicas": 3})
    with serve(handler) as url:
        yield f"{url}/scale", handler


def test_scales_out_on_p99_over_the_slo_and_a_rerun_changes_nothing_on_a_fake_kubernetes_api(
    fleet: Fleet,
) -> None:
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 2
    fleet.write(P99, 0.1, NOW - timedelta(seconds=5), pod="a")
    fleet.write(P99, 0.5, NOW - timedelta(seconds=3), pod="b")  # the worst replica counts
    fleet.write(P99, 9.0, NOW - timedelta(minutes=10), pod="gone")  # scaled away: ignored
    fleet.write(P99, 9.0, NOW, service="other")  # another service's series
    autoscaler = fleet.add("llama", DEPLOYMENT)

    result = fleet.run(autoscaler)

    assert (result.action, result.replicas, result.reason) == ("scaled", 5, "scale_out")
    assert fleet.cluster.replicas[DEPLOYMENT_KEY] == 5
    assert fleet.patches() == [{"spec": {"replicas": 5}}]
    row = fleet.row(autoscaler)
    assert (row.replicas, row.last_decision, row.last_reason) == (5, 5, "scale_out")
    assert row.last_decision_at == NOW and row.last_error is None and row.lease_until is None
    assert row.state["events"] == [[NOW.timestamp(), 2]]
    assert row.state["metrics_at"] == (NOW - timedelta(seconds=3)).timestamp()
    ((action, details),) = fleet.audit()
    assert action == "autoscaler.scale"
    assert details["from"] == 2 and details["to"] == 5 and details["reason"] == "scale_out"
    assert details["metrics"]["p99_latency_s"] == 0.5

    # The same samples again, now or later: each drives one decision; nothing is written.
    requests = len(fleet.cluster.requests)
    for later in (NOW, NOW + timedelta(seconds=15)):
        again = fleet.run(autoscaler, later)
        assert (again.action, again.replicas, again.reason) == ("unchanged", 5, "scale_out")
    assert len(fleet.cluster.requests) == requests
    after = fleet.row(autoscaler)
    assert (after.state, after.last_decision_at) == (row.state, row.last_decision_at)
    assert len(fleet.audit()) == 1


def test_no_action_on_stale_metrics_on_a_fake_kubernetes_api(fleet: Fleet) -> None:
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 4
    fleet.write(P99, 5.0, NOW - timedelta(seconds=120))  # older than max_metric_age_s (60)
    stale = fleet.add("stale", DEPLOYMENT)
    # A fresh P99 does not make up for a configured queue signal without a fresh sample.
    fleet.write(P99, 5.0, NOW - timedelta(seconds=1), service="other")
    half = fleet.add(
        "half",
        {**DEPLOYMENT, "name": "other"},
        policy={**POLICY, "target_queue_per_replica": 10},
        p99={"metric": P99, "match": ['service="other"']},
        queue={"metric": QUEUE, "match": ['service="other"']},
    )
    fleet.cluster.replicas[("deployments", "serving", "other")] = 4

    for autoscaler in (stale, half):
        result = fleet.run(autoscaler)
        assert (result.action, result.replicas, result.reason) == ("unchanged", 4, "stale_metrics")
    assert fleet.patches() == []
    assert fleet.audit() == []


def test_bounds_are_held_whatever_the_metrics_on_a_fake_kubernetes_api(fleet: Fleet) -> None:
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 14  # scaled by hand past the maximum
    autoscaler = fleet.add("llama", DEPLOYMENT)

    assert fleet.run(autoscaler).reason == "bounds"  # no metrics at all, still bounded
    assert fleet.cluster.replicas[DEPLOYMENT_KEY] == 10

    fleet.write(P99, 3.0, NOW + timedelta(seconds=1))
    later = NOW + timedelta(seconds=2)
    refused = fleet.run(autoscaler, later)
    assert (refused.action, refused.replicas, refused.reason) == ("refused", 10, "at_max")
    fleet.write(P99, 3.0, NOW + timedelta(seconds=3))
    assert fleet.run(autoscaler, NOW + timedelta(seconds=4)).action == "refused"

    assert fleet.cluster.replicas[DEPLOYMENT_KEY] == 10
    assert fleet.patches() == [{"spec": {"replicas": 10}}]
    # The refusal is audited once, not at every pass that repeats it.
    assert [action for action, _ in fleet.audit()] == ["autoscaler.scale", "autoscaler.refused"]
    assert fleet.audit()[1][1]["by"] == "policy"


def test_stabilization_survives_a_restart_on_a_fake_kubernetes_api(fleet: Fleet) -> None:
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 4
    fleet.write(P99, 0.4, NOW - timedelta(seconds=1))
    autoscaler = fleet.add("llama", DEPLOYMENT)
    assert fleet.run(autoscaler).replicas == 8

    # A new process: new engine, new sessions; only the store remembers the last pass.
    restarted = make_engine(fleet.database_url)
    try:
        fleet.sessions = session_factory(restarted)
        fleet.write(P99, 0.05, NOW + timedelta(seconds=25))
        calm = fleet.run(autoscaler, NOW + timedelta(seconds=30))
        # Without the remembered recommendation of 8 this would scale in to 4.
        assert (calm.action, calm.replicas, calm.reason) == ("unchanged", 8, "stabilizing")
        assert fleet.cluster.replicas[DEPLOYMENT_KEY] == 8

        fleet.write(P99, 0.05, NOW + timedelta(seconds=395))
        after = fleet.run(autoscaler, NOW + timedelta(seconds=400))  # past the 300 s window
        assert (after.action, after.replicas, after.reason) == ("scaled", 4, "rate_limited")
    finally:
        restarted.dispose()


def test_target_errors_are_recorded_and_the_others_still_reconciled(
    fleet: Fleet, webhook: tuple[str, type[WebhookReceiver]]
) -> None:
    url, receiver = webhook
    receiver.failing = 500
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 2
    fleet.write(P99, 0.5, NOW - timedelta(seconds=1))
    failing = fleet.add("failing-webhook", {"url": url}, kind="webhook")
    missing = fleet.add("missing", {**DEPLOYMENT, "name": "missing"})
    closed = fleet.add("closed-port", {"url": "http://127.0.0.1:9/scale"}, kind="webhook")
    healthy = fleet.add("llama", DEPLOYMENT)

    counts = reconcile_all(fleet.sessions, now=NOW, settings=fleet.settings)

    assert counts == {"error": 3, "scaled": 1}
    assert fleet.cluster.replicas[DEPLOYMENT_KEY] == 5
    assert fleet.row(failing).last_error == "webhook answered HTTP 500"
    assert str(fleet.row(missing).last_error).startswith("Kubernetes API answered 404 Not Found")
    assert str(fleet.row(closed).last_error).startswith("webhook request failed: ConnectError")
    for autoscaler in (failing, missing, closed):
        row = fleet.row(autoscaler)
        assert row.last_error_at == NOW and row.lease_until is None and row.last_decision is None
    assert fleet.row(healthy).last_error is None

    # The receiver is back: the next pass scales and clears the error.
    receiver.failing = None
    result = fleet.run(failing, NOW + timedelta(seconds=15))
    # 3 x 0.5 / 0.2 = 7.5 asks for 8; +4 per period allows 7.
    assert (result.action, result.replicas, result.reason) == ("scaled", 7, "rate_limited")
    row = fleet.row(failing)
    assert row.last_error is None and row.last_error_at is None
    assert receiver.posts == [{"replicas": 7, "reason": "rate_limited", "auth": None}]


def test_a_target_refusing_the_change_is_audited_once(
    fleet: Fleet, webhook: tuple[str, type[WebhookReceiver]]
) -> None:
    _, receiver = webhook

    class RefusesChanges(receiver):
        def do_POST(self) -> None:
            type(self).failing = 403
            try:
                super().do_POST()
            finally:
                type(self).failing = None

    fleet.write(P99, 0.5, NOW - timedelta(seconds=1))
    with serve(RefusesChanges) as base:
        autoscaler = fleet.add("llama", {"url": f"{base}/scale"}, kind="webhook")
        assert fleet.run(autoscaler).error == "webhook answered HTTP 403"
        assert fleet.run(autoscaler, NOW + timedelta(seconds=1)).action == "error"
    assert fleet.audit() == [
        (
            "autoscaler.refused",
            {"autoscaler_id": autoscaler, "by": "target", "error": "webhook answered HTTP 403"},
        )
    ]
    assert fleet.row(autoscaler).replicas == 3  # what the target last said it runs


def test_dry_run_writes_nothing_to_the_target(
    fleet: Fleet, webhook: tuple[str, type[WebhookReceiver]]
) -> None:
    url, receiver = webhook
    fleet.write(P99, 0.5, NOW - timedelta(seconds=1))
    autoscaler = fleet.add("llama", {"url": url}, kind="webhook", dry_run=True)

    first = fleet.run(autoscaler)
    fleet.write(P99, 0.5, NOW + timedelta(seconds=14))
    second = fleet.run(autoscaler, NOW + timedelta(seconds=15))

    assert (first.action, first.replicas, first.reason) == ("dry_run", 3, "rate_limited")
    assert second.action == "dry_run"
    assert receiver.posts == [] and receiver.replicas == 3
    row = fleet.row(autoscaler)
    assert (row.replicas, row.last_decision, row.last_reason) == (3, 7, "rate_limited")
    assert [action for action, _ in fleet.audit()] == ["autoscaler.dry_run"]
    assert fleet.audit()[0][1]["dry_run"] is True


def test_kubernetes_without_configuration_is_an_error_on_the_row(fleet: Fleet) -> None:
    fleet.settings = Settings(kubeconfig=None)  # and not inside a cluster
    fleet.write(P99, 0.5, NOW - timedelta(seconds=1))
    autoscaler = fleet.add("llama", DEPLOYMENT)

    result = fleet.run(autoscaler)

    assert result.action == "error"
    assert result.error is not None and result.error.startswith("no Kubernetes configuration")
    assert fleet.cluster.requests == []


def test_a_leased_or_disabled_autoscaler_is_left_alone(fleet: Fleet) -> None:
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 2
    fleet.write(P99, 0.5, NOW - timedelta(seconds=1))
    autoscaler = fleet.add("llama", DEPLOYMENT)
    held = NOW + timedelta(seconds=30)
    with fleet.sessions.begin() as session:
        session.execute(
            update(Autoscaler).where(Autoscaler.id == autoscaler).values(lease_until=held)
        )

    assert fleet.run(autoscaler).action == "busy"  # another pass holds it
    assert fleet.cluster.requests == []
    expired = NOW + timedelta(seconds=31)
    assert fleet.run(autoscaler, expired).action == "scaled"  # its worker died: the lease ran out

    with fleet.sessions.begin() as session:
        session.execute(update(Autoscaler).where(Autoscaler.id == autoscaler).values(enabled=False))
    assert fleet.run(autoscaler, expired + timedelta(seconds=LEASE_S)).action == "skipped"
    assert reconcile_all(fleet.sessions, now=NOW, settings=fleet.settings) == {}


def test_a_target_replaced_during_the_pass_gets_none_of_its_state(
    fleet: Fleet, webhook: tuple[str, type[WebhookReceiver]]
) -> None:
    url, receiver = webhook
    fleet.write(P99, 0.5, NOW - timedelta(seconds=1))
    autoscaler = fleet.add("llama", {"url": url}, kind="webhook")
    sessions = fleet.sessions

    class ReplacedMeanwhile(receiver):
        def do_GET(self) -> None:
            with sessions.begin() as session:  # an admin points it elsewhere meanwhile
                row = session.get(Autoscaler, autoscaler)
                assert row is not None
                row.target = {"url": "http://127.0.0.1:9/elsewhere"}
            super().do_GET()

    with serve(ReplacedMeanwhile) as base:
        with fleet.sessions.begin() as session:
            row = session.get(Autoscaler, autoscaler)
            assert row is not None
            row.target = {"url": f"{base}/scale"}
        assert fleet.run(autoscaler).action == "conflict"

    row = fleet.row(autoscaler)
    assert row.state == {} and row.last_decision is None and row.lease_until is None


def test_scales_out_on_a_promql_signal_on_a_fake_kubernetes_api(fleet: Fleet) -> None:
    fleet.cluster.replicas[DEPLOYMENT_KEY] = 2
    fleet.write(P99, 0.1, NOW - timedelta(seconds=5), pod="a")
    fleet.write(P99, 0.5, NOW - timedelta(seconds=3), pod="b")
    fleet.write(P99, 9.0, NOW, service="other")  # another service's series
    expr = f'max(max_over_time({P99}{{service="llama"}}[1m]))'
    autoscaler = fleet.add("llama", DEPLOYMENT, p99={"expr": expr})

    result = fleet.run(autoscaler)

    assert (result.action, result.replicas, result.reason) == ("scaled", 5, "scale_out")
    assert fleet.row(autoscaler).state["metrics_at"] == (NOW - timedelta(seconds=3)).timestamp()
    ((_, details),) = fleet.audit()
    assert details["metrics"]["p99_latency_s"] == 0.5
    # A broken expression stored behind the API's back is an error on the row.
    broken = fleet.add("broken", {**DEPLOYMENT, "name": "other"}, p99={"expr": "max("})
    assert "parse error" in str(fleet.run(broken).error)
