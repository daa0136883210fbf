"""A study objective written in PromQL (objective ``promql``, the expression in the study's
``objective_expr`` option).

``$job`` in the expression stands for the job's name as a PromQL string (quoted and escaped),
so ``sum(rate(my_tokens_total{job=$job}[1m]))`` reads the studied job's series. The expression
is checked when the study is created (a syntax error, an unsupported function, a range vector
or a string: refused) and, during a trial's window, evaluated by tuneloop's engine as a range
query at the step of the step-timing readings, over whatever keeps the project's series (the
built-in store or a Prometheus-compatible TSDB). Each step's value is one sample of the window
the measurement judges (mean, stderr, extension when noisy), as the step timings are. Several
series in the result are summed step by step, as ``sum(...)`` would; write ``max(...)`` or
``avg(...)`` around the expression for another combination.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Final

from tuneloop import promql
from tuneloop.settings import get_settings
from tuneloop.storage.prometheus.queries import promql_string
from tuneloop.storage.timeseries.backend import TimeSeriesBackend
from tuneloop.storage.types import to_micros
from tuner.measurement import Sample
from tuner.objectives import ObjectiveError
from tuner.readings import bucket_step_s

JOB_PLACEHOLDER: Final = "$job"
EVALUATION_TIMEOUT_S: Final = 30.0
"""One window's query: as long as a read of the API may take."""
MAX_SERIES_PER_SELECTOR: Final = 200_000
"""As the alert rules: a selector never reads more series than a project can hold."""
_CHECK_JOB: Final = "job"


def expand(text: str, job_name: str) -> str:
    """``text`` with every ``$job`` replaced by ``job_name`` as a PromQL string."""
    return text.replace(JOB_PLACEHOLDER, promql_string(job_name))


def check_expr(text: object) -> str:
    """``text`` if, ``$job`` expanded, the engine evaluates it to an instant vector or a scalar;
    :class:`ObjectiveError` naming ``objective_expr`` and saying why if not."""
    if not isinstance(text, str) or not text.strip():
        raise ObjectiveError("objective_expr must be a non-empty PromQL expression")
    try:
        promql.parse_instant(expand(text, _CHECK_JOB))
    except promql.PromQLError as exc:
        raise ObjectiveError(f"objective_expr: {exc}") from None
    return text


def window_samples(
    series: TimeSeriesBackend,
    project_id: int,
    job_name: str,
    text: str,
    *,
    start: datetime,
    end: datetime,
) -> list[Sample]:
    """One :class:`Sample` per step of ``(start, end]``: the expression's value at the step
    (series summed), timed at the step; steps where no series has a value, and those a
    step or more after the newest sample the expression read, are left out."""
    if end <= start:
        return []
    step_ms = bucket_step_s(start, end) * 1000
    start_ms = to_micros(start) // 1000 + step_ms
    end_ms = to_micros(end) // 1000
    if end_ms < start_ms:
        return []
    source = promql.NewestSampleTracker(
        promql.BackendSource(series, project_id, max_series=MAX_SERIES_PER_SELECTOR)
    )
    result = promql.query(
        source,
        expand(text, job_name),
        start_ms,
        end_ms,
        step_ms,
        max_samples=get_settings().promql_max_samples,
        timeout_s=EVALUATION_TIMEOUT_S,
    )
    value = result.value
    totals: dict[int, float] = {}
    if isinstance(value, promql.Scalar):
        totals = {int(t): float(v) for t, v in zip(result.times_ms, value.values, strict=True)}
    elif isinstance(value, list):
        for one in value:
            for i, t in enumerate(result.times_ms):
                if one.present[i]:
                    totals[int(t)] = totals.get(int(t), 0.0) + float(one.values[i])
    # PromQL carries a value forward over its lookback (5 minutes for a bare selector): a step
    # after the newest sample read is no fresher than that sample, so the window can go stale.
    newest = source.newest_ms
    return [
        Sample(t / 1000, v)
        for t, v in sorted(totals.items())
        if not math.isnan(v) and newest is not None and t < newest + step_ms
    ]
