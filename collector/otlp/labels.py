"""OpenTelemetry attributes -> tuneloop labels.

* Resource attributes: ``service.name`` becomes ``job`` (``service.namespace/service.name``
  when a namespace is set, as Prometheus does), ``service.instance.id`` becomes ``instance``;
  ``telemetry.sdk.*`` (which SDK exported, identical on every series of a process) is dropped;
  every other resource attribute is kept under its sanitized name.
* Instrumentation scope: ``otel_scope_name`` and ``otel_scope_version`` when non-empty.
* Data point attributes: kept under their sanitized names; they win over the two above.

A name is sanitized as Prometheus does: every character outside ``[a-zA-Z0-9_]`` becomes ``_``,
a leading digit gets a ``key_`` prefix and a leading ``__`` (reserved) a ``key`` prefix.
Attributes of one set whose sanitized names collide are joined with ``;`` in key order.
Values of any ``AnyValue`` type are stringified (arrays and maps as compact JSON, bytes as
base64); an empty value is no label, as in Prometheus.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Final

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue

from collector.otlp.common import Rejected

MAX_LABEL_LENGTH: Final = 2_048
"""Longest label name or value accepted; a point with a longer one is rejected."""
MAX_LABELS: Final = 128
"""Most labels on one series (OpenTelemetry's default attribute count limit)."""
JOB_LABEL: Final = "job"
INSTANCE_LABEL: Final = "instance"

_INVALID_NAME_CHARS: Final = re.compile(r"[^a-zA-Z0-9_]")
_DROPPED_RESOURCE_PREFIXES: Final = ("telemetry.sdk.",)
_RESOURCE_RENAMES: Final = {"service.instance.id": INSTANCE_LABEL}
_CONSUMED: Final = frozenset({"service.name", "service.namespace", "service.instance.id"})


def format_float(value: float) -> str:
    """A float as label text, as Prometheus writes ``le`` and ``quantile`` values: ``1.0``,
    ``0.25``, ``1e+16``, ``+Inf``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def stringify(value: AnyValue) -> str:
    """The label text of an attribute value of any type."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind is None:
        return ""
    native = _native(value)
    if isinstance(native, str):
        return native
    if isinstance(native, bool):
        return "true" if native else "false"
    if isinstance(native, float):
        return format_float(native)
    if isinstance(native, int):
        return str(native)
    return json.dumps(native, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def _native(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_native(item) for item in value.array_value.values]
    if kind == "kvlist_value":
        return {item.key: _native(item.value) for item in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if kind is None:
        return None
    return getattr(value, kind)


@lru_cache(maxsize=4096)  # attribute keys repeat on every point of a request
def label_name(key: str) -> str:
    """The sanitized label name of attribute ``key`` (empty for an empty key)."""
    name = _INVALID_NAME_CHARS.sub("_", key)
    if name[:1].isdigit():
        return "key_" + name
    if name.startswith("__"):
        return "key" + name
    return name


def attribute_labels(attributes: Iterable[KeyValue]) -> dict[str, str]:
    """Labels of one attribute set (colliding names joined with ``;`` in key order)."""
    pairs = sorted((item.key, stringify(item.value)) for item in attributes if item.key)
    labels: dict[str, str] = {}
    for key, text in pairs:
        if not text:
            continue
        name = label_name(key)
        labels[name] = f"{labels[name]};{text}" if name in labels else text
    return labels


def resource_labels(attributes: Iterable[KeyValue]) -> dict[str, str]:
    """Labels every series of one resource carries (``job``, ``instance`` and the rest)."""
    items = list(attributes)
    found = {item.key: stringify(item.value) for item in items}
    kept = [
        item
        for item in items
        if item.key not in _CONSUMED and not item.key.startswith(_DROPPED_RESOURCE_PREFIXES)
    ]
    labels = attribute_labels(kept)
    name, namespace = found.get("service.name", ""), found.get("service.namespace", "")
    if name:
        labels[JOB_LABEL] = f"{namespace}/{name}" if namespace else name
    for key, label in _RESOURCE_RENAMES.items():
        if found.get(key):
            labels[label] = found[key]
    return labels


def scope_labels(scope: InstrumentationScope) -> dict[str, str]:
    labels = {}
    if scope.name:
        labels["otel_scope_name"] = scope.name
    if scope.version:
        labels["otel_scope_version"] = scope.version
    return labels


def check_labels(labels: Mapping[str, str]) -> None:
    """Raise :class:`Rejected` unless ``labels`` can be stored."""
    if len(labels) > MAX_LABELS:
        raise Rejected("too_many_labels", f"{len(labels)} labels, more than {MAX_LABELS}")
    for name, value in labels.items():
        if len(name) > MAX_LABEL_LENGTH or len(value) > MAX_LABEL_LENGTH:
            raise Rejected(
                "label_too_long",
                f"label {name[:64]!r} has a name or value longer than {MAX_LABEL_LENGTH} chars",
            )
        if "\x00" in name or "\x00" in value:
            raise Rejected("invalid_label", f"label {name[:64]!r} contains a NUL character")
