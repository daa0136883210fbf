"""A real Prometheus remote-writes into tuneloop: after a few scrapes, the series Prometheus
returns for a range selector over its own API equal what tuneloop stored (names, labels,
samples with their timestamps), for the window both hold."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy import Engine

from tests.api.conftest import Minter
from tests.helpers import wait_for
from tests.peers import prom_api, running_prometheus
from tests.remote_write.conftest import Stored, stored_series


def prometheus_series(url: str, at_s: float) -> Stored:
    """Every series Prometheus holds, with its samples of the hour up to ``at_s``."""
    result = prom_api(
        url, "/api/v1/query", {"query": '{__name__=~".+"}[1h]', "time": f"{at_s:.3f}"}
    )
    out: Stored = {}
    for item in result["result"]:
        labels = dict(item["metric"])
        metric = labels.pop("__name__")
        key = (metric, frozenset(labels.items()))
        out[key] = [(round(float(ts) * 1000), float(value)) for ts, value in item["values"]]
    return out


def scrapes(url: str) -> int:
    result = prom_api(url, "/api/v1/query", {"query": "count_over_time(up[1m])"})["result"]
    return int(result[0]["value"][1]) if result else 0


def up_to(stored: Stored, last_ms: int) -> Stored:
    cut = {key: [(ts, v) for ts, v in samples if ts <= last_ms] for key, samples in stored.items()}
    return {key: samples for key, samples in cut.items() if samples}


def test_prometheus_remote_writes_what_it_stores(
    server: str, engine: Engine, mint: Minter, tmp_path: Path
) -> None:
    project_id = mint.project("fleet")
    token = mint.token("fleet", "agent", "prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        # Something real to scrape: tuneloop's own /metrics.
        "scrape_configs": [
            {"job_name": "tuneloop", "static_configs": [{"targets": [urlsplit(server).netloc]}]}
        ],
        "remote_write": [
            {
                "url": f"{server}/api/v1/write",
                "authorization": {"credentials": token},
                "queue_config": {"batch_send_deadline": "500ms", "max_backoff": "1s"},
            }
        ],
    }
    with running_prometheus(config, tmp_path / "prometheus") as prometheus:
        wait_for(lambda: scrapes(prometheus) >= 4, 30, "four scrapes", every_s=0.5)
        at_s = time.time() - 1.0
        expected = prometheus_series(prometheus, at_s)
        last_ms = int(at_s * 1000)
        # Remote write lags a scrape or two behind (batches, shards): wait until tuneloop holds
        # the window, then compare (a difference that lasts shows in the asserts below).
        deadline = time.monotonic() + 30
        while (stored := up_to(stored_series(engine, project_id), last_ms)) != expected:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert expected, "Prometheus scraped nothing"
    assert set(stored) == set(expected)
    for key, samples in expected.items():
        assert stored[key] == samples, key
