"""Does the writer's garbage-collector pause still pay? ``SampleWriter.write`` disables the
cyclic collector for its length; this times the same writes with and without that pause.

The case it is for: batches of one sample each (what a periodic exporter's request becomes on
the point-by-point path), 1,000 a write, into PostgreSQL, in a process that holds a large heap
(100,000 label dicts, a receiver's label cache at its bound), so that a collection costs what
it costs in a long-running API process. Interleaved, median of the repeats; a scratch database
is created and dropped::

    .venv/bin/python bench/writer_gc_pause.py
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock

from storage_write import DEFAULT_URL, machine, scratch_database

from tuneloop import accounts
from tuneloop.storage import make_engine, session_factory, session_scope
from tuneloop.storage.models import metadata
from tuneloop.storage.timeseries import writer as writer_module
from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind
from tuneloop.storage.timeseries.writer import SampleWriter

# What the writer sees as ``gc`` when the pause is taken out: the calls do nothing.
NO_PAUSE = SimpleNamespace(isenabled=lambda: False, disable=lambda: None, enable=lambda: None)


class GcClock:
    """Seconds the collector ran since the last :meth:`take`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def _callback(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def writes(count: int, series: int, start: datetime) -> list[list[SeriesBatch]]:
    return [
        [
            SeriesBatch(
                "gpu_utilization_ratio",
                {"gpu": str(index), "host": f"node-{index // 8}", "job": "trainer"},
                [start + timedelta(seconds=15 * tick)],
                [float(tick)],
                SeriesKind.GAUGE,
            )
            for index in range(series)
        ]
        for tick in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--writes", type=int, default=50)
    parser.add_argument("--series", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    heap = [{f"label{i}": f"value-{j}-{i}" for i in range(12)} for j in range(100_000)]
    clock = GcClock()
    start = datetime.now(UTC) - timedelta(hours=2)
    times: dict[str, list[float]] = {"with the pause": [], "without": []}
    collecting: dict[str, list[float]] = {name: [] for name in times}
    with scratch_database(args.database_url) as url:
        engine = make_engine(url)
        try:
            metadata.create_all(engine)
            with session_scope(session_factory(engine)) as session:
                project_id = accounts.create_project(session, "bench").id
            writer = SampleWriter(engine)
            writer.write(project_id, writes(1, args.series, start)[0])  # series exist
            for _ in range(args.repeats):
                for name in times:
                    work = writes(args.writes, args.series, start)
                    pause = (
                        contextlib.nullcontext()
                        if name == "with the pause"
                        else mock.patch.object(writer_module, "gc", NO_PAUSE)
                    )
                    clock.take()
                    with pause:
                        started = time.perf_counter()
                        for batches in work:
                            writer.write(project_id, batches)
                        times[name].append(time.perf_counter() - started)
                    collecting[name].append(clock.take())
                    del work
            print(f"{machine(engine)}; {len(heap):,} label dicts held; median of {args.repeats}")
        finally:
            engine.dispose()
    samples = args.writes * args.series
    print(f"\n| writer | {samples:,} samples (s) | of which GC (s) |\n|---|---:|---:|")
    for name, seconds in times.items():
        print(
            f"| {name} | {statistics.median(seconds):.3f} "
            f"| {statistics.median(collecting[name]):.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
