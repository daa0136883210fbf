"""Local HTTP servers the autoscaler's targets talk to in tests: a fake Kubernetes API server
that speaks the scale subresource (no real cluster here), and a plain webhook receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


class WebhookReceiver(BaseHTTPRequestHandler):
    """``GET`` answers ``{"replicas": n}``, ``POST`` records the body and sets ``n``; with
    ``failing`` set, both answer that status instead (a receiver that is down)."""

    replicas = 3
    posts: list[dict[str, Any]]
    failing: int | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(type(self).failing or 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._send({"replicas": type(self).replicas})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.posts.append({**body, "auth": self.headers.get("Authorization")})
        if type(self).failing is None:
            type(self).replicas = int(body["replicas"])
        self._send({})


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a free local port, in a thread; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # Polled every 50 ms: shutdown() waits for the next poll (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
