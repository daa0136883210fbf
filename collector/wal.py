"""Group commit over the spool, for the pipeline's write-ahead log.

Every accepted submission is written to the spool (:meth:`Spool.write`, no fsync) in the order
it is queued, and its submitter then waits in :meth:`GroupCommit.wait` until a sync covers its
record. The first waiter to find no sync running becomes the leader: it syncs everything
written so far, once, for every record written before it started (the followers), while new
records gather for the next sync. Under load one fsync answers many requests, as in
Prometheus's WAL.
"""

from __future__ import annotations

import threading

from collector.spool import Spool


class GroupCommit:
    """Tickets for written records, and one shared fsync per group of them."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._cond = threading.Condition()
        self._written = 0  # tickets handed out: records written, durable or not
        self._durable = 0  # every ticket up to this one is on disk
        self._syncing = False  # a leader is in fsync

    def written(self) -> int:
        """Count a record just written; its ticket for :meth:`wait`. Call in write order."""
        with self._cond:
            self._written += 1
            return self._written

    def wait(self, ticket: int) -> None:
        """Return once the record of ``ticket`` is durable. Raises ``OSError`` if the sync
        that should have covered it failed (the next waiter tries again)."""
        with self._cond:
            while self._durable < ticket:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                target = self._written
                self._cond.release()
                try:
                    self._spool.sync()
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                self._durable = max(self._durable, target)
