"""The chunk codec reads back exactly what it was given, bit for bit."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from tuneloop.storage.timeseries.chunk_codec import CorruptChunk, decode_chunk, encode_chunk

STALE_MARKER = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
"""Prometheus' stale marker: a NaN with a payload of its own."""


def roundtrip(ts: list[int], values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    ts_blob, values_blob = encode_chunk(np.array(ts, dtype=np.int64), np.array(values))
    return decode_chunk(ts_blob, values_blob)


def test_special_floats_keep_their_bits() -> None:
    values = [STALE_MARKER, float("nan"), -float("nan"), float("inf"), -float("inf"), -0.0, 0.0]
    values += [5e-324, -1.7976931348623157e308, 0.1 + 0.2]
    ts = [1_700_000_000_000_000 + 15_000_000 * i for i in range(len(values))]
    times, decoded = roundtrip(ts, values)
    assert times.tolist() == ts
    assert decoded.view(np.uint64).tolist() == np.array(values).view(np.uint64).tolist()


def test_random_bit_patterns_and_jittered_times_round_trip() -> None:
    rng = np.random.default_rng(18)
    bits = rng.integers(0, 2**64, size=240, dtype=np.uint64)
    ts = np.cumsum(rng.integers(14_000_000, 16_000_000, size=240)) + 1_700_000_000_000_000
    times, decoded = roundtrip(ts.tolist(), bits.view(np.float64).tolist())
    assert times.tolist() == ts.tolist()
    assert decoded.view(np.uint64).tolist() == bits.tolist()


def test_one_sample_and_empty_chunks() -> None:
    assert [a.tolist() for a in roundtrip([5], [1.5])] == [[5], [1.5]]
    assert [a.tolist() for a in roundtrip([], [])] == [[], []]


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="as many timestamps as values"):
        encode_chunk(np.array([1, 2], dtype=np.int64), np.array([1.0]))
    ts_blob, _ = encode_chunk(np.array([1, 2], dtype=np.int64), np.array([1.0, 2.0]))
    _, values_blob = encode_chunk(np.array([1], dtype=np.int64), np.array([1.0]))
    with pytest.raises(CorruptChunk):
        decode_chunk(ts_blob, values_blob)
