"""Regular expressions through the API on real SQLite and PostgreSQL (issue 15): a label value
planted by an agent's token and a catastrophic matcher answer at once, both backends take the
same RE2 language with PromQL's anchoring, and what RE2 lacks is refused in one line (422)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import Minter, bearer
from tests.api.test_series_api import write
from tuneloop.runtime import Runtime

ALPHA = "/api/v1/projects/alpha"
METRIC = "redos_probe"
EVIL_VALUE = "a" * 40 + "!"
LIMIT_S = 1.0
"""The issue asks for 100 ms; generous for a loaded CI machine. Timings are printed."""


@pytest.fixture
def member(mint: Minter, runtime: Runtime) -> dict[str, str]:
    mint.project("alpha")
    for value in (EVIL_VALUE, "aaaa", "a", "b", "ab", "xa", "a\nb"):
        write(runtime, "alpha", METRIC, {"v": value}, [(0, 1.0)])
    return bearer(mint.token("alpha", "member", "alice"))


def values(client: TestClient, headers: dict[str, str], *match: str) -> list[str]:
    answer = client.get(
        f"{ALPHA}/series", params={"metric": METRIC, "match": list(match)}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    return sorted(series["labels"]["v"] for series in answer.json()["series"])


def timed_get(client: TestClient, path: str, params: dict[str, Any], **kw: Any) -> Any:
    start = time.perf_counter()
    answer = client.get(path, params=params, **kw)
    elapsed = time.perf_counter() - start
    print(f"{path} {params}: {answer.status_code} in {elapsed * 1000:.1f} ms")
    assert elapsed < LIMIT_S, f"{params} took {elapsed:.3f} s"
    return answer


def test_a_catastrophic_matcher_on_a_planted_value_answers_at_once(
    client: TestClient, member: dict[str, str]
) -> None:
    assert values(client, member, 'v="a"') == ["a"]  # the first request's start-up, untimed
    for path in ("/series", "/query/latest", "/metrics"):
        answer = timed_get(
            client,
            f"{ALPHA}{path}",
            {"metric": METRIC, "match": ['v=~"(a+)+"'], "since": "0", "max_age": "1h"},
            headers=member,
        )
        assert answer.status_code == 200, answer.text
        assert EVIL_VALUE not in answer.text
    answer = timed_get(
        client,
        f"{ALPHA}/query_range",
        {"metric": METRIC, "match": ['v!~"(a+)+b"'], "start": "0", "end": "60", "step": "60"},
        headers=member,
    )
    assert answer.status_code == 200, answer.text


def test_promql_semantics_on_both_backends(client: TestClient, member: dict[str, str]) -> None:
    assert values(client, member, 'v=~"(a+)+"') == ["a", "aaaa"]
    assert values(client, member, 'v=~"a|b"') == ["a", "b"]  # anchored: not "ab" nor "xa"
    assert values(client, member, 'v!~"a|b|a+!?"', 'v!~"a.b"') == ["ab", "xa"]
    assert values(client, member, 'v=~"a.b"') == ["a\nb"]  # "." matches a newline on both
    assert values(client, member, 'v=~"x"') == []
    assert values(client, member, 'missing=~""', 'v="ab"') == ["ab"]  # missing label is ""


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", r"invalid escape sequence: \1"),
        ("(?=a)", "invalid perl operator: (?="),
        ("(?<!a)b", "invalid perl operator: (?<!"),
        ("a)|(b", "unexpected )"),
    ],
)
def test_what_re2_lacks_is_refused_with_one_line_422(
    client: TestClient, member: dict[str, str], pattern: str, reason: str
) -> None:
    answer = client.get(f"{ALPHA}/series", params={"match": f"v=~`{pattern}`"}, headers=member)
    assert answer.status_code == 422, answer.text
    # A malformed parameter: FastAPI's problem list, naming the parameter, one-line message.
    problem = answer.json()["detail"][0]
    assert problem["loc"] == ["query", "match", 0]
    assert "\n" not in problem["msg"]
    assert "invalid regular expression" in problem["msg"] and reason in problem["msg"]
    for kind, body in (
        ("silences", {"matchers": [f"v=~`{pattern}`"], "duration": "1h"}),
        ("inhibitions", {"source": ['a="b"'], "target": [f"v!~`{pattern}`"]}),
    ):
        refused = client.post(f"{ALPHA}/alerts/{kind}", json=body, headers=member)
        assert refused.status_code == 422, refused.text
        assert "invalid regular expression" in str(refused.json()["detail"]), refused.text


def test_a_catastrophic_silence_is_accepted_and_linear(
    client: TestClient, member: dict[str, str]
) -> None:
    # RE2 has no exponential patterns to refuse: (a+)+b is an ordinary silence.
    silence = client.post(
        f"{ALPHA}/alerts/silences", json={"matchers": ['v=~"(a+)+b"'], "duration": "1h"},
        headers=member,
    )  # fmt: skip
    assert silence.status_code == 201, silence.text
