"""The autoscaler's targets against local HTTP servers (:mod:`.scale_servers`): a fake
Kubernetes API server that speaks the scale subresource (no real cluster here), and a plain
webhook receiver."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from actuators.autoscaler.kubernetes import KubernetesScaleTarget
from actuators.autoscaler.policy import Metrics, ScalePolicy, ScaleState
from actuators.autoscaler.reconcile import autoscale
from actuators.autoscaler.webhook import WebhookScaleTarget
from tests.actuators.scale_servers import RESOURCES, FakeScaleApi, WebhookReceiver, serve


def api_client(url: str) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = url
    return k8s.ApiClient(configuration)


POLICY = ScalePolicy(min_replicas=1, max_replicas=10, p99_slo_s=0.2)


@pytest.mark.parametrize("resource", ["deployments", "statefulsets"])
def test_kubernetes_scale_subresource_on_a_fake_api_server(
    fake_kubernetes_api: tuple[str, type[FakeScaleApi]], resource: str
) -> None:
    url, api = fake_kubernetes_api
    api.replicas[(resource, "serving", "llama")] = 2
    target = KubernetesScaleTarget(api_client(url), RESOURCES[resource], "serving", "llama")  # type: ignore[arg-type]
    assert target.get_replicas() == 2

    hot = Metrics(at=1000.0, p99_latency_s=0.5)
    decision = autoscale(target, POLICY, ScaleState(2), hot, now=1001.0)
    assert (decision.replicas, decision.reason) == (5, "scale_out")
    assert api.replicas[(resource, "serving", "llama")] == 5
    method, path, content_type, body = api.requests[-1]
    assert (method, path) == ("PATCH", f"/apis/apps/v1/namespaces/serving/{resource}/llama/scale")
    assert "patch" in content_type and body == {"spec": {"replicas": 5}}

    # In sync and stale metrics: reads, never writes.
    patches = sum(1 for r in api.requests if r[0] == "PATCH")
    autoscale(target, POLICY, decision.state, Metrics(at=1000.0, p99_latency_s=0.2), 1002.0)
    autoscale(target, POLICY, decision.state, Metrics(at=0.0, p99_latency_s=9.0), 1003.0)
    assert sum(1 for r in api.requests if r[0] == "PATCH") == patches

    # Dry run: decides, does not scale.
    dry = autoscale(target, POLICY, decision.state, hot, 1004.0, dry_run=True)
    assert dry.replicas > 5 and api.replicas[(resource, "serving", "llama")] == 5


def test_kubernetes_unknown_workload_is_an_api_error(
    fake_kubernetes_api: tuple[str, type[FakeScaleApi]],
) -> None:
    url, _ = fake_kubernetes_api
    target = KubernetesScaleTarget(api_client(url), "Deployment", "serving", "missing")
    with pytest.raises(k8s.ApiException) as raised:
        target.get_replicas()
    assert raised.value.status == 404


def test_webhook_target() -> None:
    handler = type("Handler", (WebhookReceiver,), {"posts": []})
    with serve(handler) as base:
        target = WebhookScaleTarget(f"{base}/scale", headers={"Authorization": "Bearer s3cret"})
        quiet = Metrics(at=1000.0, p99_latency_s=0.01)
        policy = ScalePolicy(
            min_replicas=2, max_replicas=10, p99_slo_s=0.2, scale_in_stabilization_s=0
        )
        decision = autoscale(target, policy, ScaleState(3), quiet, now=1001.0)
        assert decision.replicas == 2
        assert handler.posts == [{"replicas": 2, "reason": "rate_limited", "auth": "Bearer s3cret"}]
        target.close()
