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
the scraped series match the store exactly. Histograms and summaries are stored as their classic
series (``_bucket`` with ``le``, quantiles, ``_sum``, ``_count``) and rendered as one family of
their type again; every family has a HELP line (dcgm-exporter's for DCGM fields), so
``promtool check metrics`` finds nothing the exporters' own pages do not have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache

from collector.otlp.labels import label_name
from collector.otlp.names import NameKind, escape_legacy, metric_name
from collector.sources.dcgm_fields import load_counters
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
    """The text exposition of ``latest``: one family per metric name, except that a
    histogram's ``_bucket``/``_sum``/``_count`` and a summary's quantiles, ``_sum`` and
    ``_count`` form one family typed as such; every family has a HELP line."""
    names: dict[str, _Name] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for sample in latest:
        name = exposition_name(sample.series.metric)
        labels = _labels(sample.series.labels)
        if (name, labels) in seen:
            continue
        seen.add((name, labels))
        entry = names.setdefault(name, _Name())
        entry.kinds.add(sample.series.kind)
        bounds = dict(labels)
        entry.all_le &= _is_number(bounds.get("le"))
        entry.all_quantile &= _is_number(bounds.get("quantile"))
        text = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
        selector = f"{name}{{{text}}}" if text else name
        millis = to_micros(sample.ts) // 1000
        entry.lines.append(f"{selector} {_value(sample.value)} {millis}")
    out = []
    for family, kind, members in sorted(families(names)):
        out.append(f"# HELP {family} {_escape_help(help_text(family))}")
        out.append(f"# TYPE {family} {kind}")
        for member in members:
            out.extend(names[member].lines)
    return "\n".join(out) + "\n" if out else ""


@dataclass(slots=True)
class _Name:
    """The rendered lines of one metric name and what its series have in common."""

    kinds: set[SeriesKind] = field(default_factory=set)
    lines: list[str] = field(default_factory=list)
    all_le: bool = True
    all_quantile: bool = True


def families(names: Mapping[str, _Name]) -> list[tuple[str, str, list[str]]]:
    """``(family, type, member names)``: ``X_bucket`` (every series with ``le``) makes
    histogram ``X`` with ``X_sum`` and ``X_count``; ``X`` with ``quantile`` on every series
    makes summary ``X`` with ``X_sum`` and ``X_count``; any other name is a family of its own,
    typed by its series (``untyped`` when they disagree)."""
    grouped: list[tuple[str, str, list[str]]] = []
    taken: set[str] = set()
    for name, entry in names.items():
        if name.endswith("_bucket") and entry.all_le and name[: -len("_bucket")] not in names:
            base, kind, first = name[: -len("_bucket")], "histogram", name
        elif entry.all_quantile and not name.endswith(("_sum", "_count")):
            base, kind, first = name, "summary", name
        else:
            continue
        members = [first] + [m for m in (f"{base}_sum", f"{base}_count") if m in names]
        taken.update(members)
        grouped.append((base, kind, members))
    for name, entry in names.items():
        if name not in taken:
            kind = next(iter(entry.kinds)).value if len(entry.kinds) == 1 else "untyped"
            grouped.append((name, kind, [name]))
    return grouped


def help_text(family: str) -> str:
    """dcgm-exporter's help for a DCGM field, Prometheus's meaning of ``ALERTS``, else what the
    family is: the newest stored sample of each series."""
    if family == ALERTS:
        return "Alerts pending or firing: 1 per alert, with its labels and alertstate."
    return _dcgm_help().get(family) or f"{family}: the newest sample tuneloop stores per series."


@cache
def _dcgm_help() -> dict[str, str]:
    return {f.name: f.help for f in load_counters() if f.help and not f.is_label}


def _is_number(text: str | None) -> bool:
    """A bucket bound or quantile the text format can carry (``+Inf`` included)."""
    try:
        float(text or "")
    except ValueError:
        return False
    return True


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
