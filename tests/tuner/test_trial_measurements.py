"""The typed owner of ``Trial.measurements``: round trip, and rows written by older versions."""

from __future__ import annotations

import json

import pytest

from tuner.trial_measurements import (
    ACK_TIMEOUT_KEY,
    GPU_MEMORY_KEY,
    WAITED_S_KEY,
    TrialMeasurements,
)


def test_round_trip_keeps_every_field_and_stays_plain_json() -> None:
    told = TrialMeasurements.running({"load": 0.5}).told(
        stderr=1.25,
        reason="",
        data={"noisy": True, "verdict": "accepted", GPU_MEMORY_KEY: {"peak_mib": 10.0}},
    )
    stored = json.loads(json.dumps(told.to_json()))
    assert stored == {
        "context": {"load": 0.5},
        "stderr": 1.25,
        "reason": "",
        "data": {"noisy": True, "verdict": "accepted", GPU_MEMORY_KEY: {"peak_mib": 10.0}},
    }
    again = TrialMeasurements.from_json(stored)
    assert again == told
    assert again.to_json() == stored
    assert again.gpu_memory == {"peak_mib": 10.0}


def test_a_running_trial_has_its_context_and_nothing_told() -> None:
    assert TrialMeasurements.running().to_json() == {
        "context": {},
        "stderr": None,
        "reason": "",
        "data": {},
    }


@pytest.mark.parametrize("raw", [None, {}, [], "x"])
def test_an_empty_or_malformed_column_reads_as_defaults(raw: object) -> None:
    read = TrialMeasurements.from_json(raw)
    assert read == TrialMeasurements()
    assert not read.ack_timed_out and read.waited_s == 0.0 and read.gpu_memory is None


def test_an_old_style_row_reads_with_its_missing_and_unknown_keys_tolerated() -> None:
    # Written before context was recorded: no context, a null reason, an integer stderr, a
    # key nobody writes any more, and the loop's ack timeout in its data.
    old = {
        "stderr": 2,
        "reason": None,
        "samples": [1, 2, 3],
        "data": {"desired_version": 4, WAITED_S_KEY: 90, ACK_TIMEOUT_KEY: True},
    }
    read = TrialMeasurements.from_json(old)
    assert read.context == {} and read.reason == "" and read.stderr == 2.0
    assert read.ack_timed_out and read.waited_s == 90.0
    assert read.data["desired_version"] == 4
    assert "samples" not in read.to_json()


def test_non_finite_or_non_numeric_figures_read_as_absent() -> None:
    read = TrialMeasurements.from_json(
        {"stderr": "1.0", "data": {WAITED_S_KEY: True, GPU_MEMORY_KEY: "full"}}
    )
    assert read.stderr is None and read.waited_s == 0.0 and read.gpu_memory is None
    assert TrialMeasurements.from_json({"stderr": float("nan")}).stderr is None
