"""The write path of the time-series store: batches of samples in, rows of ``samples`` out.

One :meth:`SampleWriter.write` call runs in up to three short transactions, so no lock is held
longer than its step needs:

1. resolve series ids (cache, then a bulk lookup, then creation under a per-project lock that
   enforces the series cap);
2. on PostgreSQL, create the partitions the samples fall in (cached once seen);
3. write the samples: binary ``COPY`` on PostgreSQL, one ``executemany`` on SQLite.

Bad input never raises: each bad batch becomes a :class:`Rejection` and the rest is written.
NaN values are dropped (and reported) rather than stored: SQLite cannot hold NaN in a ``REAL``
column, both backends must return the same data, and NaN would poison ``max``/``avg`` over a
window. A missing value is expressed by absence of a sample. ``+inf``/``-inf`` are stored.

A writer is safe to share between threads; its caches only ever hold facts that stay true
(a series id, an existing partition) unless series or partitions are deleted, see :meth:`forget`.
"""

from __future__ import annotations

import gc
import json
import math
import numbers
import sqlite3
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain, repeat
from typing import Any, NamedTuple, cast

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import Connection, Engine, Table, func, select, text
from sqlalchemy.dialects import sqlite

from tuneloop.settings import Settings
from tuneloop.storage.locks import LockName, advisory_lock, hold_write_lock
from tuneloop.storage.models import Series
from tuneloop.storage.timeseries.columns import Batch, SampleColumns, SeriesTable
from tuneloop.storage.timeseries.partitions import (
    MAX_PARTITIONS_PER_CALL,
    ensure_partitions,
    partition_index,
)
from tuneloop.storage.timeseries.types import (
    Rejection,
    RejectionCode,
    SeriesBatch,
    SeriesKind,
    WriteResult,
    fingerprint,
)
from tuneloop.storage.types import utcnow

DEFAULT_MAX_SERIES: int = Settings.model_fields["max_series_per_project"].default
MAX_METRIC_LENGTH = 200
"""Length of ``series.metric``; longer names would fail the whole insert on PostgreSQL."""

_SERIES: Table = cast(Table, Series.__table__)
_COPY_SQL = "COPY samples (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
_COPY_TYPES = ["int8", "timestamptz", "float8"]
_SQLITE_INSERT = "INSERT INTO samples (series_id, ts, value) VALUES (?, ?, ?)"
_LOOKUP_CHUNK = 1_000
_CACHE_LIMIT = 1_000_000
"""Series ids cached before the cache is emptied (about 150 MB); misses only cost a lookup."""
_IDENTITY_LIMIT = 250_000
"""Checked (metric, kind, labels) kept before that cache is emptied (about 500 bytes each for
a dozen labels); a miss only costs the checks and the fingerprint again."""
# PostgreSQL: the series travel as one JSON document parameter rather than one placeholder per
# value, so the statement stays short and fixed whatever their number. psycopg re-parses a long
# statement on every call and escapes text arrays element by element in Python: for 1,000
# series either cost more than COPYing 100,000 samples; json.dumps and the server's parser don't.
# ``= ANY(ARRAY(...))`` keeps the lookup an index scan of (project_id, fingerprint) at any size.
_PG_LOOKUP = text(
    """
    SELECT fingerprint, id FROM series
    WHERE project_id = :project_id
      AND fingerprint = ANY(ARRAY(SELECT jsonb_array_elements_text(CAST(:fingerprints AS jsonb))))
    """
)
_PG_INSERT = text(
    """
    INSERT INTO series (project_id, metric, labels, fingerprint, kind, created_at)
    SELECT :project_id, t.metric, t.labels, t.fingerprint, t.kind, :created_at
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
         AS t(metric text, labels jsonb, fingerprint text, kind text)
    ON CONFLICT (project_id, fingerprint) DO NOTHING
    RETURNING fingerprint, id
    """
)
_KINDS = frozenset(kind.value for kind in SeriesKind)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_DAY_US = 86_400 * 1_000_000
_POSTGRES_EPOCH_US = 946_684_800 * 1_000_000
"""2000-01-01 in Unix microseconds: the origin of PostgreSQL's binary timestamps."""
_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # signature, flags, no extension
_BINARY_TRAILER = b"\xff\xff"
# One row of ``samples`` in COPY's binary format, big-endian: the field count, then each
# field's length and value (int8 series_id, timestamptz ts, float8 value). Packed: 38 bytes.
_BINARY_ROW = np.dtype(
    [
        ("fields", ">i2"),
        ("id_size", ">i4"),
        ("id", ">i8"),
        ("ts_size", ">i4"),
        ("ts", ">i8"),
        ("value_size", ">i4"),
        ("value", ">f8"),
    ]
)
_TABLE_LIMIT = 100_000
"""Series of the checked tables, and series ids of (project, table), kept before each of those
caches empties (about 200 bytes a series: a table's own labels are shared with the receiver)."""


_Columns = tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]
"""Series ids, microseconds since the epoch and values of samples to write."""


class _Problem(NamedTuple):
    """Why a batch is refused: the stable code and the sentence for people."""

    code: RejectionCode
    text: str


class _Identity(NamedTuple):
    """What a batch's metric, labels and kind come to once checked."""

    fingerprint: str
    kind: SeriesKind


@dataclass(slots=True)
class _Accepted:
    """A batch that passed validation, with what the later steps need computed once."""

    metric: str
    labels: Mapping[str, str]
    """The batch's own (batches are not changed once handed over); copied where kept."""
    fingerprint: str
    kind: SeriesKind
    timestamps: Sequence[datetime]
    values: Sequence[float]
    first: datetime
    last: datetime


@dataclass(slots=True)
class _Block:
    """A :class:`SampleColumns` whose series all passed validation and hold no NaN."""

    columns: SampleColumns
    identities: tuple[_Identity, ...]
    """Of each series of the table."""
    ids: npt.NDArray[np.int64] | None = None
    """Series id of each series of the table (-1: refused by the cap), once resolved."""

    def entries(self) -> list[_Accepted]:
        """The series of the table that have samples, as the batches they mean would be
        accepted (no samples attached: only resolving series needs them)."""
        table = self.columns.table
        return [
            _Accepted(
                metric=table.metrics[index],
                labels=table.labels[index],
                fingerprint=self.identities[index].fingerprint,
                kind=self.identities[index].kind,
                timestamps=(),
                values=(),
                first=_EPOCH,
                last=_EPOCH,
            )
            for index in np.flatnonzero(self.columns.counts()).tolist()
        ]


class SampleWriter:
    """Writes :class:`SeriesBatch` objects of one project at a time into ``samples``."""

    def __init__(
        self,
        engine: Engine,
        *,
        partition_days: int = 1,
        max_series_per_project: int = DEFAULT_MAX_SERIES,
    ) -> None:
        if partition_days < 1:
            raise ValueError(f"partition_days must be >= 1, got {partition_days}")
        if max_series_per_project < 0:
            raise ValueError(f"max_series_per_project must be >= 0, got {max_series_per_project}")
        self.engine = engine
        self.partition_days = partition_days
        self.max_series_per_project = max_series_per_project
        self._postgres = engine.dialect.name == "postgresql"
        self._series_ids: dict[tuple[int, str], int] = {}
        self._partitions: set[int] = set()
        # A collector sends the same series again and again, often one sample at a time:
        # checking its name and labels and hashing its fingerprint would cost far more than
        # COPYing the sample. Keyed by _identity_key; the values are facts that stay true.
        self._identities: dict[tuple[object, ...], _Identity] = {}
        # The same for blocks (SampleColumns), by series table: None if one of its series does
        # not pass (its blocks then go the batches' way). And each table's series ids by
        # project, once all of them exist: a block of a known table costs no lookup per series.
        self._tables: dict[SeriesTable, tuple[_Identity, ...] | None] = {}
        self._tables_size = 0  # series in _tables
        self._table_ids: dict[tuple[int, SeriesTable], npt.NDArray[np.int64]] = {}
        self._table_ids_size = 0  # series in _table_ids

    def write(
        self, project_id: int, batches: Iterable[Batch], *, max_series: int | None = None
    ) -> WriteResult:
        """Write ``batches`` for ``project_id`` (which must exist); ``max_series`` overrides
        the writer's series cap for this call (a project's own limit)."""
        # The cyclic garbage collector is paused for the call (in the whole process: there is
        # no other way). A write makes a few objects per batch that all die, by reference
        # counting, when it returns; left on, the collector would scan them again and again,
        # promote them, and so set off full collections over the whole heap: a collector
        # sending one-sample batches spent a third of its time there. Paused, it makes up on
        # the first allocations after. Restored only if it was on, so that concurrent writes
        # leave it as they found it.
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._write(project_id, batches, max_series)
        finally:
            if enabled:
                gc.enable()

    def _write(
        self, project_id: int, batches: Iterable[Batch], max_series: int | None
    ) -> WriteResult:
        result = WriteResult()
        identities = self._identities
        accepted: list[_Accepted | _Block] = []
        for batch in batches:
            if isinstance(batch, SampleColumns):
                block = self._check_block(batch)
                if block is not None:
                    accepted.append(block)
                    continue
                # Not in bulk: the batches the block means, each checked as any other (so
                # the same rejections, in the same order).
                for each in batch.to_batches():
                    if (item := _validate(each, result, identities)) is not None:
                        accepted.append(item)
            elif (item := _validate(batch, result, identities)) is not None:
                accepted.append(item)
        if not accepted:
            return result
        cap = self.max_series_per_project if max_series is None else max_series
        # One connection for the whole call (each checkout pays a pre-ping round trip), with a
        # short transaction per step.
        with self.engine.connect() as connection:
            wanted: list[_Accepted] = []
            for part in accepted:
                if isinstance(part, _Accepted):
                    wanted.append(part)
                else:
                    part.ids = self._table_ids.get((project_id, part.columns.table))
                    if part.ids is None:
                        wanted.extend(part.entries())
            ids = self._resolve_series(connection, project_id, wanted, cap, result)
            written: list[_Accepted] = []
            work: list[tuple[int, Sequence[datetime], Sequence[float]]] = []
            blocks: list[_Columns] = []
            for part in accepted:
                if isinstance(part, _Accepted):
                    series_id = ids.get(part.fingerprint)
                    if series_id is None:
                        result.rejected.append(
                            _cap_rejection(part, project_id, cap, len(part.values))
                        )
                    else:
                        written.append(part)
                        work.append((series_id, part.timestamps, part.values))
                    continue
                columns = part.columns
                if part.ids is None:
                    part.ids = self._block_ids(project_id, part, ids, cap, result)
                series_ids = part.ids[columns.series]
                if int(series_ids.min()) < 0:  # some refused by the cap
                    kept = series_ids >= 0
                    if kept.any():
                        blocks.append(
                            (series_ids[kept], columns.micros[kept], columns.values[kept])
                        )
                else:
                    blocks.append((series_ids, columns.micros, columns.values))
            if work or blocks:
                self._write_samples(connection, written, work, blocks)
                result.samples_written = sum(len(values) for _, _, values in work) + sum(
                    len(values) for _, _, values in blocks
                )
        return result

    def _check_block(self, columns: SampleColumns) -> _Block | None:
        """``columns`` ready to write in bulk, or ``None`` if it must go the batches' way: a
        series that does not pass, or a NaN value (dropped and reported per series there)."""
        if not len(columns) or bool(np.isnan(columns.values).any()):
            return None
        table = columns.table
        if table in self._tables:
            identities = self._tables[table]
        else:
            identities = _table_identities(table, self._identities)
            # Bounded by series, not tables: a table may hold many.
            if self._tables_size + len(table) > _TABLE_LIMIT:
                self._tables.clear()
                self._tables_size = 0
            self._tables[table] = identities
            self._tables_size += len(table)
        return None if identities is None else _Block(columns, identities)

    def _block_ids(
        self,
        project_id: int,
        block: _Block,
        ids: Mapping[str, int],
        cap: int,
        result: WriteResult,
    ) -> npt.NDArray[np.int64]:
        """The series id of each series of ``block``'s table (-1 where the cap refused it, with
        the rejection recorded as for its batch); remembered once all of them exist."""
        table = block.columns.table
        found = np.array(
            [ids.get(identity.fingerprint, -1) for identity in block.identities], dtype=np.int64
        )
        refused = np.flatnonzero(found < 0)
        if len(refused):
            counts = block.columns.counts()
            for index in refused.tolist():
                if counts[index]:
                    entry = _Accepted(
                        table.metrics[index],
                        table.labels[index],
                        block.identities[index].fingerprint,
                        block.identities[index].kind,
                        (),
                        (),
                        _EPOCH,
                        _EPOCH,
                    )
                    result.rejected.append(
                        _cap_rejection(entry, project_id, cap, int(counts[index]))
                    )
        else:
            if self._table_ids_size + len(found) > _TABLE_LIMIT:
                self._table_ids.clear()
                self._table_ids_size = 0
            self._table_ids[(project_id, table)] = found
            self._table_ids_size += len(found)
        return found

    def forget(self, project_id: int | None = None) -> None:
        """Empty the caches (of one project's series, or of everything). Call it after deleting
        series or dropping partitions through anything but this writer's process."""
        if project_id is None:
            self._series_ids.clear()
            self._table_ids.clear()
            self._table_ids_size = 0
        else:
            for table_key in [key for key in list(self._table_ids) if key[0] == project_id]:
                dropped = self._table_ids.pop(table_key, None)
                self._table_ids_size -= 0 if dropped is None else len(dropped)
            # Snapshot the keys first: another thread may be adding to the cache meanwhile.
            for key in [key for key in list(self._series_ids) if key[0] == project_id]:
                self._series_ids.pop(key, None)
        self._partitions.clear()

    # ------------------------------------------------------------------ series

    def _resolve_series(
        self,
        connection: Connection,
        project_id: int,
        accepted: list[_Accepted],
        cap: int,
        result: WriteResult,
    ) -> dict[str, int]:
        """Ids by fingerprint; a series missing from the answer was refused by the cap."""
        ids: dict[str, int] = {}
        if not accepted:
            return ids
        missing: dict[str, _Accepted] = {}
        for item in accepted:
            series_id = self._series_ids.get((project_id, item.fingerprint))
            if series_id is None:
                missing.setdefault(item.fingerprint, item)
            else:
                ids[item.fingerprint] = series_id
        if not missing:
            return ids
        with connection.begin():
            found = _lookup(connection, project_id, list(missing))
            new = [item for fp, item in missing.items() if fp not in found]
            if new:
                found |= _create_series(connection, project_id, new, cap, result)
        if len(self._series_ids) + len(found) > _CACHE_LIMIT:
            self._series_ids.clear()
        self._series_ids.update(((project_id, fp), series_id) for fp, series_id in found.items())
        return ids | found

    # ------------------------------------------------------------------ samples

    def _write_samples(
        self,
        connection: Connection,
        accepted: list[_Accepted],
        work: list[tuple[int, Sequence[datetime], Sequence[float]]],
        blocks: list[_Columns],
    ) -> None:
        if not self._postgres:
            with connection.begin():
                _insert_sqlite(connection, work, blocks)
            return
        needed = _needed_partitions(accepted, self.partition_days)
        needed |= _block_partitions(blocks, self.partition_days)
        self._ensure_partitions(connection, needed)
        try:
            with connection.begin():
                _copy_postgres(connection, work, blocks)
        except psycopg.errors.CheckViolation:
            # "no partition of relation samples found for row": a partition this writer had
            # cached was dropped (retention). Forget what we knew, create it again, retry once.
            self._partitions.clear()
            self._ensure_partitions(connection, needed)
            with connection.begin():
                _copy_postgres(connection, work, blocks)

    def _ensure_partitions(self, connection: Connection, needed: set[int]) -> None:
        needed = needed - self._partitions
        if not needed:
            return
        width = timedelta(days=self.partition_days)
        # Its own transaction, before the COPY's: partition DDL locks ``samples`` exclusively.
        with connection.begin():
            for first, last in _runs(sorted(needed), MAX_PARTITIONS_PER_CALL):
                ensure_partitions(
                    connection, _EPOCH + width * first, _EPOCH + width * last, self.partition_days
                )
        self._partitions |= needed


# ---------------------------------------------------------------------- validation


def _validate(
    batch: SeriesBatch, result: WriteResult, identities: dict[tuple[object, ...], _Identity]
) -> _Accepted | None:
    """The batch ready to write, or ``None`` after recording why not (an empty batch is
    ``None`` with nothing recorded). ``identities``: see :func:`_identity_key`."""
    key = identity = None
    try:
        size = max(len(batch.timestamps), len(batch.values))
    except TypeError:
        problem: _Problem | None = _Problem(
            RejectionCode.INVALID_BATCH, "timestamps and values must be sequences"
        )
        size = 0
    else:
        key = _identity_key(batch)
        if key is not None:
            try:
                identity = identities.get(key)
            except TypeError:  # an unhashable label: not a string, found the long way
                key = None
        known = identity is not None
        problem = (None if known else _identity_problem(batch)) or _length_problem(batch)
    if problem is None and size:
        checked = _check_samples(batch)
        if not isinstance(checked, _Problem):
            if identity is None:
                identity = _learn(identities, key, batch)
            return _accept(batch, checked[0], checked[1], result, identity)
        problem = checked
    if problem is not None:
        labels = batch.labels if isinstance(batch.labels, Mapping) else {}
        result.rejected.append(
            Rejection(str(batch.metric), labels, size, problem.text, problem.code)
        )
    return None


def _identity_key(batch: SeriesBatch) -> tuple[object, ...] | None:
    """The metric, kind and labels (in their order) of a batch, flat: the key under which a
    batch that passed the identity checks is remembered; ``None`` (check it the long way)
    unless the labels are a plain dict.

    Equal keys mean equal parts: a batch whose key is known has the metric, kind and label
    set of one that passed :func:`_identity_problem` (strings, as only strings equal strings),
    and its fingerprint.
    """
    labels = batch.labels
    if type(labels) is not dict:
        return None
    # Flat, so that hashing it combines the strings' cached hashes and builds no pair tuples.
    return (batch.metric, batch.kind, *chain.from_iterable(labels.items()))


def _table_identities(
    table: SeriesTable, identities: dict[tuple[object, ...], _Identity]
) -> tuple[_Identity, ...] | None:
    """The identity of each series of ``table``, by the checks a batch of it would pass (and
    the cache they share); ``None`` if one would not."""
    found: list[_Identity] = []
    for metric, labels, kind in zip(table.metrics, table.labels, table.kinds, strict=True):
        probe = SeriesBatch(metric, labels, (), (), kind)
        key = _identity_key(probe)
        identity = None
        if key is not None:
            try:
                identity = identities.get(key)
            except TypeError:
                key = None
        if identity is None:
            if _identity_problem(probe) is not None:
                return None
            identity = _learn(identities, key, probe)
        found.append(identity)
    return tuple(found)


def _learn(
    identities: dict[tuple[object, ...], _Identity],
    key: tuple[object, ...] | None,
    batch: SeriesBatch,
) -> _Identity:
    """The identity of a batch that passed the checks, remembered under ``key``."""
    identity = _Identity(fingerprint(batch.metric, batch.labels), SeriesKind(batch.kind))
    if key is not None:
        if len(identities) >= _IDENTITY_LIMIT:
            identities.clear()
        identities[key] = identity
    return identity


def _accept(
    batch: SeriesBatch,
    total: float,
    time_range: tuple[datetime, datetime],
    result: WriteResult,
    identity: _Identity,
) -> _Accepted | None:
    """A valid batch, less its NaN values (dropped and recorded)."""
    timestamps, values = batch.timestamps, batch.values
    first, last = time_range
    if total != total and any(math.isnan(value) for value in values):
        timestamps, values = _drop_nan(batch, result)
        if not values:
            return None
        first, last = min(timestamps), max(timestamps)
    return _Accepted(
        metric=batch.metric,
        labels=batch.labels,
        fingerprint=identity.fingerprint,
        kind=identity.kind,
        timestamps=timestamps,
        values=values,
        first=first,
        last=last,
    )


def _check_samples(batch: SeriesBatch) -> tuple[float, tuple[datetime, datetime]] | _Problem:
    """(sum of values, (earliest, latest timestamp)), or why the samples are unusable."""
    total = _value_sum(batch.values)
    if isinstance(total, str):
        return _Problem(RejectionCode.INVALID_VALUE, total)
    time_range = _time_range(batch.timestamps)
    if isinstance(time_range, str):
        return _Problem(RejectionCode.INVALID_TIMESTAMP, time_range)
    return total, time_range


def _identity_problem(batch: SeriesBatch) -> _Problem | None:
    metric = batch.metric
    if not isinstance(metric, str) or not metric:
        return _Problem(RejectionCode.INVALID_METRIC, "metric name must be a non-empty string")
    if len(metric) > MAX_METRIC_LENGTH:
        return _Problem(
            RejectionCode.INVALID_METRIC,
            f"metric name is longer than {MAX_METRIC_LENGTH} characters",
        )
    if "\x00" in metric:
        return _Problem(RejectionCode.INVALID_METRIC, "metric name contains a NUL character")
    labels_problem = _labels_problem(batch.labels)
    if labels_problem is not None:
        return _Problem(RejectionCode.INVALID_LABELS, labels_problem)
    if not isinstance(batch.kind, str) or batch.kind not in _KINDS:
        return _Problem(
            RejectionCode.INVALID_KIND,
            f"kind must be one of {', '.join(sorted(_KINDS))}, got {batch.kind!r}",
        )
    return None


def _labels_problem(labels: Mapping[str, str]) -> str | None:
    if not isinstance(labels, Mapping):
        return "labels must be a mapping of strings to strings"
    for name, value in labels.items():
        if not isinstance(name, str) or not name:
            return f"label name {name!r} is not a non-empty string"
        if not isinstance(value, str):
            return f"label {name!r} has a non-string value ({type(value).__name__})"
        if "\x00" in name or "\x00" in value:
            return f"label {name!r} contains a NUL character"
    return None


def _length_problem(batch: SeriesBatch) -> _Problem | None:
    if len(batch.timestamps) != len(batch.values):
        return _Problem(
            RejectionCode.LENGTH_MISMATCH,
            f"{len(batch.timestamps)} timestamps but {len(batch.values)} values: "
            "they must pair one to one",
        )
    return None


def _time_range(timestamps: Sequence[datetime]) -> tuple[datetime, datetime] | str:
    """(earliest, latest), or why the timestamps are unusable.

    ``min``/``max`` double as the type check, in C: comparing a naive with an aware datetime,
    or a datetime with anything else, raises; so after them only "all naive" or "all of some
    other type" is left to rule out, from one element.
    """
    try:
        first, last = min(timestamps), max(timestamps)
    except TypeError:
        return _timestamp_problem(timestamps)
    if not isinstance(first, datetime) or first.utcoffset() is None:
        return _timestamp_problem(timestamps)
    return first, last


def _timestamp_problem(timestamps: Sequence[datetime]) -> str:
    for index, ts in enumerate(timestamps):
        if not isinstance(ts, datetime):
            return f"timestamps[{index}] is not a datetime ({type(ts).__name__})"
        if ts.utcoffset() is None:
            return f"timestamps[{index}] is a naive datetime: timestamps must be timezone-aware"
    return "timestamps cannot be compared with each other"


def _value_sum(values: Sequence[float]) -> float | str:
    """The sum of the values (NaN if one is NaN, which is allowed here and dropped later), or
    why they are unusable. Summing is the type check, in C; only a failure rescans."""
    try:
        total = sum(values, 0.0)
    except (TypeError, OverflowError):
        total = None
    if isinstance(total, float):
        return total
    for index, value in enumerate(values):
        if not isinstance(value, numbers.Real):
            return f"values[{index}] is not a real number ({type(value).__name__})"
        try:
            float(value)
        except OverflowError:
            return f"values[{index}] does not fit in a 64-bit float"
    return "values are not real numbers"


def _drop_nan(batch: SeriesBatch, result: WriteResult) -> tuple[list[datetime], list[float]]:
    kept = [
        (ts, value)
        for ts, value in zip(batch.timestamps, batch.values, strict=True)
        if value == value
    ]
    dropped = len(batch.values) - len(kept)
    result.rejected.append(
        Rejection(
            batch.metric,
            batch.labels,
            dropped,
            f"{dropped} NaN value(s) dropped: NaN is not stored (a missing value is no sample)",
            RejectionCode.NAN_VALUE,
        )
    )
    return [ts for ts, _ in kept], [value for _, value in kept]


def _cap_rejection(item: _Accepted, project_id: int, cap: int, samples: int) -> Rejection:
    return Rejection(
        item.metric,
        item.labels,
        samples,
        f"series limit reached: project {project_id} may have at most {cap} series "
        f"(max_series_per_project={cap}); this new series was not created",
        RejectionCode.SERIES_LIMIT,
    )


# ---------------------------------------------------------------------- series storage


def _lookup(connection: Connection, project_id: int, fingerprints: list[str]) -> dict[str, int]:
    if connection.dialect.name == "postgresql":
        rows = connection.execute(
            _PG_LOOKUP, {"project_id": project_id, "fingerprints": json.dumps(fingerprints)}
        )
        return {row.fingerprint: row.id for row in rows}
    found: dict[str, int] = {}
    for start in range(0, len(fingerprints), _LOOKUP_CHUNK):
        chunk = fingerprints[start : start + _LOOKUP_CHUNK]
        rows = connection.execute(
            select(_SERIES.c.fingerprint, _SERIES.c.id).where(
                _SERIES.c.project_id == project_id, _SERIES.c.fingerprint.in_(chunk)
            )
        )
        found.update((row.fingerprint, row.id) for row in rows)
    return found


def _create_series(
    connection: Connection, project_id: int, new: list[_Accepted], cap: int, result: WriteResult
) -> dict[str, int]:
    """Create as many of ``new`` as the cap allows, in order; return the ids of those that
    now exist (created here or, meanwhile, by another writer)."""
    _lock_project(connection, project_id)
    found = _lookup(connection, project_id, [item.fingerprint for item in new])
    new = [item for item in new if item.fingerprint not in found]
    existing = connection.execute(
        select(func.count()).select_from(_SERIES).where(_SERIES.c.project_id == project_id)
    ).scalar_one()
    allowed = new[: max(cap - existing, 0)]
    if not allowed:
        return found
    created = _insert_series(connection, project_id, allowed)
    result.series_created += len(created)
    found |= created
    conflicted = [item.fingerprint for item in allowed if item.fingerprint not in found]
    if conflicted:
        found |= _lookup(connection, project_id, conflicted)
    return found


def _insert_series(
    connection: Connection, project_id: int, items: list[_Accepted]
) -> dict[str, int]:
    """Insert ``items`` as series (a row that exists already is skipped); return the ids of
    the rows inserted, by fingerprint."""
    if connection.dialect.name == "postgresql":
        document = json.dumps(
            [
                {
                    "metric": item.metric,
                    "labels": dict(item.labels),
                    "fingerprint": item.fingerprint,
                    "kind": item.kind.value,
                }
                for item in items
            ]
        )
        rows = connection.execute(
            _PG_INSERT, {"project_id": project_id, "created_at": utcnow(), "rows": document}
        )
    else:
        statement = (
            sqlite.insert(_SERIES)
            .on_conflict_do_nothing(index_elements=["project_id", "fingerprint"])
            .returning(_SERIES.c.fingerprint, _SERIES.c.id)
        )
        params = [
            {
                "project_id": project_id,
                "metric": item.metric,
                "labels": dict(item.labels),
                "fingerprint": item.fingerprint,
                "kind": item.kind.value,
            }
            for item in items
        ]
        rows = connection.execute(statement, params)
    return {row.fingerprint: row.id for row in rows}


def _lock_project(connection: Connection, project_id: int) -> None:
    """Serialize series creation of one project until this transaction ends, so that counting
    and inserting cannot interleave with another writer's and overshoot the cap."""
    advisory_lock(connection, LockName.SERIES, project_id)
    hold_write_lock(connection)  # SQLite: one writer at a time, before we count


# ---------------------------------------------------------------------- sample storage


def _copy_postgres(
    connection: Connection,
    work: list[tuple[int, Sequence[datetime], Sequence[float]]],
    blocks: list[_Columns],
) -> None:
    driver = cast("psycopg.Connection[Any]", connection.connection.driver_connection)
    if work:
        with driver.cursor() as cursor, cursor.copy(_COPY_SQL) as copy:
            copy.set_types(_COPY_TYPES)
            ids, timestamps, values = zip(*work, strict=True)
            # zip/repeat build the row tuples in C, chain strings the batches together, and
            # deque(maxlen=0) drains map() without a Python-level loop, not even one per
            # batch (a collector's batches are often one sample each): the per-sample cost is
            # psycopg's C encoder and nothing else.
            rows = chain.from_iterable(map(zip, map(repeat, ids), timestamps, values))
            deque(map(copy.write_row, rows), maxlen=0)
    if blocks:
        # Blocks as COPY's binary format made whole by numpy: no Python object per sample.
        # A COPY of its own, since psycopg's row mode buffers rows that raw data would pass.
        with driver.cursor() as cursor, cursor.copy(_COPY_SQL) as copy:
            copy.write(_BINARY_SIGNATURE)
            for series_ids, micros, block_values in blocks:
                copy.write(_binary_rows(series_ids, micros, block_values))
            copy.write(_BINARY_TRAILER)


def _binary_rows(
    series_ids: npt.NDArray[np.int64],
    micros: npt.NDArray[np.int64],
    values: npt.NDArray[np.float64],
) -> bytes:
    rows = np.empty(len(values), dtype=_BINARY_ROW)
    rows["fields"] = 3
    rows["id_size"] = rows["ts_size"] = rows["value_size"] = 8
    rows["id"] = series_ids
    rows["ts"] = micros - _POSTGRES_EPOCH_US
    rows["value"] = values
    return rows.tobytes()


def _insert_sqlite(
    connection: Connection,
    work: list[tuple[int, Sequence[datetime], Sequence[float]]],
    blocks: list[_Columns],
) -> None:
    driver = cast(sqlite3.Connection, connection.connection.driver_connection)
    rows = chain(
        chain.from_iterable(
            zip(repeat(series_id), map(_micros, timestamps), values)
            for series_id, timestamps, values in work
        ),
        chain.from_iterable(
            zip(series_ids.tolist(), micros.tolist(), values.tolist(), strict=True)
            for series_ids, micros, values in blocks
        ),
    )
    cursor = driver.cursor()
    try:
        # One executemany streams every row through one prepared statement, in the
        # transaction the engine opened (committed by the caller's ``begin()``).
        cursor.executemany(_SQLITE_INSERT, rows)
    finally:
        cursor.close()


def _micros(ts: datetime) -> int:
    # Exact integer microseconds, the representation UTCDateTime uses on SQLite.
    return (ts - _EPOCH) // _MICROSECOND


# ---------------------------------------------------------------------- partitions


def _needed_partitions(accepted: list[_Accepted], partition_days: int) -> set[int]:
    needed: set[int] = set()
    # Batches of one collection share their timestamps: compute each one's partition once.
    known: dict[datetime, int] = {}
    for item in accepted:
        first = known.get(item.first)
        if first is None:
            first = known[item.first] = partition_index(item.first, partition_days)
        last = known.get(item.last)
        if last is None:
            last = known[item.last] = partition_index(item.last, partition_days)
        if first == last:
            needed.add(first)
        else:
            # Only a batch crossing a boundary pays a per-sample look, and only for its own
            # partitions: a stray old sample must not create every partition in between.
            needed.update(partition_index(ts, partition_days) for ts in item.timestamps)
    return needed


def _block_partitions(blocks: list[_Columns], partition_days: int) -> set[int]:
    needed: set[int] = set()
    width = _DAY_US * partition_days
    for _, micros, _ in blocks:
        first, last = int(micros.min()) // width, int(micros.max()) // width
        if first == last:
            needed.add(first)
        else:
            needed.update(np.unique(micros // width).tolist())
    return needed


def _runs(indexes: list[int], longest: int) -> Iterable[tuple[int, int]]:
    """Consecutive stretches of sorted ``indexes`` as (first, last), none longer than
    ``longest``."""
    start = previous = indexes[0]
    for index in indexes[1:]:
        if index != previous + 1 or index - start >= longest:
            yield start, previous
            start = index
        previous = index
    yield start, previous
