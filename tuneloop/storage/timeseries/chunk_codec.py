"""The encoding of a compacted chunk: its timestamps and its values, each as one pcodec blob.

pcodec (``pcodec`` on PyPI) finds the structure of numeric columns itself: timestamps 15 s
apart with jitter cost about 2 bytes each, a slowly moving gauge under 1 byte, a noisy
full-precision power reading about 6 (BENCHMARKS.md, "Chunk encoding"). It is lossless bit for
bit, NaN payloads included, so Prometheus' stale marker (a NaN with its own payload), ±inf and
-0.0 read back as written; :func:`decode_chunk` checks the lengths agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pcodec import ChunkConfig, standalone

from tuneloop.storage.timeseries.columns import Float64Array, Int64Array

_CONFIG = ChunkConfig()


class CorruptChunk(ValueError):
    """A stored chunk does not decode into as many timestamps as values."""


def encode_chunk(ts_us: Int64Array, values: Float64Array) -> tuple[bytes, bytes]:
    """Timestamps (integer microseconds since the epoch) and values as two blobs."""
    ts_us = np.ascontiguousarray(ts_us, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64)
    if ts_us.shape != values.shape or ts_us.ndim != 1:
        raise ValueError(
            f"a chunk needs as many timestamps as values, got {ts_us.shape} and {values.shape}"
        )
    return (
        bytes(standalone.simple_compress(ts_us, _CONFIG)),
        bytes(standalone.simple_compress(values, _CONFIG)),
    )


def decode_chunk(ts_blob: bytes, values_blob: bytes) -> tuple[Int64Array, Float64Array]:
    """The arrays :func:`encode_chunk` was given, bit for bit."""
    ts_us = _array(standalone.simple_decompress(bytes(ts_blob)), np.int64)
    values = _array(standalone.simple_decompress(bytes(values_blob)), np.float64)
    if ts_us.shape != values.shape:
        raise CorruptChunk(f"chunk holds {len(ts_us)} timestamps but {len(values)} values")
    return ts_us, values


def _array(decoded: Any, dtype: Any) -> Any:
    # pcodec decodes an empty column to None.
    return np.empty(0, dtype=dtype) if decoded is None else np.asarray(decoded, dtype=dtype)
