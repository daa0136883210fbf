"""Delta temporality -> cumulative, in process (as the OpenTelemetry Collector's
``deltatocumulative`` processor does).

Why cumulative: a metric name then means one thing whatever the exporter's temporality, so
counters, ``histogram_quantile`` and dashboards read delta and cumulative producers alike.

Per series (project, metric, labels) the accumulator keeps the running total and the
``(start, end)`` of the last delta it added. A delta point is

* added when it starts at or after the last one's end (gaps are normal: the SDK skips
  intervals without measurements) or has no start time and ends later;
* a repeat when its ``(start, end)`` equals the last one's: the same total is returned again,
  so a client retrying a request (after a 503, a timeout) writes the same values, not double;
* refused otherwise (out of order or overlapping), and counted as rejected.

The state lives in this process, bounded to ``max_series`` series (least recently updated
dropped first). A restart, or a dropped series, starts again from its next delta, which readers
see as a counter reset (as after a restart of a cumulative producer). The deltas of one series
must therefore reach one API process; behind a load balancer, export cumulative temporality.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

T = TypeVar("T")

DEFAULT_MAX_SERIES: Final = 50_000


@dataclass(slots=True)
class _State:
    start_ns: int
    end_ns: int
    total: Any


class OutOfOrder(Exception):
    """A delta point that starts before the last one added for its series ended."""


class DeltaAccumulator:
    """Running totals of delta series; safe to share between threads."""

    def __init__(self, max_series: int = DEFAULT_MAX_SERIES) -> None:
        if max_series < 1:
            raise ValueError(f"max_series must be >= 1, got {max_series}")
        self.max_series = max_series
        self._states: OrderedDict[Hashable, _State] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._states)

    def add(
        self,
        key: Hashable,
        start_ns: int,
        end_ns: int,
        delta: T,
        combine: Callable[[T, T], T | None],
    ) -> T:
        """The cumulative value of series ``key`` after the delta ``delta`` covering
        ``(start_ns, end_ns]``. ``combine(total, delta)`` adds; it returns ``None`` when the two
        cannot be added (a histogram whose bounds changed), which starts the series again.

        Raises :class:`OutOfOrder` for a point that can be neither added nor repeated.
        """
        with self._lock:
            state = self._states.get(key)
            if state is None:
                total = delta
            elif (start_ns, end_ns) == (state.start_ns, state.end_ns):
                self._states.move_to_end(key)
                result: T = state.total
                return result
            elif end_ns > state.end_ns and (start_ns >= state.end_ns or start_ns == 0):
                combined = combine(state.total, delta)
                total = delta if combined is None else combined
            else:
                raise OutOfOrder(
                    f"delta ({start_ns}, {end_ns}] starts before the previous one "
                    f"({state.start_ns}, {state.end_ns}] ended"
                )
            self._states[key] = _State(start_ns, end_ns, total)
            self._states.move_to_end(key)
            while len(self._states) > self.max_series:
                self._states.popitem(last=False)
            return total
