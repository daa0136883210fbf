"""The benchmark scripts import their sibling modules by file name (``bench/`` is a folder of
scripts, not a package), as they do when run as ``python bench/<script>.py``."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
