"""A small fleet with known figures, written through the store's own writer.

Three hours from ``T0`` (a Monday, midnight UTC), one sample every 30 s. Five GPUs in project
``fleet-a``: ``gpu-node-1`` GPUs 0 and 1 run job ``llama`` (whose job row says team ``nlp``),
``gpu-node-2`` GPU 0 runs ``bert`` with the series label ``team="vision"``, ``gpu-node-2``
GPU 1 runs nothing, and a host whose name is an SQL injection attempt (``HOSTILE``) has GPU 0.

GPU utilization in hour ``k`` is ``base + k`` on average (samples alternate ``-1``/``+1``
around it), with ``base`` 10, 20, 30, 40, 50 in the order above; ``gpu-node-2`` GPU 1 is idle
(0) in hour 2. The energy counter grows 9,000,000 mJ (300 W for 30 s) per sample from five
minutes before ``T0``; ``gpu-node-1`` GPU 1 restarts its counter (a reset) at ``T0 + 90 min``.
So each GPU used exactly 3 GPU-hours and 0.9 kWh in ``[T0, T0 + 3h)``.

``update_rollups`` runs as of ``T0 + 2h02m``: hour 0 is then served by ``samples_1h``, hour 1
by ``samples_1m`` and hour 2 by raw samples, so every panel query crosses all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tuneloop import accounts
from tuneloop.storage import session_factory, session_scope
from tuneloop.storage.models import (
    AlertInstance,
    AlertRule,
    AuditEntry,
    Job,
    JobConfig,
    Notification,
    Study,
    Trial,
)
from tuneloop.storage.timeseries.rollups import update_rollups
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

T0 = datetime(2026, 11, 16, tzinfo=UTC)
END = T0 + timedelta(hours=3)
STEP = timedelta(seconds=30)
PROJECT = "fleet-a"
OTHER_PROJECT = "fleet-b"
HOSTILE = "x'; DROP TABLE series; --"
ENERGY_STEP_MJ = 9_000_000.0
RESET_AT = T0 + timedelta(minutes=90)
ROLLUPS_AS_OF = T0 + timedelta(hours=2, minutes=2)


@dataclass(frozen=True)
class Gpu:
    host: str
    gpu: str
    base: float
    job: str | None = None
    team: str | None = None
    idle_last_hour: bool = False
    resets: bool = False

    @property
    def labels(self) -> dict[str, str]:
        labels = {
            "gpu": self.gpu,
            "UUID": f"GPU-{len(self.host):04d}-{self.base:.0f}",
            "device": f"nvidia{self.gpu}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": self.host,
        }
        if self.job is not None:
            labels["job"] = self.job
        if self.team is not None:
            labels["team"] = self.team
        return labels

    @property
    def name(self) -> str:
        return f"{self.host} gpu {self.gpu}"

    def util(self, at: datetime, index: int) -> float:
        hour = int((at - T0).total_seconds() // 3600)
        if self.idle_last_hour and hour == 2:
            return 0.0
        return self.base + hour + (-1.0 if index % 2 == 0 else 1.0)


GPUS = (
    Gpu("gpu-node-1", "0", 10, job="llama"),
    Gpu("gpu-node-1", "1", 20, job="llama", resets=True),
    Gpu("gpu-node-2", "0", 30, job="bert", team="vision"),
    Gpu("gpu-node-2", "1", 40, idle_last_hour=True),
    Gpu(HOSTILE, "0", 50),
)
CONSTANT_GPU_GAUGES = {
    "DCGM_FI_DEV_POWER_USAGE": 300.0,
    "DCGM_FI_DEV_FB_USED": 40_000.0,
    "DCGM_FI_DEV_GPU_TEMP": 60.0,
    "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0.0,
    "DCGM_FI_DEV_XID_ERRORS": 0.0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0,
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
}
RANKS = {"0": (0.5, 100.0), "1": (0.7, 120.0)}
"""rank -> (step seconds, samples per second) of job ``llama``."""
PHASES = {"forward": 0.2, "backward": 0.3}
SHARES = {"forward": 0.35, "backward": 0.5}
"""phase -> share of the step, as job ``llama``'s diagnosis writes it."""
MFU = 0.42
"""Job ``llama``'s MFU, as its diagnosis writes it."""
NETWORK_BYTES_PER_S = 1000.0


def times(start: datetime = T0, end: datetime = END) -> list[datetime]:
    count = int((end - start) / STEP)
    return [start + i * STEP for i in range(count)]


def gpu_batches() -> list[SeriesBatch]:
    batches = []
    stamps = times()
    for gpu in GPUS:
        batches.append(
            SeriesBatch(
                "DCGM_FI_DEV_GPU_UTIL",
                gpu.labels,
                stamps,
                [gpu.util(at, i) for i, at in enumerate(stamps)],
            )
        )
        for metric, value in CONSTANT_GPU_GAUGES.items():
            batches.append(SeriesBatch(metric, gpu.labels, stamps, [value] * len(stamps)))
        energy_stamps = times(T0 - timedelta(minutes=5))
        energy, values = 0.0, []
        for at in energy_stamps:
            energy = ENERGY_STEP_MJ if gpu.resets and at == RESET_AT else energy + ENERGY_STEP_MJ
            values.append(energy + (0.0 if gpu.resets and at >= RESET_AT else 5e9))
        batches.append(
            SeriesBatch(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                gpu.labels,
                energy_stamps,
                values,
                SeriesKind.COUNTER,
            )
        )
    return batches


def job_batches() -> list[SeriesBatch]:
    stamps = times()
    batches = []
    for rank, (seconds, rate) in RANKS.items():
        labels = {"job": "llama", "rank": rank}
        batches.append(
            SeriesBatch("tuneloop_step_duration_seconds", labels, stamps, [seconds] * len(stamps))
        )
        batches.append(
            SeriesBatch("tuneloop_samples_per_second", labels, stamps, [rate] * len(stamps))
        )
        for phase, value in PHASES.items():
            batches.append(
                SeriesBatch(
                    "tuneloop_step_phase_seconds",
                    {**labels, "phase": phase},
                    stamps,
                    [value] * len(stamps),
                )
            )
    for phase, share in SHARES.items():
        labels = {"job": "llama", "phase": phase}
        batches.append(
            SeriesBatch("tuneloop_job_phase_share", labels, stamps, [share] * len(stamps))
        )
    batches.append(
        SeriesBatch("tuneloop_job_mfu_ratio", {"job": "llama"}, stamps, [MFU] * len(stamps))
    )
    return batches


def host_batches() -> list[SeriesBatch]:
    stamps = times()
    values = [NETWORK_BYTES_PER_S * (at - T0).total_seconds() for at in stamps]
    return [
        SeriesBatch(
            metric, {"device": device, "Hostname": "gpu-node-1"}, stamps, values, SeriesKind.COUNTER
        )
        for metric, device in (
            ("node_network_receive_bytes_total", "eth0"),
            ("node_network_transmit_bytes_total", "eth0"),
            ("node_disk_read_bytes_total", "nvme0n1"),
            ("node_disk_written_bytes_total", "nvme0n1"),
        )
    ]


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def control_plane_rows(session: Session, project_id: int) -> None:
    llama = Job(project_id=project_id, name="llama", labels={"team": "nlp"}, status="running")
    session.add(llama)
    session.flush()
    study = Study(
        job_id=llama.id,
        name="bs-search",
        objective="goodput",
        direction="maximize",
        strategy="bayesian",
        space={},
        created_at=at(5),
    )
    session.add(study)
    session.flush()
    for number, (value, done) in enumerate(((5.0, 10), (3.0, 20), (8.0, 30))):
        session.add(
            Trial(
                study_id=study.id,
                number=number,
                params={"batch_size": 32 * (number + 1)},
                state="complete",
                value=value,
                started_at=at(done - 8),
                completed_at=at(done),
            )
        )
    session.add(
        JobConfig(
            job_id=llama.id,
            kind="desired",
            version=1,
            config={"batch_size": 96},
            source="tuner",
            created_at=at(15),
        )
    )
    session.add(
        AuditEntry(
            project_id=project_id,
            actor="actuator",
            action="config.rollback",
            target="job/llama",
            details={"to_version": 1},
            created_at=at(40),
        )
    )
    session.add(
        AuditEntry(project_id=project_id, actor="tuner", action="trial.tell", created_at=at(41))
    )
    rule = AlertRule(
        project_id=project_id, name="gpu-hot", kind="threshold", spec={}, severity="critical"
    )
    session.add(rule)
    session.flush()
    firing = AlertInstance(
        rule_id=rule.id,
        fingerprint="a",
        labels={"gpu": "0"},
        state="firing",
        value=91.0,
        fired_at=at(50),
    )
    resolved = AlertInstance(
        rule_id=rule.id,
        fingerprint="b",
        labels={"gpu": "1"},
        state="resolved",
        value=70.0,
        fired_at=at(20),
        resolved_at=at(30),
    )
    session.add_all([firing, resolved])
    session.flush()
    for status, minute in (("sent", 50), ("sent", 51), ("failed", 52)):
        session.add(
            Notification(
                instance_id=firing.id,
                receiver="pager",
                event="firing",
                status=status,
                attempts=1,
                last_error="HTTP 500" if status == "failed" else None,
                created_at=at(minute),
            )
        )


def fill(engine: Engine, *, rollups: bool = True) -> int:
    """Write the fleet into ``engine``'s store; returns the id of project ``fleet-a``."""
    sessions = session_factory(engine)
    with session_scope(sessions) as session:
        project_id = accounts.create_project(session, PROJECT).id
        other_id = accounts.create_project(session, OTHER_PROJECT).id
        control_plane_rows(session, project_id)
    writer = SampleWriter(engine)
    result = writer.write(project_id, [*gpu_batches(), *job_batches(), *host_batches()])
    assert not result.rejected, result.rejected
    # The same GPU in another project must never show up in fleet-a's panels or costs.
    other = writer.write(other_id, gpu_batches()[:3])
    assert not other.rejected
    if rollups:
        update_rollups(engine, now=ROLLUPS_AS_OF)
    return project_id
