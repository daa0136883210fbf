"""A job's own knobs: the settings its agent declares (name, type, range or choices, default)
and applies at a step boundary, and which of them each diagnosis verdict points at.

A declaration is one parameter of :mod:`tuner.params` in its JSON form plus the job's
``default`` (the value it starts with)::

    {"type": "int", "name": "loader_workers", "low": 0, "high": 8, "default": 0}
    {"type": "categorical", "name": "grad_compression", "choices": [false, true],
     "default": false}

Pure: the API validates declarations with :func:`parse_knobs` before it stores them, and a
study from a diagnosis takes its space from :func:`diagnosis_space`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tuneloop.errors import Conflict
from tuner.diagnosis import Verdict
from tuner.effective_batch import BATCH_SIZE, BUCKET_MB, SYNC_PERIOD
from tuner.params import Param, ParamValue, SpaceError, describe_param, param_from_dict
from tuner.space import SearchSpace

LOADER_WORKERS: Final = "loader_workers"
PREFETCH_FACTOR: Final = "prefetch_factor"
GRAD_COMPRESSION: Final = "grad_compression"
"""The names ``tuneloop.agent.torch``'s appliers declare (``tuneloop.agent.knobs`` spells
them for the job side, which imports nothing of the server)."""

MAX_KNOBS: Final = 64

VERDICT_KNOBS: Final[Mapping[Verdict, tuple[str, ...]]] = {
    Verdict.INPUT_BOUND: (LOADER_WORKERS, PREFETCH_FACTOR),
    Verdict.COMMUNICATION_BOUND: (BUCKET_MB, GRAD_COMPRESSION, SYNC_PERIOD),
    Verdict.COMPUTE_BOUND: (BATCH_SIZE,),
    Verdict.MEMORY_BOUND: (BATCH_SIZE,),
}
"""The knobs a study from a diagnosis searches, per verdict (docs/diagnosis.md). ``idle``,
``mixed`` and ``no_data`` point at no knob: there is nothing a study could show."""


class NoKnobToTune(Conflict):
    """A diagnosis points at no knob the job declared (or at none at all): the job's state,
    not the request, stands in the way (HTTP 409)."""


@dataclass(frozen=True, slots=True)
class Knob:
    """One declared knob: the parameter a study may search, and the job's starting value."""

    param: Param
    default: ParamValue

    @property
    def name(self) -> str:
        return self.param.name

    def to_dict(self) -> dict[str, Any]:
        return {**self.param.to_dict(), "default": self.default}


def parse_knob(data: Mapping[str, Any]) -> Knob:
    """One declaration, or a :class:`SpaceError` naming the knob and the problem."""
    if not isinstance(data, Mapping):
        raise SpaceError(f"a knob declaration must be an object, got {data!r}")
    name = data.get("name")
    fields = {k: v for k, v in data.items() if k != "default"}
    try:
        param = param_from_dict(fields)
    except SpaceError as exc:
        raise SpaceError(f"knob {name!r}: {exc}") from None
    if "default" not in data:
        raise SpaceError(f"knob {param.name!r}: missing field 'default' (the job's own value)")
    default = data["default"]
    if not param.contains(default):
        raise SpaceError(
            f"knob {param.name!r}: default {default!r} is outside {describe_param(param)}"
        )
    return Knob(param, default)


def parse_knobs(declared: Sequence[Mapping[str, Any]]) -> list[Knob]:
    """Every declaration of one registration, names unique, at most :data:`MAX_KNOBS`."""
    if len(declared) > MAX_KNOBS:
        raise SpaceError(f"at most {MAX_KNOBS} knobs, got {len(declared)}")
    knobs = [parse_knob(one) for one in declared]
    names = [k.name for k in knobs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpaceError(f"knob {twice[0]!r} is declared twice")
    return knobs


def stored_knobs(knobs: Sequence[Knob]) -> dict[str, dict[str, Any]]:
    """How an agent's registration stores its knobs: name -> declaration."""
    return {k.name: {f: v for f, v in k.to_dict().items() if f != "name"} for k in knobs}


def knobs_of(stored: Mapping[str, Any]) -> list[Knob]:
    """The knobs as :func:`stored_knobs` stored them."""
    return parse_knobs([{**dict(v), "name": k} for k, v in stored.items()])


def check_values(declared: Sequence[Knob], config: Mapping[str, Any]) -> None:
    """A :class:`SpaceError` naming the first value of ``config`` outside the range or
    choices its knob declared (keys that are no knob are not looked at)."""
    for knob in declared:
        if knob.name in config and not knob.param.contains(config[knob.name]):
            raise SpaceError(
                f"{knob.name}={config[knob.name]!r} is outside {describe_param(knob.param)}, "
                "the range the job declared for that knob"
            )


def diagnosis_knobs(verdict: Verdict, declared: Sequence[Knob]) -> list[Knob]:
    """The declared knobs ``verdict`` points at, in the mapping's order; refused with a
    :class:`NoKnobToTune` naming the verdict (and what it would tune) when there are none."""
    wanted = VERDICT_KNOBS.get(verdict)
    if not wanted:
        raise NoKnobToTune(
            f"the diagnosis is {verdict.value}: no knob to tune for it (studies start from "
            f"{', '.join(v.value for v in VERDICT_KNOBS)})"
        )
    by_name = {k.name: k for k in declared}
    chosen = [by_name[name] for name in wanted if name in by_name]
    if not chosen:
        have = sorted(by_name) or "none"
        raise NoKnobToTune(
            f"the diagnosis is {verdict.value}, which tunes {', '.join(wanted)}, but the job "
            f"declared none of them (declared: {have}); declare them through its agent "
            "(docs/agent.md, 'Knobs')"
        )
    return chosen


def diagnosis_space(verdict: Verdict, declared: Sequence[Knob]) -> SearchSpace:
    """The search space of a study from a diagnosis: the knobs it points at, each over its
    declared range. No learning-rate rule: a job changing its batch size keeps its own."""
    return SearchSpace(tuple(k.param for k in diagnosis_knobs(verdict, declared)), None)


__all__ = [
    "GRAD_COMPRESSION",
    "LOADER_WORKERS",
    "PREFETCH_FACTOR",
    "VERDICT_KNOBS",
    "Knob",
    "NoKnobToTune",
    "check_values",
    "diagnosis_knobs",
    "diagnosis_space",
    "knobs_of",
    "parse_knob",
    "parse_knobs",
    "stored_knobs",
]
