"""Samples of many series in columns: what a receiver that decodes in bulk hands to the writer.

A :class:`SeriesBatch` per series costs a few Python objects per series and one per sample
(a ``datetime``, a ``float``); for an exporter that sends every series again in each request,
one point each, that is most of the cost of storing a sample. :class:`SampleColumns` holds a
request's samples as three arrays (series, time, value) against a :class:`SeriesTable` of the
distinct series, which the receiver makes once and hands over again with every request of the
same shape; the writer then resolves the table's series ids once and streams the arrays to
``COPY`` without a Python object per sample.

It means exactly what :meth:`SampleColumns.to_batches` returns: one batch per series of the
table that has samples, in table order, its samples in column order. Wherever a block cannot
be handled in bulk (relabel rules, the spool, anything unusual) it is turned into those
batches, so that either way the same rows are stored and the same rejections reported.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

from tuneloop.storage.timeseries.types import SeriesBatch, SeriesKind

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
MIN_MICROS: Final = (datetime.min.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
MAX_MICROS: Final = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
"""Microseconds since the epoch that a ``datetime`` can hold: the range of ``micros``."""

Int64Array: TypeAlias = npt.NDArray[np.int64]
Float64Array: TypeAlias = npt.NDArray[np.float64]
IndexArray: TypeAlias = npt.NDArray[np.intp]


@dataclass(frozen=True, slots=True, eq=False)
class SeriesTable:
    """The distinct series of a block, each once: ``metrics[i]``, ``labels[i]``, ``kinds[i]``.

    Compared and hashed by identity (``eq=False``): a receiver hands the same table over with
    every request of one shape, and the writer remembers per table what it resolved. Nothing
    may change it (nor its label dicts) once made.
    """

    metrics: tuple[str, ...]
    labels: tuple[Mapping[str, str], ...]
    kinds: tuple[SeriesKind, ...]

    def __post_init__(self) -> None:
        if not len(self.metrics) == len(self.labels) == len(self.kinds):
            raise ValueError("a series table needs as many labels and kinds as metrics")

    def __len__(self) -> int:
        return len(self.metrics)


@dataclass(frozen=True, slots=True)
class SampleColumns:
    """Sample ``i`` is ``values[i]`` at ``micros[i]`` (microseconds since the Unix epoch, UTC)
    of series ``table[series[i]]``. Checked when made: one-dimensional arrays of one length,
    series indexes in the table, times a ``datetime`` can hold."""

    table: SeriesTable
    series: IndexArray
    micros: Int64Array
    values: Float64Array

    def __post_init__(self) -> None:
        arrays = (self.series, self.micros, self.values)
        if any(array.ndim != 1 for array in arrays) or not (
            len(self.series) == len(self.micros) == len(self.values)
        ):
            raise ValueError("series, micros and values must be 1-D arrays of one length")
        if (
            self.series.dtype != np.intp
            or self.micros.dtype != np.int64
            or self.values.dtype != np.float64
        ):
            raise ValueError("series must be intp, micros int64 and values float64")
        if len(self.series) and (
            int(self.series.min()) < 0 or int(self.series.max()) >= len(self.table)
        ):
            raise ValueError("a series index is outside the table")
        if len(self.micros) and (
            int(self.micros.min()) < MIN_MICROS or int(self.micros.max()) > MAX_MICROS
        ):
            raise ValueError("a time is outside what a datetime can hold")

    def __len__(self) -> int:
        return len(self.values)

    def counts(self) -> npt.NDArray[np.int64]:
        """Samples per series of the table."""
        return np.bincount(self.series, minlength=len(self.table)).astype(np.int64)

    def to_batches(self) -> list[SeriesBatch]:
        """What the block means: one batch per series of the table that has samples, in table
        order, with its samples in column order (aware datetimes, floats)."""
        order = np.argsort(self.series, kind="stable")
        counts = self.counts()
        micros = self.micros[order].tolist()
        values = self.values[order].tolist()
        batches: list[SeriesBatch] = []
        start = 0
        for index, count in enumerate(counts.tolist()):
            if not count:
                continue
            stop = start + count
            batches.append(
                SeriesBatch(
                    self.table.metrics[index],
                    dict(self.table.labels[index]),
                    [_EPOCH + timedelta(microseconds=us) for us in micros[start:stop]],
                    values[start:stop],
                    self.table.kinds[index],
                )
            )
            start = stop
        return batches


Batch: TypeAlias = SeriesBatch | SampleColumns
"""What the pipeline and the writer take: a series' batch, or a block of many series."""


def expand(batches: Sequence[Batch]) -> list[SeriesBatch]:
    """``batches`` with every block turned into the batches it means, in order."""
    out: list[SeriesBatch] = []
    for batch in batches:
        if isinstance(batch, SampleColumns):
            out.extend(batch.to_batches())
        else:
            out.append(batch)
    return out


def sample_count(batch: Batch) -> int:
    """Samples in ``batch`` (the longer of its two lists for a series' batch; 0 if they have
    no length)."""
    if isinstance(batch, SampleColumns):
        return len(batch)
    try:
        return max(len(batch.values), len(batch.timestamps))
    except TypeError:
        return 0
