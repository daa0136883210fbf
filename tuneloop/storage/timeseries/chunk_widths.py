"""How wide a series' compacted chunks are: wide enough to hold about ``min_samples`` samples.

A chunk costs a fixed overhead whatever it holds (its row, its key, pcodec's headers) and, worse,
the storage's page packing: on SQLite a row of 2 to 4 KB takes a 4 KB page alone, on PostgreSQL
every blob TOASTed leaves half a TOAST chunk unused on average. An hour of a series sampled every
15 s (240 samples) pays that on every few hundred samples; a chunk of a couple of thousand
samples amortizes it (BENCHMARKS.md, "Disk per sample"). So a series' chunk width is the
narrowest multiple of the base span (``chunk_span_s``) that divides a day and, at the series'
rate, holds ``min_samples``; a day at most (``sample_source.MAX_CHUNK_SPAN``), so a chunk never
straddles a partition. A span is still aligned to the epoch by its own width.

The rate is the series' samples in the compaction unit (raw rows and those its chunks already
hold) over the unit's length: a later pass over the same day, which sees the chunks the earlier
one wrote, finds the same rate and so the same width.
"""

from __future__ import annotations

from datetime import timedelta

DAY = timedelta(days=1)


def candidate_widths(base: timedelta) -> list[timedelta]:
    """The multiples of ``base`` that divide a day, narrowest first (``base`` itself and a day
    always among them)."""
    if base <= timedelta(0) or DAY % base:
        raise ValueError(f"a chunk span must divide a day, got {base}")
    spans = DAY // base
    return [base * k for k in range(1, spans + 1) if spans % k == 0]


def chunk_width(samples: int, covered: timedelta, base: timedelta, min_samples: int) -> timedelta:
    """The width of the chunks of a series with ``samples`` samples in ``covered`` time: the
    narrowest candidate holding ``min_samples`` at that rate, else a day."""
    if min_samples < 1:
        raise ValueError(f"min_samples must be >= 1, got {min_samples}")
    if covered <= timedelta(0):
        raise ValueError(f"covered must be positive, got {covered}")
    for width in candidate_widths(base):
        # samples * width / covered >= min_samples, in integers: no rounding at the boundary.
        if samples * (width // timedelta(microseconds=1)) >= min_samples * (
            covered // timedelta(microseconds=1)
        ):
            return width
    return DAY
