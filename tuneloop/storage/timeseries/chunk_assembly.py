"""Raw samples of a compaction unit into chunk rows: each series' chunk width
(:mod:`.chunk_widths`), the chunk each sample goes into (its aligned span, or a stored chunk
that already covers it), merged with the stored chunk of that start, encoded.

Pure: the arrays in, the rows out; :mod:`.compaction` reads, writes and deletes around it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from tuneloop.storage.timeseries.chunk_codec import encode_chunk
from tuneloop.storage.timeseries.chunk_widths import chunk_width
from tuneloop.storage.types import from_micros, to_micros

_US = timedelta(microseconds=1)


@dataclass(frozen=True)
class Layout:
    """The chunk widths of a pass: ``base`` (the span setting) widened per series until a
    chunk holds about ``min_samples`` (:mod:`.chunk_widths`)."""

    base: timedelta
    min_samples: int


@dataclass(frozen=True)
class StoredChunk:
    """A chunk already stored, not decoded: its span and how many samples it holds."""

    start_us: int
    end_us: int
    count: int


@dataclass(frozen=True)
class DecodedChunk:
    """A chunk already stored, decoded."""

    end: datetime
    times: Any
    values: Any


ChunkKey = tuple[int, datetime]


def series_edges(
    counts: dict[int, int],
    stored: dict[ChunkKey, StoredChunk],
    start: datetime,
    stop: datetime,
    layout: Layout,
) -> dict[int, tuple[int, int]]:
    """Per series with raw rows in the unit ``[start, stop)`` (``counts``): its chunk width and
    the edge before which its spans of that width are closed (both microseconds). The rate
    counts the raw rows and the samples the series' stored chunks of the unit hold, so every
    pass over a day finds the same width."""
    held: dict[int, int] = {}
    for (series_id, _start), chunk in stored.items():
        held[series_id] = held.get(series_id, 0) + chunk.count
    edges = {}
    for series_id, count in counts.items():
        width = chunk_width(
            count + held.get(series_id, 0), stop - start, layout.base, layout.min_samples
        )
        edges[series_id] = (width // _US, to_micros(floor_to(stop, width)))
    return edges


def per_sample(ids: Any, by_series: dict[int, int]) -> Any:
    """``by_series``' value of each sample's series, for ``ids`` sorted by series."""
    first = np.concatenate(([True], np.diff(ids) != 0))
    counts = np.diff(np.concatenate((np.flatnonzero(first), [len(ids)])))
    return np.repeat([by_series[int(series_id)] for series_id in ids[first].tolist()], counts)


def chunk_starts(ids: Any, micros: Any, width_us: Any, stored: dict[ChunkKey, StoredChunk]) -> Any:
    """The start of the chunk each sample goes into: its aligned span, or the stored chunk
    that already covers it (even one of another width: the span setting or the series' rate
    changed since)."""
    spans = micros - micros % width_us
    for (series_id, _start), chunk in stored.items():
        spans[(ids == series_id) & (micros >= chunk.start_us) & (micros < chunk.end_us)] = (
            chunk.start_us
        )
    return spans


def chunk_keys(ids: Any, spans: Any) -> set[ChunkKey]:
    first = np.concatenate(([True], (np.diff(ids) != 0) | (np.diff(spans) != 0)))
    return {
        (series_id, from_micros(span))
        for series_id, span in zip(ids[first].tolist(), spans[first].tolist(), strict=True)
    }


def chunk_rows(
    ids: Any,
    micros: Any,
    values: Any,
    spans: Any,
    width_us: Any,
    existing: dict[ChunkKey, DecodedChunk],
) -> tuple[list[dict[str, Any]], int]:
    """Chunk rows for raw samples sorted by (series_id, ts), each going into the chunk that
    starts at its ``spans`` entry, merged into the ``existing`` chunk of that start; and how
    many raw samples went into an existing chunk. A new span starting where a narrower stored
    chunk starts takes it in, the chunk's end moving out to the span's."""
    edges = np.flatnonzero((np.diff(ids) != 0) | (np.diff(spans) != 0)) + 1
    starts = np.concatenate(([0], edges)).tolist()
    stops = np.concatenate((edges, [len(ids)])).tolist()
    rows: list[dict[str, Any]] = []
    late = 0
    for begin, end in zip(starts, stops, strict=True):
        series_id, span_us = int(ids[begin]), int(spans[begin])
        span_start, span_end = from_micros(span_us), from_micros(span_us + int(width_us[begin]))
        ts_part, value_part = micros[begin:end], values[begin:end]
        stored = existing.get((series_id, span_start))
        if stored is not None:
            late += end - begin
            span_end = max(span_end, stored.end)
            ts_part, value_part = merged((stored.times, stored.values), (ts_part, value_part))
        ts_blob, values_blob = encode_chunk(ts_part, value_part)
        rows.append(
            {
                "series_id": series_id,
                "start_ts": span_start,
                "end_ts": span_end,
                "sample_count": len(ts_part),
                "ts_blob": ts_blob,
                "values_blob": values_blob,
            }
        )
    return rows, late


def merged(first: tuple[Any, Any], then: tuple[Any, Any]) -> tuple[Any, Any]:
    """Both sample sets in time order; on an equal timestamp ``first``'s value stays."""
    times = np.concatenate((first[0], then[0]))
    values = np.concatenate((first[1], then[1]))
    order = np.argsort(times, kind="stable")
    times, values = times[order], values[order]
    keep = np.concatenate(([True], np.diff(times) != 0))
    return times[keep], values[keep]


def floor_to(value: datetime, width: timedelta) -> datetime:
    """``value`` rounded down to a multiple of ``width`` since the epoch."""
    width_us = width // _US
    return from_micros(to_micros(value) // width_us * width_us)
