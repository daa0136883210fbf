"""The evaluator over real stores (SQLite and PostgreSQL): samples in, states and queued
notifications out, including a restart in the middle."""

from __future__ import annotations

from datetime import timedelta

import pytest

from alerts import evaluator as evaluator_module
from alerts.evaluator import Evaluator, prune_history
from tests.alerts.conftest import Alerting, at
from tuneloop.storage.timeseries.types import SeriesKind

TEMP = "DCGM_FI_DEV_GPU_TEMP"
GPU0 = {"gpu": "0", "hostname": "n1"}
HOT = {
    "name": "GpuHot",
    "kind": "threshold",
    "query": {"metric": TEMP, "window": "1m"},
    "op": ">",
    "threshold": 85,
    "for": "2m",
    "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.hostname }} at {{ $value }}C"},
}


def test_threshold_goes_pending_firing_resolved_after_its_for(alerting: Alerting) -> None:
    alerting.rule(**HOT)
    alerting.receiver()
    alerting.write(TEMP, GPU0, [(0, 90.0)])
    alerting.evaluate(0)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1": "pending"}
    alerting.write(TEMP, GPU0, [(60, 91.0)])
    alerting.evaluate(60)
    alerting.evaluate(119)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1": "pending"}
    assert alerting.notifications() == []

    alerting.write(TEMP, GPU0, [(120, 92.0)])
    alerting.evaluate(120)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1": "firing"}
    fired = alerting.instance("GpuHot/gpu=0/hostname=n1")
    assert fired.annotations == {"summary": "GPU 0 on n1 at 92C"}
    assert fired.active_at == at(0) and fired.fired_at == at(120)
    alerting.evaluate(150)
    assert alerting.notifications() == [("hook", "firing", "GpuHot/gpu=0/hostname=n1")]

    alerting.write(TEMP, GPU0, [(180, 50.0)])
    alerting.evaluate(180)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1": "resolved"}
    alerting.evaluate(200)
    assert alerting.notifications() == [
        ("hook", "firing", "GpuHot/gpu=0/hostname=n1"),
        ("hook", "resolved", "GpuHot/gpu=0/hostname=n1"),
    ]
    assert alerting.instance("GpuHot/gpu=0/hostname=n1").resolved_at == at(180)


def test_pending_that_stops_holding_is_never_announced(alerting: Alerting) -> None:
    alerting.rule(**HOT)
    alerting.receiver()
    alerting.write(TEMP, GPU0, [(0, 90.0), (60, 70.0)])
    alerting.evaluate(0)
    alerting.evaluate(60)
    assert alerting.states() == {}
    # No data in the window is not a breach either.
    alerting.write(TEMP, GPU0, [(100, 99.0)])
    alerting.evaluate(100)
    alerting.evaluate(400)
    assert alerting.states() == {}
    assert alerting.notifications() == []


def test_rate_absent_and_regression_kinds(alerting: Alerting) -> None:
    alerting.receiver()
    alerting.rule(
        name="GpuEccErrors", kind="rate", op=">", threshold=0,
        query={"metric": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "window": "1m", "by": ["hostname"]},
    )  # fmt: skip
    alerting.rule(
        name="CollectorSilent", kind="absent",
        query={"metric": "DCGM_FI_DEV_GPU_UTIL", "window": "1m", "by": ["hostname"]},
    )  # fmt: skip
    alerting.rule(
        name="StepTimeRegression", kind="regression", op=">", threshold=1.2,
        query={"metric": "tuneloop_step_duration_seconds", "aggregation": "avg",
               "window": "2m", "baseline": "10m", "by": ["job"]},
    )  # fmt: skip
    counter = [(t, 3.0 if t < 255 else 5.0) for t in range(0, 301, 15)]
    alerting.write("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU0, counter, SeriesKind.COUNTER)
    for host, last in (("n1", 300), ("n2", 150)):
        alerting.write("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0", "hostname": host},
                       [(t, 50.0) for t in range(0, last + 1, 15)])  # fmt: skip
    for rank in ("0", "1"):
        steps = [(t, 1.0 if t < 600 else 1.5) for t in range(-600, 721, 10)]
        alerting.write("tuneloop_step_duration_seconds", {"job": "llama", "rank": rank}, steps)
        alerting.write("tuneloop_step_duration_seconds", {"job": "bert", "rank": rank},
                       [(t, 1.0) for t in range(-600, 721, 10)])  # fmt: skip

    alerting.evaluate(200)
    assert alerting.states() == {}
    alerting.evaluate(300)
    assert alerting.states() == {
        "GpuEccErrors/hostname=n1": "firing",
        "CollectorSilent/hostname=n2": "firing",
    }
    assert alerting.instance("GpuEccErrors/hostname=n1").value == pytest.approx(2 / 60)
    assert alerting.instance("CollectorSilent/hostname=n2").value == 150
    alerting.evaluate(720)
    states = alerting.states()
    assert states["StepTimeRegression/job=llama"] == "firing"
    assert "StepTimeRegression/job=bert" not in states
    assert alerting.instance("StepTimeRegression/job=llama").value == pytest.approx(1.5)
    assert states["GpuEccErrors/hostname=n1"] == "resolved"


def test_silences_and_inhibition_keep_alerts_from_receivers(alerting: Alerting) -> None:
    alerting.receiver()
    alerting.rule(**{**HOT, "for": "0s"})
    alerting.rule(
        name="GpuNodeDown", kind="absent", severity="critical",
        query={"metric": "DCGM_FI_DEV_GPU_UTIL", "window": "1m", "by": ["hostname"]},
    )  # fmt: skip
    alerting.inhibit(['alertname="GpuNodeDown"'], ['gpu=~".+"'], ["hostname"])
    # n1 is up and hot; n2 went silent, and its last temperature was hot too.
    alerting.write(
        "DCGM_FI_DEV_GPU_UTIL", {"hostname": "n1"}, [(t, 1.0) for t in range(0, 301, 30)]
    )
    alerting.write("DCGM_FI_DEV_GPU_UTIL", {"hostname": "n2"}, [(0, 1.0)])
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [(270, 95.0), (300, 95.0)])
    alerting.write(TEMP, {"gpu": "0", "hostname": "n2"}, [(270, 95.0), (300, 95.0)])
    silence = alerting.silence(['alertname="GpuHot"', 'hostname="n1"'], at(0), at(400))

    alerting.evaluate(300)
    assert alerting.states() == {
        "GpuHot/gpu=0/hostname=n1": "firing",
        "GpuHot/gpu=0/hostname=n2": "firing",
        "GpuNodeDown/hostname=n2": "firing",
    }
    assert alerting.instance("GpuHot/gpu=0/hostname=n1").muted_by == f"silence:{silence}"
    assert alerting.instance("GpuHot/gpu=0/hostname=n2").muted_by == "inhibited"
    assert alerting.notifications() == [("hook", "firing", "GpuNodeDown/hostname=n2")]

    # The silence ends while n1 is still hot: now on-call hears about it, once.
    alerting.write(TEMP, {"gpu": "0", "hostname": "n1"}, [(400, 95.0), (430, 95.0)])
    alerting.write("DCGM_FI_DEV_GPU_UTIL", {"hostname": "n1"}, [(400, 1.0), (430, 1.0)])
    alerting.evaluate(400)
    alerting.evaluate(430)
    assert alerting.notifications()[1:] == [("hook", "firing", "GpuHot/gpu=0/hostname=n1")]


def test_receivers_get_only_what_their_matchers_select(alerting: Alerting) -> None:
    alerting.receiver("pager", matchers=['severity="critical"'])
    alerting.receiver("all")
    alerting.rule(**{**HOT, "for": "0s"})
    alerting.rule(**{**HOT, "name": "GpuVeryHot", "for": "0s", "threshold": 94,
                     "severity": "critical"})  # fmt: skip
    alerting.write(TEMP, GPU0, [(0, 95.0)])
    alerting.evaluate(0)
    assert sorted(alerting.notifications()) == [
        ("all", "firing", "GpuHot/gpu=0/hostname=n1"),
        ("all", "firing", "GpuVeryHot/gpu=0/hostname=n1"),
        ("pager", "firing", "GpuVeryHot/gpu=0/hostname=n1"),
    ]


def test_a_restart_in_the_middle_neither_repeats_nor_drops(
    alerting: Alerting, monkeypatch: pytest.MonkeyPatch
) -> None:
    alerting.rule(**HOT)
    alerting.receiver()
    alerting.write(TEMP, GPU0, [(t, 95.0) for t in range(0, 181, 30)])
    alerting.evaluate(0, Evaluator(alerting.engine, alerting.sessions))

    # The process dies in the pass that makes the alert fire, after its states changed but
    # before its commit: nothing of that pass may remain.
    real_notify = evaluator_module._notify

    def crash(*args: object) -> int:
        real_notify(*args)  # type: ignore[arg-type]
        raise SystemExit("killed")

    monkeypatch.setattr(evaluator_module, "_notify", crash)
    with pytest.raises(SystemExit):
        Evaluator(alerting.engine, alerting.sessions).evaluate(at(120))
    monkeypatch.setattr(evaluator_module, "_notify", real_notify)
    assert alerting.states() == {"GpuHot/gpu=0/hostname=n1": "pending"}
    assert alerting.notifications() == []

    # A new process carries on: the alert fires once, however many passes follow.
    for seconds in (130, 150, 180):
        alerting.evaluate(seconds, Evaluator(alerting.engine, alerting.sessions))
    alerting.write(TEMP, GPU0, [(240, 40.0)])
    for seconds in (240, 250):
        alerting.evaluate(seconds, Evaluator(alerting.engine, alerting.sessions))
    assert alerting.notifications() == [
        ("hook", "firing", "GpuHot/gpu=0/hostname=n1"),
        ("hook", "resolved", "GpuHot/gpu=0/hostname=n1"),
    ]
    assert alerting.instance("GpuHot/gpu=0/hostname=n1").fired_at == at(130)


def test_history_older_than_its_keep_is_pruned(alerting: Alerting) -> None:
    alerting.rule(**{**HOT, "for": "0s"})
    alerting.receiver()
    alerting.write(TEMP, GPU0, [(0, 95.0), (60, 40.0)])
    alerting.evaluate(0)
    alerting.evaluate(60)
    assert len(alerting.notifications()) == 2
    assert prune_history(alerting.sessions, at(3600), timedelta(hours=2)) == 0
    # Notifications still pending are kept; the resolved alert goes, and its history with it.
    assert prune_history(alerting.sessions, at(3 * 3600), timedelta(hours=2)) == 1
    assert alerting.states() == {}
    assert alerting.notifications() == []
