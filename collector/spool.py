"""The on-disk spool: where accepted samples wait while the store is unreachable, and, when the
pipeline is durable, its write-ahead log (:meth:`Spool.write`, :meth:`Spool.sync` and
:meth:`Spool.ack_to`; group commit in :mod:`collector.wal`).

Layout: ``<root>/slot-N/`` directories, each leased by one process through an exclusive
``flock`` on ``slot-N/lock`` (released by the kernel when the process dies, so a crashed
process's slot is picked up and replayed by the next one to start). A slot holds numbered,
append-only segment files (their format: :mod:`collector.spool_format`) and an ``ack`` file
naming how far replay has committed.

A record is flushed and fsync'ed before :meth:`Spool.append` returns, so what it accepted
survives a crash of the process (and of the machine). A crash in the middle of an append leaves
a torn last record; its checksum exposes it and it is cut off at the next start (it was never
acknowledged to anyone).

Replay is at-least-once: the ``ack`` file is advanced after each committed write, so a crash
between the commit and the ack repeats that one group, nothing more.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collector.spool_format import (
    MAGIC,
    RECORD_HEADER,
    Encoded,
    SpoolCorrupt,
    decode_record,
    encode_record,
    read_record,
    valid_prefix,
)
from tuneloop.errors import TemporaryError
from tuneloop.storage.timeseries.columns import Batch
from tuneloop.storage.timeseries.types import SeriesBatch

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "MAGIC",
    "MAX_SLOTS",
    "SEGMENT_SUFFIX",
    "Encoded",
    "Position",
    "Spool",
    "SpoolCorrupt",
    "SpoolFull",
    "SpoolGroup",
    "decode_record",
    "encode_record",
]

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".seg"
MAX_SLOTS = 64
DEFAULT_SEGMENT_BYTES = 16 * 1024 * 1024


class SpoolFull(TemporaryError):
    """The spool cannot take this record (size limit, no free slot, or a disk error)."""


@dataclass(frozen=True, slots=True)
class Position:
    segment: int
    offset: int


@dataclass(slots=True)
class SpoolGroup:
    """Consecutive records of one project, read for replay; :meth:`Spool.ack` it once its
    write committed."""

    project_id: int
    batches: list[SeriesBatch]
    samples: int
    end: Position


class Spool:
    """Append-only, size-bounded, crash-safe queue of records on disk.

    ``append`` may be called from any thread; ``read_group``/``ack`` from one replaying thread
    at a time. Nothing touches the disk until the first append, or until :meth:`open` finds
    a slot left with data by an earlier process.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        store: str = "",
        fsync: bool = True,
    ) -> None:
        if max_bytes <= 0 or segment_bytes <= 0:
            raise ValueError("max_bytes and segment_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.segment_bytes = min(segment_bytes, max_bytes)
        self._store = store
        self._fsync = fsync
        self._lock = threading.Lock()
        self._slot: Path | None = None
        self._lock_fd: int | None = None
        self._sizes: dict[int, int] = {}  # segment number -> bytes on disk, in order
        self._active: int | None = None  # the segment appends go to
        self._active_file: Any = None
        self._cursor: Position | None = None  # first byte not yet replayed
        self._closed = False

    # ------------------------------------------------------------------ state

    @property
    def slot(self) -> Path | None:
        """The slot directory this process leases (``None`` until it needs one)."""
        return self._slot

    @property
    def pending_bytes(self) -> int:
        """Bytes written and not yet replayed."""
        with self._lock:
            return self._pending_bytes()

    @property
    def empty(self) -> bool:
        with self._lock:
            return self._pending_bytes() == 0

    def _pending_bytes(self) -> int:
        if self._cursor is None:
            return 0
        total = sum(self._sizes.values())
        done = sum(size for seq, size in self._sizes.items() if seq < self._cursor.segment)
        return total - done - self._cursor.offset

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> bool:
        """Lease a slot that an earlier process left with data for this store, if any, so
        that it is replayed first. Returns whether there is data to replay."""
        with self._lock:
            if self._slot is None and self.root.is_dir():
                self._claim(with_data=True)
            return self._pending_bytes() > 0

    def close(self) -> None:
        """Release the slot (its data stays for the next process). Idempotent."""
        with self._lock:
            self._closed = True
            if self._active_file is not None:
                self._active_file.close()
                self._active_file = None
            if self._slot is not None and self._pending_bytes() == 0:
                self._remove_all_segments()
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None
            self._slot = None

    # ------------------------------------------------------------------ append

    def append(self, project_id: int, batches: Sequence[Batch]) -> Encoded:
        """Write one record durably, or raise :class:`SpoolFull` having written nothing.
        Batches that cannot be represented are left out and returned as rejected."""
        encoded = encode_record(project_id, batches)
        if not encoded.samples:
            return encoded
        with self._lock:
            if self._closed:
                raise SpoolFull("the spool is closed")
            if self._slot is None and not self._claim(with_data=False):
                raise SpoolFull(f"no free spool slot under {self.root}")
            if self._pending_bytes() + len(encoded.data) > self.max_bytes:
                raise SpoolFull(
                    f"the spool is full ({self._pending_bytes()} of {self.max_bytes} bytes)"
                )
            self._write(encoded.data, sync=self._fsync)
        return encoded

    def write(self, encoded: Encoded) -> Position:
        """Write an encoded record without waiting for the disk (:meth:`sync` does); return
        where it ends, for :meth:`ack_to`. Raises :class:`SpoolFull` having written nothing.
        The write-ahead log's path: many records share one fsync."""
        with self._lock:
            if self._closed:
                raise SpoolFull("the spool is closed")
            if self._slot is None and not self._claim(with_data=False):
                raise SpoolFull(f"no free spool slot under {self.root}")
            if self._pending_bytes() + len(encoded.data) > self.max_bytes:
                raise SpoolFull(
                    f"the spool is full ({self._pending_bytes()} of {self.max_bytes} bytes)"
                )
            self._write(encoded.data, sync=False)
            assert self._active is not None
            return Position(self._active, self._sizes[self._active])

    def sync(self) -> None:
        """Make every record written so far durable. The fsync runs outside the lock, so that
        writers go on filling the next group meanwhile; a segment closed since was fsync'ed
        when it was closed."""
        with self._lock:
            if self._active_file is None or not self._fsync:
                return
            fd = os.dup(self._active_file.fileno())
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def ack_to(self, end: Position) -> None:
        """Record that everything up to ``end`` is committed in the store (no-op if the
        replay cursor is already past it)."""
        with self._lock:
            cursor = self._cursor
            if cursor is None or (end.segment, end.offset) <= (cursor.segment, cursor.offset):
                return
            self._cursor = end
            self._skip_finished()
            self._save_ack()

    def _write(self, data: bytes, *, sync: bool) -> None:
        try:
            file = self._segment_for(len(data))
        except OSError as exc:
            raise SpoolFull(f"cannot create a spool segment: {exc}") from exc
        assert self._active is not None
        offset = self._sizes[self._active]
        try:
            view = memoryview(data)
            while view:
                view = view[file.write(view) :]
            if sync:
                os.fsync(file.fileno())
        except OSError as exc:
            # Disk full or failing: cut the partial record so the segment stays readable.
            try:
                file.truncate(offset)
                file.seek(offset)
            except OSError:
                log.exception("cannot truncate spool segment after a failed write")
            raise SpoolFull(f"cannot write the spool: {exc}") from exc
        self._sizes[self._active] = offset + len(data)
        if self._cursor is None:
            self._cursor = Position(self._active, len(MAGIC))

    def _segment_for(self, size: int) -> Any:
        if self._active is not None:
            current = self._sizes[self._active]
            if current == len(MAGIC) or current + size <= self.segment_bytes:
                return self._active_file
            if self._fsync:  # records written without sync are made durable before closing
                os.fsync(self._active_file.fileno())
            self._active_file.close()
            self._active_file = None
        assert self._slot is not None
        number = max(self._sizes, default=0) + 1
        path = self._slot / f"{number:016d}{SEGMENT_SUFFIX}"
        file = open(path, "xb", buffering=0)  # noqa: SIM115 - kept open across appends
        file.write(MAGIC)
        if self._fsync:
            os.fsync(file.fileno())
            _fsync_dir(self._slot)
        self._active, self._active_file = number, file
        self._sizes[number] = len(MAGIC)
        return file

    # ------------------------------------------------------------------ replay

    def read_group(self, max_samples: int) -> SpoolGroup | None:
        """The oldest records not yet replayed, of one project, up to about ``max_samples``
        (at least one record); ``None`` when everything has been replayed."""
        with self._lock:
            self._skip_finished()
            if self._cursor is None or self._slot is None:
                return None
            cursor, end = self._cursor, self._sizes[self._cursor.segment]
            path = self._segment_path(cursor.segment)
        # Appends only ever extend the file past ``end``; reading without the lock is safe.
        group: SpoolGroup | None = None
        with open(path, "rb") as file:
            file.seek(cursor.offset)
            offset = cursor.offset
            while offset < end and (group is None or group.samples < max_samples):
                try:
                    payload = read_record(file, end - offset)
                    project_id, batches = decode_record(payload)
                except SpoolCorrupt as exc:
                    self._cut(cursor.segment, offset, exc)
                    break
                if group is not None and project_id != group.project_id:
                    break
                offset += RECORD_HEADER.size + len(payload)
                samples = sum(len(batch.values) for batch in batches)
                if group is None:
                    group = SpoolGroup(project_id, [], 0, Position(cursor.segment, offset))
                group.batches.extend(batches)
                group.samples += samples
                group.end = Position(cursor.segment, offset)
        if group is None:
            # Only a corrupt tail was left in this segment: move on to the next one.
            return self.read_group(max_samples) if not self.empty else None
        return group

    def ack(self, group: SpoolGroup) -> None:
        """Record that ``group`` is committed in the store; finished segments are deleted."""
        with self._lock:
            self._cursor = group.end
            self._skip_finished()
            self._save_ack()

    def _skip_finished(self) -> None:
        """Delete fully replayed segments and move the cursor to the next unread byte."""
        while self._cursor is not None:
            seq = self._cursor.segment
            if self._cursor.offset < self._sizes.get(seq, 0):
                return
            if seq == self._active:
                # All caught up: drop the active segment too; the next append starts afresh.
                if self._active_file is not None:
                    self._active_file.close()
                self._active, self._active_file = None, None
            self._unlink(seq)
            later = [number for number in self._sizes if number > seq]
            self._cursor = Position(min(later), len(MAGIC)) if later else None
        if self._slot is not None:
            self._remove_ack()

    def _cut(self, segment: int, offset: int, exc: Exception) -> None:
        with self._lock:
            lost = self._sizes[segment] - offset
            log.error(
                "spool segment %s is corrupt at byte %d (%s); skipping its last %d bytes",
                self._segment_path(segment),
                offset,
                exc,
                lost,
            )
            self._sizes[segment] = offset
            if segment == self._active and self._active_file is not None:
                self._active_file.truncate(offset)
                self._active_file.seek(offset)

    # ------------------------------------------------------------------ slots

    def _claim(self, *, with_data: bool) -> bool:
        """Lease the first free slot (with data for this store, when ``with_data``)."""
        if not with_data:
            self.root.mkdir(parents=True, exist_ok=True)
        for index in range(MAX_SLOTS):
            path = self.root / f"slot-{index}"
            has_data = _has_segments(path)
            if with_data and not has_data:
                continue
            path.mkdir(exist_ok=True)
            fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            owner = _read_text(path / "store")
            if has_data and owner and owner != self._store:
                log.warning(
                    "spool slot %s holds samples for another store (%s); leaving it alone",
                    path,
                    owner,
                )
                os.close(fd)
                continue
            self._adopt(path, fd)
            return True
        return False

    def _adopt(self, path: Path, fd: int) -> None:
        self._slot, self._lock_fd = path, fd
        (path / "store").write_text(self._store)
        for segment in sorted(path.glob(f"*{SEGMENT_SUFFIX}")):
            try:
                number = int(segment.stem)
            except ValueError:
                continue
            self._sizes[number] = segment.stat().st_size
        ack = _read_ack(path / "ack")
        for number in [n for n in self._sizes if ack is not None and n < ack.segment]:
            self._unlink(number)
        if self._sizes:
            first = min(self._sizes)
            offset = ack.offset if ack is not None and ack.segment == first else len(MAGIC)
            self._cursor = Position(first, offset)
            self._repair()
            self._skip_finished()
            if self._cursor is not None:
                log.warning(
                    "spool slot %s holds %d bytes from an earlier run; replaying them first",
                    path,
                    self._pending_bytes(),
                )

    def _repair(self) -> None:
        """Cut a torn tail (a crash mid-append) off the newest segment. Only the newest can be
        torn: older ones were complete when the next was started. Corruption elsewhere (a
        failing disk) is caught by the checksums when the records are read."""
        number = max(self._sizes)
        path = self._segment_path(number)
        with open(path, "rb") as file:
            if file.read(len(MAGIC)) != MAGIC:
                # Torn while being created; holds no record.
                good = len(MAGIC)
            else:
                good = valid_prefix(file, self._sizes[number])
        if good < self._sizes[number]:
            log.warning("cutting %d torn bytes off the end of %s", self._sizes[number] - good, path)
            with open(path, "r+b") as file:
                file.truncate(good)
        self._sizes[number] = good

    # ------------------------------------------------------------------ files

    def _segment_path(self, number: int) -> Path:
        assert self._slot is not None
        return self._slot / f"{number:016d}{SEGMENT_SUFFIX}"

    def _unlink(self, number: int) -> None:
        self._sizes.pop(number, None)
        self._segment_path(number).unlink(missing_ok=True)

    def _remove_all_segments(self) -> None:
        for number in list(self._sizes):
            self._unlink(number)
        self._remove_ack()

    def _save_ack(self) -> None:
        if self._slot is None or self._cursor is None:
            return
        temporary = self._slot / "ack.tmp"
        with open(temporary, "w") as file:
            json.dump({"segment": self._cursor.segment, "offset": self._cursor.offset}, file)
            file.flush()
            if self._fsync:
                os.fsync(file.fileno())
        os.replace(temporary, self._slot / "ack")
        if self._fsync:
            _fsync_dir(self._slot)

    def _remove_ack(self) -> None:
        assert self._slot is not None
        (self._slot / "ack").unlink(missing_ok=True)


def _has_segments(path: Path) -> bool:
    return path.is_dir() and any(path.glob(f"*{SEGMENT_SUFFIX}"))


def _read_text(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _read_ack(path: Path) -> Position | None:
    try:
        data = json.loads(path.read_text())
        return Position(int(data["segment"]), int(data["offset"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring unreadable %s: replay starts at the oldest segment", path)
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
