"""The dcgm-exporter captures of tests/collector/fixtures served over HTTP, one page per host,
and scraped by the collector's scrape source into a store, as a fleet of four hosts."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

from sqlalchemy import Engine

from collector.points import to_batches
from collector.sources.dcgm_fields import is_blank
from collector.sources.scrape import ScrapeError, ScrapeSource
from tuneloop.storage.timeseries.writer import SampleWriter

FIXTURES = Path(__file__).resolve().parent / "collector/fixtures"
PAGES = {
    "lke529760-766837-0a634ab30000": "dcgm-exporter-k8s-rtx4000ada.txt",
    "msxf-hpc-64-35-ai": "dcgm-exporter-mig-a800.txt",
    "gpu-node-17": "dcgm-exporter-metrics.txt",  # the newer exporters' `hostname`
    "gpu-node-42": "dcgm-exporter-hostname-mig-xid.txt",
}
"""Host -> the capture its exporter answers with."""


class _Pages(BaseHTTPRequestHandler):
    down: ClassVar[set[str]] = set()

    def do_GET(self) -> None:
        host = self.path.strip("/")
        if host not in PAGES or host in self.down:
            self.send_error(503)
            return
        body = (FIXTURES / PAGES[host]).read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def serving_pages() -> Iterator[tuple[str, set[str]]]:
    """An exporter per host at ``<base>/<host>``: the base URL, and the set of hosts that
    answer 503 (add one to take it down)."""
    down: set[str] = set()
    handler = type("Pages", (_Pages,), {"down": down})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", down
    finally:
        server.shutdown()
        server.server_close()


class FleetScraper:
    """One scrape source per host, writing what each scrape returns into a project."""

    def __init__(self, engine: Engine, project_id: int, base: str) -> None:
        self.project_id = project_id
        self.writer = SampleWriter(engine)
        self.sources = {host: ScrapeSource(f"{base}/{host}", timeout_s=5) for host in PAGES}

    def scrape(self, now: datetime) -> None:
        """Scrape every host that answers; a host that does not is skipped, as the collector
        skips it."""
        for source in self.sources.values():
            try:
                points = source.collect(now)
            except ScrapeError:
                continue
            result = self.writer.write(self.project_id, to_batches(points))
            assert not result.rejected, result.rejected

    def close(self) -> None:
        for source in self.sources.values():
            source.shutdown()


@contextmanager
def scraping(engine: Engine, project_id: int, base: str) -> Iterator[FleetScraper]:
    scraper = FleetScraper(engine, project_id, base)
    try:
        yield scraper
    finally:
        scraper.close()


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def captured(metric: str, hosts: list[str] | None = None) -> list[dict[str, str]]:
    """The label sets of ``metric`` in the pages of ``hosts`` (default: all), read from the
    text independently of the collector and named as docs/labels.md stores them: ``hostname``
    spelled ``Hostname``, empty labels absent, DCGM's "no value" samples left out."""
    found = []
    for host, page in PAGES.items():
        if hosts is not None and host not in hosts:
            continue
        for line in (FIXTURES / page).read_text().splitlines():
            match = _SAMPLE.match(line)
            if line.startswith("#") or match is None or match.group(1) != metric:
                continue
            value = match.group(3)
            if is_blank(int(value) if value.isdigit() else float(value)):
                continue
            labels = dict(_LABEL.findall(match.group(2) or ""))
            if "hostname" in labels:
                labels["Hostname"] = labels.pop("hostname")
            found.append({name: text for name, text in labels.items() if text})
    return found
