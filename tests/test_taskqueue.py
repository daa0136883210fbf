"""The task queue: the in-process runner, and a real Celery worker on the real Redis."""

from __future__ import annotations

import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery.contrib.testing.worker import start_worker
from sqlalchemy import Table, func, insert, select
from typer.testing import CliRunner

from tuneloop.cli import _register_commands, app
from tuneloop.settings import Settings, configure, load_settings
from tuneloop.storage import make_engine, migrate, session_factory, session_scope
from tuneloop.storage.models import Project, Series, samples, samples_1m
from tuneloop.storage.types import utcnow
from tuneloop.taskqueue import PeriodicTask, maintenance, periodic_tasks
from tuneloop.taskqueue.celery_app import beat_schedule, create_app
from tuneloop.taskqueue.inprocess import InProcessRunner


@pytest.fixture(autouse=True)
def _restore_settings() -> Iterator[None]:
    yield
    maintenance.close_task_runtime()
    configure(load_settings())


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


# --------------------------------------------------------------------------- in-process runner


def test_runner_runs_each_task_at_its_interval_and_survives_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = time.monotonic()
    runs: list[float] = []
    failures: list[float] = []

    def count() -> None:
        runs.append(time.monotonic() - started)

    def boom() -> None:
        failures.append(time.monotonic() - started)
        raise RuntimeError("disk on fire")

    tasks = [PeriodicTask("count", count, 0.1), PeriodicTask("boom", boom, 0.1)]
    with caplog.at_level(logging.ERROR), InProcessRunner(tasks) as runner:
        assert wait_for(lambda: len(runs) >= 4 and len(failures) >= 4)
    assert runner._thread is not None and not runner._thread.is_alive()

    assert runs[0] >= 0.09, "the first run comes one interval after start, as in beat"
    gaps = [later - earlier for earlier, later in itertools.pairwise(runs)]
    assert all(gap >= 0.05 for gap in gaps), gaps
    failed_logs = [r for r in caplog.records if "periodic task boom failed" in r.getMessage()]
    assert len(failed_logs) == len(failures)
    assert failed_logs[0].exc_info is not None


def test_runner_stops_promptly_between_ticks() -> None:
    runner = InProcessRunner([PeriodicTask("never", lambda: None, 3600)])
    runner.start()
    began = time.monotonic()
    runner.stop()
    assert time.monotonic() - began < 1.0
    assert runner._thread is not None and not runner._thread.is_alive()


def test_runner_waits_for_the_running_task_on_stop() -> None:
    entered, finished = threading.Event(), threading.Event()

    def slow() -> None:
        entered.set()
        time.sleep(0.3)
        finished.set()

    runner = InProcessRunner([PeriodicTask("slow", slow, 0.01)])
    runner.start()
    assert entered.wait(5)
    runner.stop()
    assert finished.is_set()


def test_runner_uses_the_one_registry() -> None:
    settings = load_settings(
        maintenance_interval_s=7,
        tuner_interval_s=3,
        alerts_eval_interval_s=5,
        alerts_notify_interval_s=2,
        actuator_interval_s=4,
        autoscale_interval_s=6,
    )
    runner = InProcessRunner.for_settings(settings)
    assert runner.tasks == periodic_tasks(settings)
    assert {task.name: task.interval_s for task in runner.tasks} == {
        "tuneloop.maintenance.rollups": 7,
        "tuneloop.maintenance.compaction": 7,
        "tuneloop.maintenance.retention": 7,
        "tuneloop.tuner.dispatch": 3,
        "tuneloop.tuner.diagnose": 3,
        "tuneloop.alerts.evaluate": 5,
        "tuneloop.alerts.notify": 2,
        "tuneloop.actuators.reconcile": 4,
        "tuneloop.actuators.autoscale": 6,
    }


def test_a_periodic_task_needs_a_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        PeriodicTask("x", lambda: None, 0)


# --------------------------------------------------------------------------- Celery app


def test_beat_schedule_entries_all_expire() -> None:
    settings = load_settings(
        redis_url="redis://127.0.0.1:6379/15",
        maintenance_interval_s=30,
        tuner_interval_s=30,
        actuator_interval_s=30,
        autoscale_interval_s=30,
    )
    celery = create_app(settings)
    schedule = celery.conf.beat_schedule

    assert set(schedule) == {task.name for task in periodic_tasks(settings)}
    for name, entry in schedule.items():
        assert entry["task"] == name
        assert name in celery.tasks
        every = 30 if ".maintenance." in name else entry["schedule"]
        assert 0 < entry["options"]["expires"] <= entry["schedule"] == every


def test_celery_app_settings() -> None:
    celery = create_app(load_settings(redis_url="redis://127.0.0.1:6379/15"))
    conf = celery.conf
    assert conf.broker_url == conf.result_backend == "redis://127.0.0.1:6379/15"
    assert conf.task_acks_late is True
    assert conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_serializer == conf.result_serializer == "json"
    assert conf.accept_content == ["json"]
    assert beat_schedule([]) == {}


def test_celery_app_runs_the_tuning_loop_per_study_on_its_queue() -> None:
    settings = load_settings(
        redis_url="redis://127.0.0.1:6379/15", tuner_interval_s=5, task_queue="tl-q"
    )
    celery = create_app(settings)
    assert celery.conf.task_default_queue == "tl-q"
    assert {"tuneloop.tuner.dispatch", "tuneloop.tuner.step"} <= set(celery.tasks)
    step = celery.tasks["tuneloop.tuner.step"]
    assert step.autoretry_for and step.retry_backoff and step.retry_jitter
    entry = celery.conf.beat_schedule["tuneloop.tuner.dispatch"]
    assert entry["schedule"] == entry["options"]["expires"] == 5


def test_create_app_needs_redis() -> None:
    with pytest.raises(ValueError, match="TUNELOOP_REDIS_URL"):
        create_app(load_settings(redis_url=None))


# --------------------------------------------------------------------------- maintenance tasks


def test_task_runtime_is_built_once_per_settings(tmp_path: Path) -> None:
    configure(load_settings(database_url=f"sqlite:///{tmp_path / 'a.db'}"))
    first = maintenance.task_runtime()
    assert maintenance.task_runtime() is first

    configure(load_settings(database_url=f"sqlite:///{tmp_path / 'b.db'}"))
    second = maintenance.task_runtime()
    assert second is not first
    assert str(second.engine.url).endswith("b.db")


def seed(settings: Settings) -> None:
    """One series with two recent samples and one older than the retention."""
    engine = make_engine(settings.resolved_database_url)
    now = utcnow()
    with session_scope(session_factory(engine)) as session:
        project = Project(name="p")
        session.add(project)
        session.flush()
        series = Series(project_id=project.id, metric="gpu_util", labels={}, fingerprint="f" * 32)
        session.add(series)
        session.flush()
        session.execute(
            insert(samples),
            [
                {"series_id": series.id, "ts": now - timedelta(minutes=10), "value": 1.0},
                {"series_id": series.id, "ts": now - timedelta(minutes=9), "value": 3.0},
                {"series_id": series.id, "ts": now - timedelta(days=40), "value": 9.0},
            ],
        )
    engine.dispose()


def count_rows(settings: Settings, table: Table) -> int:
    engine = make_engine(settings.resolved_database_url)
    with engine.connect() as connection:
        value = connection.execute(select(func.count()).select_from(table)).scalar_one()
    engine.dispose()
    return int(value)


@pytest.mark.redis
def test_a_real_celery_worker_runs_the_maintenance_tasks(redis_url: str, tmp_path: Path) -> None:
    settings = configure(
        load_settings(
            database_url=f"sqlite:///{tmp_path / 'tuneloop.db'}",
            redis_url=redis_url,
            data_dir=str(tmp_path),
        )
    )
    migrate.upgrade(settings.resolved_database_url)
    seed(settings)
    celery = create_app(settings)
    # A queue of its own: other test runs may share this Redis database.
    celery.conf.task_default_queue = f"tuneloop-test-{uuid.uuid4().hex}"

    with start_worker(celery, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        retention = celery.tasks["tuneloop.maintenance.retention"].delay()
        assert retention.get(timeout=30) is None
        assert count_rows(settings, samples) == 2  # the 40-day-old sample is gone

        rollups = celery.tasks["tuneloop.maintenance.rollups"].delay()
        assert rollups.get(timeout=30) is None
        assert count_rows(settings, samples_1m) == 2  # two complete minutes

        runtime = maintenance.task_runtime()
        again = celery.tasks["tuneloop.maintenance.rollups"].delay()
        assert again.get(timeout=30) is None
        assert maintenance.task_runtime() is runtime, "one runtime per worker process"
        assert count_rows(settings, samples_1m) == 2  # idempotent

        compaction = celery.tasks["tuneloop.maintenance.compaction"].delay()
        assert compaction.get(timeout=30) is None
        assert count_rows(settings, samples) == 2  # inside the hot window: still rows


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("command", ["worker", "beat"])
def test_worker_and_beat_need_redis(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNELOOP_REDIS_URL", raising=False)
    _register_commands()

    result = CliRunner().invoke(app, [command])

    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"tuneloop: `tuneloop {command}` needs Redis")


def test_retention_task_creates_the_next_partition_ahead(postgres_server_url: str) -> None:
    from tests.conftest import reset_postgres
    from tuneloop.storage import make_engine
    from tuneloop.storage.models import metadata
    from tuneloop.storage.timeseries.partitions import list_partitions, partition_start
    from tuneloop.storage.types import utcnow

    reset_postgres(postgres_server_url)
    engine = make_engine(postgres_server_url)
    metadata.create_all(engine)
    configure(load_settings(database_url=postgres_server_url, partition_days=1))
    maintenance.run_retention()
    maintenance.run_retention()  # idempotent
    with engine.connect() as connection:
        lowers = {p.lower for p in list_partitions(connection)}
    today = partition_start(utcnow(), 1)
    assert today in lowers
    assert today + timedelta(days=1) in lowers
    engine.dispose()


def test_no_store_maintenance_when_series_live_in_a_tsdb() -> None:
    names = {task.name for task in periodic_tasks(load_settings(tsdb_url="http://vm:8428"))}
    assert "tuneloop.tuner.dispatch" in names
    assert not {n for n in names if n.startswith("tuneloop.maintenance.")}
