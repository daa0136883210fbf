"""The declared knobs (``tuner.knobs``): declarations parsed or refused naming the knob, the
verdict -> knobs table, and the job side (``tuneloop.agent.knobs``) speaking the same names
and the same wire form."""

from __future__ import annotations

from typing import Any

import pytest

from tuneloop.agent import knobs as sdk
from tuneloop.errors import Conflict
from tuner import knobs
from tuner.diagnosis import Verdict
from tuner.params import CategoricalParam, IntParam, SpaceError

WORKERS = {"name": "loader_workers", "type": "int", "low": 0, "high": 8, "default": 2}
PREFETCH = {"name": "prefetch_factor", "type": "int", "low": 1, "high": 4, "default": 2}
BUCKET = {"name": "bucket_mb", "type": "int", "low": 1, "high": 64, "log": True, "default": 25}
COMPRESS = {
    "name": "grad_compression",
    "type": "categorical",
    "choices": [False, True],
    "default": False,
}
SYNC = {"name": "sync_period", "type": "int", "low": 1, "high": 8, "default": 1}
BATCH = {"name": "batch_size", "type": "int", "low": 8, "high": 64, "default": 16}
ALL = [WORKERS, PREFETCH, BUCKET, COMPRESS, SYNC, BATCH]


def test_a_declaration_is_a_parameter_and_a_default() -> None:
    parsed = knobs.parse_knobs([WORKERS, COMPRESS])
    assert parsed[0] == knobs.Knob(IntParam("loader_workers", 0, 8), 2)
    assert parsed[1] == knobs.Knob(CategoricalParam("grad_compression", (False, True)), False)
    stored = knobs.stored_knobs(parsed)
    assert "name" not in stored["loader_workers"]
    assert knobs.knobs_of(stored) == parsed


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ([{**WORKERS, "low": 9}], "knob 'loader_workers': loader_workers: inverted bounds"),
        ([{k: v for k, v in WORKERS.items() if k != "default"}], "missing field 'default'"),
        ([{**WORKERS, "default": 9}], "knob 'loader_workers': default 9 is outside [0, 8]"),
        ([{**WORKERS, "default": True}], "default True is outside"),
        ([{**COMPRESS, "type": "bool"}], "knob 'grad_compression'"),
        ([{**WORKERS, "name": ""}], "parameter name must be a non-empty string"),
        ([WORKERS, WORKERS], "knob 'loader_workers' is declared twice"),
        (["workers"], "must be an object"),
        ([WORKERS] * 65, "at most 64 knobs"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_knob(declared: list[Any], says: str) -> None:
    with pytest.raises(SpaceError, match=None) as raised:
        knobs.parse_knobs(declared)
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("verdict", "chosen"),
    [
        (Verdict.INPUT_BOUND, ["loader_workers", "prefetch_factor"]),
        (Verdict.COMMUNICATION_BOUND, ["bucket_mb", "grad_compression", "sync_period"]),
        (Verdict.COMPUTE_BOUND, ["batch_size"]),
        (Verdict.MEMORY_BOUND, ["batch_size"]),
    ],
)
def test_each_verdict_searches_its_knobs(verdict: Verdict, chosen: list[str]) -> None:
    space = knobs.diagnosis_space(verdict, knobs.parse_knobs(ALL))
    assert list(space.names) == chosen
    assert space.lr_scaling is None


def test_only_the_declared_knobs_of_the_verdict() -> None:
    declared = knobs.parse_knobs([PREFETCH, BATCH])
    assert list(knobs.diagnosis_space(Verdict.INPUT_BOUND, declared).names) == ["prefetch_factor"]
    with pytest.raises(Conflict, match="communication_bound, which tunes bucket_mb"):
        knobs.diagnosis_space(Verdict.COMMUNICATION_BOUND, declared)


@pytest.mark.parametrize("verdict", [Verdict.NO_DATA, Verdict.IDLE, Verdict.MIXED])
def test_verdicts_without_knobs_start_no_study(verdict: Verdict) -> None:
    with pytest.raises(knobs.NoKnobToTune, match=f"the diagnosis is {verdict.value}"):
        knobs.diagnosis_space(verdict, knobs.parse_knobs(ALL))


def test_values_outside_a_declared_range_are_refused() -> None:
    declared = knobs.parse_knobs([WORKERS, COMPRESS])
    knobs.check_values(declared, {"loader_workers": 8, "grad_compression": True, "other": 1})
    with pytest.raises(SpaceError, match=r"loader_workers=9 is outside \[0, 8\]"):
        knobs.check_values(declared, {"loader_workers": 9})
    with pytest.raises(SpaceError, match="grad_compression=1 is outside"):
        knobs.check_values(declared, {"grad_compression": 1})


def test_the_job_side_speaks_the_same_names_and_wire_form() -> None:
    assert (sdk.LOADER_WORKERS, sdk.PREFETCH_FACTOR, sdk.GRAD_COMPRESSION) == (
        knobs.LOADER_WORKERS,
        knobs.PREFETCH_FACTOR,
        knobs.GRAD_COMPRESSION,
    )
    assert sdk.BUCKET_MB == "bucket_mb"
    job_side = [
        sdk.Knob.integer("bucket_mb", 1, 64, default=25, apply=print, log=True),
        sdk.Knob.choice("grad_compression", (False, True), default=False, apply=print),
        sdk.Knob.integer("max_batch_size", 1, 64, default=8, apply=print, powers_of_two=True),
    ]
    parsed = knobs.parse_knobs([k.declaration() for k in job_side])
    batch = {"name": "max_batch_size", "type": "int", "low": 1, "high": 64, "default": 8}
    assert parsed == knobs.parse_knobs([BUCKET, COMPRESS, {**batch, "powers_of_two": True}])
    assert parsed[2].param == IntParam("max_batch_size", 1, 64, powers_of_two=True)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: sdk.Knob.integer("w", 4, 2, default=3, apply=print), "low 4 > high 2"),
        (lambda: sdk.Knob.integer("w", 0, 2, default=3, apply=print), "w=3 is outside [0, 2]"),
        (lambda: sdk.Knob.choice("c", (), default=1, apply=print), "empty choices"),
        (lambda: sdk.Knob.choice("c", (1, 2), default=True, apply=print), "not one of"),
        (lambda: sdk.Knob.integer("batch_size", 1, 2, default=1, apply=print), "itself"),
        (lambda: sdk.Knob.integer("d", 0, 9, default=1, apply=print, log=True), "low >= 1"),
        (
            lambda: sdk.Knob.integer("b", 5, 7, default=5, apply=print, powers_of_two=True),
            "holds no power",
        ),
        (
            lambda: sdk.Knob.integer("b", 1, 64, default=6, apply=print, powers_of_two=True),
            "b=6 is not a power of two",
        ),
    ],
)
def test_the_job_side_refuses_a_bad_knob(make: Any, says: str) -> None:
    with pytest.raises(sdk.KnobError) as raised:
        make()
    assert says in str(raised.value)
