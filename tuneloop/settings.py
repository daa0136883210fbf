"""One settings object for every tuneloop process.

Values come from ``TUNELOOP_*`` environment variables and CLI flags (flags win), are validated
once at start-up, and are then read through :func:`get_settings`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any

import platformdirs
from pydantic import Field, IPvAnyNetwork, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.exc import ArgumentError

ENV_PREFIX = "TUNELOOP_"

_DATABASE_URL = re.compile(r"sqlite(\+\w+)?://(/\S*)?|postgresql(\+\w+)?://\S+")
"""The URL forms SQLAlchemy reads as intended: ``sqlite://tmp/x.db`` would name a host."""
_TSDB_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


_REMOTE_WRITE_URL = re.compile(r"https?://[^\s/?#]+(/\S*)?")


def _parses(url: str) -> bool:
    """Whether SQLAlchemy can read ``url`` (a port that is not a number, for one, it cannot)."""
    from sqlalchemy.engine import make_url  # only when a URL is given: most commands need none

    try:
        make_url(url)
    except (ArgumentError, ValueError):
        return False
    return True


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("tuneloop", appauthor=False))


class SettingsError(Exception):
    """Invalid configuration; ``str()`` is one line naming the setting and the reason."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str = ""
    """SQLAlchemy URL. Empty means a SQLite file ``tuneloop.db`` in ``data_dir``."""
    redis_url: str | None = None
    """Celery broker and result backend. Unset: tasks run in-process."""
    tsdb_url: str = ""
    """A Prometheus-compatible TSDB (VictoriaMetrics, Prometheus with
    ``--web.enable-remote-write-receiver``) that keeps the series instead of the database:
    remote write to ``<url>/api/v1/write``, PromQL over ``<url>/api/v1/...``. Empty: the
    built-in store."""
    tsdb_write_url: str = ""
    """Remote-write endpoint of the TSDB when it is not ``<tsdb_url>/api/v1/write``: a
    VictoriaMetrics cluster's vminsert (``/insert/<tenant>/prometheus/api/v1/write``, with
    ``tsdb_url`` at vmselect's ``/select/<tenant>/prometheus``), Mimir's distributor
    (``/api/v1/push``), Thanos Receive (``/api/v1/receive``). Empty: ``<tsdb_url>/api/v1/write``."""
    tsdb_headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers of every request to the TSDB, reads and writes (JSON in the
    environment), e.g. ``{"X-Scope-OrgID": "gpu-fleet"}`` for Mimir."""
    tsdb_bearer_token: SecretStr | None = None
    """Sent as ``Authorization: Bearer <token>`` with every request to the TSDB."""
    tsdb_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for one TSDB request."""
    tsdb_project_label: str = Field(default="tuneloop_project", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Label that names a series' project in the TSDB (added on write, matched on read)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: str = "info"

    max_series_per_project: int = Field(default=200_000, ge=1)
    retention_days: int = Field(default=30, ge=1)
    """Raw samples older than this are dropped (whole partitions on PostgreSQL)."""
    rollup_retention_days: int = Field(default=400, ge=1)
    partition_days: int = Field(default=1, ge=1, le=31)
    """Width of one PostgreSQL samples partition."""
    compact_after_s: int = Field(default=7200, ge=0)
    """Hot window: samples younger than this stay rows; older closed chunk spans are compacted
    (docs/storage.md, "Compacted chunks")."""
    chunk_span_s: int = Field(default=3600, ge=60, le=86_400)
    """Width of the narrowest compacted chunk; divides a day, so a chunk never straddles a
    partition."""
    chunk_min_samples: int = Field(default=2000, ge=1, le=10_000_000)
    """A series' chunks are widened (multiples of ``chunk_span_s`` dividing a day, a day at most)
    until one holds about this many samples at the series' rate; 1 keeps them all one span wide."""
    maintenance_interval_s: float = Field(default=60.0, gt=0)
    """How often rollups and retention run."""
    tuner_interval_s: float = Field(default=10.0, gt=0)
    """How often the tuning loop visits each running study."""
    peak_flops: float | None = Field(default=None, gt=0)
    """Peak FLOP/s of one GPU for the diagnosis's MFU, over the built-in table by GPU model
    (a job's own declared peak still wins); for GPUs the table lacks or clocks it misstates."""
    task_queue: str = Field(default="tuneloop", min_length=1, max_length=200)
    """Celery queue of tuneloop's tasks (workers, beat and senders of one deployment agree)."""
    actuator_interval_s: float = Field(default=5.0, gt=0)
    """How often the job actuator reconciles every job (agents' long-polls also do, at once)."""
    autoscale_interval_s: float = Field(default=15.0, gt=0)
    """How often every enabled autoscaler reads its metrics and reconciles its target."""
    kubeconfig: Path | None = None
    """Kubeconfig file of the cluster Kubernetes autoscaler targets live in. Unset: the
    in-cluster service account. Never taken from an API request."""

    sources: Annotated[tuple[str, ...], NoDecode] = ("auto",)
    """What the collector polls: specs such as ``host``, ``nvml``, ``dcgm[=HOST[:PORT]]``,
    ``scrape=URL``, ``infiniband[=PATH]`` (comma-separated in the environment), or ``auto``:
    this host, its InfiniBand ports if any, and its GPUs through DCGM or else NVML if any.
    Checked when a collector starts (see ``collector.sources``)."""
    collect_interval_s: float = Field(default=15.0, gt=0)
    """How often the host and InfiniBand sources poll."""
    gpu_interval_s: float = Field(default=10.0, gt=0)
    """How often the GPU sources (DCGM, NVML) poll; also DCGM's field update interval."""
    scrape_interval_s: float = Field(default=30.0, gt=0)
    """How often ``scrape=URL`` sources poll (dcgm-exporter's own collection interval)."""

    batch_max_samples: int = Field(default=50_000, ge=1)
    """The collector pipeline writes as soon as this many samples wait (and no more at once)."""
    flush_interval_s: float = Field(default=1.0, gt=0)
    """...or when the oldest waiting sample has waited this long."""
    queue_max_samples: int = Field(default=500_000, ge=1)
    """Samples the pipeline holds in memory; past it, submissions are refused (HTTP 503)."""
    spool_dir: Path | None = None
    """Where accepted samples wait on disk (the write-ahead log; see ``collector_durable``).
    Unset: ``data_dir/spool``."""
    spool_max_bytes: int = Field(default=1024**3, ge=1024 * 1024)
    """Disk the spool may use per process."""
    collector_durable: bool = True
    """Answer a submission (an OTLP request, a source's poll) only once its samples are fsync'ed
    to the spool, which then serves as a write-ahead log: a crash loses none of them. ``false``
    answers from memory (faster; a crash loses up to ``flush_interval_s`` of samples)."""
    store_retry_max_s: float = Field(default=30.0, gt=0)
    """Longest wait between attempts to reach an unreachable store."""
    relabel_config: Path | None = None
    """YAML or JSON file of relabel rules applied to every collected series."""

    default_project: str = "default"

    alerts_eval_interval_s: float = Field(default=15.0, gt=0)
    """How often alert rules are evaluated."""
    alerts_notify_interval_s: float = Field(default=5.0, gt=0)
    """How often queued notifications are retried (new ones go out right after evaluation)."""
    alerts_external_url: str = ""
    """Link put in notifications (``externalURL``, ``generatorURL``); default: the API's URL."""
    alerts_runbook_base_url: str = ""
    """Where docs/runbooks.md is published: rules loaded without a ``runbook_url`` get
    ``<URL>#<rule name in lower case>``; empty: the rule file's ``runbook_base_url``, if any."""
    alerts_allowed_target_networks: Annotated[tuple[IPvAnyNetwork, ...], NoDecode] = ()
    """Networks (CIDRs, comma-separated in the environment) that alert receivers may reach
    although they are loopback, link-local, private or otherwise not public: receivers are
    refused there by default, so that a receiver cannot be used to reach internal services."""

    otlp_max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest OTLP/HTTP request body accepted, on the wire and once decompressed (413 above)."""
    remote_write_max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    """Largest Prometheus remote-write body ``POST /api/v1/write`` accepts (413 above)."""

    remote_write_url: str = ""
    """Forward every sample tuneloop collects and receives to this Prometheus remote-write URL
    as well (VictoriaMetrics, Mimir, Prometheus with its receiver on), through a pipeline of
    its own: its own queue, spool and retries (docs/prometheus.md). Empty: no forwarding."""
    remote_write_headers: dict[str, str] = Field(default_factory=dict)
    """Extra headers of every forwarded request (JSON in the environment), e.g.
    ``{"X-Scope-OrgID": "gpu-fleet"}``."""
    remote_write_bearer_token: SecretStr | None = None
    """Sent as ``Authorization: Bearer ...`` with every forwarded request."""
    remote_write_timeout_s: float = Field(default=30.0, gt=0)
    """How long one forwarded request may take before it is retried."""
    remote_write_spool_dir: Path | None = None
    """Where forwarded samples wait on disk. Unset: ``spool_dir/remote-write``."""

    promql_max_samples: int = Field(default=50_000_000, ge=1)
    """Most raw samples one PromQL query may read (as Prometheus' ``query.max-samples``): a
    query that would read more is refused before it reads any."""

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str) -> str:
        if value and not (_DATABASE_URL.fullmatch(value) and _parses(value)):
            raise ValueError(
                # Not echoed: it may hold a password.
                "not a database URL: expected sqlite:///relative/path.db, "
                "sqlite:////absolute/path.db or postgresql://user:password@host:5432/dbname"
            )
        return value

    @field_validator("tsdb_url")
    @classmethod
    def _check_tsdb_url(cls, value: str) -> str:
        if value and not _TSDB_URL.fullmatch(value):
            raise ValueError("not a TSDB URL: expected http://host:port or https://host/prefix")
        return value.rstrip("/")

    @field_validator("tsdb_write_url")
    @classmethod
    def _check_tsdb_write_url(cls, value: str) -> str:
        if value and not _REMOTE_WRITE_URL.fullmatch(value):
            raise ValueError("not a remote-write URL: expected http(s)://host[:port]/path")
        return value

    @field_validator("remote_write_url")
    @classmethod
    def _check_remote_write_url(cls, value: str) -> str:
        if value and not _REMOTE_WRITE_URL.fullmatch(value):
            raise ValueError("not an http:// or https:// URL")
        return value

    @field_validator("sources", mode="before")
    @classmethod
    def _split_sources(cls, value: object) -> object:
        # The environment gives one string; CLI flags give one spec per --source.
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            specs = tuple(str(spec).strip() for spec in value)
            if not any(specs):
                raise ValueError("must name at least one source, or auto")
            return tuple(spec for spec in specs if spec)
        return value

    @field_validator("alerts_allowed_target_networks", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("chunk_span_s")
    @classmethod
    def _chunk_span_divides_a_day(cls, value: int) -> int:
        if 86_400 % value:
            raise ValueError(f"chunk_span_s must divide a day (86400 s), got {value}")
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        allowed = {"critical", "error", "warning", "info", "debug"}
        if value.lower() not in allowed:
            raise ValueError(f"must be one of {', '.join(sorted(allowed))}")
        return value.lower()

    @property
    def resolved_spool_dir(self) -> Path:
        return self.spool_dir if self.spool_dir is not None else self.data_dir / "spool"

    @property
    def resolved_remote_write_spool_dir(self) -> Path:
        if self.remote_write_spool_dir is not None:
            return self.remote_write_spool_dir
        return self.resolved_spool_dir / "remote-write"

    @property
    def resolved_database_url(self) -> str:
        """The URL actually used: psycopg 3 driver on PostgreSQL, a file in data_dir by default."""
        url = self.database_url or f"sqlite:///{self.data_dir / 'tuneloop.db'}"
        if url.startswith("postgresql://") or url.startswith("postgres://"):
            url = "postgresql+psycopg://" + url.split("://", 1)[1]
        return url


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment plus ``overrides`` (CLI flags; ``None`` is ignored).

    Raises :class:`SettingsError` with one line per invalid setting.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"]) or "settings"
            source = "--" + name.replace("_", "-") if name in given else ENV_PREFIX + name.upper()
            lines.append(f"invalid setting {source}: {error['msg']}")
        raise SettingsError("; ".join(lines)) from None


_current: Settings | None = None


def configure(settings: Settings) -> Settings:
    """Install ``settings`` as the process-wide settings (called once by each entry point)."""
    global _current
    _current = settings
    get_settings.cache_clear()
    return settings


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return _current if _current is not None else load_settings()
