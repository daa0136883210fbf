"""An ``offered_load_p99`` study (``tuner.load_bands``): a trial is scored by its P99 at the
offered rate and belongs to that rate's band; the strategy learns from the current band's
trials only; the job goes back on a band's incumbent, without a trial, when the load moves to
another band or there is no headroom to explore with."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from sqlalchemy import Engine

from tests.tuner import jobsim
from tests.tuner.test_loop import POLICY, RANKS, Loop, make_loop
from tuneloop.job_configs import latest_config
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import Job, Study
from tuner import load_bands
from tuner.study_options import StudyOptions
from tuner.trial_guard import GUARD_REASON

SLO_S = 0.2
BOUNDS = [0.05, 0.2, 1.0, math.inf]
FAST = [100.0, 0.0, 0.0, 0.0]
"""Requests per second under 50 ms, under 200 ms, under 1 s, over: P99 about 50 ms."""
MEDIUM = [97.0, 3.0, 0.0, 0.0]
"""P99 150 ms: within the 200 ms SLO, under the 160 ms up to which there is headroom."""
BUSY = [95.0, 5.0, 0.0, 0.0]
"""P99 170 ms: within the SLO, but no headroom to explore with."""
SLOW = [80.0, 0.0, 20.0, 0.0]
"""A fifth over 200 ms: the P99 breaks the SLO."""


def _loop(engine: Engine) -> Loop:
    options = StudyOptions(measurement=POLICY, ranks=RANKS, slo_s=SLO_S)
    return make_loop(engine, objective="offered_load_p99", options=options)


def _serve(loop: Loop, start: float, end: float, *, offered: float, latency: list[float]) -> None:
    """``offered`` requests/s arriving and as many answered, with ``latency``'s histogram."""
    at = {"start": loop.t0 + timedelta(seconds=start), "end": loop.t0 + timedelta(seconds=end)}
    for metric in (load_bands.OFFERED_METRIC, load_bands.SERVED_METRIC):
        jobsim.write_counter(
            loop.engine, loop.project_id, "train", metric, per_second=offered, **at
        )
    jobsim.write_latency(
        loop.engine,
        loop.project_id,
        "train",
        bounds=BOUNDS,
        per_second=latency,
        **at,
    )


def _arrivals(loop: Loop, start: float, end: float, offered: float) -> None:
    at = {"start": loop.t0 + timedelta(seconds=start), "end": loop.t0 + timedelta(seconds=end)}
    jobsim.write_counter(
        loop.engine, loop.project_id, "train", load_bands.OFFERED_METRIC, per_second=offered, **at
    )


def _run_trial(
    loop: Loop, at: float, *, offered: float, latency: list[float], asked: bool = True
) -> str:
    if asked:
        result = loop.step(at)
        assert result.action == "asked", result
    version = _desired(loop)[0]
    loop.ack(version, at=at)
    assert loop.step(at + 1).action == "applied"
    loop.steps(at, at + 31, per_rank=50.0)
    _serve(loop, at, at + 31, offered=offered, latency=latency)
    return loop.step(at + 31).detail


def _desired(loop: Loop) -> tuple[int, dict[str, object]]:
    with session_scope(session_factory(loop.engine)) as session:
        job = session.get(Job, loop.job_id)
        assert job is not None
        row = latest_config(session, job, "desired")
        assert row is not None
        return row.version, dict(row.config)


def _band_numbers(loop: Loop, band: int) -> list[int]:
    with session_scope(session_factory(loop.engine)) as session:
        study = session.get(Study, loop.study_id)
        assert study is not None
        return [o.number for o in load_bands.band_history(session, study, band)]


def test_bands_are_factors_of_two_of_the_offered_rate() -> None:
    assert [load_bands.band_of(r) for r in (0.0, 0.5, 1.0, 20.0, 31.9, 32.0, 80.0)] == [
        0, 0, 0, 4, 4, 5, 6,
    ]  # fmt: skip
    assert load_bands.band_of(math.nan) == 0


def test_a_trial_is_scored_by_its_p99_at_the_offered_load_in_that_loads_band(
    engine: Engine,
) -> None:
    loop = _loop(engine)
    assert loop.step(-100).action == "asked"  # the pre-study config
    loop.ack(1, at=-100)
    assert loop.step(-99).action == "applied"
    loop.steps(-100, -69, per_rank=50.0)
    _serve(loop, -100, -69, offered=20.0, latency=MEDIUM)
    assert loop.step(-69).detail == "complete"
    [baseline] = loop.trials()
    inputs = baseline.measurements["data"]["inputs"]
    assert inputs["offered_rate"] == pytest.approx(20.0, rel=0.05)
    assert inputs["served_rate"] == pytest.approx(20.0, rel=0.05)
    # Minimized: the P99 in seconds (it keeps up), not the throughput per model call.
    assert baseline.value == pytest.approx(inputs["p99_latency_s"])
    assert inputs["p99_latency_s"] == pytest.approx(0.15, rel=0.05)
    assert load_bands.trial_band(baseline) == 4


def test_the_job_goes_back_on_each_bands_incumbent_when_the_load_moves(engine: Engine) -> None:
    loop = _loop(engine)
    start_config = _desired(loop)[1]
    _run_trial(loop, -100, offered=20.0, latency=MEDIUM)  # the pre-study config, band 4
    _arrivals(loop, -68, -1, 20.0)
    assert _run_trial(loop, 0, offered=20.0, latency=FAST) == "complete"
    better = loop.trials()[-1]
    assert better.measurements["context"]["load_band"] == 4
    assert better.value is not None and better.value < (loop.trials()[0].value or 0)

    # The load moves to 80/s: band 6 has measured nothing, so its incumbent is the pre-study
    # config; the job goes back on it without a trial.
    _arrivals(loop, 32, 45, 80.0)
    moved = loop.step(45)
    assert moved.action == "skip" and moved.detail.startswith("band 6: on its incumbent")
    version, config = _desired(loop)
    assert {k: config[k] for k in start_config} == start_config
    entry = next(e for e in loop.audit() if e.action == "study.band_incumbent")
    assert entry.details["band"] == 6 and entry.details["desired_version"] == version
    assert entry.details["why"] == "the offered load moved to another band"

    # The next trial is asked in band 6, learning from band 6's trials (none yet).
    assert _run_trial(loop, 46, offered=80.0, latency=FAST) == "complete"
    assert load_bands.trial_band(loop.trials()[-1]) == 6
    assert _band_numbers(loop, 4) == [1, 2] and _band_numbers(loop, 6) == [3]

    # Back to 20/s: band 4's incumbent is trial 2 (a lower P99 than the pre-study config's).
    _arrivals(loop, 78, 90, 20.0)
    back = loop.step(90)
    assert back.action == "skip" and back.detail.startswith("band 4: on its incumbent")
    config = _desired(loop)[1]
    assert {k: config[k] for k in start_config} == {k: better.params[k] for k in start_config}


def test_without_headroom_the_band_incumbent_runs_instead_of_the_last_trial(
    engine: Engine,
) -> None:
    loop = _loop(engine)
    start_config = _desired(loop)[1]
    _run_trial(loop, -100, offered=20.0, latency=FAST)  # the pre-study config: P99 50 ms
    _arrivals(loop, -68, -1, 20.0)
    assert _run_trial(loop, 0, offered=20.0, latency=MEDIUM) == "complete"  # P99 150 ms
    # The worse trial's config is still running and the P99 is over 0.8 x the SLO.
    _serve(loop, 32, 40, offered=20.0, latency=BUSY)
    held = loop.step(40)
    assert held.action == "skip" and held.detail.startswith("band 4: on its incumbent")
    config = _desired(loop)[1]
    assert {k: config[k] for k in start_config} == start_config
    # Still no headroom, and the job is already on the incumbent: it only waits.
    again = loop.step(41)
    assert again.action == "skip" and again.detail.startswith("no headroom to explore")


def test_a_guarded_trial_counts_in_the_band_it_broke_the_slo_in(engine: Engine) -> None:
    loop = _loop(engine)
    _run_trial(loop, -100, offered=20.0, latency=FAST)
    _arrivals(loop, -68, -1, 80.0)
    assert loop.step(0).action == "asked"
    version = _desired(loop)[0]
    loop.ack(version, at=0)
    assert loop.step(1).action == "applied"
    loop.steps(0, 8, per_rank=50.0)
    _serve(loop, 0, 8, offered=80.0, latency=SLOW)
    guarded = loop.step(8)
    assert guarded.detail.startswith(f"infeasible: {GUARD_REASON}")
    trial = loop.trials()[-1]
    assert trial.state == "infeasible"
    assert trial.measurements["data"]["guard"]["offered_rate"] == pytest.approx(80.0, rel=0.05)
    # An overload at 80/s excludes nothing at 20/s: band 4's strategy never sees it.
    assert _band_numbers(loop, 6) == [2] and _band_numbers(loop, 4) == [1]


def test_a_study_ends_on_the_best_config_of_the_band_the_load_is_in(engine: Engine) -> None:
    """The best trial overall ran at 80/s; the study ends at 20/s, where the pre-study config
    measured best: the job is put back on it, not on the 80/s winner."""
    options = StudyOptions(measurement=POLICY, ranks=RANKS, slo_s=SLO_S, max_trials=3)
    loop = make_loop(engine, objective="offered_load_p99", options=options)
    start_config = _desired(loop)[1]
    _run_trial(loop, -100, offered=20.0, latency=MEDIUM)  # the pre-study config, band 4
    _arrivals(loop, -68, -1, 20.0)
    assert _run_trial(loop, 0, offered=20.0, latency=BUSY) == "complete"  # worse, band 4
    _arrivals(loop, 32, 45, 80.0)
    assert loop.step(45).detail.startswith("band 6: on its incumbent")
    assert _run_trial(loop, 46, offered=80.0, latency=FAST) == "complete"  # best, band 6
    winner = loop.trials()[-1]
    assert load_bands.trial_band(winner) == 6

    _arrivals(loop, 78, 90, 20.0)
    ended = loop.step(90)
    assert ended.action == "completed", ended
    with session_scope(session_factory(loop.engine)) as session:
        study = session.get(Study, loop.study_id)
        assert study is not None
        assert study.state == "complete"
        assert "ended in load band 4" in (study.end_reason or "")
        assert "the pre-study config was the best measured" in (study.end_reason or "")
    config = _desired(loop)[1]
    assert {k: config[k] for k in start_config} == start_config
    assert {k: config[k] for k in start_config} != {k: winner.params[k] for k in start_config}


def test_a_rate_near_a_band_edge_keeps_the_band_of_the_last_trial() -> None:
    # Band 7 is 128-256/s; a quarter of a band past its edges (x 2**0.25) it is still band 7.
    assert load_bands.sticky_band(265.0, 7) == 7
    assert load_bands.sticky_band(110.0, 7) == 7
    assert load_bands.sticky_band(310.0, 7) == 8
    assert load_bands.sticky_band(100.0, 7) == 6
    assert load_bands.sticky_band(265.0, None) == 8
    assert load_bands.sticky_band(20.0, 7) == 4


def test_the_job_does_not_flap_between_two_bands_incumbents_on_an_edge(engine: Engine) -> None:
    """A trial measured at 250/s (band 7), then the rate read at 265/s (band 8 by itself): the
    job stays in band 7 and explores there, instead of going to band 8's incumbent and back at
    every pass. A trial still belongs to the band its window measured."""
    loop = _loop(engine)
    _run_trial(loop, -100, offered=250.0, latency=FAST)  # the pre-study config, band 7
    _arrivals(loop, -68, -1, 265.0)
    stayed = loop.step(0)
    assert stayed.action == "asked", stayed
    assert loop.trials()[-1].measurements["context"]["load_band"] == 7
    assert _run_trial(loop, 0, offered=265.0, latency=FAST, asked=False) == "complete"
    assert _band_numbers(loop, 7) == [1] and _band_numbers(loop, 8) == [2]

    _arrivals(loop, 32, 45, 230.0)  # near the edge again, now from band 8's side
    assert loop.step(45).action == "asked"
    assert loop.trials()[-1].measurements["context"]["load_band"] == 8
