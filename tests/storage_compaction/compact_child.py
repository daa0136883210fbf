"""``python -m tests.storage_compaction.compact_child URL``: compact the store at URL as the
tests do, one series per transaction and a chunk a minute (a slow pass), printing each batch's
progress line at once, so a test can kill it in the middle."""

from __future__ import annotations

import sys
from datetime import timedelta

from tests.storage_compaction.fleet import NOW
from tuneloop.storage import make_engine
from tuneloop.storage.timeseries.compaction import compact


def main(url: str) -> None:
    engine = make_engine(url)
    compact(
        engine,
        hot_window=timedelta(0),
        now=NOW,
        after_rollups=False,
        batch_series=1,
        span=timedelta(minutes=1),
        progress=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    main(sys.argv[1])
