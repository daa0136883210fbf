"""PromQL label matchers from their text form: quoting, escapes, operators, what is refused."""

from __future__ import annotations

import pytest

from tuneloop.storage.timeseries.matchers import parse_matcher
from tuneloop.storage.timeseries.types import Matcher, MatchOp

MATCHERS = [
    ('gpu="0"', Matcher("gpu", MatchOp.EQ, "0")),
    (' job =~ "train.*" ', Matcher("job", MatchOp.RE, "train.*")),
    ('gpu!="1"', Matcher("gpu", MatchOp.NE, "1")),
    ("host!~`node-\\d+`", Matcher("host", MatchOp.NRE, "node-\\d+")),  # raw: no escapes
    ("x='it\\'s'", Matcher("x", MatchOp.EQ, "it's")),
    ('x="a\\"b\\\\c\\n"', Matcher("x", MatchOp.EQ, 'a"b\\c\n')),
    ('x="\\xe2\\x82\\xac \\u00e9 \\101 \\U0001F600"', Matcher("x", MatchOp.EQ, "€ é A 😀")),
    ('"k8s.pod"="p-1"', Matcher("k8s.pod", MatchOp.EQ, "p-1")),
    ('__name__=~"DCGM_.*"', Matcher("__name__", MatchOp.RE, "DCGM_.*")),
    ('x=""', Matcher("x", MatchOp.EQ, "")),
    ('x="=~!~,}{"', Matcher("x", MatchOp.EQ, "=~!~,}{")),
]


@pytest.mark.parametrize(("text", "expected"), MATCHERS)
def test_parse_matcher(text: str, expected: Matcher) -> None:
    assert parse_matcher(text) == expected


BAD_MATCHERS = [
    ("gpu=0", "must be a quoted string"),
    ("gpu", "expected one of =, !=, =~, !~"),
    ('="0"', "expected a label name"),
    ('0gpu="0"', "expected a label name"),
    ('{gpu="0"}', "expected a label name"),
    ('gpu="0",job="x"', "give one matcher per match"),
    ('gpu="0', "unterminated string"),
    ("gpu=`0", "unterminated raw string"),
    ('gpu="0\n"', "newline"),
    ('gpu="\\q"', "unknown escape \\q"),
    ('gpu="\\x4"', "needs 2 hex digits"),
    ('gpu="\\xff"', "valid UTF-8"),
    ('gpu="\\ud800"', "not a Unicode character"),
    ('gpu="\\400"', "invalid octal escape"),
    ('gpu=~"("', "invalid regular expression"),
    ('""="x"', "empty label name"),
    ('gpu="' + "x" * 5000 + '"', "at most 4096 characters"),
]


@pytest.mark.parametrize(("text", "message"), BAD_MATCHERS)
def test_parse_matcher_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("\\", "\\\\").replace("(", r"\(")):
        parse_matcher(text)
