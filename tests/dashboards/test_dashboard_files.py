"""The dashboard and provisioning files are what Grafana expects, match their generator, and
are where docker-compose mounts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dashboards import generate

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
PROVISIONING = DASHBOARDS / "provisioning"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
POSTGRES_DS = {"type": "grafana-postgresql-datasource", "uid": "${datasource}"}
PROMETHEUS_DS = {"type": "prometheus", "uid": "${datasource}"}

_DATASOURCE_REF = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"type": "string"}, "uid": {"type": "string"}},
}
_TARGET = {
    "type": "object",
    "required": ["refId", "datasource"],
    "properties": {
        "refId": {"type": "string", "pattern": "^[A-Z]$"},
        "rawSql": {"type": "string", "minLength": 1},
        "format": {"enum": ["time_series", "table"]},
        "rawQuery": {"const": True},
        "expr": {"type": "string", "minLength": 1},
        "datasource": _DATASOURCE_REF,
    },
    "oneOf": [
        {"required": ["rawSql", "format", "rawQuery"]},
        {"required": ["expr", "legendFormat"]},
    ],
}
# The part of Grafana's dashboard model (schemaVersion 39) that provisioning relies on.
DASHBOARD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "panels", "templating", "time", "annotations"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "editable": {"type": "boolean"},
        "time": {
            "type": "object",
            "required": ["from", "to"],
            "properties": {"from": {"type": "string"}, "to": {"type": "string"}},
        },
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {
                "list": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "type"],
                        "properties": {
                            "name": {"type": "string", "pattern": "^[a-zA-Z_]+$"},
                            "type": {
                                "enum": ["query", "custom", "constant", "interval", "datasource"]
                            },
                            "multi": {"type": "boolean"},
                            "includeAll": {"type": "boolean"},
                        },
                    },
                }
            },
        },
        "annotations": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": {"type": "object"}}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos", "datasource", "targets"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"enum": ["timeseries", "table", "stat", "barchart"]},
                    "title": {"type": "string", "minLength": 1},
                    "datasource": _DATASOURCE_REF,
                    "gridPos": {
                        "type": "object",
                        "required": ["x", "y", "w", "h"],
                        "properties": {
                            "x": {"type": "integer", "minimum": 0, "maximum": 23},
                            "y": {"type": "integer", "minimum": 0},
                            "w": {"type": "integer", "minimum": 1, "maximum": 24},
                            "h": {"type": "integer", "minimum": 1},
                        },
                    },
                    "targets": {"type": "array", "minItems": 1, "items": _TARGET},
                },
            },
        },
    },
}
DATASOURCES_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "datasources"],
    "properties": {
        "apiVersion": {"const": 1},
        "datasources": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "uid", "type", "access", "url"],
                "properties": {
                    "type": {"enum": ["grafana-postgresql-datasource", "prometheus"]},
                    "access": {"enum": ["proxy", "direct"]},
                },
            },
        },
    },
}
PROVIDERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "providers"],
    "properties": {
        "apiVersion": {"const": 1},
        "providers": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "type", "options"],
                "properties": {
                    "type": {"const": "file"},
                    "options": {
                        "type": "object",
                        "required": ["path"],
                        "properties": {"path": {"type": "string"}},
                    },
                },
            },
        },
    },
}

DASHBOARD_FILES = sorted(DASHBOARDS.glob("*.json"))


def test_the_five_dashboards_exist() -> None:
    assert {path.stem for path in DASHBOARD_FILES} == {
        "fleet",
        "fleet-prometheus",
        "job",
        "tuner",
        "alerts",
        "cost",
    }


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_is_valid(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    expected = PROMETHEUS_DS if path.stem == "fleet-prometheus" else POSTGRES_DS
    for panel in dashboard["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        assert panel["datasource"] == expected
        for target in panel["targets"]:
            assert target["datasource"] == expected
            assert ("expr" in target) == (expected is PROMETHEUS_DS)
    names = [variable["name"] for variable in dashboard["templating"]["list"]]
    assert len(names) == len(set(names))


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(path.read_text())["uid"] for path in DASHBOARD_FILES]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_checked_in_json_is_what_the_generator_builds(path: Path) -> None:
    assert path.read_text() == generate.render(path.stem), (
        f"{path.name} is stale: run `python -m dashboards.generate`"
    )


def test_provisioning_files_are_valid_and_point_at_the_dashboards() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources/tuneloop.yml").read_text())
    jsonschema.validate(datasources, DATASOURCES_SCHEMA)
    types = {source["type"] for source in datasources["datasources"]}
    assert {POSTGRES_DS["type"], PROMETHEUS_DS["type"]} <= types
    providers = yaml.safe_load((PROVISIONING / "dashboards/tuneloop.yml").read_text())
    jsonschema.validate(providers, PROVIDERS_SCHEMA)

    grafana = COMPOSE["services"]["grafana"]
    mounts = {}
    for volume in grafana["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (ROOT / source).resolve()
    assert mounts["/etc/grafana/provisioning/datasources"] == PROVISIONING / "datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == PROVISIONING / "dashboards"
    (provider,) = providers["providers"]
    folder = mounts[provider["options"]["path"]]
    assert sorted(folder.glob("*.json")) == DASHBOARD_FILES
