"""One ``tuneloop up`` per data directory: the second refuses with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tuneloop.cli.data_lock import DataDirInUse, lock_data_dir


def test_the_lock_is_held_until_released(tmp_path: Path) -> None:
    held = lock_data_dir(tmp_path / "data")
    with pytest.raises(DataDirInUse, match=r"another tuneloop up \(pid \d+\)"):
        lock_data_dir(tmp_path / "data")
    held.close()
    lock_data_dir(tmp_path / "data").close()  # free again once the holder is gone


def test_a_second_up_on_the_same_data_dir_refuses_with_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    held = lock_data_dir(data_dir)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tuneloop", "--data-dir", str(data_dir), "up"],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            timeout=60,
        )
    finally:
        held.close()
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert result.stderr.startswith("tuneloop: another tuneloop up (pid ")
    assert str(data_dir) in result.stderr
