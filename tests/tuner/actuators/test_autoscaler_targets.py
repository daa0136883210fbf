"""The autoscaler's targets against local HTTP servers: a fake Kubernetes API server that
speaks the scale subresource (no real cluster here), and a plain webhook receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client as k8s

from tuner.actuators.autoscaler.kubernetes import KubernetesScaleTarget
from tuner.actuators.autoscaler.policy import Metrics, ScalePolicy, ScaleState
from tuner.actuators.autoscaler.reconcile import autoscale
from tuner.actuators.autoscaler.webhook import WebhookScaleTarget

RESOURCES = {"deployments": "Deployment", "statefulsets": "StatefulSet"}


class FakeScaleApi(BaseHTTPRequestHandler):
    """``GET``/``PATCH /apis/apps/v1/namespaces/NS/{deployments,statefulsets}/NAME/scale``
    answering ``autoscaling/v1`` ``Scale`` objects, as the API server does."""

    replicas: dict[tuple[str, str, str], int]
    requests: list[tuple[str, str, str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _key(self) -> tuple[str, str, str] | None:
        parts = self.path.split("?")[0].strip("/").split("/")
        prefix_ok = len(parts) == 8 and parts[:4] == ["apis", "apps", "v1", "namespaces"]
        if prefix_ok and parts[5] in RESOURCES and parts[7] == "scale":
            return parts[5], parts[4], parts[6]
        return None

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _scale(self, key: tuple[str, str, str]) -> dict[str, Any]:
        _, namespace, name = key
        replicas = self.replicas[key]
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"replicas": replicas},
            "status": {"replicas": replicas, "selector": f"app={name}"},
        }

    def _not_found(self) -> None:
        self._send(
            404,
            {"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound",
             "code": 404, "message": f"{self.path} not found"},
        )  # fmt: skip

    def do_GET(self) -> None:
        key = self._key()
        self.requests.append(("GET", self.path, "", None))
        if key is None or key not in self.replicas:
            return self._not_found()
        self._send(200, self._scale(key))

    def do_PATCH(self) -> None:
        key = self._key()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(("PATCH", self.path, self.headers["Content-Type"], body))
        if key is None or key not in self.replicas:
            return self._not_found()
        if isinstance(body, list):  # JSON patch
            for op in body:
                if op["path"] == "/spec/replicas":
                    self.replicas[key] = int(op["value"])
        else:  # merge or strategic merge patch
            self.replicas[key] = int(body["spec"]["replicas"])
        self._send(200, self._scale(key))


@pytest.fixture
def fake_kubernetes_api() -> Iterator[tuple[str, type[FakeScaleApi]]]:
    handler = type("Handler", (FakeScaleApi,), {"replicas": {}, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


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


class WebhookReceiver(BaseHTTPRequestHandler):
    replicas = 3
    posts: list[dict[str, Any]]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"replicas": type(self).replicas})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.posts.append({**body, "auth": self.headers.get("Authorization")})
        type(self).replicas = int(body["replicas"])
        self._send({})


def test_webhook_target() -> None:
    handler = type("Handler", (WebhookReceiver,), {"posts": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/scale"
        target = WebhookScaleTarget(url, headers={"Authorization": "Bearer s3cret"})
        quiet = Metrics(at=1000.0, p99_latency_s=0.01)
        policy = ScalePolicy(
            min_replicas=2, max_replicas=10, p99_slo_s=0.2, scale_in_stabilization_s=0
        )
        decision = autoscale(target, policy, ScaleState(3), quiet, now=1001.0)
        assert decision.replicas == 2
        assert handler.posts == [{"replicas": 2, "reason": "rate_limited", "auth": "Bearer s3cret"}]
        target.close()
    finally:
        server.shutdown()
        server.server_close()
