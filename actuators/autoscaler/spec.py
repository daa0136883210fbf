"""An autoscaler's definition, checked: its target, its policy and its metric selectors, in
the JSON form the ``autoscalers`` table stores and the API takes.

Every check raises :class:`SpecError` (a ``ValueError``) with a message for the person who
wrote the definition. The reconcile pass checks stored rows again before acting on them, so a
row edited behind the API's back fails as an error on the row, not as a request to anywhere.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from actuators.autoscaler.policy import ScalePolicy, ScalePolicyError
from tuneloop.errors import InvalidInput
from tuneloop.promql import PromQLError, parse_instant
from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.types import Matcher
from tuneloop.strict import refuse_unknown_keys

TargetKind = Literal["kubernetes", "webhook"]
TARGET_KINDS: Final[tuple[TargetKind, ...]] = ("kubernetes", "webhook")
WORKLOAD_KINDS: Final = ("Deployment", "StatefulSet")

MAX_URL_LENGTH: Final = 2000
MAX_MATCHERS: Final = 32
MAX_METRIC_LENGTH: Final = 200

# Kubernetes object names: a namespace is a DNS-1123 label, a workload a DNS-1123 subdomain.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

_POLICY_FIELDS: Final = {field.name: field for field in dataclasses.fields(ScalePolicy)}
_INT_FIELDS: Final = frozenset({"min_replicas", "max_replicas", "scale_out_pods"})
_OPTIONAL_FIELDS: Final = frozenset({"p99_slo_s", "target_queue_per_replica"})


class SpecError(InvalidInput):
    pass


# --------------------------------------------------------------------------- targets


def check_target(kind: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The target of kind ``kind`` as stored; only the keys each kind knows are accepted, so
    nothing else (credentials, file paths) can ride along."""
    if kind == "kubernetes":
        return _kubernetes_target(spec)
    if kind == "webhook":
        return _webhook_target(spec)
    raise SpecError(f"unknown target kind {kind!r}: use one of {', '.join(TARGET_KINDS)}")


def _only_keys(what: str, spec: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    if not isinstance(spec, Mapping):
        raise SpecError(f"{what} must be an object with {', '.join(allowed)}")
    refuse_unknown_keys(
        spec,
        allowed,
        error=SpecError,
        where=what,
        message="{path} takes only {known}; unknown: {unknown_joined}",
    )
    missing = [key for key in allowed if key not in spec]
    if missing:
        raise SpecError(f"{what} needs {', '.join(missing)}")


def _kubernetes_target(spec: Mapping[str, Any]) -> dict[str, Any]:
    _only_keys("a kubernetes target", spec, ("kind", "namespace", "name"))
    kind, namespace, name = spec["kind"], spec["namespace"], spec["name"]
    if kind not in WORKLOAD_KINDS:
        raise SpecError(f"kubernetes target kind must be Deployment or StatefulSet, got {kind!r}")
    if not (
        isinstance(namespace, str) and len(namespace) <= 63 and _DNS_LABEL.fullmatch(namespace)
    ):
        raise SpecError(f"invalid namespace {namespace!r}: a DNS-1123 label (a-z, 0-9, '-')")
    if not (isinstance(name, str) and len(name) <= 253 and _DNS_SUBDOMAIN.fullmatch(name)):
        raise SpecError(f"invalid workload name {name!r}: a DNS-1123 subdomain")
    return {"kind": kind, "namespace": namespace, "name": name}


def _webhook_target(spec: Mapping[str, Any]) -> dict[str, Any]:
    _only_keys("a webhook target", spec, ("url",))
    url = spec["url"]
    if not isinstance(url, str) or len(url) > MAX_URL_LENGTH:
        raise SpecError(f"the webhook url must be a string of at most {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:
        raise SpecError(f"invalid webhook url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise SpecError(f"the webhook url must be http:// or https:// with a host, got {url!r}")
    if parts.username is not None or parts.password is not None:
        # The definition is readable by every member; a secret in it would not be one.
        raise SpecError("the webhook url must not carry credentials (user:password@)")
    if any(char.isspace() or ord(char) < 32 for char in url):
        raise SpecError("the webhook url must not contain spaces or control characters")
    return {"url": url}


# --------------------------------------------------------------------------- policy


def policy_from_dict(data: Mapping[str, Any]) -> ScalePolicy:
    """A :class:`ScalePolicy` from its fields; those left out take their defaults."""
    if not isinstance(data, Mapping):
        raise SpecError("the policy must be an object of ScalePolicy fields")
    refuse_unknown_keys(data, _POLICY_FIELDS, error=SpecError, noun="policy field(s)")
    missing = [name for name in ("min_replicas", "max_replicas") if name not in data]
    if missing:
        raise SpecError(f"the policy needs {' and '.join(missing)}")
    for name, value in data.items():
        _check_number(name, value)
    try:
        return ScalePolicy(**data)
    except ScalePolicyError as exc:
        raise SpecError(f"invalid policy: {exc}") from None


def _check_number(name: str, value: Any) -> None:
    if value is None and name in _OPTIONAL_FIELDS:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"policy field {name} must be a number, got {value!r}")
    if name in _INT_FIELDS and not isinstance(value, int):
        raise SpecError(f"policy field {name} must be a whole number, got {value!r}")
    if not math.isfinite(value):
        raise SpecError(f"policy field {name} must be finite, got {value!r}")


def policy_to_dict(policy: ScalePolicy) -> dict[str, Any]:
    return dataclasses.asdict(policy)


# --------------------------------------------------------------------------- selectors


def check_selector(what: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """A signal as stored: a series selector ``{"metric": name, "match": [PromQL matcher,
    ...]}``, or a PromQL expression ``{"expr": "..."}`` (checked by the engine)."""
    if isinstance(data, Mapping) and "expr" in data:
        return _check_expr(what, data)
    if not isinstance(data, Mapping) or "metric" not in data:
        raise SpecError(f"the {what} selector needs a metric name (or a PromQL expr)")
    refuse_unknown_keys(data, ("metric", "match"), error=SpecError, where=f"the {what} selector")
    metric, match = data["metric"], data.get("match", [])
    if not isinstance(metric, str) or not 0 < len(metric) <= MAX_METRIC_LENGTH:
        raise SpecError(f"the {what} metric must be a name of 1-{MAX_METRIC_LENGTH} characters")
    if not isinstance(match, list) or len(match) > MAX_MATCHERS:
        raise SpecError(f"the {what} match must be a list of at most {MAX_MATCHERS} matchers")
    for text in match:
        if not isinstance(text, str):
            raise SpecError(f'each {what} matcher must be a string such as job="serve"')
        try:
            parse_matcher(text)
        except ValueError as exc:
            raise SpecError(f"invalid {what} matcher: {exc}") from None
    return {"metric": metric, "match": list(match)}


def _check_expr(what: str, data: Mapping[str, Any]) -> dict[str, Any]:
    if set(data) != {"expr"}:
        others = ", ".join(sorted(str(key) for key in data if key != "expr"))
        raise SpecError(f"the {what} expr stands alone: it takes no {others}")
    text = data["expr"]
    if not isinstance(text, str):
        raise SpecError(f"the {what} expr must be a PromQL expression")
    try:
        parse_instant(text)
    except PromQLError as exc:
        raise SpecError(f"invalid {what} expr: {exc}") from None
    return {"expr": text}


def selector_parts(data: Mapping[str, Any]) -> tuple[str, tuple[Matcher, ...]]:
    """The metric name and parsed matchers of a stored selector."""
    checked = check_selector("stored", data)
    return checked["metric"], tuple(parse_matcher(text) for text in checked["match"])


def check_signals(
    policy: ScalePolicy, p99: Mapping[str, Any] | None, queue: Mapping[str, Any] | None
) -> None:
    """Each signal the policy scales on needs its selector, and each selector its target."""
    needs = {
        "p99": ("p99_slo_s", policy.p99_slo_s, p99),
        "queue": ("target_queue_per_replica", policy.target_queue_per_replica, queue),
    }
    for signal, (field, goal, selector) in needs.items():
        if goal is not None and selector is None:
            raise SpecError(f"the policy sets {field}: give the {signal} selector it is read from")
        if goal is None and selector is not None:
            raise SpecError(f"a {signal} selector needs the policy's {field}")
