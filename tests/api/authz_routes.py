"""What the authorization matrix knows about the API's routes: how to list every operation of
the app, which path parameter takes which fixture value, the role each operation needs and a
request body that passes validation (so a refusal is the role check's, not a 422).

A route added later without an entry here makes ``tests/api/test_authorization_matrix.py``
fail: the matrix stays complete by construction.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

Role = Literal["agent", "member", "admin"]
RANK: Final[dict[Role, int]] = {"agent": 0, "member": 1, "admin": 2}

PROJECT = "/api/v1/projects/{project}"
JOB = f"{PROJECT}/jobs/{{job}}"
STUDY = f"{JOB}/studies/{{study}}"
ALERTS = f"{PROJECT}/alerts"

Operation = tuple[str, str]
"""``(method, path template)``, as the app declares it."""


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute, also inside the routers newer FastAPI versions keep nested in
    ``app.routes`` (``original_router``) instead of copying their routes."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        nested = getattr(route, "original_router", None)
        if nested is not None:
            yield from _api_routes(nested.routes)


def app_operations(app: FastAPI) -> set[Operation]:
    """Every (method, path) the app serves through FastAPI routes."""
    return {
        (method, route.path) for route in _api_routes(app.routes) for method in route.methods or ()
    }


def schema_operations(app: FastAPI) -> set[Operation]:
    """Every (method, path) of the OpenAPI schema: the cross-check that no route was missed."""
    return {
        (method.upper(), path)
        for path, item in app.openapi()["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }


SLOT = re.compile(r"([^/{}]+)/\{(\w+)\}")
"""A path parameter with the collection it indexes: ``jobs/{job}``, ``receivers/{name}``."""


def slots(path: str) -> list[str]:
    """The path's parameters as ``collection/{param}``: the same parameter name can index two
    collections (an autoscaler's ``name``, a receiver's ``name``)."""
    return [f"{collection}/{{{param}}}" for collection, param in SLOT.findall(path)]


PATH_SLOTS: Final[dict[str, str]] = {
    "projects/{project}": "the project",
    "jobs/{job}": "a job, by name and by id",
    "studies/{study}": "a study of the job",
    "trials/{number}": "a trial of the study",
    "autoscalers/{name}": "an autoscaler",
    "rules/{rule}": "an alert rule",
    "silences/{silence_id}": "a silence",
    "receivers/{name}": "an alert receiver",
    "inhibitions/{inhibition_id}": "an inhibit rule",
    "tokens/{token_id}": "a token of the project",
    "prices/{price_id}": "a price of the project",
}
"""Every path parameter the matrix can fill, and the object of beta's that fills it."""


NO_OBJECT_SLOTS: Final[dict[str, str]] = {
    "label/{name}": "a label name (Prometheus' label values): the route reads the token's project",
}
"""Path parameters that name no stored object: their routes are unscoped."""


def has_path_parameters(path: str) -> bool:
    """Whether the path names an object (of some project) by a parameter."""
    return any(slot not in NO_OBJECT_SLOTS for slot in slots(path)) or (
        "{" in path and not slots(path)
    )


# --------------------------------------------------------------------------- role table
# Derived from the checks the routes make (api/deps.py and tuneloop/accounts.py):
# - ``agent``: only the project dependency (``ProjectDep``/``JobDep``): any token of the project.
# - ``member``: ``require_member`` / ``_writer`` (``accounts.can_write_desired_config``),
#   ``accounts.can_manage_tokens``, or a member-or-admin role test on revocation.
# - ``admin``: ``require(token.role == "admin", ...)`` or ``can_create_token`` of a member token.

ROLE_NEEDED: Final[dict[Operation, Role]] = {
    ("GET", PROJECT): "agent",
    ("POST", f"{PROJECT}/tokens"): "admin",  # body asks for a member token: admins only
    ("GET", f"{PROJECT}/tokens"): "member",
    ("DELETE", "/api/v1/tokens/{token_id}"): "member",
    ("POST", f"{PROJECT}/jobs"): "agent",
    ("GET", f"{PROJECT}/jobs"): "agent",
    ("GET", JOB): "agent",
    ("PATCH", JOB): "agent",
    ("PUT", f"{JOB}/config"): "member",
    ("POST", f"{JOB}/config/observed"): "agent",
    ("GET", f"{JOB}/config"): "agent",
    ("GET", f"{JOB}/diagnosis"): "agent",
    ("POST", f"{JOB}/studies"): "member",
    ("POST", f"{JOB}/studies/from-diagnosis"): "member",
    ("GET", f"{JOB}/studies"): "agent",
    ("GET", STUDY): "agent",
    ("PATCH", STUDY): "member",
    ("DELETE", STUDY): "member",
    ("GET", f"{STUDY}/trials"): "agent",
    ("GET", f"{STUDY}/best"): "agent",
    ("POST", f"{STUDY}/ask"): "agent",
    ("POST", f"{STUDY}/trials/{{number}}/tell"): "agent",
    ("POST", f"{JOB}/agents"): "agent",
    ("GET", f"{JOB}/agents"): "agent",
    ("GET", f"{PROJECT}/gpus"): "agent",
    ("GET", f"{JOB}/config/next"): "agent",
    ("POST", f"{JOB}/config/ack"): "agent",
    ("GET", f"{JOB}/actuator"): "agent",
    ("PUT", f"{JOB}/actuator"): "member",
    ("POST", f"{JOB}/actuator/approve"): "member",
    ("GET", f"{JOB}/config/marks"): "agent",
    ("POST", f"{PROJECT}/autoscalers"): "admin",
    ("GET", f"{PROJECT}/autoscalers"): "agent",
    ("GET", f"{PROJECT}/autoscalers/{{name}}"): "agent",
    ("PUT", f"{PROJECT}/autoscalers/{{name}}"): "member",  # same target: members may
    ("DELETE", f"{PROJECT}/autoscalers/{{name}}"): "admin",
    ("GET", f"{PROJECT}/autoscalers/{{name}}/state"): "agent",
    ("GET", f"{PROJECT}/series"): "agent",
    ("GET", f"{PROJECT}/query_range"): "agent",
    ("GET", f"{PROJECT}/query/latest"): "agent",
    ("GET", f"{PROJECT}/histogram_quantile"): "agent",
    ("GET", f"{PROJECT}/cost"): "agent",
    ("GET", f"{PROJECT}/metrics"): "agent",
    ("POST", f"{ALERTS}/rules"): "member",
    ("GET", f"{ALERTS}/rules"): "agent",
    ("GET", f"{ALERTS}/rules/{{rule}}"): "agent",
    ("PUT", f"{ALERTS}/rules/{{rule}}"): "member",
    ("DELETE", f"{ALERTS}/rules/{{rule}}"): "member",
    ("POST", f"{ALERTS}/rules:load"): "member",
    ("GET", ALERTS): "agent",
    ("POST", f"{ALERTS}/silences"): "member",
    ("GET", f"{ALERTS}/silences"): "agent",
    ("DELETE", f"{ALERTS}/silences/{{silence_id}}"): "member",
    ("POST", f"{ALERTS}/receivers"): "admin",  # the server sends requests to its target
    ("GET", f"{ALERTS}/receivers"): "agent",
    ("DELETE", f"{ALERTS}/receivers/{{name}}"): "member",
    ("POST", f"{ALERTS}/inhibitions"): "member",
    ("GET", f"{ALERTS}/inhibitions"): "agent",
    ("DELETE", f"{ALERTS}/inhibitions/{{inhibition_id}}"): "member",
    ("GET", f"{ALERTS}/notifications"): "agent",
    ("POST", f"{PROJECT}/prices"): "member",
    ("GET", f"{PROJECT}/prices"): "agent",
    ("PUT", f"{PROJECT}/prices/{{price_id}}"): "member",
    ("DELETE", f"{PROJECT}/prices/{{price_id}}"): "member",
    ("PUT", "/api/v1/prices/{price_id}"): "admin",  # server-wide rows only
    ("DELETE", "/api/v1/prices/{price_id}"): "admin",  # server-wide rows only
}

WINDOW = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T01:00:00Z", "step": "60"}

QUERIES: Final[dict[Operation, dict[str, Any]]] = {
    ("GET", f"{PROJECT}/gpus"): {"uuid": "GPU-beta-0"},
    ("GET", f"{PROJECT}/query_range"): WINDOW,
    ("GET", f"{PROJECT}/histogram_quantile"): {**WINDOW, "metric": "latency", "q": 0.9},
    ("GET", f"{PROJECT}/cost"): {"start": WINDOW["start"], "end": WINDOW["end"]},
    ("GET", f"{JOB}/config/next"): {"timeout": 0},  # a long-poll: never wait here
}
"""Query parameters an operation requires, so an allowed caller gets its answer."""


def bodies(marker: str) -> dict[Operation, Any]:
    """A valid body of each operation that takes one (``marker``: text only beta's data has)."""
    rule = rule_body("BetaHot", marker)
    return {
        ("POST", f"{PROJECT}/tokens"): {"name": "extra", "role": "member"},
        ("POST", f"{PROJECT}/jobs"): {"name": "another"},
        ("PATCH", JOB): {"labels": {"team": "intruder"}},
        ("PUT", f"{JOB}/config"): {"config": {"batch_size": 16}},
        ("POST", f"{JOB}/config/observed"): {"config": {"batch_size": 16}},
        ("POST", f"{JOB}/studies"): study_body("another"),
        ("POST", f"{JOB}/studies/from-diagnosis"): {"window": "5m"},
        ("PATCH", STUDY): {"state": "stopped"},
        ("POST", f"{STUDY}/ask"): {},
        ("POST", f"{STUDY}/trials/{{number}}/tell"): {"state": "failed", "reason": "x"},
        ("POST", f"{JOB}/agents"): agent_body(),
        ("POST", f"{JOB}/config/ack"): {"agent_id": 1, "version": 1},
        ("PUT", f"{JOB}/actuator"): {"dry_run": True},
        ("POST", f"{JOB}/actuator/approve"): {"version": 1},
        ("POST", f"{PROJECT}/autoscalers"): autoscaler_body("another", marker),
        ("PUT", f"{PROJECT}/autoscalers/{{name}}"): autoscaler_spec(marker),
        ("POST", f"{ALERTS}/rules"): {**rule, "name": "Another"},
        ("PUT", f"{ALERTS}/rules/{{rule}}"): rule,
        ("POST", f"{ALERTS}/rules:load"): {"text": "rules: []\n", "source": "intruder"},
        ("POST", f"{ALERTS}/silences"): {"matchers": ['a="b"'], "duration": "1h"},
        ("POST", f"{ALERTS}/receivers"): receiver_body("another", marker),
        ("POST", f"{ALERTS}/inhibitions"): {"source": ['a="b"'], "target": ['c="d"']},
        ("POST", f"{PROJECT}/prices"): price_body(),
        ("PUT", f"{PROJECT}/prices/{{price_id}}"): price_body(),
        ("PUT", "/api/v1/prices/{price_id}"): price_body(),
    }


def price_body() -> dict[str, Any]:
    return {"model": "NVIDIA H100*", "capacity_type": "spot", "price_per_gpu_hour": "2.5",
            "currency": "USD"}  # fmt: skip


def rule_body(name: str, marker: str) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "threshold",
        "query": {"metric": "DCGM_FI_DEV_GPU_TEMP", "aggregation": "max", "window": "5m"},
        "op": ">",
        "threshold": 85,
        "for": "5m",
        "annotations": {"summary": marker},
    }


def study_body(name: str) -> dict[str, Any]:
    space = {"batch_size": [8, 64], "sync_period": [1, 2], "base_lr": 0.1, "base_batch": 32}
    return {"name": name, "space": space, "seed": 1, "driven_by": "agent", "strategy": "random"}


def agent_body() -> dict[str, Any]:
    return {
        "host": "beta-node",
        "world_size": 2,
        "ranks": [{"rank": r, "gpu_uuids": [f"GPU-beta-{r}"]} for r in range(2)],
        "config": {"batch_size": 32, "sync_period": 1},
    }


def autoscaler_spec(marker: str) -> dict[str, Any]:
    return {
        "target_kind": "kubernetes",
        "target": {"kind": "Deployment", "namespace": marker, "name": "llama"},
        "policy": {"min_replicas": 2, "max_replicas": 20, "p99_slo_s": 0.5},
        "p99": {"metric": "llm_request_latency_p99_seconds", "match": ['service="llama"']},
    }


def autoscaler_body(name: str, marker: str) -> dict[str, Any]:
    return {"name": name, **autoscaler_spec(marker)}


def receiver_body(name: str, marker: str) -> dict[str, Any]:
    # PagerDuty's address is fixed: nothing for the receiver-target guard to refuse.
    return {"name": name, "kind": "pagerduty", "config": {"routing_key": marker.ljust(32, "k")}}
