"""The tuning-outcome benchmark's table: time to target of the start, default and tuned configs
with 95% t intervals, the tuned config's speed-up over each with Welch's 95% interval of the
difference, and where the tuned config falls on the job's measured surface."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from job_runs import Placement, charged_time

from tuneloop.demo import stats
from tuneloop.demo.stats import Interval

Config = Mapping[str, int]


@dataclass(frozen=True)
class ConfigOutcome:
    """One config's fresh runs to the target."""

    label: str
    config: dict[str, int]
    times_s: list[float]
    """Time to target per run; a run that missed counts at its budget."""
    reached: int
    time_to_target: Interval

    @classmethod
    def of(cls, label: str, config: Config, runs: Sequence[Mapping[str, Any]]) -> ConfigOutcome:
        times = [charged_time(run) for run in runs]
        return cls(
            label=label,
            config={k: int(v) for k, v in config.items()},
            times_s=times,
            reached=sum(run["time_to_target_s"] is not None for run in runs),
            time_to_target=stats.mean_interval(times),
        )


@dataclass(frozen=True)
class Speedup:
    """``other``'s mean time to target / the tuned config's, and Welch's 95% interval of
    ``mean(other) - mean(tuned)`` in seconds (positive: the tuned config is faster)."""

    versus: str
    ratio: float
    difference_s: float
    low_s: float
    high_s: float
    missed: int = 0
    """Runs of either config that missed the target (counted at their budget)."""

    @property
    def significant(self) -> bool:
        return self.low_s > 0 or self.high_s < 0

    @classmethod
    def of(cls, tuned: ConfigOutcome, other: ConfigOutcome) -> Speedup:
        welch = stats.welch_faster(tuned.times_s, other.times_s)
        return cls(
            versus=other.label,
            ratio=other.time_to_target.mean / tuned.time_to_target.mean,
            difference_s=welch.difference,
            low_s=welch.low,
            high_s=welch.high,
            missed=sum(len(o.times_s) - o.reached for o in (tuned, other)),
        )

    def line(self) -> str:
        word = "faster" if self.ratio >= 1 else "slower"
        sure = "beyond the noise" if self.significant else "within the noise"
        missed = f"; {self.missed} run(s) missed the target, counted at the budget" * (
            self.missed > 0
        )
        return (
            f"tuned vs {self.versus}: {self.ratio:.2f}x {word}, {sure} (difference "
            f"{self.difference_s:+.2f} s, 95% CI {self.low_s:+.2f} .. {self.high_s:+.2f} s"
            f"{missed})"
        )


def table(
    outcomes: Sequence[ConfigOutcome],
    target: str,
    placement: Placement | None,
    load: Mapping[str, float],
) -> tuple[list[str], list[Speedup]]:
    """The printed table and the tuned config's speed-ups (none without a ``tuned`` row)."""
    lines = [f"{'config':>8} {'batch x sync':>13} {'time to ' + target:>22} {'reached':>8}"]
    for outcome in outcomes:
        shape = f"{outcome.config['batch_size']} x {outcome.config['sync_period']}"
        reached = f"{outcome.reached}/{len(outcome.times_s)}"
        lines.append(
            f"{outcome.label:>8} {shape:>13} {outcome.time_to_target.fmt('s', 2):>22} {reached:>8}"
        )
    lines.append("(mean of fresh runs +- the half-width of its 95% t interval; training time)")
    by_label = {outcome.label: outcome for outcome in outcomes}
    tuned = by_label.get("tuned")
    speedups = []
    if tuned is not None and len(tuned.times_s) >= 2:
        for other in outcomes:
            if other.label != "tuned" and len(other.times_s) >= 2:
                speedups.append(Speedup.of(tuned, other))
                lines.append(speedups[-1].line())
    if placement is not None:
        best = f"{placement.best['batch_size']} x {placement.best['sync_period']}"
        lines.append(
            f"on the measured surface: tuned ranks {placement.rank} of {placement.of}, at "
            f"{placement.speed_fraction:.0%} of the best config's speed ({best})"
        )
    lines.append(
        f"host: 1-minute load average {load['min']:.2f} .. {load['max']:.2f} during the runs, "
        f"{int(load['burners'])} CPU burner(s) beside the job"
    )
    return lines, speedups


def as_json(outcomes: Sequence[ConfigOutcome], speedups: Sequence[Speedup]) -> dict[str, Any]:
    return {
        "configs": {o.label: asdict(o) for o in outcomes},
        "speedups": [{**asdict(s), "significant": s.significant} for s in speedups],
    }
