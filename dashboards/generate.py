"""Builds the Grafana dashboards in this folder from code: ``python -m dashboards.generate``.

The JSON files are checked in (Grafana provisions them as they are); a test fails when they
differ from what this module builds, so edit here and regenerate.

Every panel reads the store through the PostgreSQL data source. Time series come from
``tuneloop_series`` (see migrations 0005 and 0007), which picks raw samples, ``samples_1m`` or
``samples_1h`` by the panel's interval and range and aggregates each series per time bucket
of the panel's interval, so the panel SQL only selects and names: its time is the bucket itself
(``$__time(bucket)``, a timestamp), not ``$__timeGroupAlias``, which would recompute the same
bucket as a ``numeric`` for every row.
Template variables reach SQL only as ``${var:sqlstring}``: each value is quoted and its quotes
doubled, never pasted as raw text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from dashboards.board import Board
from dashboards.boards.alerts import alerts
from dashboards.boards.cost import cost
from dashboards.boards.fleet import fleet
from dashboards.boards.fleet_prometheus import fleet_prometheus
from dashboards.boards.job import job
from dashboards.boards.tuner import tuner

__all__ = [
    "BOARDS",
    "alerts",
    "cost",
    "fleet",
    "fleet_prometheus",
    "job",
    "main",
    "render",
    "tuner",
]

HERE = Path(__file__).resolve().parent

BOARDS: dict[str, Callable[[], Board]] = {
    "fleet": fleet,
    "fleet-prometheus": fleet_prometheus,
    "job": job,
    "tuner": tuner,
    "alerts": alerts,
    "cost": cost,
}


def render(name: str) -> str:
    return json.dumps(BOARDS[name]().to_json(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    for name in BOARDS:
        (HERE / f"{name}.json").write_text(render(name))


if __name__ == "__main__":
    main()
