"""The strict-config parser: an unknown key is refused in one line naming where, the unknown
keys and the known ones; a mapping of known keys passes."""

from __future__ import annotations

import pytest

from tuneloop.errors import InvalidInput
from tuneloop.strict import refuse_unknown_keys


def test_known_keys_pass() -> None:
    refuse_unknown_keys({"min": 1}, ("min", "max"), error=InvalidInput, where="bounds.lr")


def test_unknown_keys_are_named_with_where_and_the_known_ones() -> None:
    with pytest.raises(InvalidInput) as refused:
        refuse_unknown_keys(
            {"max": 1, "low": 0, "hi": 2}, ("min", "max"), error=InvalidInput, where="bounds.lr"
        )
    assert str(refused.value) == "bounds.lr: unknown field(s) ['hi', 'low']; known: min, max"


def test_a_set_of_known_keys_is_listed_sorted_and_wordings_can_be_kept() -> None:
    with pytest.raises(ValueError) as refused:
        refuse_unknown_keys(
            {"regexp": "x"},
            {"target_label", "regex", "action"},
            error=ValueError,
            where="rule 1",
            noun="field",
            message="{where}unknown {noun} {names}; known: {known}",
        )
    expected = "rule 1: unknown field 'regexp'; known: action, regex, target_label"
    assert str(refused.value) == expected
