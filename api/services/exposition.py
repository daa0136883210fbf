"""A project's latest values in the Prometheus text format (0.0.4), so an existing Prometheus
can scrape tuneloop as it federates another Prometheus.

Names are the stored ones: series received over OTLP already carry the OpenTelemetry-to-
Prometheus translation (``collector/otlp/names.py``) and collected GPU and host series carry
dcgm-exporter's and node-exporter's names, so dashboards written against those exporters keep
working. A name or label name the Prometheus format cannot carry (a relabel rule can make one)
is sanitized with the same rules as the OTLP receiver's: words split at anything but letters
and digits, joined with ``_``; a leading digit gets a prefix; label names starting with ``__``
(reserved) get ``key``. A name with letters outside ASCII (``ünïcödé``) is written with
Prometheus' ``U__`` escaping (``U___fc_n_ef_c_f6_d_e9_``), which the 0.0.4 format can carry.
Should two series end up with the same name and labels, the first (by metric name, then series
id) is kept.

Each sample carries its own timestamp: a value scraped twice is one sample in Prometheus, and
the scraped series match the store exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime

from collector.otlp.labels import label_name
from collector.otlp.names import NameKind, escape_legacy, metric_name
from tuneloop.storage.timeseries.types import LatestSample, SeriesInfo, SeriesKind
from tuneloop.storage.types import to_micros

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def exposition_name(metric: str) -> str:
    """``metric`` if Prometheus accepts it, else its sanitized form (no suffixes added)."""
    if _METRIC_NAME.fullmatch(metric):
        return metric
    return escape_legacy(metric_name(metric, "", NameKind.OTHER) or "_")


def exposition_label(name: str) -> str:
    if _LABEL_NAME.fullmatch(name) and not name.startswith("__"):
        return name
    return label_name(name) or "key_"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value))


def _labels(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    renamed: dict[str, str] = {}
    for name, value in sorted(labels.items()):
        renamed.setdefault(exposition_label(name), value)
    return tuple(sorted(renamed.items()))


ALERTS = "ALERTS"


def alerts_samples(alerts: Iterable[tuple[Mapping[str, str], datetime]]) -> list[LatestSample]:
    """Prometheus's ``ALERTS`` series: 1 per pending or firing alert, with its labels and
    ``alertstate``, stamped with its last evaluation."""
    return [
        LatestSample(SeriesInfo(0, ALERTS, labels, SeriesKind.GAUGE), ts, 1.0)
        for labels, ts in alerts
    ]


def render(latest: Iterable[LatestSample]) -> str:
    """The text exposition of ``latest``, one family per metric name."""
    families: dict[str, tuple[set[SeriesKind], list[str]]] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for sample in latest:
        name = exposition_name(sample.series.metric)
        labels = _labels(sample.series.labels)
        if (name, labels) in seen:
            continue
        seen.add((name, labels))
        kinds, lines = families.setdefault(name, (set(), []))
        kinds.add(sample.series.kind)
        text = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
        selector = f"{name}{{{text}}}" if text else name
        millis = to_micros(sample.ts) // 1000
        lines.append(f"{selector} {_value(sample.value)} {millis}")
    out = []
    for name, (kinds, lines) in sorted(families.items()):
        kind = kinds.pop().value if len(kinds) == 1 else "untyped"
        out.append(f"# TYPE {name} {kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""
