"""Build a stored target, and say in one line why a call to it failed.

Kubernetes credentials come from the server's own configuration only: the kubeconfig file the
``kubeconfig`` setting names, else the in-cluster service account. An autoscaler's stored
target names a workload, never a cluster or a credential.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import httpx
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from actuators.autoscaler.kubernetes import KubernetesScaleTarget
from actuators.autoscaler.reconcile import ScaleTarget
from actuators.autoscaler.spec import SpecError, check_target
from actuators.autoscaler.webhook import WebhookScaleTarget

TIMEOUT_S: Final = 10.0
"""Each call to a target; a pass makes at most two."""
MAX_ERROR_LENGTH: Final = 500


def kubernetes_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """An API client from ``kubeconfig``, or from the pod's service account without one.
    Raises ``ConfigException`` when neither is there."""
    if kubeconfig is not None:
        return k8s_config.new_client_from_config(config_file=str(kubeconfig))
    configuration = k8s.Configuration()
    k8s_config.load_incluster_config(client_configuration=configuration)
    return k8s.ApiClient(configuration)


@contextmanager
def open_target(
    kind: str,
    spec: Mapping[str, Any],
    *,
    kubeconfig: Path | None,
    timeout_s: float = TIMEOUT_S,
) -> Iterator[ScaleTarget]:
    """The target a stored row names (checked again here), closed on exit."""
    checked = check_target(kind, spec)
    if kind == "webhook":
        webhook = WebhookScaleTarget(checked["url"], timeout_s=timeout_s)
        try:
            yield webhook
        finally:
            webhook.close()
        return
    api_client = kubernetes_client(kubeconfig)
    try:
        yield KubernetesScaleTarget(
            api_client, checked["kind"], checked["namespace"], checked["name"], timeout_s=timeout_s
        )
    finally:
        api_client.close()


def describe_error(exc: BaseException) -> str:
    """One line for the row's ``last_error``: the status and the server's message, not the
    response headers and body the clients put in ``str()``."""
    if isinstance(exc, k8s.ApiException):
        text = f"Kubernetes API answered {exc.status} {exc.reason}"
        message = _status_message(exc.body)
        text = f"{text}: {message}" if message else text
    elif isinstance(exc, httpx.HTTPStatusError):
        text = f"webhook answered HTTP {exc.response.status_code}"
    elif isinstance(exc, httpx.HTTPError):
        text = f"webhook request failed: {type(exc).__name__}: {exc}"
    elif isinstance(exc, ConfigException):
        text = f"no Kubernetes configuration (set TUNELOOP_KUBECONFIG or run in a cluster): {exc}"
    elif isinstance(exc, SpecError):
        text = f"invalid target: {exc}"
    elif isinstance(exc, KeyError | ValueError | TypeError):
        # A webhook that answers 2xx but not {"replicas": n}.
        text = f"unexpected answer from the target: {type(exc).__name__}: {exc}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:MAX_ERROR_LENGTH]


def _status_message(body: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, if it is one."""
    try:
        status = json.loads(body) if isinstance(body, str | bytes) else None
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else ""
