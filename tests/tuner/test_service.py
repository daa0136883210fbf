"""Study persistence on SQLite and PostgreSQL: create, ask/tell, resume, errors."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from tuneloop.job_configs import propose
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import AuditEntry, Job, Project, Study
from tuner import service
from tuner.objectives import ObjectiveError
from tuner.space import SearchSpace
from tuner.strategies.base import REASON_OOM, config_key
from tuner.strategies.registry import UnknownStrategyError

SPACE = SearchSpace.training((8, 256), (1, 4), sync_powers_of_two=True, lr_scaling=None)
"""6 batch sizes x 3 sync periods: small enough for BO to be fast."""
LR_SPACE = SearchSpace.training((8, 256), base_lr=0.1, base_batch=64)


def _value(config: Mapping[str, Any]) -> float:
    """Synthetic throughput, best at batch 64 with no accumulation."""
    b, k = int(config["batch_size"]), int(config["sync_period"])
    return 1000.0 - abs(b - 64) - 10.0 * k


def _job(session: Session) -> Job:
    project = Project(name="p")
    session.add(project)
    session.flush()
    job = Job(project_id=project.id, name="train")
    session.add(job)
    session.flush()
    propose(session, job, {"batch_size": 64, "sync_period": 1}, source="agent")
    return job


def _study(session: Session, strategy: str = "random") -> Study:
    job = _job(session)
    return service.create_study(
        session,
        job,
        name="s",
        objective="throughput",
        space=SPACE,
        strategy=strategy,
        seed=7,
    )


def test_create_and_audit(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        study = _study(session)
        assert study.direction == "maximize"
        assert study.seed == 7
        assert service.study_space(study) == SPACE
        actions = session.scalars(select(AuditEntry.action)).all()
        assert actions == ["study.create"]


def test_ask_tell_loop_and_resume(engine: Engine, database_url: str) -> None:
    factory = session_factory(engine)
    with session_scope(factory) as session:
        study_id = _study(session, "bayesian").id
    proposed: list[dict[str, Any]] = []
    for _ in range(4):
        with session_scope(factory) as session:
            study = session.get_one(Study, study_id)
            trial = service.ask(session, study, context={"load": 0.5})
            proposed.append(dict(trial.params))
            service.tell(
                session,
                study,
                trial.number,
                state="complete",
                value=_value(trial.params),
                stderr=1.0,
                measurements={"n": 3},
            )
    # Resume on a brand-new engine: numbering continues and the strategy sees the history.
    other = make_engine(database_url)
    try:
        with session_scope(session_factory(other)) as session:
            study = session.get_one(Study, study_id)
            past = service.history(session, study)
            assert [o.number for o in past] == [1, 2, 3, 4]
            assert all(o.state == "complete" and o.stderr == 1.0 for o in past)
            assert past[0].context == {"load": 0.5}
            expected = service.study_strategy(study).ask(past)
            trial = service.ask(session, study)
            assert trial.number == 5
            assert trial.params == expected  # same seed + same history -> same proposal
            assert config_key(trial.params) not in {config_key(p) for p in proposed}
            top = service.best(session, study)
            assert top is not None
            assert top.value == max(_value(p) for p in proposed)
            actions = session.scalars(select(AuditEntry.action).order_by(AuditEntry.id)).all()
            assert actions.count("trial.ask") == 5 and actions.count("trial.tell") == 4
    finally:
        other.dispose()


def test_random_loop_and_minimize_best(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = _job(session)
        study = service.create_study(
            session, job, name="m", objective="step_time", space=SPACE, strategy="random", seed=1
        )
        assert study.direction == "minimize"
        values = []
        for _ in range(5):
            trial = service.ask(session, study)
            values.append(_value(trial.params))
            service.tell(session, study, trial.number, state="complete", value=values[-1])
        top = service.best(session, study)
        assert top is not None and top.value == min(values)
        assert [t.number for t in service.history(session, study)] == [1, 2, 3, 4, 5]


def test_infeasible_never_reproposed(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        study = _study(session, "bayesian")
        oom: list[dict[str, Any]] = []
        for _ in range(8):
            trial = service.ask(session, study)
            params = dict(trial.params)
            if any(config_key(params) == config_key(o) for o in oom):
                pytest.fail(f"infeasible config re-proposed: {params}")
            if int(params["batch_size"]) >= 128:  # pretend larger batches run out of memory
                oom.append(params)
                service.tell(session, study, trial.number, state="infeasible", reason=REASON_OOM)
            else:
                service.tell(session, study, trial.number, state="complete", value=_value(params))
        infeasible = [o for o in service.history(session, study) if o.state == "infeasible"]
        assert all(o.is_oom for o in infeasible)


def test_tell_is_idempotent_and_conflicts(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        study = _study(session)
        trial = service.ask(session, study)
        first = service.tell(
            session, study, 1, state="complete", value=5.0, measurements={"a": 1, "b": [1, 2]}
        )
        completed_at = first.completed_at
        again = service.tell(
            session, study, 1, state="complete", value=5.0, measurements={"a": 1, "b": (1, 2)}
        )
        assert again.id == trial.id and again.completed_at == completed_at
        tells = session.scalars(select(AuditEntry).where(AuditEntry.action == "trial.tell")).all()
        assert len(tells) == 1 and tells[0].details["measurements"] == {"a": 1, "b": [1, 2]}
        with pytest.raises(service.TrialConflictError):
            service.tell(session, study, 1, state="complete", value=6.0)
        with pytest.raises(service.TrialConflictError):
            service.tell(session, study, 1, state="failed", reason="noise")


def test_bad_input(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = _job(session)
        with pytest.raises(ObjectiveError, match="unknown objective"):
            service.create_study(
                session, job, name="x", objective="nope", space=SPACE, strategy="random"
            )
        with pytest.raises(UnknownStrategyError, match="unknown strategy"):
            service.create_study(
                session, job, name="x", objective="throughput", space=SPACE, strategy="nope"
            )
        study = service.create_study(
            session, job, name="x", objective="throughput", space=SPACE, strategy="random"
        )
        with pytest.raises(service.DuplicateStudyError, match="already has a study"):
            service.create_study(
                session, job, name="x", objective="throughput", space=SPACE, strategy="grid"
            )
        with pytest.raises(service.UnknownTrialError):
            service.tell(session, study, 99, state="complete", value=1.0)
        service.ask(session, study)
        with pytest.raises(service.StudyError, match="finite value"):
            service.tell(session, study, 1, state="complete")
        with pytest.raises(service.StudyError, match="finite number"):
            service.tell(session, study, 1, state="complete", value=float("nan"))
        with pytest.raises(service.StudyError, match="needs a reason"):
            service.tell(session, study, 1, state="infeasible")
        with pytest.raises(service.StudyError, match="plain JSON"):
            service.tell(session, study, 1, state="complete", value=1.0, measurements={"x": {1j}})
        with pytest.raises(service.StudyError, match="finished state"):
            service.tell(session, study, 1, state="running")
        # The caller's transaction is still usable after the errors above.
        assert len(service.history(session, study)) == 1


def test_learning_rate_travels_with_params(engine: Engine) -> None:
    with session_scope(session_factory(engine)) as session:
        job = _job(session)
        study = service.create_study(
            session,
            job,
            name="lr",
            objective="throughput",
            space=LR_SPACE,
            strategy="random",
            seed=3,
        )
        trial = service.ask(session, study, ranks=2)
        assert trial.params["learning_rate"] == pytest.approx(
            0.1 * trial.params["batch_size"] * 2 / 64
        )
        (obs,) = service.history(session, study)
        assert "learning_rate" not in obs.config


def test_concurrent_asks_get_distinct_numbers(engine: Engine) -> None:
    factory = session_factory(engine)
    with session_scope(factory) as session:
        study_id = _study(session).id
    barrier = threading.Barrier(4)

    def worker() -> int:
        barrier.wait()
        with session_scope(factory) as session:
            study = session.get_one(Study, study_id)
            return service.ask(session, study).number

    with ThreadPoolExecutor(4) as pool:
        numbers = sorted(pool.map(lambda _: worker(), range(4)))
    assert numbers == [1, 2, 3, 4]
    with session_scope(factory) as session:
        past = service.history(session, session.get_one(Study, study_id))
        # Each ask saw the others' trials, so no configuration was proposed twice.
        assert len({config_key(o.config) for o in past}) == 4
