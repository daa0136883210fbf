"""Load bands of an ``offered_load_p99`` study: one incumbent per band of the offered rate.

The best batching for 20 requests/s is not the best for 80: a configuration is only compared
with others measured under a like load. The offered rate (requests arriving per second, the
service's own counter :data:`OFFERED_METRIC`, all replicas summed) falls in a **band**: bands
are a factor of :data:`BAND_FACTOR` wide (``floor(log2(rate))``: 16-32/s is one, 64-128/s
another). A trial belongs to the band of the offered rate measured over its window (else the
band it was asked in). The strategy sees only the current band's trials, so the SLO rule's
exclusions are per band too (an overload at 80/s says nothing about 20/s); the **band's
incumbent** is its best measured configuration, else the pre-study config; and when no trial
runs and the rate has moved to another band than the last trial's, or there is no headroom to
explore, the job is put on the band's incumbent without a trial.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy.orm import Session

from tuneloop import promql
from tuneloop.job_configs import latest_config, propose
from tuneloop.settings import get_settings
from tuneloop.storage.models import Job, Study, Trial
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.types import to_micros
from tuner.objectives import LOAD_BANDED_OBJECTIVES, check_direction
from tuner.promql_objective import EVALUATION_TIMEOUT_S, MAX_SERIES_PER_SELECTOR, expand
from tuner.readings import LATENCY_HISTOGRAM
from tuner.strategies.base import Observation, best_estimate
from tuner.study_baseline import pre_study_config
from tuner.study_records import history, study_space, study_trials
from tuner.trial_measurements import TrialMeasurements

OFFERED_METRIC: Final = "inference_requests_arrived_total"
"""Requests arriving at a replica, counted before they are queued (examples/inference)."""
SERVED_METRIC: Final = f"{LATENCY_HISTOGRAM}_count"
"""Requests answered: the latency histogram's count."""
BAND_FACTOR: Final = 2.0
BAND_KEY: Final = "load_band"
RATE_KEY: Final = "offered_rate"
RATE_WINDOW_S: Final = 10
"""The offered rate a band is read from: requests arriving over the last this many seconds."""
BAND_HYSTERESIS: Final = BAND_FACTOR**0.25
"""How far past its band's edges (a factor: a quarter of a band) the offered rate must go before
the job leaves the band of its last trial. A rate on an edge (300/s read as 229 to 267/s by an
overloaded server) otherwise moved the job between two bands' incumbents at every pass."""


def banded(study: Study) -> bool:
    return study.objective in LOAD_BANDED_OBJECTIVES


def band_of(rate: float) -> int:
    """The band of ``rate`` requests/s: ``floor(log_BAND_FACTOR(rate))``, 0 under 1/s."""
    if not math.isfinite(rate) or rate < 1.0:
        return 0
    return math.floor(math.log(rate, BAND_FACTOR) + 1e-9)


def request_rate(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    metric: str,
    *,
    start: datetime,
    end: datetime,
) -> float | None:
    """Requests per second of the job's counter ``metric`` over ``[start, end]`` (its
    replicas summed), or ``None`` without data."""
    window_s = max(1, math.ceil((end - start).total_seconds()))
    at_ms = to_micros(end) // 1000
    text = expand(f"sum(rate({metric}{{job=$job}}[{window_s}s]))", job_name)
    result = promql.query(
        promql.BackendSource(series, project_id, max_series=MAX_SERIES_PER_SELECTOR),
        text,
        at_ms,
        at_ms,
        1000,
        max_samples=get_settings().promql_max_samples,
        timeout_s=EVALUATION_TIMEOUT_S,
    )
    value = result.value
    found: list[float] = []
    for one in value if isinstance(value, list) else []:
        found += [float(v) for v, ok in zip(one.values, one.present, strict=True) if ok]
    return found[-1] if found and math.isfinite(found[-1]) else None


def offered_rate(
    series: TimeSeriesBackend, project_id: int, job_name: str, *, start: datetime, end: datetime
) -> float | None:
    return request_rate(series, project_id, job_name, OFFERED_METRIC, start=start, end=end)


def served_rate(
    series: TimeSeriesBackend, project_id: int, job_name: str, *, start: datetime, end: datetime
) -> float | None:
    return request_rate(series, project_id, job_name, SERVED_METRIC, start=start, end=end)


def trial_band(trial: Trial) -> int | None:
    """The band of the offered rate measured over the trial (its window, or the guard's),
    else the band it was asked in; ``None`` when neither is known."""
    stored = TrialMeasurements.from_json(trial.measurements)
    for part in ("inputs", "guard"):
        data = stored.data.get(part)
        rate = data.get(RATE_KEY) if isinstance(data, dict) else None
        if isinstance(rate, int | float) and not isinstance(rate, bool):
            return band_of(float(rate))
    asked = stored.context.get(BAND_KEY)
    return int(asked) if asked is not None else None


def band_history(session: Session, study: Study, band: int) -> list[Observation]:
    """The study's trials of ``band`` (:func:`in_band`) as observations."""
    return history(session, study, in_band(band))


def band_incumbent(session: Session, study: Study, band: int) -> tuple[dict[str, Any] | None, str]:
    """The band's best measured configuration (its trials named), else the pre-study config."""
    space = study_space(study)
    best = best_estimate(band_history(session, study, band), check_direction(study.direction))
    if best is not None:
        config = {k: v for k, v in best.config.items() if k in space}
        return config, f"band {band}: trials {list(best.trials)}"
    before = pre_study_config(session, study)
    if before is None:
        return None, "none"
    config = {k: v for k, v in before.config.items() if k in space}
    return config, f"band {band}: pre-study desired version {before.version}"


def in_band(band: int) -> Callable[[Trial], bool]:
    """Whether a trial is one of ``band``'s: measured or asked in it, or of no known band
    (neither measured with an offered rate nor asked in a band: it says nothing about any one
    load)."""
    return lambda trial: trial_band(trial) in (band, None)


def sticky_band(rate: float, previous: int | None) -> int:
    """The band of ``rate``, but ``previous`` while the rate stays within
    :data:`BAND_HYSTERESIS` of its edges."""
    band = band_of(rate)
    if previous is None or band == previous:
        return band
    low = BAND_FACTOR**previous / BAND_HYSTERESIS
    high = BAND_FACTOR ** (previous + 1) * BAND_HYSTERESIS
    return previous if low <= rate < high else band


def current_band(
    series: TimeSeriesBackend | None, session: Session, study: Study, job: Job, now: datetime
) -> tuple[float, int] | None:
    """The offered rate of the last :data:`RATE_WINDOW_S` and its band (:func:`sticky_band`
    to the band of the study's last trial of a known band), ``None`` without data (read from
    ``series``, default the store in ``session``'s transaction)."""
    series = series or StoreBackend(session.connection())
    start = now - timedelta(seconds=RATE_WINDOW_S)
    rate = offered_rate(series, job.project_id, job.name, start=start, end=now)
    if rate is None:
        return None
    known = [b for b in map(trial_band, study_trials(session, study)) if b is not None]
    return rate, sticky_band(rate, known[-1] if known else None)


def follow_band(
    session: Session,
    study: Study,
    job: Job,
    band: int,
    *,
    no_headroom: bool,
) -> dict[str, Any] | None:
    """Put the job on ``band``'s incumbent when no trial runs and either the last trial was
    in another band (the load moved) or there is no headroom to explore with; what was done
    (for the audit log), or ``None`` when the job stays as it is."""
    trials = study_trials(session, study)
    last = trials[-1] if trials else None
    moved = last is not None and trial_band(last) not in (band, None)
    if not (moved or no_headroom):
        return None
    incumbent, which = band_incumbent(session, study, band)
    if incumbent is None:
        return None
    previous = latest_config(session, job, "desired")
    current: Mapping[str, Any] = previous.config if previous is not None else {}
    if all(current.get(k) == v for k, v in incumbent.items()):
        return None
    row = propose(session, job, {**current, **incumbent}, origin="tuner-trial", study_id=study.id)
    why = "the offered load moved to another band" if moved else "no headroom to explore"
    return {
        "band": band,
        "why": why,
        "incumbent": which,
        "config": incumbent,
        "desired_version": row.version,
    }
