"""How the example's processes end: SIGTERM unwinds the stack, so ``finally`` blocks run."""

from __future__ import annotations

import signal


def exit_on_sigterm() -> None:
    """uvicorn handles SIGTERM while it serves, then raises it again once it has stopped: with
    Python's default action the process would die there, before a scaler stops its replicas
    or a replica's agent sends its last acknowledgement."""

    def leave(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, leave)
