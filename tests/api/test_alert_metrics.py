"""What alert evaluation shows as metrics (SQLite and PostgreSQL): ``ALERTS`` on a project's
exposition as Prometheus has it, and the rule groups' evaluation on ``/metrics``, by name only
to tokens that see the project."""

from __future__ import annotations

import re
from datetime import timedelta
from uuid import uuid4

from fastapi.testclient import TestClient

from alerts import store
from alerts.evaluation_metrics import EVALUATION
from alerts.evaluator import Evaluator
from alerts.rules import parse_rule
from tests.api.conftest import Minter, bearer
from tuneloop.runtime import Runtime
from tuneloop.storage import session_scope
from tuneloop.storage.models import AlertRule, Project
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow

TEMP = "DCGM_FI_DEV_GPU_TEMP"


def rule(runtime: Runtime, project: str, **definition: object) -> None:
    with session_scope(runtime.sessions) as session:
        owner = session.query(Project).filter_by(name=project).one()
        store.create_rule(session, owner, parse_rule(definition))


def hot_gpus(runtime: Runtime, project_id: int) -> None:
    now = utcnow()
    batches = [
        SeriesBatch(TEMP, {"gpu": gpu, "Hostname": "n1"}, [now - timedelta(seconds=5)], [95.0])
        for gpu in ("0", "1")
    ]
    assert not SampleWriter(runtime.engine).write(project_id, batches).rejected


def test_alerts_series_shows_pending_and_firing_alerts(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    project_id = mint.project("vision")
    token = bearer(mint.token("vision"))
    hot_gpus(runtime, project_id)
    rule(runtime, "vision", name="GpuHot", kind="threshold", op=">", threshold=85,
         query={"metric": TEMP, "window": "1m", "match": ['gpu="0"']})  # fmt: skip
    rule(runtime, "vision", name="GpuHotLong", kind="threshold", op=">", threshold=85,
         query={"metric": TEMP, "window": "1m", "match": ['gpu="1"']},
         **{"for": "10m"})  # fmt: skip
    rule(runtime, "vision", name="GpuCold", kind="threshold", op="<", threshold=10,
         query={"metric": TEMP, "window": "1m"})  # fmt: skip
    Evaluator(runtime.engine, runtime.sessions).evaluate()

    text = client.get("/api/v1/projects/vision/metrics", headers=token).text
    assert "# TYPE ALERTS gauge" in text
    lines = sorted(line for line in text.splitlines() if line.startswith("ALERTS{"))
    assert [re.sub(r" \d+$", "", line) for line in lines] == [
        'ALERTS{Hostname="n1",alertname="GpuHot",alertstate="firing",gpu="0",'
        'severity="warning"} 1.0',
        'ALERTS{Hostname="n1",alertname="GpuHotLong",alertstate="pending",gpu="1",'
        'severity="warning"} 1.0',
    ]
    narrowed = client.get(
        "/api/v1/projects/vision/metrics",
        params={"metric": "ALERTS", "match": 'alertstate="firing"'},
        headers=token,
    )
    assert [line for line in narrowed.text.splitlines() if not line.startswith("#")] == [lines[0]]
    other = client.get(
        "/api/v1/projects/vision/metrics", params={"metric": TEMP}, headers=token
    ).text
    assert "ALERTS" not in other


def test_rule_group_metrics_show_by_name_only_to_who_sees_the_project(
    client: TestClient, runtime: Runtime, mint: Minter
) -> None:
    # The process's metrics outlive a test: a name of this run's own.
    name, other = f"metrics-{uuid4().hex[:8]}", f"other-{uuid4().hex[:8]}"
    project_id = mint.project(name)
    mint.project(other)
    hot_gpus(runtime, project_id)
    rule(runtime, name, name="GpuHot", kind="threshold", op=">", threshold=85,
         query={"metric": TEMP, "window": "1m"})  # fmt: skip
    rule(runtime, name, name="Broken", kind="threshold", op=">", threshold=85,
         query={"metric": TEMP, "window": "1m"})  # fmt: skip
    with session_scope(runtime.sessions) as session:
        broken = session.query(AlertRule).filter_by(name="Broken").one()
        broken.spec = {**broken.spec, "query": {"metric": TEMP, "window": "not a duration"}}
    before = utcnow().timestamp()
    result = Evaluator(runtime.engine, runtime.sessions, metrics=EVALUATION).evaluate()
    assert result.failed_rules == ["Broken"]

    named = client.get("/metrics", headers=bearer(mint.token(name))).text
    project = f'project="{name}"'
    assert f"tuneloop_alert_rule_group_duration_seconds_count{{{project}}} 1.0" in named
    assert f"tuneloop_alert_rule_group_evaluations_total{{{project}}} 1.0" in named
    assert f"tuneloop_alert_rule_group_rules{{{project}}} 2.0" in named
    assert f'tuneloop_alert_rule_evaluation_failures_total{{{project},rule="Broken"}} 1.0' in named
    last = re.search(
        rf"tuneloop_alert_rule_group_last_evaluation_timestamp_seconds\{{{project}\}} (\S+)",
        named,
    )
    assert last is not None and float(last.group(1)) >= before

    # Another project's token, and no token: the totals only.
    for headers in (bearer(mint.token(other)), {}):
        text = client.get("/metrics", headers=headers).text
        assert name not in text
        assert "Broken" not in text
        assert re.search(r"^tuneloop_alert_evaluations_total \d+", text, re.M)
        assert re.search(r"^tuneloop_alert_evaluation_failures_total [1-9]", text, re.M)
