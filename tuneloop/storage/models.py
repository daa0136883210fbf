"""Tables of the one tuneloop store, identical on PostgreSQL and SQLite.

Control-plane state is ORM-mapped (``Mapped[...]``). Time-series tables are Core tables: they are
written in bulk with ``COPY``/``executemany`` and read with aggregate queries, never row by row.
Any change here needs a migration in ``migrations/versions`` (a test checks they agree). The
declarative base is in ``base.py`` and the alerting tables in ``alert_models.py``; their names
are re-exported here, the one module the rest of tuneloop imports tables from.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship
from sqlalchemy.sql import expression

from tuneloop.storage.alert_models import AlertInhibition as AlertInhibition
from tuneloop.storage.alert_models import AlertInstance as AlertInstance
from tuneloop.storage.alert_models import AlertReceiver as AlertReceiver
from tuneloop.storage.alert_models import AlertRule as AlertRule
from tuneloop.storage.alert_models import AlertSilence as AlertSilence
from tuneloop.storage.alert_models import Notification as Notification
from tuneloop.storage.base import NAMING_CONVENTION as NAMING_CONVENTION
from tuneloop.storage.base import Base as Base
from tuneloop.storage.base import metadata as metadata
from tuneloop.storage.price_models import CAPACITY_TYPES as CAPACITY_TYPES
from tuneloop.storage.price_models import GpuPrice as GpuPrice
from tuneloop.storage.price_models import HostCapacity as HostCapacity
from tuneloop.storage.types import BigIntPK, UTCDateTime, utcnow

# --------------------------------------------------------------------------- control plane


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    max_series: Mapped[int | None] = mapped_column(Integer, default=None)
    """Per-project override of the series cap; ``None`` uses the global setting."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; the secret is shown once at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), index=True
    )
    """``None`` only for admin tokens, which are not bound to one project."""
    name: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(20))
    """``admin``, ``member`` (a person) or ``agent`` (a job agent or collector)."""
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    """First characters of the secret, safe to show in listings."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    project: Mapped[Project | None] = relationship()


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20), default="training")
    """``training`` or ``inference``."""
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    status: Mapped[str] = mapped_column(String(20), default="pending")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class JobConfig(Base):
    """One version of a job's desired config (written by tuner, API or a person) or of the
    config its agent reports running (observed). Versions only grow; rows are never updated.
    ``config`` holds only the job's settings; who wrote a version and what an observed one
    says about the desired versions are columns (migration 0009; ``tuneloop.job_configs``)."""

    __tablename__ = "job_configs"
    __table_args__ = (UniqueConstraint("job_id", "kind", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(10))
    """``desired`` or ``observed``."""
    version: Mapped[int] = mapped_column(Integer)
    """The row's place in its kind's sequence for the job: previous + 1, starting at 1."""
    config: Mapped[dict[str, Any]] = mapped_column()
    source: Mapped[str] = mapped_column(String(50), default="api")
    """Free text for people and the audit trail (the API's caller chooses it); code reads
    ``origin`` instead."""
    origin: Mapped[str] = mapped_column(String(20), default="api", server_default="api")
    """Who wrote it: ``api``, ``agent``, ``tuner-trial``, ``study-outcome`` or ``actuator``."""
    origin_study_id: Mapped[int | None] = mapped_column(
        ForeignKey("studies.id", ondelete="SET NULL"), index=True, default=None
    )
    """The study that wrote a ``tuner-trial`` or ``study-outcome`` version (``None`` once the
    study is deleted)."""
    acknowledged_version: Mapped[int | None] = mapped_column(Integer, default=None)
    """Observed only: the desired version the job says it runs (``None``: it did not say)."""
    status: Mapped[str] = mapped_column(String(20), default="running", server_default="running")
    """Observed only: ``running``, ``oom`` or ``failed``."""
    reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    """Observed only: why the job could not run it, in its words."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Study(Base):
    __tablename__ = "studies"
    __table_args__ = (UniqueConstraint("job_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    objective: Mapped[str] = mapped_column(String(50))
    direction: Mapped[str] = mapped_column(String(10), default="maximize")
    strategy: Mapped[str] = mapped_column(String(50))
    space: Mapped[dict[str, Any]] = mapped_column()
    """``SearchSpace.to_dict()``."""
    seed: Mapped[int | None] = mapped_column(Integer, default=None)
    """The strategy's seed (migration 0009 moved it out of ``space``)."""
    state: Mapped[str] = mapped_column(String(20), default="running")
    """``running``, ``stopped`` (no trials; the job back on its pre-study config), or an end
    state: ``complete``, ``failed``, ``cancelled`` (``end_reason`` says why; docs/tuner.md)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Tuning loop (migration 0002): strategy options, measurement policy, ranks, SLO, who
    # drives the trials, the earlier studies it warm-starts from (see tuner/study_options.py).
    options: Mapped[dict[str, Any]] = mapped_column(
        default=dict, server_default=expression.text("'{}'")
    )
    # End states (migration 0008): the job's desired version before the first trial, why and
    # when the study ended, and the desired version it left the job on (None: none written).
    baseline_version: Mapped[int | None] = mapped_column(Integer, default=None)
    end_reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    ended_at: Mapped[datetime | None] = mapped_column(default=None)
    outcome_version: Mapped[int | None] = mapped_column(Integer, default=None)


class Trial(Base):
    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("study_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column()
    state: Mapped[str] = mapped_column(String(20), default="running")
    """``running``, ``complete``, ``failed`` or ``infeasible``."""
    value: Mapped[float | None] = mapped_column(Float, default=None)
    measurements: Mapped[dict[str, Any]] = mapped_column(default=dict)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    completed_at: Mapped[datetime | None] = mapped_column(default=None)
    # Tuning loop (migration 0002): the desired config version that carries this trial to the
    # job (``None`` for trials an agent asked for itself), when the job acknowledged running
    # it (the measurement window starts there) and how often its window was extended.
    desired_version: Mapped[int | None] = mapped_column(Integer, default=None)
    applied_at: Mapped[datetime | None] = mapped_column(default=None)
    extensions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    baseline: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=expression.false()
    )
    """Measures the study's pre-study config (migration 0008), to compare the best one with."""


class AuditEntry(Base):
    """Every action tuneloop or a person took, with the evidence behind it."""

    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_project_created", "project_id", "created_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    actor: Mapped[str] = mapped_column(String(100))
    action: Mapped[str] = mapped_column(String(100))
    target: Mapped[str] = mapped_column(String(200), default="")
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# --------------------------------------------------------------------------- actuators and agents
# A job's agent registers its host, ranks and GPUs; the job actuator reconciles desired config
# versions into releases (the versions agents may run), verifies each change and rolls back.


class JobAgent(Base):
    """One registration of a job's agent: the process (usually rank 0) that talks to the API."""

    __tablename__ = "job_agents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer, default=None)
    world_size: Mapped[int] = mapped_column(Integer)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    """What the agent reported besides ranks: SDK version, framework, ..."""
    knobs: Mapped[dict[str, Any]] = mapped_column(
        default=dict, server_default=expression.text("'{}'")
    )
    """The job's own knobs, name -> declaration (``tuner.knobs``; migration 0014)."""
    rank_hosts: Mapped[dict[str, Any]] = mapped_column(
        default=dict, server_default=expression.text("'{}'")
    )
    """Rank (as a string) -> the host it runs on, GPU or not (migration 0014)."""
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobGpu(Base):
    """A GPU one rank of a job uses, by UUID: joins GPU series (label ``UUID``) to jobs,
    projects and team labels without Kubernetes."""

    __tablename__ = "job_gpus"
    __table_args__ = (
        UniqueConstraint("agent_id", "rank", "gpu_uuid"),
        Index("ix_job_gpus_gpu_uuid", "gpu_uuid"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    agent_id: Mapped[int] = mapped_column(ForeignKey("job_agents.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(255))
    gpu_uuid: Mapped[str] = mapped_column(String(100))
    registered_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobActuator(Base):
    """A job's actuation policy and the reconcile loop's progress, so a restart repeats
    nothing. ``generation`` guards against two reconcilers acting on one job at once."""

    __tablename__ = "job_actuators"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    policy: Mapped[dict[str, Any]] = mapped_column(default=dict)
    goal_version: Mapped[int | None] = mapped_column(Integer, default=None)
    """The desired version (from the tuner, the API or a person) being worked towards."""
    released_version: Mapped[int | None] = mapped_column(Integer, default=None)
    """The desired version agents are told to run."""
    last_good_version: Mapped[int | None] = mapped_column(Integer, default=None)
    approved_version: Mapped[int | None] = mapped_column(Integer, default=None)
    changed_at: Mapped[datetime | None] = mapped_column(default=None)
    """When ``released_version`` last changed: starts the freeze window and the verification."""
    baseline: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """The objective measured before the last change (mean, stderr, n), to verify it against."""
    conditions: Mapped[dict[str, Any]] = mapped_column(default=dict)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    __mapper_args__ = {"version_id_col": generation}  # noqa: RUF012


class JobConfigRelease(Base):
    """A desired version released to a job's agents. Acks of any other version are refused."""

    __tablename__ = "job_config_releases"
    __table_args__ = (UniqueConstraint("job_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(50))
    """``goal`` (the desired version itself), ``step`` (towards it) or ``rollback``."""
    released_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobConfigMark(Base):
    """A verdict on a config a job ran: ``bad`` configs are rolled back and the tuner reads
    them (with the evidence) so it does not propose them again."""

    __tablename__ = "job_config_marks"
    __table_args__ = (UniqueConstraint("job_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column()
    verdict: Mapped[str] = mapped_column(String(10))
    """``bad`` or ``good``."""
    reason: Mapped[str] = mapped_column(String(200))
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Autoscaler(Base):
    """An inference fleet scaled on its latency SLO and request queue: where it runs (the
    target), how it scales (the policy), which series it reads, and what the loop remembers
    (``state``: recent recommendations and scale events) so stabilization and rate limits
    survive restarts. See ``actuators/autoscaler``."""

    __tablename__ = "autoscalers"
    __table_args__ = (UniqueConstraint("project_id", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    target_kind: Mapped[str] = mapped_column(String(20))
    """``kubernetes`` or ``webhook``."""
    target: Mapped[dict[str, Any]] = mapped_column()
    """kubernetes: ``kind`` (Deployment, StatefulSet), ``namespace``, ``name``; webhook: ``url``."""
    policy: Mapped[dict[str, Any]] = mapped_column()
    """The ``ScalePolicy`` fields."""
    p99_selector: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """``{"metric": ..., "match": [matcher, ...]}``: the P99 latency in seconds."""
    queue_selector: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    """The same for the queue length (requests waiting)."""
    dry_run: Mapped[bool] = mapped_column(Boolean, default=False)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    replicas: Mapped[int | None] = mapped_column(Integer, default=None)
    """What the target ran at the last pass (after scaling, if it scaled)."""
    last_decision: Mapped[int | None] = mapped_column(Integer, default=None)
    """Replicas the last decision asked for (a dry run only records it)."""
    last_reason: Mapped[str | None] = mapped_column(String(30), default=None)
    last_decision_at: Mapped[datetime | None] = mapped_column(default=None)
    """When the decision (replicas, reason) last changed."""
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    """Why the last pass failed (the target, the selectors); cleared by a pass that works."""
    last_error_at: Mapped[datetime | None] = mapped_column(default=None)
    lease_until: Mapped[datetime | None] = mapped_column(default=None)
    """Held by the pass calling the target, so two workers never scale one fleet at once."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    """When the definition last changed (passes leave it alone)."""


# --------------------------------------------------------------------------- time series


class Series(Base):
    """One metric name + label set of one project. ``fingerprint`` is a hash of both."""

    __tablename__ = "series"
    __table_args__ = (
        UniqueConstraint("project_id", "fingerprint"),
        Index("ix_series_project_metric", "project_id", "metric"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    metric: Mapped[str] = mapped_column(String(200))
    labels: Mapped[dict[str, Any]] = mapped_column()
    fingerprint: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(20), default="gauge")
    """``gauge`` or ``counter`` (rates are computed at query time, reset-aware)."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


# Raw samples. On PostgreSQL a range-partitioned table (one partition per `partition_days`),
# so retention is DROP of whole partitions. No foreign key: COPY would pay a trigger per row;
# the store deletes a series' samples itself. The (series_id, ts) index serves both
# "range of one series" and "latest per series"; unique, so that a replayed write stores
# nothing twice (it includes ts, the partition key, as PostgreSQL requires).
samples = Table(
    "samples",
    metadata,
    Column("series_id", BigInteger, nullable=False),
    Column("ts", UTCDateTime(), nullable=False),
    Column("value", Float(precision=53), nullable=False),
    Index("ix_samples_series_ts", "series_id", "ts", unique=True),
    postgresql_partition_by="RANGE (ts)",
)


# Compacted samples: one row per series and closed chunk span (``chunk_span``-wide, aligned to
# the epoch), its timestamps and values encoded by ``timeseries.chunk_codec``. ``start_ts`` is
# the span's start, ``end_ts`` the newest sample's time. Range-partitioned on PostgreSQL as
# ``samples`` (by ``start_ts``), so retention drops chunks with the samples' partitions.
sample_chunks = Table(
    "sample_chunks",
    metadata,
    Column("series_id", BigInteger, nullable=False),
    Column("start_ts", UTCDateTime(), nullable=False),
    Column("end_ts", UTCDateTime(), nullable=False),
    Column("sample_count", Integer, nullable=False),
    Column("ts_blob", LargeBinary, nullable=False),
    Column("values_blob", LargeBinary, nullable=False),
    PrimaryKeyConstraint("series_id", "start_ts"),
    postgresql_partition_by="RANGE (start_ts)",
)


def _rollup_table(name: str, covered: tuple[str, ...] = (), *extra: Column[Any]) -> Table:
    """Downsampled samples: one row per series and bucket, enough to derive avg/min/max/sum/
    last/count over any coarser step without reading raw samples. ``covered`` columns are
    also stored in the primary key's index (PostgreSQL ``INCLUDE``)."""
    return Table(
        name,
        metadata,
        Column("series_id", BigInteger, nullable=False),
        Column("bucket", UTCDateTime(), nullable=False),
        Column("count", Integer, nullable=False),
        Column("sum", Float(precision=53), nullable=False),
        Column("min", Float(precision=53), nullable=False),
        Column("max", Float(precision=53), nullable=False),
        Column("last", Float(precision=53), nullable=False),
        Column("last_ts", UTCDateTime(), nullable=False),
        *extra,
        PrimaryKeyConstraint("series_id", "bucket", postgresql_include=list(covered)),
    )


# ``increase``: a counter's growth over the pairs of consecutive samples whose later sample
# lies in the minute (PostgreSQL, the counters the SQL functions read: counter_increase.py),
# so that the Cost dashboard's energy survives compaction; NULL for every other series.
samples_1m = _rollup_table("samples_1m", (), Column("increase", Float(precision=53)))
# The dashboards' week-long panels read a week of hourly rows per series: with the columns
# tuneloop_series needs in the key's index, they read adjacent index entries instead of one
# table page per hour (the rollup pass writes each hour of all series together), and the
# rollup pass vacuums the table so those reads stay index-only (migration 0007).
samples_1h = _rollup_table("samples_1h", ("count", "sum", "min", "max"))

ROLLUP_TABLES: dict[int, Table] = {60: samples_1m, 3600: samples_1h}
"""Rollup tables by bucket width in seconds."""


class RollupState(Base):
    """How far each rollup has been computed, so a restart repeats no work."""

    __tablename__ = "rollup_state"

    resolution_s: Mapped[int] = mapped_column(Integer, primary_key=True)
    watermark: Mapped[datetime] = mapped_column()
