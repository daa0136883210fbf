"""Attributes -> labels: value stringification, name sanitizing, resource and scope labels."""

from __future__ import annotations

import pytest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
    KeyValueList,
)

from collector.otlp.common import Rejected
from collector.otlp.labels import (
    MAX_LABEL_LENGTH,
    attribute_labels,
    check_labels,
    format_float,
    label_name,
    resource_labels,
    scope_labels,
    stringify,
)
from tests.otlp.builders import attrs


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (AnyValue(string_value="a b"), "a b"),
        (AnyValue(bool_value=True), "true"),
        (AnyValue(bool_value=False), "false"),
        (AnyValue(int_value=-7), "-7"),
        (AnyValue(double_value=0.25), "0.25"),
        (AnyValue(double_value=3.0), "3.0"),
        (AnyValue(double_value=float("inf")), "+Inf"),
        (AnyValue(bytes_value=b"\x00\xff"), "AP8="),
        (
            AnyValue(
                array_value=ArrayValue(
                    values=[AnyValue(int_value=1), AnyValue(string_value="x"), AnyValue()]
                )
            ),
            '[1,"x",null]',
        ),
        (
            AnyValue(
                kvlist_value=KeyValueList(
                    values=[KeyValue(key="k", value=AnyValue(bool_value=True))]
                )
            ),
            '{"k":true}',
        ),
        (AnyValue(), ""),
    ],
)
def test_every_any_value_type_is_stringified(value: AnyValue, text: str) -> None:
    assert stringify(value) == text


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("gpu", "gpu"),
        ("k8s.pod.name", "k8s_pod_name"),
        ("http-method", "http_method"),
        ("0day", "key_0day"),
        ("__name__", "key__name__"),
        ("_private", "_private"),
        ("ünï", "_n_"),
    ],
)
def test_label_names_are_sanitized(key: str, name: str) -> None:
    assert label_name(key) == name


def test_colliding_names_join_values_in_key_order_and_empty_values_are_dropped() -> None:
    labels = attribute_labels(attrs({"a_b": "2", "a.b": "1", "empty": "", "c": 3}))
    assert labels == {"a_b": "1;2", "c": "3"}


def test_resource_labels_job_instance_and_the_rest() -> None:
    labels = resource_labels(
        attrs(
            {
                "service.name": "trainer",
                "service.namespace": "llm",
                "service.instance.id": "node-3:1",
                "telemetry.sdk.name": "opentelemetry",
                "telemetry.sdk.version": "1.45",
                "host.name": "node-3",
            }
        )
    )
    assert labels == {"job": "llm/trainer", "instance": "node-3:1", "host_name": "node-3"}
    assert resource_labels(attrs({"service.name": "x"})) == {"job": "x"}
    assert resource_labels([]) == {}


def test_scope_labels() -> None:
    assert scope_labels(InstrumentationScope(name="torch", version="2.5")) == {
        "otel_scope_name": "torch",
        "otel_scope_version": "2.5",
    }
    assert scope_labels(InstrumentationScope()) == {}


def test_label_limits() -> None:
    check_labels({"a": "x" * MAX_LABEL_LENGTH})
    for labels, reason in [
        ({"a": "x" * (MAX_LABEL_LENGTH + 1)}, "label_too_long"),
        ({"x" * (MAX_LABEL_LENGTH + 1): "a"}, "label_too_long"),
        ({f"l{i}": "v" for i in range(129)}, "too_many_labels"),
        ({"a": "nul\x00"}, "invalid_label"),
    ]:
        with pytest.raises(Rejected) as caught:
            check_labels(labels)
        assert caught.value.reason == reason


def test_format_float_as_prometheus_writes_le() -> None:
    assert [format_float(v) for v in (1.0, 0.25, 1e16, float("inf"), float("-inf"))] == [
        "1.0",
        "0.25",
        "1e+16",
        "+Inf",
        "-Inf",
    ]
