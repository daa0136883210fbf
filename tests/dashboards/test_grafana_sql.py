"""The expander against the expansions Grafana documents and its macro tests show."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from dashboards.grafana_sql import GrafanaQuery, Variable, interval_text, round_interval

FROM = datetime(2017, 4, 21, 5, 1, 17, tzinfo=UTC)
TO = datetime(2017, 4, 21, 5, 6, 17, tzinfo=UTC)


def expand(sql: str, **variables: Variable) -> str:
    return GrafanaQuery(FROM, TO, variables, interval_ms=300_000).expand(sql)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("WHERE $__timeFilter(time_column)",
         "WHERE time_column BETWEEN '2017-04-21T05:01:17Z' AND '2017-04-21T05:06:17Z'"),
        ("select $__timeFrom(), $__timeTo()",
         "select '2017-04-21T05:01:17Z', '2017-04-21T05:06:17Z'"),
        ("GROUP BY $__timeGroup(time_column,'5m')",
         "GROUP BY floor(extract(epoch from time_column)/300)*300"),
        ("SELECT $__timeGroup(time_column,'5m'), value",
         'SELECT floor(extract(epoch from time_column)/300)*300 AS "time", value'),
        ("SELECT $__timeGroupAlias(time_column, $__interval)",
         'SELECT floor(extract(epoch from time_column)/300)*300 AS "time"'),
        ("$__timeGroupAlias(t, '500ms')", 'floor(extract(epoch from t)/0.5)*0.5 AS "time"'),
        ("$__time(t), $__timeEpoch(t)", 't AS "time", extract(epoch from t) as "time"'),
        ("$__interval_ms $__interval $__unixEpochFrom()", "300000 5m 1492750877"),
        ("$__unixEpochFilter(t)", "t >= 1492750877 AND t <= 1492751177"),
    ],
)  # fmt: skip
def test_macros(sql: str, expected: str) -> None:
    assert expand(sql) == expected


def test_variables_as_grafanas_sql_data_sources_format_them() -> None:
    hosts = Variable(["a", "it's"], multi=True, include_all=True)
    single = Variable("it's")
    assert expand("IN ($host)", host=hosts) == "IN ('a','it''s')"
    assert expand("IN (${host})", host=hosts) == "IN ('a','it''s')"
    assert expand("IN ([[host]])", host=hosts) == "IN ('a','it''s')"
    assert expand("IN (${host:sqlstring})", host=hosts) == "IN ('a','it''s')"
    assert expand("${host:csv}", host=hosts) == "a,it's"
    # A single-value variable without a format is pasted with quotes doubled, unquoted.
    assert expand("= $job", job=single) == "= it''s"
    assert expand("= ${job:sqlstring}", job=single) == "= 'it''s'"
    assert expand("= ${job:sqlstring}", job=Variable("x'; DROP TABLE t; --")) == (
        "= 'x''; DROP TABLE t; --'"
    )
    assert expand("$unknown stays") == "$unknown stays"


def test_interval_as_grafana_computes_it() -> None:
    assert round_interval(604_800_000 / 1000) == 600_000
    assert round_interval(21_600_000 / 1000) == 20_000
    assert interval_text(600_000) == "10m"
    assert interval_text(3_600_000) == "1h"
    assert interval_text(86_400_000) == "1d"
    assert interval_text(500) == "500ms"


def test_unknown_macros_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown macro"):
        expand("$__nope(x)")


def test_prometheus_variables_become_escaped_alternations() -> None:
    query = GrafanaQuery(
        FROM,
        TO,
        {
            "host": Variable(["gpu.node-1", "a|b"], multi=True, include_all=True),
            "one": Variable(["x+y"], multi=True),
            "job": Variable("it's"),
        },
    )
    assert (
        query.expand_promql('up{hostname=~"$host"}') == 'up{hostname=~"(gpu\\\\.node-1|a\\\\|b)"}'
    )
    assert query.expand_promql('up{h=~"$one"}') == 'up{h=~"x\\\\+y"}'
    assert query.expand_promql("rate(x[$__rate_interval])") == "rate(x[1m])"
    assert query.expand_promql('up{job="$job"}') == 'up{job="it\\\\\'s"}'
