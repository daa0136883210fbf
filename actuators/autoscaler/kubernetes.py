"""Scale a Deployment or StatefulSet through its ``scale`` subresource with the official
``kubernetes`` client (the same call ``kubectl scale`` makes)."""

from __future__ import annotations

from typing import Any, Literal

from kubernetes import client as k8s

WorkloadKind = Literal["Deployment", "StatefulSet"]


class KubernetesScaleTarget:
    """One workload. ``api_client``: a configured ``kubernetes.client.ApiClient`` (from
    ``kubernetes.config.load_incluster_config()`` or a kubeconfig). ``timeout_s`` bounds each
    API call (the client waits forever by default)."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        kind: WorkloadKind,
        namespace: str,
        name: str,
        *,
        timeout_s: float | None = None,
    ) -> None:
        if kind not in ("Deployment", "StatefulSet"):
            raise ValueError(f"kind must be Deployment or StatefulSet, got {kind!r}")
        self._apps = k8s.AppsV1Api(api_client)
        self.kind, self.namespace, self.name = kind, namespace, name
        self._call: dict[str, Any] = {} if timeout_s is None else {"_request_timeout": timeout_s}

    def __str__(self) -> str:
        return f"{self.kind.lower()}/{self.namespace}/{self.name}"

    def get_replicas(self) -> int:
        if self.kind == "Deployment":
            scale: Any = self._apps.read_namespaced_deployment_scale(
                self.name, self.namespace, **self._call
            )
        else:
            scale = self._apps.read_namespaced_stateful_set_scale(
                self.name, self.namespace, **self._call
            )
        return int(scale.spec.replicas or 0)

    def set_replicas(self, replicas: int, reason: str) -> None:
        body = {"spec": {"replicas": replicas}}
        if self.kind == "Deployment":
            self._apps.patch_namespaced_deployment_scale(
                self.name, self.namespace, body, **self._call
            )
        else:
            self._apps.patch_namespaced_stateful_set_scale(
                self.name, self.namespace, body, **self._call
            )
