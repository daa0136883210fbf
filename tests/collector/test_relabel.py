"""Relabel rules, table-driven against Prometheus's documented semantics."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from collector.relabel import RelabelConfigError, Relabeler, load_rules, parse_rules, relabel
from tuneloop.storage.timeseries.types import SeriesBatch

ROOT = Path(__file__).resolve().parents[2]

T0 = datetime(2026, 11, 22, tzinfo=UTC)
GPU = {"gpu": "0", "host": "node-7.example", "job": "train"}

# (rules, metric, labels, expected labels with __name__, or None when dropped)
CASES: list[tuple[str, list[dict[str, Any]], str, dict[str, str], dict[str, str] | None]] = [
    ("no rules", [], "util", GPU, {"__name__": "util", **GPU}),
    (
        "replace with defaults copies a label",
        [{"source_labels": ["host"], "target_label": "node"}],
        "util",
        GPU,
        {"__name__": "util", **GPU, "node": "node-7.example"},
    ),
    (
        "replace with groups, anchored regex",
        [
            {
                "source_labels": ["host"],
                "regex": r"([^.]+)\.(.*)",
                "target_label": "short",
                "replacement": "${1}_in_$2",
            }
        ],
        "util",
        GPU,
        {"__name__": "util", **GPU, "short": "node-7_in_example"},
    ),
    (
        "replace does nothing when the anchored regex does not match",
        [{"source_labels": ["host"], "regex": "node", "target_label": "x", "replacement": "y"}],
        "util",
        GPU,
        {"__name__": "util", **GPU},
    ),
    (
        "replace joins source labels with the separator; a missing one is empty",
        [
            {
                "source_labels": ["job", "missing", "gpu"],
                "separator": "/",
                "target_label": "path",
            }
        ],
        "util",
        GPU,
        {"__name__": "util", **GPU, "path": "train//0"},
    ),
    (
        "replace to an empty value removes the label",
        [{"source_labels": ["nothing"], "target_label": "job"}],
        "util",
        GPU,
        {"__name__": "util", "gpu": "0", "host": "node-7.example"},
    ),
    (
        "replace renames the metric through __name__",
        [
            {
                "source_labels": ["__name__"],
                "regex": "DCGM_FI_DEV_(.*)",
                "target_label": "__name__",
                "replacement": "gpu_$1",
            }
        ],
        "DCGM_FI_DEV_GPU_UTIL",
        GPU,
        {"__name__": "gpu_GPU_UTIL", **GPU},
    ),
    (
        "Go expansion: $1x is the (missing) group named 1x, $$ is a dollar",
        [{"source_labels": ["gpu"], "target_label": "a", "replacement": "$1x-$$-${1}x"}],
        "util",
        GPU,
        {"__name__": "util", **GPU, "a": "-$-0x"},
    ),
    (
        "named groups",
        [
            {
                "source_labels": ["host"],
                "regex": r"(?P<name>[a-z]+)-(?P<num>\d+)\..*",
                "target_label": "n",
                "replacement": "$num:${name}",
            }
        ],
        "util",
        GPU,
        {"__name__": "util", **GPU, "n": "7:node"},
    ),
    (
        "a templated target label",
        [
            {
                "source_labels": ["job"],
                "regex": "(.*)",
                "target_label": "role_$1",
                "replacement": "1",
            }
        ],
        "util",
        GPU,
        {"__name__": "util", **GPU, "role_train": "1"},
    ),
    (
        "keep keeps a match",
        [{"action": "keep", "source_labels": ["__name__"], "regex": "util|temp"}],
        "util",
        GPU,
        {"__name__": "util", **GPU},
    ),
    (
        "keep drops a non-match (anchored: utilization is not util)",
        [{"action": "keep", "source_labels": ["__name__"], "regex": "util"}],
        "utilization",
        GPU,
        None,
    ),
    (
        "drop drops a match",
        [{"action": "drop", "source_labels": ["job", "gpu"], "regex": "train;0"}],
        "util",
        GPU,
        None,
    ),
    (
        "drop keeps a non-match",
        [{"action": "drop", "source_labels": ["job"], "regex": "infer"}],
        "util",
        GPU,
        {"__name__": "util", **GPU},
    ),
    (
        "labeldrop removes matching label names",
        [{"action": "labeldrop", "regex": "host|job"}],
        "util",
        GPU,
        {"__name__": "util", "gpu": "0"},
    ),
    (
        "labelkeep removes the other label names (__name__ must be kept explicitly)",
        [{"action": "labelkeep", "regex": "__name__|gpu"}],
        "util",
        GPU,
        {"__name__": "util", "gpu": "0"},
    ),
    (
        "labelmap copies matching labels under new names",
        [{"action": "labelmap", "regex": "(gpu|job)", "replacement": "k8s_$1"}],
        "util",
        GPU,
        {"__name__": "util", **GPU, "k8s_gpu": "0", "k8s_job": "train"},
    ),
    (
        "temporary __ labels pass values between rules and vanish at the end",
        [
            {"source_labels": ["host"], "regex": "([^.]+).*", "target_label": "__tmp_node"},
            {"source_labels": ["__tmp_node", "gpu"], "target_label": "device"},
        ],
        "util",
        GPU,
        {"__name__": "util", **GPU, "device": "node-7;0"},
    ),
]


@pytest.mark.parametrize(
    ("rules", "metric", "labels", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_rule(
    rules: list[dict[str, Any]],
    metric: str,
    labels: dict[str, str],
    expected: dict[str, str] | None,
) -> None:
    assert relabel(parse_rules(rules), metric, labels) == expected


BAD_CONFIGS: list[tuple[Any, str]] = [
    ([{"action": "hashmod"}], "action must be one of"),
    ([{"action": "replace"}], "replace needs target_label"),
    ([{"target_label": "bad-name"}], "is not a label name"),
    ([{"source_labels": "host", "target_label": "x"}], "source_labels must be a list"),
    ([{"source_labels": ["bad name"], "target_label": "x"}], "source_labels must be a list"),
    ([{"action": "labeldrop", "regex": "x", "source_labels": ["a"]}], "takes only regex"),
    ([{"action": "keep", "regex": "x", "target_label": "a"}], "does not take target_label"),
    ([{"action": "drop", "regex": "x", "replacement": "a"}], "does not take replacement"),
    ([{"regexp": "x"}], "unknown field 'regexp'"),
    ([{"target_label": "x", "regex": "("}], "invalid regex"),
    ([{"target_label": "x", "separator": 1}], "separator must be a string"),
    (["keep"], "expected a mapping"),
    ({"rules": []}, "unknown top-level key"),
    ("nope", "expected a list of rules"),
    # What RE2 (and so Prometheus) does not have.
    ([{"action": "keep", "regex": r"(a)\1"}], "backreferences"),
    ([{"action": "keep", "regex": "(?=a)a"}], "lookaround"),
    ([{"action": "keep", "regex": "a" * 1001}], "longer than 1000"),
]


@pytest.mark.parametrize(("config", "message"), BAD_CONFIGS)
def test_bad_configs_are_refused_with_one_line(config: Any, message: str) -> None:
    with pytest.raises(RelabelConfigError) as excinfo:
        parse_rules(config)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_the_error_names_the_file_and_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("- action: keep\n  regex: util\n- action: keep\n  regex: '(?=a)a'\n")
    with pytest.raises(RelabelConfigError, match=rf"{path}: rule 2: invalid regex '\(\?=a\)a'"):
        load_rules(path)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(RelabelConfigError, match="cannot read it"):
        load_rules(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- action: keep\n  regex: [unclosed\n")
    with pytest.raises(RelabelConfigError, match="not valid YAML/JSON at line"):
        load_rules(bad)


def test_yaml_and_json_files_and_both_shapes(tmp_path: Path) -> None:
    rules = [{"action": "drop", "source_labels": ["__name__"], "regex": "go_.*"}]
    (tmp_path / "a.json").write_text(json.dumps(rules))
    (tmp_path / "b.yaml").write_text(
        "relabel_configs:\n"
        + "".join(["  - action: drop\n", "    source_labels: [__name__]\n", "    regex: go_.*\n"])
    )
    (tmp_path / "empty.yaml").write_text("")
    assert load_rules(tmp_path / "a.json") == load_rules(tmp_path / "b.yaml")
    assert len(load_rules(tmp_path / "a.json")) == 1
    assert load_rules(tmp_path / "empty.yaml") == []


def test_relabeler_on_batches() -> None:
    relabeler = Relabeler(
        parse_rules(
            [
                {"action": "drop", "source_labels": ["__name__"], "regex": "go_.*"},
                {"action": "labeldrop", "regex": "pid"},
            ]
        )
    )
    batches = [
        SeriesBatch("go_gc", {"pid": "1"}, [T0, T0], [1.0, 2.0]),
        SeriesBatch("util", {"pid": "1", "gpu": "0"}, [T0], [3.0]),
        SeriesBatch(7, {}, [T0], [1.0]),  # type: ignore[arg-type]  # left for the store
    ]
    kept, dropped = relabeler.apply(batches)
    assert dropped == 2
    assert [(b.metric, dict(b.labels), list(b.values)) for b in kept] == [
        ("util", {"gpu": "0"}, [3.0]),
        (7, {}, [1.0]),
    ]
    assert batches[1].labels == {"pid": "1", "gpu": "0"}  # input untouched


def test_no_rules_is_a_pass_through() -> None:
    batches = [SeriesBatch("util", {"gpu": "0"}, [T0], [1.0])]
    kept, dropped = Relabeler().apply(batches)
    assert kept[0] is batches[0] and dropped == 0
    assert not Relabeler()


def test_the_documented_vocabulary_relabel() -> None:
    rules = load_rules(ROOT / "docs/examples/relabel-vocabulary.yml")
    other_names = {
        "gpu": "0",
        "node": "gpu-node-9",
        "exported_pod": "vllm-llama3-70b-6d8f9c7b54-x2kqp",
        "exported_namespace": "inference",
        "pod": "dcgm-exporter-x7f2k",
    }
    assert relabel(rules, "DCGM_FI_DEV_GPU_UTIL", other_names) == {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "gpu": "0",
        "Hostname": "gpu-node-9",
        "pod": "vllm-llama3-70b-6d8f9c7b54-x2kqp",
        "namespace": "inference",
        "job": "vllm-llama3-70b",
    }
    # The vocabulary's own labels are left as they are.
    ours = {"gpu": "1", "Hostname": "n1", "pod": "train-0", "job": "llama"}
    assert relabel(rules, "DCGM_FI_DEV_GPU_UTIL", ours) == {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        **ours,
    }
