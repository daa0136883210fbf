"""Alert rules read series through the contract: the same rules fire on a real
VictoriaMetrics and a real Prometheus as on the built-in store (tests/alerts)."""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from alerts import store
from alerts.evaluator import Evaluator
from alerts.rules import RuleError, parse_rule
from tests.peers import flush_victoria_metrics
from tests.timeseries_contract.conftest import T0
from tuneloop import accounts
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import AlertInstance, Project, metadata
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

RULES = [
    {"name": "GpuHot", "kind": "threshold", "op": ">", "threshold": 85,
     "query": {"metric": "tl_gpu_temp", "window": "1m"}},
    {"name": "EccErrors", "kind": "rate", "op": ">", "threshold": 0,
     "query": {"metric": "tl_ecc_errors_total", "window": "1m", "by": ["hostname"]}},
    {"name": "CollectorSilent", "kind": "absent",
     "query": {"metric": "tl_gpu_util", "window": "1m", "by": ["hostname"]}},
]  # fmt: skip


@pytest.mark.parametrize("tsdb", ["victoriametrics", "prometheus"])
def test_rules_fire_on_series_in_a_tsdb(
    tsdb: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url: str = request.getfixturevalue(
        "victoria_metrics_url" if tsdb == "victoriametrics" else "prometheus_url"
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'tuneloop.db'}")
    metadata.create_all(engine)
    sessions = session_factory(engine)
    with session_scope(sessions) as session:
        project_id = accounts.create_project(session, "alpha").id
    # The TSDB is shared: this test's series go under a project id no other test uses.
    series = PrometheusBackend(url, project_label=f"p{random.randrange(10**9)}")
    times = [T0 + timedelta(seconds=s) for s in range(0, 300, 15)]
    host = {"hostname": "n1"}
    result = series.write(
        project_id,
        [
            SeriesBatch("tl_gpu_temp", {"gpu": "0", **host}, times, [90.0] * len(times)),
            SeriesBatch("tl_gpu_temp", {"gpu": "1", **host}, times, [60.0] * len(times)),
            SeriesBatch(
                "tl_ecc_errors_total",
                host,
                times,
                [float(i) for i in range(len(times))],
                SeriesKind.COUNTER,
            ),
            # Silent since T0 + 60 s.
            SeriesBatch("tl_gpu_util", {"hostname": "n2"}, times[:5], [50.0] * 5),
        ],
    )
    assert not result.rejected
    if tsdb == "victoriametrics":
        flush_victoria_metrics(url)
    # Rules are checked against the metrics in the TSDB (these exist nowhere else).
    with session_scope(sessions) as session:
        project = accounts.get_project_by_name(session, "alpha")
        assert project is not None
        for rule in RULES:
            store.create_rule(session, project, parse_rule(rule), series=series)
        unknown = {**RULES[0], "name": "Unknown", "query": {"metric": "tl_nowhere"}}
        with pytest.raises(RuleError, match="unknown metric"):
            store.create_rule(session, project, parse_rule(unknown), series=series)
    try:
        outcome = Evaluator(engine, sessions, series=series).evaluate(T0 + timedelta(seconds=290))
    finally:
        series.close()
    assert not outcome.failed_rules
    with sessions() as session:
        firing = sorted(
            (row.labels["alertname"], row.labels.get("gpu") or row.labels.get("hostname"))
            for row in session.scalars(select(AlertInstance))
        )
        assert session.scalars(select(Project.id)).all() == [project_id]
    assert firing == [("CollectorSilent", "n2"), ("EccErrors", "n1"), ("GpuHot", "0")]
    engine.dispose()


@pytest.mark.parametrize("tsdb", ["victoriametrics", "prometheus"])
def test_a_promql_rule_fires_and_resolves_on_a_tsdb(
    tsdb: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url: str = request.getfixturevalue(
        "victoria_metrics_url" if tsdb == "victoriametrics" else "prometheus_url"
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'tuneloop.db'}")
    metadata.create_all(engine)
    sessions = session_factory(engine)
    with session_scope(sessions) as session:
        alpha = accounts.create_project(session, "alpha")
        beta = accounts.create_project(session, "beta")
        project_id, other_id = alpha.id, beta.id
    series = PrometheusBackend(url, project_label=f"p{random.randrange(10**9)}")
    times = [T0 + timedelta(seconds=s) for s in range(0, 300, 15)]
    hot_then_cool = [95.0] * 8 + [40.0] * 12  # over 85 until T0 + 105 s
    for project, values in ((project_id, hot_then_cool), (other_id, [99.0] * len(times))):
        batches = [SeriesBatch("tl_gpu_temp", {"gpu": "0", "hostname": "n1"}, times, values)]
        assert not series.write(project, batches).rejected
    if tsdb == "victoriametrics":
        flush_victoria_metrics(url)
    rule = {
        "name": "GpuHot",
        "kind": "promql",
        "expr": "max by (gpu, hostname) (max_over_time(tl_gpu_temp[1m])) > 85",
    }
    with session_scope(sessions) as session:
        project = accounts.get_project_by_name(session, "alpha")
        assert project is not None
        store.create_rule(session, project, parse_rule(rule), series=series)
    evaluator = Evaluator(engine, sessions, series=series)

    def states() -> list[tuple[str, str, float | None]]:
        with sessions() as session:
            return [
                (row.labels.get("gpu", ""), row.state, row.value)
                for row in session.scalars(select(AlertInstance))
            ]

    try:
        assert not evaluator.evaluate(T0 + timedelta(seconds=90)).failed_rules
        assert states() == [("0", "firing", 95.0)]
        # Only project alpha's series: beta's stay at 99 and never reach alpha's rule.
        assert not evaluator.evaluate(T0 + timedelta(seconds=200)).failed_rules
        assert [state for _, state, _ in states()] == ["resolved"]
    finally:
        series.close()
    engine.dispose()
