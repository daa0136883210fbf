"""tuneloop.regex: RE2 for every pattern people and agents supply. Anchored as PromQL, linear in
the text (the ReDoS patterns of issue 15 answer at once), and one-line refusals of what RE2
does not have."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from alerts.muting import InhibitIndex, Inhibition, Silence, matcher, matches, mute_reason
from collector.relabel import RelabelConfigError, parse_rules, relabel
from tuneloop.errors import InvalidInput
from tuneloop.regex import (
    MAX_PATTERN_LENGTH,
    InvalidRegex,
    compile_anchored,
    fullmatch,
    postgres_pattern,
)
from tuneloop.storage.timeseries.matchers import parse_matcher

EVIL_VALUE = "a" * 40 + "!"
"""Python's re takes 10 s on (a+)+ against this, doubling with each "a"."""
LIMIT_S = 1.0
"""The issue asks for 100 ms; generous for a loaded CI machine. Timings are printed."""


def timed(what: str, call: Callable[[], object]) -> object:
    start = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - start
    print(f"{what}: {elapsed * 1000:.2f} ms")
    assert elapsed < LIMIT_S, f"{what} took {elapsed:.3f} s"
    return result


@pytest.mark.parametrize(
    ("pattern", "value"),
    [
        ("(a+)+", EVIL_VALUE),
        ("(a+)+b", "a" * 10_000),
        ("(a|a)*b", "a" * 10_000),
        ("(.*)*x", "y" * 10_000),
        ("((ab)*c)*", "ab" * 5_000),
    ],
)
def test_catastrophic_patterns_answer_in_linear_time(pattern: str, value: str) -> None:
    assert timed(pattern, lambda: fullmatch(pattern, value)) is False
    assert fullmatch(pattern, value[:5].replace("!", "")) is (pattern == "(a+)+")


def test_anchored_at_both_ends_as_promql() -> None:
    assert [fullmatch("a|b", v) for v in ("a", "b", "ab", "xa", "ax", "")] == [
        True, True, False, False, False, False,
    ]  # fmt: skip
    assert fullmatch("train.*", "train-1") and not fullmatch("train", "train-1")
    assert fullmatch("", "") and not fullmatch("", "x")
    # A pattern cannot close the anchoring group and leave one side open.
    with pytest.raises(InvalidRegex):
        compile_anchored("a)|(b")


def test_dot_matches_a_newline_as_in_prometheus_3_and_postgresql() -> None:
    assert fullmatch("a.b", "a\nb")
    assert fullmatch("line.*", "line one\nline two")


def test_groups_keep_their_numbers_and_names() -> None:
    regex = compile_anchored(r"(\w+)-(?P<n>\d+)")
    found = regex.fullmatch("gpu-12")
    assert found is not None and regex.groups == 2
    assert (found.group(1), found.group("n"), found.groupdict()) == ("gpu", "12", {"n": "12"})


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        ("(?=a)", "invalid perl operator: (?="),
        ("(?<=a)b", "invalid perl operator: (?<"),
        ("(?!a)", "invalid perl operator: (?!"),
        ("a++", "bad repetition operator: ++"),
        ("(", "missing ): ("),
        ("a{1001}", "invalid repetition size: {1001}"),
    ],
)
def test_what_re2_lacks_is_refused_in_one_line(pattern: str, reason: str) -> None:
    with pytest.raises(InvalidRegex) as refused:
        compile_anchored(pattern)
    message = str(refused.value)
    assert message.startswith(f"invalid regular expression {pattern!r}: {reason}")
    assert "\n" not in message
    assert isinstance(refused.value, InvalidInput) and isinstance(refused.value, ValueError)
    # Matchers are refused the same way wherever they are parsed.
    with pytest.raises(ValueError, match="invalid regular expression"):
        parse_matcher(f"v=~`{pattern}`")


def test_backreferences_and_lookarounds_say_why() -> None:
    for pattern in (r"(a)\1", "(?=a)"):
        with pytest.raises(InvalidRegex, match=r"RE2 syntax: no backreferences or lookarounds"):
            compile_anchored(pattern)


def test_pattern_length_and_program_size_are_bounded() -> None:
    with pytest.raises(InvalidRegex, match=f"more than the {MAX_PATTERN_LENGTH} allowed"):
        compile_anchored("a" * (MAX_PATTERN_LENGTH + 1))
    # Small text, huge program: over RE2's memory budget, refused rather than built.
    with pytest.raises(InvalidRegex, match="pattern too large"):
        compile_anchored(r"\pL{1000}")


def test_compiled_patterns_are_cached() -> None:
    assert compile_anchored("cached.*") is compile_anchored("cached.*")


def test_postgres_pattern_is_checked_by_re2_and_anchored() -> None:
    assert postgres_pattern("a|b") == "^(?:a|b)$"
    with pytest.raises(InvalidRegex):
        postgres_pattern(r"(a)\1")  # PostgreSQL would accept it; both backends must not


def test_a_lone_surrogate_is_matched_not_raised() -> None:
    assert fullmatch(".*", "x\ud800y")
    assert not fullmatch("a", "\ud800")


# ------------------------------------------------------------------ silences and inhibit rules

T = datetime(2024, 3, 1, tzinfo=UTC)


def test_a_silence_with_a_catastrophic_pattern_answers_at_once() -> None:
    # 24 characters that took Python's re 4.2 s.
    silence = Silence(3, (matcher('v=~"(a+)+b"'),), T, T + timedelta(hours=1))
    labels = {"alertname": "X", "v": "a" * 10_000}
    none = InhibitIndex([], [])
    assert (
        timed("silence", lambda: mute_reason(labels, silences=[silence], inhibit=none, now=T))
        is None
    )
    assert mute_reason({"v": "aab"}, silences=[silence], inhibit=none, now=T) == "silence:3"


def test_matchers_keep_promql_semantics() -> None:
    either = (matcher('v=~"a|b"'),)
    neither = (matcher('v!~"a|b"'),)
    for value, expected in (("a", True), ("b", True), ("ab", False), ("xa", False)):
        assert matches(either, {"v": value}) is expected
        assert matches(neither, {"v": value}) is not expected
    assert matches((matcher('missing=~""'),), {})  # a missing label is the empty string


def test_an_inhibit_rule_with_a_catastrophic_pattern_answers_at_once() -> None:
    rule = Inhibition((matcher('alertname="Down"'),), (matcher('v=~"(a|a)*b"'),), ("host",))
    source = {"alertname": "Down", "host": "n1"}
    target = {"alertname": "Xid", "host": "n1", "v": "a" * 10_000}
    index = InhibitIndex([source, target], [rule])
    assert timed("inhibit", lambda: index.inhibits(target)) is False


# --------------------------------------------------------------------------- relabel rules


def test_a_relabel_rule_with_a_catastrophic_pattern_is_linear() -> None:
    rules = parse_rules([{"action": "drop", "source_labels": ["v"], "regex": "(a+)+"}])
    kept = timed("relabel", lambda: relabel(rules, "m", {"v": EVIL_VALUE}))
    assert kept == {"__name__": "m", "v": EVIL_VALUE}
    assert relabel(rules, "m", {"v": "aaaa"}) is None


def test_relabel_groups_expand_as_before() -> None:
    rules = parse_rules(
        [{"source_labels": ["host"], "regex": r"(\w+)-(?P<n>\d+)", "target_label": "node",
          "replacement": "${n}/$1"}]
    )  # fmt: skip
    assert relabel(rules, "m", {"host": "gpu-7"}) == {
        "__name__": "m",
        "host": "gpu-7",
        "node": "7/gpu",
    }


def test_relabel_refuses_what_re2_lacks_in_one_line() -> None:
    with pytest.raises(RelabelConfigError) as refused:
        parse_rules([{"action": "keep", "regex": "(?<=a)b"}])
    assert str(refused.value) == (
        "relabel config: rule 1: invalid regex '(?<=a)b': invalid perl operator: (?<= "
        "(RE2 syntax: no backreferences or lookarounds)"
    )
