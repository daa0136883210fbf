"""PromQL text for the Prometheus backend: selectors (the one place label values become
PromQL), durations, and what a TSDB's answer means in the store's value types.

Every selector carries the project matcher first, so no expression built here can read another
project's series; a caller's matcher on the project label is ANDed with it and can only narrow.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime

from tuneloop.storage.prometheus import remote_writer
from tuneloop.storage.timeseries.query import METRIC_LABEL
from tuneloop.storage.timeseries.types import (
    Aggregation,
    Matcher,
    MatchOp,
    SeriesInfo,
    SeriesKind,
    fingerprint,
)
from tuneloop.storage.types import from_micros, to_micros

PROJECT_LABEL = remote_writer.PROJECT_LABEL
DEFAULT_LOOKBACK_S = 86_400
"""How far back ``latest(since=None)`` and series look-ups without a range look: a TSDB has no
"any age" that costs nothing."""
SUBQUERY_STEP = "1m"
"""Resolution of the subquery that finds the time of a sample older than the TSDB's lookback
delta (5 minutes by default): below it, so every sample is seen by some step."""
EDGE_SHIFT = "1ms"
"""Windows end 1 ms before the evaluation time, so a window ``(t - w, t]`` holds ``[t - w,
t)`` of millisecond timestamps: the store's half-open buckets."""

COUNTER_SUFFIXES = ("_total", "_count", "_sum", "_bucket")

_LABEL_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_AGGREGATIONS: Mapping[Aggregation, str] = {
    Aggregation.AVG: "avg_over_time",
    Aggregation.MIN: "min_over_time",
    Aggregation.MAX: "max_over_time",
    Aggregation.SUM: "sum_over_time",
    Aggregation.COUNT: "count_over_time",
    Aggregation.LAST: "last_over_time",
    Aggregation.QUANTILE: "quantile_over_time",
}
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal: backslash, quote and control
    characters escaped; everything else (UTF-8 included) as is."""
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def label_name(name: str) -> str:
    """``name`` as a label name in a ``by (...)`` clause, which PromQL 2 cannot quote: only
    names of the classic form pass."""
    if not _LABEL_NAME.fullmatch(name):
        raise ValueError(f"label name {name!r} cannot be grouped by in PromQL")
    return name


def selector(
    project_label: str, project_id: int, metric: str | None, matchers: Sequence[Matcher]
) -> str:
    """The PromQL selector of a project's series named ``metric`` (any if ``None``) that
    satisfy ``matchers``. Names go in ``{__name__="..."}`` so any metric name is safe."""
    parts = [f"{project_label}={promql_string(str(project_id))}"]
    if metric is not None:
        parts.append(f"{METRIC_LABEL}={promql_string(metric)}")
    for matcher in matchers:
        if not _LABEL_NAME_RE.fullmatch(matcher.name):
            raise ValueError(f"label name {matcher.name!r} cannot be used in a PromQL matcher")
        parts.append(f"{matcher.name}{MatchOp(matcher.op).value}{promql_string(matcher.value)}")
    return "{" + ", ".join(parts) + "}"


def duration(milliseconds: int) -> str:
    """A PromQL duration: whole seconds as ``60s``, otherwise milliseconds."""
    if milliseconds % 1000 == 0:
        return f"{milliseconds // 1000}s"
    return f"{milliseconds}ms"


def over_time(aggregation: Aggregation, sel: str, window_ms: int, q: float | None) -> str:
    """The ``*_over_time`` expression of an aggregation over ``[t - window, t)``."""
    function = _AGGREGATIONS[Aggregation(aggregation)]
    ranged = f"{sel}[{duration(window_ms)}] offset {EDGE_SHIFT}"
    if aggregation is Aggregation.QUANTILE:
        return f"{function}({float(q or 0.0)!r}, {ranged})"
    return f"{function}({ranged})"


def counter(function: str, sel: str, window_s: int) -> str:
    """``rate`` or ``increase`` over ``[t - window, t)``."""
    return f"{function}({sel}[{window_s}s] offset {EDGE_SHIFT})"


def latest_time(sel: str, lookback_ms: int) -> str:
    """The time of each series' newest sample within the lookback: ``timestamp()`` of the
    selector where the TSDB's own lookback delta still finds the sample, else the newest of a
    subquery's timestamps (``timestamp(last_over_time(...))`` would give the evaluation time)."""
    window = duration(lookback_ms)
    return f"timestamp({sel}) or max_over_time(timestamp({sel})[{window}:{SUBQUERY_STEP}])"


def series_kind(metric: str) -> SeriesKind:
    """A TSDB keeps no kind: counter if the name ends as Prometheus' counters and the
    counter-like parts of histograms and summaries do, else gauge."""
    return SeriesKind.COUNTER if metric.endswith(COUNTER_SUFFIXES) else SeriesKind.GAUGE


def series_id(metric: str, labels: Mapping[str, str]) -> int:
    """A stable 63-bit id: the first 16 hex digits of the store's fingerprint, shifted right
    once so it is a positive signed 64-bit integer. The same series has the same id in every
    process and every TSDB."""
    return int(fingerprint(metric, labels)[:16], 16) >> 1


def series_info(metric: str, labels: Mapping[str, str]) -> SeriesInfo:
    return SeriesInfo(series_id(metric, labels), metric, dict(labels), series_kind(metric))


def own_labels(raw: Mapping[str, str], project_label: str) -> dict[str, str]:
    """A TSDB's label set without the name and the project label."""
    return {k: v for k, v in raw.items() if k not in (METRIC_LABEL, project_label)}


def unix_seconds(when: datetime | int) -> str:
    """A time (or milliseconds since the epoch) as the HTTP API's seconds, to the ms."""
    millis = when if isinstance(when, int) else to_millis(when)
    return f"{millis // 1000}.{millis % 1000:03d}"


def to_millis(when: datetime) -> int:
    """Milliseconds since the epoch, rounded down (remote write carries milliseconds)."""
    return to_micros(when) // 1000


def from_seconds(seconds: float) -> datetime:
    """An answer's time (seconds with millisecond precision) as an aware datetime."""
    return from_micros(round(seconds * 1000) * 1000)
