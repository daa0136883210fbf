"""The Prometheus backend's parts that need no TSDB: generated PromQL (parsed back by a real
PromQL parser), the bucket plan, ids and kinds, HTTP status mapping, and the one factory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import promql_parser
import pytest
from sqlalchemy import create_engine

from tests.timeseries_contract.test_contract import HOSTILE
from tuneloop.errors import InvalidInput, Unavailable
from tuneloop.settings import SettingsError, load_settings
from tuneloop.storage.prometheus import queries
from tuneloop.storage.prometheus.backend import PrometheusBackend
from tuneloop.storage.prometheus.grid import Buckets, Edge, Windows
from tuneloop.storage.timeseries.backends import open_backend
from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.store_backend import StoreBackend
from tuneloop.storage.timeseries.types import Aggregation, Matcher, MatchOp, SeriesKind

_OPS = {"Equal": MatchOp.EQ, "NotEqual": MatchOp.NE, "Re": MatchOp.RE, "NotRe": MatchOp.NRE}
MORE_HOSTILE = [*HOSTILE, "\x00nul\x7fdel", "\\n not a newline", "`back`ticks`", "}", ""]


def parsed_matchers(text: str) -> list[Matcher]:
    expression = promql_parser.parse(text)
    return [
        Matcher(m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value)
        for m in expression.matchers.matchers
    ]


@pytest.mark.parametrize("value", MORE_HOSTILE)
@pytest.mark.parametrize("op", list(MatchOp))
def test_selectors_carry_hostile_values_verbatim(value: str, op: MatchOp) -> None:
    if op in (MatchOp.RE, MatchOp.NRE) and value and not value.isalnum():
        value = "x"  # regexes are for the TSDB to judge; their escaping is the same code
    text = queries.selector("tuneloop_project", 42, value or "m", [Matcher("v", op, value)])
    assert parsed_matchers(text) == [
        Matcher("tuneloop_project", MatchOp.EQ, "42"),
        Matcher("__name__", MatchOp.EQ, value or "m"),
        Matcher("v", op, value),
    ]
    # The project's own parser reads the same string back, too.
    assert parse_matcher("v=" + queries.promql_string(value)).value == value


def test_a_label_name_promql_cannot_spell_is_refused() -> None:
    with pytest.raises(ValueError, match=r"k8s\.pod"):
        queries.selector("tuneloop_project", 1, None, [Matcher("k8s.pod", MatchOp.EQ, "x")])


def test_generated_expressions_parse() -> None:
    sel = queries.selector("tuneloop_project", 1, "m", [])
    for aggregation in Aggregation:
        q = 0.9 if aggregation is Aggregation.QUANTILE else None
        promql_parser.parse(queries.over_time(aggregation, sel, 60_500, q))
    promql_parser.parse(queries.counter("rate", sel, 60))
    promql_parser.parse(queries.latest_time(sel, 86_400_001))


def test_ids_are_stable_63_bit_and_kinds_follow_the_name() -> None:
    first = queries.series_id("m", {"a": "1", "b": "2"})
    assert first == queries.series_id("m", {"b": "2", "a": "1"})
    assert 0 <= first < 2**63
    assert first != queries.series_id("m", {"a": "1"})
    assert [queries.series_kind(n) for n in ("x_total", "x_count", "x_sum", "x_bucket")] == [
        SeriesKind.COUNTER
    ] * 4
    assert queries.series_kind("gpu_util") is SeriesKind.GAUGE


T = datetime(2026, 1, 1, tzinfo=UTC)


def test_buckets_cut_at_both_ends_are_instant_queries() -> None:
    plan = Buckets.of(T + timedelta(seconds=25), T + timedelta(seconds=335), 60)
    ms = int(T.timestamp() * 1000)
    assert plan.full == (ms + 120_000, ms + 300_000)  # buckets 60..240 end at 120..300
    assert plan.edges == (
        Edge(label_ms=ms, eval_ms=ms + 60_000, window_ms=35_000),
        Edge(label_ms=ms + 300_000, eval_ms=ms + 335_000, window_ms=35_000),
    )
    inside = Buckets.of(T + timedelta(seconds=1), T + timedelta(seconds=2), 10**9)
    assert inside.full is None and len(inside.edges) == 1 and inside.edges[0].window_ms == 1000
    aligned = Buckets.of(T, T + timedelta(minutes=10), 60)
    assert aligned.full == (ms + 60_000, ms + 600_000) and aligned.edges == ()


def test_windows_end_at_each_bucket_end() -> None:
    windows = Windows.of(T + timedelta(seconds=5), T + timedelta(seconds=125), 60, 300)
    ms = int(T.timestamp() * 1000)
    assert windows.evaluations == (ms + 60_000, ms + 180_000)
    assert windows.read_from == T - timedelta(seconds=240)
    with pytest.raises(ValueError):
        Windows.of(T, T + timedelta(seconds=60), 60, 0)


class _Answer(BaseHTTPRequestHandler):
    status = 503

    def do_POST(self) -> None:
        body = b'{"status":"error","errorType":"x","error":"the reason"}'
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    # Polled every 50 ms: shutdown() waits for the next poll (0.5 s by default).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (503, Unavailable),
        (500, Unavailable),
        (429, Unavailable),
        (400, InvalidInput),
        (422, InvalidInput),
    ],
)
def test_statuses_map_to_error_kinds(
    answering: ThreadingHTTPServer, status: int, kind: type[Exception]
) -> None:
    answering.status = status  # type: ignore[attr-defined]
    backend = PrometheusBackend(f"http://127.0.0.1:{answering.server_address[1]}")
    try:
        with pytest.raises(kind, match="the reason"):
            backend.find_series(1, "m")
    finally:
        backend.close()


def test_one_factory_picks_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = create_engine("sqlite://")
    assert isinstance(open_backend(load_settings(), engine), StoreBackend)
    monkeypatch.setenv("TUNELOOP_TSDB_URL", "http://127.0.0.1:8428/")
    monkeypatch.setenv("TUNELOOP_TSDB_BEARER_TOKEN", "s3cret")
    settings = load_settings()
    assert "s3cret" not in repr(settings)
    remote = open_backend(settings, engine)
    assert isinstance(remote, PrometheusBackend)
    assert remote.client.url == "http://127.0.0.1:8428"
    remote.close()
    monkeypatch.setenv("TUNELOOP_TSDB_URL", "localhost:8428")
    with pytest.raises(SettingsError, match="TUNELOOP_TSDB_URL"):
        load_settings()
    engine.dispose()
