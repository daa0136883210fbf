"""The write path of the time-series store: batches of samples in, rows of ``samples`` out.

One :meth:`SampleWriter.write` call runs in up to three short transactions, so no lock is held
longer than its step needs:

1. resolve series ids (cache, then a bulk lookup, then creation under a per-project lock that
   enforces the series cap);
2. on PostgreSQL, create the partitions the samples fall in (cached once seen);
3. write the samples: binary ``COPY`` on PostgreSQL, one ``executemany`` on SQLite.

Writes are idempotent: ``samples`` is unique on ``(series_id, ts)`` and a sample already stored
is skipped (still counted as written, and in ``WriteResult.samples_duplicate``), so replaying a
spool after a crash between the store's commit and the spool's ack stores nothing twice. On
PostgreSQL the fast ``COPY`` stays the normal path; a ``COPY`` that meets a stored row fails
whole and the write is redone through a staging table with ``ON CONFLICT DO NOTHING``
(directly so with ``dedupe=True``, for a caller that knows it replays).

Bad input never raises: each bad batch becomes a :class:`Rejection` and the rest is written
(the checks are :mod:`~tuneloop.storage.timeseries.write_validation`'s).

A writer is safe to share between threads; its caches only ever hold facts that stay true
(a series id, an existing partition) unless series or partitions are deleted, see :meth:`forget`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping
from datetime import timedelta

import numpy as np
import numpy.typing as npt
import psycopg
from sqlalchemy import Connection, Engine

from tuneloop.settings import Settings
from tuneloop.storage.timeseries.columns import Batch, SampleColumns, SeriesTable
from tuneloop.storage.timeseries.partitions import MAX_PARTITIONS_PER_CALL, ensure_partitions
from tuneloop.storage.timeseries.samples_postgres import copy_samples, merge_samples
from tuneloop.storage.timeseries.samples_sqlite import insert_samples
from tuneloop.storage.timeseries.series_ids import create_series, lookup_series
from tuneloop.storage.timeseries.types import WriteResult
from tuneloop.storage.timeseries.write_partitions import (
    batch_partitions,
    block_partitions,
    partition_runs,
)
from tuneloop.storage.timeseries.write_validation import (
    EPOCH,
    MAX_METRIC_LENGTH,
    Accepted,
    Block,
    Identity,
    SampleArrays,
    SeriesSamples,
    cap_rejection,
    table_identities,
    validate_batch,
)

__all__ = ["DEFAULT_MAX_SERIES", "MAX_METRIC_LENGTH", "SampleWriter"]

DEFAULT_MAX_SERIES: int = Settings.model_fields["max_series_per_project"].default
_CACHE_LIMIT = 1_000_000
"""Series ids cached before the cache is emptied (about 150 MB); misses only cost a lookup."""
_TABLE_LIMIT = 100_000
"""Series of the checked tables, and series ids of (project, table), kept before each of those
caches empties (about 200 bytes a series: a table's own labels are shared with the receiver)."""


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
        self._identities: dict[tuple[object, ...], Identity] = {}
        # The same for blocks (SampleColumns), by series table: None if one of its series does
        # not pass (its blocks then go the batches' way). And each table's series ids by
        # project, once all of them exist: a block of a known table costs no lookup per series.
        self._tables: dict[SeriesTable, tuple[Identity, ...] | None] = {}
        self._tables_size = 0  # series in _tables
        self._table_ids: dict[tuple[int, SeriesTable], npt.NDArray[np.int64]] = {}
        self._table_ids_size = 0  # series in _table_ids

    def write(
        self,
        project_id: int,
        batches: Iterable[Batch],
        *,
        max_series: int | None = None,
        dedupe: bool = False,
    ) -> WriteResult:
        """Write ``batches`` for ``project_id`` (which must exist); ``max_series`` overrides
        the writer's series cap for this call (a project's own limit). ``dedupe`` says the
        samples may be stored already (a replay): skip the ``COPY`` that would fail on them.
        Samples already stored are skipped either way."""
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
            return self._write(project_id, batches, max_series, dedupe)
        finally:
            if enabled:
                gc.enable()

    def _write(
        self, project_id: int, batches: Iterable[Batch], max_series: int | None, dedupe: bool
    ) -> WriteResult:
        result = WriteResult()
        identities = self._identities
        accepted: list[Accepted | Block] = []
        for batch in batches:
            if isinstance(batch, SampleColumns):
                block = self._check_block(batch)
                if block is not None:
                    accepted.append(block)
                    continue
                # Not in bulk: the batches the block means, each checked as any other (so
                # the same rejections, in the same order).
                for each in batch.to_batches():
                    if (item := validate_batch(each, result, identities)) is not None:
                        accepted.append(item)
            elif (item := validate_batch(batch, result, identities)) is not None:
                accepted.append(item)
        if not accepted:
            return result
        cap = self.max_series_per_project if max_series is None else max_series
        # One connection for the whole call (each checkout pays a pre-ping round trip), with a
        # short transaction per step.
        with self.engine.connect() as connection:
            wanted: list[Accepted] = []
            for part in accepted:
                if isinstance(part, Accepted):
                    wanted.append(part)
                else:
                    part.ids = self._table_ids.get((project_id, part.columns.table))
                    if part.ids is None:
                        wanted.extend(part.entries())
            ids = self._resolve_series(connection, project_id, wanted, cap, result)
            written: list[Accepted] = []
            work: list[SeriesSamples] = []
            blocks: list[SampleArrays] = []
            for part in accepted:
                if isinstance(part, Accepted):
                    series_id = ids.get(part.fingerprint)
                    if series_id is None:
                        result.rejected.append(
                            cap_rejection(part, project_id, cap, len(part.values))
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
                samples = sum(len(values) for _, _, values in work) + sum(
                    len(values) for _, _, values in blocks
                )
                inserted = self._write_samples(connection, written, work, blocks, dedupe)
                result.samples_written = samples
                result.samples_duplicate = 0 if inserted is None else samples - inserted
        return result

    def _check_block(self, columns: SampleColumns) -> Block | None:
        """``columns`` ready to write in bulk, or ``None`` if it must go the batches' way: a
        series that does not pass, or a NaN value (dropped and reported per series there)."""
        if not len(columns) or bool(np.isnan(columns.values).any()):
            return None
        table = columns.table
        if table in self._tables:
            identities = self._tables[table]
        else:
            identities = table_identities(table, self._identities)
            # Bounded by series, not tables: a table may hold many.
            if self._tables_size + len(table) > _TABLE_LIMIT:
                self._tables.clear()
                self._tables_size = 0
            self._tables[table] = identities
            self._tables_size += len(table)
        return None if identities is None else Block(columns, identities)

    def _block_ids(
        self,
        project_id: int,
        block: Block,
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
                    entry = Accepted(
                        table.metrics[index],
                        table.labels[index],
                        block.identities[index].fingerprint,
                        block.identities[index].kind,
                        (),
                        (),
                        EPOCH,
                        EPOCH,
                    )
                    result.rejected.append(
                        cap_rejection(entry, project_id, cap, int(counts[index]))
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
        accepted: list[Accepted],
        cap: int,
        result: WriteResult,
    ) -> dict[str, int]:
        """Ids by fingerprint; a series missing from the answer was refused by the cap."""
        ids: dict[str, int] = {}
        if not accepted:
            return ids
        missing: dict[str, Accepted] = {}
        for item in accepted:
            series_id = self._series_ids.get((project_id, item.fingerprint))
            if series_id is None:
                missing.setdefault(item.fingerprint, item)
            else:
                ids[item.fingerprint] = series_id
        if not missing:
            return ids
        with connection.begin():
            found = lookup_series(connection, project_id, list(missing))
            new = [item for fp, item in missing.items() if fp not in found]
            if new:
                found |= create_series(connection, project_id, new, cap, result)
        if len(self._series_ids) + len(found) > _CACHE_LIMIT:
            self._series_ids.clear()
        self._series_ids.update(((project_id, fp), series_id) for fp, series_id in found.items())
        return ids | found

    # ------------------------------------------------------------------ samples

    def _write_samples(
        self,
        connection: Connection,
        accepted: list[Accepted],
        work: list[SeriesSamples],
        blocks: list[SampleArrays],
        dedupe: bool,
    ) -> int | None:
        """Rows inserted, or ``None`` for "all of them" (a ``COPY`` that went through)."""
        if not self._postgres:
            with connection.begin():
                return insert_samples(connection, work, blocks)
        needed = batch_partitions(accepted, self.partition_days)
        needed |= block_partitions(blocks, self.partition_days)
        self._ensure_partitions(connection, needed)
        try:
            return self._store(connection, work, blocks, dedupe)
        except psycopg.errors.CheckViolation:
            # "no partition of relation samples found for row": a partition this writer had
            # cached was dropped (retention). Forget what we knew, create it again, retry once.
            self._partitions.clear()
            self._ensure_partitions(connection, needed)
            return self._store(connection, work, blocks, dedupe)

    @staticmethod
    def _store(
        connection: Connection,
        work: list[SeriesSamples],
        blocks: list[SampleArrays],
        dedupe: bool,
    ) -> int | None:
        if not dedupe:
            try:
                with connection.begin():
                    copy_samples(connection, work, blocks)
                return None
            except psycopg.errors.UniqueViolation:
                pass  # some were stored already (a replay): the COPY wrote nothing; merge
        with connection.begin():
            return merge_samples(connection, work, blocks)

    def _ensure_partitions(self, connection: Connection, needed: set[int]) -> None:
        needed = needed - self._partitions
        if not needed:
            return
        width = timedelta(days=self.partition_days)
        # Its own transaction, before the COPY's: partition DDL locks ``samples`` exclusively.
        with connection.begin():
            for first, last in partition_runs(sorted(needed), MAX_PARTITIONS_PER_CALL):
                ensure_partitions(
                    connection, EPOCH + width * first, EPOCH + width * last, self.partition_days
                )
        self._partitions |= needed
