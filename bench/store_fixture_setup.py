"""What a test's empty store costs to set up (tests/fresh_store.py), the way the suite sets it
up now against the way it did: on PostgreSQL, emptying the models' tables against dropping the
schema and running ``create_all``; on SQLite, copying a file made once against ``create_all``.

Each repeat first leaves what a test leaves (a project, a token, samples in two days'
partitions), then times one setup of each kind, in alternating order; the ratio of each pair
(new / old) is reported as a median with a 95% interval (order statistics), with the machine's
load. A scratch PostgreSQL database is created and dropped::

    .venv/bin/python bench/store_fixture_setup.py --repeats 20
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from storage_write import DEFAULT_URL, scratch_database

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fresh_store import copy_sqlite, models_schema, reset_postgres, sqlite_template
from tuneloop import accounts
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter


def leave_rows(url: str) -> None:
    """What a typical storage test leaves behind."""
    engine = make_engine(url)
    try:
        with session_scope(session_factory(engine)) as session:
            project = accounts.create_project(session, "alpha")
            accounts.create_token(session, project, "t", "member")
            project_id = project.id
        start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
        times = [start + timedelta(hours=h) for h in range(0, 48, 6)]
        batch = SeriesBatch(
            "tl_gpu_util", {"gpu": "0"}, times, [1.0] * len(times), SeriesKind.GAUGE
        )
        SampleWriter(engine).write(project_id, [batch])
    finally:
        engine.dispose()


def timed(setup: Callable[[], None]) -> float:
    started = time.perf_counter()
    setup()
    return time.perf_counter() - started


def median_interval(values: list[float]) -> tuple[float, float, float]:
    """Median and its 95% interval from order statistics (normal approximation)."""
    ordered = sorted(values)
    n = len(ordered)
    half = 1.96 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return statistics.median(ordered), ordered[low], ordered[high]


def run(name: str, old: Callable[[], None], new: Callable[[], None], leave: Callable[[], None],
        repeats: int) -> None:  # fmt: skip
    olds, news, ratios = [], [], []
    for repeat in range(repeats):
        pair = {}
        for kind in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
            leave()
            pair[kind] = timed(old if kind == "old" else new)
        olds.append(pair["old"])
        news.append(pair["new"])
        ratios.append(pair["new"] / pair["old"])
    ratio, low, high = median_interval(ratios)
    print(
        f"{name}: old median {statistics.median(olds) * 1000:.0f} ms, new median "
        f"{statistics.median(news) * 1000:.0f} ms; new / old {ratio:.3f} "
        f"(95% interval {low:.3f} .. {high:.3f}, {repeats} pairs), load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--url", default=DEFAULT_URL, help="PostgreSQL server (a scratch db)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load at the start {os.getloadavg()[0]:.1f}")

    with scratch_database(args.url) as url:

        def old_postgres() -> None:
            reset_postgres(url)
            engine = make_engine(url)
            metadata.create_all(engine)
            engine.dispose()

        models_schema(url)  # the fingerprint, as the suite's first test takes it
        run("PostgreSQL", old_postgres, lambda: models_schema(url), lambda: leave_rows(url),
            args.repeats)  # fmt: skip

    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        template = sqlite_template(directory / "template.db")
        target = directory / "test.db"

        def fresh_target() -> None:
            for leftover in directory.glob("test.db*"):
                leftover.unlink()

        def old_sqlite() -> None:
            engine = make_engine(f"sqlite:///{target}")
            metadata.create_all(engine)
            engine.dispose()

        def new_sqlite() -> None:
            assert copy_sqlite(template, target)

        run("SQLite", old_sqlite, new_sqlite, fresh_target, args.repeats)


if __name__ == "__main__":
    main()
