"""One ``tuneloop up`` per data directory: two would share the SQLite file and the spool, each
replaying and deleting what the other is writing.

An ``fcntl`` lock on ``data_dir/tuneloop.lock``, held for the life of the process: the kernel
releases it when the process ends, however it ends, so a crash never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_NAME = "tuneloop.lock"


class DataDirInUse(RuntimeError):
    """Another process holds the data directory."""


def lock_data_dir(data_dir: Path) -> IO[str]:
    """Take the data directory's lock, or raise :class:`DataDirInUse` naming the holder's pid.
    Keep the returned file open as long as the lock is needed."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    handle = path.open("a+", encoding="utf-8")
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise DataDirInUse(
            f"another tuneloop up (pid {holder}) is running on data directory {data_dir}; "
            "stop it, or give this one its own --data-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle
