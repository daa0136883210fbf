"""The knobs a replica declares to tuneloop (``examples.inference.server``): the wire form the
API parses, a starting value outside its range refused, and a released config checked against
the declarations before anything is applied."""

from __future__ import annotations

from typing import Any

import pytest

from examples.inference.server import checked_release, declared_knobs
from tuneloop.agent.knobs import KnobError
from tuner.knobs import parse_knobs
from tuner.params import IntParam

START = {"max_batch_size": 8, "max_delay_ms": 5}


def test_the_declarations_are_what_a_study_searches() -> None:
    applied: list[dict[str, Any]] = []
    knobs = declared_knobs(START, lambda **values: applied.append(values))
    parsed = parse_knobs([k.declaration() for k in knobs])
    assert [(k.param, k.default) for k in parsed] == [
        (IntParam("max_batch_size", 1, 64, powers_of_two=True), 8),
        (IntParam("max_delay_ms", 1, 64, log=True), 5),
    ]
    for knob, value in zip(knobs, (16, 2), strict=True):
        knob.apply(value)
    assert applied == [{"max_batch_size": 16}, {"max_delay_ms": 2}]


@pytest.mark.parametrize(
    ("start", "says"),
    [
        ({"max_batch_size": 3, "max_delay_ms": 5}, "max_batch_size=3 is not a power of two"),
        ({"max_batch_size": 8, "max_delay_ms": 0}, "max_delay_ms=0 is outside [1, 64]"),
        ({"max_batch_size": 128, "max_delay_ms": 5}, "max_batch_size=128 is outside [1, 64]"),
    ],
)
def test_a_starting_value_outside_its_range_is_refused(start: dict[str, int], says: str) -> None:
    with pytest.raises(KnobError) as raised:
        declared_knobs(start, print)
    assert says in str(raised.value)


def test_a_released_config_is_checked_before_it_is_applied() -> None:
    knobs = declared_knobs(START, print)
    assert checked_release(knobs, {"max_batch_size": 32, "max_delay_ms": 1}) == {
        "max_batch_size": 32,
        "max_delay_ms": 1,
    }
    assert checked_release(knobs, {"max_delay_ms": 9}) == {"max_delay_ms": 9}, "one knob only"
    for config, says in (
        ({"max_batch_size": 0}, "max_batch_size=0 is outside [1, 64]"),
        ({"max_batch_size": 12}, "not a power of two"),
        ({"max_delay_ms": 2.5}, "max_delay_ms=2.5 is outside"),
        ({"batch_size": 8}, "unknown knob(s) ['batch_size']"),
    ):
        with pytest.raises(KnobError) as raised:
            checked_release(knobs, config)
        assert says in str(raised.value), config
