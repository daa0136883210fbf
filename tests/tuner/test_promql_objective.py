"""A study objective written in PromQL: checked at creation, measured by the loop over the
store on SQLite and PostgreSQL (tests/timeseries_contract/test_readers.py runs the window
reading on a TSDB too)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import Engine

from tests.tuner import jobsim
from tests.tuner.test_loop import POLICY, RANKS, SPACE, Loop
from tuneloop.errors import InvalidInput
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter
from tuneloop.storage.types import utcnow
from tuner import service
from tuner.promql_objective import check_expr, expand
from tuner.study_options import StudyOptions

THROUGHPUT_EXPR = "sum(avg_over_time(tuneloop_samples_per_second{job=$job}[2s]))"


def make_loop(engine: Engine, expr: str, direction: str, job: str = "train") -> Loop:
    with session_scope(session_factory(engine)) as session:
        made = jobsim.make_job(session, name=job)
        study = service.create_study(
            session,
            made,
            name="s",
            objective="promql",
            direction=direction,
            space=SPACE,
            strategy="random",
            seed=3,
            options=StudyOptions(measurement=POLICY, ranks=RANKS, objective_expr=expr),
        )
        return Loop(engine, study.id, made.id, made.project_id, utcnow() - timedelta(hours=1))


def measure(loop: Loop, number: int, at: float) -> None:
    """Ask, acknowledge and apply trial ``number`` at ``at``."""
    assert loop.step(at).action == "asked"
    loop.ack(number, at=at)
    assert loop.step(at + 1).action == "applied"


def test_job_is_replaced_by_the_job_name_as_a_promql_string() -> None:
    assert expand("x{job=$job} + on() y{a=$job}", 'a"b\\c') == (
        'x{job="a\\"b\\\\c"} + on() y{a="a\\"b\\\\c"}'
    )


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("max(x{job=$job}", "parse error"),
        ("predict_linear(x{job=$job}[5m], 60)", "predict_linear() is not supported"),
        ("x{job=$job}[5m]", "must give an instant vector or a scalar"),
        ('"text"', "must give an instant vector or a scalar"),
        ("   ", "must be a non-empty PromQL expression"),
    ],
)
def test_a_bad_expression_is_refused_naming_the_field(expr: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=r"objective_expr.*") as raised:
        check_expr(expr)
    assert message in str(raised.value)


def test_a_promql_study_is_measured_on_its_expression(engine: Engine) -> None:
    loop = make_loop(engine, THROUGHPUT_EXPR, "maximize")
    for number, per_rank in ((1, 100.0), (2, 120.0)):
        base = 100.0 * number
        measure(loop, number, base)
        loop.steps(base, base + 31, per_rank=per_rank)
        assert loop.step(base + 31).detail == "complete"
    baseline, second = loop.trials()
    # Two ranks: the expression sums their throughputs.
    assert baseline.value == pytest.approx(200.0, rel=0.01)
    assert second.value == pytest.approx(240.0, rel=0.01)
    data = second.measurements["data"]
    assert data["window"]["metric"] == THROUGHPUT_EXPR
    assert data["inputs"] == {"value": second.value}
    assert data["stats"]["n"] >= POLICY.min_samples
    assert second.value is not None and 0 < second.measurements["stderr"] < 0.02 * second.value


def test_a_minimized_expression_of_the_job_s_own_counter(engine: Engine) -> None:
    # The job reports no step timings; its expression reads a counter of its own (and not the
    # one of a job whose name differs).
    loop = make_loop(
        engine,
        "sum(rate(tl_wait_seconds_total{job=$job}[5s])) / sum(rate(tl_steps_total{job=$job}[5s]))",
        "minimize",
        job='we"ird',
    )
    measure(loop, 1, 0)
    times = [loop.t0 + timedelta(seconds=s) for s in range(0, 32)]
    counter = SeriesKind.COUNTER
    batches = [
        SeriesBatch(
            "tl_wait_seconds_total", {"job": 'we"ird'}, times, [0.5 * s for s in range(32)], counter
        ),
        SeriesBatch(
            "tl_steps_total", {"job": 'we"ird'}, times, [10.0 * s for s in range(32)], counter
        ),
        SeriesBatch(
            "tl_steps_total", {"job": "weird"}, times, [99.0 * s for s in range(32)], counter
        ),
    ]
    assert not SampleWriter(engine).write(loop.project_id, batches).rejected
    assert loop.step(31).detail == "complete"
    [trial] = loop.trials()
    assert trial.value == pytest.approx(0.05)


def test_no_samples_of_the_expression_extend_then_fail_the_trial(engine: Engine) -> None:
    loop = make_loop(engine, "sum(rate(tl_nothing_total{job=$job}[5s]))", "maximize")
    measure(loop, 1, 0)
    loop.steps(0, 100, per_rank=100.0)
    results = [loop.step(at).detail for at in (30, 50, 70)]
    assert results[-1].startswith("failed"), results
    assert loop.trials()[0].value is None


def test_an_expression_the_series_make_fail_fails_the_trial_with_the_engine_s_reason(
    engine: Engine,
) -> None:
    # Two ranks on each side, one match key: many-to-many, which PromQL refuses.
    ranks = "rate(tuneloop_samples_per_second{job=$job}[5s])"
    expr = f"{ranks} + ignoring(rank) {ranks}"
    loop = make_loop(engine, expr, "maximize")
    measure(loop, 1, 0)
    loop.steps(0, 31, per_rank=100.0)
    failed = loop.step(31)
    assert failed.detail.startswith("failed: objective_expr: "), failed
    [trial] = loop.trials()
    assert trial.state == "failed" and trial.value is None


def test_values_carried_past_the_newest_sample_are_stale(engine: Engine) -> None:
    # A bare selector looks back 5 minutes: without the newest sample's time, samples that
    # stopped at t=10 would still look fresh at t=30.
    loop = make_loop(engine, "sum(tuneloop_samples_per_second{job=$job})", "maximize")
    measure(loop, 1, 0)
    loop.steps(0, 10, per_rank=100.0)
    assert loop.step(30).detail.startswith("stale")
    loop.steps(30, 70, per_rank=100.0)
    assert loop.step(50).detail == "complete"
    assert loop.trials()[0].value == pytest.approx(200.0, rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"direction": None}, "needs a direction"),
        ({"expr": None}, "needs objective_expr"),
        ({"objective": "throughput"}, "objective_expr is for the promql objective"),
        ({"expr": "rate(x{job=$job})"}, "objective_expr: "),
    ],
)
def test_a_promql_study_needs_its_expression_and_direction(
    engine: Engine, kwargs: dict[str, str | None], message: str
) -> None:
    settings: dict[str, str | None] = {
        "objective": "promql",
        "direction": "maximize",
        "expr": THROUGHPUT_EXPR,
        **kwargs,
    }
    with session_scope(session_factory(engine)) as session:
        job = jobsim.make_job(session)
        with pytest.raises(InvalidInput, match=message):
            service.create_study(
                session,
                job,
                name="s",
                objective=str(settings["objective"]),
                direction=settings["direction"],
                space=SPACE,
                strategy="random",
                options=StudyOptions(measurement=POLICY, objective_expr=settings["expr"]),
            )
