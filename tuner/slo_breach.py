"""Which way a configuration broke the latency SLO, for the strategies' SLO rule
(``tuner.strategies.base.slo_rule``).

A dynamic batcher holds a batch's first request at most ``max_delay_ms``; past that, what a
request waits is the queue. A breach by a configuration whose delay is under
:data:`WAIT_SHARE` of the SLO cannot come from the wait: the queue grew, the configuration
could not carry the load (**overload**), and one that batches less could not either. A breach
by one whose delay is a larger share may come from the wait itself (**wait**), and one that
waits longer could only do worse. Without a ``max_delay_ms`` knob the breach keeps its plain
``slo`` reason and excludes nothing beyond itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from tuner.strategies.base import REASON_OVERLOAD, REASON_SLO, REASON_WAIT

DELAY_KNOB: Final = "max_delay_ms"
WAIT_SHARE: Final = 0.25
"""A delay under this share of the SLO cannot explain a breach by itself."""


def breach_reason(reason: str, config: Mapping[str, object], slo_s: float) -> str:
    """``reason`` (an ``slo: ...`` verdict) with which way the SLO broke in front of it."""
    delay = config.get(DELAY_KNOB)
    if isinstance(delay, bool) or not isinstance(delay, int) or not reason.startswith(REASON_SLO):
        return reason
    kind = REASON_WAIT if delay / 1000 >= WAIT_SHARE * slo_s else REASON_OVERLOAD
    detail = reason.removeprefix(f"{REASON_SLO}: ")
    return f"{kind} (max_delay_ms {delay} vs SLO {1000 * slo_s:g} ms): {detail}"
