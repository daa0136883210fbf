"""Scrape a Prometheus exposition endpoint (dcgm-exporter, node-exporter, ...) into Points.

Parsing uses prometheus-client's parsers, OpenMetrics when the response says so. Real exporters
emit things those parsers reject (one malformed line fails the whole text), so on a failure the
text is parsed again line by line, keeping every good sample and counting the lines dropped;
the ``# TYPE`` lines are read separately so types survive the line-by-line pass.

Names stay as emitted: prometheus-client's text parser appends ``_total`` to samples of a counter
declared without it (dcgm-exporter's ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``); that is undone,
or dcgm-exporter's dashboards would not find their series. Kinds: samples of counter families,
of untyped families ending in ``_total``, and histogram/summary ``_bucket``/``_count``/``_sum``
are counters; the rest are gauges. Sample timestamps are kept when present, else ``now``.

Labels with an empty value are dropped, as Prometheus does (``pod=""`` is no pod). Samples of
dcgm-exporter's families (``DCGM_*``) are brought to tuneloop's label vocabulary (see
``collector.sources.gpu_labels``): the newer exporters' ``hostname`` becomes ``Hostname``, and
DCGM's blank sentinels (``9223372036854775794``, "not supported", printed as a temperature by
some exporter versions) are dropped, counted with the unusable samples.

HTTP errors, timeouts and refused connections raise ``ScrapeError`` so the runner records the
source as down.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.parser import text_string_to_metric_families

from collector.points import Point
from collector.sources.dcgm_fields import DCGM_PREFIX, is_blank_reading
from collector.sources.gpu_labels import normalize_host, present
from tuneloop.storage.timeseries.types import SeriesKind

log = logging.getLogger(__name__)

ACCEPT = "text/plain; version=0.0.4"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text"

_CUMULATIVE_SUFFIXES = ("_bucket", "_count", "_sum")
_FAMILY_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created", "_gcount", "_gsum", "_info")


class ScrapeError(ConnectionError):
    """The endpoint could not be scraped (connection refused, timeout, HTTP error status)."""


@dataclass(slots=True)
class ParseResult:
    points: list[Point] = field(default_factory=list)
    dropped_lines: int = 0
    dropped_samples: int = 0  # parsed but unusable: NaN/Inf values, native histograms


def parse_exposition(
    text: str,
    now: datetime,
    *,
    openmetrics: bool = False,
    extra_labels: Mapping[str, str] | None = None,
) -> ParseResult:
    """Points from a Prometheus (or OpenMetrics) exposition text; never raises on bad input."""
    declared = _declared_types(text)
    result = ParseResult()
    try:
        families = list(_parse_whole(text, openmetrics))
        # Only the text parser's own counter families carry its _total renaming.
        undo_total = not openmetrics
    except Exception as exc:  # the parsers raise ValueError, IndexError, TypeError...
        log.debug("whole-text parse failed (%s); parsing line by line", exc)
        families = list(_parse_by_line(text, result))
        undo_total = False
    for family in families:
        for sample in family.samples:
            name = sample.name
            if undo_total and family.type == "counter":
                name = _emitted_name(name, declared)
            family_type = family.type
            if family_type in ("untyped", "unknown"):
                family_type = _declared_type(name, declared)
            point = _to_point(sample, name, family_type, now, extra_labels)
            if point is None:
                result.dropped_samples += 1
            else:
                result.points.append(point)
    return result


def _parse_whole(text: str, openmetrics: bool) -> Iterable[Any]:
    if openmetrics:
        body = text if text.rstrip().endswith("# EOF") else text.rstrip("\n") + "\n# EOF\n"
        families: Iterable[Any] = openmetrics_parser.text_string_to_metric_families(body)  # type: ignore[no-untyped-call]
        return families
    return text_string_to_metric_families(text)


def _parse_by_line(text: str, result: ParseResult) -> Iterator[Any]:
    """Each sample line on its own, as an untyped family; types come from ``# TYPE`` lines."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except Exception:
            result.dropped_lines += 1
            continue
        yield from families


def _declared_types(text: str) -> dict[str, str]:
    types: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[1] == "TYPE":
            types[parts[2]] = parts[3].strip().lower()
    return types


def _declared_type(sample_name: str, declared: Mapping[str, str]) -> str:
    if sample_name in declared:
        return declared[sample_name]
    for suffix in _FAMILY_SUFFIXES:
        if sample_name.endswith(suffix):
            base = sample_name[: -len(suffix)]
            if base in declared:
                return declared[base]
    return "untyped"


def _emitted_name(name: str, declared: Mapping[str, str]) -> str:
    # prometheus-client's text parser renames samples of "# TYPE x counter" to x_total; the
    # exporter sent x. (OpenMetrics counters are sent as x_total: nothing to undo there.)
    if name.endswith("_total"):
        base = name[:-6]
        if declared.get(base) == "counter" and name not in declared:
            return base
    return name


def _kind(name: str, family_type: str) -> SeriesKind:
    if family_type == "counter":
        return SeriesKind.COUNTER
    if family_type in ("histogram", "summary") and name.endswith(_CUMULATIVE_SUFFIXES):
        return SeriesKind.COUNTER
    if family_type in ("untyped", "unknown") and name.endswith("_total"):
        return SeriesKind.COUNTER
    return SeriesKind.GAUGE


def _timestamp(raw: Any, now: datetime) -> datetime:
    if raw is None:
        return now
    try:
        seconds = raw.sec + raw.nsec / 1e9 if hasattr(raw, "sec") else float(raw)
        return datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError, TypeError):
        return now


def _to_point(
    sample: Any,
    name: str,
    family_type: str,
    now: datetime,
    extra_labels: Mapping[str, str] | None,
) -> Point | None:
    value = sample.value
    if value is None or getattr(sample, "native_histogram", None) is not None:
        return None
    number = float(value)
    if not math.isfinite(number):
        return None
    labels = present(sample.labels)
    if name.startswith(DCGM_PREFIX):
        if is_blank_reading(number):
            return None
        labels = normalize_host(labels)
    if extra_labels:
        for key, label_value in extra_labels.items():
            if key in labels:  # as Prometheus does: the exporter's own value is kept aside
                labels[f"exported_{key}"] = labels[key]
            labels[key] = label_value
    return Point(name, labels, _timestamp(sample.timestamp, now), number, _kind(name, family_type))


class ScrapeSource:
    """Polls one ``/metrics`` URL. ``client`` is an httpx.Client passed in (tests, shared
    pools); without one the source opens its own at ``start`` and closes it at ``shutdown``."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 5.0,
        client: httpx.Client | None = None,
        relabel_instance: bool = True,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"scrape URL must be http(s)://host[:port]/path, got {url!r}")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.name = f"scrape:{url}"
        self.url = url
        self._timeout_s = timeout_s
        self._client = client
        self._owns_client = False
        self._extra_labels = {"instance": parts.netloc} if relabel_instance else None
        self.dropped_lines = 0
        self.dropped_samples = 0

    def start(self) -> None:
        if self._client is None:
            self._client = httpx.Client(timeout=self._timeout_s, follow_redirects=True)
            self._owns_client = True

    def collect(self, now: datetime) -> list[Point]:
        if self._client is None:
            self.start()
        assert self._client is not None
        try:
            response = self._client.get(
                self.url, headers={"Accept": ACCEPT}, timeout=self._timeout_s
            )
            response.raise_for_status()
            text = response.text
        except httpx.HTTPError as exc:
            raise ScrapeError(f"scraping {self.url} failed: {exc}") from exc
        content_type = response.headers.get("content-type", "")
        result = parse_exposition(
            text,
            now,
            openmetrics=OPENMETRICS_CONTENT_TYPE in content_type,
            extra_labels=self._extra_labels,
        )
        if result.dropped_lines:
            log.warning("%s: dropped %d malformed lines", self.url, result.dropped_lines)
        self.dropped_lines += result.dropped_lines
        self.dropped_samples += result.dropped_samples
        return result.points

    def shutdown(self) -> None:
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None
            self._owns_client = False
